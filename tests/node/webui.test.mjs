// The web pages of `step35 serve` in a real browser: Debian's chromium, headless, driven by
// playwright-core. The chat page (send, stream, stop, regenerate, edit and resend, reload
// and find the conversation, rename, export and import, Markdown and code blocks, model
// text with <script> that must not run, the busy / too-long / dropped-connection messages,
// the API key prompt) and the dashboard (its heat map changes while requests run, CSV
// export). No console errors, no request to another host. Writes screenshots (desktop
// 1280x800, phone 390x844) and figures.json (first paint, first-token latency) to OUT_DIR.
// With VISION_DIR (../shared/fixtures/vision), a picture attached on the chat page of a
// server with --mmproj travels to the model and its answer streams.
// usage: node webui.test.mjs STEP35_BINARY MODEL.gguf OUT_DIR [VISION_DIR]
// Exit 77 (skipped) without chromium ($STEP35_CHROMIUM or /usr/bin/chromium) or without
// node_modules (npm ci in tests/node).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { startServer } from './serve.mjs';

const [binary, model, outDir = '.', visionDir = ''] = process.argv.slice(2);
const chromiumPath = process.env.STEP35_CHROMIUM || '/usr/bin/chromium';
if (!fs.existsSync(chromiumPath)) {
  console.log(`SKIP: no chromium at ${chromiumPath} (apt-get install chromium, or set STEP35_CHROMIUM)`);
  process.exit(77);
}
let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch {
  console.log('SKIP: tests/node/node_modules is missing (run scripts/install-deps.sh, which runs npm ci there)');
  process.exit(77);
}
fs.mkdirSync(outDir, { recursive: true });

const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const figures = {};
const browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
process.on('exit', () => { try { browser.close(); } catch { /* already closed */ } });

