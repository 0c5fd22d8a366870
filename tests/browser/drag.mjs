// A real mouse drag over the heat map page in Debian's Chromium, driven by Playwright
// (tests/tests/heatmap_drag.rs runs it). Offline: every request that is not file:// is recorded
// and aborted, and any such request fails the run.
//
//   node drag.mjs PAGE.html SHOT.png NAME... [--from FX,FY] [--to FX,FY] [--chromium PATH]
//
// The drag goes from --from to --to, fractions of #heat's box (default: bottom-left to 80% of
// the height in the first column, i.e. the first 200 ms of second 0 on the default 50 rows).
// It passes when, after the drag, the flame graph (#flame) holds a frame for every NAME with a
// sample count > 0, the selection label (#sel-label) changed, the page threw no error and made
// no network request. Prints one JSON line; exits 0 on success, 1 on failure, 2 on bad usage.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

// What is known to work on the project's machines (/usr/bin/chromium from Debian, as root):
// without the background-networking flags Chromium tries to reach Google's hosts at start.
const FLAGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

function usage(why) {
  console.error(`drag.mjs: ${why}\nusage: node drag.mjs PAGE.html SHOT.png NAME... [--from FX,FY] [--to FX,FY] [--chromium PATH]`);
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { from: [0.01, 0.99], to: [0.01, 0.81], chromium: '/usr/bin/chromium', names: [] };
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--from' || a === '--to') {
      const xy = (argv[++i] || '').split(',').map(Number);
      if (xy.length !== 2 || xy.some((v) => !(v >= 0 && v <= 1))) usage(`${a} wants FX,FY in 0..1`);
      opts[a.slice(2)] = xy;
    } else if (a === '--chromium') {
      opts.chromium = argv[++i] || usage('--chromium wants a path');
    } else if (a.startsWith('--')) {
      usage(`unknown option ${a}`);
    } else {
      pos.push(a);
    }
  }
  if (pos.length < 3) usage('wants a page, a screenshot path and at least one function name');
  [opts.page, opts.shot, ...opts.names] = pos;
  return opts;
}

const opts = parseArgs(process.argv.slice(2));
const result = { ok: false, page: resolve(opts.page), screenshot: resolve(opts.shot), failures: [], requests: [], errors: [] };
const requests = new Set(); // every non-file:// URL asked for, once

const fail = (why) => result.failures.push(why);
const profileDir = mkdtempSync(join(tmpdir(), 'profiler-drag-'));
let context = null;

try {
  // A new, empty profile each run (launchPersistentContext: Playwright refuses --user-data-dir
  // in args and otherwise picks its own).
  context = await chromium.launchPersistentContext(profileDir, {
    executablePath: opts.chromium,
    headless: true,
    args: FLAGS,
    viewport: { width: 1200, height: 900 },
    offline: true,
  });
  // Everything not from disk is recorded and refused: the page must be self-contained.
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (url.startsWith('file://')) return route.continue();
    requests.add(url);
    return route.abort('blockedbyclient');
  });
  const page = context.pages()[0] || (await context.newPage());
  page.on('request', (req) => {
    const url = req.url();
    if (!url.startsWith('file://')) requests.add(url);
  });
  page.on('pageerror', (err) => result.errors.push(String(err)));
  page.on('console', (msg) => { if (msg.type() === 'error') result.errors.push(msg.text()); });

  await page.goto(pathToFileURL(result.page).href, { waitUntil: 'load', timeout: 30000 });
  await page.waitForSelector('#heat', { state: 'attached', timeout: 10000 });
  result.label_before = (await page.textContent('#sel-label')).trim();

  const heat = page.locator('#heat');
  await heat.scrollIntoViewIfNeeded();
  const box = await heat.boundingBox();
  if (!box || box.width < 2 || box.height < 2) throw new Error(`#heat has no usable box: ${JSON.stringify(box)}`);
  result.heat_box = box;
  const at = ([fx, fy]) => [box.x + fx * box.width, box.y + fy * box.height];
  const [x0, y0] = at(opts.from), [x1, y1] = at(opts.to);
  result.drag = { from: [x0, y0], to: [x1, y1] };

  // A real drag: the page's mousedown/mousemove/mouseup handlers do the selecting.
  await page.mouse.move(x0, y0);
  await page.mouse.down();
  await page.mouse.move(x1, y1, { steps: 12 });
  await page.mouse.up();

  // The flame graph for the selection: a frame for every expected name, with samples.
  const names = opts.names;
  try {
    await page.waitForFunction((want) => {
      const have = new Set([...document.querySelectorAll('#flame .fr')]
        .filter((el) => Number(el.dataset.samples) > 0).map((el) => el.dataset.name));
      return want.every((n) => have.has(n));
    }, names, { timeout: 10000 });
  } catch (e) {
    fail(`the flame graph did not show ${names.join(', ')} within 10 s`);
  }
  const dom = await page.evaluate(() => {
    const frames = {};
    for (const el of document.querySelectorAll('#flame .fr')) {
      frames[el.dataset.name] = (frames[el.dataset.name] || 0) + Number(el.dataset.samples);
    }
    const top = [...document.querySelectorAll('#top tbody tr')].map((tr) => [...tr.cells].map((c) => c.textContent));
    return { frames, top, label: document.getElementById('sel-label').textContent.trim(), hash: location.hash };
  });
  Object.assign(result, { label_after: dom.label, hash: dom.hash, frames: dom.frames, top: dom.top });
  for (const n of names) if (!(dom.frames[n] > 0)) fail(`no flame graph frame ${JSON.stringify(n)} with samples`);
  if (!(dom.frames.all > 0)) fail('the flame graph root holds no samples');
  if (dom.label === result.label_before) fail(`the selection label did not change: ${JSON.stringify(dom.label)}`);
  if (!dom.hash.startsWith('#select=')) fail(`the drag did not set #select= (hash ${JSON.stringify(dom.hash)})`);

  // Off the canvas, so the hover tooltip does not cover the selection in the screenshot.
  await page.mouse.move(0, 0);
  await page.screenshot({ path: result.screenshot, fullPage: true });
} catch (e) {
  fail(`error: ${e && e.stack ? e.stack.split('\n')[0] : e}`);
} finally {
  if (context) await context.close().catch(() => {});
  rmSync(profileDir, { recursive: true, force: true });
}

result.requests = [...requests];
if (result.requests.length) fail(`the page made ${result.requests.length} network request(s)`);
if (result.errors.length) fail(`the page reported ${result.errors.length} error(s)`);
result.ok = result.failures.length === 0;
console.log(JSON.stringify(result));
process.exit(result.ok ? 0 : 1);
