#include "exec/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <new>
#include <stdexcept>

namespace step35 {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one row of n values of cache type t; throws for a type or width the cache
// cannot hold (the message names both).
size_t cache_row_bytes(DType t, int32_t n, const char* what) {
  const bool cache_type = t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0 || t == DType::Q4_0;
  if (!cache_type)
    throw std::invalid_argument(std::string("KV cache: ") + dtype_name(t) +
                                " is not a cache type (f32, f16, bf16, q8_0, q4_0)");
  const std::optional<size_t> rb = row_bytes(t, n);
  if (n < 1 || !rb)
    throw std::invalid_argument(std::string("KV cache type ") + dtype_name(t) + " needs " + what +
                                " that are a multiple of " + std::to_string(dtype_info(t).block_elems) +
                                " values; this model's have " + std::to_string(n));
  return *rb;
}

}  // namespace

std::optional<DType> kv_type_from_name(std::string_view name) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

size_t KvPool::position_bytes(const KvLayerShape& s, KvTypes types) {
  return size_t(s.n_head_kv) * (cache_row_bytes(types.k, s.head_dim_k, "key heads") +
                                cache_row_bytes(types.v, s.head_dim_v, "value heads"));
}

KvPool::KvPool(std::vector<KvLayerShape> layers, int32_t swa_window, int32_t block_size, int64_t n_full_blocks,
               int64_t n_swa_blocks, int32_t keep_back, KvTypes types)
    : layers_(std::move(layers)), swa_window_(std::max(1, swa_window)), block_size_(block_size), keep_back_(keep_back),
      types_(types) {
  if (block_size < 1) throw std::invalid_argument("KV cache: block size must be >= 1");
  if (keep_back < 0) throw std::invalid_argument("KV cache: keep_back must be >= 0");
  if (n_full_blocks < 0 || n_swa_blocks < 0 || n_full_blocks >= (int64_t(1) << 31) || n_swa_blocks >= (int64_t(1) << 31))
    throw std::invalid_argument("KV cache: block count out of range");
  for (int k = 0; k < 2; ++k) kinds_[k].layer_offset.assign(layers_.size(), 0);
  for (size_t il = 0; il < layers_.size(); ++il) {
    Kind& K = kinds_[layers_[il].is_swa ? 1 : 0];
    K.layer_offset[il] = K.block_bytes;
    K.block_bytes += size_t(block_size_) * position_bytes(layers_[il], types_);
  }
  kinds_[0].n_blocks = kinds_[0].block_bytes ? n_full_blocks : 0;
  kinds_[1].n_blocks = kinds_[1].block_bytes ? n_swa_blocks : 0;
  for (Kind& K : kinds_) {
    K.refs.assign(size_t(K.n_blocks), 0);
    K.free_list.resize(size_t(K.n_blocks));
    // Lowest block ids are handed out first (pop from the back).
    for (int64_t b = 0; b < K.n_blocks; ++b) K.free_list[size_t(b)] = int32_t(K.n_blocks - 1 - b);
    if (K.n_blocks > 0 && K.block_bytes > std::numeric_limits<size_t>::max() / size_t(K.n_blocks))
      throw std::invalid_argument("KV cache: size out of range");
    K.mapped_bytes = size_t(K.n_blocks) * K.block_bytes;
    if (K.mapped_bytes == 0) continue;
    // Anonymous mapping: pages are committed only when a block is first written.
    void* p = ::mmap(nullptr, K.mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      for (Kind& other : kinds_)
        if (other.data) ::munmap(other.data, other.mapped_bytes), other.data = nullptr;
      throw std::bad_alloc();
    }
    K.data = static_cast<uint8_t*>(p);
  }
}

KvPool::~KvPool() {
  for (Kind& K : kinds_)
    if (K.data) ::munmap(K.data, K.mapped_bytes);
}

std::pair<size_t, size_t> KvPool::block_bytes(const std::vector<KvLayerShape>& layers, int32_t block_size,
                                               KvTypes types) {
  size_t b[2] = {0, 0};
  for (const auto& s : layers) b[s.is_swa ? 1 : 0] += size_t(block_size) * position_bytes(s, types);
  return {b[0], b[1]};
}

