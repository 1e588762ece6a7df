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
  std::string mtp = "0", expert_policy = "strict", parallel, mtp_model;
  int32_t repetitions = 5, n_batch = GeneratorOptions{}.n_batch, membw_mib = 1024, parallel_prompt = 16;
  double synthetic_accept = -1;  // off
  bool json = false, membw = false, exact = false, verify_cost = false;
  RoutingPolicy routing{kDefaultAdaptiveMass, kDefaultAdaptiveMinK};  // for --expert-policy adaptive
  KvTypes kv_types;
};

}  // namespace

static int bench_main(const Args& args) {
  ArgParser p("bench",
              "Measures prompt processing (ppN: N prompt tokens in one batch) and text generation (tgN: N\n"
              "tokens one at a time) in tokens/s, from an empty context or, with -d, after DEPTH tokens already\n"
              "in the cache (\"pp512 @ d8192\"), mean +- stddev over repetitions after one warm-up run, as\n"
              "llama-bench does (routed experts the load repacks on first use are all repacked before timing,\n"
              "the steady state of a server); prints a markdown table, or JSON with --json. With --membw it\n"
              "also measures the memory read bandwidth and reports the decode roofline (active weight bytes\n"
              "per token / bandwidth) and tg as a share of it.");
  BenchSettings bs;
  p.option("-m,--model", "FILE", "GGUF model", bs.model, "the built-in tiny model");
  add_mtp_model_flag(p, bs.mtp_model);
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
  if (!p.parse(args)) return 0;

  const auto n_prompt_list = parse_list(bs.n_prompt, "-p", 0, 1 << 20);
  const auto n_gen_list = parse_list(bs.n_gen, "-n", 0, 1 << 20);
  const auto depth_list = parse_list(bs.n_depth, "-d", 0, 1 << 30);
  const KvTypes kv_types = bs.kv_types;
  const auto threads_list = parse_list(bs.threads, "-t", 1, 1024);
  const int reps = bs.repetitions;
  const int n_batch = bs.n_batch;
  const bool json = bs.json;
  const Precision prec = bs.exact ? Precision::Exact : Precision::Native;
  const double synthetic = bs.synthetic_accept;

  const RoutingPolicy routing = adaptive_expert_policy(bs.expert_policy) ? bs.routing : RoutingPolicy{};

  std::string path = bs.model;
  if (path.empty()) path = builtin_tiny_model_path();
  EpSetup ep(p);
  if (ep.is_follower()) return ep.follow(path, int(threads_list.front()), bs.mtp_model);
  auto model = load_model(path, json, bs.mtp_model);
  ep.attach(*model);
  const HParams& hp = model->hparams();
  const int64_t max_prompt = *std::max_element(n_prompt_list.begin(), n_prompt_list.end());
  const int64_t max_gen = *std::max_element(n_gen_list.begin(), n_gen_list.end());
  const int64_t max_depth = *std::max_element(depth_list.begin(), depth_list.end());
  const int64_t need = std::max<int64_t>(
      {max_depth + max_prompt, max_depth + max_gen + 4, bs.verify_cost ? 64 + kMaxDrafts + 1 : 1});
  if (need > hp.n_ctx_train)
    throw UsageError("the test needs " + std::to_string(need) + " positions" +
                     (max_depth > 0 ? " (depth " + std::to_string(max_depth) + " + the test's tokens)" : "") +
                     " but the model's context is " + std::to_string(hp.n_ctx_train));
  const int32_t n_ctx = int32_t(need);
  // After a test at depth D the cache is cut back to D for the next one: the sliding-window
  // blocks just behind D must still be there, so the cache keeps that many positions.
  const int32_t keep_back = max_depth > 0 ? int32_t(std::max(max_prompt, max_gen)) : 0;

  uint64_t n_params = 0;
  for (const auto& t : model->file().tensors()) n_params += uint64_t(t.n_elements());
  const std::string label = model->file().opt_str("general.name").value_or("step35") + " " + model_type_label(*model);
  const uint64_t active_bytes = model->active_weight_bytes_per_token();
  const MtpSetting mtp = parse_mtp(bs.mtp, *model);
  if (synthetic >= 0 && mtp.max_k == 0) throw UsageError("--mtp-synthetic-accept needs --mtp K or auto");
  if (mtp.max_k > 0 && max_depth > 0)
    throw UsageError("--mtp cannot be combined with -d (speculative tg runs from an empty context)");
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok_dist(0, hp.n_vocab - 1);

  if (!json) {
    std::printf("| model | size | params | backend | threads | test | t/s |\n");
    std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  }
  for (int64_t threads : threads_list) {
    ThreadPool pool{int(threads)};
    if (const uint64_t done = model->lazy_repacked_so_far(); done < model->lazy_repack_bytes()) {
      // Experts repacked on first use: copy the rest now, so that no timed run pays for a
      // first use (a serving process is past them after its first requests).
      const double t0 = now_seconds();
      model->prepare_all_experts(pool);
      if (!json)
        std::fprintf(stderr, "routed experts repacked before timing: %s in %.1f s\n",
                     human_bytes(double(model->lazy_repack_bytes() - done)).c_str(), now_seconds() - t0);
    }
    Session session(*model, n_ctx, std::min<int32_t>(n_batch, n_ctx), prec, false, keep_back, kv_types);
    session.set_routing(routing);
    std::vector<float> logits;
    nlohmann::json result;
    result["model"] = label;
    result["model_path"] = path;
    result["threads"] = threads;
    result["isa"] = kernels::isa_name(kernels::active_isa());
    if (p.has("ep")) result["ep_ranks"] = ep.n_ranks();
    result["precision"] = prec == Precision::Native ? "native" : "exact";
    result["cache_type_k"] = dtype_name(kv_types.k);
    result["cache_type_v"] = dtype_name(kv_types.v);
    result["kv_cache_bytes"] = session.cache().bytes();
    int64_t depth = 0;  // the depth of the tests being run
    nlohmann::json all_tests = nlohmann::json::object();
    auto report = [&](std::string test, int64_t n_tok, const std::vector<double>& tps, const char* key) {
      const Stat s = stats_of(tps);
      const nlohmann::json entry = {{"tokens", n_tok}, {"tok_per_s", s.mean}, {"stddev", s.stddev}, {"samples", tps}};
      if (depth > 0) test += " @ d" + std::to_string(depth);
      if (json) {
        // Every test under "tests" by its llama-bench name ("pp512", "tg64 @ d8192"); the
        // last pp / tg of the first depth also as "pp" / "tg" (as before -d existed).
        if (depth == depth_list.front()) result[key] = entry;
        all_tests[test] = entry;
      } else {
        std::string ep_text = p.has("ep") ? ", EP x" + std::to_string(ep.n_ranks()) : "";
        if (!(kv_types == KvTypes{}))  // as llama-bench, the cache types only when not the default
          ep_text += std::string(", KV ") + dtype_name(kv_types.k) + "/" + dtype_name(kv_types.v);
        std::printf("| %s | %s | %.2f M | CPU (%s%s) | %lld | %s | %.2f ± %.2f |\n", label.c_str(),
                    human_bytes(double(model->weight_bytes())).c_str(), double(n_params) / 1e6,
                    kernels::isa_name(kernels::active_isa()), ep_text.c_str(), (long long)threads, test.c_str(), s.mean,
                    s.stddev);
        std::fflush(stdout);
      }
    };
    double tg_mean = 0;
    std::vector<int32_t> depth_tokens;
    for (int64_t d : depth_list) {
      depth = d;
      // Fills the cache with `depth` random tokens once; each test then starts from there.
      if (depth > 0) {
        depth_tokens.resize(size_t(depth));
        for (auto& t : depth_tokens) t = tok_dist(rng);
        session.cache().clear();
        const double t0 = now_seconds();
        session.forward(depth_tokens.data(), int32_t(depth), false, logits, pool);
        if (!json) std::fprintf(stderr, "depth %lld: filled in %.1f s\n", (long long)depth, now_seconds() - t0);
      }
      auto restart = [&] {
        if (depth > 0)
          session.cache().truncate(int32_t(depth));
        else
          session.cache().clear();
      };
      for (int64_t n_prompt : n_prompt_list) {
        if (n_prompt <= 0) continue;
        std::vector<int32_t> tokens(static_cast<size_t>(n_prompt));
        std::vector<double> tps;
        for (int r = 0; r <= reps; ++r) {  // r == 0 is the warm-up
          for (auto& t : tokens) t = tok_dist(rng);
          restart();
          const double t0 = now_seconds();
          session.forward(tokens.data(), int32_t(n_prompt), false, logits, pool);
          const double dt = now_seconds() - t0;
          if (r > 0) tps.push_back(double(n_prompt) / dt);
        }
        report("pp" + std::to_string(n_prompt), n_prompt, tps, "pp");
      }
      for (int64_t n_gen : n_gen_list) {
        if (n_gen <= 0) continue;
        std::vector<double> tps;
        SpeculationStats spec_total;
        uint64_t plain_steps = 0, probes = 0, paying_probes = 0;
        nlohmann::json cost_model;  // what the adaptive controller learned in the last repetition
        std::unique_ptr<Generator> spec_gen;
        for (int r = 0; r <= reps; ++r) {
          if (mtp.max_k == 0) {
            restart();
            int32_t tok = tok_dist(rng);
            const double t0 = now_seconds();
            for (int64_t i = 0; i < n_gen; ++i) {
              session.forward(&tok, 1, false, logits, pool);
              tok = tok_dist(rng);  // as llama-bench: the decode cost does not depend on which token
            }
            const double dt = now_seconds() - t0;
            if (r > 0) tps.push_back(double(n_gen) / dt);
            continue;
          }
          // Speculative: greedy decoding from one random token (run as the first decode step,
          // with drafts), n_gen tokens produced. One generator for all repetitions (as the
          // plain test reuses its session), restarted each time.
          if (!spec_gen) {
            GeneratorOptions go;
            go.n_ctx = n_ctx + 4;
            go.n_batch = std::min<int32_t>(n_batch, n_ctx);
            go.precision = prec;
            go.mtp = mtp.max_k;
            go.mtp_adaptive = mtp.adaptive;
            go.kv_types = kv_types;
            spec_gen = std::make_unique<Generator>(*model, go);
          }
          Generator& gen = *spec_gen;
          SequenceParams sq;
          sq.prompt = {tok_dist(rng)};
          sq.last_prompt_token_pending = true;
          sq.sampling.temperature = 0;
          sq.sampling.seed = uint64_t(r);
          sq.stop_at_eog = false;
          sq.max_tokens = int32_t(n_gen);
          sq.synthetic_accept = synthetic;
          int64_t n_done = 0;
          gen.start(std::move(sq), [&n_done](const GenerateEvent&) { return ++n_done, SinkReply::Continue; });
          const double t0 = now_seconds();
          gen.run(pool);
          const double dt = now_seconds() - t0;
          if (r > 0) {
            tps.push_back(double(n_done) / dt);
            const SpeculationStats& st = gen.sequence().speculation_stats();
            spec_total.add(st);
            plain_steps += st.plain_steps;
            const AdaptiveK& a = gen.speculation()->controller();
            probes += a.probes();
            paying_probes += a.paying_probes();
            const double c0 = a.verify_cost(0);
            nlohmann::json verify = nlohmann::json::array(), rel = nlohmann::json::array(),
                           measured = nlohmann::json::array(), expected = nlohmann::json::array(),
                           speedup = nlohmann::json::array();
            for (int32_t k = 0; k <= gen.max_k(); ++k) {
              verify.push_back(a.verify_cost(k) * 1e3);
              rel.push_back(c0 > 0 ? a.verify_cost(k) / c0 : 0.0);
              measured.push_back(a.verify_measured(k));
              expected.push_back(a.expected_tokens(k));
              speedup.push_back(c0 > 0 ? a.rate(k) * c0 : 0.0);
            }
            cost_model = {{"verify_ms", verify},
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
        }
        report("tg" + std::to_string(n_gen), n_gen, tps, "tg");
        tg_mean = stats_of(tps).mean;
        if (mtp.max_k > 0) {
          nlohmann::json m = {{"k", mtp.adaptive ? std::string("auto") : std::to_string(mtp.max_k)},
                              {"synthetic_accept", synthetic},
                              {"speculative_steps", spec_total.steps},
                              {"plain_steps", plain_steps},
                              {"mean_tokens_per_step", spec_total.mean_tokens_per_step()},
                              {"acceptance", by_draft_position([&](int32_t i) { return spec_total.acceptance(i); })}};
          if (mtp.adaptive) {
            m["probes"] = probes;
            m["paying_probes"] = paying_probes;
            m["cost_model"] = cost_model;
          }
          if (json)
            result["mtp"] = m;
          else
            std::printf("\nmtp %s: %s\n\n", mtp.adaptive ? "auto" : std::to_string(mtp.max_k).c_str(), m.dump().c_str());
        }
      }
    }  // depths
    depth = 0;
    result["tests"] = all_tests;
    if (p.has("parallel")) {
      const auto n_seq_list = parse_list(bs.parallel, "--parallel", 1, 256);
      const int32_t n_pp = bs.parallel_prompt;
      const int32_t n_tg = int32_t(n_gen_list.front() > 0 ? n_gen_list.front() : 128);
      if (n_pp + n_tg + 8 > hp.n_ctx_train)
        throw UsageError("--parallel needs " + std::to_string(n_pp + n_tg + 8) + " positions per sequence");
      nlohmann::json par = nlohmann::json::array();
      double base_total = 0, base_decode = 0;
      for (int64_t n_seq : n_seq_list) {
        EngineOptions eo;
        eo.n_threads = int32_t(threads);
        eo.n_ctx = n_pp + n_tg + 8;
        eo.n_parallel = int32_t(n_seq);
        eo.max_queue = int32_t(n_seq);
        eo.precision = prec;
        eo.kv_types = kv_types;
        eo.prefix_cache = false;
        eo.warm_up = true;
        auto engine = make_engine(*model, eo);
        std::vector<double> total, decode, distinct;
        for (int r = 0; r <= reps; ++r) {  // r == 0 is the warm-up
          const ParallelResult pr = bench_parallel_once(*engine, int32_t(n_seq), n_pp, n_tg, hp.n_vocab, rng);
          if (r == 0) continue;
          total.push_back(pr.total_tps);
          decode.push_back(pr.decode_tps);
          distinct.push_back(pr.distinct_experts);
        }
        engine->shutdown();
        const Stat st = stats_of(total), sd = stats_of(decode), sx = stats_of(distinct);
        if (n_seq == n_seq_list.front()) base_total = st.mean, base_decode = sd.mean;
        par.push_back({{"sequences", n_seq},
                       {"prompt_tokens", n_pp},
                       {"gen_tokens", n_tg},
                       {"total_tok_per_s", st.mean},
                       {"total_stddev", st.stddev},
                       {"decode_tok_per_s", sd.mean},
                       {"decode_stddev", sd.stddev},
                       {"distinct_experts", sx.mean}});
        if (!json) {
          std::printf("parallel %3lld x (pp%d + tg%d), %lld threads: total %.1f ± %.1f t/s (%.2fx), decode %.1f ± %.1f "
                      "t/s (%.2fx), %.1f distinct experts per MoE layer per step\n",
                      (long long)n_seq, n_pp, n_tg, (long long)threads, st.mean, st.stddev,
                      base_total > 0 ? st.mean / base_total : 0.0, sd.mean, sd.stddev,
                      base_decode > 0 ? sd.mean / base_decode : 0.0, sx.mean);
          std::fflush(stdout);
        }
      }
      if (json) result["parallel"] = par;
    }
    if (bs.verify_cost) {
      // One trunk pass over K+1 tokens after a 64-token context, repeated; time and the
      // distinct experts per MoE layer the pass reads.
      nlohmann::json vc = nlohmann::json::array();
      double base = 0;
      for (int32_t k = 0; k <= kMaxDrafts; ++k) {
        std::vector<double> secs;
        double distinct = 0;
        for (int r = 0; r <= reps * 4; ++r) {
          session.cache().clear();
          std::vector<int32_t> ctx(64);
          for (auto& t : ctx) t = tok_dist(rng);
          session.forward(ctx.data(), 64, false, logits, pool);
          std::vector<int32_t> toks(static_cast<size_t>(k + 1));
          for (auto& t : toks) t = tok_dist(rng);
          const double t0 = now_seconds();
          session.forward(toks.data(), k + 1, true, logits, pool);
          if (r > 0) secs.push_back(now_seconds() - t0);
          const RoutingStats& rs = session.routing();
          if (rs.n_moe_layers > 0) distinct += double(rs.distinct_experts_sum) / double(rs.n_moe_layers);
        }
        std::sort(secs.begin(), secs.end());
        const double med = secs[secs.size() / 2];
        if (k == 0) base = med;
        vc.push_back({{"k", k}, {"tokens", k + 1}, {"ms", med * 1e3}, {"relative", med / base},
                      {"distinct_experts", distinct / double(reps * 4 + 1)}});
      }
      if (json)
        result["verify_cost"] = vc;
      else
        for (const auto& v : vc)
          std::printf("verify K=%d (%d tokens): %.3f ms = %.2f x one decode step, %.1f distinct experts per MoE layer\n",
                      v["k"].get<int>(), v["tokens"].get<int>(), v["ms"].get<double>(), v["relative"].get<double>(),
                      v["distinct_experts"].get<double>());
    }
    if (bs.membw) {
      const size_t mib = size_t(bs.membw_mib);
      const double bw = measure_read_bandwidth(pool, mib << 20, 5);
      const double roofline = bw / double(active_bytes);
      if (json) {
        result["membw_bytes_per_s"] = bw;
        result["active_bytes_per_token"] = active_bytes;
        result["roofline_tok_per_s"] = roofline;
        if (tg_mean > 0) result["tg_share_of_roofline"] = tg_mean / roofline;
      } else {
        std::printf("\nthreads %lld: read bandwidth %.1f GB/s; active weights %.1f MB/token -> decode roofline %.1f "
                    "tok/s",
                    (long long)threads, bw / 1e9, double(active_bytes) / 1e6, roofline);
        if (tg_mean > 0) std::printf("; tg achieved %.1f tok/s = %.0f %% of it", tg_mean, 100.0 * tg_mean / roofline);
        std::printf("\n\n");
      }
    }
    if (routing.adaptive_mass > 0) {
      // What the lossy policy costs in accuracy: the same random prompt through the strict
      // and the adaptive policy, every position's logits compared.
      const int32_t n = std::min<int32_t>(n_ctx, 128);
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      for (auto& t : tokens) t = tok_dist(rng);
      std::vector<float> strict_logits, adaptive_logits;
      session.set_routing(RoutingPolicy{});
      session.cache().clear();
      session.forward(tokens.data(), n, true, strict_logits, pool);
      session.set_routing(routing);
      session.cache().clear();
      session.forward(tokens.data(), n, true, adaptive_logits, pool);
      const RoutingStats& rs = session.routing();
      const double experts = rs.adaptive_tokens ? double(rs.adaptive_experts) / double(rs.adaptive_tokens) : 0.0;
      const size_t V = size_t(hp.n_vocab);
      int32_t top_k = 0;  // the model's top-k (of its MoE layers)
      for (const LayerHParams& l : hp.layers) top_k = std::max(top_k, l.is_moe ? l.n_expert_used : 0);
      double max_abs = 0, sum_sq = 0;
      int32_t argmax_same = 0;
      for (int32_t i = 0; i < n; ++i) {
        const float* a = strict_logits.data() + size_t(i) * V;
        const float* b = adaptive_logits.data() + size_t(i) * V;
        for (size_t v = 0; v < V; ++v) {
          const double d = double(a[v]) - double(b[v]);
          max_abs = std::max(max_abs, std::abs(d));
          sum_sq += d * d;
        }
        argmax_same += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
      }
      const double rms = std::sqrt(sum_sq / double(size_t(n) * V));
      if (json) {
        result["expert_policy"] = {{"policy", "adaptive"},
                                   {"adaptive_mass", routing.adaptive_mass},
                                   {"adaptive_min_k", routing.adaptive_min_k},
                                   {"experts_per_token", experts},
                                   {"top_k", top_k},
                                   {"drift_positions", n},
                                   {"drift_max_abs", max_abs},
                                   {"drift_rms", rms},
                                   {"argmax_agreement", double(argmax_same) / double(n)}};
      } else {
        std::printf("\nexpert policy adaptive (mass %.2f, min k %d): %.2f routed experts per token and MoE layer (top-k "
                    "%d); logit drift against strict over %d positions: max |d| %.4g, rms %.4g, argmax agreement "
                    "%d/%d\n",
                    double(routing.adaptive_mass), routing.adaptive_min_k, experts, top_k, n, max_abs,
                    rms, argmax_same, n);
      }
    }
    result["peak_rss_bytes"] = peak_rss_bytes();
    if (json) std::printf("%s\n", result.dump().c_str());
  }
  if (!json) std::printf("\npeak RSS %s\n", human_bytes(double(peak_rss_bytes())).c_str());
  return 0;
}

int cmd_bench(const Args& args) { return run_guarded("bench", bench_main, args); }

}  // namespace step35::cli
