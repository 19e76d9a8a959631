// anthropic.test.mjs - racimo serve's Anthropic Messages API driven by the
// official `@anthropic-ai/sdk` package: messages.create, messages.stream
// (events and finalMessage), tools and tool results, forced tool_use
// (tool_choice any / tool), structured output (output_config.format), thinking,
// count_tokens, API keys and errors.  Synthetic models have random
// weights: these tests check protocol and behaviour, not text.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, writeFile, THINKING_TEMPLATE, HERMES_TEMPLATE } from './helpers.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['-c', '512', '--parallel', '2', '--api-key', 'secret']);
  client = new Anthropic({ baseURL: srv.url, apiKey: 'secret', maxRetries: 0 });
});
after(async () => { await srv.stop(); });

const user = (text) => [{ role: 'user', content: text }];

test('messages.create answers a message object', async () => {
  const r = await client.messages.create({ model: 'tiny', system: 'You are terse.', messages: user('hello'),
    max_tokens: 6, temperature: 0, metadata: { user_id: 'u1' } });
  assert.match(r.id, /^msg_/);
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(r.model, 'tiny');
  assert.equal(r.content.length, 1);
  assert.equal(r.content[0].type, 'text');
  assert.equal(typeof r.content[0].text, 'string');
  assert.ok(['end_turn', 'max_tokens'].includes(r.stop_reason), r.stop_reason);
  assert.equal(r.stop_sequence, null);
  assert.ok(r.usage.input_tokens > 0);
  assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 6);
  // greedy: the same answer again, with a system prompt as text blocks
  const again = await client.messages.create({ model: 'tiny', messages: user('hello'), max_tokens: 6, temperature: 0,
    system: [{ type: 'text', text: 'You are terse.', cache_control: { type: 'ephemeral' } }] });
  assert.equal(again.content[0].text, r.content[0].text);
  assert.equal(again.usage.input_tokens, r.usage.input_tokens);
});

test('stop_sequences end the text and are named', async () => {
  const r = await client.messages.create({ model: 'tiny', messages: user('hello'), max_tokens: 12, temperature: 0 });
  const text = r.content[0].text;
  const ch = [...text].find((c, i) => i > 0 && /[A-Za-z0-9]/.test(c));
  assert.ok(ch, `no letter to stop at in ${JSON.stringify(text)}`);
  const s = await client.messages.create({ model: 'tiny', messages: user('hello'), max_tokens: 12, temperature: 0,
    stop_sequences: [ch] });
  assert.equal(s.stop_reason, 'stop_sequence');
  assert.equal(s.stop_sequence, ch);
  assert.equal(s.content[0].text, text.slice(0, text.indexOf(ch)));
});

test('messages.stream: Anthropic events, text deltas and finalMessage', async () => {
  const whole = await client.messages.create({ model: 'tiny', messages: user('stream this'), max_tokens: 8, temperature: 0 });
  const stream = client.messages.stream({ model: 'tiny', messages: user('stream this'), max_tokens: 8, temperature: 0 });
  const types = [];
  let text = '';
  stream.on('streamEvent', (e) => types.push(e.type));
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  assert.ok(types.includes('content_block_start') && types.includes('content_block_stop'));
  assert.equal(text, whole.content[0].text);
  assert.equal(final.content[0].text, whole.content[0].text);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.input_tokens, whole.usage.input_tokens);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  // the raw stream as an iterator
  const raw = await client.messages.create({ model: 'tiny', messages: user('stream this'), max_tokens: 4, stream: true });
  let n = 0;
  for await (const e of raw) if (e.type === 'content_block_delta') n++;
  assert.ok(n >= 1);
});

test('output_config.format: the text is JSON of the schema', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 1, maximum: 3 } },
    required: ['ok', 'n'], additionalProperties: false };
  for (const temperature of [0, 1]) {
    const r = await client.messages.create({ model: 'tiny', messages: user('answer in JSON'), max_tokens: 200, temperature,
      output_config: { format: { type: 'json_schema', schema } } });
    assert.equal(r.stop_reason, 'end_turn');
    const v = JSON.parse(r.content[0].text);
    assert.equal(typeof v.ok, 'boolean');
    assert.ok(Number.isInteger(v.n) && v.n >= 1 && v.n <= 3, r.content[0].text);
    assert.deepEqual(Object.keys(v).sort(), ['n', 'ok']);
  }
  await assert.rejects(client.messages.create({ model: 'tiny', messages: user('x'), max_tokens: 5,
    output_config: { format: { type: 'json_schema', schema: { type: 'array', uniqueItems: true } } } }),
  (e) => e instanceof Anthropic.BadRequestError && /uniqueItems/.test(e.message));
});

