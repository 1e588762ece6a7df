#include "runtime/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STEP35_CPU_RELAX() _mm_pause()
#else
#define STEP35_CPU_RELAX() std::this_thread::yield()
#endif

namespace step35 {

namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

// Runs body(thread_index) on every thread (the caller is thread 0) and returns when all
// are done. The caller spins on `pending_` (sections are short); workers observe a new
// generation, run, and count down.
void ThreadPool::dispatch(const std::function<void(int)>& body) {
  if (n_threads_ == 1) {
    body(0);
    return;
  }
  body_ = &body;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);  // publishes body_ and pending_
  generation_.notify_all();
  body(0);
  const uint64_t t0 = now_ns();
  uint32_t spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    STEP35_CPU_RELAX();
    // A worker that was descheduled can take long; stop burning the core after a while.
    if (++spins % 1024 == 0 && now_ns() - t0 > 2'000'000) std::this_thread::yield();
  }
  body_ = nullptr;
}

void ThreadPool::worker(int index) {
  // Generation 0 is the value at construction: a section dispatched before this thread
  // got here must still be seen as new.
  uint64_t seen = 0;
  for (;;) {
    // Spin for a while (the next section usually follows within microseconds), then sleep.
    uint64_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      const uint64_t spin_ns = uint64_t(spin_us_.load(std::memory_order_relaxed)) * 1000;
      const uint64_t t0 = now_ns();
      uint32_t spins = 0;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        STEP35_CPU_RELAX();
        if (++spins % 64 == 0 && now_ns() - t0 >= spin_ns) {
          generation_.wait(seen, std::memory_order_acquire);
        }
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    (*body_)(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  const int nt = n_threads_;
  dispatch([&](int index) {
    const int64_t begin = n * index / nt;
    const int64_t end = n * (index + 1) / nt;
    if (begin < end) fn(begin, end, index);
  });
}

void ThreadPool::parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  if (n_threads_ == 1 || n <= chunk) {
    fn(0, n, 0);
    return;
  }
  next_chunk_.store(0, std::memory_order_relaxed);
  dispatch([&](int index) {
    for (;;) {
      const int64_t begin = next_chunk_.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= n) break;
      fn(begin, std::min(n, begin + chunk), index);
    }
  });
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) { dispatch(fn); }

}  // namespace step35
