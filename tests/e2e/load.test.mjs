// load.test.mjs - a bounded load test: 32 concurrent streaming clients
// against a small model for RACIMO_LOAD_SECONDS (default 15; the bench run
// uses 60).  No errors, every stream complete, resident memory flat.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, rssKiB, sleep, BIN } from './helpers.mjs';

const SECONDS = Number(process.env.RACIMO_LOAD_SECONDS || 15);
const CLIENTS = Number(process.env.RACIMO_LOAD_CLIENTS || 32);

async function client(c, until, stats, id) {
  let turn = 0;
  while (Date.now() < until) {
    turn++;
    const s = await c.chat.completions.create({ model: 'tiny', stream: true, max_tokens: 16 + (id % 5) * 8,
      temperature: 0.7, seed: id * 1000 + turn, stream_options: { include_usage: true },
      messages: [{ role: 'user', content: `client ${id} turn ${turn}: say something` }] });
    let finish = null, usage = null, text = '';
    for await (const chunk of s) {
      if (chunk.usage) usage = chunk.usage;
      const ch = chunk.choices[0];
      if (ch?.delta?.content) text += ch.delta.content;
      if (ch?.finish_reason) finish = ch.finish_reason;
    }
    assert.ok(finish === 'stop' || finish === 'length', `stream of client ${id} ended without a finish reason`);
    assert.ok(usage && usage.completion_tokens > 0 || finish === 'stop');
    stats.streams++;
    stats.tokens += usage?.completion_tokens ?? 0;
  }
}

test(`${CLIENTS} streaming clients for ${SECONDS} s: no errors, flat memory`, { timeout: (SECONDS * 3 + 60) * 1000 }, async () => {
  const srv = await startServer(['--parallel', '8', '-c', '512', '--queue', '64', '--no-access-log']);
  try {
    const c = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 60000 });
    // warm up: every slot used once, so the KV cache pages are touched
    const warm = { streams: 0, tokens: 0 };
    await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(c, Date.now() + 2000, warm, i)));
    await sleep(300);
    const rss0 = rssKiB(srv.proc.pid);
    const stats = { streams: 0, tokens: 0 };
    const t0 = Date.now();
    await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(c, t0 + SECONDS * 1000, stats, i)));
    const secs = (Date.now() - t0) / 1000;
    await sleep(300);
    const rss1 = rssKiB(srv.proc.pid);
    const cl = (await (await fetch(`${srv.url}/v1/cluster`)).json()).models[0];
    console.log(`load: ${stats.streams} streams, ${stats.tokens} tokens in ${secs.toFixed(1)} s ` +
      `(${(stats.tokens / secs).toFixed(0)} tokens/s), rss ${rss0} -> ${rss1} KiB`);
    assert.ok(stats.streams >= CLIENTS);
    assert.equal(cl.active, 0);
    assert.equal(cl.queued, 0);
    // (a sanitizer build keeps freed memory in quarantine; LeakSanitizer
    // checks it at exit instead)
    if (!BIN.includes('/build/san/'))
      assert.ok(rss1 - rss0 < Math.max(8192, rss0 * 0.05), `resident memory grew from ${rss0} to ${rss1} KiB`);
  } finally { await srv.stop(); }
});