std::pair<int64_t, int64_t> KvPool::blocks_for_sequence(const std::vector<KvLayerShape>& layers, int32_t n_ctx,
                                                        int32_t swa_window, int32_t max_batch, int32_t block_size,
                                                        int32_t keep_back) {
  bool any_full = false, any_swa = false;
  for (const auto& s : layers) (s.is_swa ? any_swa : any_full) = true;
  const int64_t full = ceil_div(std::max(n_ctx, 1), block_size);
  // Held at once: the window behind the oldest query of a batch, the batch itself and the
  // rollback margin; a block boundary can cut both ends, hence + 1.
  const int64_t span = int64_t(std::max(swa_window, 1)) - 1 + std::max(max_batch, 1) + keep_back;
  const int64_t swa = std::min(full, ceil_div(span, block_size) + 1);
  return {any_full ? full : 0, any_swa ? swa : 0};
}

size_t KvPool::bytes() const { return kinds_[0].mapped_bytes + kinds_[1].mapped_bytes; }

size_t KvPool::resident_bytes() const {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  size_t resident = 0;
  std::vector<unsigned char> in_core;
  for (const Kind& K : kinds_) {
    if (!K.data) continue;
    in_core.resize((K.mapped_bytes + page - 1) / page);
    if (::mincore(K.data, K.mapped_bytes, in_core.data()) != 0) continue;
    for (unsigned char c : in_core) resident += (c & 1) ? page : 0;
  }
  return resident;
}

int32_t KvPool::oldest_needed(int32_t n_pos, int32_t window, int32_t keep_back) {
  return std::max(0, n_pos - keep_back - window + 1);
}

std::pair<int64_t, int64_t> KvPool::blocks_needed(const KvSeq& seq, int32_t n_pos) const {
  const int64_t want = ceil_div(n_pos, block_size_);
  const int64_t full = kinds_[0].block_bytes ? std::max<int64_t>(0, want - int64_t(seq.full_blocks.size())) : 0;
  const int64_t swa = kinds_[1].block_bytes ? std::max<int64_t>(0, want - int64_t(seq.swa_blocks.size())) : 0;
  return {full, swa};
}

bool KvPool::reserve(KvSeq& seq, int32_t n_pos) {
  const auto [need_full, need_swa] = blocks_needed(seq, n_pos);
  if (need_full > n_free(KvKind::Full) || need_swa > n_free(KvKind::Swa)) return false;
  for (int64_t i = 0; i < need_full; ++i) seq.full_blocks.push_back(alloc(KvKind::Full));
  for (int64_t i = 0; i < need_swa; ++i) seq.swa_blocks.push_back(alloc(KvKind::Swa));
  return true;
}

bool KvPool::reserve_full(KvSeq& seq, int32_t n_pos) {
  if (!kinds_[0].block_bytes) return true;
  const int64_t need = std::max<int64_t>(0, ceil_div(n_pos, block_size_) - int64_t(seq.full_blocks.size()));
  if (need > n_free(KvKind::Full)) return false;
  for (int64_t i = 0; i < need; ++i) seq.full_blocks.push_back(alloc(KvKind::Full));
  return true;
}

void KvPool::trim_swa(KvSeq& seq) {
  if (!kinds_[1].block_bytes) return;
  const int32_t oldest = oldest_needed(seq.n_pos, swa_window_, keep_back_);
  const size_t n_dead = size_t(oldest / block_size_);  // blocks entirely before `oldest`
  for (size_t b = 0; b < std::min(n_dead, seq.swa_blocks.size()); ++b)
    if (seq.swa_blocks[b] >= 0) {
      release(KvKind::Swa, seq.swa_blocks[b]);
      seq.swa_blocks[b] = -1;
    }
}

bool KvPool::can_truncate(const KvSeq& seq, int32_t p) const {
  if (p < 0 || p > seq.n_pos) return false;
  if (!kinds_[1].block_bytes || p == 0) return true;
  const int32_t lo = std::max(0, p - swa_window_ + 1);
  for (int32_t b = lo / block_size_; b <= (p - 1) / block_size_; ++b)
    if (size_t(b) >= seq.swa_blocks.size() || seq.swa_blocks[size_t(b)] < 0) return false;
  return true;
}

void KvPool::truncate(KvSeq& seq, int32_t p) {
  if (!can_truncate(seq, p)) throw std::logic_error("KV cache: cannot roll back to position " + std::to_string(p));
  const size_t keep = size_t(ceil_div(p, block_size_));
  while (seq.full_blocks.size() > keep) {
    release(KvKind::Full, seq.full_blocks.back());
    seq.full_blocks.pop_back();
  }
  while (seq.swa_blocks.size() > keep) {
    if (seq.swa_blocks.back() >= 0) release(KvKind::Swa, seq.swa_blocks.back());
    seq.swa_blocks.pop_back();
  }
  seq.n_pos = p;
}

