// Long agent soak load for `step35 serve` (run by bench/soak_agents.sh, which starts the
// server, samples its RSS and checks the exit on SIGTERM). Node 20 built-ins only.
//
//   node bench/soak_agents.mjs --url URL --minutes M [--clients 8] [--patch FILE]
//        [--rss FILE] [--out FILE.json]
//
// Each client plays agent sessions until the deadline: multi-turn conversations on
// /v1/chat/completions, /v1/messages (Anthropic) or /v1/responses with tools declared;
// tool_choice "required" on some turns (the grammar turns the answer into a tool call), the
// tool call and a fake tool result of 300 B..3 KB appended, so the context grows until the
// server answers 400 for a prompt past the context ('context full', the session's normal
// end). Earlier assistant turns sometimes carry reasoning; about half the turns stream.
// Between turns: cancellations (a long streamed answer aborted after 0.2-1 s) and
// disconnects (a stream aborted after its first events). Around the middle of the run one
// hot-swap of --patch, later its revert. At the end: waits for the server to go idle, reads
// /metrics and the RSS samples, prints a table and exits 1 when a target fails.
import { readFileSync, writeFileSync, existsSync } from 'node:fs';

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const url = args.url;
const minutes = Number(args.minutes);
const nClients = Number(args.clients ?? 8);
if (!url || !(minutes > 0) || !(nClients > 0)) {
  console.error('usage: node bench/soak_agents.mjs --url URL --minutes M [--clients N] [--patch FILE] [--rss FILE] [--out FILE]');
  process.exit(2);
}
const runMs = minutes * 60_000;
const t0 = Date.now();
const deadline = t0 + runMs;
const hardStop = deadline + 360_000;  // nothing in flight may outlive this
const now = () => Date.now() - t0;

// Deterministic pseudo-random numbers per client (xorshift32).
function rng(seed) {
  let s = (seed * 2654435761) >>> 0 || 1;
  const next = () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; };
  next.int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  next.pick = (a) => a[Math.floor(next() * a.length)];
  return next;
}

const WORDS = ['token', 'buffer', 'expert', 'router', 'window', 'layer', 'cache', 'block', 'queue', 'stream',
  'schema', 'parser', 'kernel', 'thread', 'socket', 'request', 'result', 'offset', 'index', 'weight'];
function fakeFile(r, bytes) {
  let out = '';
  let n = 0;
  while (out.length < bytes) {
    const a = r.pick(WORDS), b = r.pick(WORDS);
    out += (n % 7 === 0) ? `// ${a} ${b}: keep the ${a} in step with the ${b}\n`
                         : `static int ${a}_${b}_${n}(int x) { return x * ${r.int(2, 97)} + ${a.length}; }\n`;
    ++n;
  }
  return out.slice(0, bytes);
}

const TOOLS = [
  { name: 'read_file', description: 'Read a source file of the repository',
    parameters: { type: 'object', properties: { path: { type: 'string', enum: ['src/engine.cpp', 'src/server.cpp', 'src/cache.cpp', 'tests/test_cache.cpp'] } }, required: ['path'] } },
  { name: 'run_tests', description: 'Run the test suite, optionally filtered',
    parameters: { type: 'object', properties: { filter: { type: 'string', maxLength: 12 } }, required: ['filter'] } },
];
const TOOLS_CHAT = TOOLS.map((t) => ({ type: 'function', function: t }));
const TOOLS_MESSAGES = TOOLS.map((t) => ({ name: t.name, description: t.description, input_schema: t.parameters }));
const TOOLS_RESPONSES = TOOLS.map((t) => ({ type: 'function', name: t.name, description: t.description, parameters: t.parameters }));

