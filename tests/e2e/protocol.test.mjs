// protocol.test.mjs - what clients see on the wire: SSE framing and JSON
// lines through curl, CORS, body limits, slow clients, a full queue (429),
// disconnects that cancel, lazy loading, health, metrics and cluster state.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import net from 'node:net';
import { startServer, metric, sleep, writeFile } from './helpers.mjs';

const run = promisify(execFile);
let srv;
before(async () => { srv = await startServer(['-c', '1024', '--timeout', '2', '--max-body', '65536']); });
after(async () => { await srv.stop(); });

const curl = async (...args) => (await run('curl', ['-sS', '--max-time', '30', ...args], { maxBuffer: 1 << 24 })).stdout;

test('SSE framing through curl: data lines, blank lines, [DONE] last', async () => {
  const out = await curl('-i', '-N', `${srv.url}/v1/chat/completions`, '-H', 'Content-Type: application/json', '-d',
    JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, stream: true }));
  const [head, body] = out.split('\r\n\r\n');
  assert.match(head, /^HTTP\/1\.1 200/);
  assert.match(head, /content-type: text\/event-stream/i);
  assert.match(head, /transfer-encoding: chunked/i);
  const events = body.split('\n\n').filter((e) => e.length);
  assert.ok(events.length >= 3);
  for (const e of events) assert.match(e, /^data: /);
  assert.equal(events[events.length - 1], 'data: [DONE]');
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
  assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk'));
  assert.ok(chunks.some((c) => c.choices[0]?.finish_reason));
  assert.ok(body.endsWith('data: [DONE]\n\n'));
});

test('Ollama JSON lines through curl: one object per line, done last', async () => {
  const out = await curl('-N', `${srv.url}/api/generate`, '-d',
    JSON.stringify({ model: 'tiny', prompt: 'hi', options: { num_predict: 5 } }));
  const lines = out.trim().split('\n').map((l) => JSON.parse(l));
  assert.ok(lines.length >= 2);
  assert.ok(lines.slice(0, -1).every((l) => l.done === false && typeof l.response === 'string'));
  assert.equal(lines[lines.length - 1].done, true);
});

test('health, metrics and cluster state', async () => {
  const h = await (await fetch(`${srv.url}/health`)).json();
  assert.equal(h.status, 'ok');
  await curl(`${srv.url}/v1/completions`, '-d', JSON.stringify({ model: 'tiny', prompt: 'm', max_tokens: 3 }));
  const text = await (await fetch(`${srv.url}/metrics`)).text();
  for (const name of ['racimo_http_requests_total', 'racimo_prompt_tokens_total', 'racimo_generated_tokens_total',
    'racimo_time_to_first_token_seconds_bucket', 'racimo_generation_tokens_per_second_bucket', 'racimo_queue_depth',
    'racimo_kv_cache_used_tokens', 'racimo_kv_cache_capacity_tokens'])
    assert.match(text, new RegExp(`^${name}`, 'm'), name);
  assert.ok(await metric(srv.url, 'racimo_generated_tokens_total', 'model="tiny"') >= 3);
  const c = await (await fetch(`${srv.url}/v1/cluster`)).json();
  assert.equal(typeof c.node.hostname, 'string');
  const tiny = c.models.find((m) => m.name === 'tiny');
  assert.equal(tiny.state, 'loaded');
  assert.equal(tiny.ctx_size, 1024);
  assert.equal(tiny.kv_total, 4 * 1024);
  assert.equal(tiny.cache_type, 'f16');   // the default, as llama.cpp's
});

test('a model that is not loaded loads on first use', async () => {
  const t = await startServer([], { preload: false });
  try {
    let ps = await (await fetch(`${t.url}/api/ps`)).json();
    assert.equal(ps.models.length, 0);
    const r = await fetch(`${t.url}/v1/chat/completions`, { method: 'POST',
      body: JSON.stringify({ model: 'tiny-qwen2', messages: [{ role: 'user', content: 'x' }], max_tokens: 2 }) });
    assert.equal(r.status, 200);
    ps = await (await fetch(`${t.url}/api/ps`)).json();
    assert.deepEqual(ps.models.map((m) => m.name), ['tiny-qwen2:latest']);
  } finally { await t.stop(); }
});

