// racimo dashboard: polls this node's /v1/cluster every second and draws the
// cluster; starts and stops instances (/v1/instances); chats over
// /v1/chat/completions with streaming.  Every data call carries the API key
// kept in session storage; a 401 opens the login prompt.
'use strict';

const KEY = 'racimo.apiKey';
const $ = (id) => document.getElementById(id);
let view = null;          // the last /v1/cluster answer
let polling = null;
let chatAbort = null;
let chatHistory = [];
const rates = new Map();  // model -> {t, prompt, gen, in, out}: tokens/s between polls

function headers(json) {
  const h = {};
  const k = sessionStorage.getItem(KEY);
  if (k) h.Authorization = 'Bearer ' + k;
  if (json) h['Content-Type'] = 'application/json';
  return h;
}

function needKey(why) {
  $('login').hidden = false;
  $('login-why').textContent = why;
  $('login-key').focus();
}

async function api(path, body, signal) {
  const r = await fetch(path, {
    method: body === undefined ? 'GET' : 'POST',
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (r.status === 401) {
    needKey(sessionStorage.getItem(KEY) ? 'The key was refused: type it again.'
                                        : 'This node asks for an API key (--api-key).');
    throw new Error('an API key is required');
  }
  return r;
}

async function errorText(r) {
  try {
    const j = await r.json();
    return (j.error && (j.error.message || j.error)) || r.statusText;
  } catch { return r.status + ' ' + r.statusText; }
}

// ---- formatting ----
function bytes(n) {
  if (n == null) return '?';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + ' ' + u[i];
}
const num = (x, d = 1) => (x == null || !isFinite(x) ? '–' : Number(x).toFixed(d));
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}
function svg(tag, attrs, text) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}
const COLORS = ['#1f6feb', '#8250df', '#bf3989', '#1a7f37', '#9a6700', '#0a7ea4', '#cf222e', '#57606a'];
function nodeColor(id) {
  const ids = nodes().map((n) => n.id).sort();
  return COLORS[Math.max(0, ids.indexOf(id)) % COLORS.length];
}
function nodes() {
  if (!view) return [];
  if (view.nodes) return view.nodes;
  // standalone: this node alone
  const nd = view.node;
  return [{ id: 'self', name: nd.hostname, state: 'up', self: true, version: nd.version,
            hardware: { cores: nd.physical_cores, mem_total: nd.memory_total_bytes,
                        mem_free: nd.memory_available_bytes, mem_offer: nd.memory_available_bytes },
            serving: (view.models || []).filter((m) => m.state === 'loaded').map((m) => m.name),
            models: (view.models || []).map((m) => ({ name: m.name, size_bytes: m.size_bytes })),
            power: view.cost ? view.cost.power : null }];
}
function nodeName(id) {
  const n = nodes().find((x) => x.id === id);
  return n ? (n.name || id.slice(0, 8)) : id.slice(0, 8);
}

// ---- topology ----
function drawGraph() {
  const g = $('graph');
  while (g.lastChild && g.lastChild.tagName !== 'title') g.lastChild.remove();
  const ns = nodes();
  const W = 640, H = 360, cx = W / 2, cy = H / 2, r = ns.length > 1 ? Math.min(W, H) / 2 - 60 : 0;
  const pos = new Map();
  ns.forEach((n, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / ns.length;
    pos.set(n.id, [cx + r * 1.5 * Math.cos(a), cy + r * Math.sin(a)]);
  });
  const seen = new Set();
  for (const l of (view && view.links) || []) {
    if (l.linked === false) continue;   // a cached measure: no link now
    const key = [l.from, l.to].sort().join('-');
    if (seen.has(key) || !pos.has(l.from) || !pos.has(l.to)) continue;
    seen.add(key);
    const [x1, y1] = pos.get(l.from), [x2, y2] = pos.get(l.to);
    g.append(svg('line', { class: 'link', x1, y1, x2, y2 }));
    const bw = l.bandwidth_mbps != null ? (l.bandwidth_mbps >= 1000 ? num(l.bandwidth_mbps / 1000) + ' Gb/s'
                                                                     : num(l.bandwidth_mbps, 0) + ' Mb/s') : '';
    g.append(svg('text', { class: 'link-label', x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4 },
                 num(l.rtt_ms, 2) + ' ms' + (bw ? ' · ' + bw : '')));
  }
  for (const n of ns) {
    const [x, y] = pos.get(n.id);
    const up = n.state === 'up';
    const grp = svg('g', { class: 'node' + (up ? '' : ' down'), 'data-id': n.id });
    grp.append(svg('rect', { x: x - 70, y: y - 30, width: 140, height: 60 }));
    grp.append(svg('text', { x, y: y - 10 }, (n.name || n.id.slice(0, 8)) + (n.self ? ' (this)' : '')));
    const hw = n.hardware || {};
    grp.append(svg('text', { class: 'sub', x, y: y + 6 },
                   up ? `${hw.simd || '?'} · ${bytes(hw.mem_total)}` : `down ${Math.round((n.down_for_ms || 0) / 1000)} s`));
    grp.append(svg('text', { class: 'sub', x, y: y + 20 }, stagesOn(n.id)));
    g.append(grp);
  }
}

