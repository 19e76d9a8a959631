// openai.test.mjs - racimo serve driven by the official `openai` package:
// chat and completions, streamed and not, models, sampling fields, seeds,
// stop strings, logprobs, prefix reuse, tools, thinking and errors.  Synthetic models
// have random weights: these tests check protocol and behaviour, not text.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, writeFile, sleep, THINKING_TEMPLATE, HERMES_TEMPLATE } from './helpers.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['-c', '512', '--parallel', '4']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await srv.stop(); });

const msgs = (text) => [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: text }];

test('models are listed and retrieved by file name', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.ok(ids.includes('tiny') && ids.includes('tiny-qwen2'), ids.join(','));
  for (const m of list.data) { assert.equal(m.object, 'model'); assert.equal(typeof m.created, 'number'); }
  const one = await client.models.retrieve('tiny');
  assert.equal(one.id, 'tiny');
  await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404);
});

test('chat completion carries the fields clients rely on', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: msgs('hello'), max_tokens: 6, temperature: 0 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'tiny');
  assert.ok(Math.abs(r.created - Date.now() / 1000) < 60);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens <= 6);
  if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 6);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('content as an array of text parts equals the same text as a string', async () => {
  const a = await client.chat.completions.create({ model: 'tiny', max_tokens: 5, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'one' }, { type: 'text', text: 'two' }] }] });
  const b = await client.chat.completions.create({ model: 'tiny', max_tokens: 5, temperature: 0,
    messages: [{ role: 'user', content: 'one\ntwo' }] });
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('streaming sends deltas that add up to the non-streamed answer, then usage', async () => {
  const args = { model: 'tiny', messages: msgs('stream me'), max_tokens: 12, temperature: 0, ignore_eos: true };
  const whole = await client.chat.completions.create(args);
  const stream = await client.chat.completions.create({ ...args, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, first = true, ids = new Set();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) { usage = chunk.usage; assert.equal(chunk.choices.length, 0); continue; }
    const c = chunk.choices[0];
    if (first) { assert.equal(c.delta.role, 'assistant'); first = false; }
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(ids.size, 1);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('a seed reproduces a sampled answer; sampling fields are accepted', async () => {
  const args = { model: 'tiny', messages: msgs('random'), max_tokens: 16, temperature: 1.5, top_p: 0.95,
    top_k: 100, min_p: 0.01, presence_penalty: 0.5, frequency_penalty: 0.5, repetition_penalty: 1.1 };
  const a = await client.chat.completions.create({ ...args, seed: 42 });
  const b = await client.chat.completions.create({ ...args, seed: 42 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const outs = new Set();
  for (const seed of [1, 2, 3, 4]) outs.add((await client.chat.completions.create({ ...args, seed })).choices[0].message.content);
  assert.ok(outs.size > 1, 'different seeds gave the same text every time');
});

test('a stop string ends the answer before it, with finish_reason stop', async () => {
  const args = { model: 'tiny', messages: msgs('stop'), max_tokens: 24, temperature: 0 };
  const full = (await client.chat.completions.create(args)).choices[0].message.content;
  assert.ok(full.length >= 6, `answer too short to test: ${JSON.stringify(full)}`);
  const stop = full.slice(3, 5);
  const cut = full.slice(0, full.indexOf(stop));
  const r = await client.chat.completions.create({ ...args, stop: [stop, 'zzzzzz'] });
  assert.equal(r.choices[0].message.content, cut);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await client.chat.completions.create({ ...args, stop, stream: true });
  let text = '', finish;
  for await (const c of s) { text += c.choices[0]?.delta?.content ?? ''; finish = c.choices[0]?.finish_reason ?? finish; }
  assert.equal(text, cut);
  assert.equal(finish, 'stop');
});

test('logit_bias bans tokens; max_completion_tokens limits', async () => {
  // ban every token but 120 (the byte 'x' in the synthetic vocabulary)
  const logit_bias = {};
  for (let id = 0; id < 512; id++) if (id !== 120) logit_bias[id] = -100;
  const r = await client.chat.completions.create({ model: 'tiny', messages: msgs('bias'), max_completion_tokens: 3,
    temperature: 0.8, logit_bias });
  assert.equal(r.choices[0].message.content, 'xxx');
  assert.equal(r.usage.completion_tokens, 3);
  assert.equal(r.choices[0].finish_reason, 'length');
});

test('logprobs: one entry per token with the requested alternatives', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: msgs('lp'), max_tokens: 5, temperature: 0,
    logprobs: true, top_logprobs: 3, ignore_eos: true });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[2].logprob);
    // greedy: the chosen token is the most likely one
    assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-4);
  }
});

