#include "jinja/interpreter.h"

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/operators.h"
#include "jinja/text.h"

namespace step35::jinja {

// --- scopes ---------------------------------------------------------------------------------

const Value* Frame::find(std::string_view name) const {
  for (const auto& [key, value] : vars)
    if (key == name) return &value;
  return nullptr;
}

void Frame::set(std::string_view name, Value value) {
  for (auto& [key, existing] : vars) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

std::shared_ptr<Frame> child_frame(std::shared_ptr<Frame> parent) {
  auto frame = std::make_shared<Frame>();
  frame->parent = std::move(parent);
  return frame;
}

// --- macros -----------------------------------------------------------------------------------

struct Interpreter::MacroDefinition {
  const Stmt* stmt;             // the macro (or call block, for a caller)
  // Where it was defined: its body sees those variables. Held weakly, as the scope holds
  // the macro (a strong pointer both ways would never be freed); a macro kept past its
  // scope (in a namespace) sees only the render's variables.
  std::weak_ptr<Frame> scope;
  std::string name;
};

namespace {

class MacroObject : public Object {
 public:
  explicit MacroObject(Interpreter::MacroDefinition definition) : definition_(std::move(definition)) {}
  const char* python_type() const override { return "Macro"; }
  const char* object_type() const override { return "jinja2.runtime.Macro object"; }
  std::string repr() const override { return "<Macro " + text::repr(definition_.name) + ">"; }
  bool is_callable() const override { return true; }
  Value call(Interpreter& interp, Arguments& args) override { return interp.invoke_macro(definition_, args); }
  Value attribute(std::string_view name) const override {
    if (name == "name") return Value::string(definition_.name);
    return Object::attribute(name);
  }

 private:
  Interpreter::MacroDefinition definition_;
};

// jinja2's LoopContext: the `loop` variable of a for-loop.
class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
 public:
  LoopObject(const Stmt* stmt, std::shared_ptr<Frame> outer, std::vector<Value> items, uint32_t depth)
      : stmt_(stmt), outer_(std::move(outer)), items_(std::move(items)), depth_(depth) {
    for (const Value& v : items_) nesting_ = std::max(nesting_, nesting_of(v) + 1);
  }

  void set_index(size_t index) { index_ = index; }

  const char* python_type() const override { return "LoopContext"; }
  const char* object_type() const override { return "jinja2.runtime.LoopContext object"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index_ + 1) + "/" + std::to_string(items_.size()) + ">";
  }
  uint32_t nesting() const override { return nesting_; }
  bool is_callable() const override { return true; }

  Value call(Interpreter& interp, Arguments& args) override {
    if (!stmt_->recursive) throw Error(ErrorKind::Type, "The loop must be marked as 'recursive' to call it recursively.");
    if (args.positional.size() != 1 || !args.keyword.empty()) {
      throw Error(ErrorKind::Type, "loop() takes exactly one argument (the items to loop over)");
    }
    return Value::string(interp.run_loop(*stmt_, iterate(interp, args.positional[0]), outer_, depth_ + 1));
  }

  Value attribute(std::string_view name) const override {
    const int64_t length = static_cast<int64_t>(items_.size());
    const int64_t index0 = static_cast<int64_t>(index_);
    if (name == "index") return Value::integer(index0 + 1);
    if (name == "index0") return Value::integer(index0);
    if (name == "revindex") return Value::integer(length - index0);
    if (name == "revindex0") return Value::integer(length - index0 - 1);
    if (name == "first") return Value::boolean(index_ == 0);
    if (name == "last") return Value::boolean(index_ + 1 == items_.size());
    if (name == "length") return Value::integer(length);
    if (name == "depth") return Value::integer(depth_);
    if (name == "depth0") return Value::integer(static_cast<int64_t>(depth_) - 1);
    if (name == "previtem") {
      return index_ == 0 ? Value::undefined_hint("there is no previous item") : items_[index_ - 1];
    }
    if (name == "nextitem") {
      return index_ + 1 >= items_.size() ? Value::undefined_hint("there is no next item") : items_[index_ + 1];
    }
    if (name == "cycle" || name == "changed") {
      auto self = std::const_pointer_cast<LoopObject>(shared_from_this());
      return Value::object(std::make_shared<LoopMethod>(std::move(self), name == "cycle"));
    }
    return Object::attribute(name);
  }

 private:
  // loop.cycle and loop.changed, bound to their loop.
  class LoopMethod : public BoundMethod {
   public:
    LoopMethod(std::shared_ptr<LoopObject> loop, bool is_cycle) : loop_(std::move(loop)), is_cycle_(is_cycle) {}
    std::string repr() const override {
      return std::string("<bound method LoopContext.") + (is_cycle_ ? "cycle" : "changed") + ">";
    }
    Value call(Interpreter&, Arguments& args) override {
      if (!args.keyword.empty()) {
        throw Error(ErrorKind::Type, std::string(is_cycle_ ? "cycle" : "changed") + "() got an unexpected keyword argument '" +
                                         args.keyword[0].first + "'");
      }
      if (is_cycle_) {
        if (args.positional.empty()) throw Error(ErrorKind::Type, "no items for cycling given");
        return args.positional[loop_->index_ % args.positional.size()];
      }
      Value current = Value::tuple(args.positional);
      LoopObject& loop = *loop_;
      if (!loop.has_changed_value_ || !equals(loop.last_changed_value_, current)) {
        loop.has_changed_value_ = true;
        loop.last_changed_value_ = std::move(current);
        return Value::boolean(true);
      }
      return Value::boolean(false);
    }

   private:
    std::shared_ptr<LoopObject> loop_;  // keeps the loop alive if the method outlives it
    bool is_cycle_;
  };

  const Stmt* stmt_;
  std::shared_ptr<Frame> outer_;
  std::vector<Value> items_;
  uint32_t depth_;
  uint32_t nesting_ = 1;
  size_t index_ = 0;
  bool has_changed_value_ = false;
  Value last_changed_value_;
};

[[noreturn]] void runtime_error(std::string message) { throw Error(ErrorKind::Type, std::move(message)); }

}  // namespace

