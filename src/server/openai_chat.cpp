// POST /v1/chat/completions (and the chat part of /v1/step35/execute): messages rendered
// with the model's chat template, reasoning returned as reasoning_content (and limited by
// reasoning_budget / reasoning_effort), structured output (response_format, grammar,
// forced tool calls) through grammar constraints, SSE streaming.
#include "chat/reasoning_budget.h"
#include "chat/step35_format.h"
#include "chat/tool_calls.h"
#include "server/api_error.h"
#include "server/chat_images.h"
#include "server/chat_plan.h"
#include "server/endpoint.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/sse.h"
#include "server/streaming.h"
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

// The declared tools as the template sees them, in the client's key order: `tools`, then
// the legacy `functions` wrapped as declared_tools wraps them (already validated there).
nlohmann::ordered_json ordered_tools(const nlohmann::ordered_json& body) {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  if (body.contains("tools") && body["tools"].is_array())
    for (const auto& t : body["tools"]) tools.push_back(t);
  if (body.contains("functions") && body["functions"].is_array())
    for (const auto& fn : body["functions"]) tools.push_back({{"type", "function"}, {"function", fn}});
  return tools;
}

// The template's options from the request (chat_template_kwargs, add_generation_prompt,
// continue_final_message; thinking switched off for a reasoning budget of 0) and the
// reasoning budget, which the plan keeps.
ChatRenderOptions render_options(ServerContext& ctx, const Fields& f, ChatPlan& plan) {
  ChatRenderOptions ro;
  ro.kwargs = template_kwargs(f);
  ro.continue_final_message = f.boolean("continue_final_message").value_or(false);
  ro.add_generation_prompt = f.boolean("add_generation_prompt").value_or(!ro.continue_final_message);
  if (ro.continue_final_message && ro.add_generation_prompt)
    throw ApiError(400, "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message");
  plan.reasoning_budget = reasoning_budget_of(ctx, f, ro.kwargs);
  if (plan.reasoning_budget == 0 && ctx.chat_template->supports_thinking_switch()) ro.kwargs["enable_thinking"] = false;
  return ro;
}

// The prompt's tokens (one BOS: added unless the template wrote it), its text, and whether
// it leaves a think block open (only for a model that has the token that closes it).
// `messages` and `tools` are in the client's key order when the endpoint has it.
void tokenize_prompt(ServerContext& ctx, const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     const ChatRenderOptions& ro, ChatPlan& plan, bool text_only) {
  // Pictures leave the messages first, the media marker in their place (server/chat_images.h).
  std::vector<vision::RgbImage> images;
  nlohmann::ordered_json with_markers;
  const bool pictures = has_image_parts(messages);
  if (pictures) {
    with_markers = messages;
    images = take_chat_images(ctx, with_markers);
  }
  RenderedChat rendered;
  try {
    rendered = render_chat(*ctx.chat_template, pictures ? with_markers : messages, tools, ro);
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  } catch (const nlohmann::ordered_json::exception& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  }
  const bool add_bos = !ctx.chat_template->starts_with_bos(rendered.text);
  if (pictures && text_only) plan.request.prompt.clear();  // (no picture is encoded for the text alone)
  else if (pictures) tokenize_with_images(ctx, rendered.text, add_bos, images, plan.request);
  else plan.request.prompt = ctx.tokenizer().encode(rendered.text, add_bos, true);
  plan.in_reasoning = ctx.think_end >= 0 && rendered.opens_reasoning;
  plan.prompt_text = std::move(rendered.text);
}

}  // namespace

RenderedChat render_chat(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                         const nlohmann::ordered_json& tools, const ChatRenderOptions& options) {
  RenderedChat out;
  out.text = chat_template.render(messages, tools, options);
  out.opens_reasoning = chat_template.opens_reasoning(out.text);
  return out;
}

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

