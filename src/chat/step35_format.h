// The markers of Step 3.5's output format (spec §6), defined once for everything that
// reads, constrains or detects them: a reasoning block, then content and tool calls
//
//   reasoning \n</think>\n content
//   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//
// (Prompts get the same markers from the model's own Jinja template, chat_template.h.)
#pragma once

#include <cstdint>
#include <string_view>

#include "chat/chat_template.h"

namespace step35 {

class Tokenizer;

namespace step35_format {

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";
inline constexpr std::string_view kFunctionOpen = "<function=";  // then NAME>
inline constexpr std::string_view kFunctionClose = "</function>";
inline constexpr std::string_view kParameterOpen = "<parameter=";  // then KEY>
inline constexpr std::string_view kParameterClose = "</parameter>";

// Whether a rendered prompt leaves the model inside a reasoning block: Step 3.5's
// generation prompt ends by opening one ("<think>\n").
bool prompt_opens_reasoning(std::string_view rendered_prompt, ChatFormat format);

// The token that closes a reasoning block (`</think>`), -1 when the vocabulary has none.
int32_t think_end_token(const Tokenizer& tok);

}  // namespace step35_format
}  // namespace step35
