// The official `@anthropic-ai/sdk` npm client against `step35 serve`: messages (plain and
// streamed through the SDK's MessageStream), countTokens, an assistant prefill, forced
// tool use (input streamed as input_json deltas), errors as the client's exception
// classes, and a clean SIGTERM exit. Starts the server itself
// (serve.mjs), which kills it on every path.
// usage: node anthropic_client.test.mjs STEP35_BINARY MODEL.gguf
import assert from 'node:assert/strict';

import { startServer } from './serve.mjs';

const [binary, model] = process.argv.slice(2);
let Anthropic;
try {
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
} catch {
  console.log('SKIP: tests/node/node_modules is missing (run scripts/install-deps.sh, which runs npm ci there)');
  process.exit(77);
}

const { base, terminate } = await startServer(binary, model, ['-t', '1', '--api-key', 'node-key']);

const client = new Anthropic({ baseURL: base, apiKey: 'node-key', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Hello there' }];
const request = { model: 'm', max_tokens: 12, temperature: 0, system: 'be brief', messages };

// Plain, then the same streamed through the SDK's helper: same text, same usage.
const message = await client.messages.create(request);
assert.equal(message.type, 'message');
assert.equal(message.role, 'assistant');
assert.equal(message.stop_reason, 'max_tokens');
assert.equal(message.usage.output_tokens, 12);
assert.equal(message.content[0].type, 'text');
const stream = client.messages.stream(request);
let streamedText = '';
stream.on('text', (t) => { streamedText += t; });
const finalMessage = await stream.finalMessage();
assert.equal(streamedText, message.content[0].text);
assert.equal(finalMessage.content[0].text, message.content[0].text);
assert.equal(finalMessage.usage.output_tokens, 12);

// countTokens: the prompt the same request runs.
const counted = await client.messages.countTokens({ model: 'm', system: 'be brief', messages });
assert.equal(counted.input_tokens, message.usage.input_tokens);

// Assistant prefill: the answer continues the given text; the prompt is the conversation
// with the assistant's turn left open (no end of turn, no new turn: what countTokens says).
const prefillMessages = [...messages, { role: 'assistant', content: 'Once upon a' }];
const prefilled = await client.messages.create({ ...request, messages: prefillMessages });
assert.equal(prefilled.content[0].type, 'text');
assert.equal(prefilled.usage.output_tokens, 12);
const prefillCount = await client.messages.countTokens({ model: 'm', system: 'be brief', messages: prefillMessages });
assert.equal(prefilled.usage.input_tokens, prefillCount.input_tokens);
assert.ok(prefilled.usage.input_tokens > message.usage.input_tokens);

// Forced tool use: a typed input; streamed, the input arrives as input_json deltas.
const toolRequest = {
  model: 'm', max_tokens: 300, temperature: 0, messages: [{ role: 'user', content: 'call it' }],
  tools: [{ name: 'count', description: 'count', input_schema: {
    type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 }, label: { type: 'string', enum: ['alpha', 'omega'] } },
    required: ['n', 'label'] } }],
  tool_choice: { type: 'any' },
};
const tooled = await client.messages.create(toolRequest);
assert.equal(tooled.stop_reason, 'tool_use');
const use = tooled.content.at(-1);
assert.equal(use.type, 'tool_use');
assert.equal(use.name, 'count');
assert.ok(Number.isInteger(use.input.n));
const toolStream = client.messages.stream(toolRequest);
let jsonDeltas = 0;
toolStream.on('inputJson', () => { ++jsonDeltas; });
const streamedUse = (await toolStream.finalMessage()).content.at(-1);
assert.ok(jsonDeltas >= 3, `input in ${jsonDeltas} deltas`);
assert.deepEqual(streamedUse.input, use.input);

// Errors as the client's exception classes.
await assert.rejects(client.messages.create({ model: 'm', max_tokens: 4, messages: [] }),
                     (e) => e instanceof Anthropic.BadRequestError);
const anonymous = new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 });
await assert.rejects(anonymous.messages.create(request), (e) => e instanceof Anthropic.AuthenticationError);

// SIGTERM: exit status 0.
assert.deepEqual(await terminate(), { code: 0, signal: null });
console.log('anthropic client test: all checks passed');
