// Methods of str, dict, list and tuple values as templates call them ('x'.strip(),
// d.items(), ...). The immutable sandbox allows everything that does not modify its
// object; the methods that would (list.append, dict.update, ...) are reported Unsafe.
#include <algorithm>

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/format.h"
#include "jinja/interpreter.h"
#include "jinja/operators.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

constexpr std::string_view kDictSafe[] = {"copy", "get", "items", "keys", "values"};
constexpr std::string_view kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kListSafe[] = {"copy", "count", "index"};
constexpr std::string_view kListUnsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

void no_keywords(std::string_view method, const Arguments& args) {
  if (!args.keyword.empty()) type_error(std::string(method) + "() takes no keyword arguments");
}

void arity(std::string_view method, const Arguments& args, size_t min, size_t max) {
  no_keywords(method, args);
  const size_t n = args.positional.size();
  if (n < min || n > max) {
    if (max == 0) type_error(std::string(method) + "() takes no arguments (" + std::to_string(n) + " given)");
    type_error(std::string(method) + "() takes " + (min == max ? "exactly " : "at most ") + std::to_string(max) +
               " argument(s) (" + std::to_string(n) + " given)");
  }
}

const std::string& string_argument(std::string_view method, const Value& v) {
  if (!v.is_string()) {
    type_error(std::string(method) + "() argument must be str, not " + v.python_type());
  }
  return v.string_value();
}

// The text's code point boundaries (empty when the text is ASCII: byte = code point).
struct CodePoints {
  explicit CodePoints(const std::string& s) : ascii(text::is_ascii(s)) {
    if (!ascii) offsets = text::code_point_offsets(s);
    length = ascii ? s.size() : offsets.size() - 1;
  }
  size_t byte_of(size_t index) const { return ascii ? index : offsets[index]; }
  size_t index_of(size_t byte) const {
    if (ascii) return byte;
    return static_cast<size_t>(std::lower_bound(offsets.begin(), offsets.end(), byte) - offsets.begin());
  }
  bool ascii;
  std::vector<size_t> offsets;
  size_t length;
};

// Python's optional start/end arguments of find/count/startswith, as byte offsets.
void range_arguments(std::string_view method, const Arguments& args, size_t first, const CodePoints& cp,
                     size_t& begin, size_t& end) {
  int64_t start = 0, stop = static_cast<int64_t>(cp.length);
  const int64_t n = static_cast<int64_t>(cp.length);
  const auto read = [&](size_t i, int64_t& out) {
    if (args.positional.size() <= i || args.positional[i].is_none()) return;
    const Value& v = args.positional[i];
    if (!v.is_int() && !v.is_bool()) {
      type_error(std::string("slice indices must be integers or None or have an __index__ method (") + std::string(method) + ")");
    }
    out = v.is_bool() ? v.bool_value() : v.int_value();
    if (out < 0) out = std::max<int64_t>(0, out + n);
    out = std::min(out, n);
  };
  read(first, start);
  read(first + 1, stop);
  if (stop < start) stop = start;
  begin = cp.byte_of(static_cast<size_t>(start));
  end = cp.byte_of(static_cast<size_t>(stop));
}

std::string pad_to(const std::string& s, int64_t width, const std::string& fill, char align) {
  const int64_t length = static_cast<int64_t>(text::length(s));
  if (width <= length) return s;
  const int64_t missing = width - length;
  int64_t left = 0;
  if (align == '>') left = missing;
  if (align == '^') left = missing / 2 + (missing & width & 1);  // CPython's center rounding
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < missing - left; ++i) out += fill;
  return out;
}

// The words of s for split() without a separator, as byte ranges: runs of whitespace
// separate them.
std::vector<std::pair<size_t, size_t>> whitespace_separated_words(const std::string& s, Interpreter& interp) {
  std::vector<std::pair<size_t, size_t>> words;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (text::is_space(text::next_code_point(s, next))) {
      pos = next;
      continue;
    }
    const size_t begin = pos;
    while (pos < s.size()) {
      next = pos;
      if (text::is_space(text::next_code_point(s, next))) break;
      pos = next;
    }
    words.emplace_back(begin, pos);
    if ((words.size() & 1023) == 0) interp.check_list_size(words.size());
  }
  return words;
}

