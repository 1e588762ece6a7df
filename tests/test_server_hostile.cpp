// Hostile HTTP against the real `step35 serve` on 127.0.0.1: malformed
// and wrongly typed bodies, absurd numbers, prompts past the context, invalid UTF-8, 10 MB
// bodies, slow-loris and idle connections, abrupt disconnects mid-stream, and cross-request
// isolation through the prefix cache. Every case must get the right 4xx or a clean close,
// and the server must keep serving others (checked after each group).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve_process.h"
#include "support.h"

namespace st = step35::testing;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string micro_model() { return std::string(PROJECT_SOURCE_DIR) + "/fuzz/corpus/gguf/micro-f16.gguf"; }

// `step35 serve` (by default on the micro model, context 256, 2 threads).
class Server : public st::ServeProcess {
 public:
  explicit Server(std::vector<std::string> extra = {}, const std::string& model = micro_model(), int ctx = 256)
      : ServeProcess(args(model, ctx, std::move(extra)), "hostile_server") {}
  httplib::Client client(int timeout_s = 60) const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(timeout_s, 0);
    c.set_connection_timeout(timeout_s, 0);
    return c;
  }
  // POSTs raw bytes; the status (-1: no response) and the body.
  int post(const std::string& path, const std::string& body, std::string* out = nullptr) const {
    auto r = client().Post(path.c_str(), body, "application/json");
    if (!r) return -1;
    if (out) *out = r->body;
    return r->status;
  }
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    const size_t at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + name.size() + 2));
  }
  // A short greedy chat completion works (the server still serves others).
  void expect_serving(const std::string& context) const {
    std::string out;
    const json body = {{"messages", {{{"role", "user"}, {"content", "still there?"}}}}, {"max_tokens", 3},
                       {"temperature", 0}};
    EXPECT_EQ(post("/v1/chat/completions", body.dump(), &out), 200) << context << ": " << out;
    EXPECT_TRUE(alive()) << context;
  }

 private:
  static std::vector<std::string> args(const std::string& model, int ctx, std::vector<std::string> extra) {
    std::vector<std::string> a = {"-m", model, "-t", "2", "-c", std::to_string(ctx)};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

// A raw TCP connection to the server (for what an HTTP client library will not send).
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawConn() { close_now(); }
  bool connected() const { return connected_; }
  bool send_all(const std::string& s) {
    size_t at = 0;
    while (at < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + at, s.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += size_t(n);
    }
    return true;
  }
  // Reads what arrives within `ms`; false once the peer closed.
  bool read_some(std::string* out, int ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return true;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    out->append(buf, size_t(n));
    return true;
  }
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

json chat(const std::string& prompt, int max_tokens) {
  return {{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

}  // namespace

TEST(ServerHostile, MalformedJsonWrongTypesMissingFields) {
  Server s;
  const std::vector<std::string> bodies = {
      "", "{", "{not json", "[]", "null", "42", "\"str\"", "{\"messages\": }", std::string(100000, '['),
      "{\"messages\": \"hi\"}", "{\"messages\": [1, 2]}", "{\"messages\": [{\"role\": 5, \"content\": \"x\"}]}",
      "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "{\"messages\": [{\"content\": \"x\"}]}",
      "{\"messages\": [{\"role\": \"user\", \"content\": {\"a\": 1}}]}", "{\"model\": \"x\"}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": \"yes\"}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": 7}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": \"all\"}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": [1]}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": \"10\"}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"seed\": 1.5}",
  };
  for (const std::string& b : bodies) {
    std::string out;
    const int status = s.post("/v1/chat/completions", b, &out);
    EXPECT_EQ(status, 400) << b.substr(0, 80) << " -> " << out.substr(0, 200);
    if (status == 400) {
      const json e = json::parse(out, nullptr, false);
      EXPECT_TRUE(!e.is_discarded() && e.contains("error")) << out.substr(0, 200);
    }
  }
  for (const char* path : {"/v1/completions", "/tokenize", "/v1/messages"}) {
    std::string out;
    EXPECT_EQ(s.post(path, "{\"prompt\": [[[", &out), 400) << path << ": " << out;
    EXPECT_EQ(s.post(path, "{}", &out) / 100, 4) << path << ": " << out;
  }
  s.expect_serving("after malformed bodies");
}

// JSON nested far deeper than any request needs, in every place a body can hold it: as a
// known field's value, as an unknown field of a message, as objects in objects, inside a
// tool call's arguments string. Each is refused with 400 before anything recursive runs
// (a recursive copy of such a DOM overflowed the HTTP thread's stack at 10^5 levels).
std::string nested_arrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }
std::string nested_objects(size_t depth) {
  std::string s;
  s.reserve(depth * 6 + 2);
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}

TEST(ServerHostile, DeepNestingIsRefusedOnEveryEndpoint) {
  Server s;
  const std::vector<std::string> endpoints = {
      "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
      "/v1/step35/execute", "/apply-template", "/tokenize", "/detokenize", "/v1/step35/hotswap",
      "/v1/step35/hotswap/revert"};
  for (const size_t depth : {size_t(10000), size_t(100000), size_t(1000000)}) {
    const std::string arrays = nested_arrays(depth), objects = nested_objects(depth);
    const std::vector<std::string> bodies = {
        "{\"messages\":" + arrays + "}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"x\":" + arrays + "}],\"max_tokens\":1}",
        "{\"prompt\":\"hi\",\"input\":\"hi\",\"content\":\"hi\",\"tokens\":[1],\"extra\":" + objects + "}",
        "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":\"hi\",\"deep\":" + objects + "}]}]}",
    };
    for (const std::string& path : endpoints)
      for (size_t b = 0; b < bodies.size(); ++b) {
        std::string out;
        const int status = s.post(path, bodies[b], &out);
        ASSERT_EQ(status, 400) << path << " body " << b << " at depth " << depth << ": " << out.substr(0, 200);
        EXPECT_NE(out.find("levels deep"), std::string::npos) << path << ": " << out.substr(0, 200);
        ASSERT_TRUE(s.alive()) << path << " body " << b << " at depth " << depth;
      }
  }
  // A tool call's arguments are a JSON string the template parses: the same limit holds there.
  const json deep_arguments = {
      {"messages",
       {{{"role", "user"}, {"content", "call it"}},
        {{"role", "assistant"},
         {"content", ""},
         {"tool_calls",
          {{{"id", "c1"},
            {"type", "function"},
            {"function", {{"name", "f"}, {"arguments", "{\"a\":" + nested_arrays(100000) + "}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}}},
      {"max_tokens", 1}};
  std::string out;
  EXPECT_EQ(s.post("/v1/chat/completions", deep_arguments.dump(), &out), 400) << out.substr(0, 200);
  EXPECT_NE(out.find("arguments nests"), std::string::npos) << out.substr(0, 200);
  // The limit itself: 256 levels pass the check (the field is then judged as usual), 257 do not.
  const auto at_depth = [](size_t depth) {
    return "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,\"metadata\":" +
           nested_arrays(depth - 1) + "}";
  };
  s.post("/v1/chat/completions", at_depth(256), &out);
  EXPECT_EQ(out.find("levels deep"), std::string::npos) << out.substr(0, 200);
  EXPECT_EQ(s.post("/v1/chat/completions", at_depth(257), &out), 400);
  EXPECT_NE(out.find("more than 256 levels deep"), std::string::npos) << out.substr(0, 200);
  s.expect_serving("after deeply nested bodies");
}

// Requests as real clients send them (OpenAI chat with tools and a schema, completions,
// Anthropic messages, Responses, tokenize), each mutated the way a hostile or broken client
// would: a value replaced by a number at the edges (-0.0, 1e400, 2^63, 2^64, a huge
// exponent), by another JSON type, by invalid or unusual Unicode, by a 100 KB string, or by
// nesting past the limit; keys given twice; the body cut short. Every answer must be a
// deliberate one (2xx, 4xx, or 503), never a 500 or a dropped connection, and the server
// keeps serving. Seeded, so a failure names a body that can be replayed.
std::vector<std::pair<std::string, json>> client_requests() {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"w",
      "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1}},
      "required":["city"]}}}])");
  const json history = json::parse(R"([{"role":"system","content":"be brief"},{"role":"user","content":"weather?"},
      {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather",
      "arguments":"{\"city\":\"Paris\",\"days\":2}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"},
      {"role":"user","content":[{"type":"text","text":"and tomorrow?"}]}])");
  return {
      {"/v1/chat/completions", {{"messages", history}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0.7},
                                {"top_p", 0.9}, {"seed", 7}, {"stop", {"\n\n"}}, {"logprobs", true}, {"top_logprobs", 2}}},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "json please"}}}}, {"max_tokens", 4},
        {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"},
         {"properties", {{"a", {{"type", "array"}, {"items", {{"type", "number"}}}}}}}}}}}}}}},
      {"/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 4}, {"n", 2}, {"logit_bias", {{"5", -100}}}}},
      {"/v1/messages", {{"model", "m"}, {"max_tokens", 4}, {"system", "be brief"},
                        {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}}}}}},
      {"/v1/responses", {{"input", "hello"}, {"max_output_tokens", 4}, {"instructions", "be brief"}}},
      {"/tokenize", {{"content", "hello world"}, {"add_special", true}, {"with_pieces", true}}},
      {"/apply-template", {{"messages", history}, {"tools", tools}}},
  };
}

