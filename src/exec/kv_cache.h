// Paged key/value cache.
//
// Keys and values live in fixed-size blocks of `block_size` positions taken from a pool
// shared by all sequences; each sequence lists its blocks in a block table (KvSeq), so
// sequences of any length share one allocation and blocks can be shared between
// sequences with a common prefix (reference counts; see engine/prefix_cache.h).
//
// There are two kinds of block because the model mixes two kinds of layer:
//  * full-attention layers need every position of a sequence: a sequence keeps all of its
//    "full" blocks;
//  * sliding-window layers only ever look at the last `swa_window` positions: a sequence
//    releases its "swa" blocks once every position in them is older than any future query
//    can see (plus `keep_back` positions that speculative decoding may roll back).
// So memory is about n_full_layers x context + n_swa_layers x (window + batch), not
// n_layers x context. Block storage is mapped lazily: untouched blocks cost no RAM.
//
// Keys and values are stored in a cache type each (KvTypes: F32, F16, BF16, Q8_0, Q4_0), as
// llama.cpp's -ctk / -ctv: a position of a layer takes n_head_kv x (row_bytes(k, head_dim_k)
// + row_bytes(v, head_dim_v)) bytes. Inside a block each layer holds, per KV head, the keys
// of its block_size positions and then, per head, the values; the order of the bytes inside
// one head's keys or values belongs to the attention kernels (tensor/kv_kernels.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace step35 {

// The cache types of keys and values (llama.cpp's --cache-type-k / --cache-type-v). F16 is
// llama.cpp's default and ours.
struct KvTypes {
  DType k = DType::F16;
  DType v = DType::F16;
  static KvTypes f32() { return {DType::F32, DType::F32}; }
  bool operator==(const KvTypes&) const = default;
};
// "f32", "f16", "bf16", "q8_0", "q4_0" -> the type; nullopt for anything else.
std::optional<DType> kv_type_from_name(std::string_view name);

struct KvLayerShape {
  bool is_swa = false;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
};

// One sequence's block tables. Entry b covers positions [b*block_size, (b+1)*block_size).
// swa_blocks entries are -1 once released.
struct KvSeq {
  std::vector<int32_t> full_blocks;
  std::vector<int32_t> swa_blocks;
  int32_t n_pos = 0;  // positions 0..n_pos-1 hold keys and values
};

enum class KvKind : uint8_t { Full = 0, Swa = 1 };

class KvPool {
 public:
  static constexpr int32_t kDefaultBlockSize = 32;

  // keep_back: positions behind the window a sequence keeps for rollback (MTP drafts).
  // Throws std::invalid_argument for a type that is not a cache type or a head dimension
  // that is not a multiple of its block (Q8_0 / Q4_0: 32).
  KvPool(std::vector<KvLayerShape> layers, int32_t swa_window, int32_t block_size, int64_t n_full_blocks,
         int64_t n_swa_blocks, int32_t keep_back = 0, KvTypes types = {});
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // Blocks one sequence of n_ctx positions needs when at most max_batch positions are
  // written per forward pass: {full, swa}. The SWA count covers the window, a batch and
  // the rollback margin, never more than the full count.
  static std::pair<int64_t, int64_t> blocks_for_sequence(const std::vector<KvLayerShape>& layers, int32_t n_ctx,
                                                         int32_t swa_window, int32_t max_batch,
                                                         int32_t block_size = kDefaultBlockSize,
                                                         int32_t keep_back = 0);
  // Bytes of one block of each kind. Throws as the constructor for unusable types.
  static std::pair<size_t, size_t> block_bytes(const std::vector<KvLayerShape>& layers, int32_t block_size,
                                                KvTypes types);
  // Bytes one position of one layer takes (keys and values of all its KV heads).
  static size_t position_bytes(const KvLayerShape& layer, KvTypes types);
  // A pool sized for one sequence of n_ctx positions written at most max_batch at a time.
  // Throws std::invalid_argument for n_ctx or max_batch below 1 (and as the constructor).
  static KvPool for_one_sequence(const std::vector<KvLayerShape>& layers, int32_t n_ctx, int32_t swa_window,
                                 int32_t max_batch, int32_t keep_back = 0, KvTypes types = {});
  // One line for logs: size, cache types, layers and the positions each kind holds for a
  // sequence of n_ctx.
  std::string describe(int32_t n_ctx) const;

  int32_t block_size() const { return block_size_; }
  int32_t swa_window() const { return swa_window_; }
  int32_t keep_back() const { return keep_back_; }
  KvTypes types() const { return types_; }
  size_t n_layers() const { return layers_.size(); }
  const KvLayerShape& shape(size_t layer) const { return layers_[layer]; }
  int64_t n_blocks(KvKind kind) const { return kinds_[int(kind)].n_blocks; }
  int64_t n_free(KvKind kind) const { return int64_t(kinds_[int(kind)].free_list.size()); }
  size_t bytes() const;  // reserved address space of both pools
  // Bytes of the pool's pages in memory. Pages are committed on first write and stay when a
  // block is freed, so this grows towards bytes() as more positions are ever held at once.
  size_t resident_bytes() const;

