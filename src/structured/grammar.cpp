// Grammar builder checks (min lengths, left recursion, byte classes) and the matcher's
// interned stacks / configurations / memoised transitions. Design: grammar.h.
#include "structured/grammar.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>
#include <unordered_map>

namespace step35::grammar {

namespace {

constexpr uint64_t kLengthCap = uint64_t(1) << 62;  // min lengths saturate here

uint64_t add_sat(uint64_t a, uint64_t b) {
  if (a == kUnreachable || b == kUnreachable) return kUnreachable;
  return std::min(a + b, kLengthCap);  // both < 2^62, so the sum cannot wrap
}

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A node of the given kind and argument; next is the node after it (Match, Special, Call).
Node linked_node(NodeKind kind, uint32_t arg, uint32_t next = kNoNode) {
  Node n;
  n.kind = kind;
  n.next = next;
  n.arg = arg;
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Builder

Builder::Builder(size_t max_nodes) : max_nodes_(max_nodes) {
  nodes_.push_back(Node{});  // node 0: Return
}

uint32_t Builder::add_node(const Node& n) {
  if (nodes_.size() >= max_nodes_)
    throw std::invalid_argument("grammar too large: more than " + std::to_string(max_nodes_) + " states");
  nodes_.push_back(n);
  return uint32_t(nodes_.size() - 1);
}

uint32_t Builder::set_index(const ByteSet& s) {
  // Sets repeat a lot (digits, hex, UTF-8 continuation bytes); a short look-back dedups
  // most of them without a hash table.
  const size_t n = sets_.size();
  for (size_t i = n; i > 0 && i + 64 > n; --i)
    if (sets_[i - 1] == s) return uint32_t(i - 1);
  sets_.push_back(s);
  return uint32_t(sets_.size() - 1);
}

uint32_t Builder::match(const ByteSet& set, uint32_t next) {
  if (set.empty()) return dead();
  return add_node(linked_node(NodeKind::Match, set_index(set), next));
}

uint32_t Builder::byte(uint8_t b, uint32_t next) {
  ByteSet s;
  s.add(b);
  return match(s, next);
}

uint32_t Builder::range(uint8_t lo, uint8_t hi, uint32_t next) {
  ByteSet s;
  s.add_range(lo, hi);
  return match(s, next);
}

uint32_t Builder::literal(std::string_view bytes, uint32_t next) {
  uint32_t cur = next;
  for (size_t i = bytes.size(); i > 0; --i) cur = byte(uint8_t(bytes[i - 1]), cur);
  return cur;
}

uint32_t Builder::special(uint32_t symbol, uint32_t next) {
  return add_node(linked_node(NodeKind::Special, symbol, next));
}

// While building, a Split's arg indexes options_ (only choices pay for an options list);
// finish() flattens them into Grammar::succ_.
uint32_t Builder::alt(std::vector<uint32_t> options) {
  if (options.size() == 1) return options[0];
  const uint32_t id = add_node(linked_node(NodeKind::Split, uint32_t(options_.size())));
  options_.push_back(std::move(options));
  return id;
}

uint32_t Builder::placeholder() {
  Node n = linked_node(NodeKind::Split, uint32_t(options_.size()));
  n.count = UINT32_MAX;  // marks "options not set yet" until set_options
  const uint32_t id = add_node(n);
  options_.emplace_back();
  return id;
}

void Builder::set_options(uint32_t split, std::vector<uint32_t> options) {
  nodes_[split].count = 0;
  options_[nodes_[split].arg] = std::move(options);
}

uint32_t Builder::add_rule(std::string name) {
  rules_.push_back(Rule{std::move(name), kNoNode});
  return uint32_t(rules_.size() - 1);
}

void Builder::set_entry(uint32_t rule, uint32_t entry) { rules_[rule].entry = entry; }

uint32_t Builder::call(uint32_t rule, uint32_t next) {
  return add_node(linked_node(NodeKind::Call, rule, next));
}

uint32_t Builder::add_symbol(std::string text) {
  symbols_.push_back(std::move(text));
  return uint32_t(symbols_.size() - 1);
}

void Builder::check_complete(uint32_t root_rule) const {
  if (root_rule >= rules_.size()) throw std::invalid_argument("grammar: no such root rule");
  for (const Rule& r : rules_)
    if (r.entry == kNoNode) throw std::invalid_argument("grammar: rule '" + r.name + "' has no body");
  for (const Node& nd : nodes_)
    if (nd.kind == NodeKind::Split && nd.count == UINT32_MAX)
      throw std::invalid_argument("grammar: a choice was left without options");
}

// Reverse edges in compressed form: dep[off[x] .. off[x+1]) are the nodes whose minimum
// length depends on x.
struct Builder::Dependents {
  std::vector<uint32_t> off, dep;
};

Builder::Dependents Builder::dependents() const {
  const size_t n = nodes_.size();
  auto each_edge = [&](auto&& edge) {  // edge(from_dependency, dependent)
    for (size_t i = 0; i < n; ++i) {
      const Node& nd = nodes_[i];
      switch (nd.kind) {
        case NodeKind::Match:
        case NodeKind::Special:
          edge(nd.next, uint32_t(i));
          break;
        case NodeKind::Split:
          for (uint32_t s : options_[nd.arg]) edge(s, uint32_t(i));
          break;
        case NodeKind::Call:
          edge(nd.next, uint32_t(i));
          edge(rules_[nd.arg].entry, uint32_t(i));
          break;
        case NodeKind::Return:
          break;
      }
    }
  };
  Dependents d;
  d.off.assign(n + 1, 0);
  each_edge([&](uint32_t x, uint32_t) { ++d.off[x + 1]; });
  for (size_t i = 0; i < n; ++i) d.off[i + 1] += d.off[i];
  d.dep.resize(d.off[n]);
  std::vector<uint32_t> fill(d.off.begin(), d.off.end() - 1);
  each_edge([&](uint32_t x, uint32_t p) { d.dep[fill[x]++] = p; });
  return d;
}

// Minimum length of every node (Knuth's generalisation of Dijkstra to grammars: a Call
// costs its rule's minimum plus its successor's, both non-negative, so nodes can be
// finalised in increasing order).
std::vector<uint64_t> Builder::min_lengths() const {
  const size_t n = nodes_.size();
  const Dependents deps = dependents();
  std::vector<uint64_t> dist(n, kUnreachable);
  std::vector<uint8_t> done(n, 0);
  using Item = std::pair<uint64_t, uint32_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
  for (size_t i = 0; i < n; ++i)
    if (nodes_[i].kind == NodeKind::Return) {
      dist[i] = 0;
      pq.push({0, uint32_t(i)});
    }
  while (!pq.empty()) {
    const auto [d, x] = pq.top();
    pq.pop();
    if (done[x] || d != dist[x]) continue;
    done[x] = 1;
    for (uint32_t k = deps.off[x]; k < deps.off[x + 1]; ++k) {
      const uint32_t p = deps.dep[k];
      if (done[p]) continue;
      const Node& nd = nodes_[p];
      uint64_t cand = kUnreachable;
      if (nd.kind == NodeKind::Match || nd.kind == NodeKind::Special) {
        cand = add_sat(d, 1);
      } else if (nd.kind == NodeKind::Split) {
        cand = d;
      } else if (nd.kind == NodeKind::Call) {
        const uint32_t e = rules_[nd.arg].entry;
        if (done[e] && done[nd.next]) cand = add_sat(dist[e], dist[nd.next]);
      }
      if (cand < dist[p]) {
        dist[p] = cand;
        pq.push({cand, p});
      }
    }
  }
  return dist;
}

// Copies the nodes into g, flattening each choice's options into g.succ_ and dropping
// those that can never complete.
void Builder::flatten_choices(Grammar& g, const std::vector<uint64_t>& dist) const {
  g.nodes_ = nodes_;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].kind != NodeKind::Split) continue;
    g.nodes_[i].arg = uint32_t(g.succ_.size());
    for (uint32_t s : options_[nodes_[i].arg])
      if (dist[s] != kUnreachable) g.succ_.push_back(s);
    g.nodes_[i].count = uint32_t(g.succ_.size() - g.nodes_[i].arg);
  }
}

