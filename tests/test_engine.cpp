// The continuous-batching engine: results equal single-sequence runs whatever runs beside
// them; cancellation, timeouts, limits, prefix reuse and KV accounting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <condition_variable>
#include <future>
#include <mutex>

#include "model/session.h"
#include "model/step35.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "exec/thread_pool.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

const Model& model() {
  static std::unique_ptr<Model> m = [] {
    Model::LoadOptions o;
    o.verbose = false;
    return Model::load(fixture_model("tiny-a-q4_k_m.gguf"), o);
  }();
  return *m;
}

std::vector<int32_t> prompt(int n, int seed) {
  std::vector<int32_t> p = {0};
  const std::vector<int32_t> rest = lcg_tokens(n - 1, uint32_t(seed) * 2654435761u + 7, 500);
  p.insert(p.end(), rest.begin(), rest.end());
  return p;
}

std::vector<int32_t> greedy_alone(const std::vector<int32_t>& p, int n) {
  ThreadPool pool(1);
  Session s(model(), 512, 512);
  std::vector<float> logits;
  s.forward(p.data(), int32_t(p.size()), false, logits, pool);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = Sampler::argmax(logits.data(), logits.size());
    if (model().tokenizer().is_eog(next)) break;
    out.push_back(next);
    if (i + 1 < n) s.forward(&next, 1, false, logits, pool);
  }
  return out;
}

// Collects one request's events.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool done = false;
  GenerateEvent final_event;
  int stop_after = -1;  // answer Cancel (or `stop_reply`) after this many tokens
  SinkReply stop_reply = SinkReply::Cancel;

  EventSink sink() {
    return [this](const GenerateEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.done) {
        done = true;
        final_event = ev;
        cv.notify_all();
        return SinkReply::Continue;
      }
      tokens.push_back(ev.token);
      if (stop_after >= 0 && int(tokens.size()) >= stop_after) {
        if (stop_reply == SinkReply::Cancel) {  // no final event follows a Cancel
          done = true;
          final_event.reason = FinishReason::Cancelled;
          cv.notify_all();
        }
        return stop_reply;
      }
      return SinkReply::Continue;
    };
  }
  bool wait(double seconds = 60) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; });
  }
};

GenerateRequest greedy_request(const std::vector<int32_t>& p, int max_tokens) {
  GenerateRequest r;
  r.prompt = p;
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

EngineOptions options(int parallel) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 256;
  o.n_parallel = parallel;
  o.n_batch = 64;
  o.max_queue = 32;
  return o;
}

void wait_idle(Engine& e) {
  for (int i = 0; i < 500; ++i) {
    const EngineStats s = e.stats();
    if (s.running == 0 && s.queue_depth == 0 && s.kv_blocks_used == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(Engine, GreedyEqualsSingleSequenceAloneAndWithEightOthers) {
  const int n = 24;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 9; ++i) prompts.push_back(prompt(5 + 9 * i, i + 1));  // 5 .. 77 tokens (window 16)
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(greedy_alone(p, n));

  auto engine = make_engine(model(), options(4));  // 9 requests, 4 at a time: queueing too
  {
    Collector alone;
    engine->submit(greedy_request(prompts[0], n), alone.sink());
    ASSERT_TRUE(alone.wait());
    EXPECT_EQ(alone.tokens, expected[0]);
  }
  std::vector<std::unique_ptr<Collector>> cs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    cs.push_back(std::make_unique<Collector>());
    engine->submit(greedy_request(prompts[i], n), cs.back()->sink());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(cs[i]->wait()) << i;
    EXPECT_EQ(cs[i]->tokens, expected[i]) << "request " << i;
    EXPECT_EQ(cs[i]->final_event.n_generated, int(expected[i].size()) + (int(expected[i].size()) < n ? 1 : 0));
  }
  wait_idle(*engine);
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.requests_submitted, 10u);
  EXPECT_GT(s.mean_distinct_experts, 0);
  EXPECT_GT(s.router_entropy, 0);
  EXPECT_GT(s.expert_skew, 1.0);
}

TEST(Engine, PrefixCacheReusesPromptBlocks) {
  auto engine = make_engine(model(), options(2));
  const auto p = prompt(100, 42);
  const auto expected = greedy_alone(p, 8);
  Collector a, b;
  engine->submit(greedy_request(p, 8), a.sink());
  ASSERT_TRUE(a.wait());
  EXPECT_EQ(a.final_event.n_cached, 0);
  engine->submit(greedy_request(p, 8), b.sink());
  ASSERT_TRUE(b.wait());
  EXPECT_EQ(a.tokens, expected);
  EXPECT_EQ(b.tokens, expected);
  EXPECT_EQ(b.final_event.n_cached, 96);  // whole 32-position blocks, short of the last token
  // A prompt sharing only the first 40 tokens reuses one block.
  auto q = p;
  for (size_t i = 40; i < q.size(); ++i) q[i] = 7;
  Collector c;
  engine->submit(greedy_request(q, 8), c.sink());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.final_event.n_cached, 32);
  EXPECT_EQ(c.tokens, greedy_alone(q, 8));
  wait_idle(*engine);
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.prefix_hits, 2u);
  EXPECT_EQ(s.prompt_tokens_cached, 128u);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_GT(s.kv_blocks_cached, 0);
}

