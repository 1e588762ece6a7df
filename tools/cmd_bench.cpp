// step35 bench: prompt processing (pp) and text generation (tg) speed in the way
// llama-bench measures them, the machine's memory read bandwidth, and the decode roofline
// (active weight bytes per token / bandwidth).
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "ep_options.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "exec/thread_pool.h"
#include "model/session.h"
#include "tensor/kernels.h"

namespace step35::cli {

namespace {

struct Stat {
  double mean = 0, stddev = 0;
};

Stat stats_of(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

std::vector<int64_t> parse_list(const std::string& s, const char* what, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < lo || v > hi)
      throw UsageError(std::string(what) + " expects integers in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "] separated by commas, got '" + s + "'");
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

size_t peak_rss_bytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;
}

// Read bandwidth with n threads: each sums its share of a buffer far larger than the
// caches; best of `reps` passes (the first pass, which faults the pages in, is not timed).
double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
  pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[size_t(i)] = uint64_t(i);
  });
  std::vector<uint64_t> sink(size_t(pool.n_threads()) * 8, 0);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_seconds();
    pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int th) {
      // Eight independent sums so the loop is bound by loads, not by an add chain.
      uint64_t s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = b;
      for (; i + 8 <= e; i += 8)
        for (int k = 0; k < 8; ++k) s[k] += buf[size_t(i + k)];
      for (; i < e; ++i) s[0] += buf[size_t(i)];
      for (int k = 0; k < 8; ++k) sink[size_t(th) * 8 + size_t(k)] += s[k];
    });
    const double dt = now_seconds() - t0;
    best = std::max(best, double(n * sizeof(uint64_t)) / dt);
  }
  uint64_t total = 0;
  for (uint64_t x : sink) total += x;
  if (total == 42) std::fprintf(stderr, " ");  // keeps the sums observable
  return best;
}

std::string human_bytes(double b) {
  char buf[64];
  if (b >= double(1 << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1 << 20));
  return buf;
}

std::string model_type_label(const Model& m) {
  const auto ft = m.file().find("general.file_type");
  // llama.cpp's LLAMA_FTYPE numbering for the common mixes.
  if (ft && ft->is_integer()) {
    switch (ft->u) {
      case 0: return "F32";
      case 1: return "F16";
      case 7: return "Q8_0";
      case 2: return "Q4_0";
      case 14: return "Q4_K_S";
      case 15: return "Q4_K_M";
      case 16: return "Q5_K_S";
      case 17: return "Q5_K_M";
      case 18: return "Q6_K";
      case 32: return "BF16";
      default: break;
    }
  }
  return dtype_name(m.layer(0).attn_q.type);
}


// Batched decoding through the serving engine (the path `step35 serve` uses): N sequences
// with random prompts submitted at once, each generating n_gen tokens greedily with EOS
// ignored. "total" counts every generated token over the whole wall time (prompts
// included); "decode" counts the tokens produced after the last sequence got its first
// token, over that window, i.e. the steady batched-decode rate.
struct ParallelResult {
  double total_tps = 0, decode_tps = 0, distinct_experts = 0;
};