// Every running instance of the cluster, each with the node that heads it:
// what each node publishes ("instances"), this node's own from its fresher
// list ("models"); standalone, this node's models.
function instances() {
  const own = ((view && view.models) || []).filter((m) => m.state !== 'available')
    .map((m) => ({ ...m, head: view.self || 'self', mine: true }));
  if (!view || !view.nodes) return own;
  const out = [...own];
  for (const n of view.nodes) {
    if (n.self || n.state !== 'up' || !Array.isArray(n.instances)) continue;
    for (const m of n.instances) {
      if (m && typeof m.name === 'string') out.push({ ...m, head: n.id, mine: false });
    }
  }
  return out;
}

// "model L0-11" for what the running instances put on node id
function stagesOn(id) {
  const out = [];
  for (const m of instances()) {
    for (const s of (m.plan && Array.isArray(m.plan.stages) && m.plan.stages) || []) {
      if (s.node !== id) continue;
      out.push(m.plan.split === 'tensor' ? `${m.name} shard` : `${m.name} L${s.first}-${s.last - 1}`);
    }
  }
  return out.join(', ');
}

function drawNodes() {
  const tb = $('nodes').tBodies[0];
  tb.replaceChildren();
  for (const n of nodes()) {
    const hw = n.hardware || {};
    const used = hw.mem_total != null && hw.mem_free != null ? hw.mem_total - hw.mem_free : null;
    const meter = el('span', { class: 'meter', role: 'img',
                               'aria-label': `${Math.round(100 * (used || 0) / (hw.mem_total || 1))}% used` }, el('i'));
    meter.firstChild.style.width = Math.round(100 * (used || 0) / (hw.mem_total || 1)) + '%';
    const up = n.state === 'up';
    const p = n.power;
    tb.append(el('tr', { 'data-id': n.id, 'data-state': n.state },
      el('td', {}, el('strong', { text: n.name || n.id.slice(0, 8) }), el('br'),
         el('span', { class: 'muted', text: n.id.slice(0, 8) + (n.self ? ' · this node' : '') })),
      el('td', { class: up ? 'up' : 'down', text: up ? 'up' : `down for ${Math.round((n.down_for_ms || 0) / 1000)} s` }),
      el('td', { text: `${hw.cpu || '?'} (${hw.cores || '?'} cores)` }),
      el('td', { text: hw.simd || '?' }),
      el('td', {}, meter, ' ', `${bytes(used)} / ${bytes(hw.mem_offer)} / ${bytes(hw.mem_total)}`),
      el('td', { text: p && p.watts != null ? `${num(p.watts, 0)} W (${p.source})` : '–' }),
      el('td', { text: n.version || '?' }),
      el('td', { text: (n.serving || []).join(', ') || '–' })));
  }
  const lb = $('links').tBodies[0];
  lb.replaceChildren();
  for (const l of (view && view.links) || []) {
    lb.append(el('tr', {}, el('td', { text: nodeName(l.from) }), el('td', { text: nodeName(l.to) }),
      el('td', { text: num(l.rtt_ms, 2) + ' ms' }),
      el('td', { text: l.bandwidth_mbps != null ? num(l.bandwidth_mbps, 0) + ' Mbit/s' : 'not measured yet' }),
      el('td', { text: (l.age_ms != null ? num(l.age_ms / 1000, 0) + ' s ago' : '–') +
                       (l.linked === false ? ' (link closed since)' : '') })));
  }
}

