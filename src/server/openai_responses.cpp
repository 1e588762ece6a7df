// POST /v1/responses: OpenAI's Responses API (what Codex and the OpenAI Agents SDK speak).
// The body is mapped to the chat shape and planned like a chat request; the answer is a
// list of output items (reasoning, message, function calls), streamed as Responses events
// (`event: response.output_text.delta` ...). Responses are kept in memory for
// `previous_response_id` (response_store.h) unless `store` is false.
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

// The text of a message's content: a string, or input_text / output_text parts.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, "'" + where + "' must be a string or an array of content parts", where);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& p = content[i];
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if (type == "input_text" || type == "output_text" || type == "text") {
      if (!p.contains("text") || !p["text"].is_string())
        throw ApiError(400, "'" + where + "[" + std::to_string(i) + "].text' must be a string", where);
      out += p["text"].get<std::string>();
    } else if (type == "refusal") {
      out += p.value("refusal", "");
    } else {
      throw ApiError(400, "'" + where + "[" + std::to_string(i) + "]': content part type '" + type +
                              "' is not supported (the model reads text only)", where);
    }
  }
  return out;
}

// The input items as chat messages. Reasoning items attach to the assistant turn that
// follows them; consecutive function calls share one assistant turn.
json input_messages(const json& input) {
  json messages = json::array();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array()) throw ApiError(400, "'input' must be a string or an array of items", "input");
  std::string pending_reasoning;
  auto assistant_turn = [&]() -> json& {
    if (messages.empty() || messages.back()["role"] != "assistant") messages.push_back({{"role", "assistant"}, {"content", ""}});
    json& m = messages.back();
    if (!pending_reasoning.empty()) {
      m["reasoning_content"] = pending_reasoning;
      pending_reasoning.clear();
    }
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) throw ApiError(400, "'" + where + "' must be an object", where);
    const std::string type = item.value("type", item.contains("role") ? "message" : "");
    if (type == "message") {
      const std::string role = item.value("role", "");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        throw ApiError(400, "'" + where + ".role' must be user, system, developer or assistant", where + ".role");
      if (!item.contains("content")) throw ApiError(400, "'" + where + ".content' is required", where + ".content");
      const std::string text = content_text(item["content"], where + ".content");
      if (role == "assistant") {
        json m = {{"role", "assistant"}, {"content", text}};
        if (!pending_reasoning.empty()) m["reasoning_content"] = pending_reasoning;
        pending_reasoning.clear();
        messages.push_back(m);
      } else {
        messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
      }
    } else if (type == "function_call") {
      if (!item.contains("name") || !item["name"].is_string())
        throw ApiError(400, "'" + where + ".name' must be a string", where + ".name");
      const std::string arguments = item.contains("arguments") && item["arguments"].is_string()
                                        ? item["arguments"].get<std::string>()
                                        : std::string("{}");
      json& m = assistant_turn();
      if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
      m["tool_calls"].push_back({{"id", item.value("call_id", "")},
                                 {"type", "function"},
                                 {"function", {{"name", item["name"]}, {"arguments", arguments}}}});
    } else if (type == "function_call_output") {
      const json output = item.contains("output") ? item["output"] : json("");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", item.value("call_id", "")},
                          {"content", output.is_string() ? output.get<std::string>()
                                                         : content_text(output, where + ".output")}});
    } else if (type == "reasoning") {
      if (item.contains("content") && item["content"].is_array())
        for (const json& c : item["content"])
          if (c.is_object() && c.value("type", "") == "reasoning_text") pending_reasoning += c.value("text", "");
      if (pending_reasoning.empty() && item.contains("summary") && item["summary"].is_array())
        for (const json& c : item["summary"])
          if (c.is_object()) pending_reasoning += c.value("text", "");
    } else {
      throw ApiError(400, "'" + where + "': item type '" + type + "' is not supported", where + ".type");
    }
  }
  return messages;
}

