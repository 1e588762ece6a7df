#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "runtime/thread_pool.h"

using step35::ThreadPool;

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(2), int64_t(7), int64_t(1000)}) {
      std::vector<std::atomic<int>> hits(size_t(n > 0 ? n : 1));
      pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, threads);
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, ManySmallJobsReuseTheSameThreads) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int iter = 0; iter < 20000; ++iter)
    pool.parallel_for(4, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 80000);
}

TEST(ThreadPool, ZeroOrNegativeThreadsMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.n_threads(), 1);
}