// split() / rsplit() without a separator: leading and trailing whitespace gives no empty parts.
std::vector<std::string> split_on_whitespace(const std::string& s, int64_t maxsplit, bool from_right,
                                             Interpreter& interp) {
  const std::vector<std::pair<size_t, size_t>> words = whitespace_separated_words(s, interp);
  std::vector<std::string> parts;
  if (static_cast<int64_t>(words.size()) <= maxsplit) {
    for (const auto& [begin, end] : words) parts.push_back(s.substr(begin, end - begin));
    return parts;
  }
  // Splitting stops after maxsplit words; the remainder stays whole, whitespace and all.
  const size_t keep = static_cast<size_t>(maxsplit);
  if (!from_right) {
    for (size_t i = 0; i < keep; ++i) parts.push_back(s.substr(words[i].first, words[i].second - words[i].first));
    parts.push_back(s.substr(words[keep].first));
  } else {
    const size_t first_whole = words.size() - keep;
    parts.push_back(s.substr(0, words[first_whole - 1].second));
    for (size_t i = first_whole; i < words.size(); ++i) {
      parts.push_back(s.substr(words[i].first, words[i].second - words[i].first));
    }
  }
  return parts;
}

std::vector<std::string> split_on_separator(const std::string& s, const std::string& sep, int64_t maxsplit,
                                            bool from_right, Interpreter& interp) {
  std::vector<std::string> parts;
  if (!from_right) {
    size_t pos = 0;
    int64_t splits = 0;
    while (splits < maxsplit) {
      const size_t at = s.find(sep, pos);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(pos, at - pos));
      if ((parts.size() & 1023) == 0) interp.check_list_size(parts.size());
      pos = at + sep.size();
      ++splits;
    }
    parts.push_back(s.substr(pos));
    return parts;
  }
  size_t end = s.size();
  int64_t splits = 0;
  std::vector<std::string> reversed;
  while (splits < maxsplit && end >= sep.size()) {
    const size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string::npos) break;
    reversed.push_back(s.substr(at + sep.size(), end - at - sep.size()));
    if ((reversed.size() & 1023) == 0) interp.check_list_size(reversed.size());
    end = at;
    ++splits;
  }
  reversed.push_back(s.substr(0, end));
  parts.assign(reversed.rbegin(), reversed.rend());
  return parts;
}

Value split(const Value& self, const Arguments& args, bool from_right, Interpreter& interp) {
  const char* method = from_right ? "rsplit" : "split";
  const std::vector<Value> bound = bind_arguments(method, args, {{"sep", Value::none()}, {"maxsplit", Value::integer(-1)}});
  if (!bound[1].is_int() && !bound[1].is_bool()) {
    type_error(std::string("'") + bound[1].python_type() + "' object cannot be interpreted as an integer");
  }
  int64_t maxsplit = bound[1].is_bool() ? bound[1].bool_value() : bound[1].int_value();
  if (maxsplit < 0) maxsplit = INT64_MAX;
  const std::string& s = self.string_value();
  interp.charge(s.size() / 64 + 1);
  std::vector<std::string> parts;
  if (bound[0].is_none()) {
    parts = split_on_whitespace(s, maxsplit, from_right, interp);
  } else {
    const std::string& sep = string_argument(method, bound[0]);
    if (sep.empty()) type_error("empty separator");
    parts = split_on_separator(s, sep, maxsplit, from_right, interp);
  }
  interp.check_list_size(parts.size());
  interp.charge(parts.size());
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.push_back(Value::string_like(self, std::move(part)));
  return Value::list(std::move(items));
}

Value splitlines(Interpreter& interp, const Value& self, const Arguments& args) {
  const std::vector<Value> bound = bind_arguments("splitlines", args, {{"keepends", Value::boolean(false)}});
  const bool keep = bound[0].truthy();
  std::vector<std::string> parts = text::split_lines(self.string_value(), keep);
  interp.check_list_size(parts.size());
  std::vector<Value> lines;
  lines.reserve(parts.size());
  for (std::string& part : parts) lines.push_back(Value::string_like(self, std::move(part)));
  interp.charge(lines.size());
  return Value::list(std::move(lines));
}

