// helpers.mjs - starts `racimo serve` on a free loopback port with a
// synthetic model written by `racimo make-model`, and stops it.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const BIN = resolve(process.env.RACIMO_BIN || join(here, '../../build/rel/racimo'));

let modelDir = null;
// One folder of models per test process: tiny (llama style) and tiny-qwen2.
export function models() {
  if (modelDir) return modelDir;
  modelDir = mkdtempSync(join(tmpdir(), 'racimo-e2e-'));
  execFileSync(BIN, ['make-model', '--preset', 'tiny', '--type', 'Q8_0', '-o', join(modelDir, 'tiny.gguf')]);
  execFileSync(BIN, ['make-model', '--preset', 'tiny-qwen2', '--type', 'Q8_0', '-o', join(modelDir, 'tiny-qwen2.gguf')]);
  process.on('exit', () => rmSync(modelDir, { recursive: true, force: true }));
  return modelDir;
}

export function writeFile(name, text) {
  const p = join(models(), name);
  writeFileSync(p, text);
  return p;
}

// Starts a server; resolves to { url, port, proc, stop(), log(), access() }.
export async function startServer(args = [], { env = {}, preload = true } = {}) {
  const dir = models();
  const accessLog = join(dir, `access-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}.log`);
  // RACIMO_MESH=1: every server runs the full mesh instead of SWIM (as the
  // namespace tests do)
  const all = ['serve', '--port', '0', '-t', '1', '--access-log', accessLog,
    ...(preload ? ['-m', join(dir, 'tiny.gguf')] : []),
    ...(process.env.RACIMO_MESH === '1' ? ['--mesh'] : []), ...args];
  const proc = spawn(BIN, all, {
    // Each server gets its own state directory (cluster key, node id), so
    // tests never touch ~/.racimo and parallel servers do not share a lock.
    env: { ...process.env, RACIMO_MODELS_DIR: dir, RACIMO_MODELS_READ_ONLY_DIRS: '',
      RACIMO_HOME: mkdtempSync(join(tmpdir(), 'racimo-home-')), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  const port = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`server did not start: ${stderr}`)), 20000);
    proc.stderr.on('data', (d) => {
      stderr += d;
      const m = /listening on http:\/\/[^:]+:(\d+)/.exec(stderr);
      if (m) { clearTimeout(timer); ok(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); fail(new Error(`server exited ${code}: ${stderr}`)); });
  });
  proc.stdout.resume();
  const url = `http://127.0.0.1:${port}`;
  // wait until the preloaded model is ready
  for (let i = 0; i < 200; i++) {
    const r = await fetch(`${url}/health`).catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((r2) => setTimeout(r2, 50));
  }
  return {
    url, port, proc,
    log: () => stderr,
    access: () => readFileSync(accessLog, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)),
    // SIGTERM: a clean shutdown must exit 0 (a sanitizer build exits
    // otherwise on a leak or a memory error)
    stop: () => new Promise((ok, fail) => {
      const done = (code) => (code === 0 ? ok(code) : fail(new Error(`server exited ${code}: ${stderr.slice(-3000)}`)));
      if (proc.exitCode !== null) return done(proc.exitCode);
      proc.once('exit', (code) => done(code));
      proc.kill('SIGTERM');
    }),
  };
}

export function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}

export async function metric(url, name, labels = '') {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + (labels ? `{${labels}}` : '')));
  return line ? Number(line.split(' ').pop()) : NaN;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A template that thinks like Qwen3 (the enable_thinking switch) but whose
// generation prompt opens the block itself, as DeepSeek-R1's does: whatever
// the random model writes is then thinking (the OpenAI tests force it to
// "xxxx" with logit_bias: token 120 is the byte 'x').
export const THINKING_TEMPLATE =
  "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}" +
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}" +
  "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}" +
  "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}{%- endif -%}";

// A Hermes-style template (Qwen2.5's tool-call format) that renders tools,
// tool calls and tool results.
export const HERMES_TEMPLATE =
  "{%- if tools %}<|im_start|>system\nYou may call functions. Answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n<tools>" +
  "{%- for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{%- endif %}" +
  "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}" +
  "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{%- endfor %}" +
  "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
