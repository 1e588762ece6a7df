#include "chat/tool_calls.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

#include "chat/step35_format.h"
#include "structured/grammar_constraint.h"
#include "structured/json_schema.h"
#include "structured/regex_grammar.h"

namespace step35 {

using nlohmann::json;
using namespace step35_format;

namespace {

// Builds the grammar: tags (literal text, or a special token spelled so), names, and one
// rule per function with its parameters' values from the structured-output compiler.
class ToolCallGrammar {
 public:
  explicit ToolCallGrammar(const std::function<bool(const std::string&)>& has_special)
      : b_(grammar::kMaxGrammarNodes), values_(b_), has_special_(has_special) {}

  std::shared_ptr<const grammar::Grammar> compile(const json& tools, const std::string& only_name);

 private:
  uint32_t tag(std::string_view text, uint32_t next);
  uint32_t symbol(std::string_view text);
  uint32_t function(const json& fn, const std::string& name, const std::string& tpath, uint32_t calls_loop);
  uint32_t parameter_value(const json& params, const grammar::ObjectMember& p, const std::string& vpath,
                           uint32_t after);
  uint32_t free_text_until_close(uint32_t after);

  grammar::Builder b_;
  grammar::SchemaValues values_;
  const std::function<bool(const std::string&)>& has_special_;
  std::map<std::string, uint32_t, std::less<>> symbols_;
};

// "\n</parameter>": what ends a parameter's value. (Built by appending: GCC 12 warns
// falsely (-Wrestrict) on "literal" + std::string temporaries.)
std::string value_terminator() {
  std::string t(1, '\n');
  t.append(kParameterClose);
  return t;
}

void check_name(const std::string& name, const std::string& what) {
  if (name.empty() || name.find('>') != std::string::npos || name.find('\n') != std::string::npos ||
      name.find('<') != std::string::npos)
    throw std::invalid_argument(what + " '" + name + "' cannot be written in a tool call (empty, or contains '<', '>' or a newline)");
  try {
    (void)json(name).dump();
  } catch (const json::exception&) {
    throw std::invalid_argument(what + " is not valid UTF-8");
  }
}

uint32_t ToolCallGrammar::symbol(std::string_view text) {
  auto it = symbols_.find(text);
  if (it == symbols_.end()) it = symbols_.emplace(std::string(text), b_.add_symbol(std::string(text))).first;
  return it->second;
}

uint32_t ToolCallGrammar::tag(std::string_view text, uint32_t next) {
  if (!has_special_ || !has_special_(std::string(text))) return b_.literal(text, next);
  const uint32_t s = symbol(text);
  return b_.alt({b_.literal(text, next), b_.special(s, next)});
}

std::shared_ptr<const grammar::Grammar> ToolCallGrammar::compile(const json& tools, const std::string& only_name) {
  if (!tools.is_array() || tools.empty()) throw std::invalid_argument("tools must be a non-empty array");
  grammar::check_document(tools, "the tools");
  const uint32_t calls_loop = b_.placeholder();  // after a complete call
  std::vector<uint32_t> functions;
  std::set<std::string> seen;
  for (size_t ti = 0; ti < tools.size(); ++ti) {
    const json& t = tools[ti];
    const std::string tpath = "tools[" + std::to_string(ti) + "]";
    if (!t.is_object()) throw std::invalid_argument(tpath + " must be an object");
    if (t.contains("type") && t["type"] != "function") throw std::invalid_argument(tpath + ": only type 'function' is supported");
    const json& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
      throw std::invalid_argument(tpath + ": missing function name");
    const std::string name = fn["name"].get<std::string>();
    if (!only_name.empty() && name != only_name) continue;
    check_name(name, tpath + ": function name");
    if (!seen.insert(name).second) throw std::invalid_argument(tpath + ": duplicate function name '" + name + "'");
    functions.push_back(function(fn, name, tpath, calls_loop));
  }
  if (functions.empty())
    throw std::invalid_argument(only_name.empty() ? "no tools" : "the function '" + only_name + "' is not among the tools");
  const uint32_t call = tag(kToolCallOpen, b_.byte('\n', tag(kFunctionOpen, b_.alt(functions))));
  // Between calls: nothing, or one or two newlines; after the last: bounded whitespace.
  b_.set_options(calls_loop, {call, b_.byte('\n', b_.alt({call, b_.byte('\n', call)})), values_.ws_then(b_.ret())});
  const uint32_t root = b_.add_rule("tool calls");
  b_.set_entry(root, values_.ws_then(call));
  try {
    return b_.finish(root);
  } catch (const grammar::EmptyLanguage&) {
    throw std::invalid_argument("no tool call can satisfy the tool schemas (a required parameter can never be written)");
  }
}

// NAME>\n, the parameters, </function>\n</tool_call>, then calls_loop.
uint32_t ToolCallGrammar::function(const json& fn, const std::string& name, const std::string& tpath,
                                   uint32_t calls_loop) {
  static const json kEmptyObject = json::object();
  const json& params = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : kEmptyObject;
  const std::string ppath = tpath + ".parameters#";
  const grammar::ObjectMembers object = grammar::object_members(params, ppath);
  switch (object.shape) {
    case grammar::ObjectMembers::Shape::False: throw std::invalid_argument(tpath + ": parameters schema is false");
    case grammar::ObjectMembers::Shape::NotObject:
      throw std::invalid_argument(tpath + ": parameters must be an object schema");
    case grammar::ObjectMembers::Shape::Choice:
      throw std::invalid_argument(tpath + ": unsupported: anyOf/oneOf at the top of tool parameters");
    case grammar::ObjectMembers::Shape::Object: break;
  }
  const uint32_t end_call = tag(kFunctionClose, b_.byte('\n', tag(kToolCallClose, calls_loop)));
  uint32_t cur = end_call;
  for (size_t i = object.members.size(); i > 0; --i) {
    const grammar::ObjectMember& p = object.members[i - 1];
    check_name(p.key, tpath + ": parameter name");
    const std::string vpath = grammar::path_join(ppath + "/properties", p.key);
    const uint32_t after = b_.byte('\n', cur);  // "\n" after </parameter>
    const uint32_t val = parameter_value(params, p, vpath, after);
    const uint32_t param = tag(kParameterOpen, b_.literal(p.key + ">\n", val));
    cur = p.required ? param : b_.alt({param, cur});
  }
  return b_.literal(name + ">\n", cur);
}

// A parameter's value then "\n</parameter>", then `after`.
uint32_t ToolCallGrammar::parameter_value(const json& params, const grammar::ObjectMember& p, const std::string& vpath,
                                          uint32_t after) {
  if (!grammar::parameter_is_raw_string(p.schema))
    return values_.value(params, p.schema, vpath, b_.byte('\n', tag(kParameterClose, after)));
  const uint32_t closing = b_.byte('\n', tag(kParameterClose, after));
  const uint32_t constrained = values_.raw_string(params, p.schema, vpath, value_terminator(), closing);
  return constrained != grammar::kNoNode ? constrained : free_text_until_close(after);
}

// Free text up to the first "\n</parameter>", then `after`: a KMP automaton over that
// terminator (after a mismatch only a '\n' can restart a partial match).
uint32_t ToolCallGrammar::free_text_until_close(uint32_t after) {
  const std::string term = value_terminator();
  std::vector<uint32_t> state(term.size());
  for (uint32_t& s : state) s = b_.placeholder();
  for (size_t k = 0; k < term.size(); ++k) {
    const uint32_t on_match = k + 1 == term.size() ? after : state[k + 1];
    std::vector<uint32_t> opts{b_.byte(uint8_t(term[k]), on_match)};
    grammar::CpSet other =
        grammar::cp_minus(grammar::cp_all(), {{0, 0}, {uint32_t(uint8_t(term[k])), uint32_t(uint8_t(term[k]))}});
    if (term[k] != '\n') {
      opts.push_back(b_.byte('\n', state[1]));
      other = grammar::cp_minus(other, {{'\n', '\n'}});
    }
    opts.push_back(grammar::emit_char_set(b_, other, grammar::TextMode::Raw, state[0]));
    if (k == 1 && has_special_ && has_special_(std::string(kParameterClose)))
      opts.push_back(b_.special(symbol(kParameterClose), after));
    b_.set_options(state[k], std::move(opts));
  }
  return state[0];
}

}  // namespace

std::shared_ptr<const grammar::Grammar> compile_tool_calls(const json& tools, const std::string& only_name,
                                                           const std::function<bool(const std::string&)>& has_special) {
  return ToolCallGrammar(has_special).compile(tools, only_name);
}

std::unique_ptr<TokenConstraint> make_tool_call_constraint(const json& tools, const std::string& only_name,
                                                           const Tokenizer& tok) {
  auto trie = grammar::TokenTrie::of(tok);
  auto has_special = [&](const std::string& text) {
    for (int32_t t : trie->specials())
      if (trie->piece(t) == text) return true;
    return false;
  };
  auto g = compile_tool_calls(tools, only_name, has_special);
  return std::make_unique<grammar::GrammarConstraint>(std::move(g), std::move(trie));
}

bool tool_parameter_is_raw_string(const json& schema) { return grammar::parameter_is_raw_string(schema); }

}  // namespace step35