// Responses function tools ({type, name, description, parameters, strict}) in the chat
// shape.
json chat_tools(const json& tools) {
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    const std::string type = t.is_object() ? t.value("type", "") : "";
    if (type != "function")
      throw ApiError(400, "'" + where + "': tool type '" + type + "' is not supported (function tools only)", where);
    if (!t.contains("name") || !t["name"].is_string()) throw ApiError(400, "'" + where + ".name' must be a string", where);
    json fn = {{"name", t["name"]}};
    if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
    fn["parameters"] = t.contains("parameters") && t["parameters"].is_object() ? t["parameters"] : json::object();
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

}  // namespace

ResponsesRequest responses_to_openai(ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
          "max_tool_calls", "temperature", "top_p", "top_logprobs", "stream", "stream_options", "reasoning", "text",
          "store", "metadata", "previous_response_id", "user", "service_tier", "truncation", "include", "background",
          "prompt_cache_key", "safety_identifier", "conversation", "prompt"});
  ResponsesRequest out;
  json& chat = out.chat;
  chat = json::object();
  if (auto model = f.string("model")) chat["model"] = *model;
  if (!f.has("input")) throw ApiError(400, "'input' is required", "input");
  out.new_messages = input_messages(f.raw("input"));
  out.previous_id = f.string("previous_response_id").value_or("");
  out.store = f.boolean("store").value_or(true);
  if (f.boolean("background").value_or(false))
    throw ApiError(400, "'background' responses are not supported", "background");
  if (f.has("conversation")) throw ApiError(400, "'conversation' objects are not supported (use previous_response_id)", "conversation");
  if (f.has("prompt")) throw ApiError(400, "reusable 'prompt' templates are not supported", "prompt");
  // Accepted and ignored (docs/server.md).
  for (const char* k : {"user", "service_tier", "prompt_cache_key", "safety_identifier"}) f.string(k);
  f.object("metadata");
  f.array("include");
  f.choice("truncation", {"auto", "disabled"});
  f.integer("top_logprobs", 0, 20);
  if (const json* so = f.object("stream_options")) {
    Fields s(*so, "stream_options.");
    s.only({"include_obfuscation"});
    s.boolean("include_obfuscation");
  }

  json messages = json::array();
  const auto instructions = f.string("instructions");
  if (instructions) messages.push_back({{"role", "system"}, {"content", *instructions}});
  if (!out.previous_id.empty()) {
    auto earlier = ctx.responses.conversation(out.previous_id);
    if (!earlier)
      throw ApiError(400, "previous response '" + out.previous_id + "' is not stored (unknown, evicted, or from before a restart)",
                     "previous_response_id");
    for (const json& m : *earlier) messages.push_back(m);
  }
  for (const json& m : out.new_messages) messages.push_back(m);
  if (messages.empty()) throw ApiError(400, "'input' holds no message", "input");
  chat["messages"] = messages;
  if (const json* tools = f.array("tools"); tools && !tools->empty()) chat["tools"] = chat_tools(*tools);
  if (f.has("tool_choice")) {
    const json& tc = f.raw("tool_choice");
    if (tc.is_string()) {
      chat["tool_choice"] = f.choice("tool_choice", {"none", "auto", "required"}).value_or("auto");
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") && tc["name"].is_string()) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      throw ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or {\"type\":\"function\",\"name\":...}",
                     "tool_choice");
    }
    if (!chat.contains("tools")) chat.erase("tool_choice");
  }
  if (auto p = f.boolean("parallel_tool_calls")) chat["parallel_tool_calls"] = *p;
  if (auto m = f.integer("max_tool_calls", 1, 1 << 20); m && *m == 1) chat["parallel_tool_calls"] = false;
  if (f.has("max_output_tokens")) chat["max_tokens"] = f.raw("max_output_tokens");
  for (const char* k : {"temperature", "top_p", "stream"})
    if (f.has(k)) chat[k] = f.raw(k);
  json reasoning_echo = {{"effort", nullptr}, {"summary", nullptr}};
  if (const json* r = f.object("reasoning")) {
    Fields rf(*r, "reasoning.");
    rf.only({"effort", "summary", "generate_summary"});
    if (auto effort = rf.choice("effort", {"none", "minimal", "low", "medium", "high", "xhigh"})) {
      chat["reasoning_effort"] = *effort;
      reasoning_echo["effort"] = *effort;
    }
    rf.choice("summary", {"auto", "concise", "detailed"});
    rf.choice("generate_summary", {"auto", "concise", "detailed"});
  }
  json text_echo = {{"format", {{"type", "text"}}}};
  if (const json* t = f.object("text")) {
    Fields tf(*t, "text.");
    tf.only({"format", "verbosity"});
    tf.choice("verbosity", {"low", "medium", "high"});
    if (const json* fmt = tf.object("format")) {
      Fields ff(*fmt, "text.format.");
      ff.only({"type", "name", "schema", "strict", "description"});
      const std::string type = ff.choice("type", {"text", "json_object", "json_schema"}).value_or("text");
      if (type == "json_object") chat["response_format"] = {{"type", "json_object"}};
      if (type == "json_schema") {
        if (!ff.has("schema")) throw ApiError(400, "'text.format.schema' is required", "text.format.schema");
        json js = {{"name", ff.string("name").value_or("output")}, {"schema", ff.raw("schema")}};
        if (auto strict = ff.boolean("strict")) js["strict"] = *strict;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      }
      text_echo["format"] = *fmt;
    }
  }
  out.echo = {{"instructions", instructions ? json(*instructions) : json(nullptr)},
              {"max_output_tokens", f.has("max_output_tokens") ? f.raw("max_output_tokens") : json(nullptr)},
              {"parallel_tool_calls", f.boolean("parallel_tool_calls").value_or(true)},
              {"previous_response_id", out.previous_id.empty() ? json(nullptr) : json(out.previous_id)},
              {"reasoning", reasoning_echo},
              {"store", out.store},
              {"temperature", f.has("temperature") ? f.raw("temperature") : json(ctx.options.sampling.temperature)},
              {"top_p", f.has("top_p") ? f.raw("top_p") : json(ctx.options.sampling.top_p)},
              {"text", text_echo},
              {"tool_choice", f.has("tool_choice") ? f.raw("tool_choice") : json("auto")},
              {"tools", f.has("tools") ? f.raw("tools") : json::array()},
              {"truncation", f.string("truncation").value_or("disabled")},
              {"metadata", f.has("metadata") ? f.raw("metadata") : json::object()},
              {"user", f.has("user") ? f.raw("user") : json(nullptr)},
              {"max_tool_calls", f.has("max_tool_calls") ? f.raw("max_tool_calls") : json(nullptr)},
              {"background", false},
              {"service_tier", "default"}};
  return out;
}

