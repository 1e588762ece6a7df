// serve_load: drives an OpenAI-compatible server (step35 serve, or llama-server for the
// comparison) with N concurrent streaming clients over loopback and reports aggregate
// generated tokens/s, time to first token (TTFT) and time per output token (TPOT)
// percentiles for each N. With --probe-low-latency it also sends low_latency requests
// (POST /v1/step35/execute) alone and then under the heaviest load, and compares their TTFT.
//
//   serve_load --url http://127.0.0.1:8080 --clients 1,4,8,16 --requests 4 --prompt-words 64
//              --max-tokens 64 [--api-key KEY] [--probe-low-latency] [--json]
//   serve_load ... --prompt-tokens 4096 --shared-prefix-tokens 3072
//
// Each request has a different prompt (random words), so prefix caching does not flatter
// the numbers, and asks for exactly max_tokens tokens (ignore_eos; temperature 0).
// With --prompt-tokens N the prompts are N token ids sent to /v1/completions (both servers
// take a list of ids), the same count for every engine whatever its tokenizer: the first
// --shared-prefix-tokens of them are one fixed random sequence for the whole run (as agents
// resend a long system prompt and tool schemas), the rest differ per request. The ids are
// byte tokens (3..258 in the step35 vocabularies), never control tokens.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<int> clients = {1, 4, 8, 16};
  int requests = 4;  // per client
  int prompt_words = 64;
  int prompt_tokens = 0;         // > 0: token-id prompts of this length (/v1/completions)
  int shared_prefix_tokens = 0;  // ... of which this many are the same in every request
  int max_tokens = 64;
  std::string api_key;
  std::string model = "step35";
  bool probe_low_latency = false;
  bool json = false;
  int timeout_s = 600;
};

struct RequestResult {
  bool ok = false;
  double ttft = 0, tpot = 0, total = 0;
  int tokens = 0;
  std::string error;
};

std::string random_prompt(std::mt19937& rng, int words) {
  static const char* vocab[] = {"river", "stone", "light", "market", "window", "cloud",  "garden", "engine",
                                "paper", "signal", "orbit", "forest", "copper", "thread", "harbor", "lantern",
                                "violet", "winter", "circuit", "meadow", "anchor", "pixel", "summit", "echo"};
  std::uniform_int_distribution<int> pick(0, int(sizeof vocab / sizeof vocab[0]) - 1);
  std::string s;
  for (int i = 0; i < words; ++i) s += std::string(i ? " " : "") + vocab[pick(rng)];
  return s;
}

// One streaming chat completion. TTFT is the time to the first chunk that carries a choice
// (the server sends it when the first token is generated; its text may be empty or held
// back by the output parser). TPOT is the time from that chunk to the last one, divided by
// the generated tokens after the first, counted from the final usage: counting deltas
// would be wrong, since a token can decode to no text (the random-weight model emits
// reserved tokens) and a delta can carry several tokens.
RequestResult stream_one(const Options& o, const std::string& path, const nlohmann::json& body) {
  RequestResult r;
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(o.timeout_s, 0);
  cli.set_connection_timeout(10, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers.emplace("Content-Type", "application/json");
  if (!o.api_key.empty()) req.headers.emplace("Authorization", "Bearer " + o.api_key);
  req.body = body.dump();
  std::string buffer;
  int text_deltas = 0, usage_tokens = -1;
  double t_first = 0, t_last = 0;
  const double t0 = now_s();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t at;
    while ((at = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, at);
      buffer.erase(0, at + 2);
      const size_t d = event.find("data: ");
      if (d == std::string::npos) continue;
      const std::string payload = event.substr(d + 6);
      if (payload == "[DONE]") continue;
      auto j = nlohmann::json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens"))
        usage_tokens = j["usage"]["completion_tokens"].get<int>();
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      const double t = now_s();
      if (t_first == 0) t_first = t;
      t_last = t;
      const auto& c = j["choices"][0];
      if (c.contains("delta")) {
        const auto& dl = c["delta"];
        for (const char* k : {"content", "reasoning_content"})
          if (dl.contains(k) && dl[k].is_string() && !dl[k].get<std::string>().empty()) {
            ++text_deltas;
            break;
          }
      } else if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
        ++text_deltas;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  if (!cli.send(req, res, err)) {
    r.error = httplib::to_string(err);
    return r;
  }
  if (res.status != 200) {
    r.error = "HTTP " + std::to_string(res.status);
    return r;
  }
  r.total = now_s() - t0;
  // Without usage (a server that does not send it) the text deltas are the best count.
  r.tokens = usage_tokens >= 0 ? usage_tokens : text_deltas;
  r.ttft = t_first > 0 ? t_first - t0 : r.total;
  r.tpot = r.tokens > 1 && t_first > 0 ? (t_last - t_first) / double(r.tokens - 1) : 0;
  r.ok = r.tokens > 0;
  if (!r.ok) r.error = "no tokens";
  return r;
}

nlohmann::json completion_body(const Options& o, const std::vector<int>& prompt, int max_tokens) {
  return {{"model", o.model},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}}};
}