// A session's history in a neutral form, rendered per API.
// {role:'user', text} | {role:'assistant', text, reasoning, calls:[{id,name,args}]} | {role:'tool', id, text}
function renderChat(h) {
  return h.map((m) => {
    if (m.role === 'user') return { role: 'user', content: m.text };
    if (m.role === 'tool') return { role: 'tool', tool_call_id: m.id, content: m.text };
    const o = { role: 'assistant', content: m.text ?? '' };
    if (m.reasoning) o.reasoning_content = m.reasoning;
    if (m.calls.length) o.tool_calls = m.calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.args } }));
    return o;
  });
}
function renderMessages(h) {
  const out = [];
  for (const m of h) {
    if (m.role === 'assistant') {
      const blocks = [];
      if (m.reasoning) blocks.push({ type: 'thinking', thinking: m.reasoning, signature: 'soak' });
      if (m.text) blocks.push({ type: 'text', text: m.text });
      for (const c of m.calls) {
        let input = {};
        try { input = JSON.parse(c.args); } catch { /* keep {} */ }
        blocks.push({ type: 'tool_use', id: c.id, name: c.name, input });
      }
      if (!blocks.length) blocks.push({ type: 'text', text: '.' });
      out.push({ role: 'assistant', content: blocks });
      continue;
    }
    const block = m.role === 'tool' ? { type: 'tool_result', tool_use_id: m.id, content: m.text } : { type: 'text', text: m.text };
    const last = out[out.length - 1];
    if (last && last.role === 'user') last.content.push(block);  // keep user/assistant alternating
    else out.push({ role: 'user', content: [block] });
  }
  return out;
}
function renderResponses(h) {
  const out = [];
  for (const m of h) {
    if (m.role === 'user') out.push({ role: 'user', content: m.text });
    else if (m.role === 'tool') out.push({ type: 'function_call_output', call_id: m.id, output: m.text });
    else {
      if (m.reasoning) out.push({ type: 'reasoning', summary: [{ type: 'summary_text', text: m.reasoning }] });
      if (m.text || !m.calls.length) out.push({ role: 'assistant', content: m.text || '.' });
      for (const c of m.calls) out.push({ type: 'function_call', call_id: c.id, name: c.name, arguments: c.args });
    }
  }
  return out;
}

function buildRequest(api, history, { maxTokens, stream, toolChoice, seed }) {
  if (api === 'chat') {
    const body = { messages: renderChat(history), tools: TOOLS_CHAT, max_tokens: maxTokens, stream, seed };
    if (toolChoice) { body.tool_choice = 'required'; body.parallel_tool_calls = false; }
    return { path: '/v1/chat/completions', body };
  }
  if (api === 'messages') {
    const body = { model: 'soak', messages: renderMessages(history), tools: TOOLS_MESSAGES, max_tokens: maxTokens, stream };
    if (toolChoice) body.tool_choice = { type: 'any', disable_parallel_tool_use: true };
    return { path: '/v1/messages', body };
  }
  const body = { input: renderResponses(history), tools: TOOLS_RESPONSES, max_output_tokens: maxTokens, stream, store: false };
  if (toolChoice) { body.tool_choice = 'required'; body.parallel_tool_calls = false; }
  return { path: '/v1/responses', body };
}

// Answer → {text, reasoning, calls}.
function parseAnswer(api, j) {
  const a = { text: '', reasoning: '', calls: [] };
  if (api === 'chat') {
    const m = j.choices?.[0]?.message ?? {};
    a.text = m.content ?? '';
    a.reasoning = m.reasoning_content ?? '';
    for (const c of m.tool_calls ?? []) a.calls.push({ id: c.id, name: c.function.name, args: c.function.arguments });
  } else if (api === 'messages') {
    for (const b of j.content ?? []) {
      if (b.type === 'text') a.text += b.text;
      else if (b.type === 'thinking') a.reasoning += b.thinking;
      else if (b.type === 'tool_use') a.calls.push({ id: b.id, name: b.name, args: JSON.stringify(b.input ?? {}) });
    }
  } else {
    for (const o of j.output ?? []) {
      if (o.type === 'message') for (const c of o.content ?? []) a.text += c.text ?? '';
      else if (o.type === 'reasoning') for (const s of [...(o.summary ?? []), ...(o.content ?? [])]) a.reasoning += s.text ?? '';
      else if (o.type === 'function_call') a.calls.push({ id: o.call_id, name: o.name, args: o.arguments });
    }
  }
  return a;
}

