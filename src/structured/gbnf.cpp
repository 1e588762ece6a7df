#include "structured/gbnf.h"

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "structured/regex_grammar.h"
#include "tokenizer/unicode.h"

namespace step35::grammar {

namespace {

constexpr uint64_t kUnbounded = UINT64_MAX;

// The parsed grammar: rules of alternatives of sequences of items. Groups are stored by
// index so the tree needs no pointers.
struct Item {
  enum class Kind : uint8_t { Literal, Class, Any, Rule, Group };
  Kind kind = Kind::Literal;
  std::string text;        // Literal: UTF-8; Rule: the name
  CpSet set;               // Class
  size_t group = 0;        // Group: index into Parsed::groups
  uint64_t min = 1, max = 1;
};
using Sequence = std::vector<Item>;
using Alternatives = std::vector<Sequence>;

struct Parsed {
  std::vector<std::pair<std::string, Alternatives>> rules;  // in definition order
  std::vector<Alternatives> groups;
};

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  Parsed parse() {
    skip_space(true);
    while (pos_ < src_.size()) {
      parse_rule();
      skip_space(true);
    }
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw std::invalid_argument("grammar: " + what + " at line " + std::to_string(line) + ", column " +
                                std::to_string(col));
  }

  bool at_end() const { return pos_ >= src_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0'; }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  }

  // Spaces, tabs and comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(src_.substr(start, pos_ - start));
  }

