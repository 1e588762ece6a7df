// The parsed template: expressions and statements, each with the line and column where it
// starts (errors at render time point there).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jinja/value.h"

namespace step35::jinja {

struct SourcePos {
  uint32_t line = 0;
  uint32_t column = 0;
};

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

enum class ExprKind : uint8_t {
  Constant,   // constant
  Name,       // name
  List,       // items
  Tuple,      // items
  Dict,       // items: key, value, key, value, ...
  Unary,      // op ("-", "+", "not"), operand = items[0]
  Binary,     // op, items[0] op items[1]; "and" / "or" short-circuit
  Concat,     // items joined with '~'
  Compare,    // items[0] ops[0] items[1] ops[1] items[2] ... (a chain, as in Python)
  Condition,  // items[1] if items[0] else items[2] (items[2] may be absent)
  Attribute,  // items[0].name
  Item,       // items[0][items[1]]
  Slice,      // start:stop:step as items[0..2]; a null item is an omitted bound
  Call,       // items[0](args...)
  Filter,     // items[0] | name(args...); items[0] null in {% filter %} blocks
  Test,       // items[0] is [not] name(args...)
};

// Arguments written at a call, filter or test.
struct CallArgs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

struct Expr {
  ExprKind kind;
  SourcePos pos;
  Value constant;                          // Constant
  std::shared_ptr<const std::string> name; // Name, Attribute, Filter, Test
  std::string op;                          // Unary, Binary
  std::vector<std::string> ops;            // Compare
  std::vector<ExprPtr> items;
  CallArgs args;                           // Call, Filter, Test
  bool negated = false;                    // Test: "is not"
};

enum class StmtKind : uint8_t {
  Text,        // text
  Print,       // {{ expr }}
  If,          // conditions[i] -> bodies[i]; else_body
  For,         // for target in expr [if condition] [recursive]: body [else: else_body]
  Set,         // set target = expr
  SetBlock,    // set target [| filter] %}body{% endset
  SetAttr,     // set ns.attr = expr
  Macro,       // macro name(params) body
  CallBlock,   // call(params) expr %}body{% endcall
  FilterBlock, // filter expr(None | ...) %}body{% endfilter
  With,        // with assignments: body
  Break,
  Continue,
};

// An assignment target: a name or a (possibly nested) tuple of names.
struct Target {
  std::string name;             // when names is empty
  std::vector<Target> names;    // tuple unpacking
  bool is_tuple = false;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  SourcePos pos;
  std::string text;                 // Text; Macro name; SetAttr namespace name
  std::string attribute;            // SetAttr attribute
  ExprPtr expr;                     // Print, For iterable, Set value, CallBlock call, FilterBlock filter chain
  ExprPtr condition;                // For: the "if" filter
  Target target;                    // For, Set, SetBlock
  std::vector<ExprPtr> conditions;  // If
  std::vector<StmtList> bodies;     // If: one per condition
  StmtList body;                    // For, SetBlock, Macro, CallBlock, FilterBlock, With
  StmtList else_body;               // If, For
  std::vector<MacroParam> params;   // Macro, CallBlock (the caller's parameters)
  std::vector<std::pair<Target, ExprPtr>> assignments;  // With
  bool recursive = false;           // For
  // Macro: whether the body refers to these names (jinja2 then accepts extra arguments).
  bool uses_caller = false;
  bool uses_varargs = false;
  bool uses_kwargs = false;
};

struct Program {
  StmtList body;
};

}  // namespace step35::jinja
