// POST /v1/step35/execute: a chat request plus StepFun's deployment fields —
// routing_hint (scheduling class), context_window (per-request context limit) and
// expert_policy (routed-expert policy). The response's "step35" object says what was
// applied.
#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/request_validation.h"
#include "server/server_context.h"

namespace step35::server {

using nlohmann::json;

ExecuteOptions take_execute_options(ServerContext& ctx, json& body) {
  ExecuteOptions exec;
  {
    Fields f(body);
    exec.routing_hint = f.choice("routing_hint", {"low_latency", "high_throughput", "vision_language"}).value_or("");
    exec.context_window = int32_t(f.integer("context_window", 1, ctx.engine->options().n_ctx).value_or(0));
    exec.expert_policy = f.choice("expert_policy", {"auto", "strict", "adaptive"}).value_or("auto");
  }
  // low_latency / high_throughput map to the engine's scheduling classes. The model is
  // text-only: vision_language requests run as ordinary ones (and count as not served
  // under their hint in the compliance metric).
  if (exec.routing_hint == "low_latency") exec.priority = Priority::LowLatency;
  if (exec.routing_hint == "high_throughput") exec.priority = Priority::HighThroughput;
  exec.applied_policy = exec.expert_policy == "strict"     ? ExpertPolicy::Strict
                        : exec.expert_policy == "adaptive" ? ExpertPolicy::Adaptive
                                                           : ctx.options.default_expert_policy;
  body.erase("routing_hint");
  body.erase("context_window");
  body.erase("expert_policy");
  return exec;
}

void handle_execute(ServerContext& ctx, json body, HttpExchange& ex) {
  ExecuteOptions exec = take_execute_options(ctx, body);
  handle_chat(ctx, std::move(body), &exec, ex);
  if (!exec.routing_hint.empty()) ctx.metrics.count_routing(exec.routing_hint != "vision_language");
}

}  // namespace step35::server
