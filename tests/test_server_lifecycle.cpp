// `step35 serve` as a process: a model that cannot load ends it with exit 1 and the reason
// within 2 s; SIGTERM / SIGINT during a slow load end it within 1 s; a second server on a
// taken port exits 1; the startup summary and the access log (text, JSON, off); -c 0 and
// --kv-mem limits. Every child is killed and reaped on every path out of a test.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve_process.h"
#include "support.h"

using namespace step35::testing;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kModel = "tiny-a-q8_0.gguf";

// A `step35 serve ... --port 0` child whose end is the point of the test: stderr goes to a
// file, the child may exit at any time, and it is SIGKILLed and reaped when the test ends.
class ServeChild {
 public:
  ServeChild(std::vector<std::string> serve_args, const std::vector<std::string>& env = {}) {
    log_ = new_log_file("lifecycle");
    std::vector<std::string> args = {step35_binary(), "serve"};
    args.insert(args.end(), serve_args.begin(), serve_args.end());
    bool has_port = false;
    for (const auto& a : serve_args) has_port |= a == "--port";
    if (!has_port) args.insert(args.end(), {"--port", "0"});
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      if (!std::freopen(log_.c_str(), "w", stderr)) _exit(126);
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~ServeChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // The exit status once the child exits within `seconds` (-1 if a signal ended it).
  std::optional<int> wait_exit(double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (pid_ > 0) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        exited_ = Clock::now();
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      if (Clock::now() > end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }
  void signal(int sig) const { kill(pid_, sig); }
  double seconds_alive() const { return std::chrono::duration<double>(exited_ - start_).count(); }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The port from the "listening on http://HOST:PORT" line, once it is there (0: not yet).
  int port() const { return listening_port(log_); }
  int wait_port(double seconds) const {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    int p = 0;
    while ((p = port()) == 0 && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return p;
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  Clock::time_point start_, exited_;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

}  // namespace

// The test harness itself: logs are named by the test's pid, pids recur across runs, and a
// log an earlier run left under the next name (its server's port long closed) must not be
// where the new server's port is read from.
TEST(ServeProcess, ALogLeftByAnEarlierRunIsNotReadForThePort) {
  const std::string probe = new_log_file("stale");  // <prefix>_<pid>_<n>.log: the next ones are n+1, ...
  const size_t n_at = probe.rfind('_') + 1;
  const int n = std::stoi(probe.substr(n_at));
  std::vector<std::string> stale;
  for (int i = 1; i <= 4; ++i) {
    stale.push_back(probe.substr(0, n_at) + std::to_string(n + i) + ".log");
    std::ofstream(stale.back()) << "step35 serve: listening on http://127.0.0.1:1 (loading an earlier run's model)\n";
  }
  {
    ServeProcess s({"-m", fixture_model(kModel), "-t", "1"}, "stale");
    EXPECT_NE(s.port(), 1);
    EXPECT_EQ(s.log_path(), stale[0]);
    httplib::Client c("127.0.0.1", s.port());
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  std::remove(probe.c_str());
  for (const std::string& f : stale) std::remove(f.c_str());
}

// A wrong path, a directory, a truncated GGUF and a file that is no GGUF at all: exit 1
// within 2 s (measured from the start, process start-up included), with one line naming
// the file and what is wrong.
TEST(ServerLifecycle, ModelsThatCannotLoadExitOneWithTheReason) {
  const std::string dir = tmp_dir() + "/not_a_model_dir";
  run_command("mkdir -p '" + dir + "'");
  const std::vector<uint8_t> whole = read_bytes(fixture_model(kModel));
  const std::string truncated = tmp_dir() + "/truncated.gguf";
  write_bytes(truncated, std::vector<uint8_t>(whole.begin(), whole.begin() + 3000));
  const std::string text = tmp_dir() + "/not_gguf.gguf";
  write_bytes(text, std::vector<uint8_t>(5000, uint8_t('x')));
  struct Case {
    std::string path, reason;
  };
  for (const Case& c : {Case{tmp_dir() + "/no/such/model.gguf", "No such file"}, Case{dir, "not a regular file"},
                        Case{truncated, "truncated.gguf"}, Case{text, "not_gguf.gguf"}}) {
    ServeChild child({"-m", c.path, "-t", "1"});
    const auto status = child.wait_exit(10);
    ASSERT_TRUE(status.has_value()) << c.path << " still running; log:\n" << child.log();
    EXPECT_EQ(*status, 1) << child.log();
    EXPECT_LT(child.seconds_alive(), 2.0) << c.path;
    const auto lines = lines_of(child.log());
    ASSERT_FALSE(lines.empty());
    const std::string& last = lines.back();
    EXPECT_NE(last.find("error:"), std::string::npos) << last;
    EXPECT_NE(last.find(c.path), std::string::npos) << last;
    EXPECT_NE(last.find(c.reason), std::string::npos) << last;
  }
}

// SIGTERM or SIGINT while the model is still loading (a load made slow on purpose by the
// STEP35_TEST_LOAD_DELAY_MS seam) ends the process within 1 s.
TEST(ServerLifecycle, SignalDuringASlowLoadExitsWithinASecond) {
  for (int sig : {SIGTERM, SIGINT}) {
    ServeChild child({"-m", fixture_model(kModel), "-t", "1"}, {"STEP35_TEST_LOAD_DELAY_MS=60000"});
    const int port = child.wait_port(10);
    ASSERT_GT(port, 0) << child.log();
    httplib::Client c("127.0.0.1", port);
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 503);
    EXPECT_EQ(json::parse(h->body)["status"], "loading");
    const auto t0 = Clock::now();
    child.signal(sig);
    const auto status = child.wait_exit(5);
    ASSERT_TRUE(status.has_value()) << "still loading 5 s after the signal; log:\n" << child.log();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
    EXPECT_EQ(*status, 0);
    EXPECT_NE(child.log().find("during the model load"), std::string::npos) << child.log();
  }
}

// A second server on the port a first one listens on exits 1 (no SO_REUSEPORT sharing),
// and the first keeps serving.
TEST(ServerLifecycle, SecondServerOnATakenPortExitsOne) {
  ServeProcess first({"-m", fixture_model(kModel), "-t", "1"}, "lifecycle_first");
  ServeChild second({"-m", fixture_model(kModel), "-t", "1", "--port", std::to_string(first.port())});
  const auto status = second.wait_exit(10);
  ASSERT_TRUE(status.has_value()) << "the second server is running; log:\n" << second.log();
  EXPECT_EQ(*status, 1);
  EXPECT_LT(second.seconds_alive(), 2.0);
  EXPECT_NE(second.log().find("already in use"), std::string::npos) << second.log();
  httplib::Client c("127.0.0.1", first.port());
  for (int i = 0; i < 8; ++i) {  // every connection reaches the first server
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
}

// The startup summary says what was loaded and how it runs; every request gets one access
// line (method, path, status, tokens, ms); --log-format json writes one object per line;
// --log-disable drops the access lines.
TEST(ServerLifecycle, StartupSummaryAndAccessLog) {
  const json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3}, {"temperature", 0}};
  std::string text_log;
  {
    ServeProcess s({"-m", fixture_model(kModel), "-t", "1"}, "lifecycle_log");
    httplib::Client c("127.0.0.1", s.port());
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    const json answer = json::parse(r->body);
    EXPECT_EQ(s.terminate(), 0);
    std::ifstream in(s.log_path());
    std::stringstream ss;
    ss << in.rdbuf();
    text_log = ss.str();
    const std::string access = "POST /v1/chat/completions 200 " +
                               std::to_string(answer["usage"]["prompt_tokens"].get<int>()) + "+3 tokens ";
    EXPECT_NE(text_log.find(access), std::string::npos) << text_log;
    EXPECT_NE(text_log.find("GET /health 200"), std::string::npos) << text_log;
  }
  for (const char* part : {"model '", "tensor types: ", "q8_0 x", "repacked: ", "KV pool ", " MiB (", "context 4096",
                           "in parallel", "threads", "MTP: 1 blocks, off", "ready: http://127.0.0.1:", "stopped"})
    EXPECT_NE(text_log.find(part), std::string::npos) << part << "\n" << text_log;

  {
    ServeProcess s({"-m", fixture_model(kModel), "-t", "1", "--log-format", "json"}, "lifecycle_json");
    httplib::Client c("127.0.0.1", s.port());
    ASSERT_TRUE(c.Post("/v1/chat/completions", body.dump(), "application/json"));
    EXPECT_EQ(s.terminate(), 0);
    std::ifstream in(s.log_path());
    int requests = 0;
    std::vector<std::string> events;
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << line;
      ASSERT_TRUE(j.contains("event") && j.contains("time") && j.contains("message")) << line;
      events.push_back(j["event"]);
      if (j["event"] == "request" && j["path"] == "/v1/chat/completions") {
        ++requests;
        EXPECT_EQ(j["status"], 200);
        EXPECT_EQ(j["completion_tokens"], 3);
        EXPECT_GE(j["ms"].get<int>(), 0);
      }
      if (j["event"] == "engine") {
        EXPECT_GT(j["kv_pool_bytes"].get<int64_t>(), 0) << line;
      }
    }
    EXPECT_EQ(requests, 1);
    for (const char* e : {"listening", "model", "engine", "ready", "stopping", "stopped"})
      EXPECT_NE(std::find(events.begin(), events.end(), e), events.end()) << e;
  }
  {
    ServeProcess s({"-m", fixture_model(kModel), "-t", "1", "--log-disable"}, "lifecycle_quiet");
    httplib::Client c("127.0.0.1", s.port());
    ASSERT_TRUE(c.Post("/v1/chat/completions", body.dump(), "application/json"));
    EXPECT_EQ(s.terminate(), 0);
    std::ifstream in(s.log_path());
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(ss.str().find("POST /v1/chat/completions"), std::string::npos) << ss.str();
    EXPECT_NE(ss.str().find("ready: "), std::string::npos);
  }
}

// -c 0 is the model's context; more than the model's is cut to it (and said so);
// --kv-mem below one sequence or beyond what the pool can index is a clear error.
TEST(ServerLifecycle, ContextAndKvMemLimits) {
  {
    ServeProcess s({"-m", fixture_model(kModel), "-t", "1", "-c", "0"}, "lifecycle_ctx");
    httplib::Client c("127.0.0.1", s.port());
    auto m = c.Get("/v1/models");
    ASSERT_TRUE(m);
    EXPECT_EQ(json::parse(m->body)["data"][0]["context_length"], 4096);  // tiny-a's training context
    auto p = c.Get("/props");
    ASSERT_TRUE(p);
    EXPECT_EQ(json::parse(p->body)["n_ctx"], 4096);
  }
  {
    ServeProcess s({"-m", fixture_model(kModel), "-t", "1", "-c", "100000"}, "lifecycle_ctx_big");
    httplib::Client c("127.0.0.1", s.port());
    auto m = c.Get("/v1/models");
    ASSERT_TRUE(m);
    EXPECT_EQ(json::parse(m->body)["data"][0]["context_length"], 4096);
    std::ifstream in(s.log_path());
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_NE(ss.str().find("context 100000 (-c) is more than the model's 4096: using 4096"), std::string::npos) << ss.str();
  }
  for (const auto& [mib, says] : std::vector<std::pair<std::string, std::string>>{
           {"1", "--kv-mem 1 MiB is less than one sequence of 4096 tokens needs"},
           {"1073741824", "MiB is more than the KV pool can index"}}) {
    ServeChild child({"-m", fixture_model(kModel), "-t", "1", "--kv-mem", mib});
    const auto status = child.wait_exit(10);
    ASSERT_TRUE(status.has_value()) << child.log();
    EXPECT_EQ(*status, 1);
    EXPECT_NE(child.log().find(says), std::string::npos) << child.log();
  }
}
