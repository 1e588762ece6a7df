// hotswap_load: expert hot-swap under load. N concurrent streaming clients send greedy
// completions to a running `step35 serve` while a swapper alternates
// POST /v1/step35/hotswap {"patch": FILE} and POST /v1/step35/hotswap/revert at a fixed
// interval. Afterwards each prompt is replayed alone with the base weights and with the
// patch; every request of the load phase must have completed and produced exactly one of
// the two replays (a request that saw both weight sets would match neither).
//
//   hotswap_load --port P --patch FILE [--streams 8] [--seconds 60] [--swap-ms 1000]
//                [--max-tokens 32] [--min-swaps N] [--api-key KEY] [--json]
//
// Exit status 0 when every request completed with one weight set and at least one swap
// happened; 1 otherwise. The ctest HotSwap.LoadTest runs it for a few seconds; docs/finetune.md
// gives the long run.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Options {
  int port = 8080;
  std::string patch;
  int streams = 8;
  double seconds = 60;
  int swap_ms = 1000;
  int max_tokens = 32;
  int min_swaps = 0;  // keep loading past `seconds` until this many swaps (a slow machine)
  std::string api_key;
  bool json = false;
};

struct Outcome {
  size_t prompt = 0;
  bool ok = false;
  std::string text, finish, error;
};

httplib::Headers headers(const Options& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

std::string make_prompt(size_t i) {
  static const char* words[] = {"expert", "router", "window", "token", "layer", "swap",  "stream", "patch",
                                "gate",   "value",  "query",  "key",   "norm",  "river", "stone",  "light"};
  std::string s = "Prompt " + std::to_string(i) + ":";
  for (size_t k = 0; k < 12; ++k) s += std::string(" ") + words[(i * 7 + k * 5 + k * k) % 16];
  return s;
}

// One greedy streaming completion; the text is the concatenation of the streamed pieces.
Outcome complete(const Options& o, size_t prompt) {
  Outcome out;
  out.prompt = prompt;
  httplib::Client c("127.0.0.1", o.port);
  c.set_read_timeout(600, 0);
  const json body = {{"prompt", make_prompt(prompt)}, {"max_tokens", o.max_tokens}, {"temperature", 0},
                     {"ignore_eos", true},            {"stream", true}};
  std::string buffer;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = headers(o);
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t nl;
    while ((nl = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, nl);
      buffer.erase(0, nl + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") continue;
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
      const json& ch = j["choices"][0];
      if (ch.contains("text") && ch["text"].is_string()) out.text += ch["text"].get<std::string>();
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) out.finish = ch["finish_reason"];
    }
    return true;
  };
  auto res = c.send(req);
  if (!res) {
    out.error = "no response (" + httplib::to_string(res.error()) + ")";
  } else if (res->status != 200) {
    out.error = "HTTP " + std::to_string(res->status);
  } else {
    out.ok = out.finish == "length";
    if (!out.ok) out.error = "finish_reason '" + out.finish + "'";
  }
  return out;
}

bool post_ok(const Options& o, const std::string& path, const json& body, std::string* err) {
  httplib::Client c("127.0.0.1", o.port);
  c.set_read_timeout(600, 0);
  auto r = c.Post(path.c_str(), headers(o), body.dump(), "application/json");
  if (r && r->status == 200) return true;
  if (err) *err = r ? "HTTP " + std::to_string(r->status) + ": " + r->body : "no response";
  return false;
}