// Left recursion: rule R "starts with" rule S when a Call to S is reachable from R's
// entry without consuming input. A cycle in that relation would make closures push
// frames forever.
std::vector<std::vector<uint32_t>> Builder::rules_started_with(const Grammar& g) const {
  const std::vector<uint64_t>& dist = g.min_bytes_;
  const size_t nr = rules_.size();
  std::vector<std::vector<uint32_t>> starts_with(nr);
  std::vector<uint32_t> mark(nodes_.size(), UINT32_MAX);
  std::vector<uint32_t> stack;
  for (uint32_t r = 0; r < nr; ++r) {
    const uint32_t e = rules_[r].entry;
    if (dist[e] == kUnreachable) continue;
    stack.assign(1, e);
    while (!stack.empty()) {
      const uint32_t x = stack.back();
      stack.pop_back();
      if (mark[x] == r || dist[x] == kUnreachable) continue;
      mark[x] = r;
      const Node& nd = g.nodes_[x];
      if (nd.kind == NodeKind::Split) {
        for (uint32_t k = 0; k < nd.count; ++k) stack.push_back(g.succ_[nd.arg + k]);
      } else if (nd.kind == NodeKind::Call) {
        starts_with[r].push_back(nd.arg);
        if (dist[rules_[nd.arg].entry] == 0) stack.push_back(nd.next);
      }
    }
  }
  return starts_with;
}

