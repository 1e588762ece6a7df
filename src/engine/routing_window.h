// MoE health over a sliding window of recent forward passes: the router entropy, expert
// skew and distinct-expert figures of EngineStats (served as /metrics), and the running
// share of the adaptive expert policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "exec/batch.h"

namespace step35 {

struct MoeHealth {
  double router_entropy = 0;         // mean entropy (nats) of the normalised weights of selected experts
  double expert_skew = 0;            // max / mean activation count per layer, averaged over layers
  double mean_distinct_experts = 0;  // distinct experts per MoE layer per pass
  uint64_t adaptive_tokens = 0;      // tokens routed with the adaptive policy (all passes)
  double adaptive_mean_k = 0;        // their mean number of experts
};

class RoutingWindow {
 public:
  explicit RoutingWindow(size_t n_passes = 64) : n_passes_(n_passes) {}
  // Adds one pass's statistics. False (nothing changed) when the pass ran no MoE layer.
  bool add(const RoutingStats& pass);
  const MoeHealth& health() const { return health_; }

 private:
  size_t n_passes_;
  std::deque<RoutingStats> window_;
  uint64_t adaptive_experts_ = 0;
  MoeHealth health_;
};

}  // namespace step35