ParallelResult bench_parallel_once(Engine& engine, int32_t n_seq, int32_t n_prompt, int32_t n_gen, int32_t n_vocab,
                                   std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok_dist(0, n_vocab - 1);
  std::mutex mu;
  std::condition_variable cv;
  int32_t n_done = 0;
  std::string error;
  std::vector<std::vector<double>> times(static_cast<size_t>(n_seq));
  const double t0 = now_seconds();
  for (int32_t s = 0; s < n_seq; ++s) {
    GenerateRequest req;
    req.prompt.resize(size_t(n_prompt));
    for (auto& t : req.prompt) t = tok_dist(rng);
    req.max_tokens = n_gen;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    std::vector<double>* my_times = &times[size_t(s)];
    engine.submit(std::move(req), [&, my_times](const GenerateEvent& ev) {
      if (!ev.done) {
        my_times->push_back(now_seconds());
        return SinkReply::Continue;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (ev.reason == FinishReason::Error) error = ev.error;
      ++n_done;
      cv.notify_all();
      return SinkReply::Continue;
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return n_done == n_seq; });
  }
  if (!error.empty()) throw std::runtime_error("batched decoding failed: " + error);
  double t_end = t0, last_first = t0;
  int64_t n_total = 0;
  for (const auto& v : times) {
    if (v.empty()) continue;
    n_total += int64_t(v.size());
    t_end = std::max(t_end, v.back());
    last_first = std::max(last_first, v.front());
  }
  int64_t n_decode = 0;
  for (const auto& v : times)
    for (double t : v) n_decode += t > last_first;
  ParallelResult r;
  r.total_tps = t_end > t0 ? double(n_total) / (t_end - t0) : 0.0;
  r.decode_tps = t_end > last_first ? double(n_decode) / (t_end - last_first) : 0.0;
  r.distinct_experts = engine.stats().mean_distinct_experts;
  return r;
}

// f(i) for each draft position i = 1 .. kMaxDrafts.
template <typename F>
nlohmann::json by_draft_position(F f) {
  nlohmann::json a = nlohmann::json::array();
  for (int32_t i = 1; i <= kMaxDrafts; ++i) a.push_back(f(i));
  return a;
}

// bench's settings, with their defaults.
struct BenchSettings {
  std::string model, n_prompt = "512", n_gen = "128", n_depth = "0", threads = std::to_string(default_threads());
  std::string mtp = "0", expert_policy = "strict", parallel, mtp_model, mem_budget;
  int32_t repetitions = 5, n_batch = GeneratorOptions{}.n_batch, membw_mib = 1024, parallel_prompt = 16;
  double synthetic_accept = -1;  // off
  bool json = false, membw = false, exact = false, verify_cost = false;
  RoutingPolicy routing{kDefaultAdaptiveMass, kDefaultAdaptiveMinK};  // for --expert-policy adaptive
  KvTypes kv_types;
};

ArgParser bench_parser(BenchSettings& bs) {
  ArgParser p("bench",
              "Measures prompt processing (ppN: N prompt tokens in one batch) and text generation (tgN: N\n"
              "tokens one at a time) in tokens/s, from an empty context or, with -d, after DEPTH tokens already\n"
              "in the cache (\"pp512 @ d8192\"), mean +- stddev over repetitions after one warm-up run, as\n"
              "llama-bench does (routed experts the load repacks on first use are all repacked before timing,\n"
              "the steady state of a server); prints a markdown table, or JSON with --json. With --membw it\n"
              "also measures the memory read bandwidth and reports the decode roofline (active weight bytes\n"
              "per token / bandwidth) and tg as a share of it.");
  p.option("-m,--model", "FILE", "GGUF model", bs.model, "the built-in tiny model");
  add_mtp_model_flag(p, bs.mtp_model);
  add_mem_budget_flag(p, bs.mem_budget);
  p.option("-p,--n-prompt", "N", "prompt tokens, comma list, 0 = skip pp", bs.n_prompt);
  p.option("-n,--n-gen", "N", "generated tokens, comma list, 0 = skip tg", bs.n_gen);
  p.option("-t,--threads", "N", "worker threads, comma list", bs.threads, "number of cores");
  p.option("-r,--repetitions", "N", "repetitions of each test", bs.repetitions, 1, 1000);
  p.option("-b,--batch-size", "N", "prompt tokens per forward pass", bs.n_batch, 1, 1 << 16);
  p.option("-d,--n-depth", "N", "tokens already in the cache before each pp / tg test, comma list (filled once per "
           "depth, untimed), as llama-bench's -d", bs.n_depth);
  add_kv_cache_flags(p, bs.kv_types);
  p.option("--json", "one JSON object per thread count instead of the table", bs.json);
  p.option("--membw", "measure memory read bandwidth and report the decode roofline", bs.membw);
  p.option("--membw-mib", "N", "buffer size for --membw in MiB", bs.membw_mib, 64, 1 << 16);
  p.option("--exact", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)",
           bs.exact);
  p.option("--mtp", "K", "tg with MTP speculative decoding: 0.." + std::to_string(kMaxDrafts) + " drafts per step, or "
           "auto; auto also prints its probes and the cost model it learned (verify cost per K, draft cost, "
           "acceptance, predicted speed-up per K)", bs.mtp);
  p.option("--mtp-synthetic-accept", "P", "benchmark only: accept each draft with probability P (output discarded), "
           "to measure speed at a realistic acceptance with random-weight heads", bs.synthetic_accept, 0.0, 1.0, "off");
  p.option("--verify-cost", "time one trunk pass over K+1 tokens (K = 0.." + std::to_string(kMaxDrafts) + ") against a "
           "single-token step, with the distinct experts the tokens touch", bs.verify_cost);
  p.option("--parallel", "N", "batched decoding through the serving engine, like llama-batched-bench: N sequences "
           "(comma list, e.g. 1,4,8,16) with random prompts generate the first -n count (128 when -n is 0) together; "
           "prints total and steady-decode aggregate t/s, the ratio to the first N, and the distinct experts per MoE "
           "layer per step", bs.parallel);
  p.option("--parallel-prompt", "N", "prompt tokens per sequence for --parallel", bs.parallel_prompt, 1, 1 << 16);
  p.option("--expert-policy", "P", "strict (the model's top-k) or adaptive (lossy: per token the fewest top-ranked "
           "experts whose normalised router weights reach --adaptive-mass); pp/tg then run with it, and the logit "
           "drift against strict over 128 positions is printed", bs.expert_policy);
  add_adaptive_policy_flags(p, bs.routing.adaptive_mass, bs.routing.adaptive_min_k);
  add_ep_flags(p);
  return p;
}

// The settings resolved (the lists parsed, then fitted to the model): what the tests of
// every thread count share.
struct BenchPlan {
  std::vector<int64_t> n_prompt_list, n_gen_list, depth_list, threads_list;
  Precision prec = Precision::Native;
  RoutingPolicy routing;  // the strict policy unless --expert-policy adaptive
  std::string path;       // the model file
  // From the model:
  int32_t n_ctx = 0, keep_back = 0;
  std::string label;  // the table's model column: name and type
  uint64_t n_params = 0, active_bytes = 0;
  MtpSetting mtp;
  // From the command line beyond the settings:
  bool ep = false, parallel = false;  // --ep, --parallel given
  int ep_ranks = 1;
};

