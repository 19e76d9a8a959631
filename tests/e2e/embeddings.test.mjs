// embeddings.test.mjs - embedding models through the official clients:
// the `openai` package's embeddings.create (which asks for base64 unless
// told otherwise, and decodes it) and the `ollama` package's embed, against
// a synthetic Qwen3-Embedding-shaped model (last pooling).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { BIN, models, startServer } from './helpers.mjs';

let srv, client, ollama;
before(async () => {
  execFileSync(BIN, ['make-model', '--preset', 'tiny-qwen3-embed', '-o', join(models(), 'embed.gguf')]);
  srv = await startServer(['-c', '256', '--parallel', '2']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  ollama = new Ollama({ host: srv.url });
});
after(async () => { await srv.stop(); });

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const close = (a, b, tol = 1e-6) => {
  assert.equal(a.length, b.length);
  for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i] - b[i]) <= tol, `${i}: ${a[i]} vs ${b[i]}`);
};

test('openai embeddings.create: several inputs, base64 and float alike', async () => {
  const r = await client.embeddings.create({ model: 'embed', input: ['the cat sat', 'on the mat'] });
  assert.equal(r.object, 'list');
  assert.equal(r.model, 'embed');
  assert.equal(r.data.length, 2);
  r.data.forEach((d, i) => {
    assert.equal(d.object, 'embedding');
    assert.equal(d.index, i);
    assert.equal(d.embedding.length, 256);
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5);
  });
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
  const f = await client.embeddings.create({ model: 'embed', input: 'on the mat', encoding_format: 'float' });
  close(f.data[0].embedding, r.data[1].embedding);
});

test('openai embeddings.create: dimensions and token ids', async () => {
  const full = await client.embeddings.create({ model: 'embed', input: 'short', encoding_format: 'float' });
  const cut = await client.embeddings.create({ model: 'embed', input: 'short', dimensions: 16 });
  assert.equal(cut.data[0].embedding.length, 16);
  const head = full.data[0].embedding.slice(0, 16), n = norm(head);
  close(cut.data[0].embedding, head.map((x) => x / n));
  const ids = await client.embeddings.create({ model: 'embed', input: [[1, 2, 3], [4]] });
  assert.equal(ids.data.length, 2);
  assert.equal(ids.usage.prompt_tokens, 4);
});

test('openai embeddings.create: errors are 400 with a message', async () => {
  await assert.rejects(client.embeddings.create({ model: 'tiny', input: 'x' }),
    (e) => e.status === 400 && /makes no embeddings/.test(e.message));
  await assert.rejects(client.embeddings.create({ model: 'embed', input: 'x', dimensions: 999 }),
    (e) => e.status === 400 && /dimensions/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'embed', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 400 && /embedding model/.test(e.message));
  await assert.rejects(client.embeddings.create({ model: 'nope', input: 'x' }), (e) => e.status === 404);
});

test('ollama embed: the same vectors as openai', async () => {
  const o = await ollama.embed({ model: 'embed', input: ['the cat sat', 'on the mat'] });
  assert.equal(o.model, 'embed');
  assert.equal(o.embeddings.length, 2);
  assert.ok(o.prompt_eval_count > 0);
  assert.ok(o.total_duration > 0);
  const r = await client.embeddings.create({ model: 'embed', input: 'the cat sat', encoding_format: 'float' });
  close(o.embeddings[0], r.data[0].embedding);
  const long = 'word '.repeat(400);
  const cut = await ollama.embed({ model: 'embed', input: long });
  assert.equal(cut.prompt_eval_count, 256);
  await assert.rejects(ollama.embed({ model: 'embed', input: long, truncate: false }), /truncate/);
});
