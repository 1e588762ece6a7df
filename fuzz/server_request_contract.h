// The contract fuzz/fuzz_server_requests.cpp checks, shared with the regression replay in
// tests/test_regressions.cpp: a request body for one of the model endpoints of `step35
// serve`, through the same validation and planning code the HTTP handlers run
// (src/server/chat_plan.h), against a real fixture model's tokenizer and chat template.
//
// Input: byte 0 picks the endpoint (mod 8: chat, completions, messages, execute, tokenize,
// detokenize, responses, messages/count_tokens), the rest is the body. A bad body must be refused with ApiError (a 4xx
// naming the problem) and nothing else; an accepted one must yield a plan inside the
// server's limits (token ids in the vocabulary, max_tokens within the context, n within
// --max-n, a non-empty chat prompt). Any other exception escapes to the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "model/step35.h"
#include "engine/engine.h"
#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "chat/chat_template.h"

namespace step35::fuzzing {

constexpr int32_t kRequestContext = 256;

// Built once and never freed (reachable from a static, so the leak checker ignores it):
// the engine's scheduler thread idles; planning never submits anything.
inline server::ServerContext& request_context(const std::string& fixtures_dir) {
  static server::ServerContext* ctx = [&] {
    auto* c = new server::ServerContext;
    c->options.model_id = "fuzz";
    c->options.max_n = 4;
    c->model = Model::load(fixtures_dir + "/models/tiny-a-q4_k_m.gguf", Model::LoadOptions{});
    const Tokenizer& tok = c->model->tokenizer();
    c->chat_template = std::make_unique<ChatTemplate>(c->model->file().opt_str("tokenizer.chat_template").value_or(""),
                                                      tok.bos() >= 0 ? tok.token_to_piece(tok.bos()) : "");
    c->think_end = tok.find_token("</think>");
    EngineOptions eo;
    eo.n_ctx = kRequestContext;
    eo.n_parallel = 1;
    eo.n_threads = 1;
    c->engine = make_engine(*c->model, eo);
    c->ready = true;
    return c;
  }();
  return *ctx;
}

// "" when the contract holds, else what broke.
inline std::string check_request_plan(const server::ServerContext& ctx, const GenerateRequest& r, int n, bool chat) {
  const int64_t vocab = int64_t(ctx.tokenizer().n_vocab());
  if (chat && r.prompt.empty()) return "an accepted chat request has no prompt";
  for (int32_t t : r.prompt)
    if (t < 0 || t >= vocab) return "a prompt token id outside the vocabulary";
  if (r.max_tokens > kRequestContext || (!chat && r.max_tokens < 0)) return "max_tokens outside [0, context]";
  if (n < 1 || n > ctx.options.max_n) return "n outside [1, --max-n]";
  if (r.n_top_logprobs < 0 || r.n_top_logprobs > 20) return "top_logprobs outside [0, 20]";
  return "";
}

inline std::string check_server_request(server::ServerContext& ctx, const uint8_t* data, size_t size) {
  using nlohmann::json;
  using namespace step35::server;
  if (size < 1) return "";
  const int endpoint = data[0] % 8;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    json body = parse_body(text);
    switch (endpoint) {
      case 0: {
        const ChatPlan p = plan_chat(ctx, body);
        return check_request_plan(ctx, p.request, p.n, true);
      }
      case 1: {
        const CompletionsPlan p = plan_completions(ctx, body);
        return check_request_plan(ctx, p.request, p.n, false);
      }
      case 2: {
        const ChatPlan p = plan_chat(ctx, anthropic_to_openai(body));
        return check_request_plan(ctx, p.request, p.n, true);
      }
      case 3: {
        const ExecuteOptions e = take_execute_options(ctx, body);
        if (e.context_window < 0 || e.context_window > kRequestContext) return "context_window outside the context";
        const ChatPlan p = plan_chat(ctx, body);
        return check_request_plan(ctx, p.request, p.n, true);
      }
      case 4: {
        const json out = tokenize_response(ctx, body);
        return out.at("tokens").size() == out.at("count").get<size_t>() ? "" : "count differs from the tokens";
      }
      case 6: {
        const ChatPlan p = plan_chat(ctx, responses_to_openai(ctx, body).chat);
        return check_request_plan(ctx, p.request, p.n, true);
      }
      case 7: {
        json chat = anthropic_to_openai(body, true);
        chat["max_tokens"] = 1;
        const ChatPlan p = plan_chat(ctx, chat);
        return check_request_plan(ctx, p.request, p.n, true);
      }
      default: {
        const json out = detokenize_response(ctx, body);
        return out.at("content").is_string() ? "" : "content is not a string";
      }
    }
  } catch (const ApiError& e) {
    return e.status() >= 400 && e.status() < 500 ? "" : "a refused body got a status outside 4xx";
  }
}

}  // namespace step35::fuzzing
