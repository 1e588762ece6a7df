// Chat prompts from the model's own Jinja template (see chat_template.h): the variables
// apply_chat_template passes (messages, tools, documents, add_generation_prompt, the
// special tokens, then the request's chat_template_kwargs), its template choice (the
// `tool_use` variant for a request with tools, when the file has one) and its cut of the
// rendering for continue_final_message.
#include "chat/chat_template.h"

#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "chat/step35_template.h"
#include "gguf/gguf.h"
#include "jinja/template.h"
#include "structured/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace step35 {

namespace {

using ordered_json = nlohmann::ordered_json;

bool is_known_role(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// Python's str.strip() / lstrip() for the whitespace a chat message carries.
std::string_view strip(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}
std::string_view lstrip(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Step 3.5's template is recognised by its generation prompt opening a think block or by
// its tools header; the output parser and the reasoning controls then expect its markers.
ChatFormat detect_format(std::string_view source) {
  const bool think_prompt = source.find("assistant\\n<think>") != std::string_view::npos ||
                            source.find("assistant\n<think>") != std::string_view::npos;
  const bool tools_header =
      source.find("You have access to the following functions in JSONSchema format") != std::string_view::npos;
  return think_prompt || tools_header ? ChatFormat::STEP35 : ChatFormat::CHATML;
}

// Whether a template looks at message contents as lists: it loops over a content or tests
// a content's type (vLLM's "openai" content format, which it detects from the same loops).
bool handles_content_parts(const std::string& source) {
  static const std::regex loop(R"(for\s+\w+\s+in\s+[\w.\['"\]]*content\b)");
  static const std::regex type_test(R"(content\b['"\]]*\s+is\s+(not\s+)?(string|iterable|sequence|mapping))");
  return std::regex_search(source, loop) || std::regex_search(source, type_test);
}

std::shared_ptr<const jinja::Template> parse(std::string_view text, const std::string& origin) {
  try {
    return std::make_shared<const jinja::Template>(text);
  } catch (const jinja::Error& e) {
    throw std::runtime_error(origin + ": " + e.what());
  }
}

// Text of a message content: a string, or the text parts of a list concatenated.
std::string content_text(const ordered_json& c) {
  if (c.is_string()) return c.get<std::string>();
  std::string out;
  if (c.is_array())
    for (const ordered_json& part : c)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
  return out;
}

void check_content(const ordered_json& c, const std::string& where) {
  if (c.is_string() || c.is_null()) return;
  if (!c.is_array()) throw std::invalid_argument(where + ".content must be a string, an array of parts or null");
  for (size_t k = 0; k < c.size(); ++k) {
    const ordered_json& part = c[k];
    const std::string pw = where + ".content[" + std::to_string(k) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw std::invalid_argument(pw + " must be an object with a string 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type != "text") throw std::invalid_argument(pw + " has type '" + type + "'; only text parts are supported");
    if (!part.contains("text") || !part["text"].is_string())
      throw std::invalid_argument(pw + " (a text part) needs a string 'text'");
  }
}

// The arguments of one tool call as the object the template iterates: an object as sent,
// or the object a JSON string encodes (in its own key order).
ordered_json call_arguments(const ordered_json& a, const std::string& cw) {
  if (a.is_null()) return ordered_json::object();
  if (a.is_object()) return a;
  if (!a.is_string()) throw std::invalid_argument(cw + ".arguments must be an object or a JSON string");
  const std::string s = a.get<std::string>();
  if (strip(s).empty()) return ordered_json::object();  // "" is sent by some clients for a call without arguments
  if (grammar::json_text_depth(s, grammar::kMaxJsonTextNesting) > grammar::kMaxJsonTextNesting)
    throw std::invalid_argument(cw + ".arguments nests arrays and objects more than " +
                                std::to_string(grammar::kMaxJsonTextNesting) + " levels deep");
  ordered_json parsed = ordered_json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) throw std::invalid_argument(cw + ".arguments is a string but not valid JSON");
  if (!parsed.is_object()) throw std::invalid_argument(cw + ".arguments must encode a JSON object");
  return parsed;
}

