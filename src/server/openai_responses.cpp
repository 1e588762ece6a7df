// POST /v1/responses: OpenAI's Responses API (what Codex and the OpenAI Agents SDK speak).
// The body is mapped to the chat shape and planned like a chat request; the answer is a
// list of output items (reasoning, message, function calls), streamed as Responses events
// (`event: response.output_text.delta` ...). Responses are kept in memory for
// `previous_response_id` (response_store.h) unless `store` is false.
#include <algorithm>
#include <optional>

#include "server/api_error.h"
#include "server/chat_images.h"
#include "server/chat_plan.h"
#include "server/endpoint.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/sse.h"
#include "server/streaming.h"

namespace step35::server {

using nlohmann::json;

namespace {

// The text of one content part (input_text, output_text, refusal); `pw` names it.
std::string part_text(const json& p, const std::string& pw, const std::string& where) {
  const std::string type = p.is_object() ? p.value("type", "") : "";
  if (type == "input_text" || type == "output_text" || type == "text") {
    if (!p.contains("text") || !p["text"].is_string()) throw ApiError(400, "'" + pw + ".text' must be a string", where);
    return p["text"].get<std::string>();
  }
  if (type == "refusal") return p.value("refusal", "");
  throw ApiError(400, "'" + pw + "': content part type '" + type + "' is not supported here", where);
}

// The text of a message's content: a string, or input_text / output_text parts.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, "'" + where + "' must be a string or an array of content parts", where);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) out += part_text(content[i], where + "[" + std::to_string(i) + "]", where);
  return out;
}

bool is_input_image(const json& p) { return p.is_object() && p.value("type", "") == "input_image"; }

// A user or system message's content: its text, or with input_image parts, the chat parts
// in order (text parts, image_url parts; server/chat_images.h reads the pictures).
json message_content(const json& content, const std::string& where) {
  if (!content.is_array() || std::none_of(content.begin(), content.end(), is_input_image))
    return content_text(content, where);
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const json& p = content[i];
    const std::string pw = where + "[" + std::to_string(i) + "]";
    if (!is_input_image(p)) {
      parts.push_back({{"type", "text"}, {"text", part_text(p, pw, where)}});
      continue;
    }
    const json url = p.contains("image_url") ? p["image_url"] : json();
    if (!url.is_string())
      throw ApiError(400, "'" + pw + ".image_url' must be a URL string (a data: URL, or http(s) on a server started with "
                     "--allow-image-urls; file_id is not supported)", pw + ".image_url");
    parts.push_back(image_url_part(url.get<std::string>()));
  }
  return parts;
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
      if (role == "assistant") {
        json m = {{"role", "assistant"}, {"content", content_text(item["content"], where + ".content")}};
        if (!pending_reasoning.empty()) m["reasoning_content"] = pending_reasoning;
        pending_reasoning.clear();
        messages.push_back(m);
      } else {
        messages.push_back({{"role", role == "developer" ? "system" : role},
                            {"content", message_content(item["content"], where + ".content")}});
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

// The conversation the chat request renders: instructions, the stored turns of
// previous_response_id, this turn's input.
json conversation(ServerContext& ctx, const std::optional<std::string>& instructions, const ResponsesRequest& out) {
  json messages = json::array();
  if (instructions) messages.push_back({{"role", "system"}, {"content", *instructions}});
  if (!out.previous_id.empty()) {
    auto earlier = ctx.responses.conversation(out.previous_id);
    if (!earlier)
      throw ApiError(400, "previous response '" + out.previous_id +
                              "' is not stored (unknown, evicted, or from before a restart)",
                     "previous_response_id");
    for (const json& m : *earlier) messages.push_back(m);
  }
  for (const json& m : out.new_messages) messages.push_back(m);
  if (messages.empty()) throw ApiError(400, "'input' holds no message", "input");
  return messages;
}

// tools, tool_choice, parallel_tool_calls and max_tool_calls in chat terms.
void tool_fields(const Fields& f, json& chat) {
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
}

// reasoning (-> reasoning_effort) and text.format (-> response_format); returns what the
// response echoes of them: {"reasoning", "text"}.
json reasoning_and_text_fields(const Fields& f, json& chat) {
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
  return {{"reasoning", reasoning_echo}, {"text", text_echo}};
}

// The request's settings as the response object repeats them.
json response_echo(const ServerContext& ctx, const Fields& f, const std::optional<std::string>& instructions,
                   const ResponsesRequest& out, const json& reasoning_and_text) {
  auto given = [&](const char* k, json otherwise) { return f.has(k) ? f.raw(k) : std::move(otherwise); };
  return {{"instructions", instructions ? json(*instructions) : json(nullptr)},
          {"max_output_tokens", given("max_output_tokens", nullptr)},
          {"parallel_tool_calls", f.boolean("parallel_tool_calls").value_or(true)},
          {"previous_response_id", out.previous_id.empty() ? json(nullptr) : json(out.previous_id)},
          {"reasoning", reasoning_and_text["reasoning"]},
          {"store", out.store},
          {"temperature", given("temperature", ctx.options.sampling.temperature)},
          {"top_p", given("top_p", ctx.options.sampling.top_p)},
          {"text", reasoning_and_text["text"]},
          {"tool_choice", given("tool_choice", "auto")},
          {"tools", given("tools", json::array())},
          {"truncation", f.string("truncation").value_or("disabled")},
          {"metadata", given("metadata", json::object())},
          {"user", given("user", nullptr)},
          {"max_tool_calls", given("max_tool_calls", nullptr)},
          {"background", false},
          {"service_tier", "default"}};
}

}  // namespace

ResponsesRequest responses_to_openai(ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
          "max_tool_calls", "temperature", "top_p", "top_logprobs", "stream", "stream_options", "reasoning", "text",
          "store", "metadata", "previous_response_id", "user", "service_tier", "truncation", "include", "background",
          "prompt_cache_key", "safety_identifier", "conversation", "prompt"});
  ResponsesRequest out;
  if (!f.has("input")) throw ApiError(400, "'input' is required", "input");
  out.new_messages = input_messages(f.raw("input"));
  out.previous_id = f.string("previous_response_id").value_or("");
  out.store = f.boolean("store").value_or(true);
  if (f.boolean("background").value_or(false))
    throw ApiError(400, "'background' responses are not supported", "background");
  if (f.has("conversation"))
    throw ApiError(400, "'conversation' objects are not supported (use previous_response_id)", "conversation");
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
  const auto instructions = f.string("instructions");
  json& chat = out.chat;
  chat = json::object();
  if (auto model = f.string("model")) chat["model"] = *model;
  chat["messages"] = conversation(ctx, instructions, out);
  tool_fields(f, chat);
  if (f.has("max_output_tokens")) chat["max_tokens"] = f.raw("max_output_tokens");
  for (const char* k : {"temperature", "top_p", "stream"})
    if (f.has(k)) chat[k] = f.raw(k);
  const json reasoning_and_text = reasoning_and_text_fields(f, chat);
  out.echo = response_echo(ctx, f, instructions, out, reasoning_and_text);
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

