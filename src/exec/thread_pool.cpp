#include "exec/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

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

// Spins until done() or until limit_ns have passed; returns done()'s last value (false:
// the caller should sleep now).
//
// It yields the core now and then. When more threads want the cores than there are (two
// pools on one machine, a test run with ctest -j, a build beside a server), a spinning
// thread otherwise holds its core for the scheduler's whole time slice while the thread
// it waits for, of its own pool or another, sits descheduled: two 2-thread processes on 2
// cores ran 30-60x slower than one after the other. But a yield costs ~1 µs even when
// nothing else is runnable, and a spinner inside one sees its flag that much later: a
// yield every 1-2 µs cost 4-5 % of a quiet machine's decode speed. So the interval adapts
// per thread (yield_every_ns): after a yield that took long (another thread had the core)
// the next comes kMinYieldEveryNs later; after a quick one the interval doubles, up to
// kMaxYieldEveryNs. A yield that took a whole time slice went to a thread that does not
// yield back (a busy process beside us): yielding again would give it another slice, so
// the spin ends there and the thread sleeps; a wake-up then gets the core at once.
constexpr uint64_t kMinYieldEveryNs = 5'000;
constexpr uint64_t kMaxYieldEveryNs = 20'000;
constexpr uint64_t kYieldTookTheCoreNs = 5'000;
constexpr uint64_t kYieldTookASliceNs = 500'000;
// How long the caller spins for the workers' end of a section before it sleeps.
constexpr uint64_t kCallerSpinNs = 200'000;

template <class Done>
bool spin_until(Done&& done, uint64_t limit_ns, uint64_t& yield_every_ns) {
  if (done()) return true;
  const uint64_t t0 = now_ns();
  uint64_t next_yield = t0 + yield_every_ns;
  for (uint32_t spins = 1;; ++spins) {
    STEP35_CPU_RELAX();
    if (done()) return true;
    if (spins % 64 == 0) {
      const uint64_t t = now_ns();
      if (t - t0 >= limit_ns) return false;
      if (t >= next_yield) {
        std::this_thread::yield();
        const uint64_t after = now_ns(), took = after - t;
        if (took >= kYieldTookASliceNs) return done();
        yield_every_ns = took >= kYieldTookTheCoreNs ? kMinYieldEveryNs : std::min(yield_every_ns * 2, kMaxYieldEveryNs);
        next_yield = after + yield_every_ns;
      }
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(n_threads < 1 ? 1 : n_threads), shares_(new Share[size_t(n_threads_)]) {
  for (int i = 0; i < n_threads_; ++i) shares_[size_t(i)].yield_every_ns = kMaxYieldEveryNs;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

// Runs body(thread_index) on every thread (the caller is thread 0) and returns when all
// are done. Workers observe a new generation, run, and count `pending_` down; the caller
// spins on it for a short while (sections are short and a worker is usually microseconds
// behind) and then sleeps on it. Spinning longer hurts when the cores are shared: the
// worker being waited for may be descheduled, and every core spent spinning delays it.
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
  if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; }, kCallerSpinNs,
                  shares_[0].yield_every_ns)) {
    // Dekker-style handshake with the worker that counts down to zero: either it sees
    // `caller_sleeping_` and wakes us, or we see its zero and do not sleep (both sides
    // seq_cst).
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    for (int left; (left = pending_.load(std::memory_order_seq_cst)) != 0;) pending_.wait(left, std::memory_order_seq_cst);
    caller_sleeping_.store(false, std::memory_order_relaxed);
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
      spin_until([&] { return (g = generation_.load(std::memory_order_acquire)) != seen; }, spin_ns,
                 shares_[size_t(index)].yield_every_ns);
      while ((g = generation_.load(std::memory_order_acquire)) == seen) generation_.wait(seen, std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    (*body_)(index);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 && caller_sleeping_.load(std::memory_order_seq_cst))
      pending_.notify_one();
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

namespace {

// Takes one item of a share packed as front << 32 | end: the front one (the owner walking
// its share) or the back one (a thief); -1 when the share is empty.
int64_t take_item(std::atomic<uint64_t>& fe, bool from_back) {
  uint64_t v = fe.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t f = v >> 32, e = v & 0xffffffffu;
    if (f >= e) return -1;
    const uint64_t next = from_back ? (f << 32 | (e - 1)) : ((f + 1) << 32 | e);
    if (fe.compare_exchange_weak(v, next, std::memory_order_relaxed)) return int64_t(from_back ? e - 1 : f);
  }
}

}  // namespace

void ThreadPool::parallel_stealing(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    for (int64_t c = 0; c < n; ++c) fn(c, 0);
    return;
  }
  if (n > int64_t(0xffffffff)) throw std::length_error("parallel_stealing: more than 2^32 - 1 items");
  const int nt = n_threads_;
  for (int i = 0; i < nt; ++i) {
    const uint64_t b = uint64_t(n * i / nt), e = uint64_t(n * (i + 1) / nt);
    shares_[size_t(i)].front_end.store(b << 32 | e, std::memory_order_relaxed);
  }
  dispatch([&](int index) {
    std::atomic<uint64_t>& own = shares_[size_t(index)].front_end;
    for (;;) {
      int64_t c = take_item(own, false);
      if (c < 0) {
        // Steal from the back of the share with the most items left.
        int victim = -1;
        uint64_t most = 0;
        for (int j = 0; j < nt; ++j) {
          const uint64_t v = shares_[size_t(j)].front_end.load(std::memory_order_relaxed);
          const uint64_t f = v >> 32, e = v & 0xffffffffu;
          if (e > f && e - f > most) most = e - f, victim = j;
        }
        if (victim < 0) return;
        c = take_item(shares_[size_t(victim)].front_end, true);
        if (c < 0) continue;  // emptied meanwhile: look again
      }
      fn(c, index);
    }
  });
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) { dispatch(fn); }

}  // namespace step35
