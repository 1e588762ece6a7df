// The routed experts of a model larger than its memory budget: kept in a fixed number of
// slots, each slot one expert of one MoE block (its gate, up and down matrices), read from
// the model's file with direct I/O when a forward pass routes to an expert that is not in a
// slot, evicting the expert asked for least often lately (counts halve as they age; among
// equals the one used last, which a pass going through the blocks in order needs again
// last) that no pass is computing. docs/memory.md says how the budget is split and how to
// choose it, and how the policy was chosen.
//
// Direct I/O (O_DIRECT) keeps the file's pages out of the page cache, which would otherwise
// hold a second copy of every expert read and count against the same memory limit. Where
// the file system refuses it (tmpfs), the cache reads through the page cache and drops the
// pages it read at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "tensor/tensor.h"

namespace step35 {

class ThreadPool;

namespace offload {

// One routed-expert tensor (n_mat matrices of mat_bytes each, contiguous) as it lies in a
// file, and the residency table its WeightMatrix reads.
struct ExpertTensor {
  std::string path;
  uint64_t offset = 0;  // file offset of matrix 0
  size_t mat_bytes = 0;
  int64_t n_mat = 0;
  ResidentMatrices* resident = nullptr;  // filled and cleared by the cache
};

struct ExpertCacheStats {
  uint64_t hits = 0;        // experts a pass asked for that were in a slot
  uint64_t misses = 0;      // experts read from the file
  uint64_t evictions = 0;   // experts dropped to make room
  uint64_t bytes_read = 0;  // from the file, alignment padding included
  double read_seconds = 0;  // wall time passes waited for reads
  uint64_t prefetched = 0;       // experts read ahead of the pass that needed them
  uint64_t prefetch_used = 0;    // of those, asked for by a pass while still in memory
  uint64_t prefetch_wasted = 0;  // of those, evicted before any pass asked for them
  int64_t slots = 0;
  size_t slot_bytes = 0;
  bool direct_io = false;   // O_DIRECT on every file
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0; }
};

class ExpertCache {
 public:
  // blocks[il]: the expert tensors of block il (gate, up, down; empty for a block without
  // experts). Bytes one slot takes for these blocks (the largest expert, alignment included).
  static size_t slot_bytes_for(const std::vector<std::vector<ExpertTensor>>& blocks);
  // Opens the files and allocates n_slots slots. Throws std::runtime_error naming a file
  // that cannot be opened.
  ExpertCache(std::vector<std::vector<ExpertTensor>> blocks, int64_t n_slots);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // The experts a pass computes, pinned in their slots until it is dropped.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : cache_(o.cache_), slots_(std::move(o.slots_)) { o.cache_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease() { release(); }
    void release();

   private:
    friend class ExpertCache;
    ExpertCache* cache_ = nullptr;
    std::vector<int64_t> slots_;
  };

  // Makes experts[0..n) of block il resident (reading the missing ones on `pool`) and pins
  // them. n distinct experts, at most slots(). Throws std::runtime_error when a read fails or
  // comes up short, or the file changed since it was opened; nothing stays pinned then.
  Lease acquire(int il, const int32_t* experts, int64_t n, ThreadPool& pool);

  // Starts reading those of experts[0..n) of block il that are in no slot, on the cache's
  // reader threads, into slots no pass has pinned; returns at once. As many as there is
  // room for; a failed read is dropped (the pass that needs the expert reads it again).
  void prefetch(int il, const int32_t* experts, int64_t n);

  // Gives back the slot of expert e of block il (a model patch replaced it) unless a pass
  // holds it; a later pass that routes to it reads it again.
  void drop(int il, int32_t e);

  ExpertCacheStats stats() const;
  int64_t slots() const { return n_slots_; }

 private:
  enum class SlotState : uint8_t { Empty, Loading, Ready };
  struct Slot {
    int32_t block = -1, expert = -1;
    SlotState state = SlotState::Empty;
    int32_t pins = 0;
    uint64_t last_use = 0;
    bool prefetched = false;  // read ahead and not asked for yet
  };
  struct OpenFile {
    std::string path;
    int fd = -1;
    bool direct = false;
    int64_t size = 0, mtime_ns = 0;
  };
  struct Read {
    int64_t slot;
    int32_t block, expert;
  };

  int64_t pick_victim();  // an unpinned slot, by the policy above; -1 if none (lock held)
  void count_use(int il, int32_t e);  // lock held
  void evict(int64_t slot);  // counted as an eviction (lock held)
  void empty_slot(int64_t slot);  // its expert out of every table (lock held)
  // A slot for expert e of block il, evicting by the policy, left Loading with one pin (lock held).
  int64_t take_slot(int il, int32_t e);
  std::vector<Read> claim(int il, const int32_t* experts, int64_t n, std::vector<int64_t>& pinned);
  std::string read_all(const std::vector<Read>& reads, ThreadPool& pool);
  std::string wait_for_others(const std::vector<int64_t>& pinned);
  void read_expert(const Read& r);  // throws
  // After reading r (error: why it failed, or ""): its tensors point into the slot, or the
  // slot is empty again (lock held).
  void publish(const Read& r, const std::string& error);
  void reader_loop();
  void read_range(const OpenFile& f, uint64_t offset, size_t bytes, uint8_t* dst);
  void check_unchanged(const OpenFile& f) const;
  void unpin(const std::vector<int64_t>& slots);
  uint8_t* slot_data(int64_t slot) const { return base_ + size_t(slot) * slot_bytes_; }

  std::vector<std::vector<ExpertTensor>> blocks_;
  std::vector<std::vector<int32_t>> file_of_;         // [block][tensor] -> files_ index
  std::vector<std::vector<int64_t>> slot_of_;         // [block][expert] -> slot or -1
  std::vector<std::vector<uint32_t>> uses_;           // [block][expert] -> aged request count
  uint64_t uses_since_aging_ = 0;
  std::vector<OpenFile> files_;
  std::vector<Slot> slots_;
  int64_t n_slots_ = 0;
  size_t slot_bytes_ = 0;
  uint8_t* base_ = nullptr;  // n_slots_ * slot_bytes_, page aligned
  uint64_t tick_ = 0;
  int64_t unpinned_ = 0;  // slots with no pin (Empty or Ready)
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a slot was unpinned or finished loading
  ExpertCacheStats stats_;
  std::deque<Read> prefetch_queue_;
  std::condition_variable queued_;
  bool stopping_ = false;
  std::vector<std::thread> readers_;
};

// The file's sequential read bandwidth with direct I/O (4 MiB reads from the start, up to
// max_bytes), in bytes per second: what an expert cache can read at best (`bench --membw`).
// Throws std::runtime_error for a file that cannot be read.
double direct_read_bandwidth(const std::string& path, uint64_t max_bytes);

}  // namespace offload
}  // namespace step35
