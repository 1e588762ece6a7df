// A persistent pool of worker threads for the forward pass. A decode step issues a few
// hundred short parallel sections (one per fused matrix product or attention pass), so
// waking workers must cost well under a microsecond: workers spin on an atomic
// generation counter for a while after each section and only then sleep (futex via
// std::atomic::wait). The calling thread always takes part as worker 0; it waits for the
// workers' end of a section the same way, spinning briefly, then sleeping. Spinning
// threads yield the core now and then, so that a pool sharing the cores with other busy
// threads (two servers on one machine, a test run with ctest -j) does not hold the core
// that a descheduled thread of its own, or of the other process, needs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
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

  // fn(item, thread_index) for every item in [0, n): each thread walks its own contiguous
  // share front to back, and a thread that runs out takes items from the back of the
  // share with the most left, so a descheduled or slower thread does not hold the others
  // up. Consecutive items are usually adjacent in memory (row chunks of one matrix): a
  // thread's reads then stay one sequential stream that its prefetches run ahead of, which
  // handing out items round-robin from one counter breaks at every item. Any item may
  // run on any thread: fn's result must not depend on it.
  void parallel_stealing(int64_t n, const std::function<void(int64_t, int)>& fn);

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
  std::atomic<bool> caller_sleeping_{false};  // the caller waits on pending_ in the kernel
  std::atomic<bool> stop_{false};
  std::atomic<int> spin_us_{200};
  // Per thread, on its own cache line: its parallel_stealing share as (front << 32 | end),
  // and how long it spins between yields (thread_pool.cpp, spin_until).
  struct alignas(64) Share {
    std::atomic<uint64_t> front_end{0};
    uint64_t yield_every_ns = 0;  // set by the constructor
  };
  std::unique_ptr<Share[]> shares_;
};

}  // namespace step35
