// A chat request turned into engine terms: the rendered prompt's tokens, sampling,
// constraint (response_format / grammar / forced tool calls / a reasoning budget), stop
// strings and output options. Shared by /v1/chat/completions, /v1/step35/execute,
// /v1/messages and /v1/responses (which map their bodies to the OpenAI chat shape first).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "engine/engine.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"

namespace step35::server {

// What the OpenAI endpoints share: the engine request and how the answer is shaped
// (`n` choices, streaming, usage in the stream, stop strings, the model name echoed).
struct ResponsePlan {
  GenerateRequest request;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::string> stops;
  std::string model;
};

// Reads `model`, `n`, `stream`, `stream_options` and `stop` (ApiError 400 naming the field).
void read_response_fields(ServerContext& ctx, Fields& f, ResponsePlan& plan);

struct ChatPlan : ResponsePlan {
  bool logprobs = false;
  bool in_reasoning = false;       // the prompt opened a think block
  int32_t reasoning_budget = -1;   // as applied: -1 unbounded, 0 no reasoning, else tokens
  nlohmann::json tools;            // declared tools (null: none, or tool_choice "none")
  bool single_tool_call = false;   // parallel_tool_calls: false
  bool legacy_functions = false;   // the request used `functions`: answer with function_call
  std::string prompt_text;         // the rendered prompt (what /apply-template returns)
  // How choice `index`'s text is assembled (tool-call ids start with `id_prefix`).
  ChoiceTextOptions text_options(const std::string& id_prefix, int index) const;
};

// The rendering step, the one place a chat becomes prompt text: the OpenAI-shaped messages
// and tools (in the client's key order) with the template's options (chat_template_kwargs,
// add_generation_prompt, continue_final_message) -> the text the model's Jinja template
// renders, and whether it leaves a think block open (the answer then starts as reasoning).
// Every chat-shaped endpoint renders through it. Bad messages and template errors throw
// std::invalid_argument.
struct RenderedChat {
  std::string text;
  bool opens_reasoning = false;
};
RenderedChat render_chat(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                         const nlohmann::ordered_json& tools, const ChatRenderOptions& options);

// Validates an OpenAI chat body (ApiError 400 naming the field) and plans it.
// `ordered_body`, when given, is the same body in the client's key order: its messages
// and tools are what the chat template renders (tool definitions and arguments keep that
// order); without it they are rendered from `body`, keys sorted. `text_only`: only
// prompt_text is wanted (/apply-template): pictures are checked and decoded but not
// encoded, and request.prompt is left empty when there are any.
ChatPlan plan_chat(ServerContext& ctx, const nlohmann::json& body, const nlohmann::ordered_json* ordered_body = nullptr,
                   bool text_only = false);

// The validation and planning step of the other endpoints, split from their handlers so
// each can be tested and fuzzed on its own (fuzz/fuzz_server_requests.cpp): every one
// either returns a plan within the server's limits or throws ApiError.

// POST /v1/completions.
struct CompletionsPlan : ResponsePlan {
  bool echo = false;
  int best_of = 1;  // choices generated; the n with the highest log-probability are returned
};
CompletionsPlan plan_completions(ServerContext& ctx, const nlohmann::json& body);

// POST /v1/messages: the Anthropic body in the OpenAI chat shape (then planned by
// plan_chat). `counting`: /v1/messages/count_tokens (no max_tokens needed).
nlohmann::json anthropic_to_openai(const nlohmann::json& body, bool counting = false);
// The converted body's messages and tools in the client's key order, taken from the
// Anthropic body as sent (`anthropic`, ordered): each tool's input_schema and each
// tool_use block's input.
nlohmann::ordered_json anthropic_ordered_chat(const nlohmann::json& chat, const nlohmann::ordered_json& anthropic);

// POST /v1/responses: the body in the OpenAI chat shape, with what the response needs to
// echo and store.
struct ResponsesRequest {
  nlohmann::json chat;             // the chat completions body
  nlohmann::json new_messages;     // this turn's input as chat messages (stored)
  std::string previous_id;
  bool store = true;
  nlohmann::json echo;             // request fields the response object repeats
};
ResponsesRequest responses_to_openai(ServerContext& ctx, const nlohmann::json& body);

// POST /v1/step35/execute: reads and removes the three step35 fields; the rest of the body
// is a chat request.
ExecuteOptions take_execute_options(ServerContext& ctx, nlohmann::json& body);

// POST /tokenize and /detokenize: the whole answer.
nlohmann::json tokenize_response(const ServerContext& ctx, const nlohmann::json& body);
nlohmann::json detokenize_response(const ServerContext& ctx, const nlohmann::json& body);

}  // namespace step35::server
