// JSON Schema validation for the subset the grammar compiler supports (so tests and the
// server can prove constrained outputs valid). oneOf is checked exactly (one branch).
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "structured/json_schema.h"
#include "structured/regex_grammar.h"

namespace step35::grammar {

namespace {

constexpr int kMaxValidateDepth = 1000;  // recursion (value nesting x schema hops); fits an 8 MB stack under ASan

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && std::floor(d) == d;
}

long double as_ld(const json& v) {
  if (v.is_number_float()) return (long double)v.get<double>();
  if (v.is_number_unsigned()) return (long double)v.get<uint64_t>();
  return (long double)v.get<int64_t>();
}

std::string where(const std::string& vpath) { return vpath.empty() ? "(root)" : vpath; }

class Validator {
 public:
  explicit Validator(const json& root) : root_(root) {}

  // The recursive path keeps its own frame small (the keyword work is in separate,
  // non-inlined functions): deep schemas and values recurse through here.
  std::string check(const json& s, const json& v, const std::string& vpath, const std::string& spath, int depth) {
    if (depth > kMaxValidateDepth) return where(vpath) + ": schema and value nest too deeply to validate";
    if (s.is_boolean()) return s.get<bool>() ? "" : where(vpath) + ": no value is allowed here (schema false)";
    std::string e = check_schema(s, spath);
    if (!e.empty()) return e;
    if (s.value("nullable", false) == true && v.is_null()) return "";
    if (!(e = check_applicators(s, v, vpath, spath, depth)).empty()) return e;
    if (!(e = check_leaf(s, v, vpath, spath)).empty()) return e;
    if (v.is_array() && !(e = check_array(s, v, vpath, spath, depth)).empty()) return e;
    if (v.is_object() && !(e = check_object(s, v, vpath, spath, depth)).empty()) return e;
    return "";
  }