// --- the interpreter ------------------------------------------------------------------------

Interpreter::Interpreter(std::shared_ptr<const Program> program, const Dict& variables, const RenderOptions& options)
    : program_(std::move(program)), variables_(variables), options_(options) {}

Interpreter::~Interpreter() {
  // A namespace can hold itself, or a loop object whose scope holds the namespace:
  // emptying them breaks those cycles.
  for (auto& weak : namespaces_) {
    if (auto ns = weak.lock()) ns->clear();
  }
}

Interpreter::DepthGuard::DepthGuard(Interpreter& i) : interp(i) {
  if (++interp.depth_ > interp.options_.limits.max_depth) {
    --interp.depth_;
    throw Error(ErrorKind::Limit, "the template nests deeper than " + std::to_string(interp.options_.limits.max_depth) +
                                      " levels at run time (recursive macros?)");
  }
}

void Interpreter::charge(uint64_t steps) {
  steps_ += steps;
  if (steps_ > options_.limits.max_steps) {
    throw Error(ErrorKind::Limit, "the template ran more than " + std::to_string(options_.limits.max_steps) +
                                      " steps (loop iterations, macro calls and filtered elements)");
  }
}

void Interpreter::check_value_size(size_t size) const {
  if (size > options_.limits.max_value_size) {
    throw Error(ErrorKind::Limit, "a value of " + std::to_string(size) + " bytes is above the limit of " +
                                      std::to_string(options_.limits.max_value_size));
  }
}

void Interpreter::check_list_size(size_t items) const {
  if (items > options_.limits.max_value_size / sizeof(Value)) {
    throw Error(ErrorKind::Limit, "a list of " + std::to_string(items) + " items (" + std::to_string(sizeof(Value)) +
                                      " bytes each) is above the limit of " +
                                      std::to_string(options_.limits.max_value_size) + " bytes");
  }
}

std::chrono::system_clock::time_point Interpreter::now() const {
  return options_.now ? options_.now() : std::chrono::system_clock::now();
}

std::string Interpreter::render() {
  std::string out;
  out_ = &out;
  out_limit_ = options_.limits.max_output_bytes;
  auto root = std::make_shared<Frame>();
  const Flow flow = render_block(program_->body, root);
  (void)flow;  // break/continue outside a loop is refused by the parser
  return out;
}

void Interpreter::append_output(std::string_view text) {
  if (out_->size() + text.size() > out_limit_) {
    throw Error(ErrorKind::Limit, "the output would exceed " + std::to_string(out_limit_) + " bytes");
  }
  out_->append(text);
}

