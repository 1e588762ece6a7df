// Per-layer key/value cache for one sequence.
//
// Full-attention layers keep every position of the context. Sliding-window layers keep
// only a ring of the most recent positions: `window` for the attention itself plus
// `max_batch - 1` so that a batch of up to max_batch new tokens can be written before its
// first token reads the keys that the batch's last token will evict. Memory is therefore
// about n_full × ctx + n_swa × (window + max_batch) rows instead of n_layers × ctx.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace step35 {

struct KvLayerShape {
  bool is_swa = false;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
};

class KvCache {
 public:
  // n_ctx: maximum positions; swa_window: keys a SWA query sees (itself included);
  // max_batch: largest number of tokens written in one forward call.
  KvCache(const std::vector<KvLayerShape>& layers, int32_t n_ctx, int32_t swa_window,
          int32_t max_batch);

  // Slots one layer needs: n_ctx for full layers, the SWA ring size otherwise (see above).
  static int32_t slots_for(bool is_swa, int32_t n_ctx, int32_t swa_window, int32_t max_batch);

  int32_t n_ctx() const { return n_ctx_; }
  int32_t max_batch() const { return max_batch_; }
  int32_t swa_window() const { return swa_window_; }
  int32_t n_pos() const { return n_pos_; }  // positions 0..n_pos-1 are filled
  void set_n_pos(int32_t n) { n_pos_ = n; }  // after a forward pass; or to truncate (see below)
  void clear() { n_pos_ = 0; }
  size_t bytes() const;
  size_t n_layers() const { return layers_.size(); }
  const KvLayerShape& shape(size_t layer) const { return layers_[layer].shape; }
  // Slots a layer holds (n_ctx for full layers, the ring size for SWA layers).
  int32_t capacity(size_t layer) const { return layers_[layer].capacity; }
  // Truncating to p keeps full layers exact; a SWA layer can only go back while the ring
  // still holds positions p - window .. p - 1, i.e. p >= n_pos - (capacity - window + 1).
  bool can_truncate_to(int32_t p) const;

  // Row of position `pos` (n_head_kv × head_dim floats) in a layer, for writing or reading.
  float* k(size_t layer, int32_t pos) { return row(layers_[layer].k, layer, pos, false); }
  float* v(size_t layer, int32_t pos) { return row(layers_[layer].v, layer, pos, true); }
  const float* k(size_t layer, int32_t pos) const {
    return const_cast<KvCache*>(this)->k(layer, pos);
  }
  const float* v(size_t layer, int32_t pos) const {
    return const_cast<KvCache*>(this)->v(layer, pos);
  }

 private:
  struct Layer {
    KvLayerShape shape;
    int32_t capacity = 0;
    std::vector<float> k, v;
  };
  float* row(std::vector<float>& buf, size_t layer, int32_t pos, bool is_v) {
    const Layer& L = layers_[layer];
    const int32_t width = L.shape.n_head_kv * (is_v ? L.shape.head_dim_v : L.shape.head_dim_k);
    return buf.data() + size_t(pos % L.capacity) * size_t(width);
  }

  std::vector<Layer> layers_;
  int32_t n_ctx_, swa_window_, max_batch_;
  int32_t n_pos_ = 0;
};

}  // namespace step35
