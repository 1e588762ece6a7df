// Embeddings of pictures encoded before, keyed by the picture's digest: agents send the same
// screenshot turn after turn, and the tower's forward pass is the costly part of a picture.
// Bounded by bytes (the embeddings' floats); the least recently used picture goes first.
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "vision/picture_digest.h"

namespace step35::vision {

// One picture through the tower: every chunk (slices in plan order, then the overview) with
// its side in pixels and its rows.
struct ChunkEmbeddings {
  int32_t side = 0;
  bool overview = false;
  std::vector<float> rows;  // tokens x projection width
};
using PictureEmbeddings = std::vector<ChunkEmbeddings>;

class EmbeddingCache {
 public:
  explicit EmbeddingCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // The picture's embeddings, or null (counted as a hit or a miss).
  std::shared_ptr<const PictureEmbeddings> find(const Digest& key);
  // Keeps them (a picture larger than the whole budget is not kept).
  void put(const Digest& key, std::shared_ptr<const PictureEmbeddings> embeddings);

  size_t bytes() const;
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  struct Entry {
    std::shared_ptr<const PictureEmbeddings> embeddings;
    size_t bytes = 0;
    std::list<Digest>::iterator lru;  // position in lru_ (front: most recent)
  };
  mutable std::mutex mu_;
  size_t max_bytes_, bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
  std::map<Digest, Entry> entries_;
  std::list<Digest> lru_;
};

}  // namespace step35::vision