// A page that records console errors, page errors and every request's URL; `expected`
// lists console messages a step provokes on purpose (the browser logs each 4xx/5xx answer).
async function openPage(base, viewport = DESKTOP) {
  const context = await browser.newContext({ viewport, acceptDownloads: true });
  const page = await context.newPage();
  const problems = [];
  const expected = [];
  page.on('console', (m) => {
    if (m.type() !== 'error' && m.type() !== 'warning') return;
    if (expected.some((re) => re.test(m.text()))) return;
    problems.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('request', (r) => {
    const url = r.url();
    if (!url.startsWith(`${base}/`) && !url.startsWith('data:') && !url.startsWith('blob:'))
      problems.push(`request to another host: ${url}`);
  });
  return {
    page, context, expected,
    check(what) { assert.deepEqual(problems, [], `${what}: ${problems.join('\n')}`); },
  };
}

async function send(page, text) {
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
}

// Waits for the last answer to end (its statistics line written, the Stop button gone).
async function answerDone(page) {
  await page.waitForSelector('#stop.hidden', { state: 'attached', timeout: 60000 });
  return page.locator('#messages .msg.assistant').last();
}

function gbnfLiteral(text) {
  return `root ::= "${text.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')}"`;
}

async function setExtra(page, extra) {
  await page.click('#settings-button');
  await page.fill('#set-extra', JSON.stringify(extra));
  await page.dispatchEvent('#set-extra', 'change');
  await page.click('#settings-close');
}

// ------------------------------------------------------------------ the chat page

const main = await startServer(binary, model, ['-t', '1', '--parallel', '4', '-c', '2048']);
{
  const { page, context, check, expected } = await openPage(main.base);
  // First paint of /: the first load in a fresh browser (which also starts the renderer
  // process) is reported; the bound holds for the median of three loads after it.
  const paints = [];
  for (let i = 0; i < 4; ++i) {
    await page.goto(`${main.base}/`);
    await page.waitForFunction(() => document.getElementById('model-name').textContent !== '');
    paints.push(await page.evaluate(() => {
      const entries = performance.getEntriesByType('paint');
      const fp = entries.find((e) => e.name === 'first-paint') || entries.find((e) => e.name === 'first-contentful-paint');
      return fp ? fp.startTime : null;
    }));
  }
  assert.ok(paints.every((p) => p !== null), 'no paint timing entries');
  const warm = paints.slice(1).sort((a, b) => a - b);
  figures.first_paint_cold_ms = Math.round(paints[0]);
  figures.first_paint_ms = Math.round(warm[1]);
  // The targets (first paint <= 300 ms, first token shown <= 50 ms after it arrived) are
  // speeds: measured on a quiet machine with STEP35_WEBUI_STRICT=1 (docs/webui.md). The
  // suite, which also runs on a loaded machine (ctest -j2 beside other work), only checks
  // bounds that no healthy page misses and writes the figures to figures.json.
  const strict = process.env.STEP35_WEBUI_STRICT === '1';
  const paintBound = strict ? 300 : 3000;
  assert.ok(warm[1] <= paintBound, `first paint ${warm[1]} ms (median of ${warm.join(', ')}), bound ${paintBound}`);

  // The conversation's settings: short answers (the tiny model rarely ends by itself).
  await page.click('#settings-button');
  await page.fill('#set-max_tokens', '48');
  await page.dispatchEvent('#set-max_tokens', 'change');
  await page.fill('#set-system', 'You are a test.');
  await page.dispatchEvent('#set-system', 'change');
  await page.click('#settings-close');

  // Send with Enter; the answer streams; statistics follow.
  await send(page, 'Hello there');
  let answer = await answerDone(page);
  assert.ok((await answer.locator('.body').innerText()).trim().length > 0, 'empty answer');
  const firstStats = await answer.locator('.stats').innerText();
  assert.match(firstStats, /tokens.*tokens\/s.*context \d+ \/ 2048/);
  assert.ok(Number(firstStats.match(/^(\d+) tokens/)[1]) <= 48, `max_tokens setting not applied: ${firstStats}`);
  const latency = await page.evaluate(() => {
    const a = performance.getEntriesByName('step35-first-token-arrived')[0];
    const s = performance.getEntriesByName('step35-first-token-shown')[0];
    return a && s ? s.startTime - a.startTime : null;
  });
  figures.first_token_arrival_to_dom_ms = latency;
  const tokenBound = strict ? 50 : 1000;
  assert.ok(latency !== null && latency <= tokenBound, `first token shown ${latency} ms after it arrived, bound ${tokenBound}`);

  // Shift+Enter is a new line, not a send.
  await page.fill('#input', 'line one');
  await page.press('#input', 'Shift+Enter');
  await page.type('#input', 'line two');
  assert.equal(await page.inputValue('#input'), 'line one\nline two');
  assert.equal(await page.locator('#messages .msg').count(), 2);
  await page.fill('#input', '');

  // Regenerate replaces the last answer.
  await page.click('#messages .msg.assistant .regenerate');
  answer = await answerDone(page);
  assert.equal(await page.locator('#messages .msg').count(), 2);

  // Edit and resend: the edited message replaces the first one and gets a new answer.
  await page.click('#messages .msg.user .edit');
  await page.fill('.edit-box textarea', 'Hello again');
  await page.click('.edit-box .save-edit');
  await answerDone(page);
  assert.equal(await page.locator('#messages .msg').count(), 2);
  assert.equal(await page.locator('#messages .msg.user .body').innerText(), 'Hello again');

  // Markdown, a code block with a copy button, and model text that carries markup: forced
  // with a grammar (the page's "extra request fields" setting) so the tiny model writes it.
  const forced = '# Heading\nSome **bold** and *italic* and `inline code`.\n\n' +
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">\n\n' +
    '- first\n- second\n\n```js\nlet x = 1;\n```\n[safe](https://example.com/) [bad](javascript:alert(1))\n';
  await setExtra(page, { grammar: gbnfLiteral(forced), max_tokens: 400, temperature: 0 });
  await send(page, 'Show me Markdown');
  answer = await answerDone(page);
  const md = answer.locator('.md');
  assert.equal(await md.locator('h1').innerText(), 'Heading');
  assert.equal(await md.locator('strong').first().innerText(), 'bold');
  assert.equal(await md.locator('em').first().innerText(), 'italic');
  assert.equal(await md.locator('p > code').first().innerText(), 'inline code');
  assert.equal(await md.locator('ul > li').count(), 2);
  assert.equal(await md.locator('.code pre code').innerText(), 'let x = 1;');
  assert.equal(await md.locator('.code .copy').count(), 1);
  assert.equal(await md.locator('a').count(), 1);
  assert.equal(await md.locator('a').getAttribute('href'), 'https://example.com/');
  assert.match(await md.innerText(), /<script>window.__pwned = 1<\/script><img src=x onerror=/);
  assert.equal(await page.locator('#messages script, #messages img').count(), 0);
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: main.base });
  await md.locator('.code .copy').click();
  await page.waitForFunction(() => document.querySelector('.md .code .copy').dataset.copied === '1');
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), 'let x = 1;');
  await setExtra(page, {});
  await page.screenshot({ path: path.join(outDir, 'chat-desktop.png') });

  // The prompt is too long: the server's 400 message is shown.
  expected.push(/status of 400/);
  await send(page, 'word '.repeat(3000));
  await page.waitForSelector('#notice:not(.hidden)');
  const tooLong = await page.locator('#notice').innerText();
  assert.match(tooLong, /refused the request: .*(context|too long|tokens)/i, tooLong);

  // Rename, then reload: the conversation is still there, with its messages.
  const title = 'Web UI test chat';
  await page.click('#conversations li.current .rename');
  await page.fill('#conversations li input', title);
  await page.press('#conversations li input', 'Enter');
  const before = await page.locator('#messages .msg').count();
  await page.reload();
  await page.waitForSelector('#conversations li.current');
  assert.equal(await page.locator('#conversations li.current .title').innerText(), title);
  assert.equal(await page.locator('#messages .msg').count(), before);

  // Export, delete, import: the conversation comes back.
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export')]);
  const exported = path.join(outDir, 'conversations.json');
  await download.saveAs(exported);
  assert.equal(JSON.parse(fs.readFileSync(exported, 'utf8')).conversations[0].title, title);
  await page.click('#conversations li.current .delete');
  await page.click('#conversations li.current .delete');
  assert.equal(await page.locator('#conversations li').count(), 0);
  await page.setInputFiles('#import', exported);
  await page.waitForSelector('#conversations li');
  assert.equal(await page.locator('#conversations li .title').first().innerText(), title);

  // A conversation with reasoning, a tool call and its result (imported): each shown as such.
  const toolConv = path.join(outDir, 'tool-conversation.json');
  fs.writeFileSync(toolConv, JSON.stringify({ conversations: [{
    id: 'tools', title: 'Tools', created: 1, updated: Date.now() + 1000, settings: {}, messages: [
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: '', reasoning: 'The user wants <b>weather</b>.', reasoning_tokens: 6,
        tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', name: 'get_weather', content: '{"temp": 3}' },
      { role: 'assistant', content: 'It is **3 °C**.' },
    ] }] }));
  await page.setInputFiles('#import', toolConv);
  await page.click('#conversations li[data-id="tools"] .title');
  const reasoning = page.locator('#messages details.reasoning');
  assert.equal(await reasoning.getAttribute('open'), null, 'reasoning is not collapsed');
  assert.equal(await reasoning.locator('summary').innerText(), 'Reasoning (6 tokens)');
  assert.equal(await reasoning.locator('.text').textContent(), 'The user wants <b>weather</b>.');
  assert.match(await page.locator('#messages .tool.call .label').innerText(), /Tool call: get_weather \(call_1\)/);
  assert.match(await page.locator('#messages .tool.call code').innerText(), /"city": "Oslo"/);
  assert.match(await page.locator('#messages .tool.result .label').innerText(), /Result of get_weather/);
  assert.equal(await page.locator('#messages b').count(), 0);

  // The Markdown renderer on hostile text: only its own tags, only http(s) links.
  const rendered = await page.evaluate(async () => {
    const { renderMarkdown } = await import('/webui/markdown.js');
    const inputs = [
      '<script>window.__pwned = 3</script>', '<img src=x onerror=window.__pwned=4>',
      '[x](javascript:window.__pwned=5) [y](data:text/html,hi) [z](  vbscript:x) <javascript:alert(1)>',
      '[**<b>bold</b>**](https://ok.example/a?b=<c>)', '```html\n<script>window.__pwned=6</script>\n```',
      '- a\n  - <i>b</i>\n- c\n\n1. one\n2. two', '> quote <iframe src="https://evil.example"></iframe>',
      '`<svg onload=window.__pwned=7>`', '_a_ *b* __c__ **d** ~~e~~ \\*f\\*', '# <h1>x</h1>\n---\n',
    ];
    const allowed = new Set(['P', 'BR', 'STRONG', 'EM', 'DEL', 'CODE', 'PRE', 'A', 'H1', 'H2', 'H3', 'H4', 'H5', 'H6',
                             'UL', 'OL', 'LI', 'BLOCKQUOTE', 'HR', 'DIV', 'SPAN', 'BUTTON']);
    const box = document.createElement('div');
    for (const t of inputs) box.append(renderMarkdown(t));
    document.body.append(box);
    const tags = [...new Set([...box.querySelectorAll('*')].map((e) => e.tagName))];
    const hrefs = [...box.querySelectorAll('a')].map((a) => a.getAttribute('href'));
    const attrs = [...box.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => a.name));
    box.remove();
    return { bad: tags.filter((t) => !allowed.has(t)), hrefs, attrs: [...new Set(attrs)], pwned: window.__pwned ?? null,
             lists: renderMarkdown('- a\n  - b\n- c').querySelectorAll('ul ul li').length };
  });
  assert.deepEqual(rendered.bad, []);
  assert.ok(rendered.hrefs.every((h) => /^https:\/\//.test(h)), rendered.hrefs.join(' '));
  assert.ok(rendered.attrs.every((a) => ['class', 'href', 'target', 'rel', 'type', 'data-lang'].includes(a)), rendered.attrs.join(' '));
  assert.equal(rendered.pwned, null);
  assert.equal(rendered.lists, 1);

  // No image button: /props says the model has no vision.
  assert.equal(await page.locator('#attach').isVisible(), false);
  check('chat page');

  // With vision (a /props answer changed in flight, as no model has it yet) the image
  // button shows and an attached image is previewed.
  const vision = await openPage(main.base);
  await vision.page.route('**/props', async (route) => {
    const res = await route.fetch();
    const props = await res.json();
    props.modalities = { ...props.modalities, vision: true };
    await route.fulfill({ response: res, json: props });
  });
  await vision.page.goto(`${main.base}/`);
  await vision.page.waitForSelector('#attach:not(.hidden)');
  const png = Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==', 'base64');
  await vision.page.setInputFiles('#image-input', { name: 'dot.png', mimeType: 'image/png', buffer: png });
  await vision.page.waitForSelector('#attachments img');
  vision.check('chat page with vision');
  await vision.context.close();

  // The phone layout.
  const phone = await openPage(main.base, PHONE);
  await phone.page.goto(`${main.base}/`);
  await phone.page.waitForFunction(() => document.getElementById('model-name').textContent !== '');
  await send(phone.page, 'Hi from a phone');
  await answerDone(phone.page);
  await phone.page.screenshot({ path: path.join(outDir, 'chat-phone.png') });
  phone.check('chat page on a phone');
  await phone.context.close();
  await context.close();
}

// ------------------------------------------------------------------ the dashboard

{
  const { page, context, check } = await openPage(main.base);
  await page.goto(`${main.base}/dashboard`);
  await page.waitForFunction(() => document.getElementById('heat').dataset.total !== undefined);
  await page.selectOption('#window', '10');
  const heatBefore = await page.evaluate(() => document.getElementById('heat').toDataURL());
  const body = JSON.stringify({ messages: [{ role: 'user', content: 'Count the experts' }], max_tokens: 64 });
  const load = Array.from({ length: 4 }, () =>
    fetch(`${main.base}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body }));
  await page.waitForFunction(() => Number(document.getElementById('heat').dataset.total) > 0, null, { timeout: 30000 });
  await Promise.all(load);
  await page.waitForTimeout(1200);
  const heatAfter = await page.evaluate(() => document.getElementById('heat').toDataURL());
  assert.notEqual(heatAfter, heatBefore, 'the heat map did not change');
  assert.match(await page.locator('.card[data-key="Generation"] .s').innerText(), /\d+ tokens/);
  const [csv] = await Promise.all([page.waitForEvent('download'), page.click('#export-csv')]);
  const csvPath = path.join(outDir, 'expert-load.csv');
  await csv.saveAs(csvPath);
  const lines = fs.readFileSync(csvPath, 'utf8').trim().split('\n');
  assert.match(lines[0], /^layer,expert_0,expert_1/);
  assert.ok(lines.length >= 2);
  const [png] = await Promise.all([page.waitForEvent('download'), page.click('#export-png')]);
  assert.match(png.suggestedFilename(), /\.png$/);
  await page.click('#pause');
  assert.equal(await page.locator('#pause').innerText(), 'Resume');
  await page.screenshot({ path: path.join(outDir, 'dashboard-desktop.png'), fullPage: true });
  check('dashboard');
  const phone = await openPage(main.base, PHONE);
  await phone.page.goto(`${main.base}/dashboard`);
  await phone.page.waitForFunction(() => document.getElementById('heat').dataset.total !== undefined);
  await phone.page.screenshot({ path: path.join(outDir, 'dashboard-phone.png'), fullPage: true });
  phone.check('dashboard on a phone');
  await phone.context.close();
  await context.close();
}
await main.terminate();

// ------------------------------------------------------------------ the API key prompt

const keyed = await startServer(binary, model, ['-t', '1', '--api-key', 'browser-key']);
{
  const { page, context, check, expected } = await openPage(keyed.base);
  expected.push(/status of 401/);
  await page.goto(`${keyed.base}/`);
  await page.waitForSelector('#key-dialog[open]');
  await page.fill('#key-input', 'browser-key');
  await page.click('#key-save');
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '');
  await send(page, 'Hello with a key');
  const answer = await answerDone(page);
  assert.ok((await answer.locator('.stats').innerText()).length > 0);
  assert.equal(await page.evaluate(() => localStorage.getItem('step35.apiKey')), 'browser-key');
  await page.goto(`${keyed.base}/dashboard`);
  await page.waitForFunction(() => document.getElementById('heat').dataset.total !== undefined);
  assert.equal(await page.locator('#key-dialog[open]').count(), 0);
  check('key prompt');
  await context.close();
  // Without a key, cancelling the prompt stops the dashboard's polling (no prompt every second).
  const nokey = await openPage(keyed.base);
  nokey.expected.push(/status of 401/);
  await nokey.page.goto(`${keyed.base}/dashboard`);
  await nokey.page.waitForSelector('#key-dialog[open]');
  await nokey.page.click('#key-cancel');
  await nokey.page.waitForFunction(() => /API key is needed/.test(document.getElementById('status').textContent));
  await nokey.page.waitForTimeout(2500);
  assert.equal(await nokey.page.locator('#key-dialog[open]').count(), 0);
  assert.equal(await nokey.page.locator('#pause').innerText(), 'Resume');
  nokey.check('dashboard without a key');
  await nokey.context.close();
}
await keyed.terminate();

// ------------------------------------------------------------------ busy, then a dropped connection

// This server takes at least 5 ms per forward pass (a test seam), so answers stream for
// long enough to be stopped, to hold the only slot, and to be cut off.
process.env.STEP35_TEST_STEP_DELAY_MS = '5';
const busy = await startServer(binary, model, ['-t', '1', '--parallel', '1', '--max-queue', '0', '-c', '4096']);
delete process.env.STEP35_TEST_STEP_DELAY_MS;
{
  const { page, context, check, expected } = await openPage(busy.base);
  expected.push(/status of 503/, /ERR_INCOMPLETE_CHUNKED_ENCODING|ERR_CONNECTION|ERR_EMPTY_RESPONSE/);
  await page.goto(`${busy.base}/`);
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '');
  const running = () => page.evaluate(async () => (await (await fetch('/v1/step35/dashboard')).json()).requests.running);

  // Stop: a long answer (ignore_eos), stopped with Esc; the partial answer stays, and the
  // server cancels the request.
  await setExtra(page, { ignore_eos: true, max_tokens: 3000 });
  await send(page, 'Tell me a long story');
  await page.waitForFunction(() => {
    const last = document.querySelector('#messages .msg:last-child');
    return last && last.matches('.assistant') && last.querySelector('.md')?.textContent.length > 20;
  });
  await page.keyboard.press('Escape');
  let stopped = await answerDone(page);
  assert.match(await stopped.locator('.status').innerText(), /Stopped/);
  for (let i = 0; (await running()) !== 0; ++i) {
    assert.ok(i < 100, 'the stopped request still runs on the server');
    await page.waitForTimeout(50);
  }
  // Hold the only slot with a long streamed request.
  const hold = new AbortController();
  const held = await fetch(`${busy.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: hold.signal,
    body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }], stream: true, ignore_eos: true, max_tokens: 4000 }),
  });
  const reader = held.body.getReader();
  await reader.read();
  await send(page, 'Are you busy?');
  await page.waitForSelector('#notice:not(.hidden)');
  assert.match(await page.locator('#notice').innerText(), /busy/i);
  hold.abort();
  await reader.cancel().catch(() => {});
  // The connection drops mid-answer: the server is killed while it streams.
  for (let i = 0; (await running()) !== 0; ++i) {
    assert.ok(i < 100, 'the held request still runs on the server');
    await page.waitForTimeout(50);
  }
  await page.click('#messages .msg.user:last-child .retry');  // "Send again" after the 503
  await page.waitForFunction(() => {
    const last = document.querySelector('#messages .msg:last-child');
    return last && last.matches('.assistant') && last.querySelector('.md')?.textContent.length > 10;
  });
  busy.kill();
  const answer = await answerDone(page);
  assert.match(await answer.locator('.status').innerText(), /connection dropped/i);
  assert.match(await page.locator('#notice').innerText(), /connection/i);
  check('busy and dropped connection');
  await context.close();
}
await busy.terminate();

