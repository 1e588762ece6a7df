// Renders a parsed template: walks the statements, evaluates expressions with Python's
// semantics and jinja2's scoping (a for-loop iteration, a macro call and a with-block
// each get a scope of their own; if-blocks do not), and enforces the render limits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace step35::jinja {

// Bounds on one render; reaching one is an Error of kind Limit, never a hang or a crash.
struct Limits {
  size_t max_output_bytes = size_t(16) << 20;  // the rendered text
  size_t max_value_size = size_t(16) << 20;    // bytes of one string or of one list's values
  uint64_t max_steps = 2'000'000;              // loop iterations, macro calls, elements filters visit
  uint32_t max_depth = 600;                    // nesting of expressions, blocks and macro calls at run time
};

struct RenderOptions {
  Limits limits;
  // The clock of strftime_now (local time, as Python's datetime.now()); default: now.
  std::function<std::chrono::system_clock::time_point()> now;
};

// A scope: the variables set in it, and the scope it sits in.
struct Frame {
  std::vector<std::pair<std::string_view, Value>> vars;  // names point into the program
  std::shared_ptr<Frame> parent;
  bool captured = false;  // a macro was defined in it (a loop then gives the next iteration a new one)

  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);
};

// A new scope inside `parent` (null: only the render's variables and globals are visible).
std::shared_ptr<Frame> child_frame(std::shared_ptr<Frame> parent);

class Interpreter {
 public:
  Interpreter(std::shared_ptr<const Program> program, const Dict& variables, const RenderOptions& options);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::string render();

  // --- services for the built-in library ---
  const Limits& limits() const { return options_.limits; }
  // Counts work against max_steps.
  void charge(uint64_t steps);
  // Refuses a string of `size` bytes above max_value_size.
  void check_value_size(size_t size) const;
  // Refuses a list whose values would take more than max_value_size bytes.
  void check_list_size(size_t items) const;
  // Calls any callable value (macro, built-in function, bound method).
  Value call(const Value& callee, Arguments& args);
  Value make_namespace(Arguments& args);
  std::chrono::system_clock::time_point now() const;

  // --- used by the objects defined in interpreter.cpp ---
  struct MacroDefinition;
  Value invoke_macro(const MacroDefinition& macro, Arguments& args);
  std::string run_loop(const Stmt& loop, std::vector<Value> items, const std::shared_ptr<Frame>& outer,
                       uint32_t depth);

 private:
  enum class Flow : uint8_t { Normal, Break, Continue };

  Flow render_block(const StmtList& body, const std::shared_ptr<Frame>& frame);
  Flow render_statement(const Stmt& s, const std::shared_ptr<Frame>& frame);
  void render_if(const Stmt& s, const std::shared_ptr<Frame>& frame, Flow& flow);
  void render_for(const Stmt& s, const std::shared_ptr<Frame>& frame);
  std::string capture(const StmtList& body, const std::shared_ptr<Frame>& frame);
  void assign(const Target& target, const Value& value, Frame& frame);
  void append_output(std::string_view text);

  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_expr(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_name(const Expr& e, const Frame& frame);
  Value eval_dict(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_item(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_call(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_filter(const Expr& e, const Value& input, const std::shared_ptr<Frame>& frame);
  void eval_arguments(const CallArgs& call, const std::shared_ptr<Frame>& frame, Arguments& args);
  Value make_macro(const Stmt& s, const std::shared_ptr<Frame>& frame, bool is_caller);

  struct DepthGuard {
    explicit DepthGuard(Interpreter& interp);
    ~DepthGuard() { --interp.depth_; }
    Interpreter& interp;
  };

  std::shared_ptr<const Program> program_;
  const Dict& variables_;
  RenderOptions options_;
  std::string* out_ = nullptr;
  size_t out_limit_ = 0;
  uint64_t steps_ = 0;
  uint32_t depth_ = 0;
  // The namespaces made (weakly): emptied at the end, which breaks the reference cycles a
  // template can make through them (a namespace holding itself or a loop object).
  std::vector<std::weak_ptr<Dict>> namespaces_;
  size_t namespaces_live_ = 0;
};

}  // namespace step35::jinja
