// POST /v1/messages: Anthropic's Messages API (what Claude Code-style agents speak). The
// body is mapped to the OpenAI chat shape and planned like a chat request; the answer is
// a message of content blocks (thinking, text, tool_use), streamed as Anthropic's named
// SSE events.
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

// An image block's picture as a URL: its base64 source as a data: URL, a url source as
// given (fetched only by a server started with --allow-image-urls).
std::string image_source_url(const json& block, const std::string& where) {
  const json src = block.contains("source") ? block["source"] : json();
  const std::string type = src.is_object() && src.contains("type") && src["type"].is_string() ? src["type"].get<std::string>() : "";
  if (type == "base64" && src.contains("data") && src["data"].is_string() && src.contains("media_type") &&
      src["media_type"].is_string())
    return "data:" + src["media_type"].get<std::string>() + ";base64," + src["data"].get<std::string>();
  if (type == "url" && src.contains("url") && src["url"].is_string()) return src["url"].get<std::string>();
  throw ApiError(400, "'" + where + "': an image block needs a source {\"type\": \"base64\", \"media_type\", \"data\"}",
                 where);
}

const char* stop_reason(const GenerateEvent& ev, const ChoiceText& t) {
  if (t.stopped()) return "stop_sequence";
  if (!t.tool_calls().empty() && ev.reason == FinishReason::Stop) return "tool_use";
  return ev.reason == FinishReason::Stop ? "end_turn" : "max_tokens";
}

}  // namespace