// Reads an SSE body to its end (or to `stopAfterEvents` events). Returns
// {done, error, answer, ttft, events}. done: the stream's own end marker was seen.
async function readSse(api, res, t_start, stopAfterEvents, ctl) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let events = 0, ttft = null, done = false, error = null;
  const a = { text: '', reasoning: '', calls: [] };
  const chatCalls = [];
  const blocks = {};
  let finalResponse = null;
  const handle = (ev, data) => {
    ++events;
    if (data === '[DONE]') { done = true; return; }
    let j;
    try { j = JSON.parse(data); } catch { error = 'bad SSE data'; return; }
    let tokenish = false;
    if (api === 'chat') {
      if (j.error) { error = j.error.message ?? 'error chunk'; return; }
      const d = j.choices?.[0]?.delta ?? {};
      if (d.content) { a.text += d.content; tokenish = true; }
      if (d.reasoning_content) { a.reasoning += d.reasoning_content; tokenish = true; }
      for (const tc of d.tool_calls ?? []) {
        tokenish = true;
        const c = (chatCalls[tc.index ?? 0] ??= { id: '', name: '', args: '' });
        if (tc.id) c.id = tc.id;
        if (tc.function?.name) c.name += tc.function.name;
        if (tc.function?.arguments) c.args += tc.function.arguments;
      }
    } else if (api === 'messages') {
      const type = j.type ?? ev;
      if (type === 'error') { error = j.error?.message ?? 'error event'; return; }
      if (type === 'message_stop') done = true;
      if (type === 'content_block_start') blocks[j.index] = { ...j.content_block, json: '' };
      if (type === 'content_block_delta') {
        tokenish = true;
        const b = blocks[j.index] ?? (blocks[j.index] = { type: 'text', json: '' });
        const d = j.delta ?? {};
        if (d.type === 'text_delta') a.text += d.text;
        else if (d.type === 'thinking_delta') a.reasoning += d.thinking;
        else if (d.type === 'input_json_delta') b.json += d.partial_json;
      }
    } else {
      const type = j.type ?? ev;
      if (/\.delta$/.test(type)) tokenish = true;
      if (type === 'response.failed' || type === 'error') { error = j.response?.error?.message ?? j.message ?? 'response.failed'; return; }
      if (type === 'response.completed' || type === 'response.incomplete') { done = true; finalResponse = j.response; }
    }
    if (tokenish && ttft === null) ttft = performance.now() - t_start;
  };
  try {
    for (;;) {
      const { value, done: eof } = await reader.read();
      if (eof) break;
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const raw = buf.slice(0, k);
        buf = buf.slice(k + 2);
        let ev = '', data = '';
        for (const line of raw.split('\n')) {
          if (line.startsWith('event:')) ev = line.slice(6).trim();
          else if (line.startsWith('data:')) data += line.slice(5).trimStart();
        }
        if (data) handle(ev, data);
        if (stopAfterEvents && events >= stopAfterEvents) { ctl.abort(); return { done: false, aborted: true, error, answer: a, ttft, events }; }
      }
    }
  } catch (e) {
    if (e.name === 'AbortError' || ctl.signal.aborted) return { done: false, aborted: true, error, answer: a, ttft, events };
    throw e;
  }
  if (api === 'chat') a.calls = chatCalls.filter(Boolean);
  if (api === 'messages') {
    for (const b of Object.values(blocks)) if (b.type === 'tool_use') a.calls.push({ id: b.id, name: b.name, args: b.json || '{}' });
  }
  if (api === 'responses' && finalResponse) Object.assign(a, parseAnswer('responses', finalResponse));
  return { done, aborted: false, error, answer: a, ttft, events };
}

const records = [];   // {t, kind, api, stream, outcome, ms, ttft}
const errors = [];    // first error messages
const stats = { sessions: 0, turns: 0, toolCallsFromModel: 0, toolCallsFilledIn: 0, reasoningSent: 0, maxPromptChars: 0 };
const noteError = (msg) => { if (errors.length < 12) errors.push(msg); };

