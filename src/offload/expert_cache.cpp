#include "offload/expert_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "exec/thread_pool.h"

namespace step35::offload {

namespace {

// Direct I/O wants offsets, lengths and buffers aligned to the device's logical block;
// 4 KiB covers every disk in use.
constexpr uint64_t kAlign = 4096;

uint64_t align_down(uint64_t v) { return v & ~(kAlign - 1); }
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }

// Bytes of a slot that one matrix's aligned read may take, wherever it starts.
size_t window_bytes(size_t mat_bytes) { return size_t(align_up(mat_bytes + kAlign - 1)); }

int64_t mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

}  // namespace

size_t ExpertCache::slot_bytes_for(const std::vector<std::vector<ExpertTensor>>& blocks) {
  size_t most = 0;
  for (const auto& tensors : blocks) {
    size_t sum = 0;
    for (const ExpertTensor& t : tensors) sum += window_bytes(t.mat_bytes);
    most = std::max(most, sum);
  }
  return most;
}

ExpertCache::ExpertCache(std::vector<std::vector<ExpertTensor>> blocks, int64_t n_slots)
    : blocks_(std::move(blocks)), n_slots_(n_slots) {
  slot_bytes_ = slot_bytes_for(blocks_);
  file_of_.resize(blocks_.size());
  slot_of_.resize(blocks_.size());
  stats_.direct_io = true;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    int64_t n_mat = 0;
    for (const ExpertTensor& t : blocks_[b]) {
      n_mat = std::max(n_mat, t.n_mat);
      auto it = std::find_if(files_.begin(), files_.end(), [&](const OpenFile& f) { return f.path == t.path; });
      if (it == files_.end()) {
        OpenFile f;
        f.path = t.path;
        f.fd = ::open(t.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        f.direct = f.fd >= 0;
        if (f.fd < 0 && errno == EINVAL) f.fd = ::open(t.path.c_str(), O_RDONLY | O_CLOEXEC);
        struct stat st {};
        if (f.fd < 0 || ::fstat(f.fd, &st) != 0) {
          const std::string why = std::strerror(errno);
          for (const OpenFile& o : files_) ::close(o.fd);
          if (f.fd >= 0) ::close(f.fd);
          throw std::runtime_error("expert cache: cannot open " + t.path + ": " + why);
        }
        f.size = int64_t(st.st_size);
        f.mtime_ns = mtime_ns(st);
        stats_.direct_io = stats_.direct_io && f.direct;
        files_.push_back(f);
        it = files_.end() - 1;
      }
      file_of_[b].push_back(int32_t(it - files_.begin()));
    }
    slot_of_[b].assign(size_t(n_mat), -1);
    uses_.push_back(std::vector<uint32_t>(size_t(n_mat), 0));
  }
  slots_.resize(size_t(n_slots_));
  unpinned_ = n_slots_;
  stats_.slots = n_slots_;
  stats_.slot_bytes = slot_bytes_;
  const size_t total = std::max<size_t>(size_t(n_slots_) * slot_bytes_, kAlign);
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    for (const OpenFile& o : files_) ::close(o.fd);
    throw std::runtime_error("expert cache: cannot reserve " + std::to_string(total >> 20) + " MiB for its slots");
  }
  base_ = static_cast<uint8_t*>(p);
  // Two reads in flight keep a disk busier than one; more would take cores from the pass.
  for (int i = 0; i < 2; ++i) readers_.emplace_back([this] { reader_loop(); });
}

ExpertCache::~ExpertCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  queued_.notify_all();
  for (std::thread& t : readers_) t.join();
  for (const auto& tensors : blocks_)
    for (const ExpertTensor& t : tensors)
      for (int64_t m = 0; m < t.n_mat; ++m) t.resident->where[size_t(m)].store(nullptr, std::memory_order_release);
  ::munmap(base_, std::max<size_t>(size_t(n_slots_) * slot_bytes_, kAlign));
  for (const OpenFile& f : files_) ::close(f.fd);
}

