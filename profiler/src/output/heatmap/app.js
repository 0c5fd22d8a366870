// The heat map page: everything is drawn from the aggregated records in #data (see
// docs/heatmap.md). Times inside the page are in "slices": col * rows + slice-in-second, so a
// selection is exact integer cells, never a float comparison.
'use strict';
(function () {
  const D = JSON.parse(document.getElementById('data').textContent);
  const R = D.rows, C = D.cols;
  // Two record sets (see docs/heatmap.md): per CPU, and all CPUs together (finer in time when
  // buckets had to coarsen). Field offsets per set; B = slices per time bucket.
  const PER = { rec: D.rec, W: 6, B: D.bucket, cpu: 1, comm: 2, cg: 3, st: 4, n: 5 };
  const ALL = { rec: D.all_rec, W: 5, B: D.all_bucket, cpu: -1, comm: 1, cg: 2, st: 3, n: 4 };
  PER.N = PER.rec.length / PER.W; ALL.N = ALL.rec.length / ALL.W;
  const view = () => (filt.cpu === null ? ALL : PER);
  const $ = (id) => document.getElementById(id);
  const filt = { cpu: null, comm: null, cgroup: null };
  let sel = null;   // [s0, s1) in slices, or null: everything
  let zoom = [];    // names from the root to the zoomed node
  let drag = null;  // slice where the mouse went down
  const CW = Math.max(3, Math.min(40, Math.floor(1000 / Math.max(C, 1)))), CH = 6, SH = 12;
  // Seconds whose stored windows kept counts but not times: drawn as such, never as quiet.
  const UNTIMED = new Set(D.untimed);
  function noTimes(g, c, y, h) {
    g.fillStyle = '#ccc'; g.fillRect(c * CW, y, CW, h);
    g.strokeStyle = '#999'; g.beginPath(); g.moveTo(c * CW, y + h); g.lineTo(c * CW + CW, y); g.stroke();
  }

  function option(el, value, text) {
    const o = document.createElement('option');
    o.value = value; o.textContent = text; el.appendChild(o);
  }
  D.cpus.forEach((c) => option($('f-cpu'), c, 'CPU ' + c));
  D.comms.map((c, i) => [c, i]).sort().forEach(([c, i]) => option($('f-comm'), i, c));
  D.cgroups.forEach((g, i) => option($('f-cgroup'), i, g));
  ['cpu', 'comm', 'cgroup'].forEach((k) => $('f-' + k).addEventListener('change', (e) => {
    filt[k] = e.target.value === '' ? null : Number(e.target.value);
    render();
  }));

  const isKernelStack = (s) => { const st = D.stacks[s]; return st.length > 0 && D.frames[st[st.length - 1]][1] === 1; };
  function pass(v, i, ignoreCpu) {
    const o = i * v.W, rec = v.rec;
    return (ignoreCpu || filt.cpu === null || rec[o + v.cpu] === filt.cpu) &&
      (filt.comm === null || rec[o + v.comm] === filt.comm) &&
      (filt.cgroup === null || rec[o + v.cg] === filt.cgroup);
  }
  // A record covers slices [b * B, (b + 1) * B): in the selection if they overlap it.
  function inSel(v, i) {
    const b = v.rec[i * v.W];
    return sel === null || (b * v.B < sel[1] && (b + 1) * v.B > sel[0]);
  }
  const filtered = () => filt.cpu !== null || filt.comm !== null || filt.cgroup !== null;
  function clock(sec) {
    const d = new Date(D.start_unix_ms + (D.first_s + sec) * 1000);
    return d.toISOString().slice(11, 23) + ' UTC';
  }
  const fmtS = (s) => (s / R).toFixed(3);

  function heat(x) { // 0..1 -> white to dark red, FlameScope-like
    if (x <= 0) return '#fff';
    const g = Math.round(235 * (1 - x)), b = Math.round(200 * (1 - x));
    return 'rgb(255,' + g + ',' + b + ')';
  }

  function drawHeat() {
    // Unfiltered: the exact grid. Filtered: from the records; a bucket coarser than a slice
    // is drawn as one block of its mean (its samples' slices are not known), and the summary
    // says at what resolution.
    let cells = D.grid;
    if (filtered()) {
      const v = view(), per = new Float64Array(Math.ceil((C * R) / v.B) + 1);
      for (let i = 0; i < v.N; i++) if (pass(v, i, false)) per[v.rec[i * v.W]] += v.rec[i * v.W + v.n];
      cells = new Float64Array(C * R);
      for (let s = 0; s < C * R; s++) cells[s] = per[Math.floor(s / v.B)] / v.B;
    }
    let max = 0, total = 0;
    for (let s = 0; s < C * R; s++) { total += cells[s]; if (cells[s] > max) max = cells[s]; }
    const cv = $('heat'); cv.width = C * CW; cv.height = R * CH;
    const g = cv.getContext('2d');
    for (let c = 0; c < C; c++) for (let r = 0; r < R; r++) {
      if (UNTIMED.has(c)) { noTimes(g, c, r * CH, CH); continue; }
      const s = c * R + (R - 1 - r);
      g.fillStyle = heat(max ? cells[s] / max : 0);
      g.fillRect(c * CW, r * CH, CW, CH);
      if (sel && s >= sel[0] && s < sel[1]) { g.fillStyle = 'rgba(40,80,255,0.35)'; g.fillRect(c * CW, r * CH, CW, CH); }
    }
    cv.cells = cells;
    $('summary').textContent = Math.round(total) + ' busy samples shown; max ' + (+max.toFixed(1)) + ' per cell; ' + D.hz + ' Hz, ' + D.cpus.length + ' CPUs' +
      (filtered() && view().B > 1 ? '; filtered at ' + (view().B * 1000 / R) + ' ms resolution (each block: its mean per cell)' : '') +
      (UNTIMED.size ? '; no exact times for ' + UNTIMED.size + ' s (grey: the store kept only counts there; ' + D.untimed_n + ' busy samples not drawn)' : '');
  }

  function drawCpus() {
    const n = D.cpus.length;
    let busy = D.cpu_busy, kern = D.cpu_kernel;
    if (filt.comm !== null || filt.cgroup !== null) {
      // From the records: a bucket of B slices lands in its second, or spreads over several.
      busy = new Float64Array(n * C); kern = new Float64Array(n * C);
      const P = PER, rec = P.rec, idx = new Map(D.cpus.map((c, i) => [c, i]));
      const secs = Math.max(1, P.B / R);
      for (let i = 0; i < P.N; i++) {
        if (!pass(P, i, true)) continue;
        const o = i * P.W, first = Math.floor((rec[o] * P.B) / R), v = rec[o + 5] / secs;
        const kv = isKernelStack(rec[o + 4]) ? v : 0;
        for (let c = first; c < first + secs && c < C; c++) {
          busy[idx.get(rec[o + 1]) * C + c] += v; kern[idx.get(rec[o + 1]) * C + c] += kv;
        }
      }
    }
    const cv = $('cpus'); cv.width = C * CW; cv.height = n * SH;
    const g = cv.getContext('2d'), hz = Math.max(D.hz, 1);
    for (let p = 0; p < n; p++) for (let c = 0; c < C; c++) {
      if (UNTIMED.has(c)) { noTimes(g, c, p * SH, SH - 1); continue; }
      const pct = (k) => Math.min(100, (100 * k) / hz);
      const b = pct(busy[p * C + c]);
      g.fillStyle = heat(b / 100); g.fillRect(c * CW, p * SH, CW, SH - 1);
      // Saturated: >= 90% here and in a neighbouring second (a run of >= 2 s).
      const hot = (cc) => cc >= 0 && cc < C && pct(busy[p * C + cc]) >= 90;
      if (hot(c) && (hot(c - 1) || hot(c + 1))) { g.strokeStyle = '#d00'; g.strokeRect(c * CW + 0.5, p * SH + 0.5, CW - 1, SH - 2); }
    }
    cv.busy = busy; cv.kern = kern;
  }

  function tip(e, text) {
    const t = $('tip');
    if (!text) { t.style.display = 'none'; return; }
    t.textContent = text; t.style.display = 'block';
    t.style.left = (e.clientX + 12) + 'px'; t.style.top = (e.clientY + 12) + 'px';
  }
  function heatSlice(e) {
    const r = $('heat').getBoundingClientRect();
    const c = Math.min(C - 1, Math.max(0, Math.floor((e.clientX - r.left) / CW)));
    const row = Math.min(R - 1, Math.max(0, Math.floor((e.clientY - r.top) / CH)));
    return { c: c, row: row, s: c * R + (R - 1 - row) };
  }
  $('heat').addEventListener('mousemove', (e) => {
    const h = heatSlice(e);
    tip(e, 't = ' + fmtS(h.s) + ' s (' + clock(h.s / R) + ')\n' + (+$('heat').cells[h.s].toFixed(1)) + ' samples');
    if (drag !== null) { sel = [Math.min(drag, h.s), Math.max(drag, h.s) + 1]; drawHeat(); }
  });
  $('heat').addEventListener('mouseleave', (e) => tip(e, null));
  $('heat').addEventListener('mousedown', (e) => { drag = heatSlice(e).s; e.preventDefault(); });
  window.addEventListener('mouseup', (e) => {
    if (drag === null) return;
    const s = heatSlice(e).s, a = Math.min(drag, s), b = Math.max(drag, s) + 1;
    drag = null;
    select(a, b);
    history.replaceState(null, '', '#select=' + fmtS(a) + '-' + fmtS(b));
  });
  $('cpus').addEventListener('mousemove', (e) => {
    const r = $('cpus').getBoundingClientRect(), cv = $('cpus');
    const c = Math.floor((e.clientX - r.left) / CW), p = Math.floor((e.clientY - r.top) / SH);
    if (c < 0 || c >= C || p < 0 || p >= D.cpus.length) return tip(e, null);
    const hz = Math.max(D.hz, 1), b = cv.busy[p * C + c], k = cv.kern[p * C + c];
    const pct = (x) => Math.min(100, (100 * x) / hz).toFixed(0) + '%';
    tip(e, 'CPU ' + D.cpus[p] + ', second ' + (D.first_s + c) + ' (' + clock(c) + ')\nbusy ' + pct(b) + ' (usr ' + pct(b - k) + ', sys ' + pct(k) + ')');
  });
  $('cpus').addEventListener('mouseleave', (e) => tip(e, null));

  // The one code path for a selection: the mouse and the #select= hash both end here.
  function select(s0, s1) {
    sel = s1 > s0 ? [s0, s1] : null;
    zoom = [];
    render();
  }
  // `#select=1.0-1.2&cpu=3&comm=kubelet&cgroup=1234`: links to a view, and the browser test's
  // way in. Filters go through the same <select> elements as a user's choice.
  function fromHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    const pick = (k, value) => {
      const el = $('f-' + k), o = [...el.options].find((x) => x.textContent === value);
      if (o) { el.value = o.value; filt[k] = o.value === '' ? null : Number(o.value); }
    };
    if (h.has('cpu')) pick('cpu', 'CPU ' + h.get('cpu'));
    if (h.has('comm')) pick('comm', h.get('comm'));
    if (h.has('cgroup')) pick('cgroup', h.get('cgroup'));
    const m = /^([0-9.]+)-([0-9.]+)$/.exec(h.get('select') || '');
    if (m) select(Math.round(Number(m[1]) * R), Math.round(Number(m[2]) * R));
    else render();
  }
  window.addEventListener('hashchange', fromHash);

  function tree() {
    const root = { n: 'all', k: 2, v: 0, ch: new Map() };
    const top = new Map();
    const V = view(), rec = V.rec;
    for (let i = 0; i < V.N; i++) {
      if (!pass(V, i, false) || !inSel(V, i)) continue;
      const v = rec[i * V.W + V.n], comm = rec[i * V.W + V.comm];
      top.set(comm, (top.get(comm) || 0) + v);
      let node = root; root.v += v;
      const path = [[D.comms[comm], 2]].concat(D.stacks[rec[i * V.W + V.st]].map((f) => D.frames[f]));
      for (const [name, k] of path) {
        const key = name + '\u0000' + k;
        let next = node.ch.get(key);
        if (!next) { next = { n: name, k: k, v: 0, ch: new Map() }; node.ch.set(key, next); }
        next.v += v; node = next;
      }
    }
    return { root: root, top: top };
  }

  function drawFlame(root) {
    const box = $('flame'); box.textContent = '';
    let re = null;
    try { re = $('search').value ? new RegExp($('search').value) : null; } catch (err) { re = null; }
    // Ancestors of the zoomed node span the full width; its subtree is scaled to fill it.
    let base = root, depth = 0;
    const chain = [root];
    for (const name of zoom) {
      const next = [...base.ch.values()].find((c) => c.n === name);
      if (!next) break;
      base = next; chain.push(next);
    }
    let matched = 0, maxDepth = 0;
    function frame(node, x, w, d, path) {
      if (w < 0.05) return;
      const el = document.createElement('div');
      const hit = re !== null && re.test(node.n);
      el.className = 'fr ' + (hit ? 'hit' : ['u', 'k', 'c'][node.k]);
      el.style.left = x + '%'; el.style.width = w + '%'; el.style.top = (d * 17) + 'px';
      el.textContent = node.n;
      el.dataset.name = node.n; el.dataset.samples = node.v;
      el.title = node.n + ' (' + node.v + ' samples, ' + ((100 * node.v) / Math.max(root.v, 1)).toFixed(2) + '%)';
      el.addEventListener('click', () => { zoom = path; drawFlame(root); });
      box.appendChild(el);
      maxDepth = Math.max(maxDepth, d);
      return hit;
    }
    chain.forEach((n, d) => frame(n, 0, 100, d, zoom.slice(0, d)));
    function walk(node, x, d, path, counted) {
      let cx = x;
      const kids = [...node.ch.values()].sort((a, b) => (a.n < b.n ? -1 : 1));
      for (const k of kids) {
        const w = (100 * k.v) / Math.max(base.v, 1), p = path.concat([k.n]);
        const hit = frame(k, cx, w, d, p);
        if (hit && !counted) matched += k.v;
        walk(k, cx, d + 1, p, counted || hit);
        cx += w;
      }
    }
    walk(base, 0, chain.length, zoom.slice(0, chain.length - 1), re !== null && re.test(base.n));
    box.style.height = ((maxDepth + 1) * 17 + 4) + 'px';
    $('match').textContent = re ? 'matched: ' + ((100 * matched) / Math.max(base.v, 1)).toFixed(2) + '%' : '';
  }

  function drawTop(top, total) {
    const body = $('top').tBodies[0]; body.textContent = '';
    [...top.entries()].sort((a, b) => b[1] - a[1]).slice(0, 20).forEach(([c, v]) => {
      const tr = body.insertRow();
      [D.comms[c], v, ((100 * v) / Math.max(total, 1)).toFixed(1)].forEach((t) => { tr.insertCell().textContent = t; });
    });
  }

  let last = null;
  function render() {
    drawHeat();
    drawCpus();
    last = tree();
    $('sel-label').textContent = sel === null
      ? 'everything (drag across the heat map to choose a range)'
      : fmtS(sel[0]) + ' s to ' + fmtS(sel[1]) + ' s (' + clock(sel[0] / R) + ' to ' + clock(sel[1] / R) + '), ' + last.root.v + ' samples' +
        (view().B > 1 ? ' (stacks kept per ' + (view().B * 1000 / R) + ' ms: range rounded out to that)' : '');
    drawFlame(last.root);
    drawTop(last.top, last.root.v);
  }
  $('search').addEventListener('input', () => drawFlame(last.root));
  $('reset').addEventListener('click', () => { zoom = []; drawFlame(last.root); });
  fromHash();
})();