// ---- models ----
function planBar(plan) {
  const bar = el('div', { class: 'bar', role: 'img' });
  const label = [];
  for (const s of Array.isArray(plan.stages) ? plan.stages : []) {
    const layers = plan.split === 'tensor' ? plan.n_layer : s.last - s.first;
    const what = plan.split === 'tensor' ? 'every layer (shard)' : `layers ${s.first}-${s.last - 1}`;
    const part = el('span', { title: `${s.name}: ${what}`, text: `${s.name} ${plan.split === 'tensor' ? 'shard' : s.first + '-' + (s.last - 1)}` });
    part.style.flex = String(Math.max(1, layers));
    part.style.background = nodeColor(s.node);
    bar.append(part);
    label.push(`${s.name}: ${what}`);
  }
  bar.setAttribute('aria-label', label.join('; '));
  return bar;
}

function drawModels() {
  const now = performance.now();
  const tb = $('instances').tBodies[0];
  tb.replaceChildren();
  for (const m of instances()) {
    const key = m.head + '/' + m.name;
    let r = rates.get(key);
    if (m.tokens_generated != null) {
      if (r && now > r.t) {
        const dt = (now - r.t) / 1000;
        r.in = Math.max(0, (m.tokens_prompt - r.prompt) / dt);
        r.out = Math.max(0, (m.tokens_generated - r.gen) / dt);
      }
      rates.set(key, r = { t: now, prompt: m.tokens_prompt, gen: m.tokens_generated, in: r ? r.in : 0, out: r ? r.out : 0 });
    }
    const box = $('plan-preview');
    if (box.dataset.pending === m.name && m.state !== 'loading') {
      delete box.dataset.pending;
      if (m.plan) showPlan(box, m.plan, 'Started');
      else box.textContent = `${m.name}: ${m.state === 'loaded' ? 'runs on this node' : m.state}`;
    }
    const rec = m.recoveries || {};
    tb.append(el('tr', { 'data-model': m.name, 'data-head': m.head },
      el('td', {}, m.name, el('br'), el('span', { class: 'muted', text: 'on ' + nodeName(m.head) })),
      el('td', { text: m.state }),
      el('td', {}, m.plan ? planBar(m.plan) : 'this node'),
      el('td', { text: m.parallel != null ? `${m.active} / ${m.parallel}` : '–' }),
      el('td', { text: m.queued != null ? String(m.queued) : '–' }),
      el('td', { text: r ? `${num(r.in)} / ${num(r.out)}` : '–' }),
      el('td', { text: rec.count != null ? `${rec.count}${rec.failed ? ` (${rec.failed} failed)` : ''}` : '–' }),
      el('td', {}, m.mine ? el('button', { type: 'button', class: 'secondary', 'aria-label': `Stop ${m.name}`,
                                           text: 'Stop', onclick: () => stopModel(m.name) })
                          : el('span', { class: 'muted', text: 'stop it on ' + nodeName(m.head) }))));
  }
  if (!tb.rows.length) tb.append(el('tr', {}, el('td', { colspan: 8, class: 'muted', text: 'No instance runs in the cluster.' })));

  // every model file of the cluster, and where it is
  const files = new Map();
  for (const n of nodes()) {
    for (const f of n.models || []) {
      const e = files.get(f.name) || { ...f, on: [] };
      e.on.push(n.name || n.id.slice(0, 8));
      files.set(f.name, e);
    }
  }
  for (const m of (view && view.models) || []) {
    if (!files.has(m.name)) files.set(m.name, { name: m.name, size_bytes: m.size_bytes, on: [nodeName(view.self || 'self')] });
  }
  const fb = $('files').tBodies[0];
  fb.replaceChildren();
  for (const f of [...files.values()].sort((a, b) => a.name.localeCompare(b.name))) {
    fb.append(el('tr', {}, el('td', { text: f.name }), el('td', { text: bytes(f.size_bytes) }),
      el('td', { text: f.type || '–' }), el('td', { text: f.family || '–' }), el('td', { text: f.on.join(', ') })));
  }
  for (const id of ['start-model', 'chat-model']) {
    const sel = $(id);
    const names = [...files.keys()].sort();
    if (sel.options.length === names.length && [...sel.options].every((o, i) => o.value === names[i])) continue;
    const keep = sel.value;
    sel.replaceChildren(...names.map((n) => el('option', { value: n, text: n })));
    if (names.includes(keep)) sel.value = keep;
  }
}