TEST(Engine, CancelTimeoutAndClosedSinkReleaseEverything) {
  auto engine = make_engine(model(), options(2));
  Collector cancelled, timed_out, closed;
  GenerateRequest long_req = greedy_request(prompt(20, 3), 200);
  long_req.ignore_eos = true;
  const uint64_t id = engine->submit(long_req, cancelled.sink());
  GenerateRequest t = long_req;
  // Far shorter than its generation takes, even with fast kernels (the tiny model makes
  // 200 tokens in tens of milliseconds).
  t.timeout_s = 0.01;
  t.max_tokens = -1;  // until the context is full
  engine->submit(t, timed_out.sink());
  closed.stop_after = 3;
  engine->submit(long_req, closed.sink());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  engine->cancel(id);
  ASSERT_TRUE(cancelled.wait());
  ASSERT_TRUE(timed_out.wait());
  ASSERT_TRUE(closed.wait());
  EXPECT_EQ(cancelled.final_event.reason, FinishReason::Cancelled);
  EXPECT_EQ(timed_out.final_event.reason, FinishReason::Timeout);
  EXPECT_EQ(closed.tokens.size(), 3u);
  wait_idle(*engine);
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.requests_finished[int(FinishReason::Cancelled)], 2u);
  EXPECT_EQ(s.requests_finished[int(FinishReason::Timeout)], 1u);
}

// A sink answering Stop ends the request at that token: nothing more is generated or
// counted, the final event still comes, and the engine counts it as a stop (a stop string).
TEST(Engine, SinkStopEndsAtOnceAsStop) {
  auto engine = make_engine(model(), options(2));
  Collector stopped;
  stopped.stop_after = 5;
  stopped.stop_reply = SinkReply::Stop;
  GenerateRequest r = greedy_request(prompt(20, 3), 200);
  r.ignore_eos = true;
  engine->submit(r, stopped.sink());
  ASSERT_TRUE(stopped.wait());
  EXPECT_EQ(stopped.final_event.reason, FinishReason::Stop);
  EXPECT_EQ(stopped.final_event.n_generated, 5);
  EXPECT_EQ(stopped.tokens.size(), 5u);
  wait_idle(*engine);
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.generated_tokens, 5u);
  EXPECT_EQ(s.requests_finished[int(FinishReason::Stop)], 1u);
  EXPECT_EQ(s.requests_finished[int(FinishReason::Cancelled)], 0u);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

// min_tokens: no end-of-generation token before that many tokens. A bias pushing the EOG
// token to the top makes the request end at once without it, and exactly after min_tokens
// with it.
TEST(Engine, MinTokensHoldsBackEndOfGeneration) {
  auto engine = make_engine(model(), options(2));
  const int32_t eog = model().tokenizer().eog_ids().at(0);
  GenerateRequest r = greedy_request(prompt(12, 4), 50);
  r.sampling.logit_bias = {{eog, 1000.0f}};
  Collector free_run, held;
  engine->submit(r, free_run.sink());
  ASSERT_TRUE(free_run.wait());
  EXPECT_EQ(free_run.final_event.reason, FinishReason::Stop);
  EXPECT_EQ(free_run.tokens.size(), 0u);
  r.min_tokens = 6;
  engine->submit(r, held.sink());
  ASSERT_TRUE(held.wait());
  EXPECT_EQ(held.final_event.reason, FinishReason::Stop);
  EXPECT_EQ(held.tokens.size(), 6u);
  for (int32_t t : held.tokens) EXPECT_FALSE(model().tokenizer().is_eog(t));
}

