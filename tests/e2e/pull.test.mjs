// pull.test.mjs - `racimo pull` and POST /api/pull against a fake Hugging
// Face Hub on loopback (fake_hub.mjs): tag choice, redirects to a CDN, a
// gated repository, pages of the listing, a cut connection resumed, Ctrl-C
// resumed, a wrong sha256, a full disk.  Every case ends with a verified
// file or a clear error, and never a partial file in the models folder.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, existsSync, writeFileSync, statSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { Ollama } from 'ollama';
import { BIN, startServer } from './helpers.mjs';
import { startHub } from './fake_hub.mjs';

const sha = (b) => createHash('sha256').update(b).digest('hex');
let hub, work, q8, q4, big, parts3;
const sigint = { pid: 0, sent: false };
// org/slow stops at half its bytes until the test releases it
const slow = {};
const twice = {};
slow.halfway = new Promise((ok) => { slow.reached = ok; });
slow.release = new Promise((ok) => { slow.go = ok; });

function model(type, extra = []) {
  const p = join(work, `src-${type}-${extra.join('')}.gguf`);
  execFileSync(BIN, ['make-model', '--preset', 'tiny', '--type', type, ...extra, '-o', p]);
  return readFileSync(p);
}

before(async () => {
  work = mkdtempSync(join(tmpdir(), 'racimo-pull-'));
  q8 = model('Q8_0');
  q4 = model('Q4_K_M');
  big = model('F32', ['--layers', '4']);
  // the same model written as 3 parts (llama.cpp's split layout)
  execFileSync(BIN, ['make-model', '--preset', 'tiny', '--type', 'F32', '--layers', '4', '--split', '3', '-o', join(work, 'big.gguf')]);
  const parts = [1, 2, 3].map((i) => readFileSync(join(work, `big-0000${i}-of-00003.gguf`)));
  parts3 = parts;
  hub = await startHub({
    repos: {
      'org/tiny-GGUF': { files: { 'tiny-Q8_0.gguf': q8, 'tiny-Q4_K_M.gguf': q4, 'mmproj-tiny-Q8_0.gguf': q8.subarray(0, 1000) } },
      'org/only': { files: { 'sub/only-F32.gguf': big } },
      'org/gated': { token: 'hf_secret', files: { 'gated-Q8_0.gguf': q8 } },
      'org/split': { files: Object.fromEntries(parts.map((p, i) => [`big-F32-0000${i + 1}-of-00003.gguf`, p])) },
      'org/cut': { cutOnce: ['cut-Q8_0.gguf'], files: { 'cut-Q8_0.gguf': q8 } },
      'org/wrong': { wrongSha: ['wrong-Q8_0.gguf'], files: { 'wrong-Q8_0.gguf': q8 } },
      'org/slow': { files: { 'slow-F32.gguf': big }, onHalf: async () => {
        slow.reached();
        await slow.release;
      } },
      'org/twice': { files: { 'twice-Q8_0.gguf': q8 }, onHalf: async () => {
        // a second pull of the same file while the first is halfway
        twice.second = await pull(['hf.co/org/twice'], { dir: twice.dir });
      } },
      'org/full': { files: { 'full-F32.gguf': big }, onHalf: async () => fillDisk() },
      'org/stop': { files: { 'stop-F32.gguf': big }, onHalf: async () => {
        if (sigint.pid && !sigint.sent) process.kill(sigint.pid, 'SIGINT');
        sigint.sent = true;
        // hold the rest of the file back until the pull has exited (a loaded
        // machine may take a while to deliver the signal)
        for (let i = 0; i < 1500 && sigint.pid; i++) await new Promise((r) => setTimeout(r, 20));
      } },
    },
  });
});
after(async () => { await hub.stop(); rmSync(work, { recursive: true, force: true }); });

