// Pictures through the official clients against `step35 serve --mmproj`: the `openai`
// client's chat image_url part and Responses input_image part, and `@anthropic-ai/sdk`'s
// base64 image block, each give llama.cpp's answer for the square-png golden of
// ../shared/fixtures/vision (132 prompt positions, the 16 greedy tokens), streamed and not;
// a picture sent to a server without --mmproj is the client's BadRequestError.
// usage: node vision_clients.test.mjs STEP35_BINARY VISION_FIXTURES_DIR
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { startServer } from './serve.mjs';

const [binary, dir] = process.argv.slice(2);
let OpenAI, Anthropic;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
} catch {
  console.log('SKIP: tests/node/node_modules is missing (run scripts/install-deps.sh, which runs npm ci there)');
  process.exit(77);
}

const golden = JSON.parse(readFileSync(`${dir}/golden/tiny-v.square-png.json`, 'utf8'));
const png = readFileSync(`${dir}/images/square-300.png`).toString('base64');
const dataUrl = `data:image/png;base64,${png}`;
const model = `${dir}/models/tiny-v-f32.gguf`;
const { base, terminate } = await startServer(binary, model, [
  '--mmproj', `${dir}/models/mmproj-tiny-v-f32.gguf`, '-t', '1', '--exact', '-ctk', 'f32', '-ctv', 'f32', '-c', '1024',
]);

// The golden's answer as text (none of its greedy tokens is a control token).
const want = (await (await fetch(`${base}/detokenize`, {
  method: 'POST', body: JSON.stringify({ tokens: golden.greedy }),
})).json()).content;
assert.equal(golden.n_positions, 132);

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
const chatRequest = {
  model: 'm', temperature: 0, max_tokens: 16,
  messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: dataUrl, detail: 'auto' } },
    { type: 'text', text: '\nDescribe this.' },
  ] }],
};
const chat = await openai.chat.completions.create(chatRequest);
assert.equal(chat.usage.prompt_tokens, golden.n_positions);
assert.equal(chat.choices[0].message.content, want);
let streamed = '';
for await (const chunk of await openai.chat.completions.create({ ...chatRequest, stream: true }))
  for (const c of chunk.choices) streamed += c.delta.content ?? '';
assert.equal(streamed, want);

const response = await openai.responses.create({
  model: 'm', temperature: 0, max_output_tokens: 16, store: false,
  input: [{ role: 'user', content: [
    { type: 'input_image', image_url: dataUrl, detail: 'auto' },
    { type: 'input_text', text: '\nDescribe this.' },
  ] }],
});
assert.equal(response.usage.input_tokens, golden.n_positions);
assert.equal(response.output_text, want);

const anthropic = new Anthropic({ baseURL: base, apiKey: 'none', maxRetries: 0 });
const messageRequest = {
  model: 'm', max_tokens: 16, temperature: 0,
  messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } },
    { type: 'text', text: '\nDescribe this.' },
  ] }],
};
const message = await anthropic.messages.create(messageRequest);
assert.equal(message.usage.input_tokens, golden.n_positions);
assert.equal(message.content[0].text, want);
const final = await anthropic.messages.stream(messageRequest).finalMessage();
assert.equal(final.content[0].text, want);
const counted = await anthropic.messages.countTokens({ model: 'm', messages: messageRequest.messages });
assert.equal(counted.input_tokens, golden.n_positions);

// A picture the server cannot read: the clients' 400 class, naming the part.
await assert.rejects(
  openai.chat.completions.create({ ...chatRequest, messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } }] }] }),
  (e) => e instanceof OpenAI.BadRequestError && /--allow-image-urls/.test(e.message));
const ended = await terminate();
assert.deepEqual(ended, { code: 0, signal: null });

const textOnly = await startServer(binary, model, ['-t', '1']);
const plain = new OpenAI({ baseURL: `${textOnly.base}/v1`, apiKey: 'none', maxRetries: 0 });
await assert.rejects(plain.chat.completions.create(chatRequest),
  (e) => e instanceof OpenAI.BadRequestError && /--mmproj/.test(e.message));
await assert.rejects(new Anthropic({ baseURL: textOnly.base, apiKey: 'none', maxRetries: 0 }).messages.create(messageRequest),
  (e) => e instanceof Anthropic.BadRequestError && /--mmproj/.test(e.message));
assert.deepEqual(await textOnly.terminate(), { code: 0, signal: null });
console.log('vision clients: ok');