std::string Interpreter::capture(const StmtList& body, const std::shared_ptr<Frame>& frame) {
  std::string buffer;
  std::string* saved = out_;
  const size_t saved_limit = out_limit_;
  out_ = &buffer;
  out_limit_ = options_.limits.max_value_size;
  try {
    render_block(body, frame);
  } catch (...) {
    out_ = saved;
    out_limit_ = saved_limit;
    throw;
  }
  out_ = saved;
  out_limit_ = saved_limit;
  return buffer;
}

// --- statements -----------------------------------------------------------------------------

Interpreter::Flow Interpreter::render_block(const StmtList& body, const std::shared_ptr<Frame>& frame) {
  for (const StmtPtr& s : body) {
    const Flow flow = render_statement(*s, frame);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::render_statement(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  DepthGuard guard(*this);
  Flow flow = Flow::Normal;
  try {
    switch (s.kind) {
      case StmtKind::Text: append_output(s.text); break;
      case StmtKind::Print: {
        const Value v = eval(*s.expr, frame);
        if (v.is_string()) {
          append_output(v.string_value());
        } else {
          append_output(v.str());
        }
        break;
      }
      case StmtKind::If: render_if(s, frame, flow); break;
      case StmtKind::For: render_for(s, frame); break;
      case StmtKind::Set: assign(s.target, eval(*s.expr, frame), *frame); break;
      case StmtKind::SetAttr: {
        const Value* ns = frame->find(s.text);
        for (const Frame* f = frame->parent.get(); ns == nullptr && f != nullptr; f = f->parent.get()) ns = f->find(s.text);
        if (ns == nullptr) ns = variables_.find(std::string_view(s.text));
        if (ns == nullptr || !ns->is_namespace()) runtime_error("cannot assign attribute on non-namespace object");
        const Value value = eval(*s.expr, frame);
        ns->namespace_attributes().set(std::string_view(s.attribute), value);
        break;
      }
      case StmtKind::SetBlock: {
        Value value = Value::string(capture(s.body, child_frame(frame)));
        if (s.expr) value = eval_filter(*s.expr, value, frame);
        assign(s.target, value, *frame);
        break;
      }
      case StmtKind::Macro: frame->set(s.text, make_macro(s, frame, false)); break;
      case StmtKind::CallBlock: {
        const Expr& call = *s.expr;
        Value callee = eval(*call.items[0], frame);
        Arguments args;
        eval_arguments(call.args, frame, args);
        args.keyword.emplace_back("caller", make_macro(s, frame, true));
        append_output(this->call(callee, args).str());
        break;
      }
      case StmtKind::FilterBlock: {
        const Value body = Value::string(capture(s.body, child_frame(frame)));
        append_output(eval_filter(*s.expr, body, frame).str());
        break;
      }
      case StmtKind::With: {
        auto inner = child_frame(frame);
        for (const auto& [target, expr] : s.assignments) assign(target, eval(*expr, frame), *inner);
        flow = render_block(s.body, inner);
        break;
      }
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
    }
  } catch (const Error& e) {
    if (!e.has_position()) throw e.at(s.pos.line, s.pos.column);
    throw;
  }
  return flow;
}

void Interpreter::render_if(const Stmt& s, const std::shared_ptr<Frame>& frame, Flow& flow) {
  for (size_t i = 0; i < s.conditions.size(); ++i) {
    if (eval(*s.conditions[i], frame).truthy()) {
      flow = render_block(s.bodies[i], frame);
      return;
    }
  }
  flow = render_block(s.else_body, frame);
}

void Interpreter::render_for(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  std::vector<Value> items = iterate(*this, eval(*s.expr, frame));
  charge(items.size());
  if (s.condition) {
    // The "if" of a filtered loop sees the loop variables (but no `loop`).
    std::vector<Value> kept;
    auto scope = child_frame(frame);
    for (Value& item : items) {
      scope->vars.clear();
      assign(s.target, item, *scope);
      if (eval(*s.condition, scope).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    render_block(s.else_body, child_frame(frame));
    return;
  }
  append_output(run_loop(s, std::move(items), frame, 1));
}

std::string Interpreter::run_loop(const Stmt& s, std::vector<Value> items, const std::shared_ptr<Frame>& outer,
                                  uint32_t depth) {
  DepthGuard guard(*this);
  // The loop's output is captured so that a recursive loop(...) call can return it.
  std::string buffer;
  std::string* saved = out_;
  const size_t saved_limit = out_limit_;
  out_ = &buffer;
  out_limit_ = saved == nullptr ? options_.limits.max_output_bytes : saved_limit - std::min(saved_limit, saved->size());
  const auto restore = [&] {
    out_ = saved;
    out_limit_ = saved_limit;
  };
  try {
    auto loop = std::make_shared<LoopObject>(&s, outer, items, depth);
    const Value loop_value = Value::object(loop);
    std::shared_ptr<Frame> scope;
    for (size_t i = 0; i < items.size(); ++i) {
      charge(1);
      // A fresh scope per iteration (jinja2: a variable set in one iteration is gone in
      // the next); reused unless something kept it (a recursive loop, a macro defined in it).
      if (!scope || scope.use_count() > 1 || scope->captured) {
        scope = child_frame(outer);
      } else {
        scope->vars.clear();
      }
      loop->set_index(i);
      scope->set("loop", loop_value);
      assign(s.target, items[i], *scope);
      if (render_block(s.body, scope) == Flow::Break) break;
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return buffer;
}

void Interpreter::assign(const Target& target, const Value& value, Frame& frame) {
  if (!target.is_tuple) {
    frame.set(target.name, value);
    return;
  }
  const std::vector<Value> parts = iterate(*this, value);
  if (parts.size() < target.names.size()) {
    runtime_error("not enough values to unpack (expected " + std::to_string(target.names.size()) + ", got " +
                  std::to_string(parts.size()) + ")");
  }
  if (parts.size() > target.names.size()) {
    runtime_error("too many values to unpack (expected " + std::to_string(target.names.size()) + ")");
  }
  for (size_t i = 0; i < parts.size(); ++i) assign(target.names[i], parts[i], frame);
}

// --- macros -------------------------------------------------------------------------------

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Frame>& frame, bool is_caller) {
  frame->captured = true;
  MacroDefinition definition{&s, frame, is_caller ? "caller" : s.text};
  return Value::object(std::make_shared<MacroObject>(std::move(definition)));
}

Value Interpreter::invoke_macro(const MacroDefinition& macro, Arguments& args) {
  DepthGuard guard(*this);
  charge(1);
  const Stmt& s = *macro.stmt;
  const std::string& name = macro.name;
  const size_t count = s.params.size();
  auto scope = child_frame(macro.scope.lock());
  // Parameters: positional first, then keywords by name, then defaults (evaluated in the
  // macro's scope, so a default may use the parameters before it).
  std::vector<bool> consumed(args.keyword.size(), false);
  for (size_t i = 0; i < count; ++i) {
    const MacroParam& param = s.params[i];
    if (i < args.positional.size()) {
      scope->set(param.name, args.positional[i]);
      continue;
    }
    bool found = false;
    for (size_t k = 0; k < args.keyword.size(); ++k) {
      if (!consumed[k] && args.keyword[k].first == param.name) {
        consumed[k] = true;
        scope->set(param.name, args.keyword[k].second);
        found = true;
        break;
      }
    }
    if (found) continue;
    if (param.default_value) {
      scope->set(param.name, eval(*param.default_value, scope));
    } else {
      scope->set(param.name, Value::undefined_hint("parameter " + text::repr(param.name) + " was not provided"));
    }
  }
  if (s.uses_caller) {
    Value caller = Value::undefined_hint("No caller defined");
    for (size_t k = 0; k < args.keyword.size(); ++k) {
      if (!consumed[k] && args.keyword[k].first == "caller") {
        consumed[k] = true;
        caller = args.keyword[k].second;
      }
    }
    scope->set("caller", caller);
  }
  auto extra_keywords = std::make_shared<Dict>();
  for (size_t k = 0; k < args.keyword.size(); ++k) {
    if (consumed[k]) continue;
    if (!s.uses_kwargs) {
      if (args.keyword[k].first == "caller") {
        runtime_error("macro " + text::repr(name) +
                      " was invoked with two values for the special caller argument. This is most likely a bug.");
      }
      runtime_error("macro " + text::repr(name) + " takes no keyword argument " + text::repr(args.keyword[k].first));
    }
    extra_keywords->set(std::string_view(args.keyword[k].first), args.keyword[k].second);
  }
  if (s.uses_kwargs) scope->set("kwargs", Value::dict(extra_keywords));
  if (s.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = count; i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
    scope->set("varargs", Value::tuple(std::move(rest)));
  } else if (args.positional.size() > count) {
    runtime_error("macro " + text::repr(name) + " takes not more than " + std::to_string(count) + " argument(s)");
  }
  return Value::string(capture(s.body, scope));
}

// --- expressions --------------------------------------------------------------------------

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  DepthGuard guard(*this);
  try {
    return eval_expr(e, frame);
  } catch (const Error& error) {
    if (!error.has_position()) throw error.at(e.pos.line, e.pos.column);
    throw;
  }
}

Value Interpreter::eval_name(const Expr& e, const Frame& frame) {
  const std::string& name = *e.name;
  for (const Frame* f = &frame; f != nullptr; f = f->parent.get()) {
    if (const Value* v = f->find(name)) return *v;
  }
  if (const Value* v = variables_.find(std::string_view(name))) return *v;
  Value global = global_function(name);
  if (!global.is_undefined()) return global;
  return Value::undefined_missing(e.name);
}

Value Interpreter::eval_expr(const Expr& e, const std::shared_ptr<Frame>& frame) {
  switch (e.kind) {
    case ExprKind::Constant: return e.constant;
    case ExprKind::Name: return eval_name(e, *frame);
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const ExprPtr& item : e.items) items.push_back(eval(*item, frame));
      return Value::list(std::move(items), e.kind == ExprKind::Tuple ? ListFlavor::Tuple : ListFlavor::List);
    }
    case ExprKind::Dict: return eval_dict(e, frame);
    case ExprKind::Unary: {
      const Value operand = eval(*e.items[0], frame);
      if (e.op == "not") return Value::boolean(!operand.truthy());
      if (e.op == "-") return negate(operand);
      return unary_plus(operand);
    }
    case ExprKind::Binary: return eval_binary(e, frame);
    case ExprKind::Concat: {
      std::string out;
      for (const ExprPtr& item : e.items) {
        eval(*item, frame).append_str(out);
        check_value_size(out.size());
      }
      return Value::string(std::move(out));
    }
    case ExprKind::Compare: return eval_compare(e, frame);
    case ExprKind::Condition: {
      if (eval(*e.items[0], frame).truthy()) return eval(*e.items[1], frame);
      if (e.items[2]) return eval(*e.items[2], frame);
      return Value::undefined_hint("the inline if-expression evaluated to false and no else section was defined.");
    }
    case ExprKind::Attribute: {
      const Value object = eval(*e.items[0], frame);
      return get_attribute(object, e.name);
    }
    case ExprKind::Item: return eval_item(e, frame);
    case ExprKind::Slice: runtime_error("a slice is only valid inside [...]");
    case ExprKind::Call: return eval_call(e, frame);
    case ExprKind::Filter: return eval_filter(e, Value(), frame);
    case ExprKind::Test: {
      const Value operand = eval(*e.items[0], frame);
      Arguments args;
      eval_arguments(e.args, frame, args);
      const bool result = apply_test(*this, *e.name, operand, args);
      return Value::boolean(e.negated ? !result : result);
    }
  }
  runtime_error("unknown expression");
}

Value Interpreter::eval_dict(const Expr& e, const std::shared_ptr<Frame>& frame) {
  auto d = std::make_shared<Dict>();
  for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
    const Value key = eval(*e.items[i], frame);
    if (!is_hashable(key)) runtime_error(std::string("unhashable type: '") + key.python_type() + "'");
    d->set(key, eval(*e.items[i + 1], frame));
  }
  return Value::dict(std::move(d));
}

// "and" / "or" short-circuit and give one of their operands, as in Python.
Value Interpreter::eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame) {
  if (e.op == "and") {
    Value left = eval(*e.items[0], frame);
    return left.truthy() ? eval(*e.items[1], frame) : left;
  }
  if (e.op == "or") {
    Value left = eval(*e.items[0], frame);
    return left.truthy() ? left : eval(*e.items[1], frame);
  }
  const Value left = eval(*e.items[0], frame);
  const Value right = eval(*e.items[1], frame);
  return binary_operation(e.op, left, right, options_.limits.max_value_size);
}