ExpertCache::Lease& ExpertCache::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    cache_ = o.cache_;
    slots_ = std::move(o.slots_);
    o.cache_ = nullptr;
  }
  return *this;
}

void ExpertCache::Lease::release() {
  if (cache_ && !slots_.empty()) cache_->unpin(slots_);
  slots_.clear();
  cache_ = nullptr;
}

void ExpertCache::unpin(const std::vector<int64_t>& slots) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t s : slots)
      if (--slots_[size_t(s)].pins == 0) ++unpinned_;
  }
  changed_.notify_all();
}

void ExpertCache::count_use(int il, int32_t e) {
  ++uses_[size_t(il)][size_t(e)];
  // Counts halve every few cache-fulls of requests, so experts that were hot long ago make
  // way for those hot now.
  if (++uses_since_aging_ < uint64_t(8 * n_slots_)) return;
  uses_since_aging_ = 0;
  for (auto& block : uses_)
    for (uint32_t& u : block) u >>= 1;
}

int64_t ExpertCache::pick_victim() {
  int64_t best = -1;
  uint32_t best_uses = 0;
  for (int64_t s = 0; s < n_slots_; ++s) {
    const Slot& slot = slots_[size_t(s)];
    if (slot.pins > 0) continue;
    if (slot.state == SlotState::Empty) return s;
    const uint32_t u = uses_[size_t(slot.block)][size_t(slot.expert)];
    if (best < 0 || u < best_uses || (u == best_uses && slot.last_use > slots_[size_t(best)].last_use)) {
      best = s;
      best_uses = u;
    }
  }
  return best;
}

void ExpertCache::evict(int64_t s) {
  Slot& slot = slots_[size_t(s)];
  if (slot.state == SlotState::Empty) return;
  ++stats_.evictions;
  if (slot.prefetched) ++stats_.prefetch_wasted;
  empty_slot(s);
}

void ExpertCache::empty_slot(int64_t s) {
  Slot& slot = slots_[size_t(s)];
  for (const ExpertTensor& t : blocks_[size_t(slot.block)])
    t.resident->where[size_t(slot.expert)].store(nullptr, std::memory_order_release);
  slot_of_[size_t(slot.block)][size_t(slot.expert)] = -1;
  slot.state = SlotState::Empty;
  slot.prefetched = false;
}

int64_t ExpertCache::take_slot(int il, int32_t e) {
  const int64_t s = pick_victim();
  evict(s);
  Slot& slot = slots_[size_t(s)];
  slot.block = il;
  slot.expert = e;
  slot.state = SlotState::Loading;
  slot.pins = 1;
  slot.last_use = ++tick_;
  --unpinned_;
  slot_of_[size_t(il)][size_t(e)] = s;
  return s;
}

ExpertCache::Lease ExpertCache::acquire(int il, const int32_t* experts, int64_t n, ThreadPool& pool) {
  for (int attempt = 0;; ++attempt) {
    Lease lease;
    lease.cache_ = this;
    const std::vector<Read> reads = claim(il, experts, n, lease.slots_);
    std::string error = reads.empty() ? std::string() : read_all(reads, pool);
    bool others_failed = false;
    if (error.empty()) others_failed = !(error = wait_for_others(lease.slots_)).empty();
    if (error.empty()) return lease;
    lease.release();
    // A read another pass or the prefetcher made failed: read those experts here once, so
    // the error (if it persists) is this pass's own.
    if (!others_failed || attempt > 0) throw std::runtime_error(error);
  }
}

