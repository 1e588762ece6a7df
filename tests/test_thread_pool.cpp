#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "exec/thread_pool.h"

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

// parallel_stealing: every item exactly once, whatever the thread count and however uneven
// the items' costs; a thread whose own share is slow gets helped from its back end, and
// each thread otherwise walks its share in ascending order.
TEST(ThreadPool, StealingRunsEveryItemOnceAndBalances) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(2), int64_t(5), int64_t(333)}) {
      int helped_rounds = 0;
      for (int round = 0; round < 10; ++round) {
        std::vector<std::atomic<int>> hits(size_t(n > 0 ? n : 1));
        std::vector<std::vector<int64_t>> order(static_cast<size_t>(threads));
        const int64_t first_share = n / threads;
        pool.parallel_stealing(n, [&](int64_t i, int t) {
          ASSERT_GE(t, 0);
          ASSERT_LT(t, threads);
          hits[size_t(i)]++;
          order[size_t(t)].push_back(i);
          // The first share is expensive: the other threads should take some of it.
          // (Sleeping, not spinning: on a busy machine the other threads get the core.)
          if (i < first_share) std::this_thread::sleep_for(std::chrono::microseconds(30));
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
        // Thread 0 walks its own share front to back.
        int64_t last = -1, own = 0;
        for (int64_t i : order[0]) {
          if (i >= first_share) continue;
          ASSERT_GT(i, last);
          last = i;
          ++own;
        }
        helped_rounds += own < first_share;
      }
      // Others took items of the slow share (in at least one round: a loaded machine may
      // start the workers late now and then).
      if (threads > 1 && n == 333) {
        EXPECT_GT(helped_rounds, 0);
      }
    }
  }
}

// A section whose worker takes much longer than the caller spins (200 µs) makes the caller
// sleep until the last worker wakes it; and a pool idle longer than the workers spin puts
// them to sleep until the next section. Every section must still end, with every range
// run once (a lost wake-up would hang here until ctest's timeout).
TEST(ThreadPool, SlowWorkersWakeASleepingCallerAndIdleWorkersWakeUp) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> done{0};
    for (int round = 0; round < 60; ++round) {
      const int slow = 1 + round % (threads - 1);
      pool.parallel_for(threads, [&](int64_t b, int64_t e, int t) {
        if (t == slow) std::this_thread::sleep_for(std::chrono::microseconds(round % 2 ? 600 : 50));
        done += e - b;
      });
      if (round % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(done.load(), 60 * threads);
  }
}

// Two pools whose threads outnumber the cores (here: each pool as many threads as the
// machine has cores, both busy at once), as two servers on one machine or ctest -j are:
// both finish, every section complete.
TEST(ThreadPool, TwoOversubscribedPoolsBothFinish) {
  const int threads = std::max(2, int(std::thread::hardware_concurrency()));
  std::atomic<int64_t> sums[2] = {0, 0};
  auto run = [&](int which) {
    ThreadPool pool(threads);
    for (int iter = 0; iter < 3000; ++iter)
      pool.parallel_for(64, [&](int64_t b, int64_t e, int) { sums[which] += e - b; });
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  EXPECT_EQ(sums[0].load(), 3000 * 64);
  EXPECT_EQ(sums[1].load(), 3000 * 64);
}