// ------------------------------------------------------------------ a picture (--mmproj)

if (visionDir) {
  const vision = await startServer(binary, `${visionDir}/models/tiny-v-f32.gguf`,
    ['-t', '1', '-c', '2048', '--mmproj', `${visionDir}/models/mmproj-tiny-v-f32.gguf`]);
  const { page, context, check } = await openPage(vision.base);
  await page.goto(`${vision.base}/`);
  // The image button shows because /props says the server reads pictures.
  await page.waitForSelector('#attach:not(.hidden)');
  await setExtra(page, { temperature: 0, max_tokens: 12 });
  const file = `${visionDir}/images/square-300.png`;
  await page.setInputFiles('#image-input', file);
  await page.waitForSelector('#attachments:not(.hidden) img');
  const sent = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
  await send(page, 'What is in this picture?');
  const body = JSON.parse((await sent).postData());
  const parts = body.messages.findLast((m) => m.role === 'user').content;
  const picture = parts.find((p) => p.type === 'image_url');
  assert.equal(picture.image_url.url, `data:image/png;base64,${fs.readFileSync(file).toString('base64')}`);
  const answer = await answerDone(page);
  assert.ok((await answer.locator('.body').innerText()).trim().length > 0, 'empty answer about the picture');
  // The picture's 100 positions are in the context the statistics line reports.
  const used = Number((await answer.locator('.stats').innerText()).match(/context (\d+) \//)[1]);
  assert.ok(used > 100, `context ${used}: the picture did not reach the model`);
  assert.equal(await page.locator('#messages .msg.user img.attached').count(), 1);
  await page.screenshot({ path: path.join(outDir, 'chat-picture.png') });
  // The server took the picture through its tower.
  const metrics = await (await fetch(`${vision.base}/metrics`)).text();
  assert.match(metrics, /^step35_images_total 1$/m);
  check('a picture');
  await context.close();
  await vision.terminate();
}

await browser.close();
fs.writeFileSync(path.join(outDir, 'figures.json'), `${JSON.stringify(figures, null, 2)}\n`);
console.log('figures:', JSON.stringify(figures));
console.log('OK: web pages in chromium');