BenchPlan bench_plan(const BenchSettings& bs) {
  BenchPlan plan;
  plan.n_prompt_list = parse_list(bs.n_prompt, "-p", 0, 1 << 20);
  plan.n_gen_list = parse_list(bs.n_gen, "-n", 0, 1 << 20);
  plan.depth_list = parse_list(bs.n_depth, "-d", 0, 1 << 30);
  plan.threads_list = parse_list(bs.threads, "-t", 1, 1024);
  plan.prec = bs.exact ? Precision::Exact : Precision::Native;
  plan.routing = adaptive_expert_policy(bs.expert_policy) ? bs.routing : RoutingPolicy{};
  plan.path = bs.model.empty() ? builtin_tiny_model_path() : bs.model;
  return plan;
}

// The KV positions a --mem-budget keeps room for: the longest test's (before the model is
// loaded; fit_plan_to_model checks them against the model afterwards).
int64_t bench_positions(const BenchPlan& plan) {
  auto most = [](const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); };
  return most(plan.depth_list) + std::max(most(plan.n_prompt_list), most(plan.n_gen_list)) + 8;
}

// The context the tests need (UsageError beyond the model's) and the model's figures.
void fit_plan_to_model(BenchPlan& plan, const BenchSettings& bs, const Model& model) {
  const HParams& hp = model.hparams();
  const int64_t max_prompt = *std::max_element(plan.n_prompt_list.begin(), plan.n_prompt_list.end());
  const int64_t max_gen = *std::max_element(plan.n_gen_list.begin(), plan.n_gen_list.end());
  const int64_t max_depth = *std::max_element(plan.depth_list.begin(), plan.depth_list.end());
  const int64_t need = std::max<int64_t>(
      {max_depth + max_prompt, max_depth + max_gen + 4, bs.verify_cost ? 64 + kMaxDrafts + 1 : 1});
  if (need > hp.n_ctx_train)
    throw UsageError("the test needs " + std::to_string(need) + " positions" +
                     (max_depth > 0 ? " (depth " + std::to_string(max_depth) + " + the test's tokens)" : "") +
                     " but the model's context is " + std::to_string(hp.n_ctx_train));
  plan.n_ctx = int32_t(need);
  // After a test at depth D the cache is cut back to D for the next one: the sliding-window
  // blocks just behind D must still be there, so the cache keeps that many positions.
  plan.keep_back = max_depth > 0 ? int32_t(std::max(max_prompt, max_gen)) : 0;

  for (const auto& t : model.file().tensors()) plan.n_params += uint64_t(t.n_elements());
  plan.label = model.file().opt_str("general.name").value_or("step35") + " " + model_type_label(model);
  plan.active_bytes = model.active_weight_bytes_per_token();
  plan.mtp = parse_mtp(bs.mtp, model);
  if (bs.synthetic_accept >= 0 && plan.mtp.max_k == 0)
    throw UsageError("--mtp-synthetic-accept needs --mtp K or auto");
  if (plan.mtp.max_k > 0 && max_depth > 0)
    throw UsageError("--mtp cannot be combined with -d (speculative tg runs from an empty context)");
}

// The random tokens every test feeds the model: one fixed-seed stream through the whole run.
struct RandomTokens {
  explicit RandomTokens(int32_t n_vocab) : dist(0, n_vocab - 1) {}
  int32_t operator()() { return dist(rng); }
  std::mt19937 rng{1234};
  std::uniform_int_distribution<int32_t> dist;
};

// Experts repacked on first use: copy the rest now, so that no timed run pays for a first
// use (a serving process is past them after its first requests).
void repack_remaining_experts(Model& model, ThreadPool& pool, bool quiet) {
  const uint64_t done = model.lazy_repacked_so_far();
  if (done >= model.lazy_repack_bytes()) return;
  const double t0 = now_seconds();
  model.prepare_all_experts(pool);
  if (!quiet)
    std::fprintf(stderr, "routed experts repacked before timing: %s in %.1f s\n",
                 human_bytes(double(model.lazy_repack_bytes() - done)).c_str(), now_seconds() - t0);
}

// The cost model the adaptive controller learned: verify cost per K, draft cost,
// acceptance, predicted speed-up per K.
nlohmann::json cost_model_json(const AdaptiveK& a, int32_t max_k) {
  const double c0 = a.verify_cost(0);
  nlohmann::json verify = nlohmann::json::array(), rel = nlohmann::json::array(), measured = nlohmann::json::array(),
                 expected = nlohmann::json::array(), speedup = nlohmann::json::array();
  for (int32_t k = 0; k <= max_k; ++k) {
    verify.push_back(a.verify_cost(k) * 1e3);
    rel.push_back(c0 > 0 ? a.verify_cost(k) / c0 : 0.0);
    measured.push_back(a.verify_measured(k));
    expected.push_back(a.expected_tokens(k));
    speedup.push_back(c0 > 0 ? a.rate(k) * c0 : 0.0);
  }
  return {{"verify_ms", verify},
          {"verify_relative", rel},
          {"verify_measured", measured},
          {"draft_ms", a.draft_cost() * 1e3},
          {"draft_relative", c0 > 0 ? a.draft_cost() / c0 : 0.0},
          {"acceptance", by_draft_position([&](int32_t i) { return a.acceptance(i); })},
          {"expected_tokens", expected},
          {"predicted_speedup", speedup},
          {"best_k", a.best_k()},
          {"probe_gap", a.probe_gap()}};
}