// Iterative DFS for a cycle in the "starts with" relation: 0 unvisited, 1 on the path,
// 2 finished. Throws naming the rules of the first cycle found.
void Builder::check_left_recursion(const Grammar& g) const {
  const std::vector<std::vector<uint32_t>> starts_with = rules_started_with(g);
  const size_t nr = rules_.size();
  std::vector<uint8_t> color(nr, 0);
  std::vector<std::pair<uint32_t, size_t>> path;
  for (uint32_t r0 = 0; r0 < nr; ++r0) {
    if (color[r0]) continue;
    path.assign(1, {r0, 0});
    color[r0] = 1;
    while (!path.empty()) {
      auto& [r, k] = path.back();
      if (k == starts_with[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t s = starts_with[r][k++];
      if (color[s] == 1) {
        std::string cyc;
        size_t from = 0;
        while (path[from].first != s) ++from;
        for (size_t i = from; i < path.size(); ++i) cyc += rules_[path[i].first].name + " -> ";
        cyc += rules_[s].name;
        throw std::invalid_argument("left recursion (a reference reached again before any text): " + cyc);
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.push_back({s, 0});
      }
    }
  }
}

// Byte classes: refine the partition of 0..255 by every set a reachable Match uses.
void Builder::assign_byte_classes(Grammar& g) const {
  std::vector<uint8_t> used(sets_.size(), 0);
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].kind == NodeKind::Match && g.min_bytes_[i] != kUnreachable) used[nodes_[i].arg] = 1;
  std::array<uint16_t, 256> cls{};
  uint32_t n_cls = 1;
  for (size_t si = 0; si < sets_.size(); ++si) {
    if (!used[si]) continue;
    std::vector<int32_t> remap(size_t(n_cls) * 2, -1);
    uint32_t next_cls = 0;
    std::array<uint16_t, 256> nc{};
    for (unsigned b = 0; b < 256; ++b) {
      const size_t key = size_t(cls[b]) * 2 + (sets_[si].has(uint8_t(b)) ? 1 : 0);
      if (remap[key] < 0) remap[key] = int32_t(next_cls++);
      nc[b] = uint16_t(remap[key]);
    }
    cls = nc;
    n_cls = next_cls;
  }
  g.n_classes_ = n_cls;
  g.class_rep_.assign(n_cls, 0);
  std::vector<uint8_t> seen(n_cls, 0);
  for (unsigned b = 0; b < 256; ++b) {
    g.class_of_[b] = uint8_t(cls[b]);
    if (!seen[cls[b]]) {
      seen[cls[b]] = 1;
      g.class_rep_[cls[b]] = uint8_t(b);
    }
  }
}

