// What both pages share: the API key (kept in localStorage, sent as Authorization: Bearer,
// asked for when an endpoint answers 401), JSON requests, errors as readable messages,
// and a reader for server-sent events.

const KEY_STORAGE = 'step35.apiKey';

export function apiKey() {
  try { return localStorage.getItem(KEY_STORAGE) || ''; } catch { return ''; }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key); else localStorage.removeItem(KEY_STORAGE);
  } catch { /* storage unavailable: the key lasts for this page only */ }
}

export function authHeaders(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

let pendingKeyPrompt = null;

// Shows the page's key dialog; resolves true once a key is saved, false when cancelled.
// Several callers asking at once share one dialog.
export function askForKey(reason) {
  if (pendingKeyPrompt) return pendingKeyPrompt;
  const dialog = document.getElementById('key-dialog');
  const input = document.getElementById('key-input');
  document.getElementById('key-reason').textContent = reason || 'This server needs an API key.';
  input.value = '';
  pendingKeyPrompt = new Promise((resolve) => {
    const done = (ok) => {
      dialog.removeEventListener('close', onClose);
      document.getElementById('key-cancel').removeEventListener('click', onCancel);
      pendingKeyPrompt = null;
      resolve(ok);
    };
    const onClose = () => {
      const ok = dialog.returnValue === 'ok' && input.value.trim() !== '';
      if (ok) setApiKey(input.value.trim());
      done(ok);
    };
    const onCancel = () => { dialog.returnValue = 'cancel'; dialog.close(); };
    dialog.addEventListener('close', onClose);
    document.getElementById('key-cancel').addEventListener('click', onCancel);
    dialog.returnValue = '';
    dialog.showModal();
    input.focus();
  });
  return pendingKeyPrompt;
}

// An HTTP error (or a dropped connection) with a message for people.
export class ApiError extends Error {
  constructor(status, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

// The error of a non-2xx response, with the server's own message where it sent one.
export async function errorOf(res) {
  let message = '';
  try {
    const body = await res.json();
    message = body?.error?.message || body?.message || '';
  } catch { /* not JSON */ }
  const retry = res.headers.get('Retry-After');
  if (res.status === 503) {
    const why = message ? ` (${message})` : '';
    return new ApiError(503, `The server is busy${why}. Try again${retry ? ` in ${retry} s` : ' shortly'}.`, retry);
  }
  if (res.status === 401) return new ApiError(401, 'The API key is missing or wrong.');
  if (res.status === 400) return new ApiError(400, `The server refused the request: ${message || 'bad request'}`);
  if (res.status === 408) return new ApiError(408, `The request timed out${message ? `: ${message}` : ''}.`);
  return new ApiError(res.status, `Error ${res.status}${message ? `: ${message}` : ''}`);
}

// fetch() with the key; a 401 asks for a key once and retries. Network failures become
// ApiError(0). Other statuses are returned as they are (check res.ok).
export async function apiFetch(path, options = {}) {
  for (let attempt = 0; ; ++attempt) {
    let res;
    try {
      res = await fetch(path, { ...options, headers: authHeaders(options.headers || {}) });
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      throw new ApiError(0, 'Cannot reach the server (is `step35 serve` still running?).');
    }
    if (res.status !== 401 || attempt > 0) return res;
    const asked = await askForKey(apiKey() ? 'The saved API key was refused: enter the right one.'
                                           : 'This server needs an API key.');
    if (!asked) return res;
  }
}

export async function getJson(path) {
  const res = await apiFetch(path);
  if (!res.ok) throw await errorOf(res);
  return res.json();
}

// Calls onEvent(parsedJson) for every `data:` line of an event stream until [DONE] or the
// end of the body. onChunk(time) is called when bytes arrive, before their events.
export async function readEvents(res, onEvent, onChunk) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (onChunk) onChunk(performance.now());
    buffer += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, nl).replace(/\r$/, '');
      buffer = buffer.slice(nl + 1);
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') return true;
      if (data) onEvent(JSON.parse(data));
    }
  }
  return false;
}

export function downloadBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