// One HTTP request. kind: 'turn' | 'cancel' | 'disconnect'.
async function request(api, kind, path, body, { abortAfterMs, abortAfterEvents } = {}) {
  const ctl = new AbortController();
  const limit = setTimeout(() => ctl.abort(), Math.max(1000, Math.min(360_000, hardStop - Date.now())));
  let cancelTimer = null;
  const rec = { t: now(), kind, api, stream: !!body.stream, outcome: 'error', ms: null, ttft: null };
  const t_start = performance.now();
  let answer = null;
  try {
    if (abortAfterMs) cancelTimer = setTimeout(() => ctl.abort(), abortAfterMs);
    const res = await fetch(url + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: ctl.signal });
    if (res.status !== 200) {
      const text = await res.text();
      if (res.status === 400 && /does not fit the context|context/.test(text)) rec.outcome = 'context_full';
      else { rec.outcome = `http_${res.status}`; noteError(`${kind} ${api} ${res.status}: ${text.slice(0, 200)}`); }
    } else if (body.stream) {
      const r = await readSse(api, res, t_start, abortAfterEvents, ctl);
      rec.ttft = r.ttft;
      if (r.aborted) rec.outcome = kind === 'turn' ? 'timeout' : (kind === 'cancel' ? 'cancelled' : 'disconnected');
      else if (r.error) { rec.outcome = 'stream_error'; noteError(`${kind} ${api} stream: ${r.error}`); }
      else if (!r.done) { rec.outcome = 'truncated'; noteError(`${kind} ${api}: stream ended without its end marker`); }
      else { rec.outcome = 'ok'; answer = r.answer; }
    } else {
      const j = await res.json();
      rec.outcome = 'ok';
      answer = parseAnswer(api, j);
    }
  } catch (e) {
    if (ctl.signal.aborted) rec.outcome = kind === 'turn' ? 'timeout' : (kind === 'cancel' ? 'cancelled' : 'disconnected');
    else { rec.outcome = 'fetch_error'; noteError(`${kind} ${api}: ${e.cause?.code ?? e.message}`); }
  } finally {
    clearTimeout(limit);
    if (cancelTimer) clearTimeout(cancelTimer);
  }
  if (rec.outcome === 'ok') rec.ms = performance.now() - t_start;
  if (rec.outcome === 'timeout') noteError(`${kind} ${api}: no answer within the time limit`);
  if (kind !== 'turn' && rec.outcome === 'ok') rec.outcome = 'finished_before_abort';
  records.push(rec);
  return { outcome: rec.outcome, answer };
}

const APIS = ['chat', 'chat', 'messages', 'responses'];
const TASKS = ['The cache test fails after the last change; find out why and fix it.',
  'Add a bound to the request queue and make the tests pass.',
  'The server leaks a block when a stream is cancelled; track it down.',
  'Refactor the parser so that tool calls stream incrementally.'];

async function client(id) {
  const r = rng(id * 7919 + 17);
  let session = 0;
  while (Date.now() < deadline) {
    ++session; ++stats.sessions;
    const api = APIS[(id + session) % APIS.length];
    const history = [{ role: 'user', text: `[client ${id} session ${session}] ${r.pick(TASKS)}` }];
    for (let turn = 0; turn < 80 && Date.now() < deadline; ++turn) {
      // Side traffic between turns: a cancellation or a disconnect (history unchanged).
      const side = r();
      if (side < 0.08) {
        await request('chat', 'cancel', '/v1/chat/completions',
          { messages: renderChat(history).slice(0, 1), max_tokens: 2000, ignore_eos: true, stream: true },
          { abortAfterMs: r.int(200, 1000) });
        continue;
      }
      if (side < 0.13) {
        const req = buildRequest(api, history, { maxTokens: 2000, stream: true, toolChoice: false, seed: turn });
        await request(api, 'disconnect', req.path, req.body, { abortAfterEvents: r.int(2, 6) });
        continue;
      }
      const wantTool = r() < 0.55;
      const stream = r() < 0.5;
      const req = buildRequest(api, history, { maxTokens: wantTool ? 160 : r.int(16, 64), stream, toolChoice: wantTool, seed: session * 100 + turn });
      stats.maxPromptChars = Math.max(stats.maxPromptChars, JSON.stringify(req.body).length);
      ++stats.turns;
      const { outcome, answer } = await request(api, 'turn', req.path, req.body);
      if (outcome === 'context_full') break;          // the session's expected end
      if (outcome !== 'ok') break;                    // counted as an error; start afresh
      const msg = { role: 'assistant', text: answer.text, reasoning: answer.reasoning, calls: answer.calls };
      if (!msg.reasoning && r() < 0.35) { msg.reasoning = `The ${r.pick(WORDS)} looks wrong; check the ${r.pick(WORDS)} next.`; ++stats.reasoningSent; }
      if (wantTool && !msg.calls.length) {
        // The grammar ran out of max_tokens before the call closed: the agent calls anyway.
        msg.calls.push({ id: `soak_${id}_${session}_${turn}`, name: 'read_file', args: '{"path":"src/cache.cpp"}' });
        msg.text = '';
        ++stats.toolCallsFilledIn;
      } else if (msg.calls.length) stats.toolCallsFromModel += msg.calls.length;
      history.push(msg);
      if (msg.calls.length) {
        for (const c of msg.calls) history.push({ role: 'tool', id: c.id, text: fakeFile(r, r.int(300, 3000)) });
      } else {
        history.push({ role: 'user', text: r() < 0.5 ? 'Go on.' : `Here is the log:\n${fakeFile(r, r.int(200, 1200))}` });
      }
    }
  }
}

