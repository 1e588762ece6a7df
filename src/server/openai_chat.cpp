// POST /v1/chat/completions (and the chat part of /v1/step35/execute): messages rendered
// with the model's chat template, reasoning returned as reasoning_content (and limited by
// reasoning_budget / reasoning_effort), structured output (response_format, grammar,
// forced tool calls) through grammar constraints, SSE streaming.
#include <chrono>

#include "chat/reasoning_budget.h"
#include "chat/step35_format.h"
#include "chat/tool_calls.h"
#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/client_connection.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/sse.h"
#include "structured/json_constraint.h"

namespace step35::server {

using nlohmann::json;

namespace {

// The grammar the output must follow, if any: response_format, grammar (GBNF) or a forced
// tool call (`tool_choice`: the request's, or its legacy function_call mapped); after a
// think block it applies once the reasoning ends (within the budget).
std::shared_ptr<TokenConstraint> structured_output(ServerContext& ctx, const Fields& f, const json& tool_choice,
                                                   const json* tools, bool in_reasoning, int32_t reasoning_budget) {
  std::unique_ptr<TokenConstraint> inner;
  const char* source = "response_format";
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
    if (const auto gbnf = f.string("grammar")) {
      source = "grammar";
      if (inner) throw ApiError(400, "'grammar' cannot be combined with 'response_format'", "grammar");
      inner = make_gbnf_constraint(*gbnf, ctx.tokenizer());
    }
    if (tools && !tool_choice.is_null()) {
      source = "tools";
      const json& tc = tool_choice;
      std::string only;
      bool forced = false;
      if (tc.is_string()) {
        if (tc != "none" && tc != "auto" && tc != "required")
          throw ApiError(400, "'tool_choice' must be one of 'none', 'auto', 'required' (got " + tc.dump() + ")",
                         "tool_choice");
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
        if (inner) throw ApiError(400, "a forced tool call cannot be combined with 'response_format' or 'grammar'", "tool_choice");
        inner = make_tool_call_constraint(*tools, only, ctx.tokenizer());
      }
    }
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), source);
  }
  if (!inner) return nullptr;
  if (in_reasoning) return make_after_token_constraint(ctx.think_end, reasoning_budget, std::move(inner));
  return std::shared_ptr<TokenConstraint>(std::move(inner));
}

// The reasoning budget a request asks for: -1 unbounded, 0 none (the template closes the
// think block), else tokens. enable_thinking: false in chat_template_kwargs switches
// reasoning off; then reasoning_budget, then reasoning_effort (budgets set by flags); a
// request asking for none of them gets the server's default (--reasoning-budget), except
// that enable_thinking: true turns a default of 0 back on.
int32_t reasoning_budget_of(const ServerContext& ctx, const Fields& f, const json& kwargs) {
  const ReasoningDefaults& d = ctx.options.reasoning;
  const auto effort = f.choice("reasoning_effort", {"none", "minimal", "low", "medium", "high", "xhigh"});
  const auto budget = f.integer("reasoning_budget", -1, ctx.engine->options().n_ctx);
  const auto thinking = kwargs.find("enable_thinking");
  const bool thinking_given = thinking != kwargs.end();
  if (thinking_given && !thinking->get<bool>()) return 0;
  if (budget) return int32_t(*budget);
  if (effort) {
    if (*effort == "none" || *effort == "minimal") return 0;
    if (*effort == "low") return d.low;
    if (*effort == "medium") return d.medium;
    return d.high;
  }
  if (thinking_given && d.budget == 0) return -1;
  return d.budget;
}

// chat_template_kwargs: an object; enable_thinking, when given, a boolean.
json template_kwargs(const Fields& f) {
  const json* kw = f.object("chat_template_kwargs");
  if (!kw) return json::object();
  if (kw->contains("enable_thinking") && !(*kw)["enable_thinking"].is_boolean())
    throw ApiError(400, "'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs.enable_thinking");
  return *kw;
}

