// The chat page (/): conversations kept in this browser (localStorage), answers streamed
// from /v1/chat/completions and rendered as Markdown (markdown.js: DOM nodes and text
// only, never HTML from the model).
import { ApiError, apiFetch, downloadBlob, errorOf, getJson, readEvents } from './api.js';
import { renderMarkdown } from './markdown.js';

const STORE = 'step35.conversations';
const CURRENT = 'step35.current';
const $ = (id) => document.getElementById(id);
const SETTING_FIELDS = ['temperature', 'top_p', 'top_k', 'max_tokens', 'seed'];

const state = {
  conversations: [],
  current: null,       // the conversation shown
  props: null,         // GET /props
  running: null,       // { controller, conv, message } while an answer streams
  attachments: [],     // data: URLs of images for the next message (vision only)
};

// ---------------------------------------------------------------- storage

function load() {
  try {
    const list = JSON.parse(localStorage.getItem(STORE) || '[]');
    state.conversations = Array.isArray(list) ? list.filter(validConversation) : [];
  } catch {
    state.conversations = [];
  }
  const id = localStorage.getItem(CURRENT);
  state.current = state.conversations.find((c) => c.id === id) || null;
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(state.conversations));
    localStorage.setItem(CURRENT, state.current ? state.current.id : '');
  } catch (e) {
    notice(`Could not save the conversations in this browser: ${e.message}`, true);
  }
}

function validConversation(c) {
  return c && typeof c === 'object' && typeof c.id === 'string' && Array.isArray(c.messages);
}

function newId() {
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

function newConversation() {
  const c = { id: newId(), title: 'New chat', created: Date.now(), updated: Date.now(), settings: {}, messages: [] };
  state.conversations.unshift(c);
  state.current = c;
  save();
  return c;
}

// ---------------------------------------------------------------- notices

function notice(text, isError = false) {
  const n = $('notice');
  n.textContent = text;
  n.classList.toggle('error', isError);
  n.classList.toggle('hidden', !text);
}

// ---------------------------------------------------------------- sidebar

function renderSidebar() {
  const ul = $('conversations');
  ul.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => (b.updated || 0) - (a.updated || 0));
  for (const c of sorted) {
    const li = document.createElement('li');
    li.dataset.id = c.id;
    if (c === state.current) li.className = 'current';
    const title = document.createElement('button');
    title.type = 'button';
    title.className = 'title';
    title.textContent = c.title || 'Untitled';
    title.title = c.title || 'Untitled';
    title.addEventListener('click', () => select(c));
    const rename = actionButton('Rename', '✎', () => startRename(li, c));
    const del = actionButton('Delete', '✕', () => {
      if (del.dataset.armed !== '1') {
        del.dataset.armed = '1';
        del.textContent = 'Delete?';
        setTimeout(() => { del.dataset.armed = ''; del.textContent = '✕'; }, 3000);
        return;
      }
      remove(c);
    });
    del.classList.add('delete');
    rename.classList.add('rename');
    li.append(title, rename, del);
    ul.append(li);
  }
}

function actionButton(label, text, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'act';
  b.title = label;
  b.setAttribute('aria-label', label);
  b.textContent = text;
  b.addEventListener('click', onClick);
  return b;
}

function startRename(li, c) {
  const input = document.createElement('input');
  input.value = c.title || '';
  input.setAttribute('aria-label', 'Conversation name');
  li.replaceChildren(input);
  input.focus();
  input.select();
  let finished = false;
  const finish = (keep) => {
    if (finished) return;
    finished = true;
    if (keep && input.value.trim()) {
      c.title = input.value.trim().slice(0, 200);
      save();
    }
    renderSidebar();
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); finish(true); }
    if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); finish(false); }
  });
  input.addEventListener('blur', () => finish(true));
}

function select(c) {
  if (state.running) stop();
  state.current = c;
  save();
  renderAll();
  closeSidebarOnPhone();
}

function remove(c) {
  if (state.running && state.running.conv === c) stop();
  state.conversations = state.conversations.filter((x) => x !== c);
  if (state.current === c) state.current = state.conversations[0] || null;
  save();
  renderAll();
}

function closeSidebarOnPhone() {
  $('sidebar').classList.remove('open');
  $('toggle-sidebar').setAttribute('aria-expanded', 'false');
}

// ---------------------------------------------------------------- export / import

function exportConversations() {
  const data = { format: 'step35.conversations', version: 1, exported: new Date().toISOString(),
                 conversations: state.conversations };
  downloadBlob(new Blob([JSON.stringify(data, null, 2)], { type: 'application/json' }),
               `step35-conversations-${new Date().toISOString().slice(0, 10)}.json`);
}

