// A persistent pool of worker threads for the forward pass. A decode step issues a few
// hundred short parallel sections (one per fused matrix product or attention pass), so
// waking workers must cost well under a microsecond: workers spin on an atomic
// generation counter for a while after each section and only then sleep (futex via
// std::atomic::wait). The calling thread always takes part as worker 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace step35 {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1 (the caller's thread counts as one)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // fn(begin, end, thread_index) over a static, contiguous split of [0, n) into one range
  // per thread. Blocks until all ranges are done. Calls are serialised.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  // fn(begin, end, thread_index) over [0, n) in chunks of `chunk` taken dynamically
  // (an atomic counter), so a thread that is descheduled or has slower rows does not hold
  // the others up. Any chunk may run on any thread: fn's result must not depend on it.
  void parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int)>& fn);

  // fn(thread_index) once on every thread.
  void run_on_all(const std::function<void(int)>& fn);

  // How long an idle worker spins before sleeping (default 200 µs; 0 = sleep at once).
  void set_spin_us(int us) { spin_us_.store(us, std::memory_order_relaxed); }

 private:
  void dispatch(const std::function<void(int)>& body);
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* body_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // bumped once per section; workers wait on it
  std::atomic<int> pending_{0};          // workers still running the current section
  std::atomic<bool> stop_{false};
  std::atomic<int> spin_us_{200};
  std::atomic<int64_t> next_chunk_{0};
};

}  // namespace step35
