// A byte-level grammar engine for constrained decoding.
//
// A grammar is a recursive transition network over bytes: rules are graphs of nodes that
// match one byte from a set (Match), match one "special symbol" standing for a special
// token such as <tool_call> (Special), branch without consuming (Split), call another rule
// (Call, which pushes its successor as the return position) or end the rule (Return).
// The Builder constructs such graphs back to front: every fragment is built with its
// continuation already known, so shared continuations and loops cost nothing extra.
//
// A Matcher runs a grammar as a pushdown automaton whose configuration is the SET of all
// parse stacks consistent with the bytes so far (so ambiguous grammars are fine). Stacks
// and configurations are interned to small integers and transitions are memoised per
// (configuration, byte class), so matching is a lazily built DFA over the configurations
// actually met: walking a token trie costs one table lookup per trie node once warm.
//
// Bounds (no input can make these explode):
//   * a configuration keeps at most kMaxStacks stacks (more are dropped, those farthest
//     from completion first: a sound fallback that can only forbid, never admit, a
//     continuation, and always keeps a shortest way to finish);
//   * a stack is at most kMaxDepth frames deep (deeper nesting is not admitted);
//   * left recursion (a rule calling itself before consuming a byte) is rejected when the
//     grammar is finished, so every closure is finite;
//   * the memo tables are rebuilt from the current state when they pass a size limit.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace step35::grammar {

constexpr uint32_t kNoNode = UINT32_MAX;
constexpr uint64_t kUnreachable = UINT64_MAX;  // min_bytes of a node that cannot complete
constexpr size_t kMaxStacks = 2048;            // stacks per configuration
constexpr uint32_t kMaxDepth = 384;            // frames per stack

// Thrown by Builder::finish when no input at all can complete the root rule (e.g. an
// unsatisfiable schema).
class EmptyLanguage : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A set of bytes, one bit each.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void add(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(uint8_t(b));
  }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet& o) const { return bits == o.bits; }
};

enum class NodeKind : uint8_t { Match, Special, Split, Call, Return };

struct Node {
  NodeKind kind = NodeKind::Return;
  uint32_t next = kNoNode;  // Match, Special, Call: the node after it
  uint32_t arg = 0;         // Match: byte-set index; Special: symbol; Call: rule; Split: first successor
  uint32_t count = 0;       // Split: number of successors
};

struct Rule {
  std::string name;  // for error messages
  uint32_t entry = kNoNode;
};

// An immutable, checked grammar (made by Builder::finish). Shared between matchers.
class Grammar {
 public:
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<uint32_t>& successors() const { return succ_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const ByteSet& byte_set(uint32_t i) const { return sets_[i]; }
  uint32_t root() const { return root_; }
  // Byte classes: bytes no Match node tells apart share a class. Matchers memoise
  // transitions per class; column n_classes() + s is special symbol s.
  uint32_t n_classes() const { return n_classes_; }
  uint8_t class_of(uint8_t b) const { return class_of_[b]; }
  const uint8_t* class_table() const { return class_of_.data(); }
  uint8_t class_representative(uint32_t c) const { return class_rep_[c]; }
  uint32_t n_symbols() const { return uint32_t(symbols_.size()); }
  const std::string& symbol_text(uint32_t s) const { return symbols_[s]; }
  uint32_t n_columns() const { return n_classes_ + n_symbols(); }
  // Fewest bytes (a special symbol counts as one) from `node` to the end of its rule;
  // kUnreachable when no path completes (such nodes are never entered).
  uint64_t min_bytes(uint32_t node) const { return min_bytes_[node]; }
  size_t n_nodes() const { return nodes_.size(); }

 private:
  friend class Builder;
  std::vector<Node> nodes_;
  std::vector<uint32_t> succ_;
  std::vector<Rule> rules_;
  std::vector<ByteSet> sets_;
  std::vector<std::string> symbols_;
  std::vector<uint64_t> min_bytes_;
  std::array<uint8_t, 256> class_of_{};
  std::vector<uint8_t> class_rep_;
  uint32_t n_classes_ = 0;
  uint32_t root_ = 0;
};

// Builds a grammar back to front. Node 0 is the shared Return node. Every method that
// takes `next` returns the entry node of a fragment that continues at `next`.
class Builder {
 public:
  // Throws std::invalid_argument once more than max_nodes nodes are created.
  explicit Builder(size_t max_nodes = size_t(1) << 20);

  uint32_t ret() const { return 0; }
  uint32_t match(const ByteSet& set, uint32_t next);
  uint32_t byte(uint8_t b, uint32_t next);
  uint32_t range(uint8_t lo, uint8_t hi, uint32_t next);
  uint32_t literal(std::string_view bytes, uint32_t next);
  uint32_t special(uint32_t symbol, uint32_t next);
  // A choice between fragments. alt({}) is a dead end; alt({x}) is x.
  uint32_t alt(std::vector<uint32_t> options);
  // A choice whose options are filled in later (for loops): make it, build the loop body
  // with it as the continuation, then set_options.
  uint32_t placeholder();
  void set_options(uint32_t split, std::vector<uint32_t> options);
  uint32_t dead() { return alt({}); }

  // Rules: create, then set_entry once the body is built (calls may precede it).
  uint32_t add_rule(std::string name);
  void set_entry(uint32_t rule, uint32_t entry);
  uint32_t call(uint32_t rule, uint32_t next);
  const std::string& rule_name(uint32_t rule) const { return rules_[rule].name; }