test('count_tokens counts the prompt of messages.create', async () => {
  const args = { model: 'tiny', system: 'You are terse.', messages: user('count me') };
  const c = await client.messages.countTokens(args);
  const r = await client.messages.create({ ...args, max_tokens: 1 });
  assert.equal(c.input_tokens, r.usage.input_tokens);
});

test('API keys: x-api-key and Bearer; a wrong key is an authentication_error', async () => {
  const wrong = new Anthropic({ baseURL: srv.url, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: 'tiny', messages: user('hi'), max_tokens: 2 }),
    (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 && e.error?.error?.type === 'authentication_error');
  const bearer = new Anthropic({ baseURL: srv.url, apiKey: null, authToken: 'secret', maxRetries: 0 });
  const r = await bearer.messages.create({ model: 'tiny', messages: user('hi'), max_tokens: 2 });
  assert.equal(r.type, 'message');
});

test('errors come back in Anthropic\'s shape', async () => {
  await assert.rejects(client.messages.create({ model: 'nope', messages: user('hi'), max_tokens: 2 }),
    (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error');
  await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
  (e) => e instanceof Anthropic.BadRequestError && /image blocks are not supported/.test(e.message));
  await assert.rejects(client.messages.create({ model: 'tiny', messages: user('hi'), max_tokens: 2, temperature: 3 }),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error');
  // the server still serves after all that
  const ok = await client.messages.create({ model: 'tiny', messages: user('still there?'), max_tokens: 2 });
  assert.equal(ok.type, 'message');
});

test('tools, tool_use and tool_result render through the template; a round trip answers', async () => {
  const t = await startServer(['--chat-template-file', writeFile('hermes-anthropic.jinja', HERMES_TEMPLATE), '-c', '1024']);
  try {
    const c = new Anthropic({ baseURL: t.url, apiKey: 'x', maxRetries: 0 });
    const tools = [{ name: 'get_weather', description: 'Weather in a city',
      input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
    const ask = user('weather in Paris?');
    const without = await c.messages.countTokens({ model: 'tiny', messages: ask });
    const withTools = await c.messages.create({ model: 'tiny', messages: ask, tools, max_tokens: 3, temperature: 0 });
    assert.ok(withTools.usage.input_tokens > without.input_tokens + 20, 'tools were not rendered');
    assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(withTools.stop_reason));
    const none = await c.messages.countTokens({ model: 'tiny', messages: ask, tools, tool_choice: { type: 'none' } });
    assert.equal(none.input_tokens, without.input_tokens);
    // the round trip: the assistant's tool_use, the user's tool_result
    const history = [...ask,
      { role: 'assistant', content: [{ type: 'text', text: 'Let me look.' },
        { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '{"temp": 21}' }] }];
    const r = await c.messages.create({ model: 'tiny', messages: history, tools, max_tokens: 3, temperature: 0 });
    assert.ok(r.usage.input_tokens > withTools.usage.input_tokens + 10, 'the tool turns were not rendered');
    assert.equal(r.type, 'message');
    const blocks = [...history.slice(0, 2),
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: '{"temp": 21}' }] }] }];
    assert.equal((await c.messages.countTokens({ model: 'tiny', messages: blocks, tools })).input_tokens, r.usage.input_tokens);
    const s = c.messages.stream({ model: 'tiny', messages: history, tools, max_tokens: 3, temperature: 0 });
    const final = await s.finalMessage();
    assert.equal(final.usage.input_tokens, r.usage.input_tokens);
    await assert.rejects(c.messages.create({ model: 'tiny', messages: ask, max_tokens: 2,
      tools, tool_choice: { type: 'tool', name: 'other' } }), (e) => e.status === 400 && /not in 'tools'/.test(e.message));
  } finally { await t.stop(); }
});