// Every value of `j` (containers included), as JSON pointers.
void value_pointers(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) value_pointers(*it, at / it.key(), out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) value_pointers(j[i], at / i, out);
}

std::string mutated(json body, std::mt19937& rng) {
  std::vector<json::json_pointer> at;
  value_pointers(body, json::json_pointer(), at);
  const json::json_pointer target = at[1 + rng() % (at.size() - 1)];
  const auto pick = [&](std::initializer_list<const char*> options) {
    return std::string(*(options.begin() + rng() % options.size()));
  };
  const std::string marker = "\"@@MUTATION@@\"";
  std::string raw;  // text put where the marker is (for what json cannot hold)
  switch (rng() % 7) {
    case 0:  // a number at the edges (as text: json cannot hold 1e400 or 2^64)
      raw = pick({"-0.0", "1e400", "-1e400", "1e-400", "9223372036854775808", "18446744073709551616",
                  "-9223372036854775809", "18446744073709551615", "1e999999999", "4.9e-324", "0.5", "-1"});
      break;
    case 1:  // another JSON type
      body[target] = json::parse(pick({"null", "true", "[]", "{}", "\"\"", "0", "[1,\"a\",null]", "{\"x\":{}}"}));
      break;
    case 2:  // unusual or invalid text
      raw = pick({"\"\\ud800\"", "\"\\udfff\\ud800\"", "\"\\u0000\"", "\"\xef\xbb\xbf\"", "\"\xc0\xaf\"",
                  "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xff\xfe\"", "\"\xe2\x80\xa8<|im_end|>\""});
      break;
    case 3:  // a long string
      body[target] = std::string(100000, 'a' + char(rng() % 26));
      break;
    case 4: {  // nesting past the limit, at a depth from just past it to 10^5
      const size_t depth = rng() % 2 ? 257 + rng() % 64 : 100000;
      raw = std::string(depth, '[') + std::string(depth, ']');
      break;
    }
    case 5: {  // a key given twice (the second with another type)
      std::string text = body.dump();
      const size_t brace = text.find('{', 1 + rng() % (text.size() - 1));
      if (brace != std::string::npos) text.insert(brace + 1, "\"max_tokens\":\"many\",\"messages\":7,");
      return text;
    }
    default: {  // cut short
      const std::string text = body.dump();
      return text.substr(0, rng() % text.size());
    }
  }
  if (!raw.empty()) body[target] = "@@MUTATION@@";
  std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
  if (!raw.empty()) {
    const size_t pos = text.find(marker);
    if (pos != std::string::npos) text.replace(pos, marker.size(), raw);
  }
  return text;
}