bool all_code_points(const std::string& s, bool (*predicate)(uint32_t)) {
  if (s.empty()) return false;
  for (size_t pos = 0; pos < s.size();)
    if (!predicate(text::next_code_point(s, pos))) return false;
  return true;
}

bool is_digit_cp(uint32_t cp) { return cp >= '0' && cp <= '9'; }
bool is_alpha_cp(uint32_t cp) { return text::is_word(cp) && !is_digit_cp(cp) && cp != '_'; }
bool is_alnum_cp(uint32_t cp) { return text::is_word(cp) && cp != '_'; }

Value format_lookup(const Value& object, const Value& key, bool as_attribute) {
  if (as_attribute) return get_attribute(object, std::make_shared<const std::string>(key.string_value()));
  return get_item(object, key);
}

// One call of a str method. Methods that share a body (strip / lstrip / rstrip, ...) tell
// themselves apart by name.
struct StrCall {
  Interpreter& interp;
  const Value& self;
  const std::string& s;  // self's text
  std::string_view name;
  Arguments& args;
  const std::vector<Value>& positional;
};

std::string swap_case_text(std::string_view s) {
  std::string out;
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = text::next_code_point(s, pos);
    text::append_utf8(out, text::is_upper_cp(cp) ? text::to_lower_cp(cp) : text::to_upper_cp(cp));
  }
  return out;
}

// upper, lower (also casefold), title, capitalize, swapcase: no arguments, the converted
// text of self's string kind.
template <std::string (*Convert)(std::string_view)>
Value str_convert_case(const StrCall& call) {
  arity(call.name, call.args, 0, 0);
  return Value::string_like(call.self, Convert(call.s));
}

// strip, lstrip, rstrip.
Value str_strip(const StrCall& call) {
  arity(call.name, call.args, 0, 1);
  const auto& a = call.positional;
  const bool left = call.name != "rstrip", right = call.name != "lstrip";
  if (a.empty() || a[0].is_none()) return Value::string_like(call.self, std::string(text::strip(call.s, left, right)));
  return Value::string_like(call.self,
                            std::string(text::strip_chars(call.s, string_argument(call.name, a[0]), left, right)));
}

Value str_split(const StrCall& call) { return split(call.self, call.args, false, call.interp); }
Value str_rsplit(const StrCall& call) { return split(call.self, call.args, true, call.interp); }
Value str_splitlines(const StrCall& call) { return splitlines(call.interp, call.self, call.args); }

// startswith, endswith: the affix may be a tuple of candidates.
Value str_affix_test(const StrCall& call) {
  arity(call.name, call.args, 1, 3);
  const std::string& s = call.s;
  const auto& a = call.positional;
  const CodePoints cp(s);
  size_t begin, end;
  range_arguments(call.name, call.args, 1, cp, begin, end);
  const std::string_view window = std::string_view(s).substr(begin, end - begin);
  std::vector<Value> candidates;
  if (a[0].is_list() && a[0].list_flavor() == ListFlavor::Tuple) {
    candidates = a[0].items();
  } else if (a[0].is_string()) {
    candidates.push_back(a[0]);
  } else {
    type_error(std::string(call.name) + " first arg must be str or a tuple of str, not " + a[0].python_type());
  }
  for (const Value& c : candidates) {
    if (!c.is_string()) {
      type_error(std::string("tuple for ") + std::string(call.name) + " must only contain str, not " + c.python_type());
    }
    const std::string& affix = c.string_value();
    if (affix.size() > window.size()) continue;
    const bool match = call.name == "startswith" ? window.substr(0, affix.size()) == affix
                                                 : window.substr(window.size() - affix.size()) == affix;
    if (match) return Value::boolean(true);
  }
  return Value::boolean(false);
}