test('instances start and stop explicitly, stop when idle, and streams wait for a load with SSE comments', async () => {
  const t = await startServer(['--idle-unload', '2'], { preload: false });
  try {
    const post = (path, body) => fetch(`${t.url}${path}`, { method: 'POST', body: JSON.stringify(body) });
    let r = await post('/v1/instances', { model: 'tiny-qwen2' });
    assert.ok([200, 202].includes(r.status));
    for (let i = 0; i < 100 && (await (await post('/v1/instances', { model: 'tiny-qwen2' })).json()).state !== 'loaded'; i++)
      await sleep(100);
    let ps = await (await fetch(`${t.url}/api/ps`)).json();
    assert.deepEqual(ps.models.map((m) => m.name), ['tiny-qwen2:latest']);
    r = await post('/v1/instances/stop', { model: 'tiny-qwen2' });
    assert.equal(r.status, 200);
    assert.equal((await r.json()).state, 'available');
    ps = await (await fetch(`${t.url}/api/ps`)).json();
    assert.equal(ps.models.length, 0);
    r = await post('/v1/instances/stop', { model: 'tiny-qwen2' });
    assert.equal(r.status, 409);
    assert.match((await r.json()).error.message, /not loaded/);
    assert.equal((await post('/v1/instances', { model: 'nope' })).status, 404);
    // the same through the CLI
    const cli = async (...a) => (await run(process.env.RACIMO_BIN, ['instances', ...a, '--url', t.url])).stdout;
    assert.match(await cli('start', 'tiny-qwen2'), /^tiny-qwen2: loaded/);
    assert.match(await cli(), /^tiny-qwen2  loaded/m);
    assert.match(await cli('stop', 'tiny-qwen2'), /^tiny-qwen2: stopped/);
    assert.match(await cli(), /no model is loaded/);
    await assert.rejects(run(process.env.RACIMO_BIN, ['instances', 'stop', 'tiny-qwen2', '--url', t.url]),
      (e) => /not loaded/.test(e.stderr));
    assert.equal((await post('/v1/instances', {})).status, 400);
    // a stream for a model that is not loaded opens at once with a comment
    const out = await curl('-N', `${t.url}/v1/chat/completions`, '-d',
      JSON.stringify({ model: 'tiny-qwen2', messages: [{ role: 'user', content: 'x' }], max_tokens: 3, stream: true }));
    assert.ok(out.startsWith(': loading the model\n\n'));
    assert.ok(out.endsWith('data: [DONE]\n\n'));
    // idle for 2 s: stopped by itself
    for (let i = 0; i < 60 && (await (await fetch(`${t.url}/api/ps`)).json()).models.length; i++) await sleep(100);
    ps = await (await fetch(`${t.url}/api/ps`)).json();
    assert.equal(ps.models.length, 0);
  } finally { await t.stop(); }
});