  // Grows `seq` to hold n_pos positions. Returns false, leaving seq as it was, when the
  // pool lacks blocks.
  bool reserve(KvSeq& seq, int32_t n_pos);
  // Takes the full-attention blocks for n_pos positions now (the scheduler reserves a
  // request's worst case at admission so it can never run out mid-generation). False,
  // leaving seq as it was, when the pool lacks blocks.
  bool reserve_full(KvSeq& seq, int32_t n_pos);
  // Blocks reserve(seq, n_pos) would take from the pool.
  std::pair<int64_t, int64_t> blocks_needed(const KvSeq& seq, int32_t n_pos) const;
  // Releases SWA blocks that no query at position >= seq.n_pos - keep_back can see.
  void trim_swa(KvSeq& seq);
  // Whether seq can be cut back to p positions (p <= n_pos): the SWA blocks a query at p
  // needs must still be held.
  bool can_truncate(const KvSeq& seq, int32_t p) const;
  // Cuts seq back to p positions (releasing whole blocks past it). Throws
  // std::logic_error when !can_truncate.
  void truncate(KvSeq& seq, int32_t p);
  // Releases every block of seq and empties it.
  void free_seq(KvSeq& seq);

  // Reference counts (a block is free at 0). alloc() returns -1 when none is free.
  int32_t alloc(KvKind kind);
  void retain(KvKind kind, int32_t block);
  void release(KvKind kind, int32_t block);
  int32_t refcount(KvKind kind, int32_t block) const { return kinds_[int(kind)].refs[size_t(block)]; }

  // The keys (values) of KV head g of a layer in one block: block_size positions in
  // head_bytes() bytes, laid out as tensor/kv_kernels.h says for the type.
  uint8_t* k_head(size_t layer, int32_t block, int32_t g) { return head_base(layer, block, g, false); }
  uint8_t* v_head(size_t layer, int32_t block, int32_t g) { return head_base(layer, block, g, true); }
  const uint8_t* k_head(size_t layer, int32_t block, int32_t g) const { return head_base(layer, block, g, false); }
  const uint8_t* v_head(size_t layer, int32_t block, int32_t g) const { return head_base(layer, block, g, true); }
  size_t k_head_bytes(size_t layer) const;
  size_t v_head_bytes(size_t layer) const;
  // The block holding pos for a layer's kind (-1 if released).
  int32_t block_of(const KvSeq& seq, size_t layer, int32_t pos) const {
    const auto& table = layers_[layer].is_swa ? seq.swa_blocks : seq.full_blocks;
    return table[size_t(pos / block_size_)];
  }

 private:
  struct Kind {
    std::vector<size_t> layer_offset;  // bytes from a block's start, per layer (this kind only)
    size_t block_bytes = 0;
    int64_t n_blocks = 0;
    uint8_t* data = nullptr;
    size_t mapped_bytes = 0;
    std::vector<int32_t> refs;
    std::vector<int32_t> free_list;
  };
  uint8_t* head_base(size_t layer, int32_t block, int32_t g, bool is_v) const;
  static int32_t oldest_needed(int32_t n_pos, int32_t window, int32_t keep_back);

  std::vector<KvLayerShape> layers_;
  int32_t swa_window_, block_size_, keep_back_;
  KvTypes types_;
  Kind kinds_[2];
};

// A single sequence with a pool of its own sized for n_ctx: the cache of `step35 run`,
// `eval`, `bench` and the tests.
class KvCache {
 public:
  KvCache(const std::vector<KvLayerShape>& layers, int32_t n_ctx, int32_t swa_window, int32_t max_batch,
          int32_t keep_back = 0, KvTypes types = {});

  int32_t n_ctx() const { return n_ctx_; }
  int32_t max_batch() const { return max_batch_; }
  int32_t n_pos() const { return seq_.n_pos; }
  int32_t swa_window() const { return pool_.swa_window(); }
  void clear() { pool_.free_seq(seq_); }
  bool can_truncate_to(int32_t p) const { return p >= 0 && p <= seq_.n_pos && pool_.can_truncate(seq_, p); }
  void truncate(int32_t p) { pool_.truncate(seq_, p); }
  size_t n_layers() const { return pool_.n_layers(); }
  const KvLayerShape& shape(size_t layer) const { return pool_.shape(layer); }
  size_t bytes() const { return pool_.bytes(); }
  // Positions a layer can hold at once (n_ctx for full layers, the SWA span otherwise).
  int32_t capacity(size_t layer) const;
  std::string describe() const;  // one line for logs

  KvPool& pool() { return pool_; }
  const KvPool& pool() const { return pool_; }
  KvSeq& seq() { return seq_; }
  const KvSeq& seq() const { return seq_; }

 private:
  int32_t n_ctx_, max_batch_;
  KvPool pool_;
  KvSeq seq_;
};

}  // namespace step35