// find, rfind, index, rindex, count: positions are in code points.
Value str_search(const StrCall& call) {
  const std::string_view name = call.name;
  arity(name, call.args, 1, 3);
  const std::string& s = call.s;
  const std::string& needle = string_argument(name, call.positional[0]);
  const CodePoints cp(s);
  size_t begin, end;
  range_arguments(name, call.args, 1, cp, begin, end);
  const std::string_view window = std::string_view(s).substr(begin, end - begin);
  if (name == "count") {
    if (needle.empty()) return Value::integer(static_cast<int64_t>(cp.index_of(end) - cp.index_of(begin) + 1));
    int64_t n = 0;
    for (size_t at = window.find(needle); at != std::string_view::npos; at = window.find(needle, at + needle.size())) ++n;
    return Value::integer(n);
  }
  const bool reverse = name == "rfind" || name == "rindex";
  const size_t at = reverse ? window.rfind(needle) : window.find(needle);
  if (at == std::string_view::npos) {
    if (name == "index" || name == "rindex") type_error("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(static_cast<int64_t>(cp.index_of(begin + at)));
}

// s with the first `count` occurrences of old_text replaced (all of them when count < 0).
std::string replace_occurrences(const std::string& s, const std::string& old_text, const std::string& new_text,
                                int64_t count, Interpreter& interp) {
  std::string out;
  int64_t done = 0;
  if (old_text.empty()) {
    // Python inserts the replacement before every code point and at the end.
    for (size_t pos = 0; pos <= s.size();) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      if (pos == s.size()) break;
      const size_t start = pos;
      text::next_code_point(s, pos);
      out.append(s, start, pos - start);
      interp.check_value_size(out.size());
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old_text, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += new_text;
    interp.check_value_size(out.size());
    pos = at + old_text.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Value str_replace(const StrCall& call) {
  const std::string_view name = call.name;
  const auto& a = call.positional;
  no_keywords(name, call.args);
  if (a.size() < 2 || a.size() > 3) type_error("replace() takes 2 or 3 arguments");
  std::string old_text = string_argument(name, a[0]);
  std::string new_text = string_argument(name, a[1]);
  if (call.self.is_markup()) {
    if (!a[0].is_markup()) old_text = html_escape_text(old_text);
    if (!a[1].is_markup()) new_text = html_escape_text(new_text);
  }
  int64_t count = -1;
  if (a.size() == 3) {
    if (!a[2].is_int()) type_error(std::string("'") + a[2].python_type() + "' object cannot be interpreted as an integer");
    count = a[2].int_value();
  }
  call.interp.charge(call.s.size() / 64 + 1);
  std::string out = replace_occurrences(call.s, old_text, new_text, count, call.interp);
  call.interp.check_value_size(out.size());
  return Value::string_like(call.self, std::move(out));
}

Value str_join(const StrCall& call) {
  arity(call.name, call.args, 1, 1);
  Interpreter& interp = call.interp;
  const std::vector<Value> items = iterate(interp, call.positional[0]);
  interp.charge(items.size());
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      type_error("sequence item " + std::to_string(i) + ": expected str instance, " + items[i].python_type() + " found");
    }
    if (i != 0) out += call.s;
    out += items[i].string_value();
    interp.check_value_size(out.size());
  }
  return Value::string_like(call.self, std::move(out));
}

Value str_format_method(const StrCall& call) {
  std::string out = str_format(call.s, call.args, format_lookup);
  call.interp.check_value_size(out.size());
  return Value::string_like(call.self, std::move(out));
}

// center, ljust, rjust.
Value str_justify(const StrCall& call) {
  const std::string_view name = call.name;
  const auto& a = call.positional;
  arity(name, call.args, 1, 2);
  if (!a[0].is_int()) type_error(std::string("'") + a[0].python_type() + "' object cannot be interpreted as an integer");
  std::string fill = " ";
  if (a.size() == 2) {
    fill = string_argument(name, a[1]);
    if (text::length(fill) != 1) type_error("The fill character must be exactly one character long");
  }
  call.interp.check_value_size(static_cast<size_t>(std::max<int64_t>(0, a[0].int_value())));
  const char align = name == "center" ? '^' : name == "ljust" ? '<' : '>';
  return Value::string_like(call.self, pad_to(call.s, a[0].int_value(), fill, align));
}

Value str_zfill(const StrCall& call) {
  const std::string& s = call.s;
  const auto& a = call.positional;
  arity(call.name, call.args, 1, 1);
  if (!a[0].is_int()) type_error(std::string("'") + a[0].python_type() + "' object cannot be interpreted as an integer");
  call.interp.check_value_size(static_cast<size_t>(std::max<int64_t>(0, a[0].int_value())));
  const int64_t length = static_cast<int64_t>(text::length(s));
  if (a[0].int_value() <= length) return call.self;
  const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  const std::string zeros(static_cast<size_t>(a[0].int_value() - length), '0');
  return Value::string_like(call.self, s.substr(0, sign) + zeros + s.substr(sign));
}

// partition, rpartition.
Value str_partition(const StrCall& call) {
  const std::string& s = call.s;
  const Value& self = call.self;
  arity(call.name, call.args, 1, 1);
  const std::string& sep = string_argument(call.name, call.positional[0]);
  if (sep.empty()) type_error("empty separator");
  const bool first = call.name == "partition";
  const size_t at = first ? s.find(sep) : s.rfind(sep);
  if (at == std::string::npos) {
    if (first) return Value::tuple({self, Value::string_like(self, ""), Value::string_like(self, "")});
    return Value::tuple({Value::string_like(self, ""), Value::string_like(self, ""), self});
  }
  return Value::tuple({Value::string_like(self, s.substr(0, at)), Value::string_like(self, sep),
                       Value::string_like(self, s.substr(at + sep.size()))});
}

// removeprefix, removesuffix.
Value str_remove_affix(const StrCall& call) {
  const std::string& s = call.s;
  arity(call.name, call.args, 1, 1);
  const std::string& affix = string_argument(call.name, call.positional[0]);
  if (call.name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) {
    return Value::string_like(call.self, s.substr(affix.size()));
  }
  if (call.name == "removesuffix" && !affix.empty() && s.size() >= affix.size() &&
      s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
    return Value::string_like(call.self, s.substr(0, s.size() - affix.size()));
  }
  return call.self;
}

// isdigit, isdecimal, isnumeric.
Value str_is_digit(const StrCall& call) {
  arity(call.name, call.args, 0, 0);
  return Value::boolean(all_code_points(call.s, is_digit_cp));
}

Value str_is_alpha(const StrCall& call) {
  arity(call.name, call.args, 0, 0);
  return Value::boolean(all_code_points(call.s, is_alpha_cp));
}

Value str_is_alnum(const StrCall& call) {
  arity(call.name, call.args, 0, 0);
  return Value::boolean(all_code_points(call.s, is_alnum_cp));
}

Value str_is_space(const StrCall& call) {
  arity(call.name, call.args, 0, 0);
  return Value::boolean(all_code_points(call.s, text::is_space));
}

// isupper, islower: at least one cased code point, and none of the other case.
Value str_is_case(const StrCall& call) {
  arity(call.name, call.args, 0, 0);
  const std::string& s = call.s;
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = text::next_code_point(s, pos);
    if (text::is_upper_cp(cp)) {
      if (call.name == "islower") return Value::boolean(false);
      cased = true;
    } else if (text::is_lower_cp(cp)) {
      if (call.name == "isupper") return Value::boolean(false);
      cased = true;
    }
  }
  return Value::boolean(cased);
}

struct StrMethodEntry {
  std::string_view name;
  Value (*body)(const StrCall&);
};

constexpr auto str_upper = str_convert_case<text::upper>;
constexpr auto str_lower = str_convert_case<text::lower>;
constexpr auto str_title = str_convert_case<text::python_title>;
constexpr auto str_capitalize = str_convert_case<text::python_capitalize>;
constexpr auto str_swapcase = str_convert_case<swap_case_text>;

// The str methods templates may call (all of them leave their object as it is).
constexpr StrMethodEntry kStrMethods[] = {
    {"capitalize", str_capitalize},     {"casefold", str_lower},        {"center", str_justify},
    {"count", str_search},              {"endswith", str_affix_test},   {"find", str_search},
    {"format", str_format_method},      {"index", str_search},          {"isalnum", str_is_alnum},
    {"isalpha", str_is_alpha},          {"isdecimal", str_is_digit},    {"isdigit", str_is_digit},
    {"islower", str_is_case},           {"isnumeric", str_is_digit},    {"isspace", str_is_space},
    {"isupper", str_is_case},           {"join", str_join},             {"ljust", str_justify},
    {"lower", str_lower},               {"lstrip", str_strip},          {"partition", str_partition},
    {"removeprefix", str_remove_affix}, {"removesuffix", str_remove_affix}, {"replace", str_replace},
    {"rfind", str_search},              {"rindex", str_search},         {"rjust", str_justify},
    {"rpartition", str_partition},      {"rsplit", str_rsplit},         {"rstrip", str_strip},
    {"split", str_split},               {"splitlines", str_splitlines}, {"startswith", str_affix_test},
    {"strip", str_strip},               {"swapcase", str_swapcase},     {"title", str_title},
    {"upper", str_upper},               {"zfill", str_zfill}};

Value str_method(Interpreter& interp, const Value& self, std::string_view name, Arguments& args) {
  const StrMethodEntry* method = find_named(kStrMethods, name);
  if (method == nullptr) type_error("str has no method " + std::string(name));
  return method->body(StrCall{interp, self, self.string_value(), name, args, args.positional});
}

Value dict_method(Interpreter& interp, const Value& self, std::string_view name, Arguments& args) {
  const Dict& d = self.dict_value();
  interp.charge(d.size());
  if (name == "get") {
    arity(name, args, 1, 2);
    const Value& key = args.positional[0];
    if (!is_hashable(key)) type_error(std::string("unhashable type: '") + key.python_type() + "'");
    if (const Value* v = d.find(key)) return *v;
    return args.positional.size() == 2 ? args.positional[1] : Value::none();
  }
  arity(name, args, 0, 0);
  if (name == "copy") {
    auto copy = std::make_shared<Dict>(d);
    return Value::dict(std::move(copy));
  }
  std::vector<Value> items;
  items.reserve(d.size());
  if (name == "items") {
    for (const auto& [key, value] : d.entries()) items.push_back(Value::tuple({key, value}));
    return Value::list(std::move(items), ListFlavor::DictItems);
  }
  if (name == "keys") {
    for (const auto& entry : d.entries()) items.push_back(entry.first);
    return Value::list(std::move(items), ListFlavor::DictKeys);
  }
  for (const auto& entry : d.entries()) items.push_back(entry.second);
  return Value::list(std::move(items), ListFlavor::DictValues);
}

Value list_method(Interpreter& interp, const Value& self, std::string_view name, Arguments& args) {
  const std::vector<Value>& items = self.items();
  interp.charge(items.size());
  if (name == "copy") {
    arity(name, args, 0, 0);
    return Value::list(items, self.list_flavor());
  }
  if (name == "count") {
    arity(name, args, 1, 1);
    int64_t n = 0;
    for (const Value& v : items)
      if (equals(v, args.positional[0])) ++n;
    return Value::integer(n);
  }
  arity(name, args, 1, 3);
  for (size_t i = 0; i < items.size(); ++i)
    if (equals(items[i], args.positional[0])) return Value::integer(static_cast<int64_t>(i));
  type_error(self.list_flavor() == ListFlavor::Tuple ? "tuple.index(x): x not in tuple"
                                                       : args.positional[0].repr() + " is not in list");
}

}  // namespace

