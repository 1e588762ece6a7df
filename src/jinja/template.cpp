#include "jinja/template.h"

#include "jinja/parser.h"

namespace step35::jinja {

Template::Template(std::string_view source, const TemplateOptions& options) {
  ParseOptions parse_options;
  parse_options.lexer.trim_blocks = options.trim_blocks;
  parse_options.lexer.lstrip_blocks = options.lstrip_blocks;
  parse_options.lexer.keep_trailing_newline = options.keep_trailing_newline;
  parse_options.max_depth = options.max_parse_depth;
  program_ = std::make_shared<const Program>(parse_template(source, parse_options));
}

std::string Template::render(const Dict& variables, const RenderOptions& options) const {
  Interpreter interpreter(program_, variables, options);
  return interpreter.render();
}

std::string Template::render_json(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  if (!variables.is_object()) throw Error(ErrorKind::Type, "the template variables must be a JSON object");
  const Value context = Value::from_json(variables);
  return render(context.dict_value(), options);
}

}  // namespace step35::jinja
