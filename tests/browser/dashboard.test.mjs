// dashboard.test.mjs - the dashboard as a user meets it, in headless
// Chromium, against the three nodes tests/browser/run.sh started (node 1 at
// URL, all with API_KEY; the model m8 on nodes 1 and 2).  The steps run in
// order on one page, never reloaded after the login: a wrong key, then the
// right one; three nodes and their links; node 3 killed shows as down; m8
// started over two nodes shows its plan (also on node 2's page); a chat
// message streams an answer.
// Screenshots go to SHOTS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const URL = process.env.URL;
const KEY = process.env.API_KEY;
const SHOTS = process.env.SHOTS || '.';
let browser, page;

async function shot(name) {
  await page.screenshot({ path: path.join(SHOTS, name + '.png'), fullPage: true });
}

// polls fn in the page until it returns something truthy (deadline in ms)
async function until(what, fn, ms, ...args) {
  try {
    return await page.waitForFunction(fn, { timeout: ms, polling: 100 }, ...args);
  } catch (e) {
    await shot('failed-' + what.replace(/\W+/g, '-'));
    throw new Error(`${what}: not within ${ms} ms (${e.message})`);
  }
}

before(async () => {
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  page.on('pageerror', (e) => console.log('# page error:', e.message));
});

after(async () => {
  if (browser) await browser.close();
});

test('a wrong API key shows the login prompt again', async () => {
  await page.goto(URL + '/', { waitUntil: 'domcontentloaded' });
  await until('login prompt', () => !document.getElementById('login').hidden, 10000);
  await page.type('#login-key', 'not-the-key');
  await page.keyboard.press('Enter');
  await until('key refused', () => !document.getElementById('login').hidden &&
    /refused/.test(document.getElementById('login-why').textContent), 10000);
  await shot('login');
  const stored = await page.evaluate(() => sessionStorage.getItem('racimo.apiKey'));
  assert.equal(stored, 'not-the-key');
  const rows = await page.$$eval('#nodes tbody tr', (r) => r.length);
  assert.equal(rows, 0, 'nothing is shown without the key');
});

test('the page lists 3 nodes and their links', async () => {
  await page.type('#login-key', KEY);
  await page.keyboard.press('Enter');
  await until('3 nodes up', () =>
    document.querySelectorAll('#nodes tbody tr[data-state="up"]').length === 3, 30000);
  await until('links', () => document.querySelectorAll('#links tbody tr').length >= 6 &&
    document.querySelectorAll('#graph line.link').length === 3, 30000);
  const names = await page.$$eval('#nodes tbody tr strong', (s) => s.map((x) => x.textContent).sort());
  assert.deepEqual(names, ['node1', 'node2', 'node3']);
  const latency = await page.$$eval('#links tbody tr td:nth-child(3)', (t) => t.map((x) => x.textContent));
  assert.ok(latency.every((l) => / ms$/.test(l)), latency.join(', '));
  const power = await page.$eval('#nodes tbody tr[data-state="up"] td:nth-child(6)', (t) => t.textContent);
  assert.match(power, /W \(configured\)/);
  await shot('nodes');
});

test('a node killed shows as down within 5 s, without a reload', async () => {
  await page.evaluate(() => { window.notReloaded = true; });
  const t0 = Date.now();
  process.kill(Number(process.env.NODE3_PID), 'SIGKILL');
  await until('node 3 down', () => {
    const r = [...document.querySelectorAll('#nodes tbody tr')]
      .find((x) => x.querySelector('strong').textContent === 'node3');
    return r && r.dataset.state === 'down' && /down for/.test(r.textContent);
  }, 5000);
  console.log(`# node 3 shown down after ${Date.now() - t0} ms`);
  assert.equal(await page.evaluate(() => window.notReloaded), true);
  assert.equal(await page.$$eval('#graph g.node.down', (g) => g.length), 1);
  await shot('node-down');
});

