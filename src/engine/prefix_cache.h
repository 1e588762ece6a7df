// Prefix caching: KV blocks of token prefixes that finished (or prefilled) sequences
// computed are kept, reference counted, so a new sequence whose prompt starts with the same
// tokens (a system prompt, the earlier turns of a conversation) reuses them instead of
// recomputing. Blocks are found by a hash chain over whole blocks of tokens; each entry
// also stores its tokens, so a hash collision can never attach the wrong keys. Entries
// nobody else uses are evicted least recently used first when the pool runs short.
//
// Sliding-window layers: a reused prefix of L positions also needs the SWA blocks that a
// query at position L can see (the last `window` positions). Entries keep their SWA block
// while it is alive; a match is cut back to the longest prefix whose window is complete.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "exec/kv_cache.h"

namespace step35 {

class PrefixCache {
 public:
  explicit PrefixCache(KvPool& pool) : pool_(pool) {}
  ~PrefixCache() { clear(); }
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Attaches the longest cached prefix of tokens[0, max_tokens) (whole blocks) to the
  // empty sequence `seq` (taking references) and returns its length in positions (0: no
  // hit; seq unchanged).
  int32_t attach(const int32_t* tokens, int32_t max_tokens, KvSeq& seq);

  // Records seq's whole blocks holding the K/V of tokens[0, n_tokens) (n_tokens <= n_pos).
  void publish(const int32_t* tokens, int32_t n_tokens, const KvSeq& seq);

  // Frees up to n blocks of `kind` by dropping least recently used entries whose block of
  // that kind only the cache holds. Returns the number of blocks freed.
  int64_t evict(KvKind kind, int64_t n);

  // Blocks of `kind` held by the cache alone (freed by evict()).
  int64_t evictable(KvKind kind) const;
  void clear();  // drops every entry

  size_t n_entries() const { return entries_.size(); }
  uint64_t lookups() const { return lookups_; }
  uint64_t hits() const { return hits_; }

 private:
  struct Entry {
    uint64_t parent = 0;   // hash of the previous block (0 for the first)
    int32_t depth = 0;     // block index
    std::vector<int32_t> tokens;
    int32_t full_block = -1, swa_block = -1;
    uint64_t last_used = 0;
  };
  static uint64_t chain_hash(uint64_t parent, const int32_t* tokens, int32_t n);
  Entry* find(uint64_t hash, uint64_t parent, const int32_t* tokens, int32_t n);
  void drop(std::unordered_map<uint64_t, Entry>::iterator it);

  KvPool& pool_;
  std::unordered_map<uint64_t, Entry> entries_;  // by chain hash
  uint64_t tick_ = 0;
  uint64_t lookups_ = 0, hits_ = 0;
};

}  // namespace step35