// Bounded (enums, an integer range) so that a random model's forced call
// ends well within max_tokens.
const boundedTools = [
  { name: 'get_weather', description: 'Weather in a city',
    input_schema: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Lima'] },
      days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'], additionalProperties: false } },
  { name: 'get_time', input_schema: { type: 'object', properties: { zone: { enum: ['UTC', 'CET'] } },
    required: ['zone'], additionalProperties: false } },
];

function checkToolUse(b, name) {
  assert.equal(b.type, 'tool_use');
  assert.match(b.id, /^toolu_/);
  if (name) assert.equal(b.name, name);
  if (b.name === 'get_weather') {
    assert.ok(['Paris', 'Lima'].includes(b.input.city), JSON.stringify(b.input));
    assert.ok(Number.isInteger(b.input.days) && b.input.days >= 1 && b.input.days <= 7, JSON.stringify(b.input));
  } else {
    assert.equal(b.name, 'get_time');
    assert.ok(['UTC', 'CET'].includes(b.input.zone), JSON.stringify(b.input));
  }
}

test('tool_choice any / tool: a random-weight model gives valid tool_use blocks; the round trip answers', async () => {
  const t = await startServer(['--chat-template-file', writeFile('hermes-anthropic-forced.jinja', HERMES_TEMPLATE), '-c', '2048']);
  try {
    const c = new Anthropic({ baseURL: t.url, apiKey: 'x', maxRetries: 0 });
    const ask = user('weather in Paris?');
    for (const temperature of [0, 1]) {
      const r = await c.messages.create({ model: 'tiny', messages: ask, max_tokens: 400, temperature,
        tools: boundedTools, tool_choice: { type: 'any' } });
      assert.equal(r.stop_reason, 'tool_use', JSON.stringify(r.content));
      const uses = r.content.filter((b) => b.type === 'tool_use');
      assert.ok(uses.length >= 1);
      for (const b of uses) checkToolUse(b);
      assert.equal(new Set(uses.map((b) => b.id)).size, uses.length, 'tool_use ids repeat');
    }
    const named = await c.messages.create({ model: 'tiny', messages: ask, max_tokens: 400, temperature: 0,
      tools: boundedTools, tool_choice: { type: 'tool', name: 'get_time' } });
    assert.equal(named.stop_reason, 'tool_use');
    for (const b of named.content.filter((x) => x.type === 'tool_use')) checkToolUse(b, 'get_time');
    // streamed: input_json_delta assembles into the same input
    const s = c.messages.stream({ model: 'tiny', messages: ask, max_tokens: 400, temperature: 0,
      tools: boundedTools, tool_choice: { type: 'tool', name: 'get_time' } });
    const types = [];
    s.on('streamEvent', (e) => types.push(e.type === 'content_block_delta' ? e.delta.type : e.type));
    const final = await s.finalMessage();
    assert.ok(types.includes('input_json_delta'), types.join(','));
    assert.equal(final.stop_reason, 'tool_use');
    assert.deepEqual(final.content.filter((b) => b.type === 'tool_use').map((b) => [b.name, b.input]),
      named.content.filter((b) => b.type === 'tool_use').map((b) => [b.name, b.input]));
    // the round trip: the calls go back with their results, and the model answers
    const results = named.content.filter((b) => b.type === 'tool_use')
      .map((b) => ({ type: 'tool_result', tool_use_id: b.id, content: '12:00' }));
    const answer = await c.messages.create({ model: 'tiny', max_tokens: 4, temperature: 0, tools: boundedTools,
      messages: [...ask, { role: 'assistant', content: named.content }, { role: 'user', content: results }] });
    assert.equal(answer.type, 'message');
    assert.ok(answer.usage.input_tokens > named.usage.input_tokens);
  } finally { await t.stop(); }
});

test('thinking: thinking blocks, streamed as thinking deltas; disabled switches the template', async () => {
  const t = await startServer(['--chat-template-file', writeFile('thinking-anthropic.jinja', THINKING_TEMPLATE)]);
  try {
    const c = new Anthropic({ baseURL: t.url, apiKey: 'x', maxRetries: 0 });
    const args = { model: 'tiny', messages: user('why?'), max_tokens: 6, temperature: 0,
      thinking: { type: 'enabled', budget_tokens: 1024 } };
    const r = await c.messages.create(args);
    assert.equal(r.content[0].type, 'thinking');
    assert.ok(r.content[0].thinking.length > 0);
    assert.equal(r.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), '');
    let thinking = '';
    const s = c.messages.stream(args);
    s.on('thinking', (d) => { thinking += d; });
    const final = await s.finalMessage();
    assert.equal(thinking, r.content[0].thinking);
    assert.equal(final.content[0].thinking, r.content[0].thinking);
    const off = await c.messages.create({ ...args, thinking: { type: 'disabled' } });
    assert.ok(!off.content.some((b) => b.type === 'thinking'));
    assert.ok(off.usage.input_tokens > r.usage.input_tokens);
    // an earlier turn's thinking goes back to the template
    const next = await c.messages.countTokens({ model: 'tiny', messages: [...user('why?'),
      { role: 'assistant', content: [{ type: 'thinking', thinking: 'because', signature: '' }, { type: 'text', text: 'so' }] },
      ...user('and?')] });
    assert.ok(next.input_tokens > r.usage.input_tokens);
  } finally { await t.stop(); }
});
