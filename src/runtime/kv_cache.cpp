#include "runtime/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace step35 {

KvCache::KvCache(const std::vector<KvLayerShape>& layers, int32_t n_ctx, int32_t swa_window,
                 int32_t max_batch)
    : n_ctx_(n_ctx), swa_window_(swa_window), max_batch_(max_batch) {
  if (n_ctx < 1) throw std::invalid_argument("KV cache: context must be >= 1");
  if (max_batch < 1) throw std::invalid_argument("KV cache: batch must be >= 1");
  for (const auto& s : layers) {
    Layer L;
    L.shape = s;
    L.capacity = slots_for(s.is_swa, n_ctx, swa_window, max_batch);
    L.k.assign(size_t(L.capacity) * size_t(s.n_head_kv) * size_t(s.head_dim_k), 0.0f);
    L.v.assign(size_t(L.capacity) * size_t(s.n_head_kv) * size_t(s.head_dim_v), 0.0f);
    layers_.push_back(std::move(L));
  }
}

int32_t KvCache::slots_for(bool is_swa, int32_t n_ctx, int32_t swa_window, int32_t max_batch) {
  if (!is_swa) return n_ctx;
  // A SWA ring needs window + max_batch - 1 slots (see header); never more than n_ctx.
  const int64_t ring = int64_t(std::max(swa_window, 1)) + max_batch - 1;
  return int32_t(std::min<int64_t>(n_ctx, ring));
}

size_t KvCache::bytes() const {
  size_t total = 0;
  for (const auto& L : layers_) total += (L.k.size() + L.v.size()) * sizeof(float);
  return total;
}

bool KvCache::can_truncate_to(int32_t p) const {
  if (p < 0 || p > n_pos_) return false;
  for (const auto& L : layers_) {
    if (!L.shape.is_swa || L.capacity >= n_ctx_) continue;
    // After truncation the next query at p needs positions p-window+1 .. p-1; the ring
    // holds n_pos-capacity .. n_pos-1.
    const int32_t oldest_needed = std::max(0, p - swa_window_ + 1);
    if (oldest_needed < n_pos_ - L.capacity) return false;
  }
  return true;
}

}  // namespace step35
