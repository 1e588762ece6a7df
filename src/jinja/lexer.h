// Splits template source into tokens the way jinja2's lexer does: text between tags (with
// the whitespace control of '-' and '+', trim_blocks and lstrip_blocks applied), the
// delimiters of {{ ... }} and {% ... %}, and the names, literals and operators inside them.
// Comments and {% raw %} are resolved here: a comment leaves nothing, raw leaves text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace step35::jinja {

enum class TokenType : uint8_t {
  Text,           // template text outside tags
  VariableBegin,  // {{
  VariableEnd,    // }}
  BlockBegin,     // {%
  BlockEnd,       // %}
  Name,
  String,         // text holds the literal's value, escapes resolved
  Integer,
  Float,
  Operator,       // text holds the operator ("+", "//", "==", "(", ...)
  End,            // end of the template
};

struct Token {
  TokenType type = TokenType::End;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
  uint32_t line = 1;
  uint32_t column = 1;
};

struct LexerOptions {
  bool trim_blocks = true;              // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;            // drop spaces and tabs before a block or comment tag on its line
  bool keep_trailing_newline = false;   // jinja2's default drops one newline at the very end
};

// Throws jinja::Error (Syntax) with the line and column of the problem.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options);

// Human-readable description of a token for parse errors ("end of print statement", "'x'").
std::string describe_token(const Token& token);

}  // namespace step35::jinja
