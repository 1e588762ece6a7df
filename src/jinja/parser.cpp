#include "jinja/parser.h"

#include <algorithm>

#include "jinja/builtins.h"
#include "jinja/error.h"

namespace step35::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseOptions& options) : tokens_(std::move(tokens)), options_(options) {}

  Program parse() {
    Program program;
    program.body = subparse({});
    if (current().type != TokenType::End) fail("unexpected " + describe(current()));
    return program;
  }

 private:
  // --- token access ---
  const Token& current() const { return tokens_[pos_]; }
  const Token& look(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  static bool is_name(const Token& t, std::string_view name) { return t.type == TokenType::Name && t.text == name; }
  static bool is_op(const Token& t, std::string_view op) { return t.type == TokenType::Operator && t.text == op; }
  bool skip_name(std::string_view name) {
    if (!is_name(current(), name)) return false;
    advance();
    return true;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(current(), op)) return false;
    advance();
    return true;
  }
  static SourcePos pos_of(const Token& t) { return SourcePos{t.line, t.column}; }

  // s in single quotes. Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on
  // "'" + std::string(...) where it inlines the concatenation.
  static std::string quoted(std::string_view s) {
    std::string q;
    q.reserve(s.size() + 2);
    q += '\'';
    q += s;
    q += '\'';
    return q;
  }

  static std::string describe(const Token& t) {
    if (t.type == TokenType::Name || t.type == TokenType::Operator) return quoted(t.text);
    return quoted(describe_token(t));
  }

  [[noreturn]] void fail(const std::string& message) const { fail_at(message, current()); }
  [[noreturn]] static void fail_at(const std::string& message, const Token& t) {
    throw Error(ErrorKind::Syntax, message, t.line, t.column);
  }

  void expect_op(std::string_view op) {
    if (current().type == TokenType::End) fail("unexpected end of template, expected '" + std::string(op) + "'.");
    if (!is_op(current(), op)) fail("expected token '" + std::string(op) + "', got " + describe(current()));
    advance();
  }
  void expect_type(TokenType type) {
    if (current().type == type) {
      advance();
      return;
    }
    Token wanted;
    wanted.type = type;
    if (current().type == TokenType::End) fail("unexpected end of template, expected '" + describe_token(wanted) + "'.");
    fail("expected token '" + describe_token(wanted) + "', got " + describe(current()));
  }
  std::string expect_name() {
    if (current().type != TokenType::Name) {
      if (current().type == TokenType::End) fail("unexpected end of template, expected 'name'.");
      fail("expected token 'name', got " + describe(current()));
    }
    std::string name = current().text;
    advance();
    return name;
  }

  // Nesting guard: the parser recurses once per nested expression or block.
  struct DepthGuard {
    DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > parser.options_.max_depth) {
        parser.fail("the template nests expressions or blocks more than " + std::to_string(parser.options_.max_depth) +
                    " levels deep");
      }
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // Inside if-statements and conditional expressions an unknown filter or test is only an
  // error when it runs (jinja2's "soft" frames); a loop or macro body resets that.
  struct SoftScope {
    SoftScope(Parser& p, bool soft) : parser(p), saved(p.soft_) { parser.soft_ = soft; }
    ~SoftScope() { parser.soft_ = saved; }
    Parser& parser;
    bool saved;
  };

  ExprPtr make_expr(ExprKind kind, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  StmtPtr make_stmt(StmtKind kind, SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->pos = pos;
    return s;
  }

  // --- statements ---

  // Parses template content until a block tag whose name is one of end_tags; stops with
  // that name as the current token.
  StmtList subparse(const std::vector<std::string_view>& end_tags) {
    StmtList body;
    while (true) {
      const Token& t = current();
      switch (t.type) {
        case TokenType::Text: {
          auto s = make_stmt(StmtKind::Text, pos_of(t));
          s->text = t.text;
          body.push_back(std::move(s));
          advance();
          break;
        }
        case TokenType::VariableBegin: {
          advance();
          auto s = make_stmt(StmtKind::Print, pos_of(current()));
          s->expr = parse_tuple(true, {}, false);
          expect_type(TokenType::VariableEnd);
          body.push_back(std::move(s));
          break;
        }
        case TokenType::BlockBegin: {
          advance();
          if (!end_tags.empty() && current().type == TokenType::Name &&
              std::find(end_tags.begin(), end_tags.end(), current().text) != end_tags.end()) {
            return body;
          }
          body.push_back(parse_statement());
          expect_type(TokenType::BlockEnd);
          break;
        }
        case TokenType::End: return body;
        default: fail("unexpected " + describe(t));
      }
    }
  }

  // The body of a block statement up to one of end_tags (consumed when drop_needle).
  StmtList parse_statements(const std::vector<std::string_view>& end_tags, bool drop_needle) {
    DepthGuard guard(*this);
    skip_op(":");
    expect_type(TokenType::BlockEnd);
    StmtList body = subparse(end_tags);
    if (current().type == TokenType::End) fail_eof(end_tags);
    if (drop_needle) advance();
    return body;
  }

  [[noreturn]] void fail_eof(const std::vector<std::string_view>& end_tags) {
    std::string message = "Unexpected end of template.";
    message += looking_for(end_tags);
    fail(message);
  }

  std::string looking_for(const std::vector<std::string_view>& end_tags) const {
    if (end_tags.empty()) return "";
    std::string message = " Jinja was looking for the following tags: ";
    for (size_t i = 0; i < end_tags.size(); ++i) {
      if (i != 0) message += " or ";
      message += quoted(end_tags[i]);
    }
    message += ".";
    if (!open_blocks_.empty()) message += " The innermost block that needs to be closed is '" + open_blocks_.back() + "'.";
    return message;
  }

  struct OpenBlock {
    OpenBlock(Parser& p, std::string name) : parser(p) { parser.open_blocks_.push_back(std::move(name)); }
    ~OpenBlock() { parser.open_blocks_.pop_back(); }
    Parser& parser;
  };

  StmtPtr parse_statement() {
    const Token& t = current();
    if (t.type != TokenType::Name) fail("tag name expected");
    const std::string name = t.text;
    const SourcePos pos = pos_of(t);
    if (name == "for") return parse_for();
    if (name == "if") return parse_if();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "print") {
      advance();
      auto s = make_stmt(StmtKind::Print, pos);
      s->expr = parse_tuple(true, {}, false);
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop");
      advance();
      return make_stmt(name == "break" ? StmtKind::Break : StmtKind::Continue, pos);
    }
    if (name == "generation") {
      // transformers' AssistantTracker: marks assistant text; renders its body unchanged.
      advance();
      OpenBlock open(*this, "generation");
      auto s = make_stmt(StmtKind::With, pos);
      s->body = parse_statements({"endgeneration"}, true);
      return s;
    }
    if (name == "include" || name == "import" || name == "from" || name == "extends" || name == "block") {
      fail("'" + name + "' is not supported: chat templates are a single file");
    }
    std::string message = "Encountered unknown tag '" + name + "'.";
    if (!end_tag_stack_.empty()) message += looking_for(end_tag_stack_.back());
    fail(message);
  }

  // Tags that end the innermost open block, for "unknown tag" messages.
  struct EndTags {
    EndTags(Parser& p, std::vector<std::string_view> tags) : parser(p) { parser.end_tag_stack_.push_back(std::move(tags)); }
    ~EndTags() { parser.end_tag_stack_.pop_back(); }
    Parser& parser;
  };

  StmtPtr parse_for() {
    auto s = make_stmt(StmtKind::For, pos_of(current()));
    advance();
    s->target = parse_assign_target({"in"});
    if (!skip_name("in")) fail("expected token 'in', got " + describe(current()));
    s->expr = parse_tuple(false, {"recursive"}, false);
    SoftScope hard(*this, false);
    if (skip_name("if")) s->condition = parse_expression(true);
    if (skip_name("recursive")) s->recursive = true;
    OpenBlock open(*this, "for");
    ++loop_depth_;
    {
      EndTags tags(*this, {"endfor", "else"});
      s->body = parse_statements({"endfor", "else"}, false);
    }
    --loop_depth_;
    if (skip_name("else")) {
      EndTags tags(*this, {"endfor"});
      const int saved_loops = loop_depth_;
      loop_depth_ = 0;  // break/continue in for-else would leave the enclosing loop: jinja2 refuses them too
      s->else_body = parse_statements({"endfor"}, true);
      loop_depth_ = saved_loops;
    } else {
      advance();
    }
    return s;
  }

  StmtPtr parse_if() {
    auto s = make_stmt(StmtKind::If, pos_of(current()));
    advance();
    OpenBlock open(*this, "if");
    SoftScope soft(*this, true);
    EndTags tags(*this, {"elif", "else", "endif"});
    while (true) {
      s->conditions.push_back(parse_tuple(false, {}, false));
      s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        EndTags else_tags(*this, {"endif"});
        s->else_body = parse_statements({"endif"}, true);
      } else {
        advance();
      }
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    const SourcePos pos = pos_of(current());
    advance();
    // set ns.attr = value
    if (current().type == TokenType::Name && is_op(look(), ".")) {
      auto s = make_stmt(StmtKind::SetAttr, pos);
      s->text = expect_name();
      advance();
      s->attribute = expect_name();
      if (!skip_op("=")) fail("expected token '=', got " + describe(current()));
      s->expr = parse_tuple(true, {}, false);
      return s;
    }
    Target target = parse_assign_target({});
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::Set, pos);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {}, false);
      return s;
    }
    auto s = make_stmt(StmtKind::SetBlock, pos);
    s->target = std::move(target);
    if (is_op(current(), "|")) s->expr = parse_filter(nullptr, false);
    OpenBlock open(*this, "set");
    SoftScope hard(*this, false);
    EndTags tags(*this, {"endset"});
    s->body = parse_statements({"endset"}, true);
    return s;
  }

  void parse_signature(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(current(), ")")) {
      if (!params.empty()) expect_op(",");
      MacroParam param;
      const Token& name_token = current();
      param.name = expect_name();
      if (param.name == "true" || param.name == "false" || param.name == "none" || param.name == "True" ||
          param.name == "False" || param.name == "None") {
        fail_at("can't assign to 'const'", name_token);
      }
      if (skip_op("=")) {
        param.default_value = parse_expression(true);
      } else if (!params.empty() && params.back().default_value) {
        fail_at("non-default argument follows default argument", name_token);
      }
      params.push_back(std::move(param));
    }
    expect_op(")");
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(StmtKind::Macro, pos_of(current()));
    advance();
    s->text = expect_name();
    parse_signature(s->params);
    OpenBlock open(*this, "macro");
    SoftScope hard(*this, false);
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    EndTags tags(*this, {"endmacro"});
    const size_t names_before = referenced_names_.size();
    s->body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved_loops;
    note_special_names(*s, names_before);
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = make_stmt(StmtKind::CallBlock, pos_of(current()));
    advance();
    if (is_op(current(), "(")) parse_signature(s->params);
    const Token& call_token = current();
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail_at("expected call", call_token);
    OpenBlock open(*this, "call");
    SoftScope hard(*this, false);
    EndTags tags(*this, {"endcall"});
    const size_t names_before = referenced_names_.size();
    s->body = parse_statements({"endcall"}, true);
    note_special_names(*s, names_before);
    return s;
  }

  // jinja2 lets a macro take extra positional / keyword arguments and a caller only when
  // its body mentions varargs / kwargs / caller.
  void note_special_names(Stmt& s, size_t names_before) {
    for (size_t i = names_before; i < referenced_names_.size(); ++i) {
      const std::string& n = referenced_names_[i];
      if (n == "caller") s.uses_caller = true;
      if (n == "varargs") s.uses_varargs = true;
      if (n == "kwargs") s.uses_kwargs = true;
    }
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(StmtKind::FilterBlock, pos_of(current()));
    advance();
    s->expr = parse_filter(nullptr, true);
    OpenBlock open(*this, "filter");
    SoftScope hard(*this, false);
    EndTags tags(*this, {"endfilter"});
    s->body = parse_statements({"endfilter"}, true);
    return s;
  }

  StmtPtr parse_with() {
    auto s = make_stmt(StmtKind::With, pos_of(current()));
    advance();
    while (current().type != TokenType::BlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      Target target = parse_assign_target({});
      expect_op("=");
      s->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    OpenBlock open(*this, "with");
    SoftScope hard(*this, false);
    EndTags tags(*this, {"endwith"});
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  // A name or a tuple of names ("a, (b, c)"), as for-loops and set take them.
  Target parse_assign_target(const std::vector<std::string_view>& extra_end) {
    DepthGuard guard(*this);
    Target target;
    bool saw_comma = false;
    std::vector<Target> parts;
    while (true) {
      if (!parts.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      parts.push_back(parse_target_primary());
      if (is_op(current(), ",")) {
        saw_comma = true;
      } else {
        break;
      }
    }
    if (!saw_comma) {
      if (parts.empty()) fail("Expected an expression, got " + describe(current()));
      return std::move(parts[0]);
    }
    target.is_tuple = true;
    target.names = std::move(parts);
    return target;
  }

  Target parse_target_primary() {
    const Token& t = current();
    if (t.type == TokenType::Name) {
      if (t.text == "true" || t.text == "false" || t.text == "none" || t.text == "True" || t.text == "False" ||
          t.text == "None") {
        fail("can't assign to 'const'");
      }
      Target target;
      target.name = t.text;
      advance();
      return target;
    }
    if (is_op(t, "(")) {
      advance();
      Target inner = parse_assign_target({});
      expect_op(")");
      if (!inner.is_tuple && inner.names.empty() && inner.name.empty()) fail("can't assign to 'tuple'");
      return inner;
    }
    if (t.type == TokenType::String || t.type == TokenType::Integer || t.type == TokenType::Float) {
      fail("can't assign to 'const'");
    }
    fail("unexpected " + describe(t));
  }

  bool is_tuple_end(const std::vector<std::string_view>& extra_end) const {
    const Token& t = current();
    if (t.type == TokenType::VariableEnd || t.type == TokenType::BlockEnd || is_op(t, ")")) return true;
    if (t.type == TokenType::Name)
      for (std::string_view name : extra_end)
        if (t.text == name) return true;
    return false;
  }

  // --- expressions ---

  // jinja2's parse_tuple: one expression, or several separated by commas (a tuple).
  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string_view>& extra_end, bool explicit_parens) {
    DepthGuard guard(*this);
    const SourcePos pos = pos_of(current());
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(current(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("Expected an expression, got " + describe(current()));
    }
    auto e = make_expr(ExprKind::Tuple, pos);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const SourcePos pos = pos_of(current());
    ExprPtr expr = parse_or();
    while (is_name(current(), "if")) {
      advance();
      SoftScope soft(*this, true);
      auto e = make_expr(ExprKind::Condition, pos);
      ExprPtr test = parse_or();
      ExprPtr otherwise;
      if (skip_name("else")) otherwise = parse_condexpr();
      e->items.push_back(std::move(test));
      e->items.push_back(std::move(expr));
      e->items.push_back(std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, SourcePos pos) {
    auto e = make_expr(ExprKind::Binary, pos);
    e->op = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    const SourcePos pos = pos_of(current());
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary("or", std::move(left), parse_and(), pos);
    return left;
  }

  ExprPtr parse_and() {
    const SourcePos pos = pos_of(current());
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary("and", std::move(left), parse_not(), pos);
    return left;
  }

  ExprPtr parse_not() {
    if (is_name(current(), "not")) {
      DepthGuard guard(*this);
      auto e = make_expr(ExprKind::Unary, pos_of(current()));
      advance();
      e->op = "not";
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const SourcePos pos = pos_of(current());
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      const Token& t = current();
      if (t.type == TokenType::Operator &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=")) {
        ops.push_back(t.text);
        advance();
      } else if (is_name(t, "in")) {
        ops.push_back("in");
        advance();
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        ops.push_back("notin");
        advance();
        advance();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make_expr(ExprKind::Compare, pos);
    e->items.push_back(std::move(first));
    for (auto& operand : operands) e->items.push_back(std::move(operand));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    const SourcePos pos = pos_of(current());
    ExprPtr left = parse_concat();
    while (is_op(current(), "+") || is_op(current(), "-")) {
      std::string op = current().text;
      advance();
      left = binary(std::move(op), std::move(left), parse_concat(), pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const SourcePos pos = pos_of(current());
    ExprPtr first = parse_math2();
    if (!is_op(current(), "~")) return first;
    auto e = make_expr(ExprKind::Concat, pos);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    const SourcePos pos = pos_of(current());
    ExprPtr left = parse_pow();
    while (is_op(current(), "*") || is_op(current(), "/") || is_op(current(), "//") || is_op(current(), "%")) {
      std::string op = current().text;
      advance();
      left = binary(std::move(op), std::move(left), parse_pow(), pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    const SourcePos pos = pos_of(current());
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary("**", std::move(left), parse_unary(true), pos);
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const Token& t = current();
    ExprPtr node;
    if (is_op(t, "-") || is_op(t, "+")) {
      node = make_expr(ExprKind::Unary, pos_of(t));
      node->op = t.text;
      advance();
      node->items.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    const SourcePos pos = pos_of(t);
    switch (t.type) {
      case TokenType::Name: {
        ExprPtr e;
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          e = make_expr(ExprKind::Constant, pos);
          e->constant = Value::boolean(t.text == "true" || t.text == "True");
        } else if (t.text == "none" || t.text == "None") {
          e = make_expr(ExprKind::Constant, pos);
          e->constant = Value::none();
        } else {
          e = make_expr(ExprKind::Name, pos);
          e->name = std::make_shared<const std::string>(t.text);
          referenced_names_.push_back(t.text);
        }
        advance();
        return e;
      }
      case TokenType::String: {
        std::string value = t.text;
        advance();
        while (current().type == TokenType::String) {  // adjacent literals join, as in Python
          value += current().text;
          advance();
        }
        auto e = make_expr(ExprKind::Constant, pos);
        e->constant = Value::string(std::move(value));
        return e;
      }
      case TokenType::Integer: {
        auto e = make_expr(ExprKind::Constant, pos);
        e->constant = Value::integer(t.int_value);
        advance();
        return e;
      }
      case TokenType::Float: {
        auto e = make_expr(ExprKind::Constant, pos);
        e->constant = Value::number(t.float_value);
        advance();
        return e;
      }
      case TokenType::Operator:
        if (t.text == "(") {
          advance();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    if (t.type == TokenType::End) fail("unexpected end of template");
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    auto e = make_expr(ExprKind::List, pos_of(current()));
    expect_op("[");
    while (!is_op(current(), "]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op(current(), "]")) break;
      e->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make_expr(ExprKind::Dict, pos_of(current()));
    expect_op("{");
    while (!is_op(current(), "}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op(current(), "}")) break;
      e->items.push_back(parse_expression(true));
      expect_op(":");
      e->items.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(current(), ".") || is_op(current(), "[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op(current(), "(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op(current(), "|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name(current(), "is")) {
        node = parse_test(std::move(node));
      } else if (is_op(current(), "(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(*this);
    const Token& t = current();
    const SourcePos pos = pos_of(t);
    if (is_op(t, ".")) {
      advance();
      const Token& attr = current();
      if (attr.type == TokenType::Name) {
        auto e = make_expr(ExprKind::Attribute, pos);
        e->name = std::make_shared<const std::string>(attr.text);
        e->items.push_back(std::move(node));
        advance();
        return e;
      }
      if (attr.type != TokenType::Integer) fail("expected name or number");
      auto index = make_expr(ExprKind::Constant, pos_of(attr));
      index->constant = Value::integer(attr.int_value);
      advance();
      auto e = make_expr(ExprKind::Item, pos);
      e->items.push_back(std::move(node));
      e->items.push_back(std::move(index));
      return e;
    }
    advance();  // '['
    std::vector<ExprPtr> args;
    while (!is_op(current(), "]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make_expr(ExprKind::Item, pos);
    e->items.push_back(std::move(node));
    if (args.size() == 1) {
      e->items.push_back(std::move(args[0]));
    } else {
      auto tuple = make_expr(ExprKind::Tuple, pos);
      tuple->items = std::move(args);
      e->items.push_back(std::move(tuple));
    }
    return e;
  }

  // An index or a slice [start]:[stop][:[step]].
  ExprPtr parse_subscribed() {
    const SourcePos pos = pos_of(current());
    ExprPtr start;
    if (is_op(current(), ":")) {
      advance();
    } else {
      ExprPtr index = parse_expression(true);
      if (!is_op(current(), ":")) return index;
      advance();
      start = std::move(index);
    }
    auto e = make_expr(ExprKind::Slice, pos);
    e->items.push_back(std::move(start));
    if (!is_op(current(), "]") && !is_op(current(), ",") && !is_op(current(), ":")) {
      e->items.push_back(parse_expression(true));
    } else {
      e->items.push_back(nullptr);
    }
    if (skip_op(":")) {
      if (!is_op(current(), "]") && !is_op(current(), ",")) {
        e->items.push_back(parse_expression(true));
      } else {
        e->items.push_back(nullptr);
      }
    } else {
      e->items.push_back(nullptr);
    }
    return e;
  }

  void parse_call_args(CallArgs& args) {
    const Token& open = current();
    expect_op("(");
    bool require_comma = false;
    const auto ensure = [&](bool ok) {
      if (!ok) fail_at("invalid syntax for function call expression", open);
    };
    while (!is_op(current(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(current(), ")")) break;
      }
      if (is_op(current(), "*")) {
        ensure(!args.star_args && !args.star_kwargs);
        advance();
        args.star_args = parse_expression(true);
      } else if (is_op(current(), "**")) {
        ensure(!args.star_kwargs);
        advance();
        args.star_kwargs = parse_expression(true);
      } else if (current().type == TokenType::Name && is_op(look(), "=")) {
        ensure(!args.star_kwargs);
        std::string key = current().text;
        advance();
        advance();
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!args.star_args && !args.star_kwargs && args.keyword.empty());
        args.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard guard(*this);
    auto e = make_expr(ExprKind::Call, node->pos);  // errors of a call point at its callee
    e->items.push_back(std::move(node));
    parse_call_args(e->args);
    return e;
  }

  // "| name(args) | name ..." (start_inline: the first filter has no '|', as in {% filter %}).
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op(current(), "|") || start_inline) {
      DepthGuard guard(*this);
      if (!start_inline) advance();
      start_inline = false;
      const Token& name_token = current();
      std::string name = expect_name();
      while (skip_op(".")) {
        name += '.';
        name += expect_name();
      }
      if (!soft_ && !is_filter_name(name)) fail_at("No filter named '" + name + "'.", name_token);
      auto e = make_expr(ExprKind::Filter, pos_of(name_token));
      e->name = std::make_shared<const std::string>(name);
      e->items.push_back(std::move(node));
      if (is_op(current(), "(")) parse_call_args(e->args);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard guard(*this);
    advance();  // 'is'
    auto e = make_expr(ExprKind::Test, pos_of(current()));
    if (skip_name("not")) e->negated = true;
    const Token& name_token = current();
    std::string name = expect_name();
    while (skip_op(".")) {
      name += '.';
      name += expect_name();
    }
    if (!soft_ && !is_test_name(name)) fail_at("No test named '" + name + "'.", name_token);
    e->name = std::make_shared<const std::string>(name);
    e->items.push_back(std::move(node));
    const Token& t = current();
    if (is_op(t, "(")) {
      parse_call_args(e->args);
    } else if ((t.type == TokenType::Name || t.type == TokenType::String || t.type == TokenType::Integer ||
                t.type == TokenType::Float || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
      if (is_name(t, "is")) fail("You cannot chain multiple tests with is");
      ExprPtr arg = parse_postfix(parse_primary());
      e->args.positional.push_back(std::move(arg));
    }
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  const ParseOptions& options_;
  uint32_t depth_ = 0;
  bool soft_ = false;
  int loop_depth_ = 0;
  std::vector<std::string> open_blocks_;
  std::vector<std::vector<std::string_view>> end_tag_stack_;
  std::vector<std::string> referenced_names_;
};

}  // namespace

Program parse_template(std::string_view source, const ParseOptions& options) {
  return Parser(tokenize(source, options.lexer), options).parse();
}

}  // namespace step35::jinja