  // Special symbols (the constraint maps each to the special tokens spelled that way).
  uint32_t add_symbol(std::string text);

  size_t size() const { return nodes_.size(); }
  size_t max_nodes() const { return max_nodes_; }

  // Checks and freezes the grammar with `root_rule` as the start. Throws
  // std::invalid_argument for a rule without a body, left recursion (names the rules),
  // or an empty language (nothing can ever match).
  std::shared_ptr<const Grammar> finish(uint32_t root_rule);

 private:
  uint32_t add_node(const Node& n);
  uint32_t set_index(const ByteSet& s);

  // The steps of finish(), in order.
  struct Dependents;
  void check_complete(uint32_t root_rule) const;
  Dependents dependents() const;
  std::vector<uint64_t> min_lengths() const;
  void flatten_choices(Grammar& g, const std::vector<uint64_t>& dist) const;
  std::vector<std::vector<uint32_t>> rules_started_with(const Grammar& g) const;
  void check_left_recursion(const Grammar& g) const;
  void assign_byte_classes(Grammar& g) const;

  size_t max_nodes_;
  std::vector<Node> nodes_;
  std::vector<std::vector<uint32_t>> options_;  // options of each choice (Split's arg)
  std::vector<Rule> rules_;
  std::vector<ByteSet> sets_;
  std::vector<std::string> symbols_;
};

// Runs a grammar over bytes and special symbols. Configurations are ids into this
// matcher's tables; step() memoises. Not thread-safe; clone with fork().
class Matcher {
 public:
  static constexpr int32_t kDead = -1;

  explicit Matcher(std::shared_ptr<const Grammar> g);

  const Grammar& grammar() const { return *g_; }
  int32_t state() const { return cur_; }
  void set_state(int32_t config) { cur_ = config; }

  // The configuration after one column (byte class or n_classes + symbol), or kDead.
  int32_t step(int32_t config, uint32_t column) {
    const size_t at = size_t(config) * width_ + column;
    int32_t t = trans_[at];
    if (t == kUnknown) {
      t = compute(config, column);  // may grow trans_
      trans_[at] = t;
    }
    return t;
  }
  int32_t step_byte(int32_t config, uint8_t b) { return step(config, g_->class_of(b)); }
  // The memo table: entry config * width() + column is the transition, kUnknown when not
  // computed yet (then call step()). Invalidated by any call that can create configurations.
  const int32_t* table() const { return trans_.data(); }
  size_t width() const { return width_; }
  static constexpr int32_t kUnknown = -2;

  bool accepting(int32_t config) const { return configs_[size_t(config)].accepting; }

  // Advance the current state; false (state unchanged) if the input is rejected.
  bool feed(std::string_view bytes);
  bool feed_symbol(uint32_t symbol);
  bool complete() const { return accepting(cur_); }
  // Fewest further bytes that complete the match from the current state / from `config`
  // (0 if complete).
  uint64_t min_remaining() const { return min_remaining(cur_); }
  uint64_t min_remaining(int32_t config) const;

  // Number of interned configurations / stack entries (for the size limit and tests).
  size_t n_configs() const { return configs_.size(); }
  size_t n_stack_entries() const { return entries_.size(); }
  // When the tables hold more than `max_configs` configurations (or 64 x as many stack
  // entries), rebuild them holding only the current state (ids change; memoised
  // transitions are recomputed lazily).
  void compact_if_larger(size_t max_configs);
  // An independent matcher in the same state, with fresh (small) tables.
  Matcher fork() const;

 private:
  struct Entry {
    uint32_t node;
    int32_t parent;  // -1: bottom of the stack
    uint32_t depth;  // frames in the chain, this one included
  };
  struct Config {
    uint32_t offset;  // into stacks_
    uint32_t size;
    uint64_t hash;
    bool accepting;
  };
  struct NoStart {};
  Matcher(std::shared_ptr<const Grammar> g, NoStart);

  void reset_tables();
  int32_t intern_entry(uint32_t node, int32_t parent);
  int32_t intern_config(std::vector<int32_t>& stacks, bool accepting);
  void closure(uint32_t node, int32_t parent);
  void finish_stacks();
  uint64_t stack_min_remaining(int32_t stack) const;
  int32_t compute(int32_t config, uint32_t column);
  int32_t import_entry(const Matcher& from, int32_t id);
  int32_t import_config(const Matcher& from, int32_t config);

  std::shared_ptr<const Grammar> g_;
  size_t width_;
  std::vector<Entry> entries_;
  std::vector<uint64_t> entry_keys_;   // open addressing: key (node, parent) ...
  std::vector<int32_t> entry_slots_;   // ... -> entry id (-1: empty)
  std::vector<int32_t> stacks_;        // stack ids of every configuration, back to back
  std::vector<Config> configs_;
  std::vector<int32_t> config_slots_;  // open addressing by hash -> config id (-1: empty)
  std::vector<int32_t> trans_;         // configs x width, kUnknown / kDead / id
  int32_t cur_ = kDead;

  // Scratch for compute()/closure().
  std::vector<int32_t> out_;
  bool out_accepting_ = false;
  std::vector<std::pair<uint32_t, int32_t>> work_;
  std::vector<uint64_t> seen_keys_;    // visited (node, parent) pairs of one compute()
  std::vector<uint32_t> seen_stamp_;   // slot valid when == stamp_
  uint32_t stamp_ = 0;
  size_t seen_count_ = 0;
  bool seen_insert(uint64_t key);
};

}  // namespace step35::grammar
