#include "jinja/lexer.h"

#include <cstdlib>

#include "jinja/error.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

// Operators, longest first so that "//" wins over "/".
constexpr std::string_view kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                           "(",  ")",  "{",  "}",  ">",  "<",  "=", ".", ":", "|", ",", ";"};

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Whether text is one or more whitespace code points (Python's \s+ fullmatch).
bool all_whitespace(std::string_view text) {
  if (text.empty()) return false;
  for (size_t pos = 0; pos < text.size();)
    if (!text::is_space(text::next_code_point(text, pos))) return false;
  return true;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : options_(options) {
    // jinja2 reads every line break as "\n" and drops one newline at the very end.
    source_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        source_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        source_ += source[i];
      }
    }
    if (!options_.keep_trailing_newline && !source_.empty() && source_.back() == '\n') source_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < source_.size()) lex_text_and_tag();
    Token end = make_token(TokenType::End, source_.size());
    tokens_.push_back(std::move(end));
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& message, size_t offset) {
    advance_position_to(offset);
    throw Error(ErrorKind::Syntax, message, line_, column_);
  }

  // Line and column of a byte offset, counted forward from the last one asked for
  // (offsets only grow, so the whole template is walked once).
  void advance_position_to(size_t offset) {
    if (offset < position_offset_) return;
    for (size_t i = position_offset_; i < offset && i < source_.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(source_[i]);
      if (b == '\n') {
        ++line_;
        column_ = 1;
      } else if ((b & 0xC0) != 0x80) {
        ++column_;
      }
    }
    position_offset_ = offset;
  }

  Token make_token(TokenType type, size_t offset) {
    advance_position_to(offset);
    Token t;
    t.type = type;
    t.line = line_;
    t.column = column_;
    return t;
  }

  void emit_text(size_t offset, std::string_view text) {
    if (text.empty()) return;
    Token t = make_token(TokenType::Text, offset);
    t.text = std::string(text);
    tokens_.push_back(std::move(t));
  }

  // Applies '-' / lstrip_blocks to the text before a tag (jinja2's OptionalLStrip).
  std::string_view strip_before_tag(std::string_view text, char sign, bool is_variable) const {
    if (sign == '-') return text::strip(text, false, true);
    if (sign != '+' && options_.lstrip_blocks && !is_variable) {
      const size_t newline = text.rfind('\n');
      const size_t line_begin = newline == std::string_view::npos ? 0 : newline + 1;
      if ((line_begin > 0 || line_starting_) && all_whitespace(text.substr(line_begin))) {
        return text.substr(0, line_begin);
      }
    }
    return text;
  }

  // Consumes the end of a block or comment tag at pos_ ("%}" or "#}" with its sign), with
  // the whitespace it strips after it.
  void consume_tag_end(char sign, size_t closer_length) {
    pos_ += closer_length;
    if (sign == '-') {
      while (pos_ < source_.size()) {
        size_t next = pos_;
        if (!text::is_space(text::next_code_point(source_, next))) break;
        pos_ = next;
      }
    } else if (sign != '+' && options_.trim_blocks && pos_ < source_.size() && source_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > 0 && source_[pos_ - 1] == '\n';
  }

  void lex_text_and_tag() {
    // The next tag opener.
    size_t tag = pos_;
    while (true) {
      tag = source_.find('{', tag);
      if (tag == std::string::npos || tag + 1 >= source_.size()) {
        emit_text(pos_, std::string_view(source_).substr(pos_));
        pos_ = source_.size();
        return;
      }
      const char c = source_[tag + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++tag;
    }
    const char kind = source_[tag + 1];
    const char sign = tag + 2 < source_.size() && (source_[tag + 2] == '-' || source_[tag + 2] == '+') ? source_[tag + 2] : 0;
    const std::string_view before = std::string_view(source_).substr(pos_, tag - pos_);
    emit_text(pos_, strip_before_tag(before, sign, kind == '{'));
    const size_t body = tag + 2 + (sign != 0 ? 1 : 0);
    if (kind == '#') {
      lex_comment(tag, body);
    } else if (kind == '%' && is_raw_begin(body)) {
      lex_raw(tag);
    } else {
      lex_tag(tag, body, kind == '{');
    }
  }

  void lex_comment(size_t tag, size_t body) {
    const size_t close = source_.find("#}", body);
    if (close == std::string::npos) fail("Missing end of comment tag", tag);
    char sign = 0;
    if (close > body && (source_[close - 1] == '-' || source_[close - 1] == '+')) sign = source_[close - 1];
    pos_ = close;
    consume_tag_end(sign, 2);
  }

  // "{%" [sign] \s* "raw" \s* ("-%}" | "%}") at the tag.
  bool is_raw_begin(size_t body) const {
    size_t p = body;
    while (p < source_.size() && is_ascii_space(source_[p])) ++p;
    if (source_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < source_.size() && is_name_char(source_[p])) return false;
    while (p < source_.size() && is_ascii_space(source_[p])) ++p;
    return source_.compare(p, 2, "%}") == 0 || source_.compare(p, 3, "-%}") == 0;
  }

  void lex_raw(size_t tag) {
    // The opening tag: raw_begin strips after it with '-' but does not trim a newline.
    size_t p = source_.find("raw", tag) + 3;
    while (is_ascii_space(source_[p])) ++p;
    if (source_[p] == '-') {
      p += 3;
      while (p < source_.size()) {
        size_t next = p;
        if (!text::is_space(text::next_code_point(source_, next))) break;
        p = next;
      }
    } else {
      p += 2;
    }
    line_starting_ = source_[p - 1] == '\n';
    // The closing tag: "{%" [sign] \s* "endraw" \s* ("+%}" | "-%}" | "%}").
    size_t search = p;
    while (true) {
      const size_t open = source_.find("{%", search);
      if (open == std::string::npos) fail("Missing end of raw directive", tag);
      size_t q = open + 2;
      char sign = 0;
      if (q < source_.size() && (source_[q] == '-' || source_[q] == '+')) sign = source_[q++];
      while (q < source_.size() && is_ascii_space(source_[q])) ++q;
      if (source_.compare(q, 6, "endraw") == 0 && !(q + 6 < source_.size() && is_name_char(source_[q + 6]))) {
        q += 6;
        while (q < source_.size() && is_ascii_space(source_[q])) ++q;
        char end_sign = 0;
        if (q < source_.size() && (source_[q] == '-' || source_[q] == '+')) end_sign = source_[q++];
        if (source_.compare(q, 2, "%}") == 0) {
          const std::string_view content = std::string_view(source_).substr(p, open - p);
          emit_text(p, strip_before_tag(content, sign, false));
          pos_ = q;
          consume_tag_end(end_sign, 2);
          return;
        }
      }
      search = open + 2;
    }
  }

  void lex_tag(size_t tag, size_t body, bool is_variable) {
    tokens_.push_back(make_token(is_variable ? TokenType::VariableBegin : TokenType::BlockBegin, tag));
    pos_ = body;
    std::vector<char> balance;  // open brackets: the end delimiter counts only outside them
    while (true) {
      while (pos_ < source_.size() && is_ascii_space(source_[pos_])) ++pos_;
      if (pos_ >= source_.size()) {
        fail(std::string("unexpected end of template, expected '") + (is_variable ? "end of print statement" : "end of statement block") + "'.",
             pos_);
      }
      if (balance.empty() && lex_tag_end(is_variable)) return;
      lex_expression_token(balance);
    }
  }

  bool lex_tag_end(bool is_variable) {
    const char closer = is_variable ? '}' : '%';
    char sign = 0;
    size_t p = pos_;
    if (source_[p] == '-' || source_[p] == '+') {
      if (is_variable && source_[p] == '+') return false;
      sign = source_[p++];
    }
    if (p + 1 >= source_.size() || source_[p] != closer || source_[p + 1] != '}') return false;
    tokens_.push_back(make_token(is_variable ? TokenType::VariableEnd : TokenType::BlockEnd, pos_));
    pos_ = p;
    if (is_variable) {
      pos_ += 2;
      if (sign == '-') {
        while (pos_ < source_.size()) {
          size_t next = pos_;
          if (!text::is_space(text::next_code_point(source_, next))) break;
          pos_ = next;
        }
      }
      line_starting_ = source_[pos_ - 1] == '\n';
    } else {
      consume_tag_end(sign, 2);
    }
    return true;
  }

  void lex_expression_token(std::vector<char>& balance) {
    const size_t start = pos_;
    const char c = source_[pos_];
    if (is_digit(c)) {
      lex_number();
      return;
    }
    if (is_name_start(c) || static_cast<uint8_t>(c) >= 0x80) {
      Token t = make_token(TokenType::Name, start);
      while (pos_ < source_.size() && (is_name_char(source_[pos_]) || static_cast<uint8_t>(source_[pos_]) >= 0x80)) ++pos_;
      t.text = source_.substr(start, pos_ - start);
      tokens_.push_back(std::move(t));
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string();
      return;
    }
    for (std::string_view op : kOperators) {
      if (source_.compare(pos_, op.size(), op) != 0) continue;
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op[0]);
      } else if (op == ")" || op == "]" || op == "}") {
        const char expected = op == ")" ? '(' : op == "]" ? '[' : '{';
        if (balance.empty()) fail("unexpected '" + std::string(op) + "'", start);
        if (balance.back() != expected) {
          const char want = balance.back() == '(' ? ')' : balance.back() == '[' ? ']' : '}';
          fail("unexpected '" + std::string(op) + "', expected '" + want + "'", start);
        }
        balance.pop_back();
      }
      Token t = make_token(TokenType::Operator, start);
      t.text = std::string(op);
      tokens_.push_back(std::move(t));
      pos_ += op.size();
      return;
    }
    std::string shown;
    size_t next = pos_;
    text::append_utf8(shown, text::next_code_point(source_, next));
    fail("unexpected char " + text::repr(shown), start);
  }

  // Digits with optional single underscores between them (jinja2's (\d+_)*\d+).
  size_t scan_digits(size_t p, bool (*digit)(char)) const {
    if (p >= source_.size() || !digit(source_[p])) return std::string::npos;
    while (p < source_.size()) {
      if (digit(source_[p])) {
        ++p;
      } else if (source_[p] == '_' && p + 1 < source_.size() && digit(source_[p + 1])) {
        p += 2;
      } else {
        break;
      }
    }
    return p;
  }

  void lex_number() {
    if (lex_prefixed_integer()) return;
    const size_t int_end = scan_digits(pos_, is_digit);
    const size_t float_end = scan_float(int_end);
    if (float_end != std::string::npos) {
      Token t = make_token(TokenType::Float, pos_);
      t.float_value = std::strtod(without_underscores(pos_, float_end).c_str(), nullptr);
      t.text = source_.substr(pos_, float_end - pos_);
      pos_ = float_end;
      tokens_.push_back(std::move(t));
      return;
    }
    // Decimal integer: [1-9](_?\d)* or 0(_?0)*.
    size_t end = pos_ + 1;
    if (source_[pos_] == '0') {
      while (end < source_.size()) {
        if (source_[end] == '0') {
          ++end;
        } else if (source_[end] == '_' && end + 1 < source_.size() && source_[end + 1] == '0') {
          end += 2;
        } else {
          break;
        }
      }
    } else {
      end = int_end;
    }
    push_integer(pos_, end, 10);
  }

  // Prefixed integers: 0b, 0o, 0x (an underscore may follow the prefix). False when the
  // number at pos_ is none.
  bool lex_prefixed_integer() {
    if (source_[pos_] != '0' || pos_ + 1 >= source_.size()) return false;
    const char p = static_cast<char>(source_[pos_ + 1] | 0x20);
    const int base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
    if (base == 0) return false;
    size_t q = pos_ + 2;
    while (q < source_.size()) {
      const char d = static_cast<char>(source_[q] | 0x20);
      const bool ok = base == 2 ? (d == '0' || d == '1')
                      : base == 8 ? (d >= '0' && d <= '7')
                                  : (is_digit(source_[q]) || (d >= 'a' && d <= 'f'));
      if (ok) {
        ++q;
      } else if (source_[q] == '_' && q + 1 < source_.size()) {
        ++q;
      } else {
        break;
      }
    }
    if (q == pos_ + 2) return false;
    push_integer(pos_ + 2, q, base);
    return true;
  }

  // The end of a float literal whose integer part ends at int_end: digits '.' digits
  // [exponent] | digits exponent; npos when the number is no float.
  size_t scan_float(size_t int_end) const {
    size_t q = int_end;
    bool is_float = false;
    if (q < source_.size() && source_[q] == '.') {
      const size_t frac_end = scan_digits(q + 1, is_digit);
      if (frac_end != std::string::npos) {
        q = frac_end;
        is_float = true;
      }
    }
    if (q < source_.size() && (source_[q] == 'e' || source_[q] == 'E')) {
      size_t e = q + 1;
      if (e < source_.size() && (source_[e] == '+' || source_[e] == '-')) ++e;
      const size_t exp_end = scan_digits(e, is_digit);
      if (exp_end != std::string::npos) {
        q = exp_end;
        is_float = true;
      }
    }
    return is_float ? q : std::string::npos;
  }

  // Emits the integer literal from pos_ to `end` whose digits (in `base`) start at digits_begin.
  void push_integer(size_t digits_begin, size_t end, int base) {
    const size_t start = pos_;
    const std::string digits = without_underscores(digits_begin, end);
    Token t = make_token(TokenType::Integer, start);
    errno = 0;
    char* digits_end = nullptr;
    const unsigned long long v = std::strtoull(digits.c_str(), &digits_end, base);
    if (errno != 0 || v > static_cast<unsigned long long>(INT64_MAX) || digits_end != digits.c_str() + digits.size()) {
      fail("integer literal out of range (step35 keeps integers in 64 bits)", start);
    }
    t.int_value = static_cast<int64_t>(v);
    t.text = source_.substr(start, end - start);
    pos_ = end;
    tokens_.push_back(std::move(t));
  }

  std::string without_underscores(size_t from, size_t to) const {
    std::string s;
    for (size_t i = from; i < to; ++i)
      if (source_[i] != '_') s += source_[i];
    return s;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A quoted literal; escapes as Python's unicode-escape codec reads them.
  void lex_string() {
    const size_t start = pos_;
    const char quote = source_[pos_];
    size_t p = pos_ + 1;
    std::string value;
    while (true) {
      if (p >= source_.size()) fail("unexpected char " + text::repr(std::string(1, quote)), start);
      const char c = source_[p];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= source_.size()) fail("unexpected char " + text::repr(std::string(1, quote)), start);
      const char e = source_[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t count = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < count; ++i) {
            const int h = p + i < source_.size() ? hex_value(source_[p + i]) : -1;
            if (h < 0) fail(std::string("truncated \\") + e + std::string(count, 'X') + " escape", start);
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          if (cp > 0x10FFFF) fail("illegal Unicode character", start);
          text::append_utf8(value, cp);
          p += count;
          break;
        }
        case 'N': fail("\\N{...} escapes are not supported", start);
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && p < source_.size() && source_[p] >= '0' && source_[p] <= '7'; ++i, ++p) {
              cp = cp * 8 + static_cast<uint32_t>(source_[p] - '0');
            }
            text::append_utf8(value, cp);
          } else {
            value += '\\';
            value += e;
          }
          break;
      }
    }
    Token t = make_token(TokenType::String, start);
    t.text = std::move(value);
    pos_ = p + 1;
    tokens_.push_back(std::move(t));
  }

  LexerOptions options_;
  std::string source_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
  size_t position_offset_ = 0;
  uint32_t line_ = 1;
  uint32_t column_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  if (!text::is_valid_utf8(source)) throw Error(ErrorKind::Syntax, "the template is not valid UTF-8", 1, 1);
  return Lexer(source, options).run();
}

std::string describe_token(const Token& token) {
  switch (token.type) {
    case TokenType::Text: return "template data";
    case TokenType::VariableBegin: return "begin of print statement";
    case TokenType::VariableEnd: return "end of print statement";
    case TokenType::BlockBegin: return "begin of statement block";
    case TokenType::BlockEnd: return "end of statement block";
    case TokenType::Name: return token.text;
    case TokenType::String: return "string";
    case TokenType::Integer: return "integer";
    case TokenType::Float: return "float";
    case TokenType::Operator: return token.text;
    case TokenType::End: return "end of template";
  }
  return "token";
}

}  // namespace step35::jinja
