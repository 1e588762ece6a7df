// The official `openai` npm client against `step35 serve`: chat (plain, streamed, tools,
// streamed tool calls, json_schema), the Responses API (plain, streamed, function tools,
// previous_response_id), completions, models, errors as the client's exception classes,
// the step35 execute endpoint, and a clean SIGTERM exit. Starts the server itself
// (serve.mjs), which kills it on every path.
// usage: node openai_client.test.mjs STEP35_BINARY MODEL.gguf
import assert from 'node:assert/strict';

import { startServer } from './serve.mjs';

const [binary, model] = process.argv.slice(2);
let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch {
  console.log('SKIP: tests/node/node_modules is missing (run scripts/install-deps.sh, which runs npm ci there)');
  process.exit(77);
}

const { base, terminate } = await startServer(binary, model, ['-t', '1', '--api-key', 'node-key']);

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'node-key', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Hello there' }];

// Models.
const models = await client.models.list();
assert.equal(models.data.length, 1);

// Chat, greedy, then the same streamed: same text, usage in the last chunk.
const chat = await client.chat.completions.create({ model: 'm', messages, temperature: 0, max_tokens: 16 });
assert.equal(chat.choices[0].finish_reason, 'length');
assert.equal(chat.usage.completion_tokens, 16);
const stream = await client.chat.completions.create({
  model: 'm', messages, temperature: 0, max_tokens: 16, stream: true, stream_options: { include_usage: true },
});
let text = '';
let usage = null;
for await (const chunk of stream) {
  for (const c of chunk.choices) text += c.delta.content ?? '';
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(text, chat.choices[0].message.content);
assert.equal(usage.completion_tokens, 16);

// Forced tool call: parsed arguments with the declared types.
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] },
                                                days: { type: 'integer', minimum: 1, maximum: 9 } },
                  required: ['city', 'days'] },
  },
}];
const called = await client.chat.completions.create({
  model: 'm', messages, temperature: 0, max_tokens: 200, tools, tool_choice: 'required',
});
const call = called.choices[0].message.tool_calls[0];
assert.equal(call.function.name, 'get_weather');
const args = JSON.parse(call.function.arguments);
assert.ok(['Paris', 'Oslo'].includes(args.city));
assert.ok(Number.isInteger(args.days));

// json_schema: the content parses and has the required members.
const structured = await client.chat.completions.create({
  model: 'm', messages, temperature: 0, max_tokens: 1000,
  response_format: { type: 'json_schema', json_schema: { name: 'a', schema: {
    type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false } } },
});
assert.equal(typeof JSON.parse(structured.choices[0].message.content).ok, 'boolean');

// Completions.
const completion = await client.completions.create({ model: 'm', prompt: 'Once upon', max_tokens: 5, temperature: 0 });
assert.equal(completion.usage.completion_tokens, 5);

// The step35 execute endpoint through the client's generic POST.
const executed = await client.post('/step35/execute', {
  body: { messages, max_tokens: 4, routing_hint: 'low_latency', expert_policy: 'adaptive' },
});
assert.equal(executed.step35.expert_policy_applied, 'adaptive');

// Errors as the client's exception classes.
await assert.rejects(client.chat.completions.create({ model: 'm', messages, temperature: 'hot' }),
                     (e) => e instanceof OpenAI.BadRequestError);
const anonymous = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
await assert.rejects(anonymous.models.list(), (e) => e instanceof OpenAI.AuthenticationError);

// A streamed forced tool call: the arguments arrive in several deltas that add up to the
// same call, and the SDK's stream helper assembles it.
const toolStream = await client.chat.completions.create({
  model: 'm', messages, temperature: 0, max_tokens: 200, tools, tool_choice: 'required', stream: true,
});
const argumentDeltas = [];
let streamedName = null;
for await (const chunk of toolStream) {
  for (const c of chunk.choices) {
    for (const tc of c.delta.tool_calls ?? []) {
      if (tc.function?.name) streamedName = tc.function.name;
      if (tc.function?.arguments) argumentDeltas.push(tc.function.arguments);
    }
  }
}
assert.equal(streamedName, 'get_weather');
assert.ok(argumentDeltas.length >= 3, `arguments in ${argumentDeltas.length} deltas`);
assert.deepEqual(JSON.parse(argumentDeltas.join('')), args);
const helper = client.chat.completions.stream({
  model: 'm', messages, temperature: 0, max_tokens: 200, tools, tool_choice: 'required',
});
const assembled = await helper.finalChatCompletion();
assert.deepEqual(JSON.parse(assembled.choices[0].message.tool_calls[0].function.arguments), args);

// The Responses API: plain (the same greedy text as chat), streamed (events through the
// SDK's helper and raw), function tools, and a function result sent back by
// previous_response_id.
const response = await client.responses.create({ model: 'm', input: 'Hello there', max_output_tokens: 16, temperature: 0 });
assert.equal(response.object, 'response');
assert.equal(response.status, 'incomplete');
assert.equal(response.output_text, chat.choices[0].message.content);
assert.equal(response.usage.output_tokens, 16);
const responseStream = client.responses.stream({ model: 'm', input: 'Hello there', max_output_tokens: 16, temperature: 0 });
let responseDeltas = '';
responseStream.on('response.output_text.delta', (e) => { responseDeltas += e.delta; });
let incomplete = null;
responseStream.on('response.incomplete', (e) => { incomplete = e.response; });
const finalResponse = await responseStream.finalResponse();
assert.equal(responseDeltas, response.output_text);
assert.equal(finalResponse.output.at(-1).content[0].text, response.output_text);  // assembled from the deltas
assert.equal(incomplete.incomplete_details.reason, 'max_output_tokens');
const rawEvents = await client.responses.create({ model: 'm', input: 'Hello there', max_output_tokens: 4, temperature: 0, stream: true });
const eventTypes = [];
for await (const e of rawEvents) eventTypes.push(e.type);
assert.equal(eventTypes[0], 'response.created');
assert.equal(eventTypes.at(-1), 'response.incomplete');
const responseTools = [{ type: 'function', name: 'get_weather', parameters: tools[0].function.parameters, strict: false }];
const functionResponse = await client.responses.create({
  model: 'm', input: 'weather?', tools: responseTools, tool_choice: 'required', temperature: 0, max_output_tokens: 200,
});
const functionCall = functionResponse.output.find((o) => o.type === 'function_call');
assert.equal(functionCall.name, 'get_weather');
assert.deepEqual(JSON.parse(functionCall.arguments), args);
const functionStream = client.responses.stream({
  model: 'm', input: 'weather?', tools: responseTools, tool_choice: 'required', temperature: 0, max_output_tokens: 200,
});
let functionDeltas = 0;
functionStream.on('response.function_call_arguments.delta', () => { ++functionDeltas; });
const streamedFunction = (await functionStream.finalResponse()).output.find((o) => o.type === 'function_call');
assert.ok(functionDeltas >= 3, `arguments in ${functionDeltas} deltas`);
assert.equal(streamedFunction.arguments, functionCall.arguments);
const followUp = await client.responses.create({
  model: 'm', previous_response_id: functionResponse.id, tools: responseTools, max_output_tokens: 4,
  input: [{ type: 'function_call_output', call_id: functionCall.call_id, output: 'sunny' }],
});
assert.ok(followUp.usage.input_tokens > functionResponse.usage.input_tokens);  // the stored turn and the result
const retrieved = await client.responses.retrieve(functionResponse.id);
assert.equal(retrieved.id, functionResponse.id);

// SIGTERM: exit status 0.
assert.deepEqual(await terminate(), { code: 0, signal: null });
console.log('openai client test: all checks passed');
