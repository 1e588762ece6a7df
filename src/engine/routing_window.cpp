#include "engine/routing_window.h"

#include <algorithm>
#include <vector>

namespace step35 {

bool RoutingWindow::add(const RoutingStats& pass) {
  if (pass.n_moe_layers == 0) return false;
  window_.push_back(pass);
  if (window_.size() > n_passes_) window_.pop_front();
  double entropy = 0, distinct = 0, skew = 0;
  int64_t pairs = 0, layer_passes = 0;
  const int32_t X = std::max(1, pass.n_expert);
  const int64_t n_layers = pass.n_moe_layers;
  std::vector<int64_t> counts(size_t(n_layers * X), 0);
  for (const RoutingStats& w : window_) {
    entropy += w.entropy_sum;
    pairs += w.token_layer_pairs;
    distinct += double(w.distinct_experts_sum);
    layer_passes += w.n_moe_layers;
    for (size_t i = 0; i < counts.size() && i < w.expert_counts.size(); ++i) counts[i] += w.expert_counts[i];
  }
  for (int64_t l = 0; l < n_layers; ++l) {
    int64_t mx = 0, total = 0;
    for (int32_t e = 0; e < X; ++e) {
      mx = std::max(mx, counts[size_t(l * X + e)]);
      total += counts[size_t(l * X + e)];
    }
    if (total > 0) skew += double(mx) / (double(total) / double(X));
  }
  health_.router_entropy = pairs ? entropy / double(pairs) : 0;
  health_.mean_distinct_experts = layer_passes ? distinct / double(layer_passes) : 0;
  health_.expert_skew = skew / double(n_layers);
  health_.adaptive_tokens += uint64_t(pass.adaptive_tokens);
  adaptive_experts_ += uint64_t(pass.adaptive_experts);
  health_.adaptive_mean_k =
      health_.adaptive_tokens ? double(adaptive_experts_) / double(health_.adaptive_tokens) : 0;
  return true;
}

}  // namespace step35