// Pins the experts that are in a slot (ready, or being read by another pass) and claims a
// slot for each of the others, waiting for room; returns the reads to make.
std::vector<ExpertCache::Read> ExpertCache::claim(int il, const int32_t* experts, int64_t n,
                                                  std::vector<int64_t>& pinned) {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<int32_t> missing;
  for (int64_t i = 0; i < n; ++i) count_use(il, experts[i]);
  for (;;) {
    missing.assign(experts, experts + n);
    size_t kept = 0;
    for (int32_t e : missing) {
      const int64_t s = slot_of_[size_t(il)][size_t(e)];
      if (s < 0) {
        missing[kept++] = e;
        continue;
      }
      Slot& slot = slots_[size_t(s)];
      if (slot.pins++ == 0) --unpinned_;
      slot.last_use = ++tick_;
      pinned.push_back(s);
      ++stats_.hits;
      stats_.prefetch_used += slot.prefetched;
      slot.prefetched = false;
    }
    missing.resize(kept);
    if (unpinned_ >= int64_t(missing.size())) break;
    // No room yet: wait holding nothing, so two passes that each hold part of what they
    // need never wait for each other.
    for (int64_t s : pinned)
      if (--slots_[size_t(s)].pins == 0) ++unpinned_;
    stats_.hits -= pinned.size();
    pinned.clear();
    changed_.notify_all();
    changed_.wait(lock);
  }
  std::vector<Read> reads;
  for (int32_t e : missing) {
    const int64_t s = take_slot(il, e);
    pinned.push_back(s);
    reads.push_back({s, il, e});
    ++stats_.misses;
  }
  return reads;
}

// The claimed experts read on `pool`, then published to their tensors' residency tables
// (or their slots emptied again); the first error, or "".
std::string ExpertCache::read_all(const std::vector<Read>& reads, ThreadPool& pool) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> errors(reads.size());
  pool.parallel_stealing(int64_t(reads.size()), [&](int64_t i, int) {
    try {
      read_expert(reads[size_t(i)]);
    } catch (const std::exception& e) {
      errors[size_t(i)] = e.what();
    }
  });
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < reads.size(); ++i) {
      publish(reads[i], errors[i]);
      if (error.empty()) error = errors[i];
    }
  }
  changed_.notify_all();
  return error;
}

void ExpertCache::publish(const Read& r, const std::string& error) {
  Slot& slot = slots_[size_t(r.slot)];
  if (!error.empty()) {
    empty_slot(r.slot);
    return;
  }
  uint8_t* at = slot_data(r.slot);
  for (const ExpertTensor& t : blocks_[size_t(r.block)]) {
    const uint64_t off = t.offset + uint64_t(r.expert) * t.mat_bytes;
    t.resident->where[size_t(r.expert)].store(at + (off - align_down(off)), std::memory_order_release);
    at += window_bytes(t.mat_bytes);
  }
  slot.state = SlotState::Ready;
}

void ExpertCache::prefetch(int il, const int32_t* experts, int64_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < n && unpinned_ > 0; ++i) {
      const int32_t e = experts[i];
      if (slot_of_[size_t(il)][size_t(e)] >= 0) continue;
      const int64_t s = take_slot(il, e);  // pinned by the reader until the bytes are in
      slots_[size_t(s)].prefetched = true;
      prefetch_queue_.push_back({s, il, e});
      ++stats_.prefetched;
    }
  }
  queued_.notify_all();
}

void ExpertCache::reader_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    queued_.wait(lock, [&] { return stopping_ || !prefetch_queue_.empty(); });
    if (stopping_) return;
    const Read r = prefetch_queue_.front();
    prefetch_queue_.pop_front();
    lock.unlock();
    std::string error;
    try {
      read_expert(r);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    publish(r, error);
    if (--slots_[size_t(r.slot)].pins == 0) ++unpinned_;
    changed_.notify_all();
  }
}

// Waits until the pinned experts another pass was reading are in; "" or why one is not.
std::string ExpertCache::wait_for_others(const std::vector<int64_t>& pinned) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] {
    return std::none_of(pinned.begin(), pinned.end(),
                        [&](int64_t s) { return slots_[size_t(s)].state == SlotState::Loading; });
  });
  for (int64_t s : pinned)
    if (slots_[size_t(s)].state != SlotState::Ready) return "expert cache: reading an expert failed in another request";
  return "";
}