MethodAccess find_method(const Value& self, std::string_view name) {
  switch (self.kind()) {
    case ValueKind::String: return find_named(kStrMethods, name) != nullptr ? MethodAccess::Safe : MethodAccess::None;
    case ValueKind::Dict:
      if (listed(kDictSafe, name)) return MethodAccess::Safe;
      if (listed(kDictUnsafe, name)) return MethodAccess::Unsafe;
      return MethodAccess::None;
    case ValueKind::List:
      switch (self.list_flavor()) {
        case ListFlavor::List:
          if (listed(kListSafe, name)) return MethodAccess::Safe;
          if (listed(kListUnsafe, name)) return MethodAccess::Unsafe;
          return MethodAccess::None;
        case ListFlavor::Tuple:
        case ListFlavor::Range:
          return name == "count" || name == "index" ? MethodAccess::Safe : MethodAccess::None;
        default: return MethodAccess::None;
      }
    default: return MethodAccess::None;
  }
}

Value call_method(Interpreter& interp, const Value& self, std::string_view name, Arguments& args) {
  switch (self.kind()) {
    case ValueKind::String: return str_method(interp, self, name, args);
    case ValueKind::Dict: return dict_method(interp, self, name, args);
    case ValueKind::List: return list_method(interp, self, name, args);
    default: type_error(std::string("'") + self.python_type() + "' object has no method " + std::string(name));
  }
}

}  // namespace step35::jinja