TEST(Engine, LimitsAreEnforcedAtSubmit) {
  EngineOptions o = options(1);
  o.max_queue = 1;
  auto engine = make_engine(model(), o);
  EXPECT_THROW(engine->submit(greedy_request(prompt(300, 1), 4), nullptr), RequestError);  // > n_ctx 256
  EXPECT_THROW(engine->submit(greedy_request({}, 4), nullptr), RequestError);
  EXPECT_THROW(engine->submit(greedy_request({0, 100000}, 4), nullptr), RequestError);
  GenerateRequest small_ctx = greedy_request(prompt(40, 1), 4);
  small_ctx.n_ctx = 32;
  EXPECT_THROW(engine->submit(small_ctx, nullptr), RequestError);
  // Prompt + max_tokens beyond the context: refused up front, naming both numbers.
  try {
    engine->submit(greedy_request(prompt(10, 1), 247), nullptr);
    ADD_FAILURE() << "10 + 247 tokens accepted with a context of 256";
  } catch (const RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("is 257 tokens, more than the context of 256"), std::string::npos) << e.what();
  }
  // One running + one queued fill it; the next is refused.
  std::vector<std::unique_ptr<Collector>> cs;
  int accepted = 0, refused = 0;
  for (int i = 0; i < 6; ++i) {
    cs.push_back(std::make_unique<Collector>());
    GenerateRequest r = greedy_request(prompt(10, i), 50);
    r.ignore_eos = true;
    try {
      engine->submit(r, cs.back()->sink());
      ++accepted;
    } catch (const QueueFullError&) {
      ++refused;
      cs.back()->done = true;
    }
  }
  EXPECT_GE(refused, 1);
  EXPECT_GE(accepted, 2);
  for (auto& c : cs) ASSERT_TRUE(c->wait());
}

TEST(Engine, MaxTokensContextAndPerRequestContext) {
  auto engine = make_engine(model(), options(2));
  Collector len, ctx;
  GenerateRequest r = greedy_request(prompt(10, 5), 7);
  r.ignore_eos = true;
  engine->submit(r, len.sink());
  GenerateRequest c = greedy_request(prompt(10, 5), -1);
  c.ignore_eos = true;
  c.n_ctx = 24;
  engine->submit(c, ctx.sink());
  ASSERT_TRUE(len.wait());
  ASSERT_TRUE(ctx.wait());
  EXPECT_EQ(len.final_event.reason, FinishReason::Length);
  EXPECT_EQ(len.tokens.size(), 7u);
  EXPECT_EQ(ctx.final_event.reason, FinishReason::Context);
  EXPECT_EQ(ctx.tokens.size(), 14u);  // positions 10 .. 23
}

TEST(Engine, AdaptiveExpertsUseFewerExpertsAndSayHowMany) {
  auto engine = make_engine(model(), options(2));
  Collector strict, adaptive;
  GenerateRequest a = greedy_request(prompt(30, 9), 16);
  a.ignore_eos = true;
  engine->submit(a, strict.sink());
  ASSERT_TRUE(strict.wait());
  EXPECT_EQ(engine->stats().adaptive_tokens, 0u);
  a.expert_policy = ExpertPolicy::Adaptive;
  a.adaptive_mass = 0.5f;
  a.adaptive_min_k = 1;
  engine->submit(a, adaptive.sink());
  ASSERT_TRUE(adaptive.wait());
  const EngineStats s = engine->stats();
  EXPECT_GT(s.adaptive_tokens, 0u);
  EXPECT_GE(s.adaptive_mean_k, 1.0);
  EXPECT_LT(s.adaptive_mean_k, 4.0);  // tiny-a routes top-4
}

TEST(Engine, MtpSpeculationKeepsGreedyOutputs) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(prompt(6 + 11 * i, 20 + i));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(greedy_alone(p, 20));
  for (bool adaptive : {false, true}) {
    EngineOptions o = options(3);
    o.mtp = 2;
    o.mtp_adaptive = adaptive;
    auto engine = make_engine(model(), o);
    std::vector<std::unique_ptr<Collector>> cs;
    for (const auto& p : prompts) {
      cs.push_back(std::make_unique<Collector>());
      engine->submit(greedy_request(p, 20), cs.back()->sink());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(cs[i]->wait()) << i;
      EXPECT_EQ(cs[i]->tokens, expected[i]) << "request " << i << (adaptive ? " auto" : " k=2");
    }
    wait_idle(*engine);
    const EngineStats s = engine->stats();
    EXPECT_EQ(s.kv_blocks_used, 0);
    if (!adaptive) {
      EXPECT_GT(s.mtp_steps, 0u);
      EXPECT_GT(s.mtp_drafted[1], 0u);
    }
  }
}