std::shared_ptr<const Grammar> Builder::finish(uint32_t root_rule) {
  check_complete(root_rule);
  auto g = std::make_shared<Grammar>();
  g->rules_ = rules_;
  g->sets_ = sets_;
  g->symbols_ = symbols_;
  g->root_ = root_rule;

  std::vector<uint64_t> dist = min_lengths();
  if (dist[rules_[root_rule].entry] == kUnreachable)
    throw EmptyLanguage("the grammar cannot match anything (no way to complete '" + rules_[root_rule].name +
                                "')");
  flatten_choices(*g, dist);
  g->min_bytes_ = std::move(dist);
  check_left_recursion(*g);
  assign_byte_classes(*g);
  return g;
}

// ---------------------------------------------------------------------------------------
// Matcher

Matcher::Matcher(std::shared_ptr<const Grammar> g, NoStart) : g_(std::move(g)), width_(g_->n_columns()) {
  if (width_ == 0) width_ = 1;
  reset_tables();
}

Matcher::Matcher(std::shared_ptr<const Grammar> g) : Matcher(std::move(g), NoStart{}) {
  out_.clear();
  out_accepting_ = false;
  ++stamp_;
  seen_count_ = 0;
  closure(g_->rules()[g_->root()].entry, -1);
  finish_stacks();
  cur_ = intern_config(out_, out_accepting_);
}

void Matcher::reset_tables() {
  entries_.clear();
  entry_keys_.assign(1024, 0);
  entry_slots_.assign(1024, -1);
  stacks_.clear();
  configs_.clear();
  config_slots_.assign(256, -1);
  trans_.clear();
  seen_keys_.assign(256, 0);
  seen_stamp_.assign(256, 0);
  stamp_ = 0;
  seen_count_ = 0;
}

int32_t Matcher::intern_entry(uint32_t node, int32_t parent) {
  const uint64_t key = (uint64_t(node) << 32) | uint32_t(parent + 1);
  size_t mask = entry_slots_.size() - 1;
  size_t i = mix64(key) & mask;
  while (entry_slots_[i] >= 0) {
    if (entry_keys_[i] == key) return entry_slots_[i];
    i = (i + 1) & mask;
  }
  const int32_t id = int32_t(entries_.size());
  entries_.push_back(Entry{node, parent, parent < 0 ? 1u : entries_[size_t(parent)].depth + 1});
  entry_keys_[i] = key;
  entry_slots_[i] = id;
  if (entries_.size() * 2 > entry_slots_.size()) {  // grow and rehash
    std::vector<uint64_t> keys(entry_slots_.size() * 2, 0);
    std::vector<int32_t> slots(entry_slots_.size() * 2, -1);
    mask = slots.size() - 1;
    for (size_t s = 0; s < entry_slots_.size(); ++s) {
      if (entry_slots_[s] < 0) continue;
      size_t j = mix64(entry_keys_[s]) & mask;
      while (slots[j] >= 0) j = (j + 1) & mask;
      keys[j] = entry_keys_[s];
      slots[j] = entry_slots_[s];
    }
    entry_keys_.swap(keys);
    entry_slots_.swap(slots);
  }
  return id;
}