test('starting a model split over 2 nodes from the page shows its plan', async () => {
  await until('model listed', () => [...document.getElementById('start-model').options]
    .some((o) => o.value === 'm8'), 15000);
  await page.select('#start-model', 'm8');
  await page.select('#start-split', 'layers');
  await page.$eval('#start-nodes', (i) => { i.value = ''; });
  await page.type('#start-nodes', '2');
  // only the two nodes up, ticked by the user (node 3 is down: not offered)
  await until('node boxes', () => document.querySelectorAll('#start-on input').length === 2, 10000);
  for (const box of await page.$$('#start-on input')) await box.click();
  await page.click('#preview');
  await until('plan preview', () => document.querySelectorAll('#plan-preview .bar span').length === 2, 15000);
  const preview = await page.$eval('#plan-preview', (p) => p.textContent);
  assert.match(preview, /fits, 2 node\(s\), layers/);
  await page.click('#start');
  await until('instance with its plan', () =>
    document.querySelectorAll('#instances tr[data-model="m8"] .bar span').length === 2, 60000);
  const stages = await page.$$eval('#instances tr[data-model="m8"] .bar span', (s) => s.map((x) => x.textContent));
  assert.ok(stages.some((s) => s.startsWith('node1')) && stages.some((s) => s.startsWith('node2')),
            stages.join(' | '));
  const graph = await page.$$eval('#graph g.node text.sub', (t) => t.map((x) => x.textContent).join(' '));
  assert.match(graph, /m8 L0-/);
  await shot('instance');
  // the same page served by node 2 shows the instance node 1 heads, with its plan
  const other = await browser.newPage();
  try {
    await other.goto(URL.replace('10.77.0.1', '10.77.0.2') + '/', { waitUntil: 'domcontentloaded' });
    await other.waitForFunction(() => !document.getElementById('login').hidden, { timeout: 10000 });
    await other.type('#login-key', KEY);
    await other.keyboard.press('Enter');
    await other.waitForFunction(() => {
      const r = document.querySelector('#instances tr[data-model="m8"]');
      return r && /on node1/.test(r.textContent) && r.querySelectorAll('.bar span').length === 2;
    }, { timeout: 15000, polling: 100 });
  } finally {
    await other.close();
  }
});

test('a chat message streams an answer', async () => {
  await page.select('#chat-model', 'm8');
  await page.$eval('#chat-max', (i) => { i.value = '24'; });
  // a random-weight model may end its answer at once: ask again until it says something
  let text = '';
  for (let k = 0; k < 4 && !text; k++) {
    await page.type('#chat-input', 'Hello, who are you?');
    await page.click('#chat-send');
    await until('answer done', () => !document.getElementById('chat-send').disabled &&
      document.querySelectorAll('#chat-log .msg.assistant').length > 0, 60000);
    text = await page.$eval('#chat-log .msg.assistant:last-child .content', (c) => c.textContent);
  }
  assert.ok(text.length > 0, 'an answer');
  const stats = await page.$eval('#chat-stats', (s) => s.textContent);
  assert.match(stats, /first token \d+ ms · \d+ tokens/);
  await until('cost row', () => {
    const r = document.querySelector('#costs tr[data-model="m8"]');
    return r && / Wh$/.test(r.children[4].textContent);
  }, 10000);
  const cost = await page.$eval('#costs tr[data-model="m8"]', (r) => [...r.children].map((c) => c.textContent));
  // node 1's 35 W and node 2's 40 W (run.sh's --watts), node 2's learnt from its cluster state
  assert.equal(cost[2], '75 W');
  assert.match(cost[5], /^\d+\.\d{4}$/, 'a cost per million tokens');
  await page.evaluate(() => document.getElementById('chat').scrollIntoView());
  await shot('chat');
  await page.setViewport({ width: 390, height: 844 });
  // a phone: wide tables scroll in their own box, the page itself does not
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(wide <= 391, `the page is ${wide} px wide on a 390 px screen`);
  await shot('phone');
  await page.setViewport({ width: 1280, height: 900 });
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot('dashboard');
});

test('stopping the instance from the page', async () => {
  await page.click('#instances tr[data-model="m8"] button');
  await until('instance gone', () => !document.querySelector('#instances tr[data-model="m8"]'), 15000);
  assert.match(await page.$eval('#plan-preview', (p) => p.textContent), /m8 stopped/);
});