test('the next turn of a conversation reuses the cached prefix', async () => {
  const turn1 = msgs('remember this long sentence about grapes and clusters of machines');
  const a = await client.chat.completions.create({ model: 'tiny-qwen2', messages: turn1, max_tokens: 4, temperature: 0 });
  const turn2 = [...turn1, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: 'and now?' }];
  const b = await client.chat.completions.create({ model: 'tiny-qwen2', messages: turn2, max_tokens: 4, temperature: 0 });
  assert.ok(b.usage.prompt_tokens > a.usage.prompt_tokens);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 1,
    `cached ${b.usage.prompt_tokens_details.cached_tokens} of ${a.usage.prompt_tokens}`);
  assert.equal(b.timings.prompt_n, b.usage.prompt_tokens - b.usage.prompt_tokens_details.cached_tokens);
});

test('completions: text and token-id prompts, streamed and not', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 7, temperature: 0 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  const ids = await client.completions.create({ model: 'tiny', prompt: [79, 110, 99, 101], max_tokens: 3, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 4);
  const s = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 7, temperature: 0, stream: true });
  let text = '', finish;
  for await (const c of s) { text += c.choices[0]?.text ?? ''; finish = c.choices[0]?.finish_reason ?? finish; }
  assert.equal(text, r.choices[0].text);
  assert.equal(finish, r.choices[0].finish_reason);
});

