// JSON Schema compiled into grammars, alone or as parts of a larger grammar (the chat
// format's tool calls, src/chat/). Supported subset and policies: docs/structured-output.md.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "structured/json_schema.h"
#include "structured/regex_grammar.h"

namespace step35::grammar {

namespace {

constexpr int64_t kIntCap = 999999999999999999LL;  // 18 digits: integers the grammar writes
constexpr uint32_t kMaxIntDigits = 18;
constexpr uint32_t kMaxFracDigits = 17;
constexpr uint32_t kMaxExpDigits = 2;  // |exponent| <= 99 keeps every number a finite double
constexpr uint32_t kWsLeading = 2;   // spaces/tabs before a newline (or alone)
constexpr uint32_t kWsNewlines = 2;  // newlines ("\n" or "\r\n")
constexpr uint32_t kWsIndent = 32;   // spaces/tabs after the last newline

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::invalid_argument(why + " at " + path);
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> s = {
      "type",      "properties", "required",  "additionalProperties", "items",            "prefixItems",
      "additionalItems", "minItems", "maxItems", "enum",              "const",            "anyOf",
      "oneOf",     "allOf",      "$ref",      "minLength",            "maxLength",        "pattern",
      "format",    "minimum",    "maximum",   "exclusiveMinimum",     "exclusiveMaximum", "nullable",
      "uniqueItems"};
  return s;
}

bool has_constraints(const json& s, const std::set<std::string>& ignore = {}) {
  if (!s.is_object()) return true;
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!is_annotation_keyword(it.key()) && !ignore.count(it.key())) return true;
  return false;
}

// ---------------------------------------------------------------------------------------
// Keyword accessors with type checks.

std::optional<uint64_t> get_count(const json& s, const char* key, const std::string& path) {
  auto it = s.find(key);
  if (it == s.end()) return std::nullopt;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer() && it->get<int64_t>() >= 0) return uint64_t(it->get<int64_t>());
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (d >= 0 && std::floor(d) == d) return d >= 1.8e19 ? UINT64_MAX - 1 : uint64_t(d);  // huge: above every limit
  }
  fail(path, std::string("'") + key + "' must be a non-negative integer");
}

const json* get_schema_map(const json& s, const char* key, const std::string& path) {
  auto it = s.find(key);
  if (it == s.end()) return nullptr;
  if (!it->is_object()) fail(path, std::string("'") + key + "' must be an object");
  return &*it;
}

const json* get_array(const json& s, const char* key, const std::string& path, bool non_empty) {
  auto it = s.find(key);
  if (it == s.end()) return nullptr;
  if (!it->is_array() || (non_empty && it->empty()))
    fail(path, std::string("'") + key + "' must be " + (non_empty ? "a non-empty array" : "an array"));
  return &*it;
}

std::vector<std::string> get_required(const json& s, const std::string& path) {
  std::vector<std::string> out;
  const json* r = get_array(s, "required", path, false);
  if (!r) return out;
  for (const json& k : *r) {
    if (!k.is_string()) fail(path, "'required' must be an array of strings");
    if (std::find(out.begin(), out.end(), k.get<std::string>()) == out.end()) out.push_back(k.get<std::string>());
  }
  return out;
}

const std::vector<std::string>& all_types() {
  static const std::vector<std::string> t = {"null", "boolean", "object", "array", "number", "string"};
  return t;
}

