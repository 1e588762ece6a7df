#include "jinja/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "jinja/error.h"
#include "jinja/format.h"
#include "jinja/operators.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = text::next_code_point(s, pos);
    char buf[16];
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else if (ensure_ascii && cp > 0x7F) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += '"';
}

std::string json_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return float_repr(x);
}

// A dict key as json.dumps writes it (before quoting).
std::string key_text(const Value& key) {
  switch (key.kind()) {
    case ValueKind::String: return key.string_value();
    case ValueKind::Int: return key.str();
    case ValueKind::Float: return json_float(key.float_value());
    case ValueKind::Bool: return key.bool_value() ? "true" : "false";
    case ValueKind::None: return "null";
    default: type_error(std::string("keys must be str, int, float, bool or None, not ") + key.python_type());
  }
}

class Dumper {
 public:
  Dumper(const JsonDumpOptions& options, std::string& out, size_t max_size)
      : options_(options), out_(out), max_size_(max_size) {
    const bool indented = options.indent.has_value();
    item_separator_ = options.item_separator.value_or(indented ? "," : ", ");
    key_separator_ = options.key_separator.value_or(": ");
  }

  void dump(const Value& v, size_t level) {
    if (level > kMaxValueNesting) type_error("values nested too deeply for tojson");
    if (out_.size() > max_size_) {
      throw Error(ErrorKind::Limit, "tojson output is above the limit of " + std::to_string(max_size_) + " bytes");
    }
    switch (v.kind()) {
      case ValueKind::None: out_ += "null"; return;
      case ValueKind::Bool: out_ += v.bool_value() ? "true" : "false"; return;
      case ValueKind::Int: v.append_str(out_); return;
      case ValueKind::Float: out_ += json_float(v.float_value()); return;
      case ValueKind::String: append_json_string(out_, v.string_value(), options_.ensure_ascii); return;
      case ValueKind::List:
        if (v.list_flavor() == ListFlavor::List || v.list_flavor() == ListFlavor::Tuple) {
          dump_list(v.items(), level);
          return;
        }
        break;
      case ValueKind::Dict: dump_dict(v.dict_value(), level); return;
      default: break;
    }
    type_error(std::string("Object of type ") + v.python_type() + " is not JSON serializable");
  }

 private:
  void newline(size_t level) {
    // The indent string may be long: check before writing level copies of it.
    if (options_.indent->size() * level > max_size_ - std::min(max_size_, out_.size())) {
      throw Error(ErrorKind::Limit, "tojson output is above the limit of " + std::to_string(max_size_) + " bytes");
    }
    out_ += '\n';
    for (size_t i = 0; i < level; ++i) out_ += *options_.indent;
  }

  void dump_list(const std::vector<Value>& items, size_t level) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i != 0) out_ += item_separator_;
      if (options_.indent) newline(level + 1);
      dump(items[i], level + 1);
    }
    if (options_.indent) newline(level);
    out_ += ']';
  }

  void dump_dict(const Dict& d, size_t level) {
    if (d.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    entries.reserve(d.size());
    for (const auto& entry : d.entries()) entries.push_back(&entry);
    if (options_.sort_keys) {
      // Python sorts the (key, value) pairs by key before converting keys to text.
      std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
        return compare("<", a->first, b->first);
      });
    }
    out_ += '{';
    bool first = true;
    for (const auto* entry : entries) {
      if (!first) out_ += item_separator_;
      first = false;
      if (options_.indent) newline(level + 1);
      append_json_string(out_, key_text(entry->first), options_.ensure_ascii);
      out_ += key_separator_;
      dump(entry->second, level + 1);
    }
    if (options_.indent) newline(level);
    out_ += '}';
  }

  const JsonDumpOptions& options_;
  std::string& out_;
  size_t max_size_;
  std::string item_separator_;
  std::string key_separator_;
};

}  // namespace

void json_dumps(const Value& v, const JsonDumpOptions& options, std::string& out, size_t max_size) {
  Dumper(options, out, max_size).dump(v, 0);
}

}  // namespace step35::jinja
