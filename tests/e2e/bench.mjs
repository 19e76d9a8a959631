// bench.mjs - throughput of `racimo serve` with 1, 4, 8 and 16 concurrent
// streams (continuous batching), with the official openai client.
//   node tests/e2e/bench.mjs MODEL.gguf [threads] [tokens per request] [streams list, e.g. 1,8]
// Not a test: prints a table for BENCHMARKS.md.  Checks first that a
// request returns exactly the tokens asked for.
import OpenAI from 'openai';
import { startServer } from './helpers.mjs';
import { basename } from 'node:path';

const [model, threads = '2', perReq = '64', concList = '1,4,8,16'] = process.argv.slice(2);
if (!model) { console.error('usage: node bench.mjs MODEL.gguf [threads] [tokens] [streams list]'); process.exit(2); }
const concs = concList.split(',').map(Number);
if (concs.some((n) => !Number.isInteger(n) || n < 1 || n > 16)) {
  console.error(`bench.mjs: streams list '${concList}' must be whole numbers from 1 to 16 (the server runs --parallel 16)`);
  process.exit(2);
}
const name = basename(model).replace(/\.gguf$/, '');
const N = Number(perReq);
const srv = await startServer(['-m', model, '-t', threads, '--parallel', '16', '-c', '512', '--no-access-log'],
  { preload: false });
for (let i = 0; i < 600; i++) {   // a big model takes a while to load
  if ((await fetch(`${srv.url}/health`)).status === 200) break;
  await new Promise((r) => setTimeout(r, 200));
}
const c = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 600000 });

async function stream(i) {
  const t0 = performance.now();
  let first = 0, usage;
  const s = await c.chat.completions.create({ model: name, stream: true, max_tokens: N, ignore_eos: true,
    temperature: 0.8, seed: i + 1, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: `Write a story about machine number ${i}.` }] });
  for await (const chunk of s) {
    if (!first && chunk.choices[0]?.delta?.content) first = performance.now();
    if (chunk.usage) usage = chunk.usage;
  }
  if (usage.completion_tokens !== N) throw new Error(`stream ${i}: ${usage.completion_tokens} tokens, wanted ${N}`);
  return { ttft: first - t0, total: performance.now() - t0 };
}

await stream(0);                     // warm-up and correctness check
const rows = [];
for (const conc of concs) {
  const t0 = performance.now();
  const res = await Promise.all(Array.from({ length: conc }, (_, i) => stream(i)));
  const secs = (performance.now() - t0) / 1000;
  const tokens = conc * N;
  rows.push({ conc, tokens, secs, tps: tokens / secs,
    ttft: res.reduce((a, r) => a + r.ttft, 0) / conc, perStream: N / (res.reduce((a, r) => a + r.total, 0) / conc / 1000) });
}
console.log(`model ${name}, ${threads} threads, ${N} tokens per stream\n`);
console.log('| concurrent streams | tokens | wall s | total tokens/s | per stream tokens/s | mean TTFT ms | vs 1 stream |');
console.log('| ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
for (const r of rows)
  console.log(`| ${r.conc} | ${r.tokens} | ${r.secs.toFixed(1)} | ${r.tps.toFixed(1)} | ${r.perStream.toFixed(1)} | ${r.ttft.toFixed(0)} | ${(r.tps / rows[0].tps).toFixed(2)}x |`);
await srv.stop();