namespace {

// The output items of one finished generation, and the assistant message that stands for
// them in a stored conversation.
struct ResponseOutput {
  json items = json::array();
  std::string text;
  json assistant;  // chat message
};

ResponseOutput build_output(const ChoiceText& t, const std::string& reasoning_id, const std::string& message_id,
                            const std::vector<std::string>& call_item_ids, bool incomplete) {
  ResponseOutput o;
  const char* status = incomplete ? "incomplete" : "completed";
  if (!t.reasoning().empty())
    o.items.push_back({{"id", reasoning_id},
                       {"type", "reasoning"},
                       {"summary", json::array()},
                       {"content", json::array({{{"type", "reasoning_text"}, {"text", t.reasoning()}}})},
                       {"status", status}});
  const auto calls = t.tool_calls();
  o.text = t.truncated_call() ? t.text_after_reasoning() : t.content();
  if (!o.text.empty() || calls.empty() || t.truncated_call())
    o.items.push_back({{"id", message_id},
                       {"type", "message"},
                       {"status", status},
                       {"role", "assistant"},
                       {"content", json::array({{{"type", "output_text"},
                                                 {"text", o.text},
                                                 {"annotations", json::array()},
                                                 {"logprobs", json::array()}}})}});
  o.assistant = {{"role", "assistant"}, {"content", o.text}};
  if (!t.reasoning().empty()) o.assistant["reasoning_content"] = t.reasoning();
  if (!t.truncated_call() && !calls.empty()) {
    json tc = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      const ParsedToolCall& c = calls[i];
      o.items.push_back({{"id", i < call_item_ids.size() ? call_item_ids[i] : random_id("fc_")},
                         {"type", "function_call"},
                         {"status", "completed"},
                         {"call_id", c.id},
                         {"name", c.name},
                         {"arguments", c.arguments}});
      tc.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    o.assistant["tool_calls"] = tc;
  }
  return o;
}

// (No `output_text`: OpenAI's clients compute it from the output items, and only when the
// object does not carry one.)
json response_object(const std::string& id, int64_t created, const std::string& model, const ResponsesRequest& rq,
                     const char* status, const json& output, const json& usage, const json& incomplete_details) {
  json r = {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", incomplete_details},
            {"model", model},
            {"output", output},
            {"usage", usage}};
  for (auto it = rq.echo.begin(); it != rq.echo.end(); ++it) r[it.key()] = it.value();
  return r;
}

json usage_of(const GenerateEvent& ev, size_t reasoning_tokens) {
  return {{"input_tokens", ev.n_prompt},
          {"input_tokens_details", {{"cached_tokens", ev.n_cached}}},
          {"output_tokens", ev.n_generated},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", ev.n_prompt + ev.n_generated}};
}

void throw_if_failed(const GenerateEvent& ev) {
  if (ev.reason == FinishReason::Timeout) throw ApiError(408, "the request timed out");
  if (ev.reason == FinishReason::Error) throw ApiError(500, "generation failed: " + ev.error);
}

}  // namespace

void handle_responses(ServerContext& ctx, const json& body, HttpExchange& ex) {
  ResponsesRequest rq = responses_to_openai(ctx, body);
  ChatPlan plan = plan_chat(ctx, rq.chat);
  const Tokenizer& tok = ctx.tokenizer();
  std::vector<ChoiceText> texts;
  texts.emplace_back(tok, plan.text_options(random_id("call_") + "_", 0));
  auto run = std::make_shared<GenerationRun>(*ctx.engine, replicate(plan.request, 1), std::move(texts));
  const auto deadline = generation_deadline(ctx);
  const std::string id = random_id("resp_");
  const std::string reasoning_id = random_id("rs_"), message_id = random_id("msg_");
  const int64_t created = unix_time();
  ex.trace->prompt_tokens = int64_t(plan.request.prompt.size());
  // Reasoning tokens: the tokens generated before the reasoning ended.
  auto reasoning_tokens = std::make_shared<size_t>(0);
  auto count_reasoning = [reasoning_tokens](const TextDelta& d, bool reasoning_open) {
    if (reasoning_open || !d.reasoning.empty()) ++*reasoning_tokens;
  };

  // The finished response: stored (unless store is false) and returned.
  auto finish = [&ctx, rq, id, created, plan, reasoning_id, message_id, reasoning_tokens](
                    const ChoiceText& t, const GenerateEvent& ev, const std::vector<std::string>& call_ids) {
    const bool incomplete = ev.reason == FinishReason::Length || ev.reason == FinishReason::Context;
    const ResponseOutput o = build_output(t, reasoning_id, message_id, call_ids, incomplete);
    const json details = incomplete ? json{{"reason", "max_output_tokens"}} : json(nullptr);
    json r = response_object(id, created, plan.model, rq, incomplete ? "incomplete" : "completed", o.items,
                             usage_of(ev, *reasoning_tokens), details);
    if (rq.store) {
      json turn = rq.new_messages;
      turn.push_back(o.assistant);
      ctx.responses.put(id, {rq.previous_id, turn, r});
    }
    return r;
  };

  if (!plan.stream) {
    GenerateEvent final_ev;
    bool reasoning_open = plan.in_reasoning;
    const ClientConnection client(ex.req);
    const DriveEnd end = drive(
        *run, deadline,
        [&](int, const GenerateEvent&, const TextDelta& d) {
          count_reasoning(d, reasoning_open && d.content.empty() && d.tool_calls.empty());
          if (!d.content.empty() || !d.tool_calls.empty()) reasoning_open = false;
          return true;
        },
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
    ex.trace->completion_tokens = final_ev.n_generated;
    set_json(ex.res, finish(run->text(0), final_ev, {}));
    return;
  }

  ChoiceEvent first;
  if (!run->peek(first, deadline)) throw ApiError(408, "the request timed out");
  if (first.event.done) throw_if_failed(first.event);
  std::shared_ptr<RequestTrace> trace = ex.trace;
  set_event_stream(ctx, ex, [&ctx, plan, run, deadline, id, created, rq, reasoning_id, message_id, trace, finish,
                             count_reasoning](httplib::DataSink& sink) {
    int sequence = 0;
    auto write = [&](const char* type, json payload) {
      payload["type"] = type;
      payload["sequence_number"] = sequence++;
      return sse_write(sink, sse_event(type, payload));
    };
    const json in_progress =
        response_object(id, created, plan.model, rq, "in_progress", json::array(), nullptr, nullptr);
    bool ok = write("response.created", {{"response", in_progress}}) &&
              write("response.in_progress", {{"response", in_progress}});
    // Output items open as their kind of output starts: reasoning, then the message, then
    // one function_call item per call.
    int output_index = -1;
    std::string open_kind;  // "reasoning" | "message" | "function_call" | ""
    std::string reasoning_text, message_text, call_arguments, call_item_id, call_id, call_name;
    std::vector<std::string> call_item_ids;
    auto close_item = [&]() {
      if (open_kind.empty()) return true;
      const std::string kind = open_kind;
      open_kind.clear();
      if (kind == "reasoning") {
        const json part = {{"type", "reasoning_text"}, {"text", reasoning_text}};
        return write("response.reasoning_text.done", {{"item_id", reasoning_id}, {"output_index", output_index},
                                                      {"content_index", 0}, {"text", reasoning_text}}) &&
               write("response.content_part.done", {{"item_id", reasoning_id}, {"output_index", output_index},
                                                    {"content_index", 0}, {"part", part}}) &&
               write("response.output_item.done",
                     {{"output_index", output_index},
                      {"item", {{"id", reasoning_id}, {"type", "reasoning"}, {"summary", json::array()},
                                {"content", json::array({part})}, {"status", "completed"}}}});
      }
      if (kind == "message") {
        const json part = {{"type", "output_text"}, {"text", message_text}, {"annotations", json::array()},
                           {"logprobs", json::array()}};
        return write("response.output_text.done", {{"item_id", message_id}, {"output_index", output_index},
                                                   {"content_index", 0}, {"text", message_text},
                                                   {"logprobs", json::array()}}) &&
               write("response.content_part.done", {{"item_id", message_id}, {"output_index", output_index},
                                                    {"content_index", 0}, {"part", part}}) &&
               write("response.output_item.done",
                     {{"output_index", output_index},
                      {"item", {{"id", message_id}, {"type", "message"}, {"status", "completed"}, {"role", "assistant"},
                                {"content", json::array({part})}}}});
      }
      return write("response.function_call_arguments.done", {{"item_id", call_item_id}, {"output_index", output_index},
                                                             {"name", call_name}, {"arguments", call_arguments}}) &&
             write("response.output_item.done",
                   {{"output_index", output_index},
                    {"item", {{"id", call_item_id}, {"type", "function_call"}, {"status", "completed"},
                              {"call_id", call_id}, {"name", call_name}, {"arguments", call_arguments}}}});
    };
    auto open_item = [&](const std::string& kind, const json& item) {
      if (!close_item()) return false;
      open_kind = kind;
      ++output_index;
      if (!write("response.output_item.added", {{"output_index", output_index}, {"item", item}})) return false;
      if (kind == "reasoning")
        return write("response.content_part.added", {{"item_id", reasoning_id}, {"output_index", output_index},
                                                     {"content_index", 0},
                                                     {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
      if (kind == "message")
        return write("response.content_part.added",
                     {{"item_id", message_id}, {"output_index", output_index}, {"content_index", 0},
                      {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()},
                                {"logprobs", json::array()}}}});
      return true;
    };
    auto emit = [&](const TextDelta& d) {
      if (!d.reasoning.empty()) {
        if (open_kind != "reasoning" &&
            !open_item("reasoning", {{"id", reasoning_id}, {"type", "reasoning"}, {"summary", json::array()},
                                     {"content", json::array()}, {"status", "in_progress"}}))
          return false;
        reasoning_text += d.reasoning;
        if (!write("response.reasoning_text.delta", {{"item_id", reasoning_id}, {"output_index", output_index},
                                                     {"content_index", 0}, {"delta", d.reasoning}}))
          return false;
      }
      if (!d.content.empty()) {
        if (open_kind != "message" &&
            !open_item("message", {{"id", message_id}, {"type", "message"}, {"status", "in_progress"},
                                   {"role", "assistant"}, {"content", json::array()}}))
          return false;
        message_text += d.content;
        if (!write("response.output_text.delta", {{"item_id", message_id}, {"output_index", output_index},
                                                  {"content_index", 0}, {"delta", d.content},
                                                  {"logprobs", json::array()}}))
          return false;
      }
      for (const OutputDelta& o : d.tool_calls) {
        if (o.kind == OutputDelta::Kind::ToolCallStart) {
          call_item_id = random_id("fc_");
          call_item_ids.push_back(call_item_id);
          call_id = o.tool_id;
          call_name = o.tool_name;
          call_arguments.clear();
          if (!open_item("function_call", {{"id", call_item_id}, {"type", "function_call"}, {"status", "in_progress"},
                                           {"call_id", call_id}, {"name", call_name}, {"arguments", ""}}))
            return false;
        } else {
          call_arguments += o.text;
          if (!write("response.function_call_arguments.delta",
                     {{"item_id", call_item_id}, {"output_index", output_index}, {"delta", o.text}}))
            return false;
        }
      }
      return true;
    };
    GenerateEvent final_ev;
    bool reasoning_open = plan.in_reasoning;
    auto on_token = [&](int, const GenerateEvent&, const TextDelta& d) {
      count_reasoning(d, reasoning_open && d.content.empty() && d.tool_calls.empty());
      if (!d.content.empty() || !d.tool_calls.empty()) reasoning_open = false;
      return emit(d);
    };
    auto on_done = [&](int, const GenerateEvent& ev, const TextDelta& d) {
      final_ev = ev;
      ctx.metrics.observe_generation(ev);
      trace->completion_tokens = ev.n_generated;
      return emit(d);
    };
    if (ok) ok = drive(*run, deadline, on_token, on_done) == DriveEnd::Finished;
    if (ok) ok = close_item();
    if (ok && (final_ev.reason == FinishReason::Error || final_ev.reason == FinishReason::Timeout)) {
      json failed = in_progress;
      failed["status"] = "failed";
      failed["error"] = {{"code", final_ev.reason == FinishReason::Timeout ? "timeout" : "server_error"},
                         {"message", final_ev.reason == FinishReason::Timeout ? "the request timed out" : final_ev.error}};
      write("response.failed", {{"response", failed}});
    } else if (ok) {
      const json r = finish(run->text(0), final_ev, call_item_ids);
      write(r["status"] == "incomplete" ? "response.incomplete" : "response.completed", {{"response", r}});
    }
    if (!ok) run->cancel_all();
    sink.done();
  });
}

}  // namespace step35::server