function pull(args, { env = {}, dir } = {}) {
  return new Promise((ok) => {
    const p = spawn(BIN, ['pull', ...args, '--models-dir', dir], {
      env: { ...process.env, HF_ENDPOINT: hub.url, HF_TOKEN: '', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    sigint.pid = p.pid;
    p.on('exit', (code) => { sigint.pid = 0; ok({ code, out, err }); });
  });
}

const newDir = () => mkdtempSync(join(work, 'models-'));
// what a model scan sees: the .gguf files (the staging folder is hidden)
const ggufs = (dir) => readdirSync(dir).filter((f) => f.endsWith('.gguf')).sort();
const parts = (dir) => (existsSync(join(dir, '.partial')) ? readdirSync(join(dir, '.partial')) : []);

test('a tag picks its file, case-insensitively, through the redirect to the CDN', async () => {
  // a first pull makes the folder and its parents
  const dir = join(newDir(), 'home', '.racimo', 'models');
  const r = await pull(['hf.co/org/tiny-GGUF:q8_0'], { dir });
  assert.equal(r.code, 0, r.err);
  assert.equal(r.out.trim(), 'tiny-Q8_0');
  assert.deepEqual(ggufs(dir), ['tiny-Q8_0.gguf']);
  assert.ok(readFileSync(join(dir, 'tiny-Q8_0.gguf')).equals(q8));
  assert.match(r.err, /sha256 verified/);
  assert.ok(!existsSync(join(dir, '.partial')), 'the empty staging folder is removed');
  // not on a terminal: plain lines, no carriage returns
  assert.ok(!r.err.includes('\r'));
  // a second pull finds it there
  const again = await pull(['hf.co/org/tiny-GGUF:Q8_0'], { dir });
  assert.equal(again.code, 0, again.err);
  // and the served model is the file
  const tok = execFileSync(BIN, ['tokenize', '-m', join(dir, 'tiny-Q8_0.gguf'), 'hello']).toString();
  assert.ok(tok.trim().length > 0);
});

test('no tag: Q4_K_M; or the only model of the repository, in a folder', async () => {
  const dir = newDir();
  const r = await pull(['huggingface.co/org/tiny-GGUF'], { dir });
  assert.equal(r.code, 0, r.err);
  assert.deepEqual(ggufs(dir), ['tiny-Q4_K_M.gguf']);
  assert.ok(readFileSync(join(dir, 'tiny-Q4_K_M.gguf')).equals(q4));
  const only = await pull(['org/only'], { dir });
  assert.equal(only.code, 0, only.err);
  assert.ok(readFileSync(join(dir, 'only-F32.gguf')).equals(big));
});

test('unknown tags, repositories and names are clear errors', async () => {
  const dir = newDir();
  let r = await pull(['hf.co/org/tiny-GGUF:Q5_K'], { dir });
  assert.equal(r.code, 1);
  assert.match(r.err, /no GGUF file tagged Q5_K.*tiny-Q8_0\.gguf/);
  r = await pull(['hf.co/org/missing'], { dir });
  assert.equal(r.code, 1);
  assert.match(r.err, /org\/missing not found/);
  r = await pull(['llama3'], { dir });
  assert.equal(r.code, 1);
  assert.match(r.err, /not a Hugging Face repository/);
  assert.deepEqual(ggufs(dir), []);
});

test('a gated repository needs a token; a wrong one is refused', async () => {
  const dir = newDir();
  let r = await pull(['hf.co/org/gated:Q8_0'], { dir });
  assert.equal(r.code, 1);
  assert.match(r.err, /gated or private.*HF_TOKEN or pass --token/);
  r = await pull(['hf.co/org/gated:Q8_0', '--token', 'hf_wrong'], { dir });
  assert.equal(r.code, 1);
  assert.match(r.err, /token was refused/);
  assert.deepEqual(ggufs(dir), []);
  const before = hub.log.length;
  r = await pull(['hf.co/org/gated:Q8_0'], { dir, env: { HF_TOKEN: 'hf_secret' } });
  assert.equal(r.code, 0, r.err);
  assert.ok(readFileSync(join(dir, 'gated-Q8_0.gguf')).equals(q8));
  const cdn = hub.log.slice(before).filter((l) => l.file === 'gated-Q8_0.gguf');
  assert.equal(cdn.length, 1);
  assert.equal(cdn[0].authorization, undefined, 'the token stays with the Hub');
});

test('a split model comes whole: every part verified, kept as published, loaded in place', async () => {
  const dir = newDir();
  const r = await pull(['org/split', '--file', 'big-F32-00002-of-00003.gguf'], { dir });
  assert.equal(r.code, 0, r.err);
  assert.equal(r.out.trim(), 'big-F32');
  assert.match(r.err, /big-F32-00003-of-00003.gguf: .*sha256 verified/);
  assert.doesNotMatch(r.err, /joining/);
  const names = [1, 2, 3].map((i) => `big-F32-0000${i}-of-00003.gguf`);
  assert.deepEqual(ggufs(dir), names);
  assert.deepEqual(parts(dir), []);
  names.forEach((n, i) => assert.ok(readFileSync(join(dir, n)).equals(parts3[i]), n));
  // the set loads by its first part, as the model before it was split
  const a = execFileSync(BIN, ['logits', '-m', join(dir, names[0]), '--tokens', '1,2,3']);
  const b = execFileSync(BIN, ['logits', '-m', join(work, 'src-F32---layers4.gguf'), '--tokens', '1,2,3']);
  assert.ok(a.equals(b), 'the same logits as the whole model');
  const again = await pull(['hf.co/org/split:f32'], { dir });
  assert.equal(again.code, 0, again.err);
  assert.doesNotMatch(again.err, /downloading/);
});

test('a connection cut mid-file is resumed with a range request', async () => {
  const dir = newDir();
  const before = hub.log.length;
  const r = await pull(['hf.co/org/cut:Q8_0'], { dir });
  assert.equal(r.code, 0, r.err);
  assert.ok(readFileSync(join(dir, 'cut-Q8_0.gguf')).equals(q8));
  const served = hub.log.slice(before).filter((l) => l.file === 'cut-Q8_0.gguf');
  assert.equal(served.length, 2, JSON.stringify(served));
  assert.equal(served[0].start, 0);
  assert.equal(served[1].start, served[0].end, 'the second request starts where the cut was');
  assert.equal(served[1].end, q8.length);
});

test('Ctrl-C keeps a part that the next pull resumes', async () => {
  const dir = newDir();
  const before = hub.log.length;
  const r = await pull(['hf.co/org/stop'], { dir });
  assert.notEqual(r.code, 0);
  assert.match(r.err, /cancelled; the partial download is kept/);
  assert.deepEqual(ggufs(dir), []);
  assert.deepEqual(parts(dir), ['stop-F32.gguf.part']);
  const kept = statSync(join(dir, '.partial', 'stop-F32.gguf.part')).size;
  assert.ok(kept > 0 && kept < big.length, `${kept}`);
  const r2 = await pull(['hf.co/org/stop'], { dir });
  assert.equal(r2.code, 0, r2.err);
  assert.ok(readFileSync(join(dir, 'stop-F32.gguf')).equals(big));
  assert.deepEqual(parts(dir), []);
  const resumed = hub.log.slice(before).filter((l) => l.file === 'stop-F32.gguf' && l.start > 0);
  assert.deepEqual(resumed, [{ file: 'stop-F32.gguf', start: kept, end: big.length }]);
});

test('a wrong sha256 deletes the part and says so', async () => {
  const dir = newDir();
  const r = await pull(['hf.co/org/wrong:Q8_0'], { dir });
  assert.equal(r.code, 1);
  assert.match(r.err, /sha256 mismatch.*partial download was deleted/);
  assert.deepEqual(ggufs(dir), []);
  assert.deepEqual(parts(dir), []);
});

// A small tmpfs as the models folder, in a private mount namespace (root);
// the script finds it in $d and starts by printing "dir $d".
function inTmpfs(sizeMiB, script) {
  return new Promise((ok) => {
    const p = spawn('unshare', ['-m', 'sh', '-c',
      `set -e; d=$(mktemp -d); mount -t tmpfs -o size=${sizeMiB}m tmpfs "$d"; echo "dir $d"; ${script}`],
    { env: { ...process.env, HF_ENDPOINT: hub.url, HF_TOKEN: '', RACIMO: BIN }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => {
      stdout += d;
      const m = /^dir (\S+)$/m.exec(stdout);
      if (m) full.where = `/proc/${p.pid}/root${m[1]}`;
    });
    p.stderr.on('data', (d) => { stderr += d; });
    p.on('exit', (code) => { full.where = null; ok({ code, stdout, stderr }); });
  });
}

// The repository whose transfer stops at half while the test fills the
// disk of the pulling process (seen through /proc/PID/root).
const full = { where: null };
function fillDisk() {
  if (!full.where) return;
  const chunk = Buffer.alloc(1 << 20, 1);
  try {
    for (let i = 0; i < 4096; i++) writeFileSync(join(full.where, 'filler'), chunk, { flag: 'a' });
  } catch (e) {
    if (e.code !== 'ENOSPC') throw e;
  }
}

test('a disk without room: refused before, or cut by ENOSPC, no partial file', { skip: process.getuid() !== 0 && 'needs root (a tmpfs in a mount namespace)' }, async () => {
  // too small for the file and the margin: refused before any byte
  let r = await inTmpfs(8, '"$RACIMO" pull hf.co/org/tiny-GGUF:Q8_0 --models-dir "$d" || echo "exit $?"; ls -A "$d"');
  assert.match(r.stderr, /not enough free space/);
  assert.match(r.stdout, /exit 1/);
  assert.doesNotMatch(r.stdout, /gguf|partial/);
  // room at the start, then something else fills the disk mid-file
  r = await inTmpfs(80, '"$RACIMO" pull hf.co/org/full --models-dir "$d" || echo "exit $?"; ls -A "$d"; ls -A "$d/.partial" 2>/dev/null || true');
  assert.match(r.stderr, /no space left on the disk/);
  assert.match(r.stdout, /exit 1/);
  assert.doesNotMatch(r.stdout, /gguf/, 'neither the file nor a part remains');
});

test('the ollama client pulls through a node: progress, success, then it chats', async () => {
  const dir = newDir();
  const srv = await startServer([], { preload: false, env: { RACIMO_MODELS_DIR: dir, HF_ENDPOINT: hub.url, HF_TOKEN: '' } });
  try {
    const ollama = new Ollama({ host: srv.url });
    const seen = [];
    for await (const part of await ollama.pull({ model: 'hf.co/org/tiny-GGUF:Q8_0', stream: true })) seen.push(part);
    const statuses = seen.map((p) => p.status);
    assert.equal(statuses[0], 'pulling manifest');
    assert.ok(statuses.includes('verifying sha256 digest'), statuses.join(','));
    assert.equal(statuses.at(-1), 'success');
    const bytes = seen.filter((p) => p.status.startsWith('pulling ') && p.total);
    assert.ok(bytes.length > 0);
    assert.equal(bytes[0].digest, `sha256:${sha(q8)}`);
    assert.equal(bytes.at(-1).completed, q8.length);
    assert.equal(bytes.at(-1).total, q8.length);
    assert.ok(readFileSync(join(dir, 'tiny-Q8_0.gguf')).equals(q8));
    const names = (await ollama.list()).models.map((m) => m.name);
    assert.ok(names.includes('tiny-Q8_0:latest'), names.join(','));
    const r = await ollama.generate({ model: 'tiny-Q8_0', prompt: 'hi', stream: false, options: { num_predict: 3 } });
    assert.equal(r.done, true);
    // not streamed: one answer
    const once = await ollama.pull({ model: 'hf.co/org/tiny-GGUF:Q4_K_M', stream: false });
    assert.equal(once.status, 'success');
    assert.ok(readFileSync(join(dir, 'tiny-Q4_K_M.gguf')).equals(q4));
    // errors: in the stream, and as an HTTP status
    await assert.rejects(async () => {
      for await (const part of await ollama.pull({ model: 'hf.co/org/gated:Q8_0', stream: true })) void part;
    }, /gated or private/);
    const bad = await fetch(`${srv.url}/api/pull`, { method: 'POST', body: JSON.stringify({ model: 'hf.co/org/wrong:Q8_0', stream: false }) });
    assert.equal(bad.status, 502);
    assert.match((await bad.json()).error, /sha256 mismatch/);
    const noName = await fetch(`${srv.url}/api/pull`, { method: 'POST', body: '{"stream":false}' });
    assert.equal(noName.status, 400);
    assert.deepEqual(ggufs(dir), ['tiny-Q4_K_M.gguf', 'tiny-Q8_0.gguf']);
    // the node's own endpoint: one JSON answer naming the model
    const v1 = await fetch(`${srv.url}/v1/models/pull`, { method: 'POST', body: JSON.stringify({ model: 'org/split', file: 'big-F32-00001-of-00003.gguf' }) });
    assert.equal(v1.status, 200);
    assert.deepEqual(await v1.json(), { status: 'success', model: 'big-F32' });
    [1, 2, 3].forEach((i) => assert.ok(readFileSync(join(dir, `big-F32-0000${i}-of-00003.gguf`)).equals(parts3[i - 1])));
    const missing = await fetch(`${srv.url}/v1/models/pull`, { method: 'POST', body: JSON.stringify({ model: 'org/none' }) });
    assert.equal(missing.status, 404);
    assert.match((await missing.json()).error.message, /org\/none not found/);

    // racimo ls: every model of the cluster (here one node), type and the verified sha256
    const lines = () => execFileSync(BIN, ['ls', '--url', srv.url]).toString().split('\n');
    let ls;
    for (let i = 0; i < 100; i++) {
      ls = lines();
      if (ls.some((l) => l.startsWith('big-F32 '))) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const row = (name) => ls.find((l) => l.startsWith(`${name} `))?.split(/\s+/);
    assert.deepEqual([row('tiny-Q8_0')[0], row('tiny-Q8_0')[4], row('tiny-Q8_0')[5]], ['tiny-Q8_0', 'Q8_0', sha(q8)]);
    assert.equal(row('tiny-Q4_K_M')[5], sha(q4));
    assert.deepEqual([row('big-F32')[4], row('big-F32')[5]], ['F32', '-'], 'a split set, listed once, has no single sha256');
    assert.equal(ls.filter((l) => l.startsWith('big-F32')).length, 1);
    // racimo rm and Ollama's delete: a loaded model is refused, the others go
    const rm = spawnSync(BIN, ['rm', 'tiny-Q8_0', '--url', srv.url], { encoding: 'utf8' });
    assert.equal(rm.status, 1);
    assert.match(rm.stderr, /loaded: stop it first/);
    const ok2 = spawnSync(BIN, ['rm', 'tiny-Q4_K_M', '--url', srv.url], { encoding: 'utf8' });
    assert.equal(ok2.status, 0, ok2.stderr);
    assert.match(ok2.stdout, /deleted tiny-Q4_K_M/);
    await ollama.delete({ model: 'big-F32' });      // every part of the set
    await assert.rejects(ollama.delete({ model: 'big-F32' }), /not found/);
    assert.deepEqual(ggufs(dir), ['tiny-Q8_0.gguf']);
    const left = (await ollama.list()).models.map((m) => m.name);
    assert.ok(!left.includes('tiny-Q4_K_M:latest') && !left.includes('big-F32:latest'), left.join(','));
    // pulled again, it is back
    await ollama.pull({ model: 'hf.co/org/tiny-GGUF:Q4_K_M', stream: false });
    assert.ok((await ollama.list()).models.some((m) => m.name === 'tiny-Q4_K_M:latest'));
  } finally {
    await srv.stop();
  }
});

test('a client that leaves cancels the pull; the part stays and the next pull resumes it', async () => {
  const dir = newDir();
  const srv = await startServer(['--no-cluster'], { preload: false, env: { RACIMO_MODELS_DIR: dir, HF_ENDPOINT: hub.url, HF_TOKEN: '' } });
  try {
    const ac = new AbortController();
    const r = await fetch(`${srv.url}/api/pull`, { method: 'POST', body: '{"model":"hf.co/org/slow"}', signal: ac.signal });
    assert.equal(r.status, 200);
    await slow.halfway;
    ac.abort();
    // the node notices, cancels; the CDN is then let go (its bytes are not wanted any more)
    const logged = () => srv.log().includes('/api/pull') || srv.access().some((l) => l.path === '/api/pull');
    for (let i = 0; i < 200 && !logged(); i++) await new Promise((ok) => setTimeout(ok, 50));
    slow.go();
    assert.ok(logged(), 'the pull ended');
    assert.deepEqual(ggufs(dir), []);
    assert.deepEqual(parts(dir), ['slow-F32.gguf.part']);
    const kept = statSync(join(dir, '.partial', 'slow-F32.gguf.part')).size;
    assert.ok(kept > 0 && kept < big.length, `${kept}`);
    assert.equal(srv.access().find((l) => l.path === '/api/pull').status, 499);
    // the CDN logs the first request once its last byte is written, after
    // slow.go(): wait for that line, or it would be taken for the resumed one
    const first = () => hub.log.some((l) => l.file === 'slow-F32.gguf' && l.start === 0);
    for (let i = 0; i < 200 && !first(); i++) await new Promise((ok) => setTimeout(ok, 50));
    // the server serves on, and a second pull resumes from the part
    const before = hub.log.length;
    const again = await fetch(`${srv.url}/v1/models/pull`, { method: 'POST', body: '{"model":"hf.co/org/slow"}' });
    assert.equal(again.status, 200, await again.clone().text());
    assert.deepEqual(await again.json(), { status: 'success', model: 'slow-F32' });
    assert.ok(readFileSync(join(dir, 'slow-F32.gguf')).equals(big));
    const resumed = hub.log.slice(before).filter((l) => l.file === 'slow-F32.gguf');
    assert.equal(resumed[0].start, kept, JSON.stringify(resumed));
  } finally {
    await srv.stop();
  }
});

test('a second pull of a file being pulled is refused; the first completes', async () => {
  twice.dir = newDir();
  const r = await pull(['hf.co/org/twice'], { dir: twice.dir });
  assert.equal(r.code, 0, r.err);
  assert.ok(readFileSync(join(twice.dir, 'twice-Q8_0.gguf')).equals(q8));
  assert.equal(twice.second.code, 1);
  assert.match(twice.second.err, /another pull of this file is running/);
});