void KvPool::free_seq(KvSeq& seq) {
  for (int32_t b : seq.full_blocks) release(KvKind::Full, b);
  for (int32_t b : seq.swa_blocks)
    if (b >= 0) release(KvKind::Swa, b);
  seq.full_blocks.clear();
  seq.swa_blocks.clear();
  seq.n_pos = 0;
}

int32_t KvPool::alloc(KvKind kind) {
  Kind& K = kinds_[int(kind)];
  if (K.free_list.empty()) return -1;
  const int32_t b = K.free_list.back();
  K.free_list.pop_back();
  K.refs[size_t(b)] = 1;
  return b;
}

void KvPool::retain(KvKind kind, int32_t block) {
  Kind& K = kinds_[int(kind)];
  if (block < 0 || block >= K.n_blocks || K.refs[size_t(block)] <= 0)
    throw std::logic_error("KV cache: retain of a free or invalid block");
  ++K.refs[size_t(block)];
}

void KvPool::release(KvKind kind, int32_t block) {
  Kind& K = kinds_[int(kind)];
  if (block < 0 || block >= K.n_blocks || K.refs[size_t(block)] <= 0)
    throw std::logic_error("KV cache: release of a free or invalid block");
  if (--K.refs[size_t(block)] == 0) K.free_list.push_back(block);
}

size_t KvPool::k_head_bytes(size_t layer) const {
  return size_t(block_size_) * *row_bytes(types_.k, layers_[layer].head_dim_k);
}

size_t KvPool::v_head_bytes(size_t layer) const {
  return size_t(block_size_) * *row_bytes(types_.v, layers_[layer].head_dim_v);
}

uint8_t* KvPool::head_base(size_t layer, int32_t block, int32_t g, bool is_v) const {
  const KvLayerShape& s = layers_[layer];
  const Kind& K = kinds_[s.is_swa ? 1 : 0];
  const size_t k_bytes = k_head_bytes(layer);
  uint8_t* base = K.data + size_t(block) * K.block_bytes + K.layer_offset[layer];
  return is_v ? base + size_t(s.n_head_kv) * k_bytes + size_t(g) * v_head_bytes(layer) : base + size_t(g) * k_bytes;
}

// ---------------------------------------------------------------------------------------

KvPool KvPool::for_one_sequence(const std::vector<KvLayerShape>& layers, int32_t n_ctx, int32_t swa_window,
                                int32_t max_batch, int32_t keep_back, KvTypes types) {
  if (n_ctx < 1) throw std::invalid_argument("KV cache: context must be >= 1");
  if (max_batch < 1) throw std::invalid_argument("KV cache: batch must be >= 1");
  const auto [full, swa] = blocks_for_sequence(layers, n_ctx, swa_window, max_batch, kDefaultBlockSize, keep_back);
  return KvPool(layers, swa_window, kDefaultBlockSize, full, swa, keep_back, types);
}

std::string KvPool::describe(int32_t n_ctx) const {
  size_t n_full = 0, n_swa = 0;
  int32_t span = 0;  // positions an SWA layer holds at once
  for (const KvLayerShape& s : layers_) {
    if (s.is_swa) {
      ++n_swa;
      span = int32_t(std::min<int64_t>(n_ctx, n_blocks(KvKind::Swa) * block_size_));
    } else {
      ++n_full;
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%.2f MiB (K %s, V %s, blocks of %d positions) = %zu full-attention layers x %d positions + %zu SWA "
                "layers x %d positions (window %d)",
                double(bytes()) / (1 << 20), dtype_name(types_.k), dtype_name(types_.v), block_size_, n_full, n_ctx,
                n_swa, span, swa_window_);
  return buf;
}

KvCache::KvCache(const std::vector<KvLayerShape>& layers, int32_t n_ctx, int32_t swa_window, int32_t max_batch,
                 int32_t keep_back, KvTypes types)
    : n_ctx_(n_ctx), max_batch_(max_batch),
      pool_(KvPool::for_one_sequence(layers, n_ctx, swa_window, max_batch, keep_back, types)) {}

int32_t KvCache::capacity(size_t layer) const {
  const KvKind kind = pool_.shape(layer).is_swa ? KvKind::Swa : KvKind::Full;
  return int32_t(std::min<int64_t>(n_ctx_, pool_.n_blocks(kind) * pool_.block_size()));
}

std::string KvCache::describe() const { return pool_.describe(n_ctx_); }

}  // namespace step35
