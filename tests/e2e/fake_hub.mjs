// fake_hub.mjs - a stand-in for the Hugging Face Hub on loopback, for the
// pull tests (never the real internet): the tree listing of
// /api/models/ORG/REPO/tree/main (paged with Link headers, like the Hub),
// resolve/main/FILE answered with a 302 to a second server, the "CDN",
// which serves the bytes with Range support and logs every byte range it
// sent.  Repositories may be gated (a bearer token needed), list a wrong
// sha256, or cut the connection mid-file once.
//
// As a module: startHub({ repos, host }) -> { url, cdnUrl, log, stop() }.
// As a script (the namespace tests): node fake_hub.mjs HOST LOG FILE...
// serves FILE... as the repository test/model and prints "ready URL";
// LOG gets a JSON line per CDN response: {file, start, end} (end exclusive).
import { createServer } from 'node:http';
import { createHash } from 'node:crypto';
import { readFileSync, appendFileSync } from 'node:fs';
import { basename } from 'node:path';
import { fileURLToPath } from 'node:url';

const sha256 = (b) => createHash('sha256').update(b).digest('hex');
const gitOid = (b) => createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex');

// repos: { 'org/name': { files: { 'path.gguf': Buffer }, token?: 'secret',
//          wrongSha?: ['path'], cutOnce?: ['path'], onHalf?: (path) => void } }
export async function startHub({ repos, host = '127.0.0.1', pageSize = 3, logFile = null } = {}) {
  const log = [];
  // the CDN's names: one per file of a repository (equal contents of two
  // repositories stay apart, each with its own behaviour)
  const blobs = new Map();   // "n-sha256" -> { repo, path, data, r }
  const blobName = new Map();  // "repo/path" -> "n-sha256"
  for (const [repo, r] of Object.entries(repos))
    for (const [path, data] of Object.entries(r.files)) {
      const name = `${blobs.size}-${sha256(data)}`;
      blobs.set(name, { repo, path, data, r });
      blobName.set(`${repo}/${path}`, name);
    }
  const cut = new Set();

  const cdn = createServer((req, res) => {
    const m = /^\/blob\/(\d+-[0-9a-f]{64})$/.exec(req.url);
    const b = m && blobs.get(m[1]);
    if (!b) { res.writeHead(404).end('no such blob'); return; }
    const size = b.data.length;
    let start = 0, end = size;
    const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range || '');
    if (range) {
      start = Number(range[1]);
      end = range[2] ? Number(range[2]) + 1 : size;
      if (start >= size) { res.writeHead(416, { 'Content-Range': `bytes */${size}` }).end(); return; }
    }
    const headers = { 'Content-Length': end - start, 'Accept-Ranges': 'bytes', 'Content-Type': 'application/octet-stream' };
    if (range) headers['Content-Range'] = `bytes ${start}-${end - 1}/${size}`;
    res.writeHead(range ? 206 : 200, headers);
    const key = `${b.repo}/${b.path}`;
    const record = (s, e) => {
      const line = { file: b.path, start: s, end: e };
      // the Hub's token must never reach the CDN (another host)
      if (req.headers.authorization) line.authorization = req.headers.authorization;
      log.push(line);
      if (logFile) appendFileSync(logFile, JSON.stringify(line) + '\n');
    };
    const half = start + Math.floor((end - start) / 2);
    if ((b.r.cutOnce || []).includes(b.path) && !cut.has(key)) {
      // half of it, then the connection drops without the rest
      cut.add(key);
      res.write(b.data.subarray(start, half), () => {
        record(start, half);
        setTimeout(() => req.socket.destroy(), 50);
      });
      return;
    }
    if (b.r.onHalf) {
      res.write(b.data.subarray(start, half), async () => {
        await b.r.onHalf(b.path);
        res.end(b.data.subarray(half, end), () => record(start, end));
      });
      return;
    }
    res.end(b.data.subarray(start, end), () => record(start, end));
  });
  await new Promise((ok) => cdn.listen(0, host, ok));
  const cdnUrl = `http://${host}:${cdn.address().port}`;

  const api = createServer((req, res) => {
    const u = new URL(req.url, 'http://x');
    let m = /^\/api\/models\/([^/]+\/[^/]+)\/tree\/main$/.exec(u.pathname);
    const repoOf = (name) => repos[name];
    const denied = (r) => r.token && req.headers.authorization !== `Bearer ${r.token}`;
    if (m) {
      const r = repoOf(m[1]);
      if (!r) { res.writeHead(404, { 'Content-Type': 'application/json' }).end('{"error":"Repository not found"}'); return; }
      if (denied(r)) { res.writeHead(401, { 'Content-Type': 'application/json' }).end('{"error":"Access to model is restricted"}'); return; }
      const entries = [{ type: 'file', oid: gitOid(Buffer.from('readme')), size: 6, path: 'README.md' }];
      for (const [path, data] of Object.entries(r.files)) {
        const oid = (r.wrongSha || []).includes(path) ? sha256(Buffer.from('something else')) : sha256(data);
        entries.push({ type: 'file', oid: gitOid(data), size: data.length, path,
          lfs: { oid, size: data.length, pointerSize: 135 } });
      }
      const from = Number(u.searchParams.get('cursor') || 0);
      const page = entries.slice(from, from + pageSize);
      const headers = { 'Content-Type': 'application/json' };
      if (from + pageSize < entries.length) {
        const next = new URL(`http://${host}:${api.address().port}${u.pathname}`);
        next.searchParams.set('recursive', 'true');
        next.searchParams.set('cursor', String(from + pageSize));
        headers.Link = `<${next}>; rel="next"`;
      }
      res.writeHead(200, headers).end(JSON.stringify(page));
      return;
    }
    m = /^\/([^/]+\/[^/]+)\/resolve\/main\/(.+)$/.exec(u.pathname);
    if (m) {
      const r = repoOf(m[1]);
      const path = decodeURIComponent(m[2]);
      if (!r || !r.files[path]) { res.writeHead(404).end('Entry not found'); return; }
      if (denied(r)) { res.writeHead(401).end('Access to model is restricted'); return; }
      res.writeHead(302, { Location: `${cdnUrl}/blob/${blobName.get(`${m[1]}/${path}`)}` }).end();
      return;
    }
    res.writeHead(404).end('not found');
  });
  await new Promise((ok) => api.listen(0, host, ok));
  const url = `http://${host}:${api.address().port}`;
  return {
    url, cdnUrl, log,
    stop: () => Promise.all([api, cdn].map((s) => new Promise((ok) => { s.closeAllConnections(); s.close(ok); }))),
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [host, logFile, ...paths] = process.argv.slice(2);
  const files = Object.fromEntries(paths.map((p) => [basename(p), readFileSync(p)]));
  const hub = await startHub({ repos: { 'test/model': { files } }, host, logFile });
  console.log(`ready ${hub.url}`);
}
