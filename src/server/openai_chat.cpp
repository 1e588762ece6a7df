// POST /v1/chat/completions (and the chat part of /v1/step35/execute): messages rendered
// with the model's chat template, reasoning returned as reasoning_content, structured
// output (response_format, forced tool calls) through grammar constraints, SSE streaming.
#include <chrono>

#include "structured/json_constraint.h"
#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/sse.h"

namespace step35::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::shared_ptr<TokenConstraint> structured_output(ServerContext& ctx, const Fields& f, const json* tools,
                                                   bool in_reasoning, int32_t reasoning_budget) {
  std::unique_ptr<TokenConstraint> inner;
  try {
    if (const json* rf = f.object("response_format")) {
      Fields r(*rf, "response_format.");
      r.only({"type", "json_schema"});
      const std::string type = r.choice("type", {"text", "json_object", "json_schema"}).value_or("");
      if (type.empty()) throw ApiError(400, "'response_format.type' is required", "response_format.type");
      if (type == "json_object") {
        inner = make_json_constraint(json{{"type", "object"}}, ctx.tokenizer());
      } else if (type == "json_schema") {
        const json* js = r.object("json_schema");
        if (!js) throw ApiError(400, "'response_format.json_schema' is required", "response_format.json_schema");
        Fields s(*js, "response_format.json_schema.");
        s.only({"name", "schema", "strict", "description"});
        s.string("name");
        s.boolean("strict");
        const json* schema = s.has("schema") ? &s.raw("schema") : nullptr;
        if (schema && !schema->is_object() && !schema->is_boolean())
          throw ApiError(400, "'response_format.json_schema.schema' must be an object", "response_format.json_schema.schema");
        inner = make_json_constraint(schema ? *schema : json::object(), ctx.tokenizer());
      }
    }
    if (tools && f.has("tool_choice")) {
      const json& tc = f.raw("tool_choice");
      std::string only;
      bool forced = false;
      if (tc.is_string()) {
        f.choice("tool_choice", {"none", "auto", "required"});
        forced = tc == "required";
      } else if (tc.is_object()) {
        Fields t(tc, "tool_choice.");
        t.only({"type", "function"});
        t.choice("type", {"function"});
        const json* fn = t.object("function");
        if (!fn) throw ApiError(400, "'tool_choice.function' is required", "tool_choice.function");
        Fields fnf(*fn, "tool_choice.function.");
        fnf.only({"name"});
        only = fnf.string("name").value_or("");
        bool known = false;
        for (const json& tool : *tools)
          known = known || (tool.contains("function") && tool["function"].is_object() &&
                            tool["function"].value("name", std::string()) == only);
        if (!known) throw ApiError(400, "'tool_choice' names no tool in 'tools': '" + only + "'", "tool_choice");
        forced = true;
      } else {
        throw ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or a function object", "tool_choice");
      }
      if (forced) {
        if (inner) throw ApiError(400, "'response_format' cannot be combined with a forced tool call", "tool_choice");
        inner = make_tool_call_constraint(*tools, only, ctx.tokenizer());
      }
    }
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), f.has("response_format") ? "response_format" : "tools");
  }
  if (!inner) return nullptr;
  if (in_reasoning) return make_after_token_constraint(ctx.think_end, reasoning_budget, std::move(inner));
  return std::shared_ptr<TokenConstraint>(std::move(inner));
}

}  // namespace