int32_t Matcher::intern_config(std::vector<int32_t>& stacks, bool accepting) {
  uint64_t h = accepting ? 0x9e3779b97f4a7c15ULL : 0x2545f4914f6cdd1dULL;
  for (int32_t s : stacks) h = mix64(h ^ uint32_t(s));
  size_t mask = config_slots_.size() - 1;
  size_t i = h & mask;
  while (config_slots_[i] >= 0) {
    const Config& c = configs_[size_t(config_slots_[i])];
    if (c.hash == h && c.accepting == accepting && c.size == stacks.size() &&
        std::equal(stacks.begin(), stacks.end(), stacks_.begin() + c.offset))
      return config_slots_[i];
    i = (i + 1) & mask;
  }
  const int32_t id = int32_t(configs_.size());
  configs_.push_back(Config{uint32_t(stacks_.size()), uint32_t(stacks.size()), h, accepting});
  stacks_.insert(stacks_.end(), stacks.begin(), stacks.end());
  trans_.resize(trans_.size() + width_, kUnknown);
  config_slots_[i] = id;
  if (configs_.size() * 2 > config_slots_.size()) {
    std::vector<int32_t> slots(config_slots_.size() * 2, -1);
    mask = slots.size() - 1;
    for (int32_t c : config_slots_) {
      if (c < 0) continue;
      size_t j = configs_[size_t(c)].hash & mask;
      while (slots[j] >= 0) j = (j + 1) & mask;
      slots[j] = c;
    }
    config_slots_.swap(slots);
  }
  return id;
}

bool Matcher::seen_insert(uint64_t key) {
  if ((seen_count_ + 1) * 2 > seen_keys_.size()) {  // grow; keep only this stamp's keys
    std::vector<uint64_t> keys(seen_keys_.size() * 2, 0);
    std::vector<uint32_t> st(seen_keys_.size() * 2, 0);
    const size_t mask = keys.size() - 1;
    for (size_t s = 0; s < seen_keys_.size(); ++s) {
      if (seen_stamp_[s] != stamp_) continue;
      size_t j = mix64(seen_keys_[s]) & mask;
      while (st[j] == stamp_) j = (j + 1) & mask;
      keys[j] = seen_keys_[s];
      st[j] = stamp_;
    }
    seen_keys_.swap(keys);
    seen_stamp_.swap(st);
  }
  const size_t mask = seen_keys_.size() - 1;
  size_t i = mix64(key) & mask;
  while (seen_stamp_[i] == stamp_) {
    if (seen_keys_[i] == key) return false;
    i = (i + 1) & mask;
  }
  seen_keys_[i] = key;
  seen_stamp_[i] = stamp_;
  ++seen_count_;
  return true;
}

// Adds to out_ every stack whose top is a Match/Special node reachable from `node` (with
// `parent` below it) without consuming input; Return with an empty stack sets
// out_accepting_.
void Matcher::closure(uint32_t node, int32_t parent) {
  const std::vector<Node>& nodes = g_->nodes();
  const std::vector<uint32_t>& succ = g_->successors();
  work_.clear();
  work_.push_back({node, parent});
  while (!work_.empty()) {
    const auto [x, p] = work_.back();
    work_.pop_back();
    if (g_->min_bytes(x) == kUnreachable) continue;
    if (!seen_insert((uint64_t(x) << 32) | uint32_t(p + 1))) continue;
    const Node& nd = nodes[x];
    switch (nd.kind) {
      case NodeKind::Match:
      case NodeKind::Special:
        out_.push_back(intern_entry(x, p));
        break;
      case NodeKind::Split:
        for (uint32_t k = nd.count; k > 0; --k) work_.push_back({succ[nd.arg + k - 1], p});
        break;
      case NodeKind::Call: {
        if (p >= 0 && entries_[size_t(p)].depth + 1 >= kMaxDepth) break;  // nesting bound
        const int32_t frame = intern_entry(nd.next, p);
        work_.push_back({g_->rules()[nd.arg].entry, frame});
        break;
      }
      case NodeKind::Return:
        if (p < 0) {
          out_accepting_ = true;
        } else {
          const Entry e = entries_[size_t(p)];
          work_.push_back({e.node, e.parent});
        }
        break;
    }
  }
}

uint64_t Matcher::stack_min_remaining(int32_t s) const {
  uint64_t total = 0;
  for (; s >= 0; s = entries_[size_t(s)].parent) total = add_sat(total, g_->min_bytes(entries_[size_t(s)].node));
  return total;
}