namespace {

// One Anthropic message in chat messages: text blocks join, thinking becomes the
// assistant's reasoning, tool_use blocks its calls, each tool_result a tool message.
void add_message(const json& message, const std::string& where, json& messages) {
  Fields m(message, where + ".");
  m.only({"role", "content"});
  const std::string role = m.choice("role", {"user", "assistant"}).value_or("");
  if (role.empty()) throw ApiError(400, "'" + where + ".role' is required", where + ".role");
  if (!m.has("content")) throw ApiError(400, "'" + where + ".content' is required", where + ".content");
  const json& content = m.raw("content");
  if (content.is_string()) {
    messages.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array()) throw ApiError(400, "'" + where + ".content' must be a string or an array", where + ".content");
  std::string text, thinking;
  json calls = json::array();
  // A user turn with pictures: its text and image_url parts in order (the text so far is
  // the next text part).
  json parts = json::array();
  const auto flush_user = [&] {
    if (!text.empty() && !parts.empty()) parts.push_back({{"type", "text"}, {"text", text}});
    if (!parts.empty()) messages.push_back({{"role", "user"}, {"content", parts}});
    else if (!text.empty()) messages.push_back({{"role", "user"}, {"content", text}});
    text.clear();
    parts = json::array();
  };
  // A block's string member ("" when absent); any other type is the client's error.
  const auto member = [&](const json& b, const char* key) -> std::string {
    if (!b.contains(key) || b[key].is_null()) return "";
    if (!b[key].is_string()) throw ApiError(400, "'" + where + "': a block's '" + key + "' must be a string", where);
    return b[key].get<std::string>();
  };
  for (const json& b : content) {
    const std::string type = b.is_object() ? member(b, "type") : "";
    if (type == "text") {
      text += member(b, "text");
    } else if (type == "thinking" && role == "assistant") {
      thinking += member(b, "thinking");
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("name") || !b["name"].is_string() || !b.contains("input") || !b["input"].is_object())
        throw ApiError(400, "'" + where + "': tool_use blocks need a name and an input object", where);
      calls.push_back({{"id", member(b, "id")}, {"type", "function"},
                       {"function", {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
    } else if (type == "image" && role == "user") {
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
      text.clear();
      parts.push_back(image_url_part(image_source_url(b, where)));
    } else if (type == "tool_result" && role == "user") {
      flush_user();
      const json rc = b.contains("content") ? b["content"] : json("");
      messages.push_back({{"role", "tool"}, {"tool_call_id", member(b, "tool_use_id")},
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
  } else {
    flush_user();
  }
}

// tools and tool_choice in chat terms (disable_parallel_tool_use: one call at most).
void tool_fields(const Fields& f, json& out) {
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
}

// Extended thinking: a budget for the reasoning, or none at all.
void thinking_field(const Fields& f, json& out) {
  const json* thinking = f.object("thinking");
  if (!thinking) return;
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
  thinking_field(f, out);
  for (const char* k : {"temperature", "top_p", "top_k", "stream"})
    if (f.has(k)) out[k] = f.raw(k);
  auto stops = f.strings_or_string("stop_sequences", 4);
  if (!stops.empty()) out["stop"] = stops;
  json messages = json::array();
  if (f.has("system")) messages.push_back({{"role", "system"}, {"content", block_text(f.raw("system"), "system")}});
  const json* msgs = f.array("messages");
  if (!msgs || msgs->empty()) throw ApiError(400, "'messages' must be a non-empty array", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) add_message((*msgs)[i], "messages[" + std::to_string(i) + "]", messages);
  // A last assistant message is a prefill: the answer continues it.
  if (msgs->back().is_object() && msgs->back().value("role", "") == "assistant") {
    out["continue_final_message"] = true;
    out["add_generation_prompt"] = false;
  }
  out["messages"] = messages;
  tool_fields(f, out);
  return out;
}

namespace {

// Anthropic's named events: message_start, content blocks opened as their kind of output
// starts and closed when another kind begins (thinking, then text, then one tool_use block
// per call), an error event for a failed generation, message_delta and message_stop.
class MessageStream final : public FinalEventWriter {
 public:
  MessageStream(std::string id, std::string model, int n_prompt)
      : id_(std::move(id)), model_(std::move(model)), n_prompt_(n_prompt) {}

  bool begin(httplib::DataSink& sink) override {
    return write(sink, "message_start",
                 {{"type", "message_start"},
                  {"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_},
                               {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                               {"usage", {{"input_tokens", n_prompt_}, {"output_tokens", 0}}}}}});
  }

  bool end(httplib::DataSink& sink) override {
    if (!close_block(sink)) return false;
    if (final_.reason == FinishReason::Error || final_.reason == FinishReason::Timeout) {
      const bool timeout = final_.reason == FinishReason::Timeout;
      if (!write(sink, "error", {{"type", "error"},
                                 {"error", {{"type", timeout ? "timeout_error" : "api_error"},
                                            {"message", timeout ? "the request timed out" : final_.error}}}}))
        return false;
    }
    if (!write(sink, "message_delta",
               {{"type", "message_delta"},
                {"delta", {{"stop_reason", stop_reason(final_, *text_)},
                           {"stop_sequence", text_->stopped() ? json(text_->matched_stop()) : json(nullptr)}}},
                {"usage", {{"output_tokens", final_.n_generated}}}}))
      return false;
    return write(sink, "message_stop", {{"type", "message_stop"}});
  }

 private:
  static bool write(httplib::DataSink& sink, const char* event, const json& payload) {
    return sse_write(sink, sse_event(event, payload));
  }
  bool close_block(httplib::DataSink& sink) {
    if (open_kind_.empty()) return true;
    open_kind_.clear();
    return write(sink, "content_block_stop", {{"type", "content_block_stop"}, {"index", block_}});
  }
  bool open_block(httplib::DataSink& sink, const std::string& kind, const json& start) {
    if (!close_block(sink)) return false;
    open_kind_ = kind;
    ++block_;
    return write(sink, "content_block_start", {{"type", "content_block_start"}, {"index", block_}, {"content_block", start}});
  }
  bool delta(httplib::DataSink& sink, const json& d) {
    return write(sink, "content_block_delta", {{"type", "content_block_delta"}, {"index", block_}, {"delta", d}});
  }
  bool emit(httplib::DataSink& sink, const TextDelta& d) override {
    if (!d.reasoning.empty()) {
      if (open_kind_ != "thinking" && !open_block(sink, "thinking", {{"type", "thinking"}, {"thinking", ""}})) return false;
      if (!delta(sink, {{"type", "thinking_delta"}, {"thinking", d.reasoning}})) return false;
    }
    if (!d.content.empty()) {
      if (open_kind_ != "text" && !open_block(sink, "text", {{"type", "text"}, {"text", ""}})) return false;
      if (!delta(sink, {{"type", "text_delta"}, {"text", d.content}})) return false;
    }
    for (const OutputDelta& o : d.tool_calls) {
      if (o.kind == OutputDelta::Kind::ToolCallStart) {
        if (!open_block(sink, "tool_use",
                        {{"type", "tool_use"}, {"id", o.tool_id}, {"name", o.tool_name}, {"input", json::object()}}))
          return false;
      } else if (!delta(sink, {{"type", "input_json_delta"}, {"partial_json", o.text}})) {
        return false;
      }
    }
    return true;
  }

  std::string id_, model_;
  int n_prompt_;
  int block_ = -1;
  std::string open_kind_;  // "thinking" | "text" | "tool_use" | ""
};

}  // namespace

nlohmann::ordered_json anthropic_ordered_chat(const json& chat, const nlohmann::ordered_json& anthropic) {
  using ordered_json = nlohmann::ordered_json;
  ordered_json out = ordered_json::object();
  out["messages"] = chat.contains("messages") ? ordered_json(chat["messages"]) : ordered_json::array();
  // Tools: one per Anthropic tool, in its order (tool_fields checked them).
  if (chat.contains("tools") && anthropic.contains("tools") && anthropic["tools"].is_array()) {
    ordered_json tools = ordered_json::array();
    for (const ordered_json& t : anthropic["tools"]) {
      ordered_json fn = ordered_json::object();
      fn["name"] = t["name"];
      fn["description"] = t.contains("description") && t["description"].is_string() ? t["description"] : ordered_json("");
      fn["parameters"] = t.contains("input_schema") ? t["input_schema"] : ordered_json::object();
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    out["tools"] = std::move(tools);
  }
  // Tool-call arguments: add_message turns the tool_use blocks into calls one for one, in
  // order, so the k-th call's arguments are the k-th block's input.
  std::vector<const ordered_json*> inputs;
  if (anthropic.contains("messages") && anthropic["messages"].is_array())
    for (const ordered_json& m : anthropic["messages"])
      if (m.is_object() && m.contains("content") && m["content"].is_array())
        for (const ordered_json& b : m["content"])
          if (b.is_object() && b.value("type", "") == "tool_use" && b.contains("input")) inputs.push_back(&b["input"]);
  size_t k = 0;
  for (ordered_json& m : out["messages"])
    if (m.contains("tool_calls"))
      for (ordered_json& call : m["tool_calls"])
        if (k < inputs.size()) call["function"]["arguments"] = *inputs[k++];
  return out;
}

void handle_messages(ServerContext& ctx, const json& body, HttpExchange& ex) {
  const json chat = anthropic_to_openai(body);
  const nlohmann::ordered_json ordered = ex.ordered_body ? anthropic_ordered_chat(chat, *ex.ordered_body) : nullptr;
  ChatPlan plan = plan_chat(ctx, chat, ex.ordered_body ? &ordered : nullptr);
  const Tokenizer& tok = ctx.tokenizer();
  std::vector<ChoiceText> texts;
  texts.emplace_back(tok, plan.text_options(random_id("toolu_") + "_", 0));
  auto gen = std::make_shared<Generation>(ctx, ex, plan.request, 1, std::move(texts));
  const std::string id = random_id("msg_");
  if (plan.stream)
    return stream(gen, ex, std::make_shared<MessageStream>(id, plan.model, int(plan.request.prompt.size())));
  const GenerateEvent final_ev = gen->collect(ex, [](int, const GenerateEvent&, const TextDelta&) { return true; })[0];
  const ChoiceText& t = gen->text(0);
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
  set_json(ex.res, {{"id", id},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", plan.model},
                    {"content", content},
                    {"stop_reason", stop_reason(final_ev, t)},
                    {"stop_sequence", t.stopped() ? json(t.matched_stop()) : json(nullptr)},
                    {"usage", {{"input_tokens", final_ev.n_prompt}, {"output_tokens", final_ev.n_generated},
                               {"cache_read_input_tokens", final_ev.n_cached}}}});
}

// POST /v1/messages/count_tokens: the prompt the request would run, counted.
void handle_count_tokens(ServerContext& ctx, const json& body, HttpExchange& ex) {
  json chat = anthropic_to_openai(body, true);
  chat["max_tokens"] = 1;
  const nlohmann::ordered_json ordered = ex.ordered_body ? anthropic_ordered_chat(chat, *ex.ordered_body) : nullptr;
  const ChatPlan plan = plan_chat(ctx, chat, ex.ordered_body ? &ordered : nullptr);
  set_json(ex.res, {{"input_tokens", plan.request.prompt.size()}});
}

}  // namespace step35::server