// The declared tools: `tools`, plus the legacy `functions` in the same shape.
json declared_tools(const Fields& f, bool& legacy) {
  json tools = json::array();
  if (const json* t = f.array("tools")) {
    for (const json& e : *t) {
      if (!e.is_object() || e.value("type", "") != "function" || !e.contains("function") || !e["function"].is_object() ||
          !e["function"].contains("name") || !e["function"]["name"].is_string())
        throw ApiError(400, "each entry of 'tools' must be {\"type\":\"function\",\"function\":{\"name\":...}}", "tools");
      tools.push_back(e);
    }
  }
  if (const json* fns = f.array("functions")) {
    for (const json& fn : *fns) {
      if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
        throw ApiError(400, "each entry of 'functions' must be {\"name\":...,\"parameters\":...}", "functions");
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    legacy = !f.has("tools");
  }
  return tools;
}

// tool_choice, or the legacy function_call mapped to it.
json tool_choice_of(const Fields& f) {
  if (f.has("tool_choice")) return f.raw("tool_choice");
  if (!f.has("function_call")) return nullptr;
  const json& fc = f.raw("function_call");
  if (fc.is_string()) {
    const std::string v = f.choice("function_call", {"none", "auto"}).value_or("auto");
    return v;
  }
  if (!fc.is_object() || !fc.contains("name") || !fc["name"].is_string())
    throw ApiError(400, "'function_call' must be 'none', 'auto' or {\"name\":...}", "function_call");
  return {{"type", "function"}, {"function", {{"name", fc["name"]}}}};
}

}  // namespace

ChoiceTextOptions ChatPlan::text_options(const std::string& id_prefix, int index) const {
  ChoiceTextOptions o;
  o.stops = stops;
  o.parse = true;
  o.tools = tools;
  o.parser.in_reasoning = in_reasoning;
  o.parser.call_id_prefix = id_prefix + std::to_string(index) + "_";
  o.single_tool_call = single_tool_call;
  return o;
}

ChatPlan plan_chat(ServerContext& ctx, const json& body) {
  Fields f(body);
  // Every field of OpenAI's chat completions reference, and llama.cpp's / vLLM's common
  // extensions; docs/server.md says which are implemented and which are accepted and
  // ignored. Anything else is a typo worth a 400.
  f.only({"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "top_k", "min_p", "typical_p", "seed", "stop", "n", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "repeat_last_n", "logprobs", "top_logprobs", "logit_bias", "tools", "tool_choice",
          "functions", "function_call", "parallel_tool_calls", "response_format", "grammar", "reasoning_effort",
          "reasoning_budget", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
          "min_tokens", "ignore_eos", "cache_prompt", "user", "store", "metadata", "service_tier", "prediction",
          "modalities", "audio", "verbosity", "web_search_options", "prompt_cache_key", "safety_identifier"});
  ChatPlan plan;
  const json* messages = f.array("messages");
  if (!messages || messages->empty()) throw ApiError(400, "'messages' must be a non-empty array", "messages");
  bool legacy = false;
  json tools = declared_tools(f, legacy);
  const json tool_choice = tool_choice_of(f);
  const bool tools_off = tool_choice == "none";
  const bool have_tools = !tools.empty() && !tools_off;

  // Accepted and ignored: they have no meaning for this server (docs/server.md).
  for (const char* k : {"user", "service_tier", "verbosity", "prompt_cache_key", "safety_identifier"}) f.string(k);
  for (const char* k : {"metadata", "prediction", "audio", "web_search_options"}) f.object(k);
  for (const char* k : {"store", "cache_prompt"}) f.boolean(k);
  f.array("modalities");

  ChatRenderOptions ro;
  ro.kwargs = template_kwargs(f);
  ro.continue_final_message = f.boolean("continue_final_message").value_or(false);
  ro.add_generation_prompt = f.boolean("add_generation_prompt").value_or(!ro.continue_final_message);
  if (ro.continue_final_message && ro.add_generation_prompt)
    throw ApiError(400, "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message");
  plan.reasoning_budget = reasoning_budget_of(ctx, f, ro.kwargs);
  if (plan.reasoning_budget == 0 && ctx.chat_template->supports_thinking_switch()) ro.kwargs["enable_thinking"] = false;

  std::string rendered;
  std::vector<ChatMessage> msgs;
  try {
    msgs = ChatTemplate::messages_from_json(*messages);
    rendered = ctx.chat_template->render(msgs, have_tools ? tools : json::array(), ro);
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  }
  const Tokenizer& tok = ctx.tokenizer();
  GenerateRequest& r = plan.request;
  r.prompt = tok.encode(rendered, !ctx.chat_template->renders_bos(), true);
  plan.in_reasoning = ctx.think_end >= 0 && ctx.chat_template->opens_reasoning(msgs, ro);

  r.sampling = sampling_from(f, ctx.options.sampling, int32_t(tok.n_vocab()));
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
  r.min_tokens = int32_t(f.integer("min_tokens", 0, ctx_max).value_or(0));
  plan.single_tool_call = !f.boolean("parallel_tool_calls").value_or(true);
  r.constraint =
      structured_output(ctx, f, tool_choice, have_tools ? &tools : nullptr, plan.in_reasoning, plan.reasoning_budget);
  if (r.constraint && r.ignore_eos) throw ApiError(400, "'ignore_eos' cannot be combined with structured output", "ignore_eos");
  if (r.constraint && r.min_tokens > 0)
    throw ApiError(400, "'min_tokens' cannot be combined with structured output", "min_tokens");
  if (!r.constraint && plan.in_reasoning && plan.reasoning_budget > 0) {
    try {
      r.constraint = make_reasoning_budget(tok, plan.reasoning_budget);
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, e.what(), "reasoning_budget");
    }
  }
  if (have_tools) plan.tools = tools;
  plan.legacy_functions = legacy && have_tools;
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

