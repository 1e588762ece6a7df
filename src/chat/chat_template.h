// Chat prompt rendering. The GGUF's tokenizer.chat_template (Jinja) is recognised by its
// content and rendered by a native renderer for that format: Step 3.5's own format
// (think blocks, tools, tool responses; §6 of the spec) or plain ChatML.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace step35 {

struct ChatToolCall {
  std::string name;
  nlohmann::json arguments;  // object
};

struct ChatMessage {
  std::string role;     // system | user | assistant | tool
  std::string content;  // text parts already concatenated
  std::string reasoning_content;  // assistant only, optional
  std::vector<ChatToolCall> tool_calls;  // assistant only
  std::string name;     // optional (tool name, or system "observation")
};

enum class ChatFormat { STEP35, CHATML };

class ChatTemplate {
 public:
  // Picks the format from the template text (empty -> STEP35, the model's own format).
  explicit ChatTemplate(const std::string& jinja_source, std::string bos_text = "");
  ChatFormat format() const { return format_; }
  // True when the rendered text already starts with the BOS text (Step 3.5 format): the
  // caller must then tokenize with add_special=false so BOS is not doubled.
  bool renders_bos() const { return format_ == ChatFormat::STEP35 && !bos_text_.empty(); }

  // Renders messages (+ optional tool definitions, JSON objects in OpenAI's
  // {"type":"function","function":{...}} shape) and the generation prompt.
  // Throws std::invalid_argument for unknown roles or malformed tool entries.
  std::string render(const std::vector<ChatMessage>& messages,
                     const nlohmann::json& tools = nlohmann::json::array(),
                     bool add_generation_prompt = true) const;
  // The same with tool definitions whose key order is kept: nlohmann::json sorts object
  // keys, while the template writes each tool's JSON in the client's order.
  std::string render(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt = true) const;

  // Parses OpenAI-style message JSON ({"role":..,"content": string | [parts], ...}).
  static std::vector<ChatMessage> messages_from_json(const nlohmann::json& messages);

 private:
  // Both render() overloads: `tool_lines` are the tools already written as JSON text.
  std::string render_lines(const std::vector<ChatMessage>& messages, const std::vector<std::string>& tool_lines,
                           bool add_generation_prompt) const;

  ChatFormat format_;
  std::string bos_text_;
  // STEP35: the call-format paragraph closing the tools section, taken from the template
  // source when it carries one, else step35's own wording.
  std::string tool_instructions_;
};

}  // namespace step35
