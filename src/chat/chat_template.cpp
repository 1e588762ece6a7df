// Native renderers for the chat formats step35 GGUFs carry (see chat_template.h).
//
// STEP35 follows the rules of the Step 3.5 Flash Jinja template (§6 of
// ../shared/docs/step35-model.md) as rendered by HF transformers / llama.cpp:
//   * tool definitions and object/array arguments are JSON in Python's json.dumps style
//     (", " and ": " separators, non-ASCII kept), which is what the template's `tojson` gives;
//   * scalar arguments use Python's str() (`| string`): True/False/None for JSON
//     true/false/null;
//   * every message content is whitespace-trimmed first (llama.cpp does this for the
//     template because leftover whitespace triggers reasoning loops).
// Known difference: nlohmann::json keeps object keys sorted, so tool-call arguments (and
// tools passed as nlohmann::json) render in key order, not in the client's order; pass
// tools as nlohmann::ordered_json to keep theirs.
#include "chat/chat_template.h"

#include <stdexcept>
#include <string_view>

namespace step35 {

namespace {

using nlohmann::json;

bool is_known_role(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ascii_space(s[b])) ++b;
  while (e > b && is_ascii_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Scalars (and object keys) as JSON text; invalid UTF-8 becomes U+FFFD instead of throwing.
template <class Json>
std::string json_scalar(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Python json.dumps(x, ensure_ascii=False): ", " between items, ": " after keys; objects in
// the container's own key order.
template <class Json>
void append_python_json(const Json& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += json_scalar(Json(it.key()));
      out += ": ";
      append_python_json(it.value(), out);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ", ";
      append_python_json(j[i], out);
    }
    out += ']';
  } else {
    out += json_scalar(j);
  }
}

template <class Json>
std::string python_json(const Json& j) {
  std::string out;
  append_python_json(j, out);
  return out;
}

// A tool-call argument value: objects and arrays as JSON, scalars as Python's str().
std::string argument_text(const json& v) {
  if (v.is_object() || v.is_array()) return python_json(v);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return json_scalar(v);  // numbers
}

// The call-format instructions that close the tools section when the template does not
// carry its own (see extract_tool_instructions).
const char* const kDefaultToolInstructions =
    "To call a function, answer with the call alone, nothing after it, in exactly this form "
    "(one <parameter> block per argument; a value may span several lines):\n\n"
    "<tool_call>\n<function=function_name>\n<parameter=first_argument>\nvalue\n</parameter>\n"
    "<parameter=second_argument>\na value\nover two lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n"
    "- Each <function=...>\n...\n</function> block goes inside its own <tool_call>\n...\n</tool_call> tags\n"
    "- Always give the required parameters\n"
    "</IMPORTANT>";

// The Step 3.5 template writes its instruction paragraph as one string literal between
// `</tools>\n\n` and `<|im_end|>`. Taking it from the GGUF's own template keeps the prompt
// identical to the one the model was trained with; "" when the source has no such literal.
std::string extract_tool_instructions(const std::string& src) {
  const std::string open = "</tools>\\n\\n";
  const size_t a = src.find(open);
  if (a == std::string::npos) return "";
  const size_t begin = a + open.size();
  const size_t end = src.find("<|im_end|>", begin);
  if (end == std::string::npos) return "";
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    const char c = src[i];
    if (c == '"' || c == '\'' || c == '{' || c == '}' || c == '%') return "";  // left the literal
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i >= end) return "";
    switch (src[i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case '\\': out += '\\'; break;
      case '"': out += '"'; break;
      case '\'': out += '\''; break;
      default: return "";
    }
  }
  return out;
}

// Validates the tool list and writes each entry as one JSON line.
template <class Json>
std::vector<std::string> tool_lines(const Json& tools) {
  std::vector<std::string> lines;
  if (tools.is_null()) return lines;
  if (!tools.is_array()) throw std::invalid_argument("tools must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw std::invalid_argument(where + " must be an object");
    // OpenAI shape {"type":"function","function":{"name":..}}, or the bare function object.
    const Json& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string() ||
        fn["name"].template get<std::string>().empty())
      throw std::invalid_argument(where + " needs a function object with a non-empty string 'name'");
    lines.push_back(python_json(t));  // the whole entry, as the template's `tool | tojson`
  }
  return lines;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& jinja_source, std::string bos_text)
    : bos_text_(std::move(bos_text)) {
  // Step 3.5's template is recognised by its generation prompt opening a think block or by
  // its tools header; an empty template means the model's own format. Everything else,
  // ChatML templates ("<|im_start|>") and unrecognised ones alike, is rendered as ChatML,
  // the format every other template seen in step35 GGUFs (the fixtures') uses.
  const bool think_prompt = jinja_source.find("assistant\\n<think>") != std::string::npos ||
                            jinja_source.find("assistant\n<think>") != std::string::npos;
  const bool tools_header =
      jinja_source.find("You have access to the following functions in JSONSchema format") != std::string::npos;
  format_ = (jinja_source.empty() || think_prompt || tools_header) ? ChatFormat::STEP35 : ChatFormat::CHATML;
  if (format_ == ChatFormat::STEP35) tool_instructions_ = extract_tool_instructions(jinja_source);
  if (tool_instructions_.empty()) tool_instructions_ = kDefaultToolInstructions;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt) const {
  return render_lines(messages, tool_lines(tools), add_generation_prompt);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt) const {
  return render_lines(messages, tool_lines(tools), add_generation_prompt);
}

