// A persistent pool of worker threads: parallel_for splits [0, n) into contiguous
// chunks, one per thread, and blocks until all are done. No threads are created per call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
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
  // fn(begin, end, thread_index) over a static split of [0, n). Calls are serialised.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace step35