ChatPlan plan_chat(ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "top_k", "min_p", "seed", "stop", "n", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "repeat_last_n", "logprobs", "top_logprobs", "tools", "tool_choice",
          "parallel_tool_calls", "response_format", "user", "store", "metadata", "reasoning_budget", "ignore_eos"});
  ChatPlan plan;
  const json* messages = f.array("messages");
  if (!messages || messages->empty()) throw ApiError(400, "'messages' must be a non-empty array", "messages");
  const json* tools = f.array("tools");
  if (tools)
    for (const json& t : *tools)
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string())
        throw ApiError(400, "each entry of 'tools' must be {\"type\":\"function\",\"function\":{\"name\":...}}", "tools");
  const bool tools_off = f.has("tool_choice") && f.raw("tool_choice") == "none";
  std::string rendered;
  try {
    const auto msgs = ChatTemplate::messages_from_json(*messages);
    rendered = ctx.chat_template->render(msgs, tools && !tools_off ? *tools : json::array());
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  }
  const Tokenizer& tok = ctx.tokenizer();
  GenerateRequest& r = plan.request;
  r.prompt = tok.encode(rendered, !ctx.chat_template->renders_bos(), true);
  static const std::string kThinkOpen = "<think>\n";
  plan.in_reasoning = ctx.think_end >= 0 && ctx.chat_template->format() == ChatFormat::STEP35 &&
                      rendered.size() >= kThinkOpen.size() &&
                      rendered.compare(rendered.size() - kThinkOpen.size(), kThinkOpen.size(), kThinkOpen) == 0;

  r.sampling = sampling_from(f);
  const int64_t ctx_max = ctx.engine->options().n_ctx;
  auto max_tokens = f.integer("max_completion_tokens", 1, ctx_max);
  if (!max_tokens) max_tokens = f.integer("max_tokens", 1, ctx_max);
  r.max_tokens = max_tokens ? int32_t(*max_tokens) : -1;
  read_response_fields(ctx, f, plan);
  plan.logprobs = f.boolean("logprobs").value_or(false);
  r.want_logprobs = plan.logprobs;
  r.n_top_logprobs = int32_t(f.integer("top_logprobs", 0, 20).value_or(0));
  if (r.n_top_logprobs > 0 && !plan.logprobs)
    throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  const int32_t budget = int32_t(f.integer("reasoning_budget", -1, ctx_max).value_or(-1));
  f.boolean("parallel_tool_calls");
  f.string("user");
  r.constraint = structured_output(ctx, f, tools_off ? nullptr : tools, plan.in_reasoning, budget);
  if (tools && !tools_off) plan.tools = *tools;
  if (r.constraint && r.ignore_eos) throw ApiError(400, "'ignore_eos' cannot be combined with structured output", "ignore_eos");
  r.timeout_s = ctx.options.timeout_s;
  return plan;
}

