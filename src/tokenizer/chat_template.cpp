// Native renderers for the two chat formats step35 GGUFs carry (see chat_template.h).
#include "tokenizer/chat_template.h"

#include <stdexcept>

namespace step35 {

namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Step 3.5's tool-call markup (§6): one <tool_call> block per call, objects and arrays as
// JSON, scalars as plain text.
std::string render_tool_call(const ChatToolCall& call) {
  std::string s = "<tool_call>\n<function=" + call.name + ">\n";
  if (call.arguments.is_object()) {
    for (const auto& [k, v] : call.arguments.items()) {
      s += "<parameter=" + k + ">\n";
      s += v.is_string() ? v.get<std::string>() : json_text(v);
      s += "\n</parameter>\n";
    }
  }
  return s + "</function>\n</tool_call>";
}

const char* kToolInstructions =
    "When you decide to call a function, write the call in this exact form, with one "
    "<parameter> block per argument:\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter>\nvalue\n</parameter>\n"
    "</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nA call must follow that form exactly and name only the functions listed above; "
    "give every required parameter; put any explanation before the call, never after it; if no "
    "function fits, answer without one.\n</IMPORTANT>";

}  // namespace

ChatTemplate::ChatTemplate(const std::string& jinja_source, std::string bos_text) : bos_text_(std::move(bos_text)) {
  const bool step35_markers = jinja_source.find("<think>") != std::string::npos ||
                              jinja_source.find("You have access to the following functions in JSONSchema format") !=
                                  std::string::npos;
  // An empty template means the model's own format. A template with ChatML markers and
  // none of Step 3.5's is rendered as plain ChatML (the fixtures' template).
  format_ = jinja_source.empty() || step35_markers ? ChatFormat::STEP35 : ChatFormat::CHATML;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt) const {
  for (const auto& m : messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      throw std::invalid_argument("unknown message role '" + m.role + "' (expected system, user, assistant or tool)");
  if (!tools.is_null() && !tools.is_array()) throw std::invalid_argument("'tools' must be an array");

  std::string out;
  if (format_ == ChatFormat::CHATML) {
    for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }

  // Step 3.5 (§6).
  out = bos_text_;
  size_t first = 0;
  const bool has_tools = tools.is_array() && !tools.empty();
  if (has_tools || (!messages.empty() && messages[0].role == "system")) {
    out += "<|im_start|>system\n";
    if (!messages.empty() && messages[0].role == "system") {
      out += trim(messages[0].content);
      first = 1;
      if (has_tools) out += "\n\n";
    }
    if (has_tools) {
      out += "# Tools\n\nYou have access to the following functions in JSONSchema format:\n\n<tools>";
      for (const auto& t : tools) {
        if (!t.is_object()) throw std::invalid_argument("each entry of 'tools' must be an object");
        const nlohmann::json& fn = t.contains("function") ? t["function"] : t;
        if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
          throw std::invalid_argument("each tool needs a function with a string 'name'");
        out += "\n" + json_text(fn);
      }
      out += "\n</tools>\n\n";
      out += kToolInstructions;
    }
    out += "<|im_end|>\n";
  }
  // Reasoning is kept only for assistant turns after the last user message.
  size_t last_user = 0;
  bool any_user = false;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") last_user = i, any_user = true;

  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      out += "<|im_start|>tool_response\n";
      for (; i < messages.size() && messages[i].role == "tool"; ++i)
        out += "<tool_response>" + trim(messages[i].content) + "</tool_response>";
      --i;
      out += "<|im_end|>\n";
      continue;
    }
    if (m.role == "assistant") {
      std::string content = m.content, reasoning = m.reasoning_content;
      const size_t close = content.find("</think>");
      if (close != std::string::npos) {
        if (reasoning.empty()) {
          reasoning = content.substr(0, close);
          const size_t open = reasoning.find("<think>");
          if (open != std::string::npos) reasoning = reasoning.substr(open + 7);
        }
        content = content.substr(close + 8);
      }
      out += "<|im_start|>assistant\n";
      if (!any_user || i > last_user) out += "<think>\n" + trim(reasoning) + "\n</think>\n";
      out += trim(content);
      for (const auto& call : m.tool_calls) out += (out.back() == '\n' ? "" : "\n") + render_tool_call(call);
      out += "<|im_end|>\n";
      continue;
    }
    const std::string role = (m.role == "system" && m.name == "observation") ? "observation" : m.role;
    out += "<|im_start|>" + role + "\n" + trim(m.content) + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n<think>\n";
  return out;
}

std::vector<ChatMessage> ChatTemplate::messages_from_json(const nlohmann::json& messages) {
  if (!messages.is_array()) throw std::invalid_argument("'messages' must be an array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& j = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!j.is_object()) throw std::invalid_argument(where + " must be an object");
    if (!j.contains("role") || !j["role"].is_string()) throw std::invalid_argument(where + ".role must be a string");
    ChatMessage m;
    m.role = j["role"].get<std::string>();
    if (m.role == "developer") m.role = "system";
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      throw std::invalid_argument(where + ".role '" + m.role + "' is not one of system, user, assistant, tool");
    if (j.contains("content") && !j["content"].is_null()) {
      const auto& c = j["content"];
      if (c.is_string()) {
        m.content = c.get<std::string>();
      } else if (c.is_array()) {
        for (const auto& part : c) {
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            throw std::invalid_argument(where + ".content parts must be objects with a 'type'");
          const std::string type = part["type"];
          if (type == "text") {
            if (!part.contains("text") || !part["text"].is_string())
              throw std::invalid_argument(where + ".content text part needs a string 'text'");
            m.content += part["text"].get<std::string>();
          } else if (type == "image_url" || type == "image") {
            m.content += "<im_patch>";
          } else {
            throw std::invalid_argument(where + ".content part type '" + type + "' is not supported");
          }
        }
      } else {
        throw std::invalid_argument(where + ".content must be a string, an array of parts, or null");
      }
    }
    if (j.contains("reasoning_content") && j["reasoning_content"].is_string())
      m.reasoning_content = j["reasoning_content"].get<std::string>();
    if (j.contains("name") && j["name"].is_string()) m.name = j["name"].get<std::string>();
    if (j.contains("tool_calls") && !j["tool_calls"].is_null()) {
      if (!j["tool_calls"].is_array()) throw std::invalid_argument(where + ".tool_calls must be an array");
      for (const auto& tc : j["tool_calls"]) {
        const nlohmann::json& fn = tc.is_object() && tc.contains("function") ? tc["function"] : tc;
        if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
          throw std::invalid_argument(where + ".tool_calls entries need function.name");
        ChatToolCall call;
        call.name = fn["name"].get<std::string>();
        if (fn.contains("arguments")) {
          const auto& a = fn["arguments"];
          if (a.is_string()) {
            call.arguments = nlohmann::json::parse(a.get<std::string>(), nullptr, false);
            if (call.arguments.is_discarded() || !call.arguments.is_object())
              throw std::invalid_argument(where + ".tool_calls arguments must be a JSON object");
          } else if (a.is_object()) {
            call.arguments = a;
          } else {
            throw std::invalid_argument(where + ".tool_calls arguments must be an object or a JSON string");
          }
        } else {
          call.arguments = nlohmann::json::object();
        }
        m.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace step35