// object[index] or object[start:stop:step] (a None bound counts as omitted).
Value Interpreter::eval_item(const Expr& e, const std::shared_ptr<Frame>& frame) {
  const Value object = eval(*e.items[0], frame);
  const Expr& index = *e.items[1];
  if (index.kind != ExprKind::Slice) return get_item(object, eval(index, frame));
  Value bounds[3];
  const Value* pointers[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    if (!index.items[i]) continue;
    bounds[i] = eval(*index.items[i], frame);
    if (!bounds[i].is_none()) pointers[i] = &bounds[i];
  }
  if (object.is_undefined()) raise_undefined(object);
  return get_slice(object, pointers[0], pointers[1], pointers[2]);
}

Value Interpreter::eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame) {
  Value left = eval(*e.items[0], frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i + 1], frame);
    const std::string& op = e.ops[i];
    bool result;
    if (op == "==") {
      result = equals(left, right);
    } else if (op == "!=") {
      result = !equals(left, right);
    } else if (op == "in") {
      result = contains(right, left);
    } else if (op == "notin") {
      result = !contains(right, left);
    } else {
      result = compare(op, left, right);
    }
    if (!result) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

void Interpreter::eval_arguments(const CallArgs& call, const std::shared_ptr<Frame>& frame, Arguments& args) {
  args.positional.reserve(call.positional.size());
  for (const ExprPtr& arg : call.positional) args.positional.push_back(eval(*arg, frame));
  for (const auto& [name, arg] : call.keyword) args.keyword.emplace_back(name, eval(*arg, frame));
  if (call.star_args) {
    for (Value& v : iterate(*this, eval(*call.star_args, frame))) args.positional.push_back(std::move(v));
  }
  if (call.star_kwargs) {
    const Value kwargs = eval(*call.star_kwargs, frame);
    if (!kwargs.is_dict()) runtime_error(std::string("argument after ** must be a mapping, not ") + kwargs.python_type());
    for (const auto& [key, value] : kwargs.dict_value().entries()) {
      if (!key.is_string()) runtime_error("keywords must be strings");
      args.keyword.emplace_back(key.string_value(), value);
    }
  }
}