ChatPlan plan_chat(ServerContext& ctx, const json& body, const nlohmann::ordered_json* ordered_body, bool text_only) {
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

  const ChatRenderOptions ro = render_options(ctx, f, plan);
  if (ordered_body && ordered_body->contains("messages")) {
    tokenize_prompt(ctx, (*ordered_body)["messages"],
                    have_tools ? ordered_tools(*ordered_body) : nlohmann::ordered_json::array(), ro, plan, text_only);
  } else {
    tokenize_prompt(ctx, *messages, have_tools ? tools : json::array(), ro, plan, text_only);
  }
  const Tokenizer& tok = ctx.tokenizer();
  GenerateRequest& r = plan.request;
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

// OpenAI's finish_reason, with the legacy name for a call answered as function_call.
const char* chat_finish_reason(const ChatPlan& plan, const GenerateEvent& ev, const ChoiceText& t) {
  const char* reason = openai_finish_reason(ev, t);
  if (plan.legacy_functions && std::string(reason) == "tool_calls") return "function_call";
  return reason;
}

// Tool-call deltas: as tool_calls, or (legacy functions) the first call as function_call.
void add_tool_call_deltas(const ChatPlan& plan, const std::vector<OutputDelta>& deltas, json& delta) {
  if (deltas.empty()) return;
  if (plan.legacy_functions) {
    for (const OutputDelta& o : deltas) {
      if (o.tool_index != 0) continue;
      if (o.kind == OutputDelta::Kind::ToolCallStart)
        delta["function_call"] = {{"name", o.tool_name}, {"arguments", ""}};
      else
        delta["function_call"] = {{"arguments", o.text}};
    }
    return;
  }
  json tc = json::array();
  for (const OutputDelta& o : deltas) {
    if (o.kind == OutputDelta::Kind::ToolCallStart)
      tc.push_back({{"index", o.tool_index}, {"id", o.tool_id}, {"type", "function"},
                    {"function", {{"name", o.tool_name}, {"arguments", ""}}}});
    else
      tc.push_back({{"index", o.tool_index}, {"function", {{"arguments", o.text}}}});
  }
  delta["tool_calls"] = tc;
}

// The chat.completion.chunk stream: a delta per token that added text (or logprobs), the
// role in a choice's first delta, its finish_reason in a last one, then usage and [DONE].
class ChatStream final : public EventWriter {
 public:
  ChatStream(const Tokenizer& tok, const ChatPlan& plan, std::string id, int64_t created, json step35_info)
      : tok_(tok), plan_(plan), id_(std::move(id)), created_(created), step35_info_(std::move(step35_info)),
        started_(size_t(plan.n), false) {}

  bool token(httplib::DataSink& sink, int i, const GenerateEvent& ev, const TextDelta& d) override {
    const bool logprob = plan_.logprobs && !tok_.is_eog(ev.token);
    if (d.reasoning.empty() && d.content.empty() && d.tool_calls.empty() && !logprob && started_[size_t(i)]) return true;
    return sse_write(sink, sse_data(chunk(json::array({delta_choice(i, d, &ev)}))));
  }

  bool done(httplib::DataSink& sink, int i, const GenerateEvent& ev, const TextDelta& d, const ChoiceText& t) override {
    usage_.add(ev);
    if (!d.reasoning.empty() || !d.content.empty() || !d.tool_calls.empty() || !started_[size_t(i)])
      if (!sse_write(sink, sse_data(chunk(json::array({delta_choice(i, d, nullptr)}))))) return false;
    json c = delta_choice(i, TextDelta{}, nullptr);
    c["finish_reason"] = chat_finish_reason(plan_, ev, t);
    if (ev.reason == FinishReason::Error || ev.reason == FinishReason::Timeout) {
      const json err = ApiError(ev.reason == FinishReason::Timeout ? 408 : 500,
                                ev.reason == FinishReason::Timeout ? "the request timed out" : "generation failed: " + ev.error)
                           .body();
      if (!sse_write(sink, sse_data(err))) return false;
    }
    return sse_write(sink, sse_data(chunk(json::array({c}))));
  }

  bool end(httplib::DataSink& sink) override {
    if (plan_.include_usage) {
      json u = chunk(json::array());
      u["usage"] = usage_.openai();
      sse_write(sink, sse_data(u));
    }
    sse_write(sink, sse_done());
    return true;
  }

 private:
  json chunk(json choices) const {
    json c = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", plan_.model},
              {"choices", std::move(choices)}};
    if (!step35_info_.is_null()) c["step35"] = step35_info_;
    if (plan_.include_usage) c["usage"] = nullptr;
    return c;
  }

  json delta_choice(int i, const TextDelta& d, const GenerateEvent* tok_ev) {
    json delta = json::object();
    if (!started_[size_t(i)]) {
      delta["role"] = "assistant";
      started_[size_t(i)] = true;
    }
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    add_tool_call_deltas(plan_, d.tool_calls, delta);
    json c = {{"index", i}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (plan_.logprobs && tok_ev && !tok_.is_eog(tok_ev->token))
      c["logprobs"] = {{"content", json::array({logprob_entry(tok_, tok_ev->token, tok_ev->logprob, &tok_ev->top)})}};
    return c;
  }

  const Tokenizer& tok_;
  ChatPlan plan_;
  std::string id_;
  int64_t created_;
  json step35_info_;  // null unless /v1/step35/execute
  std::vector<bool> started_;
  Usage usage_;
};

// What /v1/step35/execute applied, echoed in the response's "step35" object.
json execute_info(const ServerContext& ctx, const ExecuteOptions& exec) {
  const bool adaptive = exec.applied_policy == ExpertPolicy::Adaptive;
  json info = {{"routing_hint", exec.routing_hint.empty() ? json(nullptr) : json(exec.routing_hint)},
               {"priority", exec.priority == Priority::LowLatency       ? "low_latency"
                            : exec.priority == Priority::HighThroughput ? "high_throughput"
                                                                         : "normal"},
               {"context_window", exec.context_window ? exec.context_window : ctx.engine->options().n_ctx},
               {"expert_policy", exec.expert_policy},
               {"expert_policy_applied", adaptive ? "adaptive" : "strict"}};
  if (adaptive) {
    info["adaptive_mass"] = ctx.options.adaptive_mass;
    info["adaptive_min_k"] = ctx.options.adaptive_min_k;
  }
  return info;
}

// A choice's message: content, reasoning, tool calls (or the legacy function_call); a call
// cut off by max_tokens or the context is not a call the client could run, so the output
// comes back as the text it is (finish_reason "length").
json chat_message(const ChatPlan& plan, const ChoiceText& t) {
  json message = {{"role", "assistant"}, {"content", t.content()}};
  if (plan.in_reasoning || !t.reasoning().empty()) message["reasoning_content"] = t.reasoning();
  const auto calls = t.tool_calls();
  if (t.truncated_call()) {
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
  return message;
}

// The whole chat.completion object but its id and created time.
json chat_completion(const Tokenizer& tok, const ChatPlan& plan, Generation& gen, HttpExchange& ex) {
  std::vector<json> logprobs(size_t(plan.n), json::array());
  const std::vector<GenerateEvent> finals = gen.collect(ex, [&](int i, const GenerateEvent& ev, const TextDelta&) {
    if (plan.logprobs && !tok.is_eog(ev.token))
      logprobs[size_t(i)].push_back(logprob_entry(tok, ev.token, ev.logprob, &ev.top));
    return true;
  });
  json choices = json::array();
  Usage usage;
  for (int i = 0; i < plan.n; ++i) {
    const GenerateEvent& ev = finals[size_t(i)];
    const ChoiceText& t = gen.text(i);
    choices.push_back({{"index", i},
                       {"message", chat_message(plan, t)},
                       {"logprobs", plan.logprobs ? json{{"content", logprobs[size_t(i)]}} : json(nullptr)},
                       {"finish_reason", chat_finish_reason(plan, ev, t)}});
    usage.add(ev);
  }
  return {{"object", "chat.completion"}, {"model", plan.model}, {"choices", choices}, {"usage", usage.openai()}};
}

}  // namespace

void handle_chat(ServerContext& ctx, json body, const ExecuteOptions* exec, HttpExchange& ex) {
  ChatPlan plan = plan_chat(ctx, body, ex.ordered_body);
  json step35_info;
  if (exec) {
    plan.request.priority = exec->priority;
    plan.request.n_ctx = exec->context_window;
    plan.request.expert_policy = exec->applied_policy;
    plan.request.adaptive_mass = ctx.options.adaptive_mass;
    plan.request.adaptive_min_k = ctx.options.adaptive_min_k;
    step35_info = execute_info(ctx, *exec);
  }
  const Tokenizer& tok = ctx.tokenizer();
  std::vector<ChoiceText> texts;
  const std::string call_prefix = random_id("call_") + "_";
  for (int i = 0; i < plan.n; ++i) texts.emplace_back(tok, plan.text_options(call_prefix, i));
  auto gen = std::make_shared<Generation>(ctx, ex, plan.request, plan.n, std::move(texts));
  const std::string id = random_id("chatcmpl-");
  const int64_t created = unix_time();
  if (plan.stream) return stream(gen, ex, std::make_shared<ChatStream>(tok, plan, id, created, step35_info));
  json out = chat_completion(tok, plan, *gen, ex);
  out["id"] = id;
  out["created"] = created;
  if (exec) out["step35"] = step35_info;
  set_json(ex.res, out);
}

void handle_apply_template(ServerContext& ctx, const json& body, HttpExchange& ex) {
  const ChatPlan plan = plan_chat(ctx, body, ex.ordered_body, /*text_only=*/true);
  set_json(ex.res, {{"prompt", plan.prompt_text}});
}

}  // namespace step35::server