ordered_json normalized_tool_calls(const ordered_json& calls, const std::string& where) {
  if (!calls.is_array()) throw std::invalid_argument(where + ".tool_calls must be an array");
  ordered_json out = calls;
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
    const ordered_json& tc = calls[k];
    if (!tc.is_object()) throw std::invalid_argument(cw + " must be an object");
    if (tc.contains("type") && !(tc["type"].is_string() && tc["type"].get<std::string>() == "function"))
      throw std::invalid_argument(cw + ".type must be \"function\"");
    // OpenAI shape {"function":{"name","arguments"}}, or name/arguments at the top.
    const bool nested = tc.contains("function");
    const ordered_json& fn = nested ? tc["function"] : tc;
    if (!fn.is_object()) throw std::invalid_argument(cw + ".function must be an object");
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      throw std::invalid_argument(cw + " needs a non-empty string function name");
    ordered_json& target = nested ? out[k]["function"] : out[k];
    if (fn.contains("arguments")) target["arguments"] = call_arguments(fn["arguments"], cw);
  }
  return out;
}

// apply_chat_template's cut for continue_final_message: the rendering ends where the
// final message's text (its last text part) does; a template that strips the message is
// matched by the stripped text.
std::string cut_after_final_message(const std::string& rendered, const ordered_json& final_message) {
  const ordered_json& c = final_message.contains("content") ? final_message["content"] : ordered_json();
  std::string final_text;
  if (c.is_array()) {
    bool found = false;
    for (size_t k = c.size(); k-- > 0 && !found;)
      if (c[k].is_object() && c[k].contains("text") && c[k]["text"].is_string()) {
        final_text = c[k]["text"].get<std::string>();
        found = true;
      }
    if (!found) throw std::invalid_argument("continue_final_message: the final message has no text to continue");
  } else {
    final_text = content_text(c);
  }
  // Nothing to continue after but reasoning (apply_chat_template would keep the whole
  // closed turn): continue inside the reasoning, where the template wrote it.
  if (strip(final_text).empty() && final_message.contains("reasoning_content") &&
      final_message["reasoning_content"].is_string() && !strip(final_message["reasoning_content"].get<std::string>()).empty())
    final_text = final_message["reasoning_content"].get<std::string>();
  const std::string_view stripped = strip(final_text);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    throw std::invalid_argument(
        "continue_final_message: the final message does not appear in the rendered chat (the template changes it)");
  if (stripped.size() == final_text.size()) return rendered.substr(0, at + final_text.size());
  const std::string_view left_stripped = lstrip(final_text);
  // The template kept the message's trailing whitespace: keep it too.
  if (std::string_view(rendered).substr(at, left_stripped.size()) == left_stripped)
    return rendered.substr(0, at + left_stripped.size());
  return rendered.substr(0, at + stripped.size());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read chat template file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read chat template file '" + path + "'");
  return text.str();
}

}  // namespace

ChatTemplateSource ChatTemplateSource::from_model(const gguf::File& file, const Tokenizer& tok,
                                                  const std::string& override_path) {
  ChatTemplateSource s;
  s.bos_text = tok.bos() >= 0 ? tok.token_to_piece(tok.bos()) : "";
  s.eos_text = tok.eos() >= 0 ? tok.token_to_piece(tok.eos()) : "";
  if (!override_path.empty()) {
    s.text = read_file(override_path);
    s.origin = override_path;
    if (s.text.empty()) throw std::runtime_error("chat template file '" + override_path + "' is empty");
    return s;
  }
  const std::string key = "tokenizer.chat_template";
  s.text = file.opt_str(key).value_or("");
  s.origin = s.text.empty() ? "the built-in Step 3.5 Flash template" : key + " of " + file.path();
  // Named variants (tokenizer.chat_template.<name>), as the GGUF converter writes a
  // tokenizer_config.json's list of templates.
  for (const auto& [k, v] : file.metadata()) {
    if (!starts_with(k, key + ".") || k.size() == key.size() + 1) continue;
    if (const auto text = file.opt_str(k)) s.named[k.substr(key.size() + 1)] = *text;
  }
  return s;
}