TEST(ServerHostile, MutatedClientRequestsGetDeliberateAnswers) {
  Server s;
  const auto requests = client_requests();
  // STEP35_HOSTILE_SEED / STEP35_HOSTILE_REQUESTS: another seed, a longer run (CI's fuzz stage).
  const char* seed_env = std::getenv("STEP35_HOSTILE_SEED");
  const char* count_env = std::getenv("STEP35_HOSTILE_REQUESTS");
  const uint32_t seed = seed_env ? uint32_t(std::strtoul(seed_env, nullptr, 10)) : 20261207u;
  const int n_requests = count_env ? std::atoi(count_env) : 700;
  std::mt19937 rng(seed);
  int answered = 0;
  for (int i = 0; i < n_requests; ++i) {
    const auto& [path, body] = requests[size_t(i) % requests.size()];
    const std::string text = mutated(body, rng);
    std::string out;
    const int status = s.post(path, text, &out);
    const bool deliberate = (status >= 200 && status < 500) || status == 503;
    ASSERT_TRUE(deliberate) << "seed " << seed << ", request " << i << " to " << path << " got " << status << ": " << out.substr(0, 300)
                            << "\nbody: " << text.substr(0, 600);
    ++answered;
    if (i % 100 == 99) {
      ASSERT_TRUE(s.alive()) << "after request " << i;
    }
  }
  EXPECT_EQ(answered, n_requests);
  s.expect_serving("after mutated client requests");
}