  uint64_t parse_count() {
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a number");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + uint64_t(peek() - '0');
      if (v > kMaxGbnfRepetition) fail("more than " + std::to_string(kMaxGbnfRepetition) + " repetitions");
      ++pos_;
    }
    return v;
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      uint32_t d;
      if (c >= '0' && c <= '9') d = uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') d = uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = uint32_t(c - 'A' + 10);
      else fail("expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  uint32_t parse_char() {
    if (at_end()) fail("unexpected end of the grammar");
    if (peek() == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      uint32_t cp = 0;
      switch (e) {
        case 'x': cp = parse_hex(2); break;
        case 'u': cp = parse_hex(4); break;
        case 'U': cp = parse_hex(8); break;
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': return uint32_t(uint8_t(e));
        default: --pos_; fail(std::string("unknown escape '\\") + e + "'");
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("escape outside the Unicode scalar values");
      return cp;
    }
    const uint8_t c = uint8_t(peek());
    const int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || pos_ + size_t(len) > src_.size()) fail("invalid UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const uint8_t cc = uint8_t(src_[pos_ + size_t(i)]);
      if ((cc & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (cc & 0x3F);
    }
    pos_ += size_t(len);
    return cp;
  }

  void parse_rule() {
    const std::string name = parse_name();
    skip_space(false);
    if (src_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
    pos_ += 3;
    skip_space(true);
    for (const auto& r : out_.rules)
      if (r.first == name) fail("rule '" + name + "' is defined twice");
    Alternatives alts = parse_alternatives(false);
    if (!at_end()) {
      if (peek() == '\r') ++pos_;
      if (peek() != '\n') fail(std::string("unexpected '") + peek() + "'");
      ++pos_;
    }
    out_.rules.emplace_back(name, std::move(alts));
  }

  Alternatives parse_alternatives(bool nested) {
    Alternatives alts;
    alts.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  Sequence parse_sequence(bool nested) {
    Sequence seq;
    for (;;) {
      const char c = peek();
      Item it;
      if (c == '"') {
        ++pos_;
        while (peek() != '"') unicode::append_utf8(it.text, parse_char());
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        bool negate = false;
        if (peek() == '^') {
          negate = true;
          ++pos_;
        }
        CpSet set;
        while (peek() != ']') {
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
            ++pos_;
            hi = parse_char();
            if (hi < lo) fail("character range out of order");
          }
          set.push_back({lo, hi});
        }
        ++pos_;
        set = cp_normalize(std::move(set));
        it.kind = Item::Kind::Class;
        it.set = negate ? cp_complement(set) : set;
      } else if (c == '.') {
        ++pos_;
        it.kind = Item::Kind::Any;
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        Alternatives inner = parse_alternatives(true);
        if (peek() != ')') fail("expected ')'");
        ++pos_;
        it.kind = Item::Kind::Group;
        it.group = out_.groups.size();
        out_.groups.push_back(std::move(inner));
      } else if (is_name_char(c) && c != '\0') {
        it.kind = Item::Kind::Rule;
        it.text = parse_name();
      } else if (c == '<' || c == '!') {
        fail("token references (<...>) are not supported");
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        fail(std::string("'") + c + "' with nothing to repeat");
      } else {
        break;
      }
      skip_space(nested);
      parse_repetition(it, nested);
      seq.push_back(std::move(it));
    }
    return seq;
  }

  void parse_repetition(Item& it, bool nested) {
    const char c = peek();
    if (c == '*') {
      it.min = 0, it.max = kUnbounded;
    } else if (c == '+') {
      it.min = 1, it.max = kUnbounded;
    } else if (c == '?') {
      it.min = 0, it.max = 1;
    } else if (c == '{') {
      ++pos_;
      skip_space(nested);
      it.min = parse_count();
      skip_space(nested);
      it.max = it.min;
      if (peek() == ',') {
        ++pos_;
        skip_space(nested);
        it.max = peek() >= '0' && peek() <= '9' ? parse_count() : kUnbounded;
        skip_space(nested);
      }
      if (peek() != '}') fail("expected '}'");
      if (it.max < it.min) fail("repetition {m,n} with n < m");
    } else {
      return;
    }
    ++pos_;
    skip_space(nested);
    if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{') fail("a repetition of a repetition");
  }

  std::string_view src_;
  size_t pos_ = 0;
  Parsed out_;
};

class Emitter {
 public:
  Emitter(const Parsed& p, Builder& b) : p_(p), b_(b) {}

  std::shared_ptr<const Grammar> build() {
    for (const auto& [name, alts] : p_.rules) rule_ids_[name] = b_.add_rule(name);
    const auto root = rule_ids_.find("root");
    if (root == rule_ids_.end()) throw std::invalid_argument("grammar: no 'root' rule");
    for (const auto& [name, alts] : p_.rules) b_.set_entry(rule_ids_[name], alternatives(alts, b_.ret()));
    return b_.finish(root->second);
  }

 private:
  uint32_t alternatives(const Alternatives& alts, uint32_t next) {
    std::vector<uint32_t> options;
    for (const Sequence& s : alts) options.push_back(sequence(s, next));
    return b_.alt(std::move(options));
  }

  uint32_t sequence(const Sequence& s, uint32_t next) {
    for (size_t i = s.size(); i-- > 0;) next = item(s[i], next);
    return next;
  }

  uint32_t item(const Item& it, uint32_t next) {
    uint32_t tail = next;
    if (it.max == kUnbounded) {
      const uint32_t loop = b_.placeholder();
      b_.set_options(loop, {atom(it, loop), next});
      tail = loop;
    } else {
      for (uint64_t k = it.min; k < it.max; ++k) tail = b_.alt({atom(it, tail), next});
    }
    for (uint64_t k = 0; k < it.min; ++k) tail = atom(it, tail);
    return tail;
  }

  uint32_t atom(const Item& it, uint32_t next) {
    switch (it.kind) {
      case Item::Kind::Literal: return emit_text(b_, it.text, TextMode::Raw, next);
      case Item::Kind::Class: return emit_char_set(b_, it.set, TextMode::Raw, next);
      case Item::Kind::Any: return emit_char_set(b_, cp_all(), TextMode::Raw, next);
      case Item::Kind::Rule: {
        const auto r = rule_ids_.find(it.text);
        if (r == rule_ids_.end()) throw std::invalid_argument("grammar: undefined rule '" + it.text + "'");
        return b_.call(r->second, next);
      }
      case Item::Kind::Group: return alternatives(p_.groups[it.group], next);
    }
    return b_.dead();
  }

  const Parsed& p_;
  Builder& b_;
  std::map<std::string, uint32_t> rule_ids_;
};

}  // namespace

std::shared_ptr<const Grammar> compile_gbnf(std::string_view source) {
  const Parsed parsed = Parser(source).parse();
  Builder b;
  return Emitter(parsed, b).build();
}

}  // namespace step35::grammar