// What the timed repetitions of a speculative tg test did, summed; the cost model is the
// last repetition's.
struct SpeculationTotals {
  SpeculationStats stats;
  uint64_t plain_steps = 0, probes = 0, paying_probes = 0;
  nlohmann::json cost_model;

  void add(Generator& gen) {
    const SpeculationStats& st = gen.sequence().speculation_stats();
    stats.add(st);
    plain_steps += st.plain_steps;
    const AdaptiveK& a = gen.speculation()->controller();
    probes += a.probes();
    paying_probes += a.paying_probes();
    cost_model = cost_model_json(a, gen.max_k());
  }
};

// The aggregate rates of --parallel for one sequence count, over the timed repetitions.
struct ParallelStats {
  Stat total, decode, distinct_experts;
};

// How far the adaptive policy's logits are from the strict policy's over n positions.
struct LogitDrift {
  double max_abs = 0, rms = 0;
  int32_t argmax_same = 0;  // positions whose top token is the same
};

LogitDrift logit_drift(const std::vector<float>& strict_logits, const std::vector<float>& adaptive_logits, int32_t n,
                       size_t V) {
  LogitDrift drift;
  double sum_sq = 0;
  for (int32_t i = 0; i < n; ++i) {
    const float* a = strict_logits.data() + size_t(i) * V;
    const float* b = adaptive_logits.data() + size_t(i) * V;
    for (size_t v = 0; v < V; ++v) {
      const double d = double(a[v]) - double(b[v]);
      drift.max_abs = std::max(drift.max_abs, std::abs(d));
      sum_sq += d * d;
    }
    drift.argmax_same += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  drift.rms = std::sqrt(sum_sq / double(size_t(n) * V));
  return drift;
}

// The tests of one thread count, in the order they report: pp and tg at each depth, then
// --parallel, --verify-cost, --membw and the adaptive policy's drift; with --json all of
// them in one object printed at the end.
class ThreadCountBench {
 public:
  ThreadCountBench(const BenchSettings& bs, const BenchPlan& plan, Model& model, int64_t threads,
                   RandomTokens& tokens);
  void run();

 private:
  void report(std::string test, int64_t n_tok, const std::vector<double>& tps, const char* key);
  void fill_depth();
  void restart();
  void bench_pp(int64_t n_prompt);
  void bench_tg(int64_t n_gen);
  std::vector<double> time_plain_tg(int64_t n_gen);
  std::vector<double> time_speculative_tg(int64_t n_gen, SpeculationTotals& totals);
  void report_speculation(const SpeculationTotals& totals);
  void bench_parallel();
  ParallelStats time_parallel(int32_t n_seq, int32_t n_pp, int32_t n_tg);
  void bench_verify_cost();
  void bench_membw();
  void bench_policy_drift();

  const BenchSettings& bs_;
  const BenchPlan& plan_;
  Model& model_;
  const int64_t threads_;
  RandomTokens& tokens_;
  ThreadPool pool_;
  std::optional<Session> session_;  // made once the experts are repacked
  std::vector<float> logits_;
  nlohmann::json result_, all_tests_ = nlohmann::json::object();
  int64_t depth_ = 0;  // the depth of the tests being run
  double tg_mean_ = 0;  // the last tg test's, for --membw's share of the roofline
  // --mem-budget: the expert cache's counters when the current test began.
  offload::ExpertCacheStats cache_mark_;
  double tg_read_per_token_ = 0;  // the last tg test's expert bytes read per token
  void mark_expert_cache();
  void bench_disk_bound();
  nlohmann::json expert_cache_since_mark(int64_t n_tok) const;
};

void ThreadCountBench::mark_expert_cache() {
  if (const offload::ExpertCache* c = model_.expert_cache()) cache_mark_ = c->stats();
}

// The expert cache over the current test (warm-up included): hit rate, bytes read per token
// and the read bandwidth the passes saw.
nlohmann::json ThreadCountBench::expert_cache_since_mark(int64_t n_tok) const {
  const offload::ExpertCacheStats now = model_.expert_cache()->stats();
  const uint64_t hits = now.hits - cache_mark_.hits, misses = now.misses - cache_mark_.misses;
  const double bytes = double(now.bytes_read - cache_mark_.bytes_read);
  const double secs = now.read_seconds - cache_mark_.read_seconds;
  const double tokens = double(n_tok) * double(bs_.repetitions + 1);
  const uint64_t ahead = now.prefetched - cache_mark_.prefetched, used = now.prefetch_used - cache_mark_.prefetch_used,
                 wasted = now.prefetch_wasted - cache_mark_.prefetch_wasted;
  return {{"hit_rate", hits + misses ? double(hits) / double(hits + misses) : 0.0},
          {"hits", hits},
          {"misses", misses},
          {"bytes_read_per_token", tokens > 0 ? bytes / tokens : 0.0},
          {"read_bytes_per_s", secs > 0 ? bytes / secs : 0.0},
          {"prefetched", ahead},
          // Of the experts passes would have read themselves, the share read ahead; of those
          // read ahead, the share evicted before any pass asked for them.
          {"prefetch_recall", used + misses ? double(used) / double(used + misses) : 0.0},
          {"prefetch_wasted", ahead ? double(wasted) / double(ahead) : 0.0},
          {"slots", now.slots},
          {"slot_bytes", now.slot_bytes},
          {"direct_io", now.direct_io}};
}

ThreadCountBench::ThreadCountBench(const BenchSettings& bs, const BenchPlan& plan, Model& model, int64_t threads,
                                   RandomTokens& tokens)
    : bs_(bs), plan_(plan), model_(model), threads_(threads), tokens_(tokens), pool_(int(threads)) {
  repack_remaining_experts(model_, pool_, bs_.json);
  session_.emplace(model_, plan_.n_ctx, std::min<int32_t>(bs_.n_batch, plan_.n_ctx), plan_.prec, false,
                   plan_.keep_back, bs_.kv_types);
  session_->set_routing(plan_.routing);
  result_["model"] = plan_.label;
  result_["model_path"] = plan_.path;
  result_["threads"] = threads_;
  result_["isa"] = kernels::isa_name(kernels::active_isa());
  if (plan_.ep) result_["ep_ranks"] = plan_.ep_ranks;
  result_["precision"] = plan_.prec == Precision::Native ? "native" : "exact";
  result_["cache_type_k"] = dtype_name(bs_.kv_types.k);
  result_["cache_type_v"] = dtype_name(bs_.kv_types.v);
  result_["kv_cache_bytes"] = session_->cache().bytes();
}

void ThreadCountBench::run() {
  for (int64_t d : plan_.depth_list) {
    depth_ = d;
    fill_depth();
    for (int64_t n_prompt : plan_.n_prompt_list)
      if (n_prompt > 0) bench_pp(n_prompt);
    for (int64_t n_gen : plan_.n_gen_list)
      if (n_gen > 0) bench_tg(n_gen);
  }
  depth_ = 0;
  result_["tests"] = all_tests_;
  if (plan_.parallel) bench_parallel();
  if (bs_.verify_cost) bench_verify_cost();
  if (bs_.membw) bench_membw();
  if (plan_.routing.adaptive_mass > 0) bench_policy_drift();
  result_["peak_rss_bytes"] = peak_rss_bytes();
  if (bs_.json) std::printf("%s\n", result_.dump().c_str());
}

// A test's mean +- stddev: a table row, or with --json an entry of the object.
void ThreadCountBench::report(std::string test, int64_t n_tok, const std::vector<double>& tps, const char* key) {
  const Stat s = stats_of(tps);
  nlohmann::json entry = {{"tokens", n_tok}, {"tok_per_s", s.mean}, {"stddev", s.stddev}, {"samples", tps}};
  if (depth_ > 0) test += " @ d" + std::to_string(depth_);
  if (model_.expert_cache()) {
    entry["expert_cache"] = expert_cache_since_mark(n_tok);
    if (!bs_.json) {
      const nlohmann::json& c = entry["expert_cache"];
      std::fprintf(stderr, "%s: expert cache hit rate %.1f %%, %.2f MiB read per token at %.0f MB/s\n", test.c_str(),
                   100 * c["hit_rate"].get<double>(), c["bytes_read_per_token"].get<double>() / (1 << 20),
                   c["read_bytes_per_s"].get<double>() / 1e6);
    }
  }
  if (bs_.json) {
    // Every test under "tests" by its llama-bench name ("pp512", "tg64 @ d8192"); the
    // last pp / tg of the first depth also as "pp" / "tg" (as before -d existed).
    if (depth_ == plan_.depth_list.front()) result_[key] = entry;
    all_tests_[test] = entry;
    return;
  }
  std::string ep_text = plan_.ep ? ", EP x" + std::to_string(plan_.ep_ranks) : "";
  if (!(bs_.kv_types == KvTypes{}))  // as llama-bench, the cache types only when not the default
    ep_text += std::string(", KV ") + dtype_name(bs_.kv_types.k) + "/" + dtype_name(bs_.kv_types.v);
  std::printf("| %s | %s | %.2f M | CPU (%s%s) | %lld | %s | %.2f ± %.2f |\n", plan_.label.c_str(),
              human_bytes(double(model_.weight_bytes())).c_str(), double(plan_.n_params) / 1e6,
              kernels::isa_name(kernels::active_isa()), ep_text.c_str(), (long long)threads_, test.c_str(), s.mean,
              s.stddev);
  std::fflush(stdout);
}

// Fills the cache with `depth` random tokens once; each test then starts from there.
void ThreadCountBench::fill_depth() {
  if (depth_ <= 0) return;
  std::vector<int32_t> depth_tokens(static_cast<size_t>(depth_));
  for (auto& t : depth_tokens) t = tokens_();
  session_->cache().clear();
  const double t0 = now_seconds();
  session_->forward(depth_tokens.data(), int32_t(depth_), false, logits_, pool_);
  if (!bs_.json) std::fprintf(stderr, "depth %lld: filled in %.1f s\n", (long long)depth_, now_seconds() - t0);
}

// Back to the cache of the current depth.
void ThreadCountBench::restart() {
  if (depth_ > 0)
    session_->cache().truncate(int32_t(depth_));
  else
    session_->cache().clear();
}

void ThreadCountBench::bench_pp(int64_t n_prompt) {
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  std::vector<double> tps;
  mark_expert_cache();
  for (int r = 0; r <= bs_.repetitions; ++r) {  // r == 0 is the warm-up
    for (auto& t : prompt) t = tokens_();
    restart();
    const double t0 = now_seconds();
    session_->forward(prompt.data(), int32_t(n_prompt), false, logits_, pool_);
    const double dt = now_seconds() - t0;
    if (r > 0) tps.push_back(double(n_prompt) / dt);
  }
  report("pp" + std::to_string(n_prompt), n_prompt, tps, "pp");
}

void ThreadCountBench::bench_tg(int64_t n_gen) {
  SpeculationTotals spec;
  mark_expert_cache();
  const std::vector<double> tps = plan_.mtp.max_k == 0 ? time_plain_tg(n_gen) : time_speculative_tg(n_gen, spec);
  report("tg" + std::to_string(n_gen), n_gen, tps, "tg");
  tg_mean_ = stats_of(tps).mean;
  if (model_.expert_cache())
    tg_read_per_token_ = expert_cache_since_mark(n_gen)["bytes_read_per_token"].get<double>();
  if (plan_.mtp.max_k > 0) report_speculation(spec);
}

std::vector<double> ThreadCountBench::time_plain_tg(int64_t n_gen) {
  std::vector<double> tps;
  for (int r = 0; r <= bs_.repetitions; ++r) {  // r == 0 is the warm-up
    restart();
    int32_t tok = tokens_();
    const double t0 = now_seconds();
    for (int64_t i = 0; i < n_gen; ++i) {
      session_->forward(&tok, 1, false, logits_, pool_);
      tok = tokens_();  // as llama-bench: the decode cost does not depend on which token
    }
    const double dt = now_seconds() - t0;
    if (r > 0) tps.push_back(double(n_gen) / dt);
  }
  return tps;
}

// Greedy decoding from one random token (run as the first decode step, with drafts), n_gen
// tokens produced. One generator for all repetitions (as the plain test reuses its
// session), restarted each time.
std::vector<double> ThreadCountBench::time_speculative_tg(int64_t n_gen, SpeculationTotals& totals) {
  GeneratorOptions go;
  go.n_ctx = plan_.n_ctx + 4;
  go.n_batch = std::min<int32_t>(bs_.n_batch, plan_.n_ctx);
  go.precision = plan_.prec;
  go.mtp = plan_.mtp.max_k;
  go.mtp_adaptive = plan_.mtp.adaptive;
  go.kv_types = bs_.kv_types;
  Generator gen(model_, go);
  std::vector<double> tps;
  for (int r = 0; r <= bs_.repetitions; ++r) {  // r == 0 is the warm-up
    SequenceParams sq;
    sq.prompt = {tokens_()};
    sq.last_prompt_token_pending = true;
    sq.sampling.temperature = 0;
    sq.sampling.seed = uint64_t(r);
    sq.stop_at_eog = false;
    sq.max_tokens = int32_t(n_gen);
    sq.synthetic_accept = bs_.synthetic_accept;
    int64_t n_done = 0;
    gen.start(std::move(sq), [&n_done](const GenerateEvent&) { return ++n_done, SinkReply::Continue; });
    const double t0 = now_seconds();
    gen.run(pool_);
    const double dt = now_seconds() - t0;
    if (r == 0) continue;
    tps.push_back(double(n_done) / dt);
    totals.add(gen);
  }
  return tps;
}

void ThreadCountBench::report_speculation(const SpeculationTotals& totals) {
  const MtpSetting& mtp = plan_.mtp;
  nlohmann::json m = {{"k", mtp.adaptive ? std::string("auto") : std::to_string(mtp.max_k)},
                      {"synthetic_accept", bs_.synthetic_accept},
                      {"speculative_steps", totals.stats.steps},
                      {"plain_steps", totals.plain_steps},
                      {"mean_tokens_per_step", totals.stats.mean_tokens_per_step()},
                      {"acceptance", by_draft_position([&](int32_t i) { return totals.stats.acceptance(i); })}};
  if (mtp.adaptive) {
    m["probes"] = totals.probes;
    m["paying_probes"] = totals.paying_probes;
    m["cost_model"] = totals.cost_model;
  }
  if (bs_.json)
    result_["mtp"] = m;
  else
    std::printf("\nmtp %s: %s\n\n", mtp.adaptive ? "auto" : std::to_string(mtp.max_k).c_str(), m.dump().c_str());
}

void ThreadCountBench::bench_parallel() {
  const auto n_seq_list = parse_list(bs_.parallel, "--parallel", 1, 256);
  const int32_t n_pp = bs_.parallel_prompt;
  const int32_t n_tg = int32_t(plan_.n_gen_list.front() > 0 ? plan_.n_gen_list.front() : 128);
  if (n_pp + n_tg + 8 > model_.hparams().n_ctx_train)
    throw UsageError("--parallel needs " + std::to_string(n_pp + n_tg + 8) + " positions per sequence");
  nlohmann::json par = nlohmann::json::array();
  double base_total = 0, base_decode = 0;
  for (int64_t n_seq : n_seq_list) {
    const ParallelStats ps = time_parallel(int32_t(n_seq), n_pp, n_tg);
    const Stat &st = ps.total, &sd = ps.decode, &sx = ps.distinct_experts;
    if (n_seq == n_seq_list.front()) base_total = st.mean, base_decode = sd.mean;
    par.push_back({{"sequences", n_seq},
                   {"prompt_tokens", n_pp},
                   {"gen_tokens", n_tg},
                   {"total_tok_per_s", st.mean},
                   {"total_stddev", st.stddev},
                   {"decode_tok_per_s", sd.mean},
                   {"decode_stddev", sd.stddev},
                   {"distinct_experts", sx.mean}});
    if (!bs_.json) {
      std::printf("parallel %3lld x (pp%d + tg%d), %lld threads: total %.1f ± %.1f t/s (%.2fx), decode %.1f ± %.1f "
                  "t/s (%.2fx), %.1f distinct experts per MoE layer per step\n",
                  (long long)n_seq, n_pp, n_tg, (long long)threads_, st.mean, st.stddev,
                  base_total > 0 ? st.mean / base_total : 0.0, sd.mean, sd.stddev,
                  base_decode > 0 ? sd.mean / base_decode : 0.0, sx.mean);
      std::fflush(stdout);
    }
  }
  if (bs_.json) result_["parallel"] = par;
}

// n_seq sequences of n_pp prompt and n_tg generated tokens through a serving engine of
// their own, after one warm-up round.
ParallelStats ThreadCountBench::time_parallel(int32_t n_seq, int32_t n_pp, int32_t n_tg) {
  EngineOptions eo;
  eo.n_threads = int32_t(threads_);
  eo.n_ctx = n_pp + n_tg + 8;
  eo.n_parallel = n_seq;
  eo.max_queue = n_seq;
  eo.precision = plan_.prec;
  eo.kv_types = bs_.kv_types;
  eo.prefix_cache = false;
  eo.warm_up = true;
  auto engine = make_engine(model_, eo);
  std::vector<double> total, decode, distinct;
  for (int r = 0; r <= bs_.repetitions; ++r) {  // r == 0 is the warm-up
    const ParallelResult pr = bench_parallel_once(*engine, n_seq, n_pp, n_tg, model_.hparams().n_vocab, tokens_.rng);
    if (r == 0) continue;
    total.push_back(pr.total_tps);
    decode.push_back(pr.decode_tps);
    distinct.push_back(pr.distinct_experts);
  }
  engine->shutdown();
  return {stats_of(total), stats_of(decode), stats_of(distinct)};
}

// One trunk pass over K+1 tokens after a 64-token context, repeated; time and the
// distinct experts per MoE layer the pass reads.
void ThreadCountBench::bench_verify_cost() {
  nlohmann::json vc = nlohmann::json::array();
  double base = 0;
  for (int32_t k = 0; k <= kMaxDrafts; ++k) {
    std::vector<double> secs;
    double distinct = 0;
    for (int r = 0; r <= bs_.repetitions * 4; ++r) {
      session_->cache().clear();
      std::vector<int32_t> ctx(64);
      for (auto& t : ctx) t = tokens_();
      session_->forward(ctx.data(), 64, false, logits_, pool_);
      std::vector<int32_t> toks(static_cast<size_t>(k + 1));
      for (auto& t : toks) t = tokens_();
      const double t0 = now_seconds();
      session_->forward(toks.data(), k + 1, true, logits_, pool_);
      if (r > 0) secs.push_back(now_seconds() - t0);
      const RoutingStats& rs = session_->routing();
      if (rs.n_moe_layers > 0) distinct += double(rs.distinct_experts_sum) / double(rs.n_moe_layers);
    }
    std::sort(secs.begin(), secs.end());
    const double med = secs[secs.size() / 2];
    if (k == 0) base = med;
    vc.push_back({{"k", k}, {"tokens", k + 1}, {"ms", med * 1e3}, {"relative", med / base},
                  {"distinct_experts", distinct / double(bs_.repetitions * 4 + 1)}});
  }
  if (bs_.json)
    result_["verify_cost"] = vc;
  else
    for (const auto& v : vc)
      std::printf("verify K=%d (%d tokens): %.3f ms = %.2f x one decode step, %.1f distinct experts per MoE layer\n",
                  v["k"].get<int>(), v["tokens"].get<int>(), v["ms"].get<double>(), v["relative"].get<double>(),
                  v["distinct_experts"].get<double>());
}

void ThreadCountBench::bench_membw() {
  // Under --mem-budget the buffer stays small: the budget is the process's memory.
  const size_t mib = model_.expert_cache() ? std::min<size_t>(size_t(bs_.membw_mib), 64) : size_t(bs_.membw_mib);
  const double bw = measure_read_bandwidth(pool_, mib << 20, 5);
  const double roofline = bw / double(plan_.active_bytes);
  if (model_.expert_cache()) bench_disk_bound();
  if (bs_.json) {
    result_["membw_bytes_per_s"] = bw;
    result_["active_bytes_per_token"] = plan_.active_bytes;
    result_["roofline_tok_per_s"] = roofline;
    if (tg_mean_ > 0) result_["tg_share_of_roofline"] = tg_mean_ / roofline;
    return;
  }
  std::printf("\nthreads %lld: read bandwidth %.1f GB/s; active weights %.1f MB/token -> decode roofline %.1f tok/s",
              (long long)threads_, bw / 1e9, double(plan_.active_bytes) / 1e6, roofline);
  if (tg_mean_ > 0) std::printf("; tg achieved %.1f tok/s = %.0f %% of it", tg_mean_, 100.0 * tg_mean_ / roofline);
  std::printf("\n\n");
}

// Under --mem-budget: the model file's direct-I/O read bandwidth and the decode speed the
// last tg test's expert reads allow at that bandwidth.
void ThreadCountBench::bench_disk_bound() {
  const double disk = offload::direct_read_bandwidth(plan_.path, uint64_t(1) << 30);
  const double bound = tg_read_per_token_ > 0 ? disk / tg_read_per_token_ : 0;
  if (bs_.json) {
    result_["disk_read_bytes_per_s"] = disk;
    if (bound > 0) {
      result_["disk_bound_tok_per_s"] = bound;
      result_["tg_share_of_disk_bound"] = tg_mean_ / bound;
    }
    return;
  }
  std::printf("\nthreads %lld: model file read with direct I/O at %.2f GB/s", (long long)threads_, disk / 1e9);
  if (bound > 0)
    std::printf("; tg read %.1f MB of experts per token -> disk bound %.1f tok/s, tg achieved %.0f %% of it",
                tg_read_per_token_ / 1e6, bound, 100.0 * tg_mean_ / bound);
  std::printf("\n");
}

// What the lossy policy costs in accuracy: the same random prompt through the strict and
// the adaptive policy, every position's logits compared.
void ThreadCountBench::bench_policy_drift() {
  const HParams& hp = model_.hparams();
  const RoutingPolicy& routing = plan_.routing;
  const int32_t n = std::min<int32_t>(plan_.n_ctx, 128);
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (auto& t : prompt) t = tokens_();
  std::vector<float> strict_logits, adaptive_logits;
  session_->set_routing(RoutingPolicy{});
  session_->cache().clear();
  session_->forward(prompt.data(), n, true, strict_logits, pool_);
  session_->set_routing(routing);
  session_->cache().clear();
  session_->forward(prompt.data(), n, true, adaptive_logits, pool_);
  const RoutingStats& rs = session_->routing();
  const double experts = rs.adaptive_tokens ? double(rs.adaptive_experts) / double(rs.adaptive_tokens) : 0.0;
  int32_t top_k = 0;  // the model's top-k (of its MoE layers)
  for (const LayerHParams& l : hp.layers) top_k = std::max(top_k, l.is_moe ? l.n_expert_used : 0);
  const LogitDrift drift = logit_drift(strict_logits, adaptive_logits, n, size_t(hp.n_vocab));
  if (bs_.json) {
    result_["expert_policy"] = {{"policy", "adaptive"},
                                {"adaptive_mass", routing.adaptive_mass},
                                {"adaptive_min_k", routing.adaptive_min_k},
                                {"experts_per_token", experts},
                                {"top_k", top_k},
                                {"drift_positions", n},
                                {"drift_max_abs", drift.max_abs},
                                {"drift_rms", drift.rms},
                                {"argmax_agreement", double(drift.argmax_same) / double(n)}};
    return;
  }
  std::printf("\nexpert policy adaptive (mass %.2f, min k %d): %.2f routed experts per token and MoE layer (top-k "
              "%d); logit drift against strict over %d positions: max |d| %.4g, rms %.4g, argmax agreement %d/%d\n",
              double(routing.adaptive_mass), routing.adaptive_min_k, experts, top_k, n, drift.max_abs, drift.rms,
              drift.argmax_same, n);
}

}  // namespace

