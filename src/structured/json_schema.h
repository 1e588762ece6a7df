// JSON Schema -> grammar compiler and validator. The entry points for structured output are
// in json_constraint.h; the pieces below also let another format embed schema values in a
// grammar of its own (the chat format's tool calls, src/chat/tool_calls.cpp). The supported
// subset, the whitespace policy and the limits are described in docs/structured-output.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

// True when a tool parameter with this schema is written as raw text (string-only
// schemas), false when it is written as JSON. Never throws.
bool parameter_is_raw_string(const json& schema);

// Throws std::invalid_argument when `doc` (a schema, or a document holding schemas, named
// `what` in the message) nests deeper than kMaxDocumentDepth.
void check_document(const json& doc, const char* what);

// Schema values as parts of a larger grammar on one Builder: the rules they share
// (whitespace, strings, any value) are made once.
class SchemaValues {
 public:
  explicit SchemaValues(Builder& b);
  ~SchemaValues();
  SchemaValues(const SchemaValues&) = delete;
  SchemaValues& operator=(const SchemaValues&) = delete;

  // Bounded whitespace (compile_json_schema's policy), then `next`.
  uint32_t ws_then(uint32_t next);
  // One JSON value matching `schema`, whose $refs resolve in `root`, then `next`. Throws
  // std::invalid_argument naming the keyword and path, as compile_json_schema does.
  uint32_t value(const json& root, const json& schema, const std::string& path, uint32_t next);
  // The text of a string-only `schema` (parameter_is_raw_string) as it is: no quotes or
  // escapes, on one line; then `next`. Enum values containing `forbidden` are left out
  // (the caller's format could not read them back). kNoNode when the schema allows any
  // text: the caller writes that with its own rule.
  uint32_t raw_string(const json& root, const json& schema, const std::string& path, std::string_view forbidden,
                      uint32_t next);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The members of an object schema ($ref, allOf and const folded): the "required" names
// first in their order, then the other properties in key order; a required name without
// a property schema takes any value. `shape` says when the schema is no plain object
// schema (members then empty). Throws std::invalid_argument for a malformed schema.
struct ObjectMember {
  std::string key;
  json schema;
  bool required = false;
};
struct ObjectMembers {
  enum class Shape : uint8_t { Object, False, NotObject, Choice /* anyOf / oneOf at its top */ };
  Shape shape = Shape::Object;
  std::vector<ObjectMember> members;
};
ObjectMembers object_members(const json& schema, const std::string& path);

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

// The deepest nesting of arrays and objects accepted in JSON text from outside (a request
// body, a tool call's arguments string, a JSON value in the model's output). Copies,
// comparisons, dumps, the Jinja context and schema compilation all recurse once per level;
// checking the text against this before it becomes a DOM bounds every one of them. Real
// requests nest a few dozen levels, deep JSON schemas included.
constexpr size_t kMaxJsonTextNesting = 256;
// Nesting depth of JSON text (brackets outside strings; malformed text is left to the
// parser), read in one pass without recursion; stops reading at limit+1.
size_t json_text_depth(std::string_view text, size_t limit);
std::string path_join(const std::string& path, const std::string& token);

}  // namespace step35::grammar