int usage() {
  std::fprintf(stderr,
               "usage: hotswap_load --port P --patch FILE [--streams 8] [--seconds 60] [--swap-ms 1000] "
               "[--max-tokens 32] [--min-swaps N] [--api-key KEY] [--json]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hotswap_load: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--port") o.port = std::atoi(value().c_str());
    else if (a == "--patch") o.patch = value();
    else if (a == "--streams") o.streams = std::atoi(value().c_str());
    else if (a == "--seconds") o.seconds = std::atof(value().c_str());
    else if (a == "--swap-ms") o.swap_ms = std::atoi(value().c_str());
    else if (a == "--max-tokens") o.max_tokens = std::atoi(value().c_str());
    else if (a == "--min-swaps") o.min_swaps = std::atoi(value().c_str());
    else if (a == "--api-key") o.api_key = value();
    else if (a == "--json") o.json = true;
    else return usage();
  }
  if (o.port <= 0 || o.patch.empty() || o.streams < 1 || o.seconds <= 0 || o.swap_ms < 1 || o.max_tokens < 1 ||
      o.min_swaps < 0)
    return usage();

  // Load phase: each stream cycles over two prompts of its own; the swapper alternates
  // swap and revert.
  const size_t n_prompts = size_t(o.streams) * 2;
  std::mutex mu;
  std::vector<Outcome> outcomes;
  std::atomic<bool> stop{false};
  const double t0 = now_s();
  std::vector<std::thread> clients;
  for (int s = 0; s < o.streams; ++s)
    clients.emplace_back([&, s] {
      for (size_t k = 0; !stop; ++k) {
        Outcome r = complete(o, size_t(s) * 2 + k % 2);
        std::lock_guard<std::mutex> lock(mu);
        outcomes.push_back(std::move(r));
      }
    });
  int swaps = 0, reverts = 0, swap_errors = 0;
  std::string swap_error;
  bool patched = false;
  // The load lasts `seconds`, and longer (up to ten times that) until `min_swaps` swaps went
  // through: under a sanitizer on a busy machine one swap can take seconds.
  auto more = [&] {
    const double t = now_s() - t0;
    return t < o.seconds || (swaps < o.min_swaps && t < 10 * o.seconds);
  };
  while (more()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.swap_ms));
    const bool ok = patched ? post_ok(o, "/v1/step35/hotswap/revert", json::object(), &swap_error)
                            : post_ok(o, "/v1/step35/hotswap", {{"patch", o.patch}}, &swap_error);
    if (!ok) {
      ++swap_errors;
      continue;
    }
    (patched ? reverts : swaps) += 1;
    patched = !patched;
  }
  stop = true;
  for (auto& t : clients) t.join();
  const double load_s = now_s() - t0;
  if (patched && post_ok(o, "/v1/step35/hotswap/revert", json::object(), &swap_error)) ++reverts;

  // Replays, one request at a time: base, then patched.
  std::vector<Outcome> base(n_prompts), with_patch(n_prompts);
  for (size_t p = 0; p < n_prompts; ++p) base[p] = complete(o, p);
  const bool swapped_for_replay = post_ok(o, "/v1/step35/hotswap", {{"patch", o.patch}}, &swap_error);
  for (size_t p = 0; p < n_prompts; ++p) with_patch[p] = complete(o, p);
  if (swapped_for_replay) post_ok(o, "/v1/step35/hotswap/revert", json::object(), nullptr);

  size_t failed = 0, mixed = 0, saw_base = 0, saw_patch = 0, same_both = 0;
  std::string first_problem;
  for (size_t p = 0; p < n_prompts; ++p)
    if (base[p].ok && with_patch[p].ok && base[p].text == with_patch[p].text) ++same_both;
  for (const Outcome& r : outcomes) {
    if (!r.ok) {
      ++failed;
      if (first_problem.empty()) first_problem = "prompt " + std::to_string(r.prompt) + ": " + r.error;
      continue;
    }
    const bool b = r.text == base[r.prompt].text, q = r.text == with_patch[r.prompt].text;
    saw_base += b;
    saw_patch += q && !b;
    if (!b && !q) {
      ++mixed;
      if (first_problem.empty()) first_problem = "prompt " + std::to_string(r.prompt) + " produced neither replay";
    }
  }
  bool replays_ok = swapped_for_replay;
  for (size_t p = 0; p < n_prompts; ++p) replays_ok = replays_ok && base[p].ok && with_patch[p].ok;
  const bool pass = failed == 0 && mixed == 0 && swaps > 0 && swap_errors == 0 && replays_ok;
  if (o.json) {
    const json j = {{"requests", outcomes.size()}, {"failed", failed},     {"mixed", mixed},
                    {"base_outputs", saw_base},    {"patched_outputs", saw_patch},
                    {"swaps", swaps},              {"reverts", reverts},   {"swap_errors", swap_errors},
                    {"prompts", n_prompts},        {"prompts_same_both", same_both},
                    {"seconds", load_s},           {"replays_ok", replays_ok},
                    {"pass", pass},                {"first_problem", first_problem},
                    {"swap_error", swap_error}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%zu requests in %.1f s with %d swaps and %d reverts: %zu failed, %zu mixed (base %zu, patched %zu)%s%s\n",
                outcomes.size(), load_s, swaps, reverts, failed, mixed, saw_base, saw_patch,
                first_problem.empty() ? "" : "; first problem: ", first_problem.c_str());
    if (same_both) std::printf("note: %zu of %zu prompts give the same text with and without the patch\n", same_both, n_prompts);
  }
  return pass ? 0 : 1;
}
