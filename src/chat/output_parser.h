// Splits generated Step 3.5 output into reasoning, visible content and tool calls, one
// token (or one chunk of text) at a time, for streamed and non-streamed responses alike.
//
// Output grammar (spec §6): `reasoning \n</think>\n content` then optional tool calls
//
//   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//
// Rules this parser applies (deterministic; the markers are step35_format.h's):
// * Reasoning mode first when the prompt opened `<think>` (the generation prompt does).
//   Reasoning ends at `</think>` or at the first `<tool_call>`. One newline right before
//   and one right after `</think>` are dropped. A `<think>` in content mode opens a new
//   reasoning block (one newline after it dropped); a stray `</think>` in content is
//   dropped. The tags themselves never appear in reasoning or content.
// * Tags are recognised in the decoded text, so it makes no difference whether the model
//   wrote a tag as one special token or as several ordinary ones, nor where chunk
//   boundaries fall: text that may be the start of a tag is held back until it is
//   certain (at most one tag's length). End-of-generation tokens end the output; other
//   control tokens that are not tags (e.g. `<|im_start|>`) are dropped.
// * Tool calls are parsed only when the request declared tools; without tools the tool
//   tags are ordinary content. Whitespace between content and a call, between calls and
//   after the last call is dropped (it is formatting, not content).
// * Parameter values: one newline after `<parameter=K>` and one before `</parameter>` are
//   dropped; a value ends at the first `</parameter>`. A parameter whose schema is
//   string-only (`tool_parameter_is_raw_string`, the rule the tool-call grammar uses) is
//   the raw text. Any other declared parameter, an undeclared one, or one of an unknown
//   function is parsed as JSON (surrounding whitespace ignored); when that fails the raw
//   text is kept as a JSON string (so `arguments` is always a valid JSON object). A
//   repeated parameter name keeps its first value (the repeat is dropped, with a warning).
// * Streaming: a call's name is sent (ToolCallStart) as soon as `<function=NAME>` is
//   complete; its arguments are sent as JSON fragments that concatenate to exactly
//   ToolCall::arguments. A raw-string parameter streams as it is generated (`{"a":"` when
//   its name is complete, then the escaped text as it comes, holding back only what may
//   still be the newline and `</parameter>` that end it, then `"`); any other parameter
//   is one fragment once its value is complete (`,"b":1`); `}` closes the call. A call
//   whose name never completed is dropped (warning).
// * Malformed output: a call to a function not among the tools is still returned as a
//   call (known_function = false, values parsed as JSON-or-string) so the client can
//   answer it with an error; stray text inside a call's tag structure is skipped (a
//   warning); a call left open at the end of generation is closed with what was parsed
//   (a value in progress is kept, as far as it got) and `truncated` is set.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace step35 {

// One piece of streamed output.
struct OutputDelta {
  enum class Kind : uint8_t {
    Reasoning,          // text: reasoning text
    Content,            // text: visible content
    ToolCallStart,      // a new call: tool_index, tool_id, tool_name (text empty)
    ToolCallArguments,  // text: the next fragment of call tool_index's arguments JSON
  };
  Kind kind = Kind::Content;
  std::string text;
  int32_t tool_index = -1;  // tool-call kinds: 0-based index of the call in this output
  std::string tool_id;      // ToolCallStart
  std::string tool_name;    // ToolCallStart
};

struct ParsedToolCall {
  std::string id;         // call_id_prefix + index
  std::string name;
  std::string arguments;  // JSON object text (compact, parameter order as generated)
  bool known_function = true;  // false: the name is not among the declared tools
};

struct ParsedOutput {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool truncated = false;              // generation ended inside a tool call
  std::vector<std::string> warnings;   // what malformed output was repaired or dropped
};

struct OutputParserOptions {
  // The prompt already opened a `<think>` block (Step 3.5's generation prompt does).
  bool in_reasoning = true;
  // Tool-call ids are this prefix followed by the call's index; the server passes a
  // per-request prefix so ids are unique (the parser itself holds no randomness).
  std::string call_id_prefix = "call_";
};

class OutputParser {
 public:
  // `tools`: the request's tools in OpenAI shape ({"type":"function","function":{"name",
  // "parameters"}}; a bare {"name","parameters"} is accepted too); empty / null = no tool
  // calls are parsed. Entries without a string name are ignored. `tok` must outlive the
  // parser (only push(token) uses it).
  OutputParser(const Tokenizer& tok, const nlohmann::json& tools, OutputParserOptions options = {});