// A hot-swap waits for the requests already running (each runs on one set of weights), which
// under a full load can take as long as the server's request timeout: 10 minutes here.
async function postJson(path, body, timeoutMs = 120_000) {
  try {
    const res = await fetch(url + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
    return { status: res.status, body: await res.text() };
  } catch (e) { return { status: 0, body: String(e.message) }; }
}

const swaps = [];
async function hotswapper() {
  if (!args.patch) return;
  const sleepUntil = async (t) => { while (Date.now() < t && Date.now() < deadline) await new Promise((r) => setTimeout(r, Math.min(500, Math.max(1, t - Date.now())))); };
  await sleepUntil(t0 + runMs * 0.45);
  if (Date.now() >= deadline) return;
  let t = now();
  const s = await postJson('/v1/step35/hotswap', { patch: args.patch }, 600_000);
  swaps.push({ what: 'swap', t, ms: now() - t, status: s.status, body: s.body.slice(0, 300) });
  await sleepUntil(t0 + runMs * 0.6);
  t = now();
  const v = await postJson('/v1/step35/hotswap/revert', {}, 600_000);
  swaps.push({ what: 'revert', t, ms: now() - t, status: v.status, body: v.body.slice(0, 300) });
}

async function metrics() {
  const res = await fetch(url + '/metrics', { signal: AbortSignal.timeout(10_000) });
  const m = {};
  for (const line of (await res.text()).split('\n')) {
    if (!line || line[0] === '#') continue;
    const sp = line.lastIndexOf(' ');
    m[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return m;
}
const sumOf = (m, re) => Object.entries(m).filter(([k]) => re.test(k)).reduce((s, [, v]) => s + v, 0);

function pct(values, p) {
  if (!values.length) return null;
  const a = [...values].sort((x, y) => x - y);
  return a[Math.min(a.length - 1, Math.max(0, Math.ceil(a.length * p) - 1))];
}

// ---- run -----------------------------------------------------------------------------
// Two kinds of memory grow by design after the reference is taken, each up to a bound the
// server reports: routed experts' copies made on first use (until every expert has been
// routed to; step35_expert_repack_bytes) and the KV pool's pages, committed when a block is
// first written (until as many positions as ever are held at once; step35_kv_bytes_total).
// The reference is taken with both gauges, and only growth beyond theirs counts.
let repackedRef = null, kvResidentRef = null, heapRef = null;
const repackProbe = (async () => {
  while (Date.now() < t0 + runMs / 12) await new Promise((r) => setTimeout(r, 250));
  try {
    const m0 = await metrics();
    repackedRef = m0.step35_expert_repacked_bytes ?? 0;
    kvResidentRef = m0.step35_kv_bytes_resident ?? 0;
    heapRef = m0['step35_heap_bytes{kind="in_use"}'] ?? null;
  } catch { repackedRef = null; kvResidentRef = null; }
})();
const swapDone = hotswapper();
await Promise.all([...Array(nClients).keys()].map((i) => client(i + 1)));
await swapDone;
await repackProbe;
const loadEnd = now();

// Idle: KV blocks used back to 0 (cancelled sequences are freed asynchronously).
let m = await metrics();
for (let i = 0; i < 100 && (m.step35_kv_blocks_used !== 0 || m.step35_running_sequences !== 0); ++i) {
  await new Promise((r) => setTimeout(r, 100));
  m = await metrics();
}
await new Promise((r) => setTimeout(r, 4500));  // two more idle RSS samples
const idleAt = Date.now();
m = await metrics();

const accepted = m.step35_requests_submitted_total ?? 0;
const finished = sumOf(m, /^step35_requests_finished_total\{/);
const srvCancelled = sumOf(m, /^step35_requests_finished_total\{reason="cancelled"\}/);
const srvErrored = sumOf(m, /^step35_requests_finished_total\{reason="(error|timeout)"\}/);
const srvCompleted = finished - srvCancelled - srvErrored;

const count = (f) => records.filter(f).length;
const turns = records.filter((r) => r.kind === 'turn');
const okTurns = turns.filter((r) => r.outcome === 'ok');
const cliErrors = count((r) => !['ok', 'context_full', 'cancelled', 'disconnected', 'finished_before_abort'].includes(r.outcome));
const cliAborted = count((r) => r.outcome === 'cancelled' || r.outcome === 'disconnected');
const cliAnswered = count((r) => r.outcome === 'ok' || r.outcome === 'finished_before_abort');
const cliSent = count((r) => r.outcome !== 'context_full' && r.outcome !== 'http_400');  // 400s never reach the engine

const win = runMs / 6;
const first = okTurns.filter((r) => r.t < win).map((r) => r.ms);
const last = okTurns.filter((r) => r.t >= runMs - win).map((r) => r.ms);
const p99First = pct(first, 0.99), p99Last = pct(last, 0.99);
const ttfts = records.filter((r) => r.kind === 'turn' && r.stream && r.outcome === 'ok' && r.ttft !== null).map((r) => r.ttft);
const ttftFirst = records.filter((r) => r.kind === 'turn' && r.stream && r.outcome === 'ok' && r.ttft !== null && r.t < win).map((r) => r.ttft);
const ttftLast = records.filter((r) => r.kind === 'turn' && r.stream && r.outcome === 'ok' && r.ttft !== null && r.t >= runMs - win).map((r) => r.ttft);

// RSS: samples "epoch_ms kB"; reference = the first sample at or after 1/12 of the run,
// end = the last sample once idle.
let rssRef = null, rssEnd = null, rssMax = null, rssN = 0, rssLine = '';
if (args.rss && existsSync(args.rss)) {
  const samples = readFileSync(args.rss, 'utf8').trim().split('\n').map((l) => l.split(' ').map(Number)).filter((s) => s.length === 2 && s[1] > 0);
  rssN = samples.length;
  rssRef = samples.find(([t]) => t >= t0 + runMs / 12)?.[1] ?? null;
  rssEnd = samples.filter(([t]) => t <= idleAt).at(-1)?.[1] ?? null;
  rssMax = Math.max(...samples.map((s) => s[1]));
  const during = samples.filter(([t]) => t >= t0);
  rssLine = [...Array(10).keys()].map((k) => during[Math.floor((during.length - 1) * (k + 1) / 10)]?.[1]).join(' ');
}

const fmt = (x, d = 0) => (x === null || x === undefined || Number.isNaN(x)) ? 'n/a' : Number(x).toFixed(d);
const checks = [];
const check = (name, ok, detail) => checks.push({ name, ok, detail });
check('lost requests', accepted === finished && finished > 0,
  `accepted ${accepted} = completed ${srvCompleted} + errored ${srvErrored} + cancelled ${srvCancelled} (${finished})`);
check('client/server agree', accepted >= cliAnswered && accepted <= cliSent && srvCancelled <= cliAborted,
  `server accepted ${accepted}, client answered ${cliAnswered} .. sent ${cliSent}; server cancelled ${srvCancelled} <= client aborts ${cliAborted}`);
check('errors', cliErrors === 0 && srvErrored === 0, `client ${cliErrors}, server ${srvErrored}`);
check('kv idle', m.step35_kv_blocks_used === 0 && m.step35_running_sequences === 0,
  `kv blocks used ${m.step35_kv_blocks_used}, running ${m.step35_running_sequences}`);
const repackedKb = repackedRef !== null ? ((m.step35_expert_repacked_bytes ?? 0) - repackedRef) / 1024 : 0;
const kvKb = kvResidentRef !== null ? ((m.step35_kv_bytes_resident ?? 0) - kvResidentRef) / 1024 : 0;
const rssRatio = rssRef && rssEnd ? (rssEnd - repackedKb - kvKb) / rssRef : null;
// The heap in use (what the server's own allocations hold) at the reference and the end:
// where the RSS check fails, this says whether memory is held or only not yet returned.
const heapEnd = m['step35_heap_bytes{kind="in_use"}'] ?? null;
console.log(`heap in use kB: after 1/12 ${fmt(heapRef !== null ? heapRef / 1024 : null)}, end ${fmt(heapEnd !== null ? heapEnd / 1024 : null)}; free at the end ${fmt((m['step35_heap_bytes{kind="free"}'] ?? 0) / 1024)}`);
check('rss', rssRatio !== null && rssRatio <= 1.02,
  `(end ${fmt(rssEnd)} kB - experts repacked since ${fmt(repackedKb)} kB - KV pages committed since ${fmt(kvKb)} kB) / after 1/12 ${fmt(rssRef)} kB = ${fmt(rssRatio, 4)}; unadjusted ${fmt(rssRef && rssEnd ? rssEnd / rssRef : null, 4)} (max ${fmt(rssMax)} kB; KV resident at the end ${fmt((m.step35_kv_bytes_resident ?? 0) / 1024)} of ${fmt((m.step35_kv_bytes_total ?? 0) / 1024)} kB)`);
const latRatio = p99First && p99Last ? p99Last / p99First : null;
check('p99 latency', latRatio !== null && latRatio <= 1.2, `last 1/6 ${fmt(p99Last)} ms / first 1/6 ${fmt(p99First)} ms = ${fmt(latRatio, 3)}`);
if (args.patch) {
  const ok = swaps.length === 2 && swaps.every((s) => s.status === 200) &&
    sumOf(m, /^step35_hotswaps_total\{result="ok"\}/) === 1 && m.step35_hotswap_reverts_total === 1 && m.step35_active_patches === 0;
  check('hot-swap + revert', ok, swaps.map((s) => `${s.what} at ${fmt(s.t / 1000, 1)} s: ${s.status} in ${s.ms} ms`).join('; ') || 'not done (run too short?)');
}

const p = (s) => console.log(s);
p(`soak_agents: ${minutes} min, ${nClients} clients, ${url}; load ${fmt(loadEnd / 1000, 1)} s`);
p(`sessions ${stats.sessions}  turns ${stats.turns}  (ok ${okTurns.length}, context full ${count((r) => r.outcome === 'context_full')})  ` +
  `tool calls: model ${stats.toolCallsFromModel}, filled in ${stats.toolCallsFilledIn}  reasoning sent ${stats.reasoningSent}  largest request ${stats.maxPromptChars} B`);
const byApi = ['chat', 'messages', 'responses'].map((a) => `${a} ${count((r) => r.api === a)}`).join(', ');
p(`requests ${records.length} (${byApi}); cancels ${count((r) => r.kind === 'cancel')} (cancelled ${count((r) => r.outcome === 'cancelled')}, finished first ${count((r) => r.kind === 'cancel' && r.outcome === 'finished_before_abort')}); ` +
  `disconnects ${count((r) => r.kind === 'disconnect')} (mid-stream ${count((r) => r.outcome === 'disconnected')})`);
p(`server: accepted ${accepted}  completed ${srvCompleted}  errored ${srvErrored}  cancelled ${srvCancelled}`);
p(`latency to the full answer (ms): all p50 ${fmt(pct(okTurns.map((r) => r.ms), 0.5))} p99 ${fmt(pct(okTurns.map((r) => r.ms), 0.99))}; ` +
  `first 1/6 n=${first.length} p99 ${fmt(p99First)}; last 1/6 n=${last.length} p99 ${fmt(p99Last)}`);
p(`time to first token, streamed (ms): p50 ${fmt(pct(ttfts, 0.5))} p99 ${fmt(pct(ttfts, 0.99))}; first 1/6 p99 ${fmt(pct(ttftFirst, 0.99))}; last 1/6 p99 ${fmt(pct(ttftLast, 0.99))}`);
p(`rss kB over the run (${rssN} samples): ${rssLine}`);
for (const s of swaps) p(`${s.what}: ${s.status} ${s.body.replace(/\s+/g, ' ').slice(0, 160)}`);
if (errors.length) { p('first errors:'); for (const e of errors) p(`  ${e}`); }
p('');
p('| target | result | detail |');
p('|---|---|---|');
for (const c of checks) p(`| ${c.name} | ${c.ok ? 'ok' : 'FAIL'} | ${c.detail} |`);
if (args.out) writeFileSync(args.out, JSON.stringify({ checks, stats, swaps, errors, accepted, finished, records: records.length }, null, 1));
process.exit(checks.every((c) => c.ok) ? 0 : 1);
