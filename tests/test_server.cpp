// Integration tests of `step35 serve`: the real binary on a 127.0.0.1 port, spoken to over
// HTTP (cpp-httplib client, and curl for SSE streams and client disconnects).
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "json_schema_check.h"
#include "serve_process.h"
#include "support.h"

using namespace step35::testing;
using nlohmann::json;

// Clang spells the sanitizers as features, GCC as macros.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STEP35_TEST_SANITIZER 1
#endif
#endif
#ifndef STEP35_TEST_SANITIZER
#define STEP35_TEST_SANITIZER 0
#endif

namespace {

const std::string kModel = "tiny-a-q8_0.gguf";

// `step35 serve` on the tiny-a fixture with one thread, plus an HTTP client for it.
class ServerProcess : public ServeProcess {
 public:
  explicit ServerProcess(std::vector<std::string> extra = {})
      : ServeProcess(args(std::move(extra)), "server") {}
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(120, 0);
    return c;
  }

 private:
  static std::vector<std::string> args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"-m", fixture_model(kModel), "-t", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

json post(const ServerProcess& s, const std::string& path, const json& body, int* status = nullptr,
          const httplib::Headers& headers = {}) {
  auto c = s.client();
  auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response from " << path;
    return json();
  }
  if (status) *status = r->status;
  return json::parse(r->body);
}

// Generated text as JSON carries it (invalid UTF-8 replaced by U+FFFD).
std::string as_json_text(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

std::string run_greedy(const std::string& prompt, int n) {
  std::string out;
  EXPECT_EQ(run_command(step35_binary() + " run -m '" + fixture_model(kModel) + "' --chat -p '" + prompt +
                            "' --temp 0 -n " + std::to_string(n) + " -t 1",
                        &out, nullptr),
            0);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return as_json_text(out);
}

json chat_body(const std::string& prompt, int max_tokens) {
  return {{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"temperature", 0}, {"max_tokens", max_tokens}};
}

// SSE data payloads of a curl-ed stream.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

// One /metrics scrape: the values of the metrics `names` (-1 for one that is missing or
// when nothing answered). Values that must agree come from one scrape: the scheduler
// publishes them together, and a request can end between two scrapes.
std::vector<double> metrics(const ServerProcess& s, const std::vector<std::string>& names) {
  auto c = s.client();
  auto r = c.Get("/metrics");
  std::vector<double> values;
  for (const std::string& name : names) {
    const size_t at = r ? r->body.find("\n" + name + " ") : std::string::npos;
    values.push_back(at == std::string::npos ? -1 : std::stod(r->body.substr(at + name.size() + 2)));
  }
  return values;
}

double metric(const ServerProcess& s, const std::string& name) { return metrics(s, {name})[0]; }

}  // namespace

// MTP statistics reach /metrics: steps, tokens, and drafts / accepted / acceptance rate per
// draft position, consistent with each other (tiny-a has one MTP block).
TEST(Server, MtpAcceptanceByPositionInMetrics) {
  ServerProcess s({"--mtp", "2"});
  int status = 0;
  json r = post(s, "/v1/chat/completions", chat_body("Hello there", 24), &status);
  ASSERT_EQ(status, 200) << r.dump();
  const double steps = metric(s, "step35_mtp_steps_total"), tokens = metric(s, "step35_mtp_tokens_total");
  EXPECT_GT(steps, 0);
  EXPECT_GE(tokens, steps);
  for (int k = 1; k <= 2; ++k) {
    const std::string pos = "{position=\"" + std::to_string(k) + "\"}";
    const double drafted = metric(s, "step35_mtp_drafts_total" + pos);
    const double accepted = metric(s, "step35_mtp_accepted_total" + pos);
    const double rate = metric(s, "step35_mtp_acceptance_rate" + pos);
    EXPECT_GT(drafted, 0) << k;
    EXPECT_GE(accepted, 0) << k;
    EXPECT_LE(accepted, drafted) << k;
    EXPECT_NEAR(rate, drafted > 0 ? accepted / drafted : 0, 1e-6) << k;
  }
  EXPECT_EQ(metric(s, "step35_mtp_drafts_total{position=\"3\"}"), 0);  // --mtp 2: no third draft
}

