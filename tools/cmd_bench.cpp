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
#include "model/session.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "exec/thread_pool.h"
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
        return true;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (ev.reason == FinishReason::Error) error = ev.error;
      ++n_done;
      cv.notify_all();
      return true;
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

}  // namespace

static int bench_main(const Args& args) {
  ArgParser p("bench",
              "Measures prompt processing (ppN: N prompt tokens in one batch from an empty context) and\n"
              "text generation (tgN: N tokens one at a time from an empty context) in tokens/s, mean +- stddev\n"
              "over repetitions after one warm-up run, as llama-bench does; prints a markdown table, or JSON\n"
              "with --json. With --membw it also measures the memory read bandwidth and reports the decode\n"
              "roofline (active weight bytes per token / bandwidth) and tg as a share of it.");
  p.flag("-m,--model", "FILE", "GGUF model", "the built-in tiny model");
  p.flag("-p,--n-prompt", "N", "prompt tokens (comma list; 0 = skip pp)", "512");
  p.flag("-n,--n-gen", "N", "generated tokens (comma list; 0 = skip tg)", "128");
  p.flag("-t,--threads", "N", "worker threads (comma list)", "number of cores");
  p.flag("-r,--repetitions", "N", "repetitions of each test", "5");
  p.flag("-b,--batch-size", "N", "prompt tokens per forward pass", "512");
  p.flag("--json", "", "print one JSON object per thread count instead of the table");
  p.flag("--membw", "", "measure memory read bandwidth and report the decode roofline");
  p.flag("--membw-mib", "N", "buffer size for --membw in MiB", "1024");
  p.flag("--exact", "", "F32 activations on the exact stored weights (default: llama.cpp's activation rounding)");
  p.flag("--mtp", "K", "tg with MTP speculative decoding: 0..3 drafts per step, or auto", "0");
  p.flag("--mtp-synthetic-accept", "P", "benchmark only: accept each draft with probability P (output discarded), "
                                        "to measure speed at a realistic acceptance with random-weight heads");
  p.flag("--verify-cost", "", "measure one trunk pass over K+1 tokens (K = 0..3) at a decode position, relative "
                               "to a single-token step, with the distinct experts the tokens touch");
  p.flag("--expert-policy", "P", "strict (the model's top-k) or adaptive (lossy: fewer experts per token, see "
         "--adaptive-mass); adaptive also reports the logit drift against strict", "strict");
  p.flag("--parallel", "N", "batched decoding through the serving engine, as llama-batched-bench: N sequences "
         "(comma list) each with a random prompt of --parallel-prompt tokens generate the first -n count (128 "
         "when -n is 0, which skips the one-sequence tg test) together; reports aggregate t/s and the distinct "
         "experts per step");
  p.flag("--parallel-prompt", "N", "prompt tokens per sequence for --parallel", "16");
  add_adaptive_policy_flags(p);
  add_ep_flags(p);
  if (!p.parse(args)) return 0;

  const auto n_prompt_list = parse_list(p.str("n-prompt", "512"), "-p", 0, 1 << 20);
  const auto n_gen_list = parse_list(p.str("n-gen", "128"), "-n", 0, 1 << 20);
  const auto threads_list = parse_list(p.str("threads", std::to_string(default_threads())), "-t", 1, 1024);
  const int reps = int(p.i64("repetitions", 5, 1, 1000));
  const int n_batch = int(p.i64("batch-size", 512, 1, 1 << 16));
  const bool json = p.has("json");
  const Precision prec = p.has("exact") ? Precision::Exact : Precision::Native;
  const double synthetic = p.has("mtp-synthetic-accept") ? p.f64("mtp-synthetic-accept", 0.0, 0.0, 1.0) : -1.0;

  const ExpertPolicySetting policy = parse_expert_policy(p);
  RoutingPolicy routing;  // strict unless adaptive
  if (policy.adaptive) routing = RoutingPolicy{policy.mass, policy.min_k};

  std::string path = p.str("model");
  if (path.empty()) path = builtin_tiny_model_path();
  EpSetup ep(p);
  if (ep.is_follower()) return ep.follow(path, int(threads_list.front()));
  auto model = load_model(path, json);
  ep.attach(*model);
  const HParams& hp = model->hparams();
  const int64_t max_prompt = *std::max_element(n_prompt_list.begin(), n_prompt_list.end());
  const int64_t max_gen = *std::max_element(n_gen_list.begin(), n_gen_list.end());
  const int32_t n_ctx = int32_t(std::max<int64_t>({max_prompt, max_gen + 4, p.has("verify-cost") ? 68 : 1}));
  if (n_ctx > hp.n_ctx_train)
    throw UsageError("the test needs " + std::to_string(n_ctx) + " positions but the model's context is " +
                     std::to_string(hp.n_ctx_train));

  uint64_t n_params = 0;
  for (const auto& t : model->file().tensors()) n_params += uint64_t(t.n_elements());
  const std::string label = model->file().opt_str("general.name").value_or("step35") + " " + model_type_label(*model);
  const uint64_t active_bytes = model->active_weight_bytes_per_token();
  const MtpSetting mtp = parse_mtp(p.str("mtp", "0"), *model);
  if (synthetic >= 0 && mtp.max_k == 0) throw UsageError("--mtp-synthetic-accept needs --mtp K or auto");
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok_dist(0, hp.n_vocab - 1);

  if (!json) {
    std::printf("| model | size | params | backend | threads | test | t/s |\n");
    std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  }
  for (int64_t threads : threads_list) {
    ThreadPool pool{int(threads)};
    Session session(*model, n_ctx, std::min<int32_t>(n_batch, n_ctx), prec);
    session.set_routing(routing);
    std::vector<float> logits;
    nlohmann::json result;
    result["model"] = label;
    result["model_path"] = path;
    result["threads"] = threads;
    result["isa"] = kernels::isa_name(kernels::active_isa());
    if (p.has("ep")) result["ep_ranks"] = ep.n_ranks();
    result["precision"] = prec == Precision::Native ? "native" : "exact";
    auto report = [&](const std::string& test, int64_t n_tok, const std::vector<double>& tps, const char* key) {
      const Stat s = stats_of(tps);
      if (json) {
        result[key] = {{"tokens", n_tok}, {"tok_per_s", s.mean}, {"stddev", s.stddev}, {"samples", tps}};
      } else {
        const std::string ep_text = p.has("ep") ? ", EP x" + std::to_string(ep.n_ranks()) : "";
        std::printf("| %s | %s | %.2f M | CPU (%s%s) | %lld | %s | %.2f ± %.2f |\n", label.c_str(),
                    human_bytes(double(model->weight_bytes())).c_str(), double(n_params) / 1e6,
                    kernels::isa_name(kernels::active_isa()), ep_text.c_str(), (long long)threads, test.c_str(), s.mean,
                    s.stddev);
        std::fflush(stdout);
      }
    };
    for (int64_t n_prompt : n_prompt_list) {
      if (n_prompt <= 0) continue;
      std::vector<int32_t> tokens(static_cast<size_t>(n_prompt));
      std::vector<double> tps;
      for (int r = 0; r <= reps; ++r) {  // r == 0 is the warm-up
        for (auto& t : tokens) t = tok_dist(rng);
        session.cache().clear();
        const double t0 = now_seconds();
        session.forward(tokens.data(), int32_t(n_prompt), false, logits, pool);
        const double dt = now_seconds() - t0;
        if (r > 0) tps.push_back(double(n_prompt) / dt);
      }
      report("pp" + std::to_string(n_prompt), n_prompt, tps, "pp");
    }
    double tg_mean = 0;
    for (int64_t n_gen : n_gen_list) {
      if (n_gen <= 0) continue;
      std::vector<double> tps;
      SpeculationStats spec_total;
      uint64_t plain_steps = 0, probes = 0, paying_probes = 0;
      nlohmann::json cost_model;  // what the adaptive controller learned in the last repetition
      std::unique_ptr<SpeculativeDecoder> spec_dec;
      for (int r = 0; r <= reps; ++r) {
        if (mtp.max_k == 0) {
          session.cache().clear();
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
        // Speculative: greedy decoding from one random token, n_gen tokens produced. One
        // decoder for all repetitions (as the plain test reuses its session), reset each time.
        if (!spec_dec)
          spec_dec = std::make_unique<SpeculativeDecoder>(*model, n_ctx + 4, std::min<int32_t>(n_batch, n_ctx), prec,
                                                          mtp.max_k, mtp.adaptive);
        SpeculativeDecoder& dec = *spec_dec;
        dec.reset();
        SamplingParams sp;
        sp.temperature = 0;
        sp.seed = uint64_t(r);
        Sampler sampler(sp, size_t(hp.n_vocab));
        const int32_t first = tok_dist(rng);
        std::vector<int32_t> produced = {first};
        int64_t n_done = 0;
        const double t0 = now_seconds();
        while (n_done < n_gen && dec.n_pos() + 4 < dec.n_ctx()) {
          const int32_t pending = produced.back();
          produced.clear();
          dec.step(pending, sampler, produced, pool, synthetic);
          n_done += int64_t(produced.size());
        }
        const double dt = now_seconds() - t0;
        if (r > 0) {
          tps.push_back(double(n_done) / dt);
          spec_total.add(dec.stats());
          plain_steps += dec.plain_steps();
          const AdaptiveK& a = dec.adaptive();
          probes += a.probes();
          paying_probes += a.paying_probes();
          const double c0 = a.verify_cost(0);
          nlohmann::json verify = nlohmann::json::array(), rel = nlohmann::json::array(),
                         measured = nlohmann::json::array(), expected = nlohmann::json::array(),
                         speedup = nlohmann::json::array();
          for (int32_t k = 0; k <= dec.max_k(); ++k) {
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
                        {"acceptance", {a.acceptance(1), a.acceptance(2), a.acceptance(3)}},
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
                            {"acceptance", {spec_total.acceptance(1), spec_total.acceptance(2), spec_total.acceptance(3)}}};
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
    if (p.has("parallel")) {
      const auto n_seq_list = parse_list(p.str("parallel"), "--parallel", 1, 256);
      const int32_t n_pp = int32_t(p.i64("parallel-prompt", 16, 1, 1 << 16));
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
    if (p.has("verify-cost")) {
      // One trunk pass over K+1 tokens after a 64-token context, repeated; time and the
      // distinct experts per MoE layer the pass reads.
      nlohmann::json vc = nlohmann::json::array();
      double base = 0;
      for (int32_t k = 0; k <= 3; ++k) {
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
    if (p.has("membw")) {
      const size_t mib = size_t(p.i64("membw-mib", 1024, 64, 1 << 16));
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