namespace {

json logprob_entry(const Tokenizer& tok, int32_t token, float logprob, const std::vector<TokenLogprob>* top) {
  const std::string piece = tok.token_to_piece(token, false);
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(int(c));
  json e = {{"token", piece}, {"logprob", logprob}, {"bytes", bytes}};
  if (top) {
    json alts = json::array();
    for (const TokenLogprob& t : *top) alts.push_back(logprob_entry(tok, t.token, t.logprob, nullptr));
    e["top_logprobs"] = alts;
  }
  return e;
}

json usage_json(int32_t prompt, int32_t cached, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// The error a choice's final event carries, for a response that has not started.
void throw_if_failed(const GenerateEvent& ev) {
  if (ev.reason == FinishReason::Timeout) throw ApiError(408, "the request timed out");
  if (ev.reason == FinishReason::Error) throw ApiError(500, "generation failed: " + ev.error);
}

}  // namespace

void handle_chat(ServerContext& ctx, json body, const ExecuteOptions* exec, httplib::Response& res) {
  ChatPlan plan = plan_chat(ctx, body);
  json step35_info;
  if (exec) {
    plan.request.priority = exec->priority;
    plan.request.n_ctx = exec->context_window;
    plan.request.expert_policy = exec->applied_policy;
    plan.request.adaptive_mass = ctx.options.adaptive_mass;
    plan.request.adaptive_min_k = ctx.options.adaptive_min_k;
    const bool adaptive = exec->applied_policy == ExpertPolicy::Adaptive;
    step35_info = {{"routing_hint", exec->routing_hint.empty() ? json(nullptr) : json(exec->routing_hint)},
                   {"priority", exec->priority == Priority::LowLatency       ? "low_latency"
                                : exec->priority == Priority::HighThroughput ? "high_throughput"
                                                                             : "normal"},
                   {"context_window", exec->context_window ? exec->context_window : ctx.engine->options().n_ctx},
                   {"expert_policy", exec->expert_policy},
                   {"expert_policy_applied", adaptive ? "adaptive" : "strict"}};
    if (adaptive) {
      step35_info["adaptive_mass"] = ctx.options.adaptive_mass;
      step35_info["adaptive_min_k"] = ctx.options.adaptive_min_k;
    }
  }
  const Tokenizer& tok = ctx.tokenizer();
  auto run = std::make_shared<GenerationRun>(*ctx.engine, replicate(plan.request, plan.n));
  auto texts = std::make_shared<std::vector<ChoiceText>>();
  for (int i = 0; i < plan.n; ++i) {
    OutputParserOptions po;
    po.in_reasoning = plan.in_reasoning;
    po.call_id_prefix = random_id("call_") + "_" + std::to_string(i) + "_";
    texts->emplace_back(tok, plan.stops, plan.tools, po);
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(ctx.options.timeout_s + 5));
  const std::string id = random_id("chatcmpl-");
  const int64_t created = unix_time();

  if (!plan.stream) {
    std::vector<json> choices(size_t(plan.n));
    std::vector<json> logprobs(size_t(plan.n), json::array());
    int32_t n_prompt = 0, n_cached = 0;
    int64_t n_completion = 0;
    std::vector<GenerateEvent> finals(size_t(plan.n));
    const bool ok = drive(
        *run, *texts, deadline,
        [&](int i, const GenerateEvent& ev, const TextDelta&) {
          if (plan.logprobs && !tok.is_eog(ev.token))
            logprobs[size_t(i)].push_back(logprob_entry(tok, ev.token, ev.logprob, &ev.top));
          return true;
        },
        [&](int i, const GenerateEvent& ev, const TextDelta&) {
          finals[size_t(i)] = ev;
          ctx.metrics.observe_generation(ev);
          return true;
        });
    if (!ok) throw ApiError(408, "the request timed out");
    for (int i = 0; i < plan.n; ++i) {
      const GenerateEvent& ev = finals[size_t(i)];
      throw_if_failed(ev);
      const ChoiceText& t = (*texts)[size_t(i)];
      json message = {{"role", "assistant"}, {"content", t.content()}};
      if (plan.in_reasoning || !t.reasoning().empty()) message["reasoning_content"] = t.reasoning();
      const auto calls = t.tool_calls();
      if (!calls.empty()) {
        json tc = json::array();
        for (const ParsedToolCall& c : calls)
          tc.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        message["tool_calls"] = tc;
        if (t.content().empty()) message["content"] = nullptr;
      }
      choices[size_t(i)] = {{"index", i},
                            {"message", message},
                            {"logprobs", plan.logprobs ? json{{"content", logprobs[size_t(i)]}} : json(nullptr)},
                            {"finish_reason", !calls.empty() && ev.reason == FinishReason::Stop
                                                  ? "tool_calls"
                                                  : openai_finish_reason(ev, t.stopped())}};
      n_prompt = ev.n_prompt;
      n_cached = std::max(n_cached, ev.n_cached);
      n_completion += ev.n_generated;
    }
    json out = {{"id", id},
                {"object", "chat.completion"},
                {"created", created},
                {"model", plan.model},
                {"choices", choices},
                {"usage", usage_json(n_prompt, n_cached, n_completion)}};
    if (exec) out["step35"] = step35_info;
    set_json(res, out);
    return;
  }

  // Streaming: wait for the first event before answering, so a request that fails before
  // its first token (timeout in the queue, engine error) still gets its HTTP status.
  auto first = std::make_shared<ChoiceEvent>();
  if (!run->next(*first, deadline)) throw ApiError(408, "the request timed out");
  if (first->event.done) throw_if_failed(first->event);
  set_event_stream(ctx, res, [&ctx, plan, run, texts, first, deadline, id, created, step35_info, exec_given = exec != nullptr](
                            httplib::DataSink& sink) {
    const Tokenizer& tok = ctx.tokenizer();
    auto chunk = [&](json choices) {
      json c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", plan.model},
                {"choices", std::move(choices)}};
      if (exec_given) c["step35"] = step35_info;
      if (plan.include_usage) c["usage"] = nullptr;
      return c;
    };
    std::vector<bool> started(size_t(plan.n), false);
    auto delta_choice = [&](int i, const TextDelta& d, const GenerateEvent* tok_ev) -> json {
      json delta = json::object();
      if (!started[size_t(i)]) {
        delta["role"] = "assistant";
        started[size_t(i)] = true;
      }
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      if (!d.content.empty()) delta["content"] = d.content;
      if (!d.tool_calls.empty()) {
        json tc = json::array();
        for (const OutputDelta& o : d.tool_calls) {
          if (o.kind == OutputDelta::Kind::ToolCallStart)
            tc.push_back({{"index", o.tool_index}, {"id", o.tool_id}, {"type", "function"},
                          {"function", {{"name", o.tool_name}, {"arguments", ""}}}});
          else
            tc.push_back({{"index", o.tool_index}, {"function", {{"arguments", o.text}}}});
        }
        delta["tool_calls"] = tc;
      }
      json c = {{"index", i}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (plan.logprobs && tok_ev && !tok.is_eog(tok_ev->token))
        c["logprobs"] = {{"content", json::array({logprob_entry(tok, tok_ev->token, tok_ev->logprob, &tok_ev->top)})}};
      return c;
    };
    int32_t n_prompt = 0, n_cached = 0;
    int64_t n_completion = 0;
    auto on_token = [&](int i, const GenerateEvent& ev, const TextDelta& d) {
      if (d.reasoning.empty() && d.content.empty() && d.tool_calls.empty() && !(plan.logprobs && !tok.is_eog(ev.token)) && started[size_t(i)])
        return true;
      return sse_write(sink, sse_data(chunk(json::array({delta_choice(i, d, &ev)}))));
    };
    auto on_done = [&](int i, const GenerateEvent& ev, const TextDelta& d) {
      ctx.metrics.observe_generation(ev);
      n_prompt = ev.n_prompt;
      n_cached = std::max(n_cached, ev.n_cached);
      n_completion += ev.n_generated;
      if (!d.reasoning.empty() || !d.content.empty() || !d.tool_calls.empty() || !started[size_t(i)])
        if (!sse_write(sink, sse_data(chunk(json::array({delta_choice(i, d, nullptr)}))))) return false;
      json c = delta_choice(i, TextDelta{}, nullptr);
      const ChoiceText& t = (*texts)[size_t(i)];
      c["finish_reason"] = !t.tool_calls().empty() && ev.reason == FinishReason::Stop
                               ? "tool_calls"
                               : openai_finish_reason(ev, t.stopped());
      if (ev.reason == FinishReason::Error || ev.reason == FinishReason::Timeout) {
        json err = ApiError(ev.reason == FinishReason::Timeout ? 408 : 500,
                            ev.reason == FinishReason::Timeout ? "the request timed out" : "generation failed: " + ev.error)
                       .body();
        if (!sse_write(sink, sse_data(err))) return false;
      }
      return sse_write(sink, sse_data(chunk(json::array({c}))));
    };
    // The first event was taken off the queue already: put it through the same path.
    bool ok = true;
    {
      ChoiceText& t = (*texts)[size_t(first->index)];
      if (!first->event.done) {
        const TextDelta d = t.push(first->event.token);
        ok = on_token(first->index, first->event, d);
        if (d.stop_matched) run->stop(first->index);
      } else {
        run->mark_done(first->index);
        ok = on_done(first->index, first->event, t.finish());
      }
    }
    if (ok) {
      // drive() counts choices from the ones still running.
      ok = drive(*run, *texts, deadline, on_token, on_done);
    }
    if (!ok) {
      run->cancel_all();
      sink.done();
      return;
    }
    if (plan.include_usage) {
      json u = chunk(json::array());
      u["usage"] = usage_json(n_prompt, n_cached, n_completion);
      sse_write(sink, sse_data(u));
    }
    sse_write(sink, sse_done());
    sink.done();
  });
}

}  // namespace step35::server