Value Interpreter::eval_call(const Expr& e, const std::shared_ptr<Frame>& frame) {
  const Expr& callee_expr = *e.items[0];
  // obj.method(...) on a str, dict or list calls the method without making a bound object.
  if (callee_expr.kind == ExprKind::Attribute) {
    const Value object = eval(*callee_expr.items[0], frame);
    const MethodAccess access = find_method(object, *callee_expr.name);
    if (access == MethodAccess::Safe) {
      Arguments args;
      eval_arguments(e.args, frame, args);
      return call_method(*this, object, *callee_expr.name, args);
    }
    const Value callee = get_attribute(object, callee_expr.name);
    Arguments args;
    eval_arguments(e.args, frame, args);
    return call(callee, args);
  }
  const Value callee = eval(callee_expr, frame);
  Arguments args;
  eval_arguments(e.args, frame, args);
  return call(callee, args);
}

Value Interpreter::call(const Value& callee, Arguments& args) {
  if (callee.is_undefined()) raise_undefined(callee);
  if (!callee.is_callable()) runtime_error(std::string("'") + callee.python_type() + "' object is not callable");
  return callee.object_value().call(*this, args);
}

// A filter node, or a chain of them; `input` replaces the innermost operand when that is
// absent ({% filter %} blocks, {% set x | f %}).
Value Interpreter::eval_filter(const Expr& e, const Value& input, const std::shared_ptr<Frame>& frame) {
  if (e.kind != ExprKind::Filter) return eval(e, frame);
  DepthGuard guard(*this);
  try {
    const Value operand = e.items[0] ? eval_filter(*e.items[0], input, frame) : input;
    Arguments args;
    eval_arguments(e.args, frame, args);
    return apply_filter(*this, *e.name, operand, args);
  } catch (const Error& error) {
    if (!error.has_position()) throw error.at(e.pos.line, e.pos.column);
    throw;
  }
}

Value Interpreter::make_namespace(Arguments& args) {
  auto attributes = std::make_shared<Dict>();
  for (const Value& positional : args.positional) {
    if (!positional.is_dict()) runtime_error(std::string("'") + positional.python_type() + "' object is not a mapping");
    for (const auto& [key, value] : positional.dict_value().entries()) attributes->set(key, value);
  }
  for (const auto& [key, value] : args.keyword) attributes->set(std::string_view(key), value);
  // Namespaces that are gone need no clearing: drop them when the list doubles, so that a
  // loop making namespaces does not grow it without bound.
  if (namespaces_.size() >= 2 * namespaces_live_ + 64) {
    std::erase_if(namespaces_, [](const std::weak_ptr<Dict>& ns) { return ns.expired(); });
    namespaces_live_ = namespaces_.size();
  }
  namespaces_.push_back(attributes);
  return Value::namespace_of(std::move(attributes));
}

}  // namespace step35::jinja
