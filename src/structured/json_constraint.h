// Grammar-constrained decoding for structured output: JSON schemas (OpenAI
// response_format json_object / json_schema) and Step 3.5 tool calls compiled into
// TokenConstraints over a tokenizer's vocabulary.
#pragma once

#include <memory>
#include <string>

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

// Output must be one or more Step 3.5 tool calls (spec §6):
//   <tool_call>\n<function=NAME>\n<parameter=K>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// for tools in OpenAI's [{"type":"function","function":{"name","parameters"}}] shape, each
// parameter value matching its JSON schema (strings raw, other types as JSON), required
// parameters present; then end of generation. `only_name` non-empty restricts the calls to
// that function. Throws std::invalid_argument for malformed tools. The tags may be special
// tokens of the vocabulary spelled exactly so, or plain text.
std::unique_ptr<TokenConstraint> make_tool_call_constraint(const nlohmann::json& tools, const std::string& only_name,
                                                           const Tokenizer& tok);

// How make_tool_call_constraint writes a parameter with this schema: true = raw text
// (string-only schemas: "type":"string", or an enum of strings), false = JSON. Parsers of
// the output should decode values the same way. Never throws.
bool tool_parameter_is_raw_string(const nlohmann::json& schema);

// Leaves the first tokens free until `trigger` (e.g. the `</think>` token) is produced,
// then applies `inner`. With max_free >= 0, after that many free tokens only `trigger`
// is allowed (a reasoning budget; 0 = trigger first). End-of-generation tokens are not
// allowed before the trigger when `inner` comes from make_json_constraint /
// make_tool_call_constraint (the constrained part must follow); complete() is false
// until the trigger has been produced and `inner` is complete. Throws
// std::invalid_argument for a negative trigger (a vocabulary without that token).
std::unique_ptr<TokenConstraint> make_after_token_constraint(int32_t trigger, int32_t max_free,
                                                             std::unique_ptr<TokenConstraint> inner);

// Checks `value` against `schema` (the same keyword subset make_json_constraint
// supports). Returns "" when valid, else a one-line reason.
std::string json_schema_validate(const nlohmann::json& schema, const nlohmann::json& value);

}  // namespace step35
