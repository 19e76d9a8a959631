// structured.test.mjs - constrained output through the official clients: OpenAI
// response_format (json_schema via zod and client.chat.completions.parse,
// json_object), tool_choice required / named giving valid calls (whole and
// streamed), Ollama format (schema and "json").  The models have random
// weights: whatever they write, the grammar keeps it inside the schema, so
// every answer must parse and validate.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { Ollama } from 'ollama';
import { z } from 'zod';
import { startServer, writeFile, HERMES_TEMPLATE } from './helpers.mjs';

let srv, client, ollama;

before(async () => {
  srv = await startServer(['--chat-template-file', writeFile('hermes-structured.jinja', HERMES_TEMPLATE)]);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0 });
  ollama = new Ollama({ host: srv.url });
});
after(async () => { await srv.stop(); });

const msgs = (text) => [{ role: 'user', content: text }];

// Bounded everywhere (enums, integer ranges, short strings) so that a random
// model finishes well within max_tokens.
const Weather = z.object({
  city: z.enum(['Paris', 'Lima', 'Oslo']),
  celsius: z.number().int().min(-40).max(50),
  sunny: z.boolean(),
  note: z.string().max(6),
  tags: z.array(z.enum(['wind', 'rain'])).max(2),
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Lima'] },
      days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'], additionalProperties: false },
  },
};
const timeTool = {
  type: 'function',
  function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { enum: ['UTC', 'CET'] } },
    required: ['zone'], additionalProperties: false } },
};

function checkWeatherArgs(args) {
  const a = JSON.parse(args);
  assert.ok(['Paris', 'Lima'].includes(a.city), args);
  assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 7, args);
  assert.deepEqual(Object.keys(a).sort(), ['city', 'days']);
}

test('response_format json_schema from zod: parse() returns the parsed object', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.parse({
      model: 'tiny', messages: msgs('weather?'), max_tokens: 400, seed, temperature: 1,
      response_format: zodResponseFormat(Weather, 'weather'),
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop', m.content);
    assert.ok(m.parsed, m.content);
    Weather.parse(m.parsed);
  }
});

test('response_format json_object and a hand-written json_schema', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: msgs('json please'), max_tokens: 300,
    seed: 4, response_format: { type: 'json_object' } });
  if (r.choices[0].finish_reason === 'stop') {
    assert.equal(typeof JSON.parse(r.choices[0].message.content), 'object');
  } else {
    assert.match(r.choices[0].message.content, /^\{/);   // cut by max_tokens, but an object so far
  }
  const s = await client.chat.completions.create({ model: 'tiny', messages: msgs('x'), max_tokens: 200, seed: 5,
    response_format: { type: 'json_schema', json_schema: { name: 'pick', strict: true,
      schema: { type: 'object', properties: { pick: { anyOf: [{ type: 'integer', minimum: 0, maximum: 9 }, { type: 'null' }] } },
        required: ['pick'], additionalProperties: false } } } });
  const v = JSON.parse(s.choices[0].message.content);
  assert.ok(v.pick === null || (Number.isInteger(v.pick) && v.pick >= 0 && v.pick <= 9), s.choices[0].message.content);
});

test('unsupported schema keywords are a 400 naming them', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: msgs('x'), max_tokens: 5,
    response_format: { type: 'json_schema', json_schema: { name: 'u', schema: { type: 'array', uniqueItems: true } } } }),
  (e) => e.status === 400 && /uniqueItems/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: msgs('x'), max_tokens: 5,
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { not: {} } } } } }],
    tool_choice: 'required' }),
  (e) => e.status === 400 && /'not'/.test(e.message) && /tool 'f'/.test(e.message));
  // the server keeps serving
  const ok = await client.chat.completions.create({ model: 'tiny', messages: msgs('x'), max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test('tool_choice required: a random-weight model gives a valid tool call', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ model: 'tiny', messages: msgs('weather in Paris?'), max_tokens: 400,
      seed, temperature: 1, tools: [weatherTool, timeTool], tool_choice: 'required' });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.ok(c.message.tool_calls.length >= 1);
    for (const call of c.message.tool_calls) {
      assert.equal(call.type, 'function');
      assert.ok(call.id);
      if (call.function.name === 'get_weather') checkWeatherArgs(call.function.arguments);
      else assert.deepEqual(JSON.parse(call.function.arguments).zone.length, 3);
    }
  }
});

test('tool_choice naming a function calls that function', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: msgs('weather?'), max_tokens: 400, seed: 9,
    tools: [weatherTool, timeTool], tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const calls = r.choices[0].message.tool_calls;
  assert.ok(calls.length >= 1);
  for (const call of calls) {
    assert.equal(call.function.name, 'get_weather');
    checkWeatherArgs(call.function.arguments);
  }
});

test('streamed tool-call deltas assemble into valid calls', async () => {
  const s = await client.chat.completions.create({ model: 'tiny', messages: msgs('weather?'), max_tokens: 400, seed: 11,
    tools: [weatherTool], tool_choice: 'required', stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    for (const d of ch.delta.tool_calls ?? []) {
      calls[d.index] ??= { name: '', args: '' };
      if (d.function?.name) calls[d.index].name += d.function.name;
      if (d.function?.arguments) calls[d.index].args += d.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.ok(calls.length >= 1);
  for (const c of calls) {
    assert.equal(c.name, 'get_weather');
    checkWeatherArgs(c.args);
  }
});

test('ollama format: a schema and "json"', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 1, maximum: 3 } },
    required: ['ok', 'n'] };
  for (const seed of [1, 2]) {
    const r = await ollama.chat({ model: 'tiny', messages: msgs('answer'), format: schema, stream: false,
      options: { seed, num_predict: 300 } });
    const v = JSON.parse(r.message.content);
    assert.equal(typeof v.ok, 'boolean');
    assert.ok([1, 2, 3].includes(v.n), r.message.content);
  }
  const g = await ollama.generate({ model: 'tiny', prompt: 'answer', format: schema, stream: false, options: { seed: 3, num_predict: 300 } });
  assert.equal(typeof JSON.parse(g.response).ok, 'boolean');
  const j = await ollama.chat({ model: 'tiny', messages: msgs('json'), format: 'json', stream: false, options: { seed: 4, num_predict: 300 } });
  assert.match(j.message.content, /^\{/);
  await assert.rejects(ollama.chat({ model: 'tiny', messages: msgs('x'), format: { type: 'string', format: 'ipv6' }, stream: false }),
    (e) => e.status_code === 400 && /ipv6/.test(e.error));
});
