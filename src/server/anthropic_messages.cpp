// POST /v1/messages: Anthropic's Messages API (what Claude Code-style agents speak). The
// body is mapped to the OpenAI chat shape and planned like a chat request; the answer is
// a message of content blocks (thinking, text, tool_use), streamed as Anthropic's named
// SSE events.
#include <chrono>

#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/client_connection.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/sse.h"

namespace step35::server {

using nlohmann::json;

namespace {

// Text of a string-or-blocks content (text blocks only).
std::string block_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, "'" + where + "' must be a string or an array of content blocks", where);
  std::string out;
  for (const json& b : content) {
    if (!b.is_object() || !b.contains("type")) throw ApiError(400, "'" + where + "' holds a block without a type", where);
    if (b["type"] == "text") {
      if (!b.contains("text") || !b["text"].is_string()) throw ApiError(400, "'" + where + "' text block without text", where);
      out += b["text"].get<std::string>();
    } else {
      throw ApiError(400, "'" + where + "': unsupported content block type " + b["type"].dump(), where);
    }
  }
  return out;
}


const char* stop_reason(const GenerateEvent& ev, const ChoiceText& t) {
  if (t.stopped()) return "stop_sequence";
  if (!t.tool_calls().empty() && ev.reason == FinishReason::Stop) return "tool_use";
  return ev.reason == FinishReason::Stop ? "end_turn" : "max_tokens";
}

void throw_if_failed(const GenerateEvent& ev) {
  if (ev.reason == FinishReason::Timeout) throw ApiError(408, "the request timed out");
  if (ev.reason == FinishReason::Error) throw ApiError(500, "generation failed: " + ev.error);
}

}  // namespace