async function importConversations(file) {
  try {
    const data = JSON.parse(await file.text());
    const list = Array.isArray(data) ? data : data?.conversations;
    if (!Array.isArray(list)) throw new Error('no "conversations" list in the file');
    let n = 0;
    for (const raw of list) {
      if (!validConversation(raw)) continue;
      const c = {
        id: state.conversations.some((x) => x.id === raw.id) ? newId() : raw.id,
        title: String(raw.title || 'Imported chat'),
        created: Number(raw.created) || Date.now(),
        updated: Number(raw.updated) || Date.now(),
        settings: raw.settings && typeof raw.settings === 'object' ? raw.settings : {},
        messages: raw.messages.filter((m) => m && typeof m.role === 'string'),
      };
      state.conversations.push(c);
      ++n;
    }
    save();
    renderSidebar();
    notice(`Imported ${n} conversation${n === 1 ? '' : 's'}.`);
  } catch (e) {
    notice(`Could not import ${file.name}: ${e.message}`, true);
  }
}

// ---------------------------------------------------------------- messages

function renderAll() {
  renderSidebar();
  renderMessages();
  loadSettingsForm();
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  const msgs = state.current ? state.current.messages : [];
  if (!msgs.length) {
    const p = document.createElement('p');
    p.id = 'empty';
    p.className = 'muted center';
    p.textContent = 'Send a message to start. Enter sends, Shift+Enter starts a new line, Esc stops.';
    box.append(p);
    return;
  }
  msgs.forEach((m, i) => box.append(messageView(m, i)));
  box.scrollTop = box.scrollHeight;
}

function messageView(m, index) {
  const wrap = document.createElement('div');
  wrap.className = `msg ${m.role}`;
  wrap.dataset.index = String(index);
  const who = document.createElement('div');
  who.className = 'who';
  const name = document.createElement('span');
  name.textContent = m.role === 'assistant' ? 'step35' : m.role === 'tool' ? 'tool result' : m.role;
  who.append(name);
  const conv = state.current;
  const last = conv && index === conv.messages.length - 1;
  if (m.role === 'user') who.append(smallButton('Edit', 'edit', () => startEdit(wrap, index)));
  if (m.role === 'user' && last) who.append(smallButton('Send again', 'retry', () => regenerate()));
  if (m.role === 'assistant' && last)
    who.append(smallButton('Regenerate', 'regenerate', () => regenerate()));
  if (m.role === 'assistant' && m.content)
    who.append(smallButton('Copy', 'copy-message', (b) => copyMessage(m.content, b)));
  const body = document.createElement('div');
  body.className = 'body';
  wrap.append(who, body);
  fillBody(body, m);
  const stats = document.createElement('div');
  stats.className = 'stats';
  stats.textContent = statsText(m);
  wrap.append(stats);
  return wrap;
}

function smallButton(label, cls, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = cls;
  b.textContent = label;
  b.addEventListener('click', () => onClick(b));
  return b;
}

async function copyMessage(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    button.textContent = 'Copy failed';
  }
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
}

// The body of a message: user text as plain text, assistant text as Markdown, reasoning
// collapsed, tool calls and tool results as such.
function fillBody(body, m) {
  body.replaceChildren();
  if (m.role === 'user' || m.role === 'system') {
    body.classList.add('plain');
    for (const src of m.images || []) {
      const img = document.createElement('img');
      img.className = 'attached';
      img.alt = 'attached image';
      if (/^data:image\//.test(src)) img.src = src;
      body.append(img);
    }
    body.append(document.createTextNode(m.content || ''));
    return;
  }
  if (m.role === 'tool') {
    const t = document.createElement('div');
    t.className = 'tool result';
    const label = document.createElement('div');
    label.className = 'label';
    label.textContent = `Result of ${m.name || 'a tool'}${m.tool_call_id ? ` (${m.tool_call_id})` : ''}`;
    const pre = document.createElement('pre');
    const code = document.createElement('code');
    code.textContent = typeof m.content === 'string' ? m.content : JSON.stringify(m.content, null, 2);
    pre.append(code);
    t.append(label, pre);
    body.append(t);
    return;
  }
  if (m.reasoning) {
    const d = document.createElement('details');
    d.className = 'reasoning';
    const s = document.createElement('summary');
    const n = m.reasoning_tokens || 0;
    s.textContent = `Reasoning (${n} token${n === 1 ? '' : 's'})`;
    const t = document.createElement('div');
    t.className = 'text';
    t.textContent = m.reasoning;
    d.append(s, t);
    body.append(d);
  }
  if (m.content) {
    const md = document.createElement('div');
    md.className = 'md';
    md.append(renderMarkdown(m.content));
    body.append(md);
  }
  for (const call of m.tool_calls || []) {
    const t = document.createElement('div');
    t.className = 'tool call';
    const label = document.createElement('div');
    label.className = 'label';
    label.textContent = `Tool call: ${call.function?.name || '?'}${call.id ? ` (${call.id})` : ''}`;
    const pre = document.createElement('pre');
    const code = document.createElement('code');
    let args = call.function?.arguments || '';
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* partial: as sent */ }
    code.textContent = args;
    pre.append(code);
    t.append(label, pre);
    body.append(t);
  }
  if (m.status) {
    const s = document.createElement('div');
    s.className = 'status';
    s.textContent = m.status;
    body.append(s);
  }
  if (!m.reasoning && !m.content && !(m.tool_calls || []).length && !m.status) {
    const s = document.createElement('div');
    s.className = 'status';
    s.textContent = '…';
    body.append(s);
  }
}

