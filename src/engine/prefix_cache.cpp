#include "engine/prefix_cache.h"

#include <algorithm>

namespace step35 {

uint64_t PrefixCache::chain_hash(uint64_t parent, const int32_t* tokens, int32_t n) {
  // splitmix64-style mixing of the parent hash and each token id.
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (int32_t i = 0; i < n; ++i) {
    h ^= uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h == 0 ? 1 : h;  // 0 means "no parent"
}

PrefixCache::Entry* PrefixCache::find(uint64_t hash, uint64_t parent, const int32_t* tokens, int32_t n) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  if (e.parent != parent || int32_t(e.tokens.size()) != n || !std::equal(e.tokens.begin(), e.tokens.end(), tokens))
    return nullptr;  // a collision: treat as absent
  return &e;
}

int32_t PrefixCache::attach(const int32_t* tokens, int32_t max_tokens, KvSeq& seq) {
  ++lookups_;
  const int32_t bs = pool_.block_size();
  std::vector<Entry*> chain;
  uint64_t parent = 0;
  for (int32_t b = 0; (b + 1) * bs <= max_tokens; ++b) {
    const uint64_t h = chain_hash(parent, tokens + b * bs, bs);
    Entry* e = find(h, parent, tokens + b * bs, bs);
    if (!e) break;
    chain.push_back(e);
    parent = h;
  }
  bool has_swa = false;
  for (size_t il = 0; il < pool_.n_layers(); ++il) has_swa |= pool_.shape(il).is_swa;
  // The longest prefix whose sliding window is complete.
  int32_t n_blocks = int32_t(chain.size());
  while (n_blocks > 0 && has_swa) {
    const int32_t end = n_blocks * bs;
    const int32_t first = std::max(0, end - pool_.swa_window() + 1) / bs;
    bool ok = true;
    for (int32_t b = first; b < n_blocks && ok; ++b) ok = chain[size_t(b)]->swa_block >= 0;
    if (ok) break;
    --n_blocks;
  }
  if (n_blocks == 0) return 0;
  ++tick_;
  const int32_t end = n_blocks * bs;
  const int32_t first_swa = std::max(0, end - pool_.swa_window() + 1) / bs;
  seq.full_blocks.clear();
  seq.swa_blocks.clear();
  for (int32_t b = 0; b < n_blocks; ++b) {
    Entry* e = chain[size_t(b)];
    e->last_used = tick_;
    pool_.retain(KvKind::Full, e->full_block);
    seq.full_blocks.push_back(e->full_block);
    if (has_swa) {
      if (b >= first_swa) {
        pool_.retain(KvKind::Swa, e->swa_block);
        seq.swa_blocks.push_back(e->swa_block);
      } else {
        seq.swa_blocks.push_back(-1);
      }
    }
  }
  seq.n_pos = end;
  ++hits_;
  return end;
}

void PrefixCache::publish(const int32_t* tokens, int32_t n_tokens, const KvSeq& seq) {
  const int32_t bs = pool_.block_size();
  n_tokens = std::min(n_tokens, seq.n_pos);
  ++tick_;
  uint64_t parent = 0;
  for (int32_t b = 0; (b + 1) * bs <= n_tokens; ++b) {
    if (size_t(b) >= seq.full_blocks.size() || seq.full_blocks[size_t(b)] < 0) break;
    const int32_t* t = tokens + b * bs;
    const uint64_t h = chain_hash(parent, t, bs);
    const int32_t swa = size_t(b) < seq.swa_blocks.size() ? seq.swa_blocks[size_t(b)] : -1;
    Entry* e = find(h, parent, t, bs);
    if (!e) {
      if (entries_.count(h)) {  // a colliding entry: keep the older one, stop the chain here
        break;
      }
      Entry ne;
      ne.parent = parent;
      ne.depth = b;
      ne.tokens.assign(t, t + bs);
      ne.full_block = seq.full_blocks[size_t(b)];
      pool_.retain(KvKind::Full, ne.full_block);
      if (swa >= 0) {
        ne.swa_block = swa;
        pool_.retain(KvKind::Swa, swa);
      }
      ne.last_used = tick_;
      entries_.emplace(h, std::move(ne));
    } else {
      e->last_used = tick_;
      if (e->swa_block < 0 && swa >= 0) {  // the window part was gone; this sequence still has it
        e->swa_block = swa;
        pool_.retain(KvKind::Swa, swa);
      }
    }
    parent = h;
  }
}

void PrefixCache::drop(std::unordered_map<uint64_t, Entry>::iterator it) {
  Entry& e = it->second;
  if (e.full_block >= 0) pool_.release(KvKind::Full, e.full_block);
  if (e.swa_block >= 0) pool_.release(KvKind::Swa, e.swa_block);
  entries_.erase(it);
}

int64_t PrefixCache::evict(KvKind kind, int64_t n) {
  if (n <= 0) return 0;
  // Candidates: entries whose block of this kind only the cache holds; oldest first, and
  // deeper blocks before their parents when equally old.
  std::vector<std::pair<std::pair<uint64_t, int32_t>, uint64_t>> order;
  for (const auto& [h, e] : entries_) {
    const int32_t b = kind == KvKind::Full ? e.full_block : e.swa_block;
    if (b >= 0 && pool_.refcount(kind, b) == 1) order.push_back({{e.last_used, -e.depth}, h});
  }
  std::sort(order.begin(), order.end());
  int64_t freed = 0;
  for (const auto& o : order) {
    if (freed >= n) break;
    auto it = entries_.find(o.second);
    if (it == entries_.end()) continue;
    if (kind == KvKind::Swa) {
      // Only the window part goes; the entry keeps its full block.
      pool_.release(KvKind::Swa, it->second.swa_block);
      it->second.swa_block = -1;
    } else {
      drop(it);
    }
    ++freed;
  }
  return freed;
}

int64_t PrefixCache::evictable(KvKind kind) const {
  int64_t n = 0;
  for (const auto& [h, e] : entries_) {
    const int32_t b = kind == KvKind::Full ? e.full_block : e.swa_block;
    if (b >= 0 && pool_.refcount(kind, b) == 1) ++n;
  }
  return n;
}

void PrefixCache::clear() {
  while (!entries_.empty()) drop(entries_.begin());
}

}  // namespace step35
