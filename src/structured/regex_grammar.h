// Text building blocks for grammars: sets of Unicode code points emitted as UTF-8 (raw, or
// as the characters of a JSON string literal), and a regular-expression subset (JSON
// Schema "pattern", ECMAScript syntax) compiled into grammar fragments.
//
// Regex subset: literals, '.', classes [...] / [^...] with ranges, escapes \d \D \w \W \s
// \S \t \n \r \f \v \0 \xHH \uHHHH \u{H...} and escaped punctuation, groups (...) (?:...)
// (?<name>...), alternation |, quantifiers * + ? {n} {n,} {n,m} (a lazy '?' suffix is
// accepted: it does not change which strings match). '^' / '$' only at the start / end of
// a top-level alternative. Unanchored ends match anywhere (JSON Schema patterns search).
// Everything else (backreferences, lookaround, \b, \p{..}, flags, possessive quantifiers)
// throws std::invalid_argument naming the construct.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace step35::grammar {

// Sorted, disjoint, non-adjacent inclusive ranges of code points.
using CpSet = std::vector<std::pair<uint32_t, uint32_t>>;

CpSet cp_normalize(CpSet s);
CpSet cp_complement(const CpSet& s);  // within 0 .. 0x10FFFF
CpSet cp_minus(const CpSet& a, const CpSet& b);
CpSet cp_union(const CpSet& a, const CpSet& b);
CpSet cp_all();  // every scalar value (no surrogates)

enum class TextMode : uint8_t {
  Json,     // characters of a JSON string literal: canonical escapes for '"', '\\', controls
  Raw,      // raw UTF-8 (validation of decoded strings)
  RawLine,  // raw UTF-8 without NUL and '\n' (Step 3.5 tool-call parameter text)
};

// One character from `set` (surrogates never match) in the given encoding, then `next`.
uint32_t emit_char_set(Builder& b, const CpSet& set, TextMode mode, uint32_t next);
// Exact code point sequence (UTF-8 string) in the given encoding.
uint32_t emit_text(Builder& b, std::string_view utf8, TextMode mode, uint32_t next);

struct Regex {
  enum class Kind : uint8_t { Empty, Set, Concat, Alt, Repeat };
  struct Node {
    Kind kind = Kind::Empty;
    CpSet set;
    std::vector<uint32_t> kids;
    uint32_t min = 0, max = 0;  // Repeat; max == kUnbounded for no upper bound
  };
  static constexpr uint32_t kUnbounded = UINT32_MAX;
  std::vector<Node> nodes;
  // Top-level alternatives with their anchors.
  struct Branch {
    uint32_t node;
    bool anchored_start, anchored_end;
  };
  std::vector<Branch> branches;
};

// Throws std::invalid_argument("pattern ...: <reason> at offset N").
Regex parse_regex(std::string_view pattern);
// The strings the pattern matches (search semantics: unanchored ends allow any text).
uint32_t emit_regex(Builder& b, const Regex& re, TextMode mode, uint32_t next);

// The regex (ECMAScript syntax) enforcing a JSON Schema "format", or nullptr when the
// format is not enforced (an annotation: any string).
const char* format_pattern(std::string_view format);

// A grammar matching exactly the raw UTF-8 strings `pattern` accepts (for validation).
std::shared_ptr<const Grammar> compile_pattern(std::string_view pattern);
bool grammar_matches(const std::shared_ptr<const Grammar>& g, std::string_view text);

// Number of code points in valid UTF-8 (JSON Schema string length).
size_t utf8_length(std::string_view s);

}  // namespace step35::grammar