void ExpertCache::read_expert(const Read& r) {
  uint8_t* at = slot_data(r.slot);
  const auto& tensors = blocks_[size_t(r.block)];
  // A file replaced or rewritten under a running process would give other weights than
  // the ones loaded: refuse before reading.
  // (The three tensors of a block are nearly always in one file: each file is checked once.)
  const std::vector<int32_t>& files = file_of_[size_t(r.block)];
  for (size_t t = 0; t < files.size(); ++t)
    if (std::find(files.begin(), files.begin() + ptrdiff_t(t), files[t]) == files.begin() + ptrdiff_t(t))
      check_unchanged(files_[size_t(files[t])]);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const ExpertTensor& x = tensors[t];
    const OpenFile& f = files_[size_t(file_of_[size_t(r.block)][t])];
    const uint64_t off = x.offset + uint64_t(r.expert) * x.mat_bytes, start = align_down(off);
    const size_t need = size_t(off - start) + x.mat_bytes;
    read_range(f, start, need, at);
    at += window_bytes(x.mat_bytes);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t t = 0; t < tensors.size(); ++t) stats_.bytes_read += align_up(tensors[t].mat_bytes);
}

void ExpertCache::read_range(const OpenFile& f, uint64_t offset, size_t need, uint8_t* dst) {
  // Whole aligned blocks; the last may run past the end of the file, where the read stops.
  const size_t want = size_t(align_up(need));
  size_t done = 0;
  while (done < want) {
    const ssize_t got = ::pread(f.fd, dst + done, want - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const std::string why = std::strerror(errno);
      check_unchanged(f);
      throw std::runtime_error("expert cache: reading " + f.path + " at byte " + std::to_string(offset + done) +
                               ": " + why);
    }
    if (got == 0) break;
    done += size_t(got);
  }
  if (!f.direct) ::posix_fadvise(f.fd, off_t(offset), off_t(want), POSIX_FADV_DONTNEED);
  if (done < need) {
    check_unchanged(f);
    throw std::runtime_error("expert cache: short read of " + f.path + " at byte " + std::to_string(offset) + ": " +
                             std::to_string(done) + " of " + std::to_string(need) + " bytes");
  }
}

void ExpertCache::check_unchanged(const OpenFile& f) const {
  struct stat st {};
  if (::stat(f.path.c_str(), &st) != 0) throw std::runtime_error("expert cache: " + f.path + " is gone: " + std::strerror(errno));
  if (int64_t(st.st_size) != f.size || mtime_ns(st) != f.mtime_ns)
    throw std::runtime_error("expert cache: " + f.path + " changed on disk since the model was loaded (size " +
                             std::to_string(f.size) + " -> " + std::to_string(int64_t(st.st_size)) +
                             "); restart with the new file");
}

double direct_read_bandwidth(const std::string& path, uint64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  constexpr size_t kChunk = size_t(4) << 20;
  void* buf = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) {
    ::close(fd);
    throw std::runtime_error("cannot allocate a read buffer");
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  while (done < max_bytes) {
    const ssize_t got = ::pread(fd, buf, kChunk, off_t(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += uint64_t(got);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::posix_fadvise(fd, 0, off_t(done), POSIX_FADV_DONTNEED);  // where direct I/O was refused
  ::munmap(buf, kChunk);
  ::close(fd);
  return secs > 0 ? double(done) / secs : 0;
}

void ExpertCache::drop(int il, int32_t e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (il < 0 || size_t(il) >= slot_of_.size() || e < 0 || size_t(e) >= slot_of_[size_t(il)].size()) return;
  const int64_t s = slot_of_[size_t(il)][size_t(e)];
  if (s >= 0 && slots_[size_t(s)].pins == 0) evict(s);
}

ExpertCacheStats ExpertCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace step35::offload
