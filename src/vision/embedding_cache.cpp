#include "vision/embedding_cache.h"

namespace step35::vision {

std::shared_ptr<const PictureEmbeddings> EmbeddingCache::find(const Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.embeddings;
}

void EmbeddingCache::put(const Digest& key, std::shared_ptr<const PictureEmbeddings> embeddings) {
  size_t size = 0;
  for (const auto& chunk : *embeddings) size += chunk.rows.size() * sizeof(float);
  std::lock_guard<std::mutex> lock(mu_);
  if (size > max_bytes_ || entries_.count(key)) return;
  while (bytes_ + size > max_bytes_ && !lru_.empty()) {
    const auto oldest = entries_.find(lru_.back());
    bytes_ -= oldest->second.bytes;
    entries_.erase(oldest);
    lru_.pop_back();
  }
  lru_.push_front(key);
  entries_[key] = Entry{std::move(embeddings), size, lru_.begin()};
  bytes_ += size;
}

size_t EmbeddingCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

uint64_t EmbeddingCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

uint64_t EmbeddingCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace step35::vision
