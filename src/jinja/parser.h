// Recursive-descent parser with jinja2's grammar and operator precedence (its parser.py
// is the specification): statements, expressions, filters and tests.
#pragma once

#include <string_view>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace step35::jinja {

struct ParseOptions {
  LexerOptions lexer;
  // Deepest nesting of expressions and blocks accepted (the parser recurses per level).
  uint32_t max_depth = 256;
};

// Throws jinja::Error (Syntax) with line and column. A filter or test that does not exist
// is an error here, except inside an if-statement or conditional expression, where
// jinja2 defers it to the moment it runs.
Program parse_template(std::string_view source, const ParseOptions& options);

}  // namespace step35::jinja
