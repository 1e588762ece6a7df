// The dashboard (/dashboard): polls GET /v1/step35/dashboard (cumulative counters and
// current gauges) once a second and shows rates, the KV cache, the prefix cache, MTP, the
// router's entropy and skew over time, and the expert load per MoE layer as a heat map
// over a sliding window (the difference of two readings).
import { downloadBlob, getJson } from './api.js';

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const HISTORY_S = 330;  // readings kept: the longest window plus a margin

const state = { paused: false, history: [], trend: [], timer: null, heat: null };

// ---------------------------------------------------------------- numbers

function fmt(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(1)} M`;
  if (Math.abs(v) >= 1e4) return `${(v / 1e3).toFixed(1)} k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(digits);
}

function bytes(v) {
  if (!v) return '0 B';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; ++i; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function pct(a, b) {
  return b > 0 ? `${((100 * a) / b).toFixed(1)} %` : '–';
}

// The reading at least `seconds` before the newest one (the oldest kept if none).
function baseline(seconds) {
  const h = state.history;
  const newest = h[h.length - 1];
  if (seconds <= 0) return null;
  for (let i = h.length - 1; i >= 0; --i) if (newest.time - h[i].time >= seconds) return h[i];
  return h[0];
}

function rate(now, before, get) {
  if (!before || now.time <= before.time) return null;
  return (get(now) - get(before)) / (now.time - before.time);
}

// ---------------------------------------------------------------- cards

function card(key, value, sub = '') {
  const c = document.createElement('div');
  c.className = 'card';
  c.dataset.key = key;
  const k = document.createElement('div');
  k.className = 'k';
  k.textContent = key;
  const v = document.createElement('div');
  v.className = 'v';
  v.textContent = value;
  const s = document.createElement('div');
  s.className = 's';
  s.textContent = sub;
  c.append(k, v, s);
  return c;
}

function renderCards(d) {
  const prev = state.history.length > 1 ? state.history[state.history.length - 2] : null;
  const genRate = rate(d, prev, (x) => x.tokens.generated);
  const promptRate = rate(d, prev, (x) => x.tokens.prompt);
  const kv = d.kv;
  const pc = d.prefix_cache;
  const mtpDrafted = d.mtp.drafted.reduce((a, b) => a + b, 0);
  const mtpAccepted = d.mtp.accepted.reduce((a, b) => a + b, 0);
  const hints = d.routing_hints;
  const finished = Object.values(d.requests.finished).reduce((a, b) => a + b, 0);
  $('cards').replaceChildren(
    card('Running', fmt(d.requests.running), `of ${d.parallel} slots`),
    card('Queued', fmt(d.requests.queued), `${fmt(finished)} finished`),
    card('Generation', `${fmt(genRate)} tok/s`, `${fmt(d.tokens.generated)} tokens`),
    card('Prompt', `${fmt(promptRate)} tok/s`, `${fmt(d.tokens.prompt_cached)} cached tokens`),
    card('KV cache', pct(kv.blocks_used, kv.blocks_total),
         `${fmt(kv.blocks_used)} used, ${fmt(kv.blocks_cached)} cached of ${fmt(kv.blocks_total)} blocks · ${bytes(kv.bytes_used)}`),
    card('Prefix cache hits', pct(pc.hits, pc.lookups), `${fmt(pc.hits)} of ${fmt(pc.lookups)} lookups`),
    card('MTP acceptance', d.mtp.enabled ? pct(mtpAccepted, mtpDrafted) : 'off',
         d.mtp.enabled ? d.mtp.drafted.map((n, i) => `k${i + 1} ${pct(d.mtp.accepted[i], n)}`).join(' ') : ''),
    card('Router entropy', `${fmt(d.moe.router_entropy, 3)}`, 'nats, recent steps'),
    card('Expert skew', `${fmt(d.moe.expert_skew, 2)}`, `max / mean · ${fmt(d.moe.distinct_experts, 1)} distinct`),
    card('Hint compliance', hints.requests ? pct(hints.compliant, hints.requests) : '–',
         `${fmt(hints.requests)} hinted requests`),
  );
}

// ---------------------------------------------------------------- heat map

// Counts per [layer][expert] over the chosen window.
function windowCounts(d) {
  const w = Number($('window').value);
  const base = baseline(w);
  const now = d.experts.counts;
  if (!base || !base.experts.counts.length) return now.map((row) => row.slice());
  return now.map((row, l) => row.map((v, e) => v - (base.experts.counts[l]?.[e] ?? 0)));
}

function heatColour(x) {
  // 0 -> pale, 1 -> dark red through orange.
  const t = Math.max(0, Math.min(1, x));
  const r = Math.round(255 - 80 * t);
  const g = Math.round(247 - 200 * t * (1.2 - 0.4 * t));
  const b = Math.round(236 - 220 * Math.sqrt(t));
  return `rgb(${r},${Math.max(0, g)},${Math.max(0, b)})`;
}

function drawHeat(d) {
  const counts = windowCounts(d);
  const layers = d.experts.layers;
  const nExpert = d.experts.n_expert || (counts[0] || []).length;
  state.heat = { counts, layers, nExpert };
  const canvas = $('heat');
  const css = canvas.parentElement.clientWidth || 800;
  const dpr = window.devicePixelRatio || 1;
  const labelW = 34;
  const cellW = Math.max(2, (css - labelW) / Math.max(1, nExpert));
  const cellH = Math.max(6, Math.min(22, 320 / Math.max(1, counts.length)));
  const width = Math.max(css, labelW + cellW * nExpert);
  const height = cellH * Math.max(1, counts.length) + 16;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const style = getComputedStyle(document.body);
  g.fillStyle = style.backgroundColor;
  g.fillRect(0, 0, width, height);
  const perLayer = $('per-layer').checked;
  let globalMax = 0;
  for (const row of counts) for (const v of row) globalMax = Math.max(globalMax, v);
  let total = 0;
  counts.forEach((row, l) => {
    const max = perLayer ? Math.max(0, ...row) : globalMax;
    row.forEach((v, e) => {
      total += v;
      g.fillStyle = heatColour(max > 0 ? v / max : 0);
      g.fillRect(labelW + e * cellW, l * cellH, Math.ceil(cellW), Math.ceil(cellH));
    });
    g.fillStyle = style.color;
    g.font = `${Math.min(11, cellH)}px system-ui, sans-serif`;
    g.textBaseline = 'middle';
    g.fillText(`L${layers[l] ?? l}`, 2, l * cellH + cellH / 2);
  });
  g.fillStyle = style.color;
  g.font = '10px system-ui, sans-serif';
  g.textBaseline = 'top';
  const step = Math.max(1, Math.ceil(24 / cellW));  // expert numbers at least 24 px apart
  for (let e = 0; e < nExpert; e += step) g.fillText(String(e), labelW + e * cellW + 1, counts.length * cellH + 3);
  const w = Number($('window').value);
  $('heat-caption').textContent =
    `${counts.length} layers × ${nExpert} experts · ${fmt(total)} routings ${w > 0 ? `in the last ${w} s` : 'since start'}`;
  canvas.dataset.total = String(total);
}

function heatTip(e) {
  const h = state.heat;
  if (!h) return;
  const canvas = $('heat');
  const r = canvas.getBoundingClientRect();
  const labelW = 34;
  const cellW = (r.width - labelW) / Math.max(1, h.nExpert);
  const cellH = (r.height - 16) / Math.max(1, h.counts.length);
  const ex = Math.floor((e.clientX - r.left - labelW) / cellW);
  const l = Math.floor((e.clientY - r.top) / cellH);
  if (ex < 0 || ex >= h.nExpert || l < 0 || l >= h.counts.length) return;
  $('heat-tip').textContent = `Layer ${h.layers[l] ?? l}, expert ${ex}: ${h.counts[l][ex]} routings in the window`;
}

function heatCsv() {
  const h = state.heat;
  if (!h) return;
  const lines = [['layer', ...Array.from({ length: h.nExpert }, (_, e) => `expert_${e}`)].join(',')];
  h.counts.forEach((row, l) => lines.push([h.layers[l] ?? l, ...row].join(',')));
  downloadBlob(new Blob([`${lines.join('\n')}\n`], { type: 'text/csv' }), 'step35-expert-load.csv');
}

function heatPng() {
  $('heat').toBlob((blob) => { if (blob) downloadBlob(blob, 'step35-expert-load.png'); }, 'image/png');
}

// ---------------------------------------------------------------- trend

function drawTrend() {
  const canvas = $('trend');
  const css = canvas.clientWidth || 800;
  const height = 160;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(css * dpr);
  canvas.height = Math.round(height * dpr);
  canvas.style.height = `${height}px`;
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const style = getComputedStyle(document.body);
  g.clearRect(0, 0, css, height);
  const pts = state.trend;
  g.strokeStyle = style.color;
  g.globalAlpha = 0.25;
  g.strokeRect(0.5, 0.5, css - 1, height - 1);
  g.globalAlpha = 1;
  if (pts.length < 2) return;
  const t1 = pts[pts.length - 1].time;
  const t0 = Math.min(pts[0].time, t1 - 10);
  const series = [['entropy', '#2f6fde'], ['skew', '#e07b24']];
  for (const [key, colour] of series) {
    const max = Math.max(1e-9, ...pts.map((p) => p[key])) * 1.1;
    g.strokeStyle = colour;
    g.lineWidth = 2;
    g.beginPath();
    pts.forEach((p, i) => {
      const x = ((p.time - t0) / (t1 - t0)) * (css - 8) + 4;
      const y = height - 6 - (p[key] / max) * (height - 16);
      if (i) g.lineTo(x, y); else g.moveTo(x, y);
    });
    g.stroke();
    g.fillStyle = colour;
    g.font = '11px system-ui, sans-serif';
    g.fillText(`${key} ${fmt(pts[pts.length - 1][key], 3)} (max ${fmt(max / 1.1, 3)})`, 8, key === 'entropy' ? 14 : 28);
  }
}

// ---------------------------------------------------------------- polling

async function poll() {
  state.timer = null;
  if (state.paused) return;
  try {
    const d = await getJson('/v1/step35/dashboard');
    if (state.paused) return;
    state.history.push(d);
    while (state.history.length > 2 && d.time - state.history[0].time > HISTORY_S) state.history.shift();
    state.trend.push({ time: d.time, entropy: d.moe.router_entropy, skew: d.moe.expert_skew });
    while (state.trend.length > 2 && d.time - state.trend[0].time > HISTORY_S) state.trend.shift();
    $('model-name').textContent = d.model;
    renderCards(d);
    drawHeat(d);
    drawTrend();
    $('status').textContent = `updated ${new Date().toLocaleTimeString()}`;
    $('status').classList.remove('error');
  } catch (e) {
    $('status').textContent = e.status === 503 ? 'The model is loading…' : e.message;
    $('status').classList.add('error');
    if (e.status === 401) {
      // No key given: stop asking every second; Resume asks again.
      setPaused(true);
      $('status').textContent = 'An API key is needed: press Resume to enter it.';
      return;
    }
  }
  if (!state.paused) state.timer = setTimeout(poll, POLL_MS);
}

function redrawLatest() {
  const d = state.history[state.history.length - 1];
  if (d) { drawHeat(d); drawTrend(); }
}

function setPaused(paused) {
  state.paused = paused;
  $('pause').textContent = paused ? 'Resume' : 'Pause';
  $('pause').setAttribute('aria-pressed', String(paused));
  $('status').textContent = paused ? 'paused' : '';
  $('status').classList.remove('error');
  if (!paused && !state.timer) poll();
  if (paused && state.timer) { clearTimeout(state.timer); state.timer = null; }
}

function wire() {
  $('pause').addEventListener('click', () => setPaused(!state.paused));
  $('window').addEventListener('change', redrawLatest);
  $('per-layer').addEventListener('change', redrawLatest);
  $('export-csv').addEventListener('click', heatCsv);
  $('export-png').addEventListener('click', heatPng);
  $('heat').addEventListener('mousemove', heatTip);
  let resizeTimer = null;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(redrawLatest, 100);
  });
}

wire();
poll();
