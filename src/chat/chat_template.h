// Chat prompt rendering: the model's own Jinja chat template (GGUF tokenizer.chat_template,
// or a file given with --chat-template-file) run by src/jinja exactly as Hugging Face's
// apply_chat_template runs it (docs/chat-templates.md). A file without a template gets the
// published Step 3.5 Flash template (step35_template.h), the model family's own format.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace step35 {

namespace gguf {
class File;
}
namespace jinja {
class Template;
}
class Tokenizer;

struct ChatToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // object, in the client's key order
};

struct ChatMessage {
  std::string role;     // system | user | assistant | tool
  std::string content;  // text parts already concatenated
  std::string reasoning_content;  // assistant only, optional
  std::vector<ChatToolCall> tool_calls;  // assistant only
  std::string name;     // optional (tool name, or system "observation")
};

// STEP35: the template writes Step 3.5's markers (think blocks, <tool_call> XML), which the
// output parser and the reasoning controls look for; CHATML: any other template.
enum class ChatFormat { STEP35, CHATML };

// How one conversation is rendered, beyond its messages and tools.
struct ChatRenderOptions {
  // End with the assistant's opening (the generation prompt).
  bool add_generation_prompt = true;
  // Leave the last message, which must be the assistant's, open so that generation
  // continues it (an assistant prefill); excludes add_generation_prompt. The rendering is
  // cut after the final message's text, as apply_chat_template does (after its
  // reasoning_content when it has no text: the model goes on reasoning).
  bool continue_final_message = false;
  // The template's extra variables (OpenAI chat_template_kwargs, a JSON object), passed to
  // the template as they are. enable_thinking: false also closes an empty think block
  // after a STEP35 generation prompt when the template itself has no such switch.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// Where a template comes from: its source text(s) and the special tokens it is given.
struct ChatTemplateSource {
  std::string text;                           // "" = the built-in Step 3.5 template
  std::map<std::string, std::string> named;   // tokenizer.chat_template.<name> (e.g. tool_use)
  std::string origin = "chat template";       // named in errors (a GGUF key or a file path)
  std::string bos_text, eos_text;             // bos_token / eos_token of the template

  // tokenizer.chat_template and its named variants from a model file, the special tokens
  // from its tokenizer; `override_path` (--chat-template-file), when not empty, replaces
  // the file's templates. Throws std::runtime_error naming the file when it cannot be read.
  static ChatTemplateSource from_model(const gguf::File& file, const Tokenizer& tok,
                                       const std::string& override_path = "");
};

class ChatTemplate {
 public:
  // Parses the template(s) once; throws std::runtime_error ("<origin>: LINE:COLUMN:
  // syntax error: ...") when one does not parse.
  explicit ChatTemplate(const ChatTemplateSource& source);
  // The template text alone (tests; "" = the built-in Step 3.5 template).
  explicit ChatTemplate(const std::string& jinja_source, std::string bos_text = "");
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  ChatFormat format() const { return format_; }
  // The template text in use (the file's, the override's or the built-in one).
  const std::string& source_text() const { return source_text_; }
  // Whether a rendered prompt already starts with the BOS text: the caller then tokenizes
  // with add_special=false so BOS is not doubled.
  bool starts_with_bos(std::string_view rendered) const;

  // Renders a conversation as the client sent it (OpenAI message objects; their objects,
  // tool definitions and tool-call arguments keep the client's key order). Messages are
  // checked (normalized_messages) first; text parts are joined into one string when the
  // template cannot take a list. tools: an array (empty or null: no tools; then
  // the template sees tools = None, as apply_chat_template passes it). Throws
  // std::invalid_argument for malformed messages, bad options or a template error
  // (raise_exception's message, an undefined value, a limit reached).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     const ChatRenderOptions& options) const;
  // The same from parsed messages (the CLI and tests).
  std::string render(const std::vector<ChatMessage>& messages,
                     const nlohmann::ordered_json& tools = nlohmann::ordered_json::array(),
                     bool add_generation_prompt = true) const;
  std::string render(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                     const ChatRenderOptions& options) const;

  // Whether a rendered prompt leaves the model inside a reasoning block (STEP35: the last
  // <think> is not closed, as after the generation prompt with thinking on).
  bool opens_reasoning(std::string_view rendered) const;
  // Whether enable_thinking: false can switch reasoning off: the template reads the
  // variable, or it is Step 3.5's (see ChatRenderOptions::kwargs).
  bool supports_thinking_switch() const { return format_ == ChatFormat::STEP35 || reads_enable_thinking_; }

  // Checks OpenAI-style messages and returns what the template is given: the messages as
  // sent, except that role "developer" becomes "system" and tool-call arguments sent as a
  // JSON string (OpenAI's shape) become the object they encode, in its key order ("" is {}).
  // Throws std::invalid_argument naming the field.
  static nlohmann::ordered_json normalized_messages(const nlohmann::ordered_json& messages);
  // Parses OpenAI-style message JSON ({"role":..,"content": string | [parts], ...}).
  static std::vector<ChatMessage> messages_from_json(const nlohmann::ordered_json& messages);
  // The messages as OpenAI JSON (what render() of ChatMessages gives the template).
  static nlohmann::ordered_json messages_to_json(const std::vector<ChatMessage>& messages);

 private:
  const jinja::Template& pick(bool has_tools) const;
  // Content given as a list of text parts becomes one string for a template that only
  // takes strings (see takes_content_parts_).
  void flatten_content_parts(nlohmann::ordered_json& messages) const;

  std::shared_ptr<const jinja::Template> default_;
  std::shared_ptr<const jinja::Template> tool_use_;  // null: default_ serves requests with tools
  std::string origin_;
  std::string source_text_;
  std::string bos_text_, eos_text_;
  ChatFormat format_ = ChatFormat::STEP35;
  bool reads_enable_thinking_ = false;
  // The template handles content as a list of parts (it iterates it or tests its type);
  // otherwise parts are joined into a string first, as vLLM and llama.cpp do, because
  // `'...' + message['content']` fails on a list.
  bool takes_content_parts_ = false;
};

}  // namespace step35