  // Feeds one generated token. Returns the deltas that became certain (often none). An
  // end-of-generation token finishes the output (as finish() does); tokens after that
  // are ignored. Throws std::out_of_range for an id outside the vocabulary.
  std::vector<OutputDelta> push(TokenId token);
  // Feeds decoded text directly (tests, or callers that decode themselves). Invalid
  // UTF-8 is passed through; a multi-byte character split across chunks is kept whole.
  std::vector<OutputDelta> push_text(std::string_view text);
  // End of generation (EOS, max_tokens, stop string...): releases held-back text and
  // closes an open call. Idempotent; push after finish returns nothing.
  std::vector<OutputDelta> finish();

  // Everything parsed so far (complete after finish()). The streamed deltas concatenate
  // to exactly these strings.
  const ParsedOutput& result() const { return out_; }
  bool finished() const { return finished_; }
  bool in_reasoning() const { return mode_ == Mode::Reasoning; }
  bool in_tool_call() const { return mode_ == Mode::ToolCall; }

 private:
  enum class Mode : uint8_t { Reasoning, Content, ToolCall };
  // Position inside a <tool_call> block.
  enum class CallState : uint8_t {
    ExpectFunction,   // before <function=
    FunctionName,     // inside <function=...>
    ExpectParameter,  // before <parameter=, </function> or </tool_call>
    ParameterName,    // inside <parameter=...>
    ParameterValue,   // the value, up to </parameter>
    ExpectCallEnd,    // after </function>, before </tool_call>
  };

  void consume(std::vector<OutputDelta>& out, bool at_end);
  bool step_reasoning(std::vector<OutputDelta>& out, bool at_end);
  bool step_content(std::vector<OutputDelta>& out, bool at_end);
  bool step_call(std::vector<OutputDelta>& out, bool at_end);
  bool step_call_tag(std::vector<OutputDelta>& out, bool at_end);
  bool step_call_name(std::vector<OutputDelta>& out, bool at_end);
  bool step_parameter_value(std::vector<OutputDelta>& out, bool at_end);
  void skip_call_space();
  void skip_stray(const char* where);
  bool read_call_name(bool at_end);
  void emit_text(std::vector<OutputDelta>& out, OutputDelta::Kind kind, std::string_view text);
  void emit_content(std::vector<OutputDelta>& out, std::string_view text);
  void start_call(std::vector<OutputDelta>& out, std::string name);
  void finish_parameter(std::vector<OutputDelta>& out, std::string value);
  // A raw-string parameter value streamed as it comes: opened when its name is complete,
  // fed the value text, closed at its end.
  void open_streamed_value(std::vector<OutputDelta>& out);
  void stream_value(std::vector<OutputDelta>& out, std::string_view text, bool last);
  void emit_arguments(std::vector<OutputDelta>& out, std::string fragment);
  void close_call(std::vector<OutputDelta>& out);
  void warn(std::string message);
  const nlohmann::json* parameter_schema(const std::string& key) const;

  const Tokenizer* tok_;
  OutputParserOptions options_;
  bool tools_enabled_ = false;
  nlohmann::json tool_params_;  // name -> parameters schema (object)
  Utf8Stream utf8_;
  std::string buf_;             // decoded text not yet consumed
  Mode mode_;
  bool finished_ = false;
  bool skip_newline_ = false;   // drop one '\n' at the start of the next text (after a tag)
  bool after_call_ = false;     // in content right after a call: leading whitespace dropped
  std::string held_space_;      // content whitespace held until it is known not to precede a call

  // The call being parsed.
  CallState call_state_ = CallState::ExpectFunction;
  std::string call_text_;       // name / parameter name / value being collected
  std::string param_name_;
  bool call_started_ = false;   // ToolCallStart sent
  size_t call_n_params_ = 0;    // parameters written into the arguments so far
  std::vector<std::string> call_keys_;
  bool value_streamed_ = false;  // the value in progress streams (a raw-string parameter)
  bool value_started_ = false;   // ... and its leading newline has been dealt with
  std::string value_held_;       // ... text held back: it may be the newline before </parameter>

  ParsedOutput out_;
};

}  // namespace step35