const char* chat_finish_reason(const ChatPlan& plan, const GenerateEvent& ev, const ChoiceText& t) {
  const char* reason = openai_finish_reason(ev, t);
  if (plan.legacy_functions && std::string(reason) == "tool_calls") return "function_call";
  return reason;
}

}  // namespace

void handle_chat(ServerContext& ctx, json body, const ExecuteOptions* exec, HttpExchange& ex) {
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
  std::vector<ChoiceText> texts;
  const std::string call_prefix = random_id("call_") + "_";
  for (int i = 0; i < plan.n; ++i) texts.emplace_back(tok, plan.text_options(call_prefix, i));
  auto run = std::make_shared<GenerationRun>(*ctx.engine, replicate(plan.request, plan.n), std::move(texts));
  const auto deadline = generation_deadline(ctx);
  const std::string id = random_id("chatcmpl-");
  const int64_t created = unix_time();
  ex.trace->prompt_tokens = int64_t(plan.request.prompt.size());

  if (!plan.stream) {
    std::vector<json> logprobs(size_t(plan.n), json::array());
    std::vector<GenerateEvent> finals(size_t(plan.n));
    const ClientConnection client(ex.req);
    const DriveEnd end = drive(
        *run, deadline,
        [&](int i, const GenerateEvent& ev, const TextDelta&) {
          if (plan.logprobs && !tok.is_eog(ev.token))
            logprobs[size_t(i)].push_back(logprob_entry(tok, ev.token, ev.logprob, &ev.top));
          return true;
        },
        [&](int i, const GenerateEvent& ev, const TextDelta&) {
          finals[size_t(i)] = ev;
          ctx.metrics.observe_generation(ev);
          return true;
        },
        [&client] { return client.gone(); });
    if (end == DriveEnd::Abandoned) {
      ex.res.status = 499;  // nobody reads it (nginx's "client closed request", for the log)
      return;
    }
    if (end == DriveEnd::Deadline) throw ApiError(408, "the request timed out");
    std::vector<json> choices(size_t(plan.n));
    int32_t n_prompt = 0, n_cached = 0;
    int64_t n_completion = 0;
    for (int i = 0; i < plan.n; ++i) {
      const GenerateEvent& ev = finals[size_t(i)];
      throw_if_failed(ev);
      const ChoiceText& t = run->text(i);
      json message = {{"role", "assistant"}, {"content", t.content()}};
      if (plan.in_reasoning || !t.reasoning().empty()) message["reasoning_content"] = t.reasoning();
      const auto calls = t.tool_calls();
      if (t.truncated_call()) {
        // Cut off inside a tool call: not a call the client could run, so the output comes
        // back as the text it is (finish_reason "length").
        message["content"] = t.text_after_reasoning();
      } else if (!calls.empty() && plan.legacy_functions) {
        message["function_call"] = {{"name", calls[0].name}, {"arguments", calls[0].arguments}};
        if (t.content().empty()) message["content"] = nullptr;
      } else if (!calls.empty()) {
        json tc = json::array();
        for (const ParsedToolCall& c : calls)
          tc.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        message["tool_calls"] = tc;
        if (t.content().empty()) message["content"] = nullptr;
      }
      choices[size_t(i)] = {{"index", i},
                            {"message", message},
                            {"logprobs", plan.logprobs ? json{{"content", logprobs[size_t(i)]}} : json(nullptr)},
                            {"finish_reason", chat_finish_reason(plan, ev, t)}};
      n_prompt = ev.n_prompt;
      n_cached = std::max(n_cached, ev.n_cached);
      n_completion += ev.n_generated;
    }
    ex.trace->completion_tokens = n_completion;
    json out = {{"id", id},
                {"object", "chat.completion"},
                {"created", created},
                {"model", plan.model},
                {"choices", choices},
                {"usage", usage_json(n_prompt, n_cached, n_completion)}};
    if (exec) out["step35"] = step35_info;
    set_json(ex.res, out);
    return;
  }

  // Streaming: wait for the first event before answering, so a request that fails before
  // its first token (timeout in the queue, engine error) still gets its HTTP status.
  ChoiceEvent first;
  if (!run->peek(first, deadline)) throw ApiError(408, "the request timed out");
  if (first.event.done) throw_if_failed(first.event);
  std::shared_ptr<RequestTrace> trace = ex.trace;
  set_event_stream(ctx, ex, [&ctx, plan, run, deadline, id, created, step35_info, trace,
                             exec_given = exec != nullptr](httplib::DataSink& sink) {
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
      if (!d.tool_calls.empty() && plan.legacy_functions) {
        // Legacy function calling: one call, as function_call deltas.
        for (const OutputDelta& o : d.tool_calls) {
          if (o.tool_index != 0) continue;
          if (o.kind == OutputDelta::Kind::ToolCallStart)
            delta["function_call"] = {{"name", o.tool_name}, {"arguments", ""}};
          else
            delta["function_call"] = {{"arguments", o.text}};
        }
      } else if (!d.tool_calls.empty()) {
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
      if (d.reasoning.empty() && d.content.empty() && d.tool_calls.empty() && !(plan.logprobs && !tok.is_eog(ev.token)) &&
          started[size_t(i)])
        return true;
      return sse_write(sink, sse_data(chunk(json::array({delta_choice(i, d, &ev)}))));
    };
    auto on_done = [&](int i, const GenerateEvent& ev, const TextDelta& d) {
      ctx.metrics.observe_generation(ev);
      n_prompt = ev.n_prompt;
      n_cached = std::max(n_cached, ev.n_cached);
      n_completion += ev.n_generated;
      trace->completion_tokens = n_completion;
      if (!d.reasoning.empty() || !d.content.empty() || !d.tool_calls.empty() || !started[size_t(i)])
        if (!sse_write(sink, sse_data(chunk(json::array({delta_choice(i, d, nullptr)}))))) return false;
      json c = delta_choice(i, TextDelta{}, nullptr);
      c["finish_reason"] = chat_finish_reason(plan, ev, run->text(i));
      if (ev.reason == FinishReason::Error || ev.reason == FinishReason::Timeout) {
        json err = ApiError(ev.reason == FinishReason::Timeout ? 408 : 500,
                            ev.reason == FinishReason::Timeout ? "the request timed out" : "generation failed: " + ev.error)
                       .body();
        if (!sse_write(sink, sse_data(err))) return false;
      }
      return sse_write(sink, sse_data(chunk(json::array({c}))));
    };
    if (drive(*run, deadline, on_token, on_done) != DriveEnd::Finished) {
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