// A token-id prompt: the run's shared prefix, then ids of this request's own.
std::vector<int> token_prompt(const Options& o, std::mt19937& rng) {
  std::vector<int> ids;
  std::mt19937 prefix_rng(12345);  // one prefix for the whole run
  std::uniform_int_distribution<int> byte_token(3, 258);
  for (int i = 0; i < o.shared_prefix_tokens; ++i) ids.push_back(byte_token(prefix_rng));
  while (int(ids.size()) < o.prompt_tokens) ids.push_back(byte_token(rng));
  return ids;
}

nlohmann::json chat_body(const Options& o, const std::string& prompt, int max_tokens) {
  return {{"model", o.model},
          {"messages", {{{"role", "user"}, {"content", prompt}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}}};
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = size_t(pos), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

struct LevelResult {
  int clients = 0;
  int ok = 0, failed = 0;
  double wall = 0, tokens_per_s = 0;
  std::vector<double> ttft, tpot;
  int64_t tokens = 0;
  // step35's distinct routed experts per MoE layer per step, sampled from /metrics while the
  // level runs (the union of the batch's experts each step reads); < 0 when the server does
  // not export it (llama-server).
  double distinct_experts = -1;
};

// The value of one unlabelled Prometheus metric, or < 0 when absent.
double scrape_metric(const Options& o, const std::string& name) {
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(5, 0);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  auto res = cli.Get("/metrics", headers);
  if (!res || res->status != 200) return -1;
  const size_t at = res->body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::atof(res->body.c_str() + at + name.size() + 2);
}

LevelResult run_level(const Options& o, int n_clients, uint32_t seed) {
  LevelResult lr;
  lr.clients = n_clients;
  std::mutex mu;
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  std::vector<double> distinct;
  std::thread sampler([&] {
    while (!done.load()) {
      const double v = scrape_metric(o, "step35_distinct_experts_per_step");
      if (v < 0) return;
      if (v > 0) distinct.push_back(v);
      for (int i = 0; i < 10 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const double t0 = now_s();
  for (int c = 0; c < n_clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(seed * 7919u + uint32_t(c));
      for (int i = 0; i < o.requests; ++i) {
        const RequestResult r =
            o.prompt_tokens > 0
                ? stream_one(o, "/v1/completions", completion_body(o, token_prompt(o, rng), o.max_tokens))
                : stream_one(o, "/v1/chat/completions", chat_body(o, random_prompt(rng, o.prompt_words), o.max_tokens));
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok) {
          ++lr.ok;
          lr.tokens += r.tokens;
          lr.ttft.push_back(r.ttft);
          if (r.tpot > 0) lr.tpot.push_back(r.tpot);
        } else {
          ++lr.failed;
          std::fprintf(stderr, "request failed: %s\n", r.error.c_str());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  lr.wall = now_s() - t0;
  done = true;
  sampler.join();
  // The server's gauge averages a window of recent steps; the median of the samples taken
  // while this level ran is that level's figure.
  if (!distinct.empty()) lr.distinct_experts = percentile(distinct, 0.5);
  lr.tokens_per_s = double(lr.tokens) / lr.wall;
  return lr;
}

// TTFT of low_latency requests (short prompt, few tokens) sent one at a time.
std::vector<double> probe_ttft(const Options& o, int n, uint32_t seed, std::atomic<bool>* stop = nullptr) {
  std::vector<double> out;
  std::mt19937 rng(seed);
  for (int i = 0; i < n && !(stop && stop->load()); ++i) {
    nlohmann::json body = chat_body(o, random_prompt(rng, 16), 4);
    body["routing_hint"] = "low_latency";
    const RequestResult r = stream_one(o, "/v1/step35/execute", body);
    if (r.ok) out.push_back(r.ttft);
  }
  return out;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(std::stoi(s.substr(i, j - i)));
    i = j + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "serve_load: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--url") {
        std::string u = next();
        if (u.rfind("http://", 0) == 0) u = u.substr(7);
        const size_t colon = u.rfind(':');
        o.host = u.substr(0, colon);
        o.port = std::stoi(u.substr(colon + 1));
      } else if (a == "--clients") {
        o.clients = parse_list(next());
      } else if (a == "--requests") {
        o.requests = std::stoi(next());
      } else if (a == "--prompt-words") {
        o.prompt_words = std::stoi(next());
      } else if (a == "--prompt-tokens") {
        o.prompt_tokens = std::stoi(next());
      } else if (a == "--shared-prefix-tokens") {
        o.shared_prefix_tokens = std::stoi(next());
      } else if (a == "--max-tokens") {
        o.max_tokens = std::stoi(next());
      } else if (a == "--api-key") {
        o.api_key = next();
      } else if (a == "--model") {
        o.model = next();
      } else if (a == "--probe-low-latency") {
        o.probe_low_latency = true;
      } else if (a == "--json") {
        o.json = true;
      } else if (a == "--help" || a == "-h") {
        std::printf(
            "usage: serve_load [--url http://127.0.0.1:8080] [--clients 1,4,8,16] [--requests R]\n"
            "                  [--prompt-words W | --prompt-tokens N [--shared-prefix-tokens P]]\n"
            "                  [--max-tokens M] [--api-key KEY] [--model NAME] [--probe-low-latency] [--json]\n");
        return 0;
      } else {
        std::fprintf(stderr, "serve_load: unknown option %s\n", a.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "serve_load: bad value for %s\n", a.c_str());
      return 2;
    }
  }

  if (o.shared_prefix_tokens > o.prompt_tokens) {
    std::fprintf(stderr, "serve_load: --shared-prefix-tokens %d is longer than --prompt-tokens %d\n",
                 o.shared_prefix_tokens, o.prompt_tokens);
    return 2;
  }
  nlohmann::json report = nlohmann::json::array();
  if (!o.json) {
    std::printf("| clients | requests ok/failed | tokens/s (aggregate) | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | "
                "distinct experts per MoE layer per step |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  }
  for (size_t li = 0; li < o.clients.size(); ++li) {
    const LevelResult lr = run_level(o, o.clients[li], uint32_t(li + 1));
    const double t50 = percentile(lr.ttft, 0.5) * 1e3, t99 = percentile(lr.ttft, 0.99) * 1e3;
    const double p50 = percentile(lr.tpot, 0.5) * 1e3, p99 = percentile(lr.tpot, 0.99) * 1e3;
    report.push_back({{"clients", lr.clients},
                      {"ok", lr.ok},
                      {"failed", lr.failed},
                      {"tokens", lr.tokens},
                      {"wall_s", lr.wall},
                      {"tokens_per_s", lr.tokens_per_s},
                      {"ttft_ms", {{"p50", t50}, {"p99", t99}}},
                      {"tpot_ms", {{"p50", p50}, {"p99", p99}}},
                      {"distinct_experts_per_step", lr.distinct_experts >= 0 ? nlohmann::json(lr.distinct_experts)
                                                                            : nlohmann::json(nullptr)}});
    if (!o.json) {
      char distinct[32] = "—";
      if (lr.distinct_experts >= 0) std::snprintf(distinct, sizeof distinct, "%.1f", lr.distinct_experts);
      std::printf("| %d | %d/%d | %.1f | %.0f / %.0f | %.1f / %.1f | %s |\n", lr.clients, lr.ok, lr.failed,
                  lr.tokens_per_s, t50, t99, p50, p99, distinct);
      std::fflush(stdout);
    }
  }
  nlohmann::json out = {{"levels", report}};
  if (o.probe_low_latency) {
    // Unloaded, then while the largest client count runs.
    const auto alone = probe_ttft(o, 8, 99);
    std::atomic<bool> stop{false};
    std::vector<double> loaded;
    std::thread probe([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the load ramp up
      loaded = probe_ttft(o, 20, 98, &stop);
    });
    const int n = *std::max_element(o.clients.begin(), o.clients.end());
    const LevelResult lr = run_level(o, n, 77);
    stop = true;
    probe.join();
    const double a99 = percentile(alone, 0.99) * 1e3, l99 = percentile(loaded, 0.99) * 1e3;
    out["low_latency"] = {{"unloaded_ttft_ms", {{"p50", percentile(alone, 0.5) * 1e3}, {"p99", a99}}},
                          {"loaded_ttft_ms", {{"p50", percentile(loaded, 0.5) * 1e3}, {"p99", l99}}},
                          {"load_clients", n},
                          {"load_tokens_per_s", lr.tokens_per_s},
                          {"probes", loaded.size()},
                          {"ratio_p99", a99 > 0 ? l99 / a99 : 0}};
    if (!o.json)
      std::printf("\nlow_latency TTFT: unloaded p99 %.0f ms, under %d clients p99 %.0f ms (x%.2f, %zu probes)\n", a99, n,
                  l99, a99 > 0 ? l99 / a99 : 0.0, loaded.size());
  }
  if (o.json) std::printf("%s\n", out.dump().c_str());
  return 0;
}