TEST(ServerHostile, HugeAndNegativeNumbers) {
  Server s;
  struct Case {
    const char* field;
    json value;
  };
  const std::vector<Case> rejected = {
      {"max_tokens", -1}, {"max_tokens", -9223372036854775807LL}, {"max_tokens", 1e300},
      {"n", -1}, {"n", 0}, {"n", 1000000}, {"n", 4294967297LL},
      {"top_k", -5}, {"top_k", 1e30}, {"temperature", -1}, {"temperature", 1e308},
      {"top_p", -0.5}, {"top_p", 2}, {"top_logprobs", -1}, {"top_logprobs", 1000000},
      {"frequency_penalty", 1e308}, {"seed", -1e300},
  };
  for (const Case& c : rejected) {
    json body = chat("x", 4);
    body[c.field] = c.value;
    if (std::string(c.field) == "top_logprobs") body["logprobs"] = true;
    std::string out;
    EXPECT_EQ(s.post("/v1/chat/completions", body.dump(), &out), 400) << c.field << "=" << c.value.dump() << ": "
                                                                       << out.substr(0, 200);
  }
  // max_tokens beyond the context is refused up front, naming the limit; so is a prompt plus
  // max_tokens beyond it (naming both numbers); exactly at the context it runs to the end.
  json big = chat("x", 4);
  big["max_tokens"] = 2147483647;
  std::string out;
  ASSERT_EQ(s.post("/v1/chat/completions", big.dump(), &out), 400) << out.substr(0, 300);
  EXPECT_EQ(json::parse(out)["error"]["param"], "max_tokens");
  big["max_tokens"] = 256;
  big["ignore_eos"] = true;
  ASSERT_EQ(s.post("/v1/chat/completions", big.dump(), &out), 400) << out.substr(0, 300);
  const std::string msg = json::parse(out)["error"]["message"].get<std::string>();
  EXPECT_NE(msg.find("plus max_tokens (256)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("context of 256 tokens"), std::string::npos) << msg;
  const size_t open = msg.find("prompt ("), close = msg.find(" tokens)");
  ASSERT_NE(close, std::string::npos) << msg;
  const int n_prompt = std::stoi(msg.substr(open + 8, close - open - 8));
  big["max_tokens"] = 256 - n_prompt;
  ASSERT_EQ(s.post("/v1/chat/completions", big.dump(), &out), 200) << out.substr(0, 300);
  const json r = json::parse(out);
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<int64_t>() + r["usage"]["completion_tokens"].get<int64_t>(), 256);
  s.expect_serving("after absurd numbers");
}

TEST(ServerHostile, PromptLongerThanTheContextAndInvalidUtf8) {
  Server s;
  std::string out;
  EXPECT_EQ(s.post("/v1/chat/completions", chat(std::string(5000, 'x') + " " + std::string(5000, 'q'), 4).dump(), &out),
            400) << out.substr(0, 300);
  EXPECT_NE(out.find("context"), std::string::npos) << out.substr(0, 300);
  // Raw invalid UTF-8 inside a JSON string is invalid JSON (RFC 8259): 400, not a crash.
  for (const std::string& bad : {std::string("\xff"), std::string("\xc3"), std::string("\xed\xa0\x80"),
                                std::string("\xc0\xaf")}) {
    const std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"a" + bad + "b\"}],\"max_tokens\":2}";
    EXPECT_EQ(s.post("/v1/chat/completions", body, &out), 400) << out.substr(0, 200);
  }
  // A lone surrogate escape is well-formed JSON text but not a character.
  EXPECT_EQ(s.post("/v1/chat/completions",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}],\"max_tokens\":2}", &out) / 100, 4)
      << out.substr(0, 200);
  s.expect_serving("after long prompts and invalid UTF-8");
}

