// A Jinja2 template as Hugging Face's apply_chat_template renders it: parsed once, then
// rendered any number of times (from any number of threads) with a context of values.
//
// The environment is transformers' chat-template environment: jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
// extension ({% break %}, {% continue %}), {% generation %} blocks, the globals
// raise_exception(message) and strftime_now(format), and a tojson filter that is
// json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...).
// docs/chat-templates.md lists the language supported and what still differs.
//
//   jinja::Template t(source);                       // throws jinja::Error (Syntax)
//   std::string prompt = t.render_json(variables);   // throws jinja::Error
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/value.h"

namespace step35::jinja {

struct TemplateOptions {
  bool trim_blocks = true;             // as transformers sets them
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;  // jinja2's default
  uint32_t max_parse_depth = 256;      // deepest nesting of expressions and blocks accepted
};

class Template {
 public:
  explicit Template(std::string_view source, const TemplateOptions& options = {});

  // variables: name -> value, as keyword arguments of jinja2's render().
  std::string render(const Dict& variables, const RenderOptions& options = {}) const;
  // variables: a JSON object; its objects become dicts keeping the client's key order.
  std::string render_json(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace step35::jinja