TEST(Engine, ShutdownEndsEveryRequest) {
  auto engine = make_engine(model(), options(1));
  std::vector<std::unique_ptr<Collector>> cs;
  for (int i = 0; i < 4; ++i) {
    cs.push_back(std::make_unique<Collector>());
    GenerateRequest r = greedy_request(prompt(10, i), 240);  // all the context there is
    r.ignore_eos = true;
    engine->submit(r, cs.back()->sink());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  engine->shutdown();
  for (auto& c : cs) {
    ASSERT_TRUE(c->wait(5));
    EXPECT_EQ(c->final_event.reason, FinishReason::Cancelled);
  }
  EXPECT_THROW(engine->submit(greedy_request(prompt(5, 1), 2), nullptr), QueueFullError);
}

// Issue 7: a low_latency prompt is not merged into a pass over other work; it runs alone
// in the first step that can see it, and prompt chunks beside running decodes stay small.
TEST(Engine, LowLatencyPromptRunsAloneInTheNextStep) {
  std::mutex mu;
  std::vector<StepTrace> traces;
  EngineOptions o = options(4);
  o.n_batch = 256;
  o.on_step = [&](const StepTrace& t) {
    std::lock_guard<std::mutex> lock(mu);
    traces.push_back(t);
  };
  auto engine = make_engine(model(), o);
  Collector decoding, long_a, long_b, urgent;
  GenerateRequest first = greedy_request(prompt(8, 1), 60);
  first.ignore_eos = true;
  engine->submit(first, decoding.sink());
  for (int i = 0; i < 1000; ++i) {  // until it decodes
    {
      std::lock_guard<std::mutex> lock(decoding.mu);
      if (decoding.tokens.size() >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  GenerateRequest la = greedy_request(prompt(200, 2), 10), lb = greedy_request(prompt(180, 3), 10);
  la.ignore_eos = lb.ignore_eos = true;
  engine->submit(la, long_a.sink());
  engine->submit(lb, long_b.sink());
  const std::vector<int32_t> ll_prompt = prompt(20, 4);
  GenerateRequest ll = greedy_request(ll_prompt, 5);
  ll.priority = Priority::LowLatency;
  const uint64_t ll_id = engine->submit(ll, urgent.sink());
  for (Collector* c : {&decoding, &long_a, &long_b, &urgent}) ASSERT_TRUE(c->wait());
  EXPECT_EQ(urgent.tokens, greedy_alone(ll_prompt, 5));

  std::lock_guard<std::mutex> lock(mu);
  bool saw_ll = false, mixed = false;
  for (const StepTrace& t : traces) {
    int32_t prefill_tokens = 0, decodes = 0;
    for (const auto& c : t.chunks) c.prefill ? prefill_tokens += c.n_tokens : ++decodes;
    if (decodes > 0 && prefill_tokens > 0) mixed = true;
    if (decodes > 0) {
      EXPECT_LE(prefill_tokens, 32) << "prompt chunks beside decodes";
    }
    if (!saw_ll && t.newest_request_id >= ll_id) {
      saw_ll = true;
      ASSERT_EQ(t.chunks.size(), 1u) << "the low_latency prompt shares its step";
      EXPECT_EQ(t.chunks[0].request_id, ll_id);
      EXPECT_TRUE(t.chunks[0].prefill);
      EXPECT_EQ(t.chunks[0].n_tokens, int32_t(ll_prompt.size()));
    }
  }
  EXPECT_TRUE(saw_ll);
  EXPECT_TRUE(mixed);  // the long prompts did run beside the decoding request, in small chunks
}

TEST(Engine, WarmUpRunsBeforeTheFirstRequestAndLeavesNoTrace) {
  EngineOptions o = options(2);
  o.warm_up = true;
  std::atomic<int> steps_seen{0};
  o.on_step = [&](const StepTrace&) { ++steps_seen; };  // requests' steps only
  auto engine = make_engine(model(), o);
  EngineStats s = engine->stats();
  EXPECT_EQ(s.steps, 0u);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(steps_seen.load(), 0);
  const std::vector<int32_t> p = prompt(12, 9);
  Collector c;
  engine->submit(greedy_request(p, 8), c.sink());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.tokens, greedy_alone(p, 8));
  wait_idle(*engine);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  EXPECT_GT(steps_seen.load(), 0);
}

}  // namespace

// on_idle runs once each time the scheduler runs out of work: not before the first request,
// once after it, not again while nothing happens, once more after the next request.
TEST(Engine, OnIdleRunsOncePerIdlePeriod) {
  std::atomic<int> calls{0};
  EngineOptions o = options(2);
  o.on_idle = [&calls] { ++calls; };
  auto engine = make_engine(model(), o);
  auto settle = [&] {
    for (int i = 0; i < 200 && calls == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  };
  settle();
  const int at_start = calls;
  EXPECT_LE(at_start, 1);  // (an engine that starts with nothing to do may report it once)
  for (int round = 1; round <= 2; ++round) {
    Collector c;
    engine->submit(greedy_request(prompt(20, round), 4), c.sink());
    ASSERT_TRUE(c.wait());
    wait_idle(*engine);
    for (int i = 0; i < 200 && calls < at_start + round; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(calls, at_start + round);
  }
}