TEST(ServerHostile, TenMegabyteBodyIs413) {
  Server s;
  const std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"" + std::string(10 << 20, 'a') + "\"}]}";
  std::string out;
  EXPECT_EQ(s.post("/v1/chat/completions", body, &out), 413) << out.substr(0, 200);
  // Declared but never sent: cpp-httplib drains a too-long body before it answers 413, so
  // this connection waits for the read timeout (the slow-loris case); others are served.
  RawConn c(s.port());
  ASSERT_TRUE(c.connected());
  c.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: 10485760\r\n\r\n{");
  s.expect_serving("while a declared 10 MB body is pending");
  s.expect_serving("after 10 MB bodies");
}

TEST(ServerHostile, SlowLorisIsClosedAndOthersAreServed) {
  // --read-timeout 3 instead of the default 30 s keeps the test short; each trickled byte
  // comes well within it.
  Server s({"--read-timeout", "3"});
  RawConn slow(s.port());
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"));
  // Trickle header bytes for a few seconds (longer than the read timeout in all).
  const std::string rest = "X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  for (char ch : rest) {
    ASSERT_TRUE(slow.send_all(std::string(1, ch))) << "dropped while it was still sending";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Then it goes quiet: the server must drop it after its read timeout, not before and
  // not only after the default 30 s.
  const auto quiet_since = Clock::now();
  s.expect_serving("during a slow-loris client");
  std::string got;
  bool open = true;
  while (open && Clock::now() - quiet_since < std::chrono::seconds(25)) open = slow.read_some(&got, 200);
  const double quiet_s = std::chrono::duration<double>(Clock::now() - quiet_since).count();
  EXPECT_FALSE(open) << "the server kept a stalled connection open for 25 s (--read-timeout 3)";
  EXPECT_GT(quiet_s, 2.5) << "dropped " << quiet_s << " s after it went quiet, before its read timeout";
  s.expect_serving("after a slow-loris client");
}

TEST(ServerHostile, ManyIdleConnectionsDoNotStarveOthers) {
  Server s;
  std::vector<std::unique_ptr<RawConn>> idle;
  const auto opening = Clock::now();
  for (int i = 0; i < 200; ++i) {
    idle.push_back(std::make_unique<RawConn>(s.port()));
    ASSERT_TRUE(idle.back()->connected()) << i;
  }
  // The accept queue takes a burst: with httplib's backlog of 5, SYNs were dropped whenever
  // the accept thread lagged, and each drop cost a 1 s retransmit (10-21 s for these 200).
  const double open_secs = std::chrono::duration<double>(Clock::now() - opening).count();
  EXPECT_LT(open_secs, 4.0) << "opening 200 connections took " << open_secs << " s: SYNs dropped?";
  const auto t0 = Clock::now();
  auto c = s.client(20);
  auto r = c.Get("/health");
  ASSERT_TRUE(r) << "no answer with 200 idle connections open";
  EXPECT_EQ(r->status, 200);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  // More idle connections than HTTP threads: each holds its thread until --keep-alive (2 s)
  // runs out, which bounds the wait (httplib's own 5 s made this a race with the time the
  // 200 connections took to open).
  EXPECT_LT(secs, 3.5) << "a request waited " << secs << " s behind idle connections";
  s.expect_serving("with 200 idle connections");
}

TEST(ServerHostile, AbruptDisconnectMidStreamCancelsAndFreesKv) {
  // A fixture model with a long context, so that each request is still generating when its
  // client goes away (the micro model finishes 200 tokens in milliseconds).
  Server s({}, st::fixture_model("tiny-a-f32.gguf"), 4096);
  const double cancelled_before = s.metric("step35_requests_finished_total{reason=\"cancelled\"}");
  for (int round = 0; round < 3; ++round) {
    json body = chat("tell me a long story", 4000);
    body["ignore_eos"] = true;
    body["stream"] = true;
    const std::string payload = body.dump();
    RawConn c(s.port());
    ASSERT_TRUE(c.connected());
    c.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(payload.size()) + "\r\n\r\n" + payload);
    std::string got;
    for (int i = 0; i < 100 && got.find("data: ") == std::string::npos; ++i)
      if (!c.read_some(&got, 100)) break;
    EXPECT_NE(got.find("data: "), std::string::npos) << got.substr(0, 300);
    c.close_now();  // mid-stream
  }
  double used = -1, running = -1;
  for (int i = 0; i < 200; ++i) {
    used = s.metric("step35_kv_blocks_used");
    running = s.metric("step35_running_sequences");
    if (used == 0 && running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(used, 0);
  EXPECT_EQ(running, 0);
  const double cancelled = s.metric("step35_requests_finished_total{reason=\"cancelled\"}");
  EXPECT_GE(cancelled - std::max(cancelled_before, 0.0), 3) << "each disconnect is a logged cancel";
  s.expect_serving("after abrupt disconnects");
}

TEST(ServerHostile, PrefixCacheNeverLeaksAnotherRequestsText) {
  // B alone on a fresh server, then B after A on another: A shares B's prompt prefix (so the
  // prefix cache serves B from A's blocks), and B's greedy output must not change.
  const std::string shared = "You are a helpful assistant. The account number is ";
  const json a = chat(shared + "ZEBRA-4411-SECRET. Repeat it back.", 24);
  const json b = chat(shared + "unknown. Say hello.", 24);
  std::string alone, after, out_a;
  {
    Server s;
    ASSERT_EQ(s.post("/v1/chat/completions", b.dump(), &alone), 200) << alone;
  }
  Server s;
  ASSERT_EQ(s.post("/v1/chat/completions", a.dump(), &out_a), 200) << out_a;
  ASSERT_EQ(s.post("/v1/chat/completions", b.dump(), &after), 200) << after;
  const json ja = json::parse(out_a), jb = json::parse(alone), jc = json::parse(after);
  EXPECT_EQ(jb["choices"][0]["message"]["content"], jc["choices"][0]["message"]["content"]);
  EXPECT_EQ(jc["choices"][0]["message"]["content"].get<std::string>().find("ZEBRA"), std::string::npos);
  EXPECT_GT(s.metric("step35_prompt_tokens_cached_total"), 0) << "the prefix cache was not exercised";
}
