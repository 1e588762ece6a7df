// GBNF, llama.cpp's grammar notation (the `grammar` field of its server), compiled into
// this project's byte-level grammars (grammar.h).
//
// Syntax (as llama.cpp's grammars/README.md defines it):
//   name ::= alternatives        one rule per line; `root` is the start rule
//   a b                          sequence;   a | b   alternatives;   ( ... )   grouping
//   "text"                       literal, with escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH
//   [a-z0-9_] [^"\\]             character class (code points) and its complement
//   .                            any character
//   x* x+ x? x{m} x{m,} x{m,n}   repetition
//   # ...                        comment to the end of the line
// Rule names are letters, digits and '-'. Newlines end a rule except after `::=`, after
// `|` and inside parentheses. Token references (`<...>`, `!<...>`) are not supported.
// Characters are Unicode code points matched as UTF-8.
#pragma once

#include <memory>
#include <string_view>

#include "structured/grammar.h"

namespace step35::grammar {

// At most this many repetitions may be spelled out by {m,n}.
constexpr uint64_t kMaxGbnfRepetition = 2000;

// Throws std::invalid_argument("grammar: <reason> at line L, column C") for a syntax
// error, a missing `root` or an undefined rule, and the Builder's errors (left
// recursion, an empty language, too many nodes).
std::shared_ptr<const Grammar> compile_gbnf(std::string_view source);

}  // namespace step35::grammar
