// Checks a JSON value against a JSON Schema, for tests and fuzzers: the structured-output
// library's own validator (the one its compiler filters enum values with), behind the
// document depth check a caller of it must make. Not part of the shipped API.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "structured/json_schema.h"

namespace step35::testing {

// "" when `value` matches `schema` (the keyword subset make_json_constraint supports),
// else a one-line reason.
inline std::string schema_violation(const nlohmann::json& schema, const nlohmann::json& value) {
  if (grammar::json_depth(schema, grammar::kMaxDocumentDepth) > grammar::kMaxDocumentDepth)
    return "the schema nests deeper than " + std::to_string(grammar::kMaxDocumentDepth) + " levels";
  return grammar::validate_value(schema, schema, value);
}

}  // namespace step35::testing