// One response in the making: its ids, what it echoes, and how it is finished (stored
// unless store is false). Counts its reasoning tokens from the deltas: the tokens
// generated while the reasoning was still open.
class ResponseBuilder {
 public:
  ResponseBuilder(ServerContext& ctx, ResponsesRequest rq, const ChatPlan& plan)
      : ctx_(ctx), rq_(std::move(rq)), model_(plan.model), reasoning_open_(plan.in_reasoning) {}

  void count(const TextDelta& d) {
    if (reasoning_open_ && d.content.empty() && d.tool_calls.empty()) ++reasoning_tokens_;
    if (!d.content.empty() || !d.tool_calls.empty()) reasoning_open_ = false;
  }

  json in_progress() const { return response_object(id_, created_, model_, rq_, "in_progress", json::array(), nullptr, nullptr); }

  json finish(const ChoiceText& t, const GenerateEvent& ev, const std::vector<std::string>& call_item_ids) {
    const bool incomplete = ev.reason == FinishReason::Length || ev.reason == FinishReason::Context;
    const ResponseOutput o = build_output(t, reasoning_id_, message_id_, call_item_ids, incomplete);
    const json details = incomplete ? json{{"reason", "max_output_tokens"}} : json(nullptr);
    json r = response_object(id_, created_, model_, rq_, incomplete ? "incomplete" : "completed", o.items,
                             usage_of(ev, reasoning_tokens_), details);
    if (rq_.store) {
      json turn = rq_.new_messages;
      turn.push_back(o.assistant);
      ctx_.responses.put(id_, {rq_.previous_id, turn, r});
    }
    return r;
  }

  const std::string& reasoning_id() const { return reasoning_id_; }
  const std::string& message_id() const { return message_id_; }

 private:
  ServerContext& ctx_;
  ResponsesRequest rq_;
  std::string model_;
  std::string id_ = random_id("resp_"), reasoning_id_ = random_id("rs_"), message_id_ = random_id("msg_");
  int64_t created_ = unix_time();
  bool reasoning_open_;
  size_t reasoning_tokens_ = 0;
};