// The Anthropic body as an OpenAI chat body.
json anthropic_to_openai(const json& body, bool counting) {
  Fields f(body);
  if (counting) {
    f.only({"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers"});
  } else {
    f.only({"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
            "tools", "tool_choice", "metadata", "thinking", "service_tier"});
  }
  json out = json::object();
  if (auto model = f.string("model")) out["model"] = *model;
  const auto max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  if (!max_tokens && !counting) throw ApiError(400, "'max_tokens' is required", "max_tokens");
  if (max_tokens) out["max_tokens"] = *max_tokens;
  // Accepted and ignored (docs/server.md).
  f.object("metadata");
  f.string("service_tier");
  f.array("mcp_servers");
  // Extended thinking: a budget for the reasoning, or none at all.
  if (const json* thinking = f.object("thinking")) {
    Fields t(*thinking, "thinking.");
    t.only({"type", "budget_tokens"});
    const std::string type = t.choice("type", {"enabled", "disabled", "adaptive"}).value_or("");
    if (type.empty()) throw ApiError(400, "'thinking.type' is required", "thinking.type");
    if (type == "disabled") out["reasoning_budget"] = 0;
    if (type == "enabled") {
      const auto budget = t.integer("budget_tokens", 1, INT32_MAX);
      if (!budget) throw ApiError(400, "'thinking.budget_tokens' is required with type 'enabled'", "thinking.budget_tokens");
      out["reasoning_budget"] = *budget;
    }
  }
  for (const char* k : {"temperature", "top_p", "top_k", "stream"})
    if (f.has(k)) out[k] = f.raw(k);
  if (!f.has("temperature")) out["temperature"] = 1.0;
  auto stops = f.strings_or_string("stop_sequences", 4);
  if (!stops.empty()) out["stop"] = stops;
  json messages = json::array();
  if (f.has("system")) messages.push_back({{"role", "system"}, {"content", block_text(f.raw("system"), "system")}});
  const json* msgs = f.array("messages");
  if (!msgs || msgs->empty()) throw ApiError(400, "'messages' must be a non-empty array", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    Fields m((*msgs)[i], where + ".");
    m.only({"role", "content"});
    const std::string role = m.choice("role", {"user", "assistant"}).value_or("");
    if (role.empty()) throw ApiError(400, "'" + where + ".role' is required", where + ".role");
    if (!m.has("content")) throw ApiError(400, "'" + where + ".content' is required", where + ".content");
    const json& content = m.raw("content");
    if (content.is_string()) {
      messages.push_back({{"role", role}, {"content", content}});
      continue;
    }
    if (!content.is_array()) throw ApiError(400, "'" + where + ".content' must be a string or an array", where + ".content");
    std::string text, thinking;
    json calls = json::array();
    for (const json& b : content) {
      const std::string type = b.is_object() ? b.value("type", "") : "";
      if (type == "text") {
        text += b.value("text", "");
      } else if (type == "thinking" && role == "assistant") {
        thinking += b.value("thinking", "");
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("name") || !b["name"].is_string() || !b.contains("input") || !b["input"].is_object())
          throw ApiError(400, "'" + where + "': tool_use blocks need a name and an input object", where);
        calls.push_back({{"id", b.value("id", "")}, {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
      } else if (type == "tool_result" && role == "user") {
        if (!text.empty()) {
          messages.push_back({{"role", "user"}, {"content", text}});
          text.clear();
        }
        const json rc = b.contains("content") ? b["content"] : json("");
        messages.push_back({{"role", "tool"}, {"tool_call_id", b.value("tool_use_id", "")},
                            {"content", block_text(rc, where + ".tool_result.content")}});
      } else {
        throw ApiError(400, "'" + where + "': unsupported content block type '" + type + "' for role " + role, where);
      }
    }
    if (role == "assistant") {
      json a = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) a["reasoning_content"] = thinking;
      if (!calls.empty()) a["tool_calls"] = calls;
      messages.push_back(a);
    } else if (!text.empty()) {
      messages.push_back({{"role", "user"}, {"content", text}});
    }
  }
  // A last assistant message is a prefill: the answer continues it.
  if (!msgs->empty() && (*msgs)[msgs->size() - 1].is_object() && (*msgs)[msgs->size() - 1].value("role", "") == "assistant") {
    out["continue_final_message"] = true;
    out["add_generation_prompt"] = false;
  }
  out["messages"] = messages;
  if (const json* tools = f.array("tools")) {
    json t = json::array();
    for (const json& tool : *tools) {
      if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string())
        throw ApiError(400, "each entry of 'tools' needs a name", "tools");
      t.push_back({{"type", "function"},
                   {"function", {{"name", tool["name"]}, {"description", tool.value("description", "")},
                                 {"parameters", tool.contains("input_schema") ? tool["input_schema"] : json::object()}}}});
    }
    out["tools"] = t;
  }
  if (const json* tc = f.object("tool_choice")) {
    Fields c(*tc, "tool_choice.");
    c.only({"type", "name", "disable_parallel_tool_use"});
    const std::string type = c.choice("type", {"auto", "any", "tool", "none"}).value_or("auto");
    if (c.boolean("disable_parallel_tool_use").value_or(false)) out["parallel_tool_calls"] = false;
    if (type == "any") out["tool_choice"] = "required";
    if (type == "none") out["tool_choice"] = "none";
    if (type == "auto") out["tool_choice"] = "auto";
    if (type == "tool") {
      const auto name = c.string("name");
      if (!name) throw ApiError(400, "'tool_choice.name' is required for type 'tool'", "tool_choice.name");
      out["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    }
  }
  return out;
}

void handle_messages(ServerContext& ctx, const json& body, HttpExchange& ex) {
  ChatPlan plan = plan_chat(ctx, anthropic_to_openai(body));
  const Tokenizer& tok = ctx.tokenizer();
  std::vector<ChoiceText> texts;
  texts.emplace_back(tok, plan.text_options(random_id("toolu_") + "_", 0));
  auto run = std::make_shared<GenerationRun>(*ctx.engine, replicate(plan.request, 1), std::move(texts));
  const auto deadline = generation_deadline(ctx);
  const std::string id = random_id("msg_");
  ex.trace->prompt_tokens = int64_t(plan.request.prompt.size());

  if (!plan.stream) {
    GenerateEvent final_ev;
    const ClientConnection client(ex.req);
    const DriveEnd end = drive(
        *run, deadline, [](int, const GenerateEvent&, const TextDelta&) { return true; },
        [&](int, const GenerateEvent& ev, const TextDelta&) {
          final_ev = ev;
          ctx.metrics.observe_generation(ev);
          return true;
        },
        [&client] { return client.gone(); });
    if (end == DriveEnd::Abandoned) {
      ex.res.status = 499;
      return;
    }
    if (end == DriveEnd::Deadline) throw ApiError(408, "the request timed out");
    throw_if_failed(final_ev);
    const ChoiceText& t = run->text(0);
    json content = json::array();
    if (!t.reasoning().empty()) content.push_back({{"type", "thinking"}, {"thinking", t.reasoning()}, {"signature", ""}});
    if (t.truncated_call()) {
      // Cut off inside a tool call: the output is text, not a call (stop_reason max_tokens).
      content.push_back({{"type", "text"}, {"text", t.text_after_reasoning()}});
    } else {
      if (!t.content().empty()) content.push_back({{"type", "text"}, {"text", t.content()}});
      for (const ParsedToolCall& c : t.tool_calls())
        content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::parse(c.arguments)}});
    }
    ex.trace->completion_tokens = final_ev.n_generated;
    set_json(ex.res, {{"id", id},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", plan.model},
                      {"content", content},
                      {"stop_reason", stop_reason(final_ev, t)},
                      {"stop_sequence", t.stopped() ? json(t.matched_stop()) : json(nullptr)},
                      {"usage", {{"input_tokens", final_ev.n_prompt}, {"output_tokens", final_ev.n_generated},
                                 {"cache_read_input_tokens", final_ev.n_cached}}}});
    return;
  }

  ChoiceEvent first;
  if (!run->peek(first, deadline)) throw ApiError(408, "the request timed out");
  if (first.event.done) throw_if_failed(first.event);
  std::shared_ptr<RequestTrace> trace = ex.trace;
  set_event_stream(ctx, ex, [&ctx, plan, run, deadline, id, trace](httplib::DataSink& sink) {
    // Content blocks are opened as their kind of output starts and closed when another
    // kind begins: thinking, then text, then one tool_use block per call.
    int block = -1;
    std::string open_kind;  // "thinking" | "text" | "tool_use" | ""
    auto write = [&](const char* event, const json& payload) { return sse_write(sink, sse_event(event, payload)); };
    auto close_block = [&] {
      if (open_kind.empty()) return true;
      open_kind.clear();
      return write("content_block_stop", {{"type", "content_block_stop"}, {"index", block}});
    };
    auto open_block = [&](const std::string& kind, const json& start) {
      if (!close_block()) return false;
      open_kind = kind;
      ++block;
      return write("content_block_start", {{"type", "content_block_start"}, {"index", block}, {"content_block", start}});
    };
    auto emit = [&](const TextDelta& d) {
      if (!d.reasoning.empty()) {
        if (open_kind != "thinking" && !open_block("thinking", {{"type", "thinking"}, {"thinking", ""}})) return false;
        if (!write("content_block_delta", {{"type", "content_block_delta"}, {"index", block},
                                           {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}}))
          return false;
      }
      if (!d.content.empty()) {
        if (open_kind != "text" && !open_block("text", {{"type", "text"}, {"text", ""}})) return false;
        if (!write("content_block_delta", {{"type", "content_block_delta"}, {"index", block},
                                           {"delta", {{"type", "text_delta"}, {"text", d.content}}}}))
          return false;
      }
      for (const OutputDelta& o : d.tool_calls) {
        if (o.kind == OutputDelta::Kind::ToolCallStart) {
          if (!open_block("tool_use", {{"type", "tool_use"}, {"id", o.tool_id}, {"name", o.tool_name}, {"input", json::object()}}))
            return false;
        } else if (!write("content_block_delta", {{"type", "content_block_delta"}, {"index", block},
                                                  {"delta", {{"type", "input_json_delta"}, {"partial_json", o.text}}}})) {
          return false;
        }
      }
      return true;
    };
    GenerateEvent final_ev;
    auto on_token = [&](int, const GenerateEvent&, const TextDelta& d) { return emit(d); };
    auto on_done = [&](int, const GenerateEvent& ev, const TextDelta& d) {
      final_ev = ev;
      ctx.metrics.observe_generation(ev);
      trace->completion_tokens = ev.n_generated;
      return emit(d);
    };
    bool ok = write("message_start", {{"type", "message_start"},
                                      {"message", {{"id", id}, {"type", "message"}, {"role", "assistant"},
                                                   {"model", plan.model}, {"content", json::array()},
                                                   {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                                   {"usage", {{"input_tokens", int(plan.request.prompt.size())},
                                                              {"output_tokens", 0}}}}}});
    if (ok) ok = drive(*run, deadline, on_token, on_done) == DriveEnd::Finished;
    if (ok) ok = close_block();
    if (ok && (final_ev.reason == FinishReason::Error || final_ev.reason == FinishReason::Timeout))
      ok = write("error", {{"type", "error"},
                           {"error", {{"type", final_ev.reason == FinishReason::Timeout ? "timeout_error" : "api_error"},
                                      {"message", final_ev.reason == FinishReason::Timeout ? "the request timed out"
                                                                                           : final_ev.error}}}});
    const ChoiceText& t = run->text(0);
    if (ok)
      ok = write("message_delta", {{"type", "message_delta"},
                                   {"delta", {{"stop_reason", stop_reason(final_ev, t)},
                                              {"stop_sequence", t.stopped() ? json(t.matched_stop()) : json(nullptr)}}},
                                   {"usage", {{"output_tokens", final_ev.n_generated}}}});
    if (ok) write("message_stop", {{"type", "message_stop"}});
    if (!ok) run->cancel_all();
    sink.done();
  });
}

// POST /v1/messages/count_tokens: the prompt the request would run, counted.
void handle_count_tokens(ServerContext& ctx, const json& body, HttpExchange& ex) {
  json chat = anthropic_to_openai(body, true);
  chat["max_tokens"] = 1;
  const ChatPlan plan = plan_chat(ctx, chat);
  set_json(ex.res, {{"input_tokens", plan.request.prompt.size()}});
}

}  // namespace step35::server