 private:
  [[gnu::noinline]] std::string check_schema(const json& s, const std::string& spath) {
    if (!s.is_object()) return "schema at " + spath + " must be an object or a boolean";
    try {
      check_keywords(s, spath);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  }

  // $ref, allOf, anyOf, oneOf.
  [[gnu::noinline]] std::string check_applicators(const json& s, const json& v, const std::string& vpath,
                                                  const std::string& spath, int depth) {
    std::string e;
    if (s.contains("$ref")) {
      const json* target = nullptr;
      try {
        target = &resolve_ref(root_, s["$ref"], spath);
      } catch (const std::invalid_argument& ex) {
        return ex.what();
      }
      if (!(e = check(*target, v, vpath, s["$ref"].get<std::string>(), depth + 1)).empty()) return e;
    }
    if (s.contains("allOf")) {
      const json& all = s["allOf"];
      for (size_t i = 0; i < all.size(); ++i)
        if (!(e = check(all[i], v, vpath, spath + "/allOf/" + std::to_string(i), depth + 1)).empty()) return e;
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& alts = s[key];
      size_t matched = 0;
      std::string first;
      for (size_t i = 0; i < alts.size(); ++i) {
        const std::string r = check(alts[i], v, vpath, spath + "/" + key + "/" + std::to_string(i), depth + 1);
        if (r.empty())
          ++matched;
        else if (first.empty())
          first = r;
        if (r.find("unsupported JSON Schema keyword") != std::string::npos) return r;
      }
      if (matched == 0) return where(vpath) + ": matches none of the " + key + " alternatives (first: " + first + ")";
      if (std::string(key) == "oneOf" && matched > 1)
        return where(vpath) + ": matches " + std::to_string(matched) + " oneOf alternatives (exactly one allowed)";
    }
    return "";
  }

  // enum, const, type, and the string / number keywords.
  [[gnu::noinline]] std::string check_leaf(const json& s, const json& v, const std::string& vpath,
                                           const std::string& spath) {
    std::string e;
    if (s.contains("enum")) {
      const json& en = s["enum"];
      if (std::find(en.begin(), en.end(), v) == en.end()) return where(vpath) + ": not one of the enum values";
    }
    if (s.contains("const") && s["const"] != v) return where(vpath) + ": differs from const " + s["const"].dump();
    if (s.contains("type") && !(e = check_type(s["type"], v, vpath, spath)).empty()) return e;
    if (v.is_string() && !(e = check_string(s, v.get_ref<const std::string&>(), vpath, spath)).empty()) return e;
    if (v.is_number() && !(e = check_number(s, v, vpath, spath)).empty()) return e;
    return "";
  }

  std::string check_type(const json& t, const json& v, const std::string& vpath, const std::string& spath) {
    std::vector<json> names;
    if (t.is_string())
      names.push_back(t);
    else if (t.is_array())
      names.assign(t.begin(), t.end());
    else
      return "'type' must be a string or an array at " + spath;
    std::string list;
    for (const json& n : names) {
      if (!n.is_string()) return "'type' must name types at " + spath;
      const std::string& name = n.get_ref<const std::string&>();
      const bool ok = (name == "null" && v.is_null()) || (name == "boolean" && v.is_boolean()) ||
                      (name == "object" && v.is_object()) || (name == "array" && v.is_array()) ||
                      (name == "string" && v.is_string()) || (name == "number" && v.is_number()) ||
                      (name == "integer" && is_integral(v));
      if (ok) return "";
      static const std::set<std::string> known = {"null", "boolean", "object", "array", "number", "string", "integer"};
      if (!known.count(name)) return "'type' has an unknown type name '" + name + "' at " + spath;
      list += (list.empty() ? "" : " or ") + name;
    }
    return where(vpath) + ": expected " + list + ", got " + describe(v);
  }

  std::shared_ptr<const Grammar> pattern(const std::string& p) {
    auto it = patterns_.find(p);
    if (it == patterns_.end()) it = patterns_.emplace(p, compile_pattern(p)).first;
    return it->second;
  }

  std::string check_string(const json& s, const std::string& str, const std::string& vpath, const std::string& spath) {
    const size_t len = utf8_length(str);
    for (const char* k : {"minLength", "maxLength"}) {
      if (!s.contains(k)) continue;
      const json& b = s[k];
      if (!b.is_number() || as_ld(b) < 0) return std::string("'") + k + "' must be a non-negative integer at " + spath;
      const bool bad = std::string(k) == "minLength" ? (long double)len < as_ld(b) : (long double)len > as_ld(b);
      if (bad) return where(vpath) + ": string length " + std::to_string(len) + " violates " + k + " " + b.dump();
    }
    try {
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) return "'pattern' must be a string at " + spath;
        if (!grammar_matches(pattern(s["pattern"].get<std::string>()), str))
          return where(vpath) + ": does not match pattern " + s["pattern"].dump();
      }
      if (s.contains("format")) {
        if (!s["format"].is_string()) return "'format' must be a string at " + spath;
        if (const char* f = format_pattern(s["format"].get<std::string>()))
          if (!grammar_matches(pattern(f), str)) return where(vpath) + ": not a valid " + s["format"].get<std::string>();
      }
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()) + " at " + spath;
    }
    return "";
  }

  std::string check_number(const json& s, const json& v, const std::string& vpath, const std::string& spath) {
    const long double x = as_ld(v);
    auto bound = [&](const char* key, bool lower, bool exclusive) -> std::string {
      if (!s.contains(key)) return "";
      const json& b = s[key];
      if (b.is_boolean()) return "";  // draft 4 flag, applied with minimum/maximum below
      if (!b.is_number()) return std::string("'") + key + "' must be a number at " + spath;
      const long double y = as_ld(b);
      const bool ok = lower ? (exclusive ? x > y : x >= y) : (exclusive ? x < y : x <= y);
      return ok ? "" : where(vpath) + ": " + v.dump() + " violates " + key + " " + b.dump();
    };
    const bool min_excl = s.contains("exclusiveMinimum") && s["exclusiveMinimum"] == true;
    const bool max_excl = s.contains("exclusiveMaximum") && s["exclusiveMaximum"] == true;
    std::string e;
    if (!(e = bound("minimum", true, min_excl)).empty()) return e;
    if (!(e = bound("maximum", false, max_excl)).empty()) return e;
    if (!(e = bound("exclusiveMinimum", true, true)).empty()) return e;
    return bound("exclusiveMaximum", false, true);
  }

  [[gnu::noinline]] std::string check_array(const json& s, const json& v, const std::string& vpath,
                                            const std::string& spath, int depth) {
    const json* prefix = nullptr;
    const json* rest = nullptr;
    std::string prefix_key = "prefixItems", rest_key = "items";
    if (s.contains("prefixItems")) {
      prefix = &s["prefixItems"];
      if (s.contains("items")) rest = &s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {
      prefix = &s["items"];
      prefix_key = "items";
      rest_key = "additionalItems";
      if (s.contains("additionalItems")) rest = &s["additionalItems"];
    } else if (s.contains("items")) {
      rest = &s["items"];
    }
    if (prefix && !prefix->is_array()) return "'" + prefix_key + "' must be an array at " + spath;
    std::string e;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string ip = vpath + "/" + std::to_string(i);
      if (prefix && i < prefix->size()) {
        if (!(e = check((*prefix)[i], v[i], ip, spath + "/" + prefix_key + "/" + std::to_string(i), depth + 1)).empty())
          return e;
      } else if (rest) {
        if (!(e = check(*rest, v[i], ip, spath + "/" + rest_key, depth + 1)).empty()) return e;
      }
    }
    for (const char* k : {"minItems", "maxItems"}) {
      if (!s.contains(k)) continue;
      const json& b = s[k];
      if (!b.is_number() || as_ld(b) < 0) return std::string("'") + k + "' must be a non-negative integer at " + spath;
      const bool bad = std::string(k) == "minItems" ? (long double)v.size() < as_ld(b) : (long double)v.size() > as_ld(b);
      if (bad) return where(vpath) + ": " + std::to_string(v.size()) + " items violates " + k + " " + b.dump();
    }
    return "";
  }

  [[gnu::noinline]] std::string check_object(const json& s, const json& v, const std::string& vpath,
                                             const std::string& spath, int depth) {
    const json* props = nullptr;
    if (s.contains("properties")) {
      props = &s["properties"];
      if (!props->is_object()) return "'properties' must be an object at " + spath;
    }
    std::string e;
    if (s.contains("required")) {
      const json& req = s["required"];
      if (!req.is_array()) return "'required' must be an array at " + spath;
      for (const json& k : req) {
        if (!k.is_string()) return "'required' must be an array of strings at " + spath;
        if (!v.contains(k.get<std::string>())) return where(vpath) + ": missing required property " + k.dump();
      }
    }
    const json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string kp = path_join(vpath, it.key());
      if (props && props->contains(it.key())) {
        if (!(e = check((*props)[it.key()], it.value(), kp, path_join(spath + "/properties", it.key()), depth + 1)).empty())
          return e;
      } else if (extra) {
        if (extra->is_boolean() && !extra->get<bool>()) return where(vpath) + ": property \"" + it.key() + "\" is not allowed";
        if (!(e = check(*extra, it.value(), kp, spath + "/additionalProperties", depth + 1)).empty()) return e;
      }
    }
    return "";
  }

  const json& root_;
  std::map<std::string, std::shared_ptr<const Grammar>> patterns_;
};

}  // namespace

std::string validate_value(const json& root, const json& schema, const json& value) {
  if (json_depth(value, kMaxValueDepth) > kMaxValueDepth)
    return "the value nests deeper than " + std::to_string(kMaxValueDepth) + " levels";
  try {
    return Validator(root).check(schema, value, "", "#", 0);
  } catch (const std::exception& e) {  // e.g. a malformed pattern
    return e.what();
  }
}

}  // namespace step35::grammar