// The Responses event stream: response.created / in_progress, then the output items as
// their kind of output starts (reasoning, the message, one function_call per call), each
// opened, filled with deltas and closed, then response.completed / incomplete / failed.
// Every event carries its type and a sequence number.
class ResponsesStream final : public FinalEventWriter {
 public:
  explicit ResponsesStream(std::shared_ptr<ResponseBuilder> builder) : b_(std::move(builder)) {}

  bool begin(httplib::DataSink& sink) override {
    const json r = b_->in_progress();
    return write(sink, "response.created", {{"response", r}}) && write(sink, "response.in_progress", {{"response", r}});
  }

  bool token(httplib::DataSink& sink, int, const GenerateEvent&, const TextDelta& d) override {
    b_->count(d);
    return emit(sink, d);
  }

  bool end(httplib::DataSink& sink) override {
    if (!close_item(sink)) return false;
    if (final_.reason == FinishReason::Error || final_.reason == FinishReason::Timeout) {
      json failed = b_->in_progress();
      failed["status"] = "failed";
      failed["error"] = {{"code", final_.reason == FinishReason::Timeout ? "timeout" : "server_error"},
                         {"message", final_.reason == FinishReason::Timeout ? "the request timed out" : final_.error}};
      return write(sink, "response.failed", {{"response", failed}});
    }
    const json r = b_->finish(*text_, final_, call_item_ids_);
    return write(sink, r["status"] == "incomplete" ? "response.incomplete" : "response.completed", {{"response", r}});
  }

 private:
  bool write(httplib::DataSink& sink, const char* type, json payload) {
    payload["type"] = type;
    payload["sequence_number"] = sequence_++;
    return sse_write(sink, sse_event(type, payload));
  }

  static json message_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
  }

  bool close_item(httplib::DataSink& sink) {
    if (open_kind_.empty()) return true;
    const std::string kind = std::move(open_kind_);
    open_kind_.clear();
    const json at = {{"output_index", index_}, {"content_index", 0}};
    if (kind == "reasoning") {
      const json part = {{"type", "reasoning_text"}, {"text", reasoning_text_}};
      return write(sink, "response.reasoning_text.done", with(at, {{"item_id", b_->reasoning_id()}, {"text", reasoning_text_}})) &&
             write(sink, "response.content_part.done", with(at, {{"item_id", b_->reasoning_id()}, {"part", part}})) &&
             write(sink, "response.output_item.done",
                   {{"output_index", index_},
                    {"item", {{"id", b_->reasoning_id()}, {"type", "reasoning"}, {"summary", json::array()},
                              {"content", json::array({part})}, {"status", "completed"}}}});
    }
    if (kind == "message") {
      const json part = message_part(message_text_);
      return write(sink, "response.output_text.done",
                   with(at, {{"item_id", b_->message_id()}, {"text", message_text_}, {"logprobs", json::array()}})) &&
             write(sink, "response.content_part.done", with(at, {{"item_id", b_->message_id()}, {"part", part}})) &&
             write(sink, "response.output_item.done",
                   {{"output_index", index_},
                    {"item", {{"id", b_->message_id()}, {"type", "message"}, {"status", "completed"},
                              {"role", "assistant"}, {"content", json::array({part})}}}});
    }
    return write(sink, "response.function_call_arguments.done",
                 {{"item_id", call_item_id_}, {"output_index", index_}, {"name", call_name_}, {"arguments", call_arguments_}}) &&
           write(sink, "response.output_item.done",
                 {{"output_index", index_},
                  {"item", {{"id", call_item_id_}, {"type", "function_call"}, {"status", "completed"},
                            {"call_id", call_id_}, {"name", call_name_}, {"arguments", call_arguments_}}}});
  }

  bool open_item(httplib::DataSink& sink, const std::string& kind, const json& item) {
    if (!close_item(sink)) return false;
    open_kind_ = kind;
    ++index_;
    if (!write(sink, "response.output_item.added", {{"output_index", index_}, {"item", item}})) return false;
    const json at = {{"output_index", index_}, {"content_index", 0}};
    if (kind == "reasoning")
      return write(sink, "response.content_part.added",
                   with(at, {{"item_id", b_->reasoning_id()}, {"part", {{"type", "reasoning_text"}, {"text", ""}}}}));
    if (kind == "message")
      return write(sink, "response.content_part.added", with(at, {{"item_id", b_->message_id()}, {"part", message_part("")}}));
    return true;
  }

  static json with(json a, const json& b) {
    for (auto it = b.begin(); it != b.end(); ++it) a[it.key()] = it.value();
    return a;
  }

  bool emit(httplib::DataSink& sink, const TextDelta& d) override {
    const json at = {{"content_index", 0}};
    if (!d.reasoning.empty()) {
      if (open_kind_ != "reasoning" &&
          !open_item(sink, "reasoning", {{"id", b_->reasoning_id()}, {"type", "reasoning"}, {"summary", json::array()},
                                         {"content", json::array()}, {"status", "in_progress"}}))
        return false;
      reasoning_text_ += d.reasoning;
      if (!write(sink, "response.reasoning_text.delta",
                 with(at, {{"item_id", b_->reasoning_id()}, {"output_index", index_}, {"delta", d.reasoning}})))
        return false;
    }
    if (!d.content.empty()) {
      if (open_kind_ != "message" &&
          !open_item(sink, "message", {{"id", b_->message_id()}, {"type", "message"}, {"status", "in_progress"},
                                       {"role", "assistant"}, {"content", json::array()}}))
        return false;
      message_text_ += d.content;
      if (!write(sink, "response.output_text.delta",
                 with(at, {{"item_id", b_->message_id()}, {"output_index", index_}, {"delta", d.content},
                           {"logprobs", json::array()}})))
        return false;
    }
    for (const OutputDelta& o : d.tool_calls) {
      if (o.kind == OutputDelta::Kind::ToolCallStart) {
        call_item_id_ = random_id("fc_");
        call_item_ids_.push_back(call_item_id_);
        call_id_ = o.tool_id;
        call_name_ = o.tool_name;
        call_arguments_.clear();
        if (!open_item(sink, "function_call", {{"id", call_item_id_}, {"type", "function_call"}, {"status", "in_progress"},
                                               {"call_id", call_id_}, {"name", call_name_}, {"arguments", ""}}))
          return false;
      } else {
        call_arguments_ += o.text;
        if (!write(sink, "response.function_call_arguments.delta",
                   {{"item_id", call_item_id_}, {"output_index", index_}, {"delta", o.text}}))
          return false;
      }
    }
    return true;
  }

  std::shared_ptr<ResponseBuilder> b_;
  int sequence_ = 0;
  int index_ = -1;          // output_index of the open item
  std::string open_kind_;   // "reasoning" | "message" | "function_call" | ""
  std::string reasoning_text_, message_text_, call_arguments_, call_item_id_, call_id_, call_name_;
  std::vector<std::string> call_item_ids_;
};

}  // namespace