test('errors come back as OpenAI errors the client understands', async () => {
  const bad = async (args, status, re) => {
    await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: msgs('x'), ...args }), (e) => {
      assert.equal(e.status, status, `${JSON.stringify(args)}: ${e.message}`);
      assert.match(e.message, re);
      assert.equal(typeof e.error?.message ?? e.message, 'string');
      return true;
    });
  };
  await bad({ model: 'no-such-model' }, 404, /not found/);
  await bad({ n: 2 }, 400, /n = 1|'n'/);
  await bad({ messages: [] }, 400, /empty/);
  await bad({ max_tokens: 100000000 }, 400, /max_tokens/);
  await bad({ max_tokens: 1000 }, 400, /context/);
  await bad({ temperature: 'hot' }, 400, /temperature/);
  await bad({ response_format: { type: 'xml' } }, 400, /xml/);
  await bad({ messages: [{ role: 'wizard', content: 'x' }] }, 400, /role/);
  await bad({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 400, /image_url/);
  await bad({ logit_bias: { 999999: 5 } }, 400, /vocabulary/);
  await bad({ messages: msgs('long '.repeat(2000)) }, 400, /prompt has \d+ tokens/);
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', echo: true }), (e) => e.status === 400);
  // malformed JSON and wrong types through plain fetch
  for (const body of ['{', '[]', '{"model": 5, "messages": []}', '{"model":"tiny","messages":"hi"}']) {
    const r = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', body, headers: { 'content-type': 'application/json' } });
    assert.equal(r.status, 400, body);
    const j = await r.json();
    assert.equal(typeof j.error.message, 'string');
    assert.equal(j.error.type, 'invalid_request_error');
    assert.ok('code' in j.error && 'param' in j.error);
  }
  const nf = await fetch(`${srv.url}/v1/nothing`);
  assert.equal(nf.status, 404);
  const wrong = await fetch(`${srv.url}/v1/chat/completions`);
  assert.equal(wrong.status, 405);
  // the server still serves after all that
  const ok = await client.chat.completions.create({ model: 'tiny', messages: msgs('still there?'), max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test('tools are rendered through the template; tool turns are accepted', async () => {
  const tpl = writeFile('hermes.jinja', HERMES_TEMPLATE);
  const t = await startServer(['--chat-template-file', tpl]);
  try {
    const c = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const without = await c.chat.completions.create({ model: 'tiny', messages: msgs('weather in Paris?'), max_tokens: 3, temperature: 0 });
    const withTools = await c.chat.completions.create({ model: 'tiny', messages: msgs('weather in Paris?'), tools, max_tokens: 3, temperature: 0 });
    assert.ok(withTools.usage.prompt_tokens > without.usage.prompt_tokens + 20, 'tools were not rendered');
    assert.ok(['stop', 'length', 'tool_calls'].includes(withTools.choices[0].finish_reason));
    const none = await c.chat.completions.create({ model: 'tiny', messages: msgs('weather in Paris?'), tools, tool_choice: 'none', max_tokens: 3, temperature: 0 });
    assert.equal(none.usage.prompt_tokens, without.usage.prompt_tokens);
    const history = [...msgs('weather in Paris?'),
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' }];
    const r = await c.chat.completions.create({ model: 'tiny', messages: history, tools, max_tokens: 3, temperature: 0 });
    assert.ok(r.usage.prompt_tokens > withTools.usage.prompt_tokens);
    const s = await c.chat.completions.create({ model: 'tiny', messages: history, tools, max_tokens: 3, temperature: 0, stream: true });
    let n = 0;
    for await (const chunk of s) n += chunk.choices.length;
    assert.ok(n >= 2);
    await assert.rejects(c.chat.completions.create({ model: 'tiny', messages: msgs('x'), tools: [{ type: 'function' }] }), (e) => e.status === 400);
  } finally { await t.stop(); }
});

test('API keys: every endpoint but /health and the dashboard needs one; 401 in OpenAI form', async () => {
  const keyFile = writeFile('keys.txt', '# keys\nsecond-key\n\nthird-key\n');
  const t = await startServer(['--api-key', 'first-key', '--api-key-file', keyFile]);
  try {
    const anon = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(anon.models.list(), (e) => e.status === 401 && /API key/.test(e.message));
    for (const key of ['first-key', 'third-key']) {
      const c = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: key, maxRetries: 0 });
      const r = await c.chat.completions.create({ model: 'tiny', messages: msgs('hi'), max_tokens: 2 });
      assert.equal(r.choices.length, 1);
    }
    assert.equal((await fetch(`${t.url}/health`)).status, 200);
    assert.equal((await fetch(`${t.url}/`)).status, 200, 'the dashboard page asks for the key itself');
    for (const p of ['/metrics', '/v1/cluster', '/api/tags']) assert.equal((await fetch(`${t.url}${p}`)).status, 401, p);
    const o = await fetch(`${t.url}/api/tags`);
    assert.equal(typeof (await o.json()).error, 'string');
    await sleep(100);
    const log = t.access();
    assert.ok(log.some((l) => l.key === 'key-3' && l.path === '/v1/chat/completions'), 'key id logged');
    assert.ok(!JSON.stringify(log).includes('third-key'), 'a key leaked into the log');
  } finally { await t.stop(); }
});

test('thinking goes to reasoning_content; reasoning_format none and chat_template_kwargs switch it', async () => {
  const t = await startServer(['--chat-template-file', writeFile('thinking-openai.jinja', THINKING_TEMPLATE)]);
  try {
    const c = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const args = { model: 'tiny', messages: msgs('why?'), max_tokens: 4, temperature: 0, logit_bias: { 120: 100 } };
    const r = await c.chat.completions.create(args);
    assert.equal(r.choices[0].message.reasoning_content, 'xxxx');
    assert.equal(r.choices[0].message.content, '');
    assert.equal(r.choices[0].finish_reason, 'length');
    let reasoning = '', content = '';
    for await (const chunk of await c.chat.completions.create({ ...args, stream: true })) {
      reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
      content += chunk.choices[0]?.delta?.content ?? '';
    }
    assert.equal(reasoning, 'xxxx');
    assert.equal(content, '');
    const none = await c.chat.completions.create({ ...args, reasoning_format: 'none' });
    assert.equal(none.choices[0].message.content, 'xxxx');
    assert.equal(none.choices[0].message.reasoning_content, undefined);
    // a stop string looks at the content only
    const inThought = await c.chat.completions.create({ ...args, stop: ['xx'] });
    assert.equal(inThought.choices[0].message.reasoning_content, 'xxxx');
    assert.equal(inThought.choices[0].finish_reason, 'length');
    const off = await c.chat.completions.create({ ...args, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(off.choices[0].message.content, 'xxxx');
    assert.equal(off.choices[0].message.reasoning_content, undefined);
    assert.ok(off.usage.prompt_tokens > r.usage.prompt_tokens, 'chat_template_kwargs did not reach the template');
    const stopped = await c.chat.completions.create({ ...args, chat_template_kwargs: { enable_thinking: false }, stop: ['xx'] });
    assert.equal(stopped.choices[0].message.content, '');
    assert.equal(stopped.choices[0].finish_reason, 'stop');
    assert.equal(stopped.usage.completion_tokens, 2);
    await assert.rejects(c.chat.completions.create({ ...args, reasoning_format: 'sometimes' }),
      (e) => e.status === 400 && /reasoning_format/.test(e.message));
    await assert.rejects(c.chat.completions.create({ ...args, chat_template_kwargs: { messages: [] } }),
      (e) => e.status === 400 && /chat_template_kwargs/.test(e.message));
  } finally { await t.stop(); }
});