// Sorts and dedups out_; over kMaxStacks, keeps the stacks closest to completion (so the
// truncation can forbid continuations but never the shortest way to finish).
void Matcher::finish_stacks() {
  std::sort(out_.begin(), out_.end());
  out_.erase(std::unique(out_.begin(), out_.end()), out_.end());
  if (out_.size() <= kMaxStacks) return;
  std::vector<std::pair<uint64_t, int32_t>> ranked;
  ranked.reserve(out_.size());
  for (int32_t s : out_) ranked.push_back({stack_min_remaining(s), s});
  std::nth_element(ranked.begin(), ranked.begin() + long(kMaxStacks), ranked.end());
  out_.clear();
  for (size_t i = 0; i < kMaxStacks; ++i) out_.push_back(ranked[i].second);
  std::sort(out_.begin(), out_.end());
}

int32_t Matcher::compute(int32_t config, uint32_t column) {
  out_.clear();
  out_accepting_ = false;
  if (++stamp_ == 0) {  // stamp wrapped: clear the visited table once
    std::fill(seen_stamp_.begin(), seen_stamp_.end(), 0);
    stamp_ = 1;
  }
  seen_count_ = 0;
  const std::vector<Node>& nodes = g_->nodes();
  const Config c = configs_[size_t(config)];
  const uint32_t n_cls = g_->n_classes();
  for (uint32_t k = 0; k < c.size; ++k) {
    const Entry e = entries_[size_t(stacks_[c.offset + k])];
    const Node& nd = nodes[e.node];
    bool moves = false;
    if (column < n_cls)
      moves = nd.kind == NodeKind::Match && g_->byte_set(nd.arg).has(g_->class_representative(column));
    else
      moves = nd.kind == NodeKind::Special && nd.arg == column - n_cls;
    if (moves) closure(nd.next, e.parent);
  }
  if (out_.empty() && !out_accepting_) return kDead;
  finish_stacks();
  return intern_config(out_, out_accepting_);
}

bool Matcher::feed(std::string_view bytes) {
  int32_t c = cur_;
  for (char ch : bytes) {
    c = step_byte(c, uint8_t(ch));
    if (c == kDead) return false;
  }
  cur_ = c;
  return true;
}

bool Matcher::feed_symbol(uint32_t symbol) {
  if (symbol >= g_->n_symbols()) return false;
  const int32_t c = step(cur_, g_->n_classes() + symbol);
  if (c == kDead) return false;
  cur_ = c;
  return true;
}

uint64_t Matcher::min_remaining(int32_t config) const {
  const Config& c = configs_[size_t(config)];
  if (c.accepting) return 0;
  uint64_t best = kUnreachable;
  for (uint32_t k = 0; k < c.size; ++k) best = std::min(best, stack_min_remaining(stacks_[c.offset + k]));
  return best;
}

int32_t Matcher::import_entry(const Matcher& from, int32_t id) {
  // Re-intern a chain bottom first (chains are at most kMaxDepth long).
  std::vector<int32_t> chain;
  for (int32_t s = id; s >= 0; s = from.entries_[size_t(s)].parent) chain.push_back(s);
  int32_t parent = -1;
  for (size_t i = chain.size(); i > 0; --i) parent = intern_entry(from.entries_[size_t(chain[i - 1])].node, parent);
  return parent;
}

int32_t Matcher::import_config(const Matcher& from, int32_t config) {
  const Config& c = from.configs_[size_t(config)];
  std::vector<int32_t> stacks;
  stacks.reserve(c.size);
  for (uint32_t k = 0; k < c.size; ++k) stacks.push_back(import_entry(from, from.stacks_[c.offset + k]));
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  return intern_config(stacks, c.accepting);
}

Matcher Matcher::fork() const {
  Matcher m(g_, NoStart{});
  m.cur_ = m.import_config(*this, cur_);
  return m;
}

void Matcher::compact_if_larger(size_t max_configs) {
  if (configs_.size() <= max_configs && entries_.size() <= max_configs * 64) return;
  *this = fork();
}

}  // namespace step35::grammar
