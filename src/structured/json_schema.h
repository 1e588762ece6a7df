// JSON Schema -> grammar compiler and validator (internal; the public entry points are in
// json_constraint.h). The supported subset, the whitespace policy and the limits are
// described in docs/structured-output.md.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace step35::grammar {

using nlohmann::json;

// Limits (errors name the schema path where they are hit).
constexpr int kMaxSchemaDepth = 64;            // nested subschemas / reference hops
constexpr size_t kMaxDocumentDepth = 256;      // nesting of the schema document itself
constexpr size_t kMaxValueDepth = 512;         // nesting of a value given to the validator
constexpr uint64_t kMaxCount = 100000;         // minItems/maxItems/minLength/maxLength enforced by the grammar
constexpr size_t kMaxGrammarNodes = size_t(1) << 20;  // ~16 MB of nodes while compiling

// One JSON value (optionally surrounded by bounded whitespace) matching `schema`.
// Throws std::invalid_argument naming the keyword and path for anything unsupported,
// malformed, too large or unsatisfiable.
std::shared_ptr<const Grammar> compile_json_schema(const json& schema);

// One or more Step 3.5 tool calls (see json_constraint.h). has_special(text) says
// whether the vocabulary has a special token spelled `text` (tags may then be that token).
std::shared_ptr<const Grammar> compile_tool_calls(const json& tools, const std::string& only_name,
                                                  const std::function<bool(const std::string&)>& has_special);

// True when a tool parameter with this schema is written as raw text (string-only
// schemas), false when it is written as JSON. Never throws.
bool parameter_is_raw_string(const json& schema);

// Validation against `schema`, with $ref resolved in `root` (whose nesting the caller
// has checked against kMaxDocumentDepth). "" when valid, else a one-line reason (also for
// unsupported keywords).
std::string validate_value(const json& root, const json& schema, const json& value);

// Shared by the compiler and the validator.
bool is_annotation_keyword(const std::string& key);
// Throws std::invalid_argument for a keyword outside the supported subset.
void check_keywords(const json& schema, const std::string& path);
// The schema a local reference ("#", "#/$defs/x", any "#/json/pointer") points to.
const json& resolve_ref(const json& root, const json& ref, const std::string& path);
// Depth of nesting of a JSON document, computed without recursion; stops counting at limit+1.
size_t json_depth(const json& j, size_t limit);
std::string path_join(const std::string& path, const std::string& token);

}  // namespace step35::grammar
