// Grammar-constrained decoding for structured output: JSON schemas (OpenAI
// response_format json_object / json_schema) compiled into TokenConstraints over a
// tokenizer's vocabulary. (Step 3.5 tool calls are the chat format's: src/chat/tool_calls.h.)
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "structured/constraint.h"

namespace step35 {

class Tokenizer;

// Output must be one JSON value matching `schema` (a JSON Schema object; {} or
// {"type":"object"} for json_object mode), optionally surrounded by whitespace, then an
// end-of-generation token. Throws std::invalid_argument naming the offending part for
// a malformed schema or one using unsupported keywords. Supported subset, property order,
// whitespace policy and limits: docs/structured-output.md.
std::unique_ptr<TokenConstraint> make_json_constraint(const nlohmann::json& schema, const Tokenizer& tok);

// Output must match a GBNF grammar (llama.cpp's notation, structured/gbnf.h) from its
// `root` rule, then an end-of-generation token. Throws std::invalid_argument naming the
// line and column of a syntax error, or the rule at fault.
std::unique_ptr<TokenConstraint> make_gbnf_constraint(std::string_view gbnf, const Tokenizer& tok);

// Leaves the first tokens free until `trigger` (e.g. the `</think>` token) is produced,
// then applies `inner`. With max_free >= 0, after that many free tokens only `trigger`
// is allowed (a reasoning budget; 0 = trigger first). End-of-generation tokens are not
// allowed before the trigger when `inner` is a grammar constraint (make_json_constraint,
// make_tool_call_constraint: the constrained part must follow); complete() is false
// until the trigger has been produced and `inner` is complete. Throws
// std::invalid_argument for a negative trigger (a vocabulary without that token).
std::unique_ptr<TokenConstraint> make_after_token_constraint(int32_t trigger, int32_t max_free,
                                                             std::unique_ptr<TokenConstraint> inner);

}  // namespace step35
