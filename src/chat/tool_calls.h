// Step 3.5 tool calls (spec §6) as a grammar, for constrained decoding of forced calls
// (tool_choice "required" or a named function):
//
//   <tool_call>\n<function=NAME>\n<parameter=K>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//
// for tools in OpenAI's [{"type":"function","function":{"name","parameters"}}] shape (a bare
// {"name","parameters"} is accepted too). Each parameter value matches its JSON schema:
// string-only schemas are written as raw text, the others as JSON; required parameters come
// first, in their order, then the others in key order, each optional. One call or more
// (separated by at most two newlines), then end of generation.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "structured/constraint.h"
#include "structured/grammar.h"

namespace step35 {

class Tokenizer;

// The grammar. `only_name` non-empty restricts the calls to that function. has_special(text)
// says whether the vocabulary has a special token spelled `text`: a tag may then be that
// token or its text. Throws std::invalid_argument for malformed tools (naming the tool).
std::shared_ptr<const grammar::Grammar> compile_tool_calls(const nlohmann::json& tools, const std::string& only_name,
                                                           const std::function<bool(const std::string&)>& has_special);

// The grammar as a constraint over a tokenizer's vocabulary.
std::unique_ptr<TokenConstraint> make_tool_call_constraint(const nlohmann::json& tools, const std::string& only_name,
                                                           const Tokenizer& tok);

// How a parameter with this schema is written in a call: true = raw text (string-only
// schemas: "type":"string", or an enum of strings), false = JSON. The output parser reads
// values back by the same rule. Never throws.
bool tool_parameter_is_raw_string(const nlohmann::json& schema);

}  // namespace step35