// the start form's node boxes: one per node up, ticks kept across polls
function drawNodeChoice() {
  const box = $('start-on');
  const up = nodes().filter((n) => n.state === 'up' && view && view.nodes);
  const have = [...box.querySelectorAll('input')].map((i) => i.value).join();
  if (have === up.map((n) => n.id).join()) return;
  const ticked = new Set([...box.querySelectorAll('input:checked')].map((i) => i.value));
  box.querySelectorAll('label').forEach((l) => l.remove());
  for (const n of up) {
    box.append(el('label', {}, el('input', { type: 'checkbox', value: n.id, ...(ticked.has(n.id) ? { checked: '' } : {}) }),
                  n.name || n.id.slice(0, 8)));
  }
  box.hidden = up.length < 2;
}

function startBody(dry) {
  const b = { model: $('start-model').value };
  const on = [...$('start-on').querySelectorAll('input:checked')].map((i) => i.value);
  if (on.length) b.nodes = on;
  if ($('start-split').value) b.split = $('start-split').value;
  const k = parseInt($('start-nodes').value, 10);
  if (k > 1) b.min_nodes = k;
  if (dry) b.dry_run = true;
  return b;
}

function showPlan(box, plan, heading) {
  box.replaceChildren(el('p', {}, el('strong', { text: heading + ': ' }),
    plan.fits ? `fits, ${plan.stages.length} node(s), ${plan.split}, about ${num(plan.tokens_per_s)} tokens/s for one stream`
              : `does not fit: ${plan.advice}`));
  if (plan.fits) box.append(planBar(plan));
}

async function previewPlan() {
  const box = $('plan-preview');
  try {
    const r = await api('/v1/instances', startBody(true));
    if (!r.ok) { box.textContent = 'Preview failed: ' + await errorText(r); return; }
    showPlan(box, (await r.json()).plan, 'Plan preview');
  } catch (e) { box.textContent = String(e.message || e); }
}

async function startModel(ev) {
  ev.preventDefault();
  const box = $('plan-preview');
  box.textContent = 'Starting…';
  try {
    const r = await api('/v1/instances', startBody(false));
    if (!r.ok) { box.textContent = 'Start failed: ' + await errorText(r); return; }
    const j = await r.json();
    if (j.plan) showPlan(box, j.plan, 'Started');
    else {
      box.textContent = `${j.model}: ${j.state}…`;
      box.dataset.pending = j.model;     // drawModels shows the plan once it is loaded
    }
    poll();
  } catch (e) { box.textContent = String(e.message || e); }
}

async function stopModel(name) {
  try {
    const r = await api('/v1/instances/stop', { model: name });
    $('plan-preview').textContent = r.ok ? `${name} stopped` : 'Stop failed: ' + await errorText(r);
    poll();
  } catch (e) { $('plan-preview').textContent = String(e.message || e); }
}

// ---- cost ----
function drawCost() {
  const c = view && view.cost;
  $('cost-basis').textContent = c ? c.basis : '';
  const tb = $('costs').tBodies[0];
  tb.replaceChildren();
  for (const m of instances()) {
    const k = m.cost;
    if (!k || typeof k !== 'object') continue;
    tb.append(el('tr', { 'data-model': m.name, 'data-head': m.head }, el('td', { text: m.name }),
      el('td', { text: (Array.isArray(k.nodes) ? k.nodes : []).map(String).map(nodeName).join(', ') }),
      el('td', { text: k.watts != null ? num(k.watts, 0) + ' W' : 'unknown' }),
      el('td', { text: num(k.tokens_per_s) }),
      el('td', { text: k.wh_per_1k_tokens != null ? num(k.wh_per_1k_tokens, 3) + ' Wh' : '–' }),
      el('td', { text: k.cost_per_mtok != null ? num(k.cost_per_mtok, 4) : '–' }),
      el('td', { text: c && c.cloud_per_mtok != null ? num(c.cloud_per_mtok, 4) : '–' })));
  }
  if (!tb.rows.length) tb.append(el('tr', {}, el('td', { colspan: 7, class: 'muted', text: 'No model runs in the cluster.' })));
}