function statsText(m) {
  const st = m.stats;
  if (!st) return '';
  const parts = [];
  if (st.completion_tokens != null) parts.push(`${st.completion_tokens} tokens`);
  if (st.tokens_per_s != null) parts.push(`${st.tokens_per_s.toFixed(1)} tokens/s`);
  if (st.ttft_ms != null) parts.push(`first token ${Math.round(st.ttft_ms)} ms`);
  if (st.prompt_tokens != null && st.n_ctx) {
    const used = st.prompt_tokens + (st.completion_tokens || 0);
    parts.push(`context ${used} / ${st.n_ctx} (${Math.round((100 * used) / st.n_ctx)} %)`);
  }
  if (st.cached_tokens) parts.push(`${st.cached_tokens} prompt tokens cached`);
  return parts.join(' · ');
}

// ---------------------------------------------------------------- editing

function startEdit(wrap, index) {
  if (state.running) return;
  const m = state.current.messages[index];
  const body = wrap.querySelector('.body');
  const box = document.createElement('div');
  box.className = 'edit-box';
  const ta = document.createElement('textarea');
  ta.value = m.content || '';
  ta.setAttribute('aria-label', 'Edit message');
  const row = document.createElement('div');
  row.className = 'row';
  const send = smallButton('Save and send', 'primary save-edit', () => {
    const text = ta.value.trim();
    if (!text) return;
    state.current.messages.splice(index);
    state.current.messages.push({ role: 'user', content: text, images: m.images });
    touch(state.current);
    renderMessages();
    generate(state.current);
  });
  const cancel = smallButton('Cancel', 'cancel-edit', () => renderMessages());
  row.append(send, cancel);
  box.append(ta, row);
  body.replaceChildren(box);
  body.classList.remove('plain');
  ta.focus();
  ta.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send.click(); }
    if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); renderMessages(); }
  });
}

function regenerate() {
  const c = state.current;
  if (!c || state.running) return;
  while (c.messages.length && c.messages[c.messages.length - 1].role === 'assistant') c.messages.pop();
  if (!c.messages.length) return;
  touch(c);
  renderMessages();
  generate(c);
}

function touch(c) {
  c.updated = Date.now();
  save();
}

// ---------------------------------------------------------------- sending

function send() {
  const input = $('input');
  const text = input.value.trim();
  if (state.running || (!text && !state.attachments.length)) return;
  const c = state.current || newConversation();
  const m = { role: 'user', content: text };
  if (state.attachments.length) m.images = state.attachments.splice(0);
  renderAttachments();
  c.messages.push(m);
  if (c.title === 'New chat' && text) c.title = text.replace(/\s+/g, ' ').slice(0, 60);
  input.value = '';
  touch(c);
  renderAll();
  generate(c);
}

// The messages as the API takes them (the display-only fields dropped).
function apiMessages(c) {
  const out = [];
  const system = (c.settings?.system || '').trim();
  if (system) out.push({ role: 'system', content: system });
  for (const m of c.messages) {
    if (m.role === 'assistant') {
      const a = { role: 'assistant', content: m.content || '' };
      if (m.tool_calls?.length) a.tool_calls = m.tool_calls;
      out.push(a);
    } else if (m.role === 'tool') {
      out.push({ role: 'tool', content: m.content, tool_call_id: m.tool_call_id, ...(m.name ? { name: m.name } : {}) });
    } else if (m.images?.length) {
      out.push({ role: m.role, content: [{ type: 'text', text: m.content || '' },
        ...m.images.map((url) => ({ type: 'image_url', image_url: { url } }))] });
    } else {
      out.push({ role: m.role, content: m.content || '' });
    }
  }
  return out;
}