ChatTemplate::ChatTemplate(const ChatTemplateSource& source)
    : origin_(source.origin), bos_text_(source.bos_text), eos_text_(source.eos_text) {
  const std::string_view text = source.text.empty() ? kStep35FlashChatTemplate : std::string_view(source.text);
  source_text_ = std::string(text);
  default_ = parse(text, origin_);
  format_ = detect_format(text);
  reads_enable_thinking_ = text.find("enable_thinking") != std::string_view::npos;
  takes_content_parts_ = handles_content_parts(std::string(text));
  const auto tool_use = source.named.find("tool_use");
  if (tool_use != source.named.end() && !tool_use->second.empty())
    tool_use_ = parse(tool_use->second, origin_ + ".tool_use");
}

ChatTemplate::ChatTemplate(const std::string& jinja_source, std::string bos_text)
    : ChatTemplate([&] {
        ChatTemplateSource s;
        s.text = jinja_source;
        s.bos_text = std::move(bos_text);
        return s;
      }()) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

bool ChatTemplate::starts_with_bos(std::string_view rendered) const {
  return !bos_text_.empty() && starts_with(rendered, bos_text_);
}

void ChatTemplate::flatten_content_parts(ordered_json& messages) const {
  if (takes_content_parts_) return;
  for (ordered_json& m : messages)
    if (m.contains("content") && m["content"].is_array()) m["content"] = content_text(m["content"]);
}

const jinja::Template& ChatTemplate::pick(bool has_tools) const {
  return has_tools && tool_use_ ? *tool_use_ : *default_;
}

std::string ChatTemplate::render(const ordered_json& messages, const ordered_json& tools,
                                 const ChatRenderOptions& options) const {
  if (options.continue_final_message && options.add_generation_prompt)
    throw std::invalid_argument("continue_final_message and add_generation_prompt exclude each other");
  if (!tools.is_null() && !tools.is_array()) throw std::invalid_argument("tools must be an array");
  if (!options.kwargs.is_null() && !options.kwargs.is_object())
    throw std::invalid_argument("chat_template_kwargs must be an object");
  ordered_json vars = ordered_json::object();
  vars["messages"] = normalized_messages(messages);
  flatten_content_parts(vars["messages"]);
  if (options.continue_final_message) {
    const ordered_json& last = vars["messages"].empty() ? ordered_json() : vars["messages"].back();
    if (!last.is_object() || last.value("role", "") != "assistant")
      throw std::invalid_argument("continue_final_message needs the last message to be the assistant's");
  }
  const bool has_tools = tools.is_array() && !tools.empty();
  vars["tools"] = has_tools ? tools : ordered_json();
  vars["documents"] = ordered_json();
  vars["add_generation_prompt"] = options.add_generation_prompt;
  vars["bos_token"] = bos_text_;
  vars["eos_token"] = eos_text_;
  if (options.kwargs.is_object()) {
    for (const auto& [key, value] : options.kwargs.items()) {
      if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt")
        throw std::invalid_argument("chat_template_kwargs cannot set '" + key + "' (a field of the request)");
      vars[key] = value;
    }
  }
  std::string out;
  try {
    out = pick(has_tools).render_json(vars);
  } catch (const jinja::Error& e) {
    throw std::invalid_argument("chat template: " + std::string(e.what()));
  }
  if (options.continue_final_message) return cut_after_final_message(out, vars["messages"].back());
  // Step 3.5's template has no thinking switch: with enable_thinking false its generation
  // prompt gets the empty think block the template writes for an assistant turn without
  // reasoning, so the model goes straight to its answer.
  const bool thinking_off = options.kwargs.is_object() && options.kwargs.contains("enable_thinking") &&
                            options.kwargs["enable_thinking"].is_boolean() &&
                            !options.kwargs["enable_thinking"].get<bool>();
  if (thinking_off && options.add_generation_prompt && format_ == ChatFormat::STEP35 && !reads_enable_thinking_ &&
      ends_with(out, "<think>\n"))
    out += "\n</think>\n";
  return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ordered_json& tools,
                                 bool add_generation_prompt) const {
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  return render(messages_to_json(messages), tools, o);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ordered_json& tools,
                                 const ChatRenderOptions& options) const {
  return render(messages_to_json(messages), tools, options);
}