namespace {

// The chat body's messages and tools for the template, tools in the client's key order
// (from the body as sent, `ordered`; chat_tools checked them). Call arguments are JSON
// strings in the Responses API, parsed in their own order when rendered.
nlohmann::ordered_json ordered_chat(const json& chat, const nlohmann::ordered_json& ordered) {
  using ordered_json = nlohmann::ordered_json;
  ordered_json out = ordered_json::object();
  out["messages"] = ordered_json(chat["messages"]);
  if (chat.contains("tools") && ordered.contains("tools") && ordered["tools"].is_array()) {
    ordered_json tools = ordered_json::array();
    for (const ordered_json& t : ordered["tools"]) {
      ordered_json fn = ordered_json::object();
      fn["name"] = t["name"];
      if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
      fn["parameters"] = t.contains("parameters") && t["parameters"].is_object() ? t["parameters"] : ordered_json::object();
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    out["tools"] = std::move(tools);
  }
  return out;
}

}  // namespace

void handle_responses(ServerContext& ctx, const json& body, HttpExchange& ex) {
  ResponsesRequest rq = responses_to_openai(ctx, body);
  const nlohmann::ordered_json ordered = ex.ordered_body ? ordered_chat(rq.chat, *ex.ordered_body) : nullptr;
  const ChatPlan plan = plan_chat(ctx, rq.chat, ex.ordered_body ? &ordered : nullptr);
  std::vector<ChoiceText> texts;
  texts.emplace_back(ctx.tokenizer(), plan.text_options(random_id("call_") + "_", 0));
  auto gen = std::make_shared<Generation>(ctx, ex, plan.request, 1, std::move(texts));
  auto builder = std::make_shared<ResponseBuilder>(ctx, std::move(rq), plan);
  if (plan.stream) return stream(gen, ex, std::make_shared<ResponsesStream>(builder));
  const GenerateEvent final_ev = gen->collect(ex, [&](int, const GenerateEvent&, const TextDelta& d) {
    builder->count(d);
    return true;
  })[0];
  set_json(ex.res, builder->finish(gen->text(0), final_ev, {}));
}

}  // namespace step35::server