// ---- polling ----
let inflight = false;
async function poll() {
  if (inflight) return;     // a slow answer: skip a beat rather than pile up
  inflight = true;
  try {
    const r = await api('/v1/cluster');
    if (!r.ok) throw new Error(await errorText(r));
    view = await r.json();
    $('error').hidden = true;
    $('login').hidden = true;
    $('logout').hidden = !sessionStorage.getItem(KEY);
    const ns = nodes();
    const up = ns.filter((n) => n.state === 'up').length;
    $('summary').textContent = view.nodes
      ? `${up} of ${ns.length} nodes up${view.quorum ? '' : ' · no quorum'} · served by ${view.node.hostname}`
      : `standalone node ${view.node.hostname} · version ${view.node.version}`;
    drawGraph();
    drawNodes();
    drawModels();
    drawNodeChoice();
    drawCost();
  } catch (e) {
    if (!$('login').hidden) return;
    $('error').hidden = false;
    $('error').textContent = 'Cannot reach the node: ' + (e.message || e);
  } finally {
    inflight = false;
  }
}

// ---- chat ----
function addMessage(role, text) {
  const m = el('div', { class: 'msg ' + role });
  const reasoning = el('div', { class: 'reasoning', hidden: '' });
  const content = el('div', { class: 'content', text: text || '' });
  m.append(reasoning, content);
  $('chat-log').append(m);
  return { m, reasoning, content };
}

async function sendChat(ev) {
  ev.preventDefault();
  const text = $('chat-input').value.trim();
  if (!text) return;
  $('chat-input').value = '';
  chatHistory.push({ role: 'user', content: text });
  addMessage('user', text);
  const out = addMessage('assistant', '');
  const messages = [];
  if ($('chat-system').value.trim()) messages.push({ role: 'system', content: $('chat-system').value.trim() });
  messages.push(...chatHistory);
  const body = { model: $('chat-model').value, messages, stream: true,
                 stream_options: { include_usage: true },
                 temperature: parseFloat($('chat-temp').value),
                 top_p: parseFloat($('chat-top-p').value),
                 max_tokens: parseInt($('chat-max').value, 10) };
  chatAbort = new AbortController();
  $('chat-send').disabled = true;
  $('chat-stop').disabled = false;
  const t0 = performance.now();
  let tFirst = null, nTok = 0, answer = '', usage = null;
  const stats = () => {
    const dt = tFirst != null ? (performance.now() - tFirst) / 1000 : 0;
    const n = usage ? usage.completion_tokens : nTok;
    $('chat-stats').textContent = tFirst == null ? 'waiting for the first token…'
      : `first token ${num(tFirst - t0, 0)} ms · ${n} tokens · ${dt > 0 && n > 1 ? num((n - 1) / dt) : '–'} tokens/s`;
  };
  stats();
  try {
    const r = await api('/v1/chat/completions', body, chatAbort.signal);
    if (!r.ok) throw new Error(await errorText(r));
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message || 'error');
          if (j.usage) usage = j.usage;
          const d = j.choices && j.choices[0] && j.choices[0].delta;
          if (!d) continue;
          if (d.reasoning_content) {
            out.reasoning.hidden = false;
            out.reasoning.textContent += d.reasoning_content;
          }
          if (d.content) { out.content.textContent += d.content; answer += d.content; }
          if (d.content || d.reasoning_content) {
            if (tFirst == null) tFirst = performance.now();
            nTok++;
          }
        }
        stats();
      }
    }
    chatHistory.push({ role: 'assistant', content: answer });
  } catch (e) {
    if (e.name !== 'AbortError') out.content.append(el('span', { class: 'error', text: ' [' + (e.message || e) + ']' }));
  } finally {
    stats();
    chatAbort = null;
    $('chat-send').disabled = false;
    $('chat-stop').disabled = true;
    $('chat-log').scrollTop = $('chat-log').scrollHeight;
  }
}

// ---- start ----
document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $('login-key').value);
    $('login-key').value = '';
    $('login').hidden = true;
    poll();
  });
  $('logout').addEventListener('click', () => { sessionStorage.removeItem(KEY); location.reload(); });
  $('preview').addEventListener('click', previewPlan);
  $('start-form').addEventListener('submit', startModel);
  $('chat-form').addEventListener('submit', sendChat);
  $('chat-input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('chat-form').requestSubmit(); }
  });
  $('chat-stop').addEventListener('click', () => chatAbort && chatAbort.abort());
  $('chat-clear').addEventListener('click', () => { chatHistory = []; $('chat-log').replaceChildren(); });
  poll();
  polling = setInterval(poll, 1000);
});