function requestBody(c) {
  const s = c.settings || {};
  const body = { messages: apiMessages(c), stream: true, stream_options: { include_usage: true } };
  if (state.props?.model) body.model = state.props.model;
  for (const f of SETTING_FIELDS) if (s[f] !== undefined && s[f] !== null && s[f] !== '') body[f] = Number(s[f]);
  if (s.reasoning_effort) body.reasoning_effort = s.reasoning_effort;
  if (s.extra && typeof s.extra === 'object') Object.assign(body, s.extra);
  return body;
}

function setRunning(on) {
  $('send').classList.toggle('hidden', on);
  $('stop').classList.toggle('hidden', !on);
}

function stop() {
  if (state.running) state.running.controller.abort();
}

// Streams an answer to conversation c's last message.
async function generate(c) {
  notice('');
  const message = { role: 'assistant', content: '', reasoning: '', reasoning_tokens: 0 };
  c.messages.push(message);
  const controller = new AbortController();
  state.running = { controller, conv: c, message };
  setRunning(true);
  renderMessages();
  const view = () => (state.current === c ? $('messages').lastElementChild : null);
  const t0 = performance.now();
  let tFirst = null;
  let chunkTime = 0;
  let usage = null;
  let firstMarked = false;
  const redraw = () => {
    const v = view();
    if (!v) return;
    fillBody(v.querySelector('.body'), message);
    const box = $('messages');
    if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
  };
  try {
    const res = await apiFetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(requestBody(c)),
      signal: controller.signal,
    });
    if (!res.ok) throw await errorOf(res);
    const finished = await readEvents(res, (ev) => {
      if (ev.error) throw new ApiError(ev.error.code || 500, ev.error.message || 'generation failed');
      if (ev.usage) usage = ev.usage;
      const choice = ev.choices?.[0];
      if (!choice) return;
      const d = choice.delta || {};
      let changed = false;
      if (d.reasoning_content) { message.reasoning += d.reasoning_content; ++message.reasoning_tokens; changed = true; }
      if (d.content) { message.content += d.content; changed = true; }
      if (d.tool_calls) { mergeToolCalls(message, d.tool_calls); changed = true; }
      if (choice.finish_reason) message.finish_reason = choice.finish_reason;
      if (!changed) return;
      if (tFirst === null) tFirst = chunkTime;
      redraw();
      if (!firstMarked) {
        // For the page's latency test: when the first token's bytes arrived, and when it showed.
        firstMarked = true;
        performance.mark('step35-first-token-arrived', { startTime: chunkTime });
        performance.mark('step35-first-token-shown');
      }
    }, (t) => { chunkTime = t; });
    if (!finished) message.status = 'The connection dropped before the answer was complete.';
    else if (message.finish_reason === 'length') message.status = 'Stopped at the token limit.';
  } catch (e) {
    if (e.name === 'AbortError') {
      message.status = 'Stopped.';
    } else if (e instanceof ApiError) {
      if (!message.content && !message.reasoning) c.messages.pop();
      else message.status = e.message;
      notice(e.message, true);
    } else if (e instanceof TypeError) {
      message.status = 'The connection dropped before the answer was complete.';
      notice('The connection to the server dropped.', true);
    } else {
      message.status = `Error: ${e.message}`;
      notice(String(e.message || e), true);
    }
  } finally {
    const tEnd = performance.now();
    if (c.messages.includes(message)) {
      message.stats = answerStats(usage, message, t0, tFirst, tEnd);
      if (!message.reasoning) { delete message.reasoning; delete message.reasoning_tokens; }
    }
    state.running = null;
    setRunning(false);
    touch(c);
    if (state.current === c) renderMessages();
    renderSidebar();
  }
}

function answerStats(usage, message, t0, tFirst, tEnd) {
  const st = { n_ctx: state.props?.n_ctx || null };
  if (tFirst !== null) st.ttft_ms = tFirst - t0;
  if (usage) {
    st.prompt_tokens = usage.prompt_tokens;
    st.completion_tokens = usage.completion_tokens;
    st.cached_tokens = usage.prompt_tokens_details?.cached_tokens || 0;
  }
  const n = st.completion_tokens ?? null;
  if (n && n > 1 && tFirst !== null && tEnd > tFirst) st.tokens_per_s = ((n - 1) * 1000) / (tEnd - tFirst);
  return st;
}

