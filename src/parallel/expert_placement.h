// Which process (rank) computes each routed expert of each MoE block under expert
// parallelism, and how such a placement is planned from recorded expert activation
// counts (`step35 ep-plan`). Files are JSON:
//   placement: {"n_ranks":R,"n_expert":X,"layers":{"<block>":[rank of expert 0, ...], ...}}
//   counts:    {"n_expert":X,"layers":{"<block>":[count of expert 0, ...], ...}}
// Blocks a placement does not list use the contiguous default.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace step35 {

// Expert activation counts per MoE block (the block index is the model's layer index).
struct ExpertCounts {
  int32_t n_expert = 0;
  std::map<int, std::vector<int64_t>> layers;

  void add(int il, const int32_t* counts, int64_t n_expert);
  std::string to_json() const;
  // Throws std::runtime_error naming the problem for malformed input.
  static ExpertCounts from_json(const std::string& text);
};

class ExpertPlacement {
 public:
  ExpertPlacement() = default;
  // Contiguous groups: expert e -> rank e*R/X.
  ExpertPlacement(int32_t n_ranks, int32_t n_expert);

  int32_t n_ranks() const { return n_ranks_; }
  int32_t n_expert() const { return n_expert_; }
  int32_t owner(int il, int32_t e) const;
  static int32_t contiguous_owner(int32_t e, int32_t n_ranks, int32_t n_expert) {
    return int32_t(int64_t(e) * n_ranks / n_expert);
  }
  // Sets block il's table (X entries, each in [0, R)); throws std::invalid_argument otherwise.
  void set_layer(int il, std::vector<int32_t> owners);
  const std::map<int, std::vector<int32_t>>& layers() const { return layers_; }

  std::string to_json() const;
  static ExpertPlacement from_json(const std::string& text);

 private:
  int32_t n_ranks_ = 1, n_expert_ = 1;
  std::map<int, std::vector<int32_t>> layers_;
};

// Load per rank of one block's counts under a placement, and max/mean (1 = balanced).
std::vector<int64_t> rank_loads(const ExpertPlacement& p, int il, const std::vector<int64_t>& counts);
double imbalance(const std::vector<int64_t>& loads);

// Balanced placement for `counts` over R ranks: per block, experts in decreasing count
// order each go to the least-loaded rank that still has room (every rank holds
// ceil(X/R) experts at most, so memory stays balanced too); ties go to the lower rank.
// The most-used experts thereby land on different ranks.
ExpertPlacement plan_placement(const ExpertCounts& counts, int32_t n_ranks);

std::string read_text_file(const std::string& path);  // throws std::runtime_error
void write_text_file(const std::string& path, const std::string& text);

}  // namespace step35