std::string ChatTemplate::render_lines(const std::vector<ChatMessage>& messages,
                                       const std::vector<std::string>& tools, bool add_generation_prompt) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!is_known_role(messages[i].role))
      throw std::invalid_argument("message " + std::to_string(i) + " has unknown role '" + messages[i].role +
                                  "' (expected system, user, assistant or tool)");
  }
  std::string out;
  if (format_ == ChatFormat::CHATML) {
    // Plain ChatML renders roles and contents only (tools, reasoning and tool calls have
    // no place in it).
    for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }

  const size_t n = messages.size();
  std::vector<std::string> content(n);
  for (size_t i = 0; i < n; ++i) content[i] = trim(messages[i].content);

  out = bos_text_;
  const bool has_tools = !tools.empty();
  const bool first_is_system = n > 0 && messages[0].role == "system";
  if (has_tools) {
    out += "<|im_start|>system\n";
    if (first_is_system) out += content[0] + "\n\n";
    out += "# Tools\n\nYou have access to the following functions in JSONSchema format:\n\n<tools>";
    for (const std::string& t : tools) out += "\n" + t;
    out += "\n</tools>\n\n";
    out += tool_instructions_;
    out += "<|im_end|>\n";
  } else if (first_is_system) {
    out += "<|im_start|>system\n" + content[0] + "<|im_end|>\n";
  }

  // The last real user query: a user message that is not just wrapped tool output.
  // Assistant turns after it keep their reasoning; earlier ones drop it.
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t k = n; k-- > 0;) {
    if (messages[k].role == "user" &&
        !(starts_with(content[k], "<tool_response>") && ends_with(content[k], "</tool_response>"))) {
      last_query = k;
      break;
    }
  }

  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      const std::string role = (m.role == "system" && m.name == "observation") ? "observation" : m.role;
      out += "<|im_start|>" + role + "\n" + content[i] + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view text = content[i];
      std::string reasoning;
      if (!m.reasoning_content.empty()) {
        reasoning = m.reasoning_content;
      } else {
        // Reasoning inline: before the first </think> (after the last <think> there),
        // content after the last </think>.
        const size_t close = text.find("</think>");
        if (close != std::string_view::npos) {
          std::string_view r = rstrip_newlines(text.substr(0, close));
          const size_t open = r.rfind("<think>");
          if (open != std::string_view::npos) r = r.substr(open + 7);
          reasoning = std::string(lstrip_newlines(r));
          text = lstrip_newlines(text.substr(text.rfind("</think>") + 8));
        }
      }
      out += "<|im_start|>assistant\n";
      if (i > last_query) out += "<think>\n" + reasoning + "\n</think>\n";
      out += text;
      for (const ChatToolCall& call : m.tool_calls) {
        if (call.name.empty())
          throw std::invalid_argument("message " + std::to_string(i) + " has a tool call without a name");
        if (!call.arguments.is_null() && !call.arguments.is_object())
          throw std::invalid_argument("message " + std::to_string(i) + ": arguments of tool call '" + call.name +
                                      "' must be an object");
        out += "<tool_call>\n<function=" + call.name + ">\n";
        if (call.arguments.is_object()) {
          for (auto it = call.arguments.begin(); it != call.arguments.end(); ++it)
            out += "<parameter=" + it.key() + ">\n" + argument_text(it.value()) + "\n</parameter>\n";
        }
        out += "</function>\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      // Consecutive tool results share one tool_response turn.
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>tool_response\n";
      out += "<tool_response>" + content[i] + "</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // The first message, when it is a system message, was rendered above.
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n<think>\n";
  return out;
}