function mergeToolCalls(message, deltas) {
  message.tool_calls ||= [];
  for (const d of deltas) {
    const i = d.index ?? message.tool_calls.length;
    const call = (message.tool_calls[i] ||= { id: '', type: 'function', function: { name: '', arguments: '' } });
    if (d.id) call.id = d.id;
    if (d.function?.name) call.function.name += d.function.name;
    if (d.function?.arguments) call.function.arguments += d.function.arguments;
  }
}

// ---------------------------------------------------------------- settings

function loadSettingsForm() {
  const s = state.current?.settings || {};
  $('set-system').value = s.system || '';
  for (const f of SETTING_FIELDS) $(`set-${f}`).value = s[f] ?? '';
  $('set-reasoning_effort').value = s.reasoning_effort || '';
  $('set-extra').value = s.extra ? JSON.stringify(s.extra) : '';
  $('settings-error').classList.add('hidden');
}

function saveSettingsForm() {
  const c = state.current || newConversation();
  const s = (c.settings ||= {});
  s.system = $('set-system').value;
  for (const f of SETTING_FIELDS) {
    const v = $(`set-${f}`).value;
    if (v === '') delete s[f]; else s[f] = Number(v);
  }
  s.reasoning_effort = $('set-reasoning_effort').value;
  const err = $('settings-error');
  const extra = $('set-extra').value.trim();
  try {
    const parsed = extra ? JSON.parse(extra) : null;
    if (parsed !== null && (typeof parsed !== 'object' || Array.isArray(parsed))) throw new Error('not a JSON object');
    if (parsed) s.extra = parsed; else delete s.extra;
    err.classList.add('hidden');
  } catch (e) {
    err.textContent = `Extra request fields: ${e.message}`;
    err.classList.remove('hidden');
  }
  touch(c);
  renderSidebar();
}

// ---------------------------------------------------------------- images (vision only)

function renderAttachments() {
  const box = $('attachments');
  box.replaceChildren();
  state.attachments.forEach((src, i) => {
    const img = document.createElement('img');
    img.src = src;
    img.alt = 'attachment';
    img.title = 'Click to remove';
    img.addEventListener('click', () => { state.attachments.splice(i, 1); renderAttachments(); });
    box.append(img);
  });
  box.classList.toggle('hidden', !state.attachments.length);
}

function addImages(files) {
  for (const f of files) {
    if (!f.type.startsWith('image/')) continue;
    const reader = new FileReader();
    reader.onload = () => { state.attachments.push(String(reader.result)); renderAttachments(); };
    reader.readAsDataURL(f);
  }
}

function enableVision() {
  $('attach').classList.remove('hidden');
  $('attach').addEventListener('click', () => $('image-input').click());
  $('image-input').addEventListener('change', (e) => { addImages(e.target.files); e.target.value = ''; });
  $('input').addEventListener('paste', (e) => {
    const files = [...(e.clipboardData?.files || [])];
    if (files.length) { e.preventDefault(); addImages(files); }
  });
  const main = document.querySelector('main');
  main.addEventListener('dragover', (e) => { e.preventDefault(); main.classList.add('dragging'); });
  main.addEventListener('dragleave', () => main.classList.remove('dragging'));
  main.addEventListener('drop', (e) => {
    e.preventDefault();
    main.classList.remove('dragging');
    addImages(e.dataTransfer?.files || []);
  });
}

// ---------------------------------------------------------------- start

function wire() {
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && state.running) { e.preventDefault(); stop(); }
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', () => { if (state.running) stop(); newConversation(); renderAll(); closeSidebarOnPhone(); $('input').focus(); });
  $('export').addEventListener('click', exportConversations);
  $('import').addEventListener('change', (e) => { if (e.target.files[0]) importConversations(e.target.files[0]); e.target.value = ''; });
  $('toggle-sidebar').addEventListener('click', () => {
    const open = $('sidebar').classList.toggle('open');
    $('toggle-sidebar').setAttribute('aria-expanded', String(open));
  });
  const toggleSettings = (show) => {
    $('settings').classList.toggle('hidden', !show);
    $('settings-button').setAttribute('aria-expanded', String(show));
  };
  $('settings-button').addEventListener('click', () => toggleSettings($('settings').classList.contains('hidden')));
  $('settings-close').addEventListener('click', () => toggleSettings(false));
  for (const el of $('settings').querySelectorAll('input, select, textarea')) el.addEventListener('change', saveSettingsForm);
}

async function start() {
  load();
  wire();
  renderAll();
  try {
    state.props = await getJson('/props');
    $('model-name').textContent = state.props.model || '';
    if (state.props.modalities?.vision) enableVision();
  } catch (e) {
    notice(e.status === 503 ? 'The model is still loading: try again in a moment.' : e.message, true);
  }
  $('input').focus();
}

start();
