// Python's json.dumps on template values: what transformers' tojson filter returns
// (json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys)), keys in the dict's own order unless sort_keys.
#pragma once

#include <optional>
#include <string>

#include "jinja/value.h"

namespace step35::jinja {

struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;      // nullopt: one line; "" (indent=0): newlines only
  std::optional<std::string> item_separator;  // default ", " (one line) or "," (indented)
  std::optional<std::string> key_separator;   // default ": "
  bool sort_keys = false;
};

// Throws jinja::Error (Type) for values JSON cannot hold (undefined, namespaces,
// generators, ...) and for keys json.dumps refuses.
void json_dumps(const Value& v, const JsonDumpOptions& options, std::string& out, size_t max_size);

}  // namespace step35::jinja