bool ChatTemplate::opens_reasoning(std::string_view rendered) const {
  if (format_ != ChatFormat::STEP35) return false;
  const size_t open = rendered.rfind("<think>");
  if (open == std::string_view::npos) return false;
  const size_t close = rendered.rfind("</think>");
  return close == std::string_view::npos || close < open;
}

ordered_json ChatTemplate::normalized_messages(const ordered_json& messages) {
  if (!messages.is_array()) throw std::invalid_argument("messages must be an array");
  ordered_json out = messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& j = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!j.is_object()) throw std::invalid_argument(where + " must be an object");
    if (!j.contains("role") || !j["role"].is_string()) throw std::invalid_argument(where + " needs a string 'role'");
    std::string role = j["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for system
    if (!is_known_role(role))
      throw std::invalid_argument(where + ".role '" + role + "' is not one of system, user, assistant, tool");
    out[i]["role"] = role;
    if (j.contains("content")) check_content(j["content"], where);
    for (const char* field : {"reasoning_content", "name"})
      if (j.contains(field) && !j[field].is_null() && !j[field].is_string())
        throw std::invalid_argument(where + "." + field + " must be a string");
    if (j.contains("tool_calls") && !j["tool_calls"].is_null())
      out[i]["tool_calls"] = normalized_tool_calls(j["tool_calls"], where);
  }
  return out;
}

std::vector<ChatMessage> ChatTemplate::messages_from_json(const ordered_json& messages) {
  const ordered_json normalized = normalized_messages(messages);
  std::vector<ChatMessage> out;
  out.reserve(normalized.size());
  for (const ordered_json& j : normalized) {
    ChatMessage m;
    m.role = j["role"].get<std::string>();
    if (j.contains("content")) m.content = content_text(j["content"]);
    if (j.contains("reasoning_content") && j["reasoning_content"].is_string())
      m.reasoning_content = j["reasoning_content"].get<std::string>();
    if (j.contains("name") && j["name"].is_string()) m.name = j["name"].get<std::string>();
    if (j.contains("tool_calls") && j["tool_calls"].is_array()) {
      for (const ordered_json& tc : j["tool_calls"]) {
        const ordered_json& fn = tc.contains("function") ? tc["function"] : tc;
        m.tool_calls.push_back({fn["name"].get<std::string>(),
                                fn.contains("arguments") ? fn["arguments"] : ordered_json::object()});
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

ordered_json ChatTemplate::messages_to_json(const std::vector<ChatMessage>& messages) {
  ordered_json out = ordered_json::array();
  for (const ChatMessage& m : messages) {
    ordered_json j = ordered_json::object();
    j["role"] = m.role;
    j["content"] = m.content;
    if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const ChatToolCall& c : m.tool_calls) {
        ordered_json fn = ordered_json::object();
        fn["name"] = c.name;
        fn["arguments"] = c.arguments.is_null() ? ordered_json::object() : c.arguments;
        calls.push_back({{"type", "function"}, {"function", std::move(fn)}});
      }
      j["tool_calls"] = std::move(calls);
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace step35