std::vector<ChatMessage> ChatTemplate::messages_from_json(const nlohmann::json& messages) {
  if (!messages.is_array()) throw std::invalid_argument("messages must be an array");
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& j = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!j.is_object()) throw std::invalid_argument(where + " must be an object");
    ChatMessage m;

    if (!j.contains("role") || !j["role"].is_string())
      throw std::invalid_argument(where + " needs a string 'role'");
    m.role = j["role"].get<std::string>();
    if (m.role == "developer") m.role = "system";  // OpenAI's newer name for system
    if (!is_known_role(m.role))
      throw std::invalid_argument(where + ".role '" + m.role + "' is not one of system, user, assistant, tool");

    if (j.contains("content")) {
      const json& c = j["content"];
      if (c.is_string()) {
        m.content = c.get<std::string>();
      } else if (c.is_array()) {
        for (size_t k = 0; k < c.size(); ++k) {
          const json& part = c[k];
          const std::string pw = where + ".content[" + std::to_string(k) + "]";
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            throw std::invalid_argument(pw + " must be an object with a string 'type'");
          const std::string type = part["type"].get<std::string>();
          if (type != "text")
            throw std::invalid_argument(pw + " has type '" + type + "'; only text parts are supported");
          if (!part.contains("text") || !part["text"].is_string())
            throw std::invalid_argument(pw + " (a text part) needs a string 'text'");
          m.content += part["text"].get<std::string>();
        }
      } else if (!c.is_null()) {
        throw std::invalid_argument(where + ".content must be a string, an array of parts or null");
      }
    }

    if (j.contains("reasoning_content") && !j["reasoning_content"].is_null()) {
      if (!j["reasoning_content"].is_string())
        throw std::invalid_argument(where + ".reasoning_content must be a string");
      m.reasoning_content = j["reasoning_content"].get<std::string>();
    }
    if (j.contains("name") && !j["name"].is_null()) {
      if (!j["name"].is_string()) throw std::invalid_argument(where + ".name must be a string");
      m.name = j["name"].get<std::string>();
    }

    if (j.contains("tool_calls") && !j["tool_calls"].is_null()) {
      const json& calls = j["tool_calls"];
      if (!calls.is_array()) throw std::invalid_argument(where + ".tool_calls must be an array");
      for (size_t k = 0; k < calls.size(); ++k) {
        const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
        const json& tc = calls[k];
        if (!tc.is_object()) throw std::invalid_argument(cw + " must be an object");
        if (tc.contains("type") && !(tc["type"].is_string() && tc["type"].get<std::string>() == "function"))
          throw std::invalid_argument(cw + ".type must be \"function\"");
        // OpenAI shape {"function":{"name","arguments"}}, or name/arguments at the top.
        const json& fn = tc.contains("function") ? tc["function"] : tc;
        if (!fn.is_object()) throw std::invalid_argument(cw + ".function must be an object");
        if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
          throw std::invalid_argument(cw + " needs a non-empty string function name");
        ChatToolCall call;
        call.name = fn["name"].get<std::string>();
        call.arguments = json::object();
        if (fn.contains("arguments") && !fn["arguments"].is_null()) {
          const json& a = fn["arguments"];
          if (a.is_object()) {
            call.arguments = a;
          } else if (a.is_string()) {
            const std::string s = a.get<std::string>();
            if (!trim(s).empty()) {  // "" is sent by some clients for a call without arguments
              json parsed = json::parse(s, nullptr, /*allow_exceptions=*/false);
              if (parsed.is_discarded())
                throw std::invalid_argument(cw + ".arguments is a string but not valid JSON");
              if (!parsed.is_object())
                throw std::invalid_argument(cw + ".arguments must encode a JSON object");
              call.arguments = std::move(parsed);
            }
          } else {
            throw std::invalid_argument(cw + ".arguments must be an object or a JSON string");
          }
        }
        m.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace step35