static int bench_main(const Args& args) {
  BenchSettings bs;
  ArgParser p = bench_parser(bs);
  if (!p.parse(args)) return 0;
  BenchPlan plan = bench_plan(bs);
  EpSetup ep(p);
  if (ep.is_follower())
    return ep.follow(plan.path, int(plan.threads_list.front()), bs.mtp_model, parse_mem_size(bs.mem_budget));
  auto model = load_model(plan.path, bs.json, bs.mtp_model, {parse_mem_size(bs.mem_budget), bench_positions(plan), bs.kv_types});
  ep.attach(*model);
  fit_plan_to_model(plan, bs, *model);
  plan.ep = p.has("ep");
  plan.ep_ranks = ep.n_ranks();
  plan.parallel = p.has("parallel");
  RandomTokens tokens(model->hparams().n_vocab);

  if (!bs.json) {
    std::printf("| model | size | params | backend | threads | test | t/s |\n");
    std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  }
  for (int64_t threads : plan.threads_list) ThreadCountBench(bs, plan, *model, threads, tokens).run();
  if (!bs.json) std::printf("\npeak RSS %s\n", human_bytes(double(peak_rss_bytes())).c_str());
  return 0;
}

int cmd_bench(const Args& args) { return run_guarded("bench", bench_main, args); }

}  // namespace step35::cli