TEST(Server, GreedyChatEqualsRunAloneAndUnderLoad) {
  ServerProcess s({"--parallel", "9"});
  const std::string expected = run_greedy("Hello there", 24);
  ASSERT_FALSE(expected.empty());
  int status = 0;
  json r = post(s, "/v1/chat/completions", chat_body("Hello there", 24), &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"].get<std::string>(), expected);
  EXPECT_EQ(r["usage"]["completion_tokens"].get<int>(), 24);
  // The same request with 8 others in flight (different prompts and lengths).
  std::vector<std::future<json>> others;
  for (int i = 0; i < 8; ++i)
    others.push_back(std::async(std::launch::async, [&, i] {
      json b = chat_body("other prompt number " + std::to_string(i), 2000 + 10 * i);
      b["ignore_eos"] = true;
      return post(s, "/v1/chat/completions", b);
    }));
  // Wait until the others are being generated, then send the request again.
  for (int i = 0; i < 200 && metric(s, "step35_running_sequences") < 8; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metric(s, "step35_running_sequences"), 8);
  json again = post(s, "/v1/chat/completions", chat_body("Hello there", 24), &status);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(others[size_t(i)].get()["usage"]["completion_tokens"].get<int>(), 2000 + 10 * i);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(again["choices"][0]["message"]["content"].get<std::string>(), expected);
}

// Each KV cache type through the HTTP API: the greedy chat equals `run` with the same cache
// type, the start-up line and /metrics count bytes of that type (Q8_0 keys and values take
// 34/64 of F16's), and a request whose prompt plus max_tokens exceeds the context is a 400
// naming both numbers, while a request already running is not disturbed.
TEST(Server, CacheTypesAndContextLimit) {
  double f16_bytes = 0;
  for (const char* type : {"f16", "q8_0", "q4_0", "bf16", "f32"}) {
    SCOPED_TRACE(type);
    // The q8_0 server's steps take at least 30 ms each (the server's test seam), so that its
    // 100-token request below is surely still running when /metrics is read: at full speed it
    // could finish between two scrapes on a loaded machine (a flake of full runs).
    const bool slow_steps = std::string(type) == "q8_0";
    if (slow_steps) setenv("STEP35_TEST_STEP_DELAY_MS", "30", 1);
    ServerProcess s({"-c", "160", "--parallel", "2", "-ctk", type, "-ctv", type});
    if (slow_steps) unsetenv("STEP35_TEST_STEP_DELAY_MS");
    std::string expected;
    ASSERT_EQ(run_command(step35_binary() + " run -m '" + fixture_model(kModel) + "' --chat -p 'Hello there' --temp 0 " +
                              "-n 24 -t 1 -ctk " + type + " -ctv " + type,
                          &expected, nullptr),
              0);
    if (!expected.empty() && expected.back() == '\n') expected.pop_back();
    int status = 0;
    json r = post(s, "/v1/chat/completions", chat_body("Hello there", 24), &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["content"].get<std::string>(), as_json_text(expected));
    const double bytes = metric(s, "step35_kv_bytes_total");
    EXPECT_GT(bytes, 0);
    // Nothing running once the scheduler has published the step that ended the request.
    for (int i = 0; i < 200 && metric(s, "step35_kv_bytes_used") != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(metric(s, "step35_kv_bytes_used"), 0);
    // The answer's positions were written, so some of the pool is in memory, and it stays
    // there after the blocks were freed; never more than the pool.
    const double resident = metric(s, "step35_kv_bytes_resident");
    EXPECT_GT(resident, 0);
    EXPECT_LE(resident, bytes + 2 * 4096.0);  // each kind's mapping rounded up to whole pages
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || STEP35_TEST_SANITIZER
    // A sanitizer's allocator replaces glibc's: the server leaves the heap figures out.
    EXPECT_EQ(metric(s, "step35_heap_bytes{kind=\"in_use\"}"), -1);
#else
    EXPECT_GT(metric(s, "step35_heap_bytes{kind=\"in_use\"}"), 0);
#endif
    if (std::string(type) == "f16") f16_bytes = bytes;
    if (std::string(type) == "q8_0") {
      EXPECT_DOUBLE_EQ(bytes, f16_bytes * 34 / 64);
    }
    std::ifstream log(s.log_path());
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(std::string("(K ") + type + ", V " + type + ")"), std::string::npos) << text;
    if (std::string(type) != "q8_0") continue;

    // A long request runs while an oversized one is refused.
    json long_body = chat_body("keep going", 100);
    long_body["ignore_eos"] = true;
    auto running = std::async(std::launch::async, [&] { int st = 0; json j = post(s, "/v1/chat/completions", long_body, &st); return std::make_pair(st, j); });
    std::vector<double> running_and_used;
    for (int i = 0; i < 1000; ++i) {
      running_and_used = metrics(s, {"step35_running_sequences", "step35_kv_bytes_used"});
      if (running_and_used[0] >= 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GE(running_and_used[0], 1) << "the long request was never seen running";
    EXPECT_GT(running_and_used[1], 0) << "a running sequence holds no KV blocks";
    json big = post(s, "/v1/chat/completions", chat_body("Hello there", 150), &status);
    EXPECT_EQ(status, 400) << big.dump();
    const std::string msg = big["error"]["message"].get<std::string>();
    EXPECT_NE(msg.find("max_tokens (150)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("context of 160 tokens"), std::string::npos) << msg;
    const auto [st, done] = running.get();
    EXPECT_EQ(st, 200) << done.dump();
    EXPECT_EQ(done["usage"]["completion_tokens"], 100);
  }
}

TEST(Server, StreamingFramingDoneAndUsage) {
  ServerProcess s;
  json body = chat_body("Hello there", 12);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  std::string out;
  ASSERT_EQ(run_command("curl -sN " + s.url("/v1/chat/completions") + " -H 'Content-Type: application/json' -d '" +
                            body.dump() + "'",
                        &out),
            0);
  auto payloads = sse_payloads(out);
  ASSERT_GE(payloads.size(), 3u) << out;
  EXPECT_EQ(payloads.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < payloads.size(); ++i) {
    json c = json::parse(payloads[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  json usage = json::parse(payloads[payloads.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(text, run_greedy("Hello there", 12));
}

TEST(Server, CompletionsModelsHealthTokenize) {
  ServerProcess s;
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], kModel);
  int status = 0;
  json tk = post(s, "/tokenize", {{"content", "The quick brown fox"}}, &status);
  ASSERT_EQ(status, 200);
  json dt = post(s, "/detokenize", {{"tokens", tk["tokens"]}, {"special", false}}, &status);
  EXPECT_EQ(dt["content"], "The quick brown fox");
  // A string prompt and the same prompt as token ids give the same greedy text.
  json a = post(s, "/v1/completions", {{"prompt", "The quick brown fox"}, {"max_tokens", 8}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << a.dump();
  json b = post(s, "/v1/completions", {{"prompt", tk["tokens"]}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", 2}});
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_EQ(b["choices"][0]["logprobs"]["tokens"].size(), 8u);
  EXPECT_EQ(b["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(a["usage"]["prompt_tokens"].get<size_t>(), tk["tokens"].size());
  // Chat logprobs: one entry per token, each with top_logprobs sorted best first.
  json body = chat_body("hi", 5);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  json lp = post(s, "/v1/chat/completions", body);
  const json& entries = lp["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(entries.size(), 5u);
  for (const json& e : entries) {
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_EQ(e["logprob"].get<double>(), e["top_logprobs"][0]["logprob"].get<double>());  // greedy
  }
}

TEST(Server, NChoicesAndStopStrings) {
  ServerProcess s;
  json body = chat_body("Tell me", 16);
  body["n"] = 3;
  body["temperature"] = 1.0;
  body["seed"] = 7;
  json r = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(r["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r["choices"][i]["index"], i);
  // A stop string taken from the greedy text cuts the content right before it.
  const std::string full = run_greedy("Tell me", 24);
  ASSERT_GE(full.size(), 8u);
  // Two ASCII characters from the second half (a stop string is text, not a byte cut).
  std::string stop;
  for (size_t i = full.size() / 2; i + 1 < full.size() && stop.empty(); ++i)
    if (uint8_t(full[i]) < 0x80 && uint8_t(full[i + 1]) < 0x80 && full[i] != ' ') stop = full.substr(i, 2);
  ASSERT_FALSE(stop.empty()) << full;
  json sb = chat_body("Tell me", 24);
  sb["stop"] = stop;
  json st = post(s, "/v1/chat/completions", sb);
  EXPECT_EQ(st["choices"][0]["message"]["content"], full.substr(0, full.find(stop)));
  EXPECT_EQ(st["choices"][0]["finish_reason"], "stop");
}

TEST(Server, ErrorsHaveStatusAndShape) {
  ServerProcess s({"--max-body", "4096"});
  auto c = s.client();
  auto bad = c.Post("/v1/chat/completions", "{not json", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_TRUE(json::parse(bad->body)["error"].contains("message"));
  int status = 0;
  json body = chat_body("x", 4);
  body["temperature"] = "hot";
  json e = post(s, "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "temperature");
  body = chat_body("x", 4);
  body["frobnicate"] = 1;
  post(s, "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  body = chat_body("x", 4);
  body["response_format"] = {{"type", "yaml"}};
  post(s, "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  post(s, "/v1/chat/completions", {{"messages", json::array()}}, &status);
  EXPECT_EQ(status, 400);
  auto nf = c.Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(json::parse(nf->body)["error"]["code"], 404);
  auto big = c.Post("/v1/completions", std::string(10000, ' '), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
}

TEST(Server, ApiKeyGuardsEverythingButHealth) {
  ServerProcess s({"--api-key", "sekrit"});
  auto c = s.client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  int status = 0;
  post(s, "/tokenize", {{"content", "a"}}, &status);
  EXPECT_EQ(status, 401);
  post(s, "/tokenize", {{"content", "a"}}, &status, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(status, 401);
  post(s, "/tokenize", {{"content", "a"}}, &status, {{"Authorization", "Bearer sekrit"}});
  EXPECT_EQ(status, 200);
  post(s, "/tokenize", {{"content", "a"}}, &status, {{"x-api-key", "sekrit"}});
  EXPECT_EQ(status, 200);
}

TEST(Server, TimeoutIs408AndFullQueueIs503WithRetryAfter) {
  {
    ServerProcess s({"--timeout", "0.2"});
    int status = 0;
    json body = chat_body("x", 4000);
    body["ignore_eos"] = true;
    json e = post(s, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 408) << e.dump();
  }
  ServerProcess s({"--parallel", "1", "--max-queue", "0"});
  json body = chat_body("x", 300);
  body["ignore_eos"] = true;
  std::vector<std::future<int>> calls;
  for (int i = 0; i < 4; ++i)
    calls.push_back(std::async(std::launch::async, [&] {
      auto c = s.client();
      auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
      if (r && r->status == 503) {
        EXPECT_FALSE(r->get_header_value("Retry-After").empty());
      }
      return r ? r->status : -1;
    }));
  int n503 = 0;
  for (auto& f : calls) n503 += f.get() == 503;
  EXPECT_GE(n503, 1);
}

TEST(Server, ClientDisconnectCancelsAndFreesKvBlocks) {
  ServerProcess s;
  json body = chat_body("a long story", 3000);
  body["ignore_eos"] = true;
  body["stream"] = true;
  std::string out;
  run_command("curl -sN --max-time 1 " + s.url("/v1/chat/completions") + " -d '" + body.dump() + "'", &out);
  EXPECT_NE(out.find("data: "), std::string::npos);
  double used = -1, running = -1;
  for (int i = 0; i < 100; ++i) {
    const std::vector<double> m = metrics(s, {"step35_kv_blocks_used", "step35_running_sequences"});
    used = m[0];
    running = m[1];
    if (used == 0 && running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(used, 0);
  EXPECT_EQ(running, 0);
  EXPECT_GT(metric(s, "step35_kv_blocks_total"), 0);
}

TEST(Server, ExecuteEndpointAppliesPolicy) {
  ServerProcess s;
  int status = 0;
  json body = chat_body("hi", 6);
  body["routing_hint"] = "low_latency";
  body["context_window"] = 256;
  body["expert_policy"] = "adaptive";
  json r = post(s, "/v1/step35/execute", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["step35"]["expert_policy_applied"], "adaptive");
  EXPECT_EQ(r["step35"]["priority"], "low_latency");
  EXPECT_EQ(r["step35"]["context_window"], 256);
  body["expert_policy"] = "strict";
  body["routing_hint"] = "high_throughput";
  r = post(s, "/v1/step35/execute", body, &status);
  EXPECT_EQ(r["step35"]["expert_policy_applied"], "strict");
  body["expert_policy"] = "auto";
  r = post(s, "/v1/step35/execute", body, &status);
  EXPECT_EQ(r["step35"]["expert_policy_applied"], "strict");
  for (const char* field : {"routing_hint", "expert_policy"}) {
    json bad = chat_body("hi", 2);
    bad[field] = "fastest";
    post(s, "/v1/step35/execute", bad, &status);
    EXPECT_EQ(status, 400) << field;
  }
  json small = chat_body("hi", 100);
  small["context_window"] = 8;  // shorter than the prompt
  post(s, "/v1/step35/execute", small, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(metric(s, "step35_routing_hint_compliance"), 1);
}

TEST(Server, ForcedToolCallsAndJsonSchema) {
  ServerProcess s;
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":
      {"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]},"days":{"type":"integer","minimum":1,"maximum":9}},
       "required":["city","days"]}}}])");
  json body = chat_body("weather?", 200);
  body["tools"] = tools;
  body["tool_choice"] = "required";
  int status = 0;
  json r = post(s, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& msg = r["choices"][0]["message"];
  ASSERT_TRUE(msg.contains("tool_calls")) << r.dump();
  const json& call = msg["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  const json args = json::parse(call["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(args["days"].is_number_integer()) << args.dump();
  EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << args.dump();
  const std::string content = msg["content"].is_null() ? "" : msg["content"].get<std::string>();
  EXPECT_EQ(content.find("tool_call"), std::string::npos);
  EXPECT_EQ(content.find("<function"), std::string::npos);

  const json schema = json::parse(R"({"type":"object","properties":{"answer":{"enum":["yes","no"]},
      "n":{"type":"integer","minimum":0,"maximum":99}},"required":["answer","n"],"additionalProperties":false})");
  json jb = chat_body("json please", 1000);
  jb["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}};
  r = post(s, "/v1/chat/completions", jb, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
  const json value = json::parse(r["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(schema_violation(schema, value), "");
  jb["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", {{"not", {}}}}}}};
  post(s, "/v1/chat/completions", jb, &status);
  EXPECT_EQ(status, 400);
}

TEST(Server, SigtermExitsCleanly) {
  ServerProcess s({"--shutdown-grace", "120"});
  // A request in flight at SIGTERM still completes (within --shutdown-grace).
  json body = chat_body("x", 30);
  body["ignore_eos"] = true;
  int status = 0;
  auto inflight = std::async(std::launch::async, [&] { return post(s, "/v1/chat/completions", body, &status); });
  for (int i = 0; i < 200 && metric(s, "step35_running_sequences") < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(s.terminate(), 0);
  const json r = inflight.get();
  EXPECT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 30);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
}

// --log-steps: one line per forward pass; a prompt pass, then one decode pass per further
// token, numbered in order, each with a forward time.
TEST(Server, LogStepsWritesOneLinePerPass) {
  ServerProcess s({"--log-steps", "--no-prefix-cache"});
  json body = chat_body("x", 5);
  body["ignore_eos"] = true;
  int status = 0;
  const json r = post(s, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const int prompt_tokens = r["usage"]["prompt_tokens"];
  EXPECT_EQ(s.terminate(), 0);
  std::ifstream in(s.log_path());
  std::vector<std::string> steps;
  for (std::string line; std::getline(in, line);)
    if (line.find("step35 serve: step ") == 0) steps.push_back(line);
  ASSERT_EQ(steps.size(), 5u) << "one prompt pass (giving the first token) and four decode passes";
  EXPECT_NE(steps[0].find("step 1: decode 0 tokens of 0 sequences, prompt " + std::to_string(prompt_tokens) +
                          " tokens in 1 chunks, forward "),
            std::string::npos)
      << steps[0];
  for (size_t i = 1; i < steps.size(); ++i)
    EXPECT_NE(steps[i].find("step " + std::to_string(i + 1) +
                            ": decode 1 tokens of 1 sequences, prompt 0 tokens in 0 chunks, forward "),
              std::string::npos)
        << steps[i];
  for (const std::string& line : steps) {
    const double ms = std::stod(line.substr(line.find("forward ") + 8));
    EXPECT_GT(ms, 0.0) << line;
    EXPECT_NE(line.find(" ms"), std::string::npos) << line;
  }
}

TEST(Server, AnthropicMessages) {
  ServerProcess s({"--api-key", "k"});
  const httplib::Headers key = {{"x-api-key", "k"}, {"anthropic-version", "2023-06-01"}};
  json body = {{"model", "m"},
               {"max_tokens", 12},
               {"temperature", 0},
               {"system", "be brief"},
               {"messages", {{{"role", "user"}, {"content", "Hello there"}}}}};
  int status = 0;
  json r = post(s, "/v1/messages", body, &status, key);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["type"], "message");
  EXPECT_EQ(r["stop_reason"], "max_tokens");
  EXPECT_EQ(r["usage"]["output_tokens"], 12);
  ASSERT_EQ(r["content"][0]["type"], "text");
  // Streaming: the named events in order, and the text deltas concatenate to the same text.
  body["stream"] = true;
  std::string out;
  ASSERT_EQ(run_command("curl -sN " + s.url("/v1/messages") + " -H 'x-api-key: k' -d '" + body.dump() + "'", &out), 0);
  std::vector<std::string> events;
  for (size_t at = 0; (at = out.find("event: ", at)) != std::string::npos; at += 7)
    events.push_back(out.substr(at + 7, out.find('\n', at) - at - 7));
  ASSERT_GE(events.size(), 5u) << out;
  EXPECT_EQ(events.front(), "message_start");
  EXPECT_EQ(events[1], "content_block_start");
  EXPECT_EQ(events[events.size() - 3], "content_block_stop");
  EXPECT_EQ(events[events.size() - 2], "message_delta");
  EXPECT_EQ(events.back(), "message_stop");
  std::string text;
  for (const std::string& p : sse_payloads(out)) {
    json e = json::parse(p);
    if (e["type"] == "content_block_delta") text += e["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(text, r["content"][0]["text"].get<std::string>());
  // Tools: a forced call comes back as a tool_use block with a typed input.
  json tb = {{"model", "m"}, {"max_tokens", 300}, {"temperature", 0},
             {"messages", {{{"role", "user"}, {"content", "call it"}}}},
             {"tools", {{{"name", "count"}, {"input_schema", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}}, {"required", {"n"}}}}}}},
             {"tool_choice", {{"type", "any"}}}};
  json t = post(s, "/v1/messages", tb, &status, key);
  ASSERT_EQ(status, 200) << t.dump();
  EXPECT_EQ(t["stop_reason"], "tool_use") << t.dump();
  ASSERT_EQ(t["content"].back()["type"], "tool_use") << t.dump();
  EXPECT_TRUE(t["content"].back()["input"]["n"].is_number_integer()) << t.dump();
  // Errors in Anthropic's shape.
  json e = post(s, "/v1/messages", {{"messages", json::array()}}, &status, key);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  post(s, "/v1/messages", body, &status);
  EXPECT_EQ(status, 401);
}
