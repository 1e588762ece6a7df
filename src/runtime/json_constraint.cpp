// Placeholder until the JSON-schema grammar compiler lands.
#include "runtime/json_constraint.h"

#include <stdexcept>

namespace step35 {

std::unique_ptr<TokenConstraint> make_json_constraint(const nlohmann::json&, const Tokenizer&) {
  throw std::invalid_argument("structured output (response_format) is not supported yet");
}

std::unique_ptr<TokenConstraint> make_tool_call_constraint(const nlohmann::json&, const std::string&, const Tokenizer&) {
  throw std::invalid_argument("tool_choice 'required' is not supported yet");
}

std::unique_ptr<TokenConstraint> make_after_token_constraint(int32_t, int32_t, std::unique_ptr<TokenConstraint>) {
  throw std::invalid_argument("structured output (response_format) is not supported yet");
}

std::string json_schema_validate(const nlohmann::json&, const nlohmann::json&) { return "not supported yet"; }

}  // namespace step35