// The set of type names a schema allows ("number" includes "integer"); explicit or
// inferred from the keywords present (none: every type).
std::set<std::string> type_set(const json& s, const std::string& path) {
  std::set<std::string> out;
  auto it = s.find("type");
  if (it != s.end()) {
    std::vector<json> names;
    if (it->is_string())
      names.push_back(*it);
    else if (it->is_array())
      names.assign(it->begin(), it->end());
    else
      fail(path, "'type' must be a string or an array of strings");
    for (const json& n : names) {
      static const std::set<std::string> known = {"null", "boolean", "object", "array", "number", "string", "integer"};
      if (!n.is_string() || !known.count(n.get<std::string>()))
        fail(path, "'type' has an unknown type name " + n.dump());
      out.insert(n.get<std::string>());
    }
    if (out.count("number")) out.erase("integer");
    return out;
  }
  auto any_of = [&](std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      if (s.contains(k)) return true;
    return false;
  };
  if (any_of({"properties", "required", "additionalProperties"})) out.insert("object");
  if (any_of({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})) out.insert("array");
  if (any_of({"minLength", "maxLength", "pattern", "format"})) out.insert("string");
  if (any_of({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) out.insert("number");
  if (out.empty()) out.insert(all_types().begin(), all_types().end());
  return out;
}

std::set<std::string> type_intersection(const std::set<std::string>& a, const std::set<std::string>& b) {
  auto expand = [](std::set<std::string> s) {
    if (s.count("number")) s.insert("integer");
    return s;
  };
  const std::set<std::string> ea = expand(a), eb = expand(b);
  std::set<std::string> out;
  for (const std::string& t : ea)
    if (eb.count(t)) out.insert(t);
  if (out.count("number")) out.erase("integer");
  return out;
}

// ---------------------------------------------------------------------------------------
// Normalisation: top-level $ref (with siblings), allOf, const and draft-4 boolean
// exclusive bounds folded into one plain schema. Subschemas stay as they are.

json normalize(const json& root, const json& s, const std::string& path, int depth);

json merge(const json& root, const json& a, const json& b, const std::string& path, int depth) {
  if (depth > kMaxSchemaDepth) fail(path, "schema references/merges nest deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
  if (a.is_boolean()) return a.get<bool>() ? b : a;
  if (b.is_boolean()) return b.get<bool>() ? a : b;
  json out = a;
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "properties" || k == "additionalProperties" || k == "nullable") continue;  // below
    if (!out.contains(k)) {
      out[k] = v;
      continue;
    }
    json& o = out[k];
    if (k == "type") {
      const std::set<std::string> t = type_intersection(type_set(a, path), type_set(b, path));
      if (t.empty()) return json(false);
      o = json(std::vector<std::string>(t.begin(), t.end()));
    } else if (k == "required") {
      for (const json& r : v)
        if (std::find(o.begin(), o.end(), r) == o.end()) o.push_back(r);
    } else if (k == "minItems" || k == "minLength" || k == "minimum" || k == "exclusiveMinimum") {
      if (!v.is_number() || !o.is_number()) fail(path, "'" + k + "' must be a number");
      if (o < v) o = v;
    } else if (k == "maxItems" || k == "maxLength" || k == "maximum" || k == "exclusiveMaximum") {
      if (!v.is_number() || !o.is_number()) fail(path, "'" + k + "' must be a number");
      if (v < o) o = v;
    } else if (k == "enum") {
      if (!v.is_array() || !o.is_array()) fail(path, "'enum' must be an array");
      json keep = json::array();
      for (const json& x : o)
        if (std::find(v.begin(), v.end(), x) != v.end()) keep.push_back(x);
      o = keep;
    } else if (k == "items" && o.is_object() == v.is_object() && !o.is_array() && !v.is_array()) {
      o = merge(root, normalize(root, o, path + "/items", depth + 1), normalize(root, v, path + "/items", depth + 1),
                path + "/items", depth + 1);
    } else if (k == "anyOf" || k == "oneOf") {
      fail(path, "unsupported: allOf combining more than one '" + k + "'");
    } else if (o != v) {
      fail(path, "unsupported: allOf combining two different '" + k + "' values");
    }
  }
  if ((a.contains("anyOf") && b.contains("oneOf")) || (a.contains("oneOf") && b.contains("anyOf")))
    fail(path, "unsupported: allOf combining anyOf with oneOf");
  // properties / additionalProperties: a key undeclared on one side meets that side's
  // additionalProperties (false forbids it), so the merge is exact.
  const json* pa = a.contains("properties") ? &a["properties"] : nullptr;
  const json* pb = b.contains("properties") ? &b["properties"] : nullptr;
  const json* aa = a.contains("additionalProperties") ? &a["additionalProperties"] : nullptr;
  const json* ab = b.contains("additionalProperties") ? &b["additionalProperties"] : nullptr;
  if ((pa && !pa->is_object()) || (pb && !pb->is_object())) fail(path, "'properties' must be an object");
  if (pa || pb) {
    std::set<std::string> keys;
    if (pa)
      for (auto it = pa->begin(); it != pa->end(); ++it) keys.insert(it.key());
    if (pb)
      for (auto it = pb->begin(); it != pb->end(); ++it) keys.insert(it.key());
    json props = json::object();
    for (const std::string& key : keys) {
      const std::string kp = path_join(path + "/properties", key);
      const json sa = pa && pa->contains(key) ? (*pa)[key] : aa ? *aa : json(true);
      const json sb = pb && pb->contains(key) ? (*pb)[key] : ab ? *ab : json(true);
      props[key] = merge(root, normalize(root, sa, kp, depth + 1), normalize(root, sb, kp, depth + 1), kp, depth + 1);
    }
    out["properties"] = props;
  }
  if (aa && ab)
    out["additionalProperties"] = merge(root, normalize(root, *aa, path, depth + 1), normalize(root, *ab, path, depth + 1),
                                        path + "/additionalProperties", depth + 1);
  else if (aa || ab)
    out["additionalProperties"] = aa ? *aa : *ab;
  const bool nullable = a.value("nullable", false) == true && b.value("nullable", false) == true;
  out.erase("nullable");
  if (nullable) out["nullable"] = true;
  return out;
}

json normalize(const json& root, const json& s, const std::string& path, int depth) {
  if (depth > kMaxSchemaDepth) fail(path, "schema references/merges nest deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
  if (s.is_boolean()) return s;
  if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
  check_keywords(s, path);
  json out = json::object();
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (is_annotation_keyword(k) || k == "$ref" || k == "allOf" || k == "const") continue;
    out[k] = it.value();
  }
  if (s.contains("enum") && !s["enum"].is_array()) fail(path, "'enum' must be an array");
  if (s.contains("const")) {
    const json& c = s["const"];
    if (out.contains("enum")) {
      json keep = json::array();
      if (std::find(out["enum"].begin(), out["enum"].end(), c) != out["enum"].end()) keep.push_back(c);
      out["enum"] = keep;
    } else {
      out["enum"] = json::array({c});
    }
  }
  // Draft 4: "exclusiveMinimum": true turns "minimum" exclusive.
  for (const auto& [excl, incl] : {std::pair<const char*, const char*>{"exclusiveMinimum", "minimum"}, {"exclusiveMaximum", "maximum"}}) {
    if (!out.contains(excl) || !out[excl].is_boolean()) continue;
    const bool on = out[excl].get<bool>();
    out.erase(excl);
    if (on && out.contains(incl)) {
      out[excl] = out[incl];
      out.erase(incl);
    }
  }
  for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
    if (out.contains(k) && !out[k].is_number()) fail(path, std::string("'") + k + "' must be a number");
  if (s.contains("$ref")) {
    const std::string rp = s["$ref"].is_string() ? s["$ref"].get<std::string>() : path;
    const json target = normalize(root, resolve_ref(root, s["$ref"], path), rp, depth + 1);
    out = merge(root, target, out, path, depth + 1);
  }
  if (s.contains("allOf")) {
    const json* all = get_array(s, "allOf", path, true);
    for (size_t i = 0; i < all->size(); ++i) {
      const std::string ip = path + "/allOf/" + std::to_string(i);
      out = merge(root, out, normalize(root, (*all)[i], ip, depth + 1), ip, depth + 1);
      if (out.is_boolean() && !out.get<bool>()) break;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Shared rules: whitespace, any JSON value, strings, characters.

class Library {
 public:
  explicit Library(Builder& b) : b_(b) {}

  uint32_t ws() {
    if (ws_ != kNoNode) return ws_;
    ws_ = b_.add_rule("whitespace");
    const uint32_t end = b_.ret();
    uint32_t indent = end;  // up to kWsIndent spaces/tabs after the last newline
    for (uint32_t i = 0; i < kWsIndent; ++i) indent = b_.alt({space_or_tab(indent), end});
    uint32_t lines = indent;  // after the first newline, up to kWsNewlines - 1 more
    for (uint32_t i = 1; i < kWsNewlines; ++i) lines = b_.alt({newline(lines), indent});
    uint32_t after_lead = b_.alt({newline(lines), end});
    uint32_t lead = after_lead;  // up to kWsLeading spaces/tabs first
    for (uint32_t i = 0; i < kWsLeading; ++i) lead = b_.alt({space_or_tab(lead), after_lead});
    b_.set_entry(ws_, lead);
    return ws_;
  }
  uint32_t ws_then(uint32_t next) { return b_.call(ws(), next); }

  // One character of a JSON string literal: any UTF-8 scalar except '"', '\\' and
  // controls, or any valid escape (a surrogate pair as one character).
  uint32_t json_char(uint32_t next) {
    ByteSet hx;
    hx.add_range('0', '9');
    hx.add_range('a', 'f');
    hx.add_range('A', 'F');
    auto hex_n = [&](int n, uint32_t cont) {
      for (int i = 0; i < n; ++i) cont = b_.match(hx, cont);
      return cont;
    };
    ByteSet first_plain;  // first hex digit of a non-surrogate: 0-9 A-C E-F (either case)
    first_plain.add_range('0', '9');
    first_plain.add_range('a', 'c');
    first_plain.add_range('A', 'C');
    first_plain.add_range('e', 'f');
    first_plain.add_range('E', 'F');
    ByteSet d;
    d.add('d');
    d.add('D');
    ByteSet high2, low2;
    high2.add_range('8', '9');
    high2.add_range('a', 'b');
    high2.add_range('A', 'B');
    low2.add_range('c', 'f');
    low2.add_range('C', 'F');
    const uint32_t low = b_.match(d, b_.match(low2, hex_n(2, next)));
    const uint32_t u = b_.alt({b_.match(first_plain, hex_n(3, next)), b_.match(d, b_.range('0', '7', hex_n(2, next))),
                               b_.match(d, b_.match(high2, hex_n(2, b_.literal("\\u", low))))});
    ByteSet simple;
    for (char c : std::string("\"\\/bfnrt")) simple.add(uint8_t(c));
    const uint32_t esc = b_.byte('\\', b_.alt({b_.match(simple, next), b_.byte('u', u)}));
    return b_.alt({emit_char_set(b_, cp_minus(cp_all(), {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}), TextMode::Raw, next), esc});
  }

  uint32_t json_char_rule() {
    if (char_ == kNoNode) {
      char_ = b_.add_rule("string character");
      b_.set_entry(char_, json_char(b_.ret()));
    }
    return char_;
  }
  uint32_t raw_char_rule() {  // tool-call parameter text: one UTF-8 character, no NUL / newline
    if (raw_char_ == kNoNode) {
      raw_char_ = b_.add_rule("text character");
      b_.set_entry(raw_char_, emit_char_set(b_, cp_all(), TextMode::RawLine, b_.ret()));
    }
    return raw_char_;
  }

  uint32_t string_rule() {  // any JSON string literal
    if (str_ == kNoNode) {
      str_ = b_.add_rule("string");
      const uint32_t loop = b_.placeholder();
      b_.set_options(loop, {json_char(loop), b_.byte('"', b_.ret())});
      b_.set_entry(str_, b_.byte('"', loop));
    }
    return str_;
  }

  uint32_t integer(uint32_t next) {
    uint32_t digits = next;
    for (uint32_t i = 1; i < kMaxIntDigits; ++i) digits = b_.alt({b_.range('0', '9', digits), next});
    const uint32_t magnitude = b_.alt({b_.byte('0', next), b_.range('1', '9', digits)});
    return b_.alt({b_.byte('-', magnitude), magnitude});
  }

  uint32_t number(uint32_t next) {
    uint32_t exp_digits = next;
    for (uint32_t i = 1; i < kMaxExpDigits; ++i) exp_digits = b_.alt({b_.range('0', '9', exp_digits), next});
    exp_digits = b_.range('0', '9', exp_digits);
    ByteSet e, sign;
    e.add('e');
    e.add('E');
    sign.add('+');
    sign.add('-');
    const uint32_t exp = b_.alt({b_.match(e, b_.alt({b_.match(sign, exp_digits), exp_digits})), next});
    const uint32_t frac = b_.alt({b_.byte('.', fraction_digits(exp)), exp});
    return integer(frac);
  }

  uint32_t fraction_digits(uint32_t next) {  // [0-9]{1,kMaxFracDigits}
    uint32_t d = next;
    for (uint32_t i = 1; i < kMaxFracDigits; ++i) d = b_.alt({b_.range('0', '9', d), next});
    return b_.range('0', '9', d);
  }

  uint32_t any_rule() {  // any JSON value
    if (any_ != kNoNode) return any_;
    any_ = b_.add_rule("any value");
    const uint32_t ret = b_.ret();
    b_.set_entry(any_, b_.alt({b_.call(object_rule(), ret), b_.call(array_rule(), ret), b_.call(string_rule(), ret),
                               number(ret), b_.literal("true", ret), b_.literal("false", ret), b_.literal("null", ret)}));
    return any_;
  }

  uint32_t object_rule() {  // any JSON object: { ws ( } | member (ws , ws member)* ws } )
    if (object_ != kNoNode) return object_;
    object_ = b_.add_rule("any object");
    const uint32_t ret = b_.ret();
    const uint32_t loop = b_.placeholder();
    const uint32_t member =
        b_.call(string_rule(), ws_then(b_.byte(':', ws_then(b_.call(any_rule(), ws_then(loop))))));
    b_.set_options(loop, {b_.byte(',', ws_then(member)), b_.byte('}', ret)});
    b_.set_entry(object_, b_.byte('{', ws_then(b_.alt({b_.byte('}', ret), member}))));
    return object_;
  }

  uint32_t array_rule() {  // any JSON array
    if (array_ != kNoNode) return array_;
    array_ = b_.add_rule("any array");
    const uint32_t ret = b_.ret();
    const uint32_t loop = b_.placeholder();
    const uint32_t element = b_.call(any_rule(), ws_then(loop));
    b_.set_options(loop, {b_.byte(',', ws_then(element)), b_.byte(']', ret)});
    b_.set_entry(array_, b_.byte('[', ws_then(b_.alt({b_.byte(']', ret), element}))));
    return array_;
  }

 private:
  uint32_t space_or_tab(uint32_t next) {
    ByteSet s;
    s.add(' ');
    s.add('\t');
    return b_.match(s, next);
  }
  uint32_t newline(uint32_t next) { return b_.alt({b_.byte('\n', next), b_.literal("\r\n", next)}); }

  Builder& b_;
  uint32_t ws_ = kNoNode, char_ = kNoNode, raw_char_ = kNoNode, str_ = kNoNode, any_ = kNoNode, object_ = kNoNode,
           array_ = kNoNode;
};

// ---------------------------------------------------------------------------------------
// Integer ranges as digit grammars (no leading zeros).

class Digits {
 public:
  explicit Digits(Builder& b) : b_(b) {}

  uint32_t any(size_t k, uint32_t next) {
    for (size_t i = 0; i < k; ++i) next = b_.range('0', '9', next);
    return next;
  }

  // Decimal strings of equal length between lo and hi (inclusive, lo <= hi).
  uint32_t same_length(const std::string& lo, const std::string& hi, uint32_t next) {
    if (lo.empty()) return next;
    const size_t rest = lo.size() - 1;
    const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
    if (lo[0] == hi[0]) return b_.byte(uint8_t(lo[0]), same_length(lo_rest, hi_rest, next));
    const bool lo_full = lo_rest == std::string(rest, '0');  // lo[0] takes every tail
    const bool hi_full = hi_rest == std::string(rest, '9');
    std::vector<uint32_t> opts;
    const char mid_lo = char(lo_full ? lo[0] : lo[0] + 1), mid_hi = char(hi_full ? hi[0] : hi[0] - 1);
    if (!lo_full) opts.push_back(b_.byte(uint8_t(lo[0]), same_length(lo_rest, std::string(rest, '9'), next)));
    if (mid_lo <= mid_hi) opts.push_back(b_.range(uint8_t(mid_lo), uint8_t(mid_hi), any(rest, next)));
    if (!hi_full) opts.push_back(b_.byte(uint8_t(hi[0]), same_length(std::string(rest, '0'), hi_rest, next)));
    return b_.alt(std::move(opts));
  }

  // Non-negative integers in [a, b].
  uint32_t range(uint64_t a, uint64_t b, uint32_t next) {
    std::vector<uint32_t> opts;
    uint64_t lo_of_len = 0, hi_of_len = 9;
    for (size_t len = 1; len <= 19 && a <= b; ++len) {
      const uint64_t lo = std::max(a, lo_of_len), hi = std::min(b, hi_of_len);
      if (lo <= hi) opts.push_back(same_length(std::to_string(lo), std::to_string(hi), next));
      lo_of_len = hi_of_len + 1;
      if (hi_of_len > UINT64_MAX / 10) break;
      hi_of_len = hi_of_len * 10 + 9;
    }
    return b_.alt(std::move(opts));
  }

  // Integers in [lo, hi] ("-0" never).
  uint32_t signed_range(int64_t lo, int64_t hi, uint32_t next) {
    std::vector<uint32_t> opts;
    if (lo > hi) return b_.dead();
    if (lo < 0) {
      const int64_t top = std::min<int64_t>(hi, -1);
      opts.push_back(b_.byte('-', range(uint64_t(-top), uint64_t(-lo), next)));
    }
    if (hi >= 0) opts.push_back(range(uint64_t(std::max<int64_t>(lo, 0)), uint64_t(hi), next));
    return b_.alt(std::move(opts));
  }

 private:
  Builder& b_;
};

struct Bound {
  bool present = false;
  long double value = 0;
  bool exclusive = false;
};

int64_t clamp_int(long double v) {
  if (v > (long double)kIntCap) return kIntCap + 1;  // out of the writable range on purpose
  if (v < -(long double)kIntCap) return -kIntCap - 1;
  return int64_t(v);
}

// ---------------------------------------------------------------------------------------

class SchemaCompiler {
 public:
  SchemaCompiler(Builder& b, Library& lib, const json& root) : b_(b), lib_(lib), root_(root) {}

  uint32_t value(const json& s, const std::string& path, uint32_t next, int depth) {
    guard(path, depth);
    if (s.is_boolean()) return s.get<bool>() ? b_.call(lib_.any_rule(), next) : b_.dead();
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    check_keywords(s, path);
    if (!has_constraints(s)) return b_.call(lib_.any_rule(), next);
    if (s.contains("$ref") && !has_constraints(s, {"$ref"})) return ref_call(s["$ref"], path, next, depth);
    return normalized(normalize(root_, s, path, depth), path, next, depth);
  }

  // A rule for `s` (so it can be called from many places without copying it).
  uint32_t rule_for(const json& s, const std::string& path, int depth) {
    const uint32_t r = b_.add_rule(path);
    b_.set_entry(r, value(s, path, b_.ret(), depth + 1));
    return r;
  }

  // String content (no quotes in the raw modes) for a normalised string schema.
  uint32_t string_body(const json& n, const std::string& path, TextMode mode, uint32_t next) {
    const std::optional<uint64_t> min_len = get_count(n, "minLength", path), max_len = get_count(n, "maxLength", path);
    const bool lengths = min_len || max_len;
    const char* fmt = nullptr;
    if (n.contains("format")) {
      if (!n["format"].is_string()) fail(path, "'format' must be a string");
      fmt = format_pattern(n["format"].get<std::string>());  // nullptr: not enforced (annotation)
    }
    if (fmt || n.contains("pattern")) {
      if (fmt && n.contains("pattern")) fail(path, "unsupported: 'format' together with 'pattern'");
      if (lengths) fail(path, std::string("unsupported: '") + (fmt ? "format" : "pattern") + "' together with minLength/maxLength");
      if (!fmt && !n["pattern"].is_string()) fail(path, "'pattern' must be a string");
      const std::string pat = fmt ? std::string(fmt) : n["pattern"].get<std::string>();
      try {
        return emit_regex(b_, parse_regex(pat), mode, next);
      } catch (const std::invalid_argument& e) {  // a bad pattern, or a grammar too large
        fail(path, e.what());
      }
    }
    const uint64_t lo = min_len.value_or(0);
    const uint64_t hi = max_len.value_or(UINT64_MAX);
    if (lo > hi) return b_.dead();
    const uint32_t ch = mode == TextMode::Json ? lib_.json_char_rule() : lib_.raw_char_rule();
    if (lo > kMaxCount || (hi != UINT64_MAX && hi > kMaxCount))
      fail(path, "string length bounds above " + std::to_string(kMaxCount) + " are not supported");
    uint32_t cur = next;
    if (hi == UINT64_MAX) {
      const uint32_t loop = b_.placeholder();
      b_.set_options(loop, {b_.call(ch, loop), next});
      cur = loop;
    } else {
      for (uint64_t i = lo; i < hi; ++i) cur = b_.alt({b_.call(ch, cur), next});
    }
    for (uint64_t i = 0; i < lo; ++i) cur = b_.call(ch, cur);
    return cur;
  }

  const json& root() const { return root_; }

 private:
  void guard(const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) fail(path, "schema nested deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
    if (b_.size() + 4096 > b_.max_nodes())
      fail(path, "schema too large (its grammar exceeds " + std::to_string(b_.max_nodes()) + " states)");
  }

  uint32_t ref_call(const json& ref, const std::string& path, uint32_t next, int depth) {
    const json& target = resolve_ref(root_, ref, path);
    const std::string key = ref.get<std::string>();
    auto it = refs_.find(key);
    if (it == refs_.end()) {
      const uint32_t r = b_.add_rule("$ref " + key);
      it = refs_.emplace(key, r).first;
      b_.set_entry(r, value(target, key, b_.ret(), depth + 1));
    }
    return b_.call(it->second, next);
  }

  uint32_t normalized(const json& n, const std::string& path, uint32_t next, int depth) {
    if (n.is_boolean()) return n.get<bool>() ? b_.call(lib_.any_rule(), next) : b_.dead();
    const bool any_of = n.contains("anyOf"), one_of = n.contains("oneOf");
    if (any_of && one_of) fail(path, "unsupported: anyOf together with oneOf");
    if (any_of || one_of) {
      const char* key = any_of ? "anyOf" : "oneOf";
      const json* branches = get_array(n, key, path, true);
      json rest = n;
      rest.erase(key);
      std::vector<uint32_t> opts;
      for (size_t i = 0; i < branches->size(); ++i) {
        const std::string bp = path + "/" + key + "/" + std::to_string(i);
        const json& br = (*branches)[i];
        if (!has_constraints(rest)) {
          opts.push_back(value(br, bp, next, depth + 1));
        } else {
          const json merged = merge(root_, rest, normalize(root_, br, bp, depth + 1), bp, depth + 1);
          opts.push_back(normalized(merged, bp, next, depth + 1));
        }
      }
      return b_.alt(std::move(opts));
    }
    if (n.value("nullable", false) == true) {
      json rest = n;
      rest.erase("nullable");
      return b_.alt({normalized(rest, path, next, depth + 1), b_.literal("null", next)});
    }
    if (n.contains("enum")) return enum_values(n, path, next);
    std::vector<uint32_t> opts;
    for (const std::string& t : type_set(n, path)) {
      if (t == "null") opts.push_back(b_.literal("null", next));
      if (t == "boolean") opts.push_back(b_.alt({b_.literal("true", next), b_.literal("false", next)}));
      if (t == "integer") opts.push_back(integer(n, path, next));
      if (t == "number") opts.push_back(number(n, path, next));
      if (t == "string") opts.push_back(string(n, path, next));
      if (t == "array") opts.push_back(array(n, path, next, depth));
      if (t == "object") opts.push_back(object(n, path, next, depth));
    }
    return b_.alt(std::move(opts));
  }

  // enum/const: the listed values that also satisfy the other keywords, written compactly.
  uint32_t enum_values(const json& n, const std::string& path, uint32_t next) {
    json rest = n;
    rest.erase("enum");
    std::vector<uint32_t> opts;
    for (const json& v : n["enum"]) {
      if (!validate_value(root_, rest, v).empty()) continue;
      std::string text;
      try {
        text = v.dump();
      } catch (const json::exception&) {
        fail(path, "an 'enum'/'const' value is not valid UTF-8");
      }
      opts.push_back(b_.literal(text, next));
    }
    return b_.alt(std::move(opts));
  }

  Bound bound(const json& n, const char* incl, const char* excl, bool lower) {
    Bound b;
    auto take = [&](const json& v, bool exclusive) {
      const long double x = v.is_number_float() ? (long double)v.get<double>()
                            : v.is_number_unsigned() ? (long double)v.get<uint64_t>()
                                                     : (long double)v.get<int64_t>();
      const bool tighter = !b.present || (lower ? (x > b.value || (x == b.value && exclusive))
                                                : (x < b.value || (x == b.value && exclusive)));
      if (tighter) b = Bound{true, x, exclusive};
    };
    if (n.contains(incl)) take(n[incl], false);
    if (n.contains(excl)) take(n[excl], true);
    return b;
  }

  uint32_t integer(const json& n, const std::string& path, uint32_t next) {
    (void)path;
    const Bound lo = bound(n, "minimum", "exclusiveMinimum", true), hi = bound(n, "maximum", "exclusiveMaximum", false);
    if (!lo.present && !hi.present) return lib_.integer(next);
    const int64_t ilo = lo.present ? clamp_int(lo.exclusive ? std::floor(lo.value) + 1 : std::ceil(lo.value)) : -kIntCap;
    const int64_t ihi = hi.present ? clamp_int(hi.exclusive ? std::ceil(hi.value) - 1 : std::floor(hi.value)) : kIntCap;
    Digits d(b_);
    return d.signed_range(std::max(ilo, -kIntCap), std::min(ihi, kIntCap), next);
  }

  // Bounded numbers: integers in range, plus decimals k.f / -k.f whose every fraction
  // stays in range (k strictly inside); no exponents. A sound subset of the range.
  uint32_t number(const json& n, const std::string& path, uint32_t next) {
    const Bound lo = bound(n, "minimum", "exclusiveMinimum", true), hi = bound(n, "maximum", "exclusiveMaximum", false);
    if (!lo.present && !hi.present) return lib_.number(next);
    std::vector<uint32_t> opts{integer(n, path, next)};
    Digits d(b_);
    const uint32_t frac = b_.byte('.', lib_.fraction_digits(next));
    const int64_t k_lo_pos = lo.present ? clamp_int(lo.exclusive ? std::floor(lo.value) + 1 : std::ceil(lo.value)) : 0;
    const int64_t k_hi_pos = hi.present ? clamp_int(std::floor(hi.value) - 1) : kIntCap;
    const int64_t a = std::max<int64_t>(k_lo_pos, 0), b = std::min(k_hi_pos, kIntCap);
    if (a <= b) opts.push_back(d.range(uint64_t(a), uint64_t(b), frac));
    const int64_t k_lo_neg = hi.present ? clamp_int(hi.exclusive ? std::floor(-hi.value) + 1 : std::ceil(-hi.value)) : 0;
    const int64_t k_hi_neg = lo.present ? clamp_int(std::floor(-lo.value) - 1) : kIntCap;
    const int64_t c = std::max<int64_t>(k_lo_neg, 0), e = std::min(k_hi_neg, kIntCap);
    if (c <= e) opts.push_back(b_.byte('-', d.range(uint64_t(c), uint64_t(e), frac)));
    return b_.alt(std::move(opts));
  }

  uint32_t string(const json& n, const std::string& path, uint32_t next) {
    const bool plain = !n.contains("minLength") && !n.contains("maxLength") && !n.contains("pattern") &&
                       !(n.contains("format") && n["format"].is_string() && format_pattern(n["format"].get<std::string>()));
    if (plain) {
      if (n.contains("format") && !n["format"].is_string()) fail(path, "'format' must be a string");
      return b_.call(lib_.string_rule(), next);
    }
    return b_.byte('"', string_body(n, path, TextMode::Json, b_.byte('"', next)));
  }

  uint32_t array(const json& n, const std::string& path, uint32_t next, int depth) {
    std::vector<const json*> prefix;
    std::string prefix_key = "prefixItems";
    const json* items = nullptr;  // schema for items after the prefix (nullptr: absent)
    if (const json* p = get_array(n, "prefixItems", path, false)) {
      for (const json& x : *p) prefix.push_back(&x);
      if (n.contains("items")) items = &n["items"];
    } else if (n.contains("items") && n["items"].is_array()) {  // draft 4-2019 tuple form
      prefix_key = "items";
      for (const json& x : n["items"]) prefix.push_back(&x);
      if (n.contains("additionalItems")) items = &n["additionalItems"];
    } else if (n.contains("items")) {
      items = &n["items"];
    }
    if (items && !items->is_object() && !items->is_boolean()) fail(path, "'items' must be a schema");
    const uint64_t min = get_count(n, "minItems", path).value_or(0);
    uint64_t max = get_count(n, "maxItems", path).value_or(UINT64_MAX);
    const bool items_false = items && items->is_boolean() && !items->get<bool>();
    if (items_false) max = std::min<uint64_t>(max, prefix.size());
    // No "items" after a prefix: extra items are allowed but not generated unless
    // minItems needs them.
    if (!items && !prefix.empty()) max = std::min<uint64_t>(max, std::max<uint64_t>(prefix.size(), min));
    if (min > max) return b_.dead();
    if (prefix.empty() && !items && min == 0 && max == UINT64_MAX) return b_.call(lib_.array_rule(), next);
    const uint64_t unrolled = max == UINT64_MAX ? std::max<uint64_t>(prefix.size(), min) : max;
    if (unrolled > kMaxCount) fail(path, "array bounds above " + std::to_string(kMaxCount) + " items are not supported");

    std::vector<uint32_t> prefix_rules;
    for (size_t i = 0; i < prefix.size() && i < unrolled; ++i)
      prefix_rules.push_back(rule_for(*prefix[i], path + "/" + prefix_key + "/" + std::to_string(i), depth));
    uint32_t item_rule = kNoNode;  // made on first use
    auto element = [&](uint64_t index, uint32_t cont) {  // element `index` (0-based), then cont
      if (index < prefix_rules.size()) return b_.call(prefix_rules[index], cont);
      if (item_rule == kNoNode) {
        if (items) {
          item_rule = rule_for(*items, path + (prefix_key == "items" ? "/additionalItems" : "/items"), depth);
        } else {
          item_rule = b_.add_rule(path + "/items");
          b_.set_entry(item_rule, b_.call(lib_.any_rule(), b_.ret()));
        }
      }
      return b_.call(item_rule, cont);
    };
    const uint32_t close = b_.byte(']', next);
    // after[i]: i elements written, whitespace after the last one consumed.
    uint32_t after = kNoNode;
    uint64_t i;
    if (max == UINT64_MAX) {
      i = std::max<uint64_t>(unrolled, 1);
      const uint32_t loop = b_.placeholder();
      b_.set_options(loop, {b_.byte(',', lib_.ws_then(element(i, lib_.ws_then(loop)))), close});
      after = loop;
      // Elements past the loop start reuse the items rule, so the loop's element index only
      // has to be >= prefix size; i >= unrolled guarantees that.
    } else {
      i = max;
      after = close;
    }
    for (; i > 1; --i) {
      const uint64_t have = i - 1;  // build after[have]
      std::vector<uint32_t> opts{b_.byte(',', lib_.ws_then(element(have, lib_.ws_then(after))))};
      if (have >= min) opts.push_back(close);
      after = b_.alt(std::move(opts));
    }
    std::vector<uint32_t> first;
    if (max >= 1) first.push_back(element(0, lib_.ws_then(after)));
    if (min == 0) first.push_back(close);
    return b_.byte('[', lib_.ws_then(b_.alt(std::move(first))));
  }

  uint32_t object(const json& n, const std::string& path, uint32_t next, int depth) {
    const json* props = get_schema_map(n, "properties", path);
    const std::vector<std::string> required = get_required(n, path);
    // Additional properties: generated when the schema allows them explicitly, or when it
    // declares no properties at all (a free-form object). With declared properties and no
    // "additionalProperties", only the declared ones are written (valid either way).
    static const json kAny = true;
    const json* extra = nullptr;  // schema of additional properties when they are generated
    if (n.contains("additionalProperties")) {
      const json& ap = n["additionalProperties"];
      if (!ap.is_boolean() && !ap.is_object()) fail(path, "'additionalProperties' must be a schema");
      if (!(ap.is_boolean() && !ap.get<bool>())) extra = &ap;
    } else if (!props) {
      if (required.empty()) return b_.call(lib_.object_rule(), next);
      extra = &kAny;
    }
    // Order: the "required" array first (it is ordered; nlohmann::json objects are not),
    // then the other declared properties in key order.
    struct Prop {
      std::string key;
      const json* schema;
      bool required;
    };
    std::vector<Prop> list;
    for (const std::string& k : required) {
      const json* s = props && props->contains(k) ? &(*props)[k] : nullptr;
      if (!s) {
        if (n.contains("additionalProperties") && !extra) return b_.dead();  // required but forbidden
        s = extra ? extra : &kAny;
      }
      list.push_back({k, s, true});
    }
    if (props)
      for (auto it = props->begin(); it != props->end(); ++it)
        if (std::find(required.begin(), required.end(), it.key()) == required.end())
          list.push_back({it.key(), &it.value(), false});

    const uint32_t close = b_.byte('}', next);
    // Additional properties after the declared ones: keys never equal to a declared name.
    uint32_t extra_loop = kNoNode, extra_first = kNoNode;
    if (extra) {
      std::vector<std::string> names;
      for (const Prop& p : list) names.push_back(p.key);
      const uint32_t value_rule = rule_for(*extra, path + "/additionalProperties", depth);
      extra_loop = b_.placeholder();
      const uint32_t after_key = lib_.ws_then(b_.byte(':', lib_.ws_then(b_.call(value_rule, lib_.ws_then(extra_loop)))));
      const uint32_t member = b_.byte('"', key_excluding(names, after_key));
      b_.set_options(extra_loop, {b_.byte(',', lib_.ws_then(member)), close});
      extra_first = member;
    }
    // rest[i]: properties i.. may follow, at least one member already written;
    // first[i]: none written yet. Each member is built once and shared by both.
    uint32_t rest = extra ? extra_loop : close;
    uint32_t first = extra ? b_.alt({extra_first, close}) : close;
    for (size_t i = list.size(); i > 0; --i) {
      const Prop& p = list[i - 1];
      const std::string pp = path_join(path + "/properties", p.key);
      const uint32_t member = b_.literal(json(p.key).dump(), lib_.ws_then(b_.byte(':', lib_.ws_then(value(*p.schema, pp, lib_.ws_then(rest), depth + 1)))));
      const uint32_t with_comma = b_.byte(',', lib_.ws_then(member));
      rest = p.required ? with_comma : b_.alt({with_comma, rest});
      first = p.required ? member : b_.alt({member, first});
    }
    return b_.byte('{', lib_.ws_then(first));
  }

  // The rest of a JSON key after its opening quote: unescaped characters forming any
  // string except the given names, then the closing quote, then `next`. A byte trie of
  // the names is walked; leaving it (a byte no name has there) enters free text.
  uint32_t key_excluding(const std::vector<std::string>& names, uint32_t next) {
    const CpSet plain = cp_minus(cp_all(), {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
    const uint32_t free_loop = b_.placeholder();
    b_.set_options(free_loop, {emit_char_set(b_, plain, TextMode::Raw, free_loop), b_.byte('"', next)});
    struct TNode {
      std::map<uint8_t, uint32_t> kids;
      bool terminal = false;
      uint8_t lead = 0;   // lead byte of the character being read (0 at a boundary)
      uint8_t pos = 0;    // bytes of that character already read
      uint8_t len = 0;    // its length
    };
    std::vector<TNode> t(1);
    for (const std::string& name : names) {
      bool ok = true;  // names needing escapes can never equal an unescaped key
      for (char c : name) ok = ok && uint8_t(c) >= 0x20 && c != '"' && c != '\\';
      if (!ok || name.size() > 4096) continue;
      uint32_t cur = 0;
      for (size_t i = 0; i < name.size(); ++i) {
        const uint8_t c = uint8_t(name[i]);
        auto it = t[cur].kids.find(c);
        if (it == t[cur].kids.end()) {
          TNode nn;
          const TNode& parent = t[cur];
          if (parent.pos == 0) {  // c starts a character
            nn.len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            nn.lead = c;
            nn.pos = 1;
          } else {
            nn.len = parent.len;
            nn.lead = parent.lead;
            nn.pos = uint8_t(parent.pos + 1);
          }
          if (nn.pos == nn.len) nn.pos = nn.lead = nn.len = 0;  // character complete
          t.push_back(nn);
          const uint32_t id = uint32_t(t.size() - 1);
          t[cur].kids[c] = id;
          cur = id;
        } else {
          cur = it->second;
        }
      }
      t[cur].terminal = true;
    }
    std::vector<uint32_t> entry(t.size(), kNoNode);
    for (size_t k = t.size(); k > 0; --k) {  // children were created after their parents
      const TNode& nd = t[k - 1];
      std::vector<uint32_t> opts;
      for (const auto& [c, kid] : nd.kids) opts.push_back(b_.byte(c, entry[kid]));
      if (nd.pos == 0) {
        if (!nd.terminal) opts.push_back(b_.byte('"', next));
        CpSet taken;  // code points whose first byte continues the trie
        for (const auto& [c, kid] : nd.kids) {
          (void)kid;
          if (c < 0x80) taken.push_back({c, c});
          else if (c < 0xE0) taken.push_back({uint32_t(c & 0x1F) << 6, (uint32_t(c & 0x1F) << 6) + 0x3F});
          else if (c < 0xF0) taken.push_back({uint32_t(c & 0x0F) << 12, (uint32_t(c & 0x0F) << 12) + 0xFFF});
          else taken.push_back({uint32_t(c & 0x07) << 18, (uint32_t(c & 0x07) << 18) + 0x3FFFF});
        }
        opts.push_back(emit_char_set(b_, cp_minus(plain, cp_normalize(taken)), TextMode::Raw, free_loop));
      } else {
        // Inside a multi-byte character: the bytes valid here, minus the trie's.
        uint8_t lo = 0x80, hi = 0xBF;
        if (nd.pos == 1) {
          if (nd.lead == 0xE0) lo = 0xA0;
          if (nd.lead == 0xED) hi = 0x9F;
          if (nd.lead == 0xF0) lo = 0x90;
          if (nd.lead == 0xF4) hi = 0x8F;
        }
        ByteSet div;
        for (unsigned c = lo; c <= hi; ++c)
          if (!nd.kids.count(uint8_t(c))) div.add(uint8_t(c));
        uint32_t tail = free_loop;
        for (unsigned r = nd.pos + 1; r < nd.len; ++r) tail = b_.range(0x80, 0xBF, tail);
        if (!div.empty()) opts.push_back(b_.match(div, tail));
      }
      entry[k - 1] = b_.alt(std::move(opts));
    }
    return entry[0];
  }

  Builder& b_;
  Library& lib_;
  const json& root_;
  std::map<std::string, uint32_t> refs_;
};

}  // namespace

void check_document(const json& doc, const char* what) {
  if (json_depth(doc, kMaxDocumentDepth) > kMaxDocumentDepth)
    throw std::invalid_argument(std::string(what) + " nests deeper than " + std::to_string(kMaxDocumentDepth) + " levels");
}

bool is_annotation_keyword(const std::string& key) {
  static const std::set<std::string> a = {"title",    "description", "default",         "examples",        "example",
                                          "$schema",  "$id",         "$comment",        "deprecated",      "readOnly",
                                          "writeOnly", "contentMediaType", "contentEncoding", "$defs", "definitions"};
  return a.count(key) || key.rfind("x-", 0) == 0;
}

void check_keywords(const json& s, const std::string& path) {
  if (!s.is_object()) return;
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (is_annotation_keyword(k)) {
      if ((k == "$defs" || k == "definitions") && !v.is_object()) fail(path, "'" + k + "' must be an object");
      continue;
    }
    if (!supported_keywords().count(k)) fail(path, "unsupported JSON Schema keyword '" + k + "'");
    // The shape of every keyword's value, checked once here so the compiler and the
    // validator can rely on it.
    auto need = [&](bool ok, const char* what) {
      if (!ok) fail(path, "'" + k + "' must be " + what);
    };
    const bool schema_like = v.is_object() || v.is_boolean();
    if (k == "type") {
      need(v.is_string() || v.is_array(), "a string or an array of strings");
      if (v.is_array())
        for (const json& t : v) need(t.is_string(), "a string or an array of strings");
    } else if (k == "properties") {
      need(v.is_object(), "an object");
    } else if (k == "required") {
      need(v.is_array(), "an array of strings");
      for (const json& r : v) need(r.is_string(), "an array of strings");
    } else if (k == "additionalProperties" || k == "additionalItems") {
      need(schema_like, "a schema");
    } else if (k == "items") {
      need(schema_like || v.is_array(), "a schema or an array of schemas");
    } else if (k == "prefixItems" || k == "enum") {
      need(v.is_array(), "an array");
    } else if (k == "anyOf" || k == "oneOf" || k == "allOf") {
      need(v.is_array() && !v.empty(), "a non-empty array");
    } else if (k == "minItems" || k == "maxItems" || k == "minLength" || k == "maxLength") {
      need(v.is_number() && v >= 0 && (!v.is_number_float() || std::floor(v.get<double>()) == v.get<double>()),
           "a non-negative integer");
    } else if (k == "minimum" || k == "maximum") {
      need(v.is_number(), "a number");
    } else if (k == "exclusiveMinimum" || k == "exclusiveMaximum") {
      need(v.is_number() || v.is_boolean(), "a number");
    } else if (k == "$ref" || k == "pattern" || k == "format") {
      need(v.is_string(), "a string");
    } else if (k == "nullable") {
      need(v.is_boolean(), "a boolean");
    } else if (k == "uniqueItems") {
      if (!(v.is_boolean() && !v.get<bool>())) fail(path, "unsupported JSON Schema keyword 'uniqueItems' (only false)");
    }
  }
}

std::string path_join(const std::string& path, const std::string& token) {
  std::string t;
  for (char c : token) {
    if (c == '~')
      t += "~0";
    else if (c == '/')
      t += "~1";
    else
      t += c;
  }
  return path + "/" + t;
}

const json& resolve_ref(const json& root, const json& ref, const std::string& path) {
  if (!ref.is_string()) fail(path, "'$ref' must be a string");
  const std::string r = ref.get<std::string>();
  if (r == "#") return root;
  if (r.rfind("#/", 0) != 0) fail(path, "unsupported $ref '" + r + "' (only local references '#/...' are supported)");
  try {
    const json::json_pointer ptr(r.substr(1));
    return root.at(ptr);
  } catch (const json::exception&) {
    fail(path, "$ref '" + r + "' does not resolve");
  }
}

size_t json_depth(const json& j, size_t limit) {
  // Iterative DFS over containers; returns as soon as the limit is passed.
  std::vector<std::pair<const json*, size_t>> stack{{&j, 1}};
  size_t max = 0;
  while (!stack.empty()) {
    const auto [v, d] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) {
      max = std::max(max, d - 1);
      continue;
    }
    max = std::max(max, d);
    if (max > limit) return max;
    for (const json& c : *v) stack.push_back({&c, d + 1});
  }
  return max;
}

size_t json_text_depth(std::string_view text, size_t limit) {
  size_t depth = 0, max = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max = std::max(max, ++depth);
      if (max > limit) return max;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max;
}

std::shared_ptr<const Grammar> compile_json_schema(const json& schema) {
  check_document(schema, "the schema");
  Builder b(kMaxGrammarNodes);
  Library lib(b);
  SchemaCompiler c(b, lib, schema);
  const uint32_t root = b.add_rule("#");
  b.set_entry(root, lib.ws_then(c.value(schema, "#", lib.ws_then(b.ret()), 0)));
  try {
    return b.finish(root);
  } catch (const EmptyLanguage&) {
    throw std::invalid_argument("the schema can never be satisfied (no JSON value matches it) at #");
  }
}

bool parameter_is_raw_string(const json& schema) {
  try {
    if (json_depth(schema, kMaxDocumentDepth) > kMaxDocumentDepth) return false;
    const json n = normalize(schema, schema, "#", 0);
    if (!n.is_object() || n.contains("anyOf") || n.contains("oneOf") || n.value("nullable", false) == true) return false;
    if (n.contains("type")) {
      const json& t = n["type"];
      return (t.is_string() && t == "string") || (t.is_array() && t.size() == 1 && t[0] == "string");
    }
    if (!n.contains("enum") || !n["enum"].is_array() || n["enum"].empty()) return false;
    for (const json& v : n["enum"])
      if (!v.is_string()) return false;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

struct SchemaValues::Impl {
  explicit Impl(Builder& builder) : b(builder), lib(builder) {}
  SchemaCompiler& compiler(const json& root) {
    auto it = compilers.find(&root);
    if (it == compilers.end()) it = compilers.emplace(&root, std::make_unique<SchemaCompiler>(b, lib, root)).first;
    return *it->second;
  }
  Builder& b;
  Library lib;
  std::map<const json*, std::unique_ptr<SchemaCompiler>> compilers;  // by root document ($ref targets)
};

SchemaValues::SchemaValues(Builder& b) : impl_(std::make_unique<Impl>(b)) {}
SchemaValues::~SchemaValues() = default;

uint32_t SchemaValues::ws_then(uint32_t next) { return impl_->lib.ws_then(next); }

uint32_t SchemaValues::value(const json& root, const json& schema, const std::string& path, uint32_t next) {
  return impl_->compiler(root).value(schema, path, next, 1);
}

uint32_t SchemaValues::raw_string(const json& root, const json& schema, const std::string& path,
                                  std::string_view forbidden, uint32_t next) {
  Builder& b = impl_->b;
  const json n = normalize(root, schema, path, 1);
  if (n.contains("enum")) {
    json rest = n;
    rest.erase("enum");
    std::vector<uint32_t> opts;
    for (const json& v : n["enum"]) {
      if (!v.is_string() || !validate_value(root, rest, v).empty()) continue;
      const std::string text = v.get<std::string>();
      if (!forbidden.empty() && text.find(forbidden) != std::string::npos) continue;  // could not be read back
      opts.push_back(b.literal(text, next));
    }
    return b.alt(std::move(opts));
  }
  const bool constrained = n.contains("minLength") || n.contains("maxLength") || n.contains("pattern") ||
                           (n.contains("format") && n["format"].is_string() &&
                            format_pattern(n["format"].get<std::string>()));
  if (!constrained) return kNoNode;
  return impl_->compiler(root).string_body(n, path, TextMode::RawLine, next);
}

ObjectMembers object_members(const json& schema, const std::string& path) {
  ObjectMembers out;
  const json n = normalize(schema, schema, path, 0);
  if (n.is_boolean() && !n.get<bool>()) return out.shape = ObjectMembers::Shape::False, out;
  if (n.is_object() && n.contains("type") && type_intersection(type_set(n, path), {"object"}).empty())
    return out.shape = ObjectMembers::Shape::NotObject, out;
  if (n.is_object() && (n.contains("anyOf") || n.contains("oneOf")))
    return out.shape = ObjectMembers::Shape::Choice, out;
  const json* props = n.is_object() ? get_schema_map(n, "properties", path) : nullptr;
  const std::vector<std::string> required = n.is_object() ? get_required(n, path) : std::vector<std::string>{};
  for (const std::string& k : required)
    out.members.push_back({k, props && props->contains(k) ? (*props)[k] : json(true), true});
  if (props)
    for (auto it = props->begin(); it != props->end(); ++it)
      if (std::find(required.begin(), required.end(), it.key()) == required.end())
        out.members.push_back({it.key(), it.value(), false});
  return out;
}

}  // namespace step35::grammar
