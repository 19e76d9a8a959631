// ollama.test.mjs - racimo serve as a drop-in for Ollama, driven by the
// official `ollama` package: tags, show, ps, version, chat and generate
// (streamed JSON lines and not), options, thinking, and errors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Ollama } from 'ollama';
import { startServer, writeFile, THINKING_TEMPLATE } from './helpers.mjs';

let srv, ollama;
before(async () => {
  srv = await startServer(['-c', '512']);
  ollama = new Ollama({ host: srv.url });
});
after(async () => { await srv.stop(); });

test('list, show, ps and version', async () => {
  const tags = await ollama.list();
  const names = tags.models.map((m) => m.name);
  assert.ok(names.includes('tiny:latest') && names.includes('tiny-qwen2:latest'), names.join(','));
  const tiny = tags.models.find((m) => m.name === 'tiny:latest');
  assert.ok(tiny.size > 0);
  assert.match(tiny.digest, /^[0-9a-f]{64}$/);
  assert.equal(tiny.details.format, 'gguf');
  assert.equal(tiny.details.family, 'llama');
  assert.equal(tiny.details.quantization_level, 'Q8_0');
  const show = await ollama.show({ model: 'tiny' });
  assert.match(show.template, /start_header_id/);
  assert.equal(show.model_info['general.architecture'], 'llama');
  assert.ok(show.capabilities.includes('completion'));
  const ps = await ollama.ps();
  assert.ok(ps.models.some((m) => m.name === 'tiny:latest'));
  const v = await ollama.version();
  assert.match(v.version, /^\d+\.\d+\.\d+/);
});

test('chat, not streamed: message, done, counts and durations', async () => {
  const r = await ollama.chat({ model: 'tiny:latest', messages: [{ role: 'user', content: 'hello' }], stream: false,
    options: { num_predict: 5, temperature: 0, seed: 3 } });
  assert.equal(r.model, 'tiny:latest');
  assert.equal(r.message.role, 'assistant');
  assert.equal(typeof r.message.content, 'string');
  assert.equal(r.done, true);
  assert.ok(['stop', 'length'].includes(r.done_reason));
  assert.ok(r.prompt_eval_count > 0);
  assert.ok(r.eval_count <= 5);
  assert.ok(r.total_duration > 0 && r.eval_duration >= 0);
  assert.ok(!Number.isNaN(Date.parse(r.created_at)));
});

test('chat, streamed: lines add up to the whole answer', async () => {
  const args = { model: 'tiny', messages: [{ role: 'user', content: 'count' }], options: { num_predict: 10, temperature: 0 } };
  const whole = await ollama.chat({ ...args, stream: false });
  let text = '', last;
  for await (const part of await ollama.chat({ ...args, stream: true })) { text += part.message.content; last = part; }
  assert.equal(text, whole.message.content);
  assert.equal(last.done, true);
  assert.equal(last.eval_count, whole.eval_count);
});

test('generate: template applied unless raw, seeds reproduce, stop strings', async () => {
  const args = { model: 'tiny', prompt: 'Why is the sky blue?', options: { num_predict: 12, temperature: 1, seed: 7 } };
  const a = await ollama.generate({ ...args, stream: false });
  const b = await ollama.generate({ ...args, stream: false });
  assert.equal(a.response, b.response);
  const raw = await ollama.generate({ ...args, raw: true, stream: false });
  assert.ok(raw.prompt_eval_count < a.prompt_eval_count, 'raw prompt should skip the chat template');
  let text = '';
  for await (const part of await ollama.generate({ ...args, stream: true })) text += part.response;
  assert.equal(text, a.response);
  const greedy = await ollama.generate({ ...args, options: { num_predict: 20, temperature: 0 }, stream: false });
  if (greedy.response.length >= 5) {
    const stop = greedy.response.slice(2, 4);
    const cut = await ollama.generate({ ...args, options: { num_predict: 20, temperature: 0, stop: [stop] }, stream: false });
    assert.equal(cut.response, greedy.response.slice(0, greedy.response.indexOf(stop)));
    assert.equal(cut.done_reason, 'stop');
  }
  const load = await ollama.generate({ model: 'tiny', prompt: '' });
  assert.equal(load.done_reason, 'load');
});

test('errors: unknown model, bad options, format, empty messages', async () => {
  await assert.rejects(ollama.chat({ model: 'nope', messages: [{ role: 'user', content: 'x' }], stream: false }),
    (e) => e.status_code === 404 && /not found/.test(e.error));
  await assert.rejects(ollama.chat({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], format: 'yaml', stream: false }),
    (e) => e.status_code === 400 && /yaml/.test(e.error));
  await assert.rejects(ollama.chat({ model: 'tiny', messages: [], stream: false }), (e) => e.status_code === 400);
  await assert.rejects(ollama.generate({ model: 'tiny', prompt: 'x', options: { temperature: 'hot' }, stream: false }),
    (e) => e.status_code === 400 && /temperature/.test(e.error));
  await assert.rejects(ollama.show({ model: 'nope' }), (e) => e.status_code === 404);
  const r = await fetch(`${srv.url}/api/chat`, { method: 'POST', body: '{"model":' });
  assert.equal(r.status, 400);
  const j = await r.json();
  assert.equal(typeof j.error, 'string');
});


test('think: thinking in message.thinking and generate\'s thinking, streamed or not; think false switches it off', async () => {
  const t = await startServer(['--chat-template-file', writeFile('thinking-ollama.jinja', THINKING_TEMPLATE)]);
  try {
    const o = new Ollama({ host: t.url });
    const show = await o.show({ model: 'tiny' });
    assert.ok(show.capabilities.includes('thinking'), show.capabilities.join(','));
    const args = { model: 'tiny', messages: [{ role: 'user', content: 'why?' }], options: { num_predict: 8, temperature: 0 } };
    const r = await o.chat({ ...args, think: true, stream: false });
    assert.ok(r.message.thinking && r.message.thinking.length > 0, JSON.stringify(r.message));
    assert.equal(r.message.content, '');
    let thinking = '', content = '', done = null;
    for await (const part of await o.chat({ ...args, think: true, stream: true })) {
      thinking += part.message.thinking ?? '';
      content += part.message.content;
      if (part.done) done = part;
    }
    assert.equal(thinking, r.message.thinking);
    assert.equal(content, '');
    assert.equal(done.eval_count, r.eval_count);
    // not given: on, as Ollama has it for models that think
    const unset = await o.chat({ ...args, stream: false });
    assert.equal(unset.message.thinking, r.message.thinking);
    const off = await o.chat({ ...args, think: false, stream: false });
    assert.equal(off.message.thinking, undefined);
    assert.ok(off.prompt_eval_count > r.prompt_eval_count, 'think false did not reach the template');
    const g = await o.generate({ model: 'tiny', prompt: 'why?', think: true, stream: false, options: { num_predict: 8, temperature: 0 } });
    assert.equal(g.thinking, r.message.thinking);
    assert.equal(g.response, '');
  } finally { await t.stop(); }
});

test('think: true on a model whose template does not think is refused as Ollama refuses it', async () => {
  await assert.rejects(ollama.chat({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], think: true, stream: false }),
    (e) => e.status_code === 400 && /does not support thinking/.test(e.error));
  const r = await ollama.chat({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], think: false, stream: false,
    options: { num_predict: 2 } });
  assert.equal(r.message.thinking, undefined);
});