test('a model file that fails to load gets a 500 naming the problem; others still work', async () => {
  writeFile('broken.gguf', 'GGUF this is not a model');
  const r = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST',
    body: JSON.stringify({ model: 'broken', messages: [{ role: 'user', content: 'x' }] }) });
  assert.equal(r.status, 500);
  const j = await r.json();
  assert.equal(j.error.code, 'model_load_failed');
  assert.match(j.error.message, /broken/);
  const o = await fetch(`${srv.url}/api/generate`, { method: 'POST', body: JSON.stringify({ model: 'broken', prompt: 'x' }) });
  assert.equal(o.status, 500);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  const ok = await fetch(`${srv.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: 2 }) });
  assert.equal(ok.status, 200);
});

test('CORS is off by default and answers allowed origins when configured', async () => {
  const r = await fetch(`${srv.url}/v1/models`, { headers: { Origin: 'http://example.test' } });
  assert.equal(r.headers.get('access-control-allow-origin'), null);
  const t = await startServer(['--cors-origin', 'http://app.test']);
  try {
    const ok = await fetch(`${t.url}/v1/models`, { headers: { Origin: 'http://app.test' } });
    assert.equal(ok.headers.get('access-control-allow-origin'), 'http://app.test');
    const other = await fetch(`${t.url}/v1/models`, { headers: { Origin: 'http://evil.test' } });
    assert.equal(other.headers.get('access-control-allow-origin'), null);
    const pre = await fetch(`${t.url}/v1/chat/completions`, { method: 'OPTIONS', headers: { Origin: 'http://app.test',
      'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type' } });
    assert.equal(pre.status, 204);
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
    assert.match(pre.headers.get('access-control-allow-headers'), /authorization/);
  } finally { await t.stop(); }
});

test('a body over --max-body gets 413 in JSON; the server keeps serving', async () => {
  const big = JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'a'.repeat(70000) }] });
  const r = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', body: big });
  assert.equal(r.status, 413);
  assert.match((await r.json()).error.message, /limit of 65536 bytes/);
  const o = await fetch(`${srv.url}/api/chat`, { method: 'POST', body: big });
  assert.equal(o.status, 413);
  assert.equal(typeof (await o.json()).error, 'string');
  const huge = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', body: 'x'.repeat(1 << 20) }).catch((e) => e);
  assert.ok(huge instanceof Error || huge.status === 413);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
});

test('a slow-loris client is dropped after --timeout while others are served', async () => {
  const sock = net.connect(srv.port, '127.0.0.1');
  await new Promise((ok) => sock.on('connect', ok));
  sock.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n');
  const closed = new Promise((ok) => sock.on('close', ok));
  sock.on('error', () => {});
  const t0 = Date.now();
  const r = await fetch(`${srv.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: 2 }) });
  assert.equal(r.status, 200);
  await closed;
  const waited = Date.now() - t0;
  assert.ok(waited >= 1500 && waited < 10000, `closed after ${waited} ms`);
});

test('past the queue bound: 429 with Retry-After; everyone else completes', async () => {
  const t = await startServer(['--parallel', '1', '--queue', '0', '-c', '2048']);
  try {
    const body = JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'long' }], max_tokens: 400, ignore_eos: true });
    const rs = await Promise.all(Array.from({ length: 6 }, () => fetch(`${t.url}/v1/chat/completions`, { method: 'POST', body })));
    const codes = rs.map((r) => r.status);
    assert.ok(codes.includes(200), codes.join(','));
    const busy = rs.filter((r) => r.status === 429);
    assert.ok(busy.length >= 1, codes.join(','));
    assert.equal(busy[0].headers.get('retry-after'), '1');
    assert.equal((await busy[0].json()).error.type, 'rate_limit_error');
    for (const r of rs.filter((x) => x.status === 200)) assert.equal((await r.json()).choices.length, 1);
  } finally { await t.stop(); }
});

test('a client that disconnects cancels its sequence at once', async () => {
  const t = await startServer(['--parallel', '2', '-c', '2048']);
  try {
    const body = (stream) => JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'go on' }],
      max_tokens: 2000, ignore_eos: true, stream });
    // streamed: leave after the first event
    const ac = new AbortController();
    const r = await fetch(`${t.url}/v1/chat/completions`, { method: 'POST', signal: ac.signal, body: body(true) });
    const reader = r.body.getReader();
    await reader.read();
    ac.abort();
    // not streamed: leave while it computes
    const ac2 = new AbortController();
    const p = fetch(`${t.url}/v1/chat/completions`, { method: 'POST', signal: ac2.signal, body: body(false) }).catch(() => {});
    await sleep(30);
    ac2.abort();
    await p;
    let c;
    for (let i = 0; i < 40; i++) {
      await sleep(50);
      c = (await (await fetch(`${t.url}/v1/cluster`)).json()).models.find((m) => m.name === 'tiny');
      if (c.active === 0 && t.access().filter((l) => l.finish === 'cancelled').length === 2) break;
    }
    assert.equal(c.active, 0, 'a sequence kept running');
    const cancelled = t.access().filter((l) => l.finish === 'cancelled');
    assert.equal(cancelled.length, 2, JSON.stringify(t.access()));
    assert.ok(cancelled.every((l) => l.status === 499 && l.tokens_out < 2000), JSON.stringify(cancelled));
    assert.ok(c.tokens_generated < 2 * 2000);
  } finally { await t.stop(); }
});
