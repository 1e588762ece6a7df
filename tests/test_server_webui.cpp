// The web pages of `step35 serve` (docs/webui.md) over HTTP against the real binary: the
// chat page, the dashboard and every file of src/server/webui/ with their content types
// and security headers, --no-webui, --api-key (pages load, the data needs the key), and
// GET /v1/step35/dashboard's expert counts. The pages in a browser: tests/node/webui.test.mjs.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve_process.h"
#include "support.h"

using namespace step35::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

class WebServer : public ServeProcess {
 public:
  explicit WebServer(std::vector<std::string> extra = {}) : ServeProcess(args(std::move(extra)), "webui") {}
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(120, 0);
    return c;
  }

 private:
  static std::vector<std::string> args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"-m", fixture_model("tiny-a-q8_0.gguf"), "-t", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

const fs::path kAssets = fs::path(PROJECT_SOURCE_DIR) / "src" / "server" / "webui";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string expected_type(const fs::path& p) {
  static const std::map<std::string, std::string> types = {{".html", "text/html; charset=utf-8"},
                                                           {".js", "text/javascript; charset=utf-8"},
                                                           {".css", "text/css; charset=utf-8"},
                                                           {".svg", "image/svg+xml"}};
  auto it = types.find(p.extension().string());
  return it == types.end() ? "" : it->second;
}

// The headers every page response carries.
void expect_page_headers(const httplib::Result& r, const std::string& what) {
  ASSERT_TRUE(r) << what;
  const std::string csp = r->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'self'"), std::string::npos) << what << ": " << csp;
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << what << ": " << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << what << ": " << csp;
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos) << what << ": " << csp;
  EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos) << what << ": " << csp;
  EXPECT_EQ(csp.find("unsafe-eval"), std::string::npos) << what << ": " << csp;
  EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff") << what;
  EXPECT_EQ(r->get_header_value("X-Frame-Options"), "DENY") << what;
}

uint64_t total_expert_counts(const json& d) {
  uint64_t total = 0;
  for (const json& row : d["experts"]["counts"])
    for (const json& v : row) total += v.get<uint64_t>();
  return total;
}

}  // namespace

// / and /dashboard, and every file of src/server/webui/ at /webui/NAME: 200, the right
// content type, the bytes of the file, the security headers.
TEST(ServerWebui, PagesAndAssetsWithTypesAndHeaders) {
  WebServer s;
  auto c = s.client();
  auto index = c.Get("/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 200);
  EXPECT_EQ(index->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(index->body, read_file(kAssets / "index.html"));
  expect_page_headers(index, "/");
  auto dash = c.Get("/dashboard");
  ASSERT_TRUE(dash);
  EXPECT_EQ(dash->status, 200);
  EXPECT_EQ(dash->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(dash->body, read_file(kAssets / "dashboard.html"));
  expect_page_headers(dash, "/dashboard");
  int n = 0;
  for (const auto& entry : fs::directory_iterator(kAssets)) {
    const fs::path p = entry.path();
    const std::string url = "/webui/" + p.filename().string();
    auto r = c.Get(url.c_str());
    ASSERT_TRUE(r) << url;
    EXPECT_EQ(r->status, 200) << url;
    EXPECT_EQ(r->get_header_value("Content-Type"), expected_type(p)) << url;
    EXPECT_EQ(r->body, read_file(p)) << url;
    expect_page_headers(r, url);
    ++n;
  }
  EXPECT_GE(n, 6);
  for (const char* missing : {"/webui/nothing.js", "/webui/../server.cpp", "/webui/", "/index.html"}) {
    auto r = c.Get(missing);
    ASSERT_TRUE(r) << missing;
    EXPECT_EQ(r->status, 404) << missing;
  }
}

// The pages reference only files that are served, and hold no inline script or style
// (the Content-Security-Policy would block them) and no external URL.
TEST(ServerWebui, PagesReferenceOnlyTheirOwnFiles) {
  WebServer s;
  auto c = s.client();
  for (const char* page : {"/", "/dashboard"}) {
    auto r = c.Get(page);
    ASSERT_TRUE(r && r->status == 200) << page;
    const std::string& html = r->body;
    EXPECT_EQ(html.find("http://"), std::string::npos) << page;
    EXPECT_EQ(html.find("https://"), std::string::npos) << page;
    EXPECT_EQ(html.find("style=\""), std::string::npos) << page;
    EXPECT_FALSE(std::regex_search(html, std::regex(R"(\son[a-z]+\s*=)"))) << page << ": an inline event handler";
    const std::regex script(R"(<script\b([^>]*)>)");
    for (auto it = std::sregex_iterator(html.begin(), html.end(), script); it != std::sregex_iterator(); ++it)
      EXPECT_NE((*it)[1].str().find("src="), std::string::npos) << page << ": inline <script>";
    const std::regex ref(R"re((?:src|href)="(/[^"]*)")re");
    int refs = 0;
    for (auto it = std::sregex_iterator(html.begin(), html.end(), ref); it != std::sregex_iterator(); ++it) {
      const std::string url = (*it)[1];
      auto a = c.Get(url.c_str());
      ASSERT_TRUE(a) << url;
      EXPECT_EQ(a->status, 200) << page << " -> " << url;
      ++refs;
    }
    EXPECT_GE(refs, 3) << page;
  }
  // The modules import only each other.
  for (const auto& entry : fs::directory_iterator(kAssets)) {
    if (entry.path().extension() != ".js") continue;
    const std::string js = read_file(entry.path());
    const std::regex import(R"re(from\s+'([^']+)')re");
    for (auto it = std::sregex_iterator(js.begin(), js.end(), import); it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1];
      EXPECT_EQ(target.rfind("./", 0), 0u) << entry.path() << " imports " << target;
      EXPECT_TRUE(fs::exists(kAssets / target.substr(2))) << entry.path() << " imports " << target;
    }
    EXPECT_EQ(js.find("innerHTML"), std::string::npos) << entry.path();
    EXPECT_EQ(js.find("outerHTML"), std::string::npos) << entry.path();
    EXPECT_EQ(js.find("insertAdjacentHTML"), std::string::npos) << entry.path();
    EXPECT_EQ(js.find("eval("), std::string::npos) << entry.path();
  }
}

// --no-webui: no pages (404 as before), the API and the dashboard's data stay.
TEST(ServerWebui, NoWebuiAnswers404) {
  WebServer s({"--no-webui"});
  auto c = s.client();
  for (const char* path : {"/", "/dashboard", "/webui/chat.js", "/webui/style.css"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(r->get_header_value("Content-Security-Policy"), "") << path;
  }
  auto d = c.Get("/v1/step35/dashboard");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 200);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// --api-key: the pages load without a key (they ask for it); the data needs it.
TEST(ServerWebui, PagesLoadWithoutKeyDataNeedsIt) {
  WebServer s({"--api-key", "web-key"});
  auto c = s.client();
  for (const char* path : {"/", "/dashboard", "/webui/chat.js", "/webui/dashboard.js", "/webui/api.js"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
  }
  auto no_key = c.Get("/v1/step35/dashboard");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(no_key->get_header_value("WWW-Authenticate"), "Bearer");
  auto wrong = c.Get("/v1/step35/dashboard", {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto ok = c.Get("/v1/step35/dashboard", {{"Authorization", "Bearer web-key"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto props = c.Get("/props");
  ASSERT_TRUE(props);
  EXPECT_EQ(props->status, 401);
}

// CORS stays as it was: an allowed origin gets the header on the pages too.
TEST(ServerWebui, CorsHeadersAsBefore) {
  WebServer s({"--cors", "http://example.test"});
  auto c = s.client();
  auto r = c.Get("/", {{"Origin", "http://example.test"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://example.test");
  auto other = c.Get("/v1/step35/dashboard", {{"Origin", "http://elsewhere.test"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->get_header_value("Access-Control-Allow-Origin"), "");
}

// GET /v1/step35/dashboard: the gauges and counters, and per MoE layer x expert counts
// that grow with a request.
TEST(ServerWebui, DashboardJsonExpertCountsGrow) {
  WebServer s;
  auto c = s.client();
  auto before_r = c.Get("/v1/step35/dashboard");
  ASSERT_TRUE(before_r);
  ASSERT_EQ(before_r->status, 200);
  EXPECT_EQ(before_r->get_header_value("Content-Type"), "application/json");
  const json before = json::parse(before_r->body);
  for (const char* key : {"requests", "tokens", "kv", "prefix_cache", "moe", "mtp", "routing_hints", "experts"})
    EXPECT_TRUE(before.contains(key)) << key;
  const json& ex = before["experts"];
  const int n_expert = ex["n_expert"].get<int>();
  ASSERT_GT(n_expert, 1);
  ASSERT_GT(ex["layers"].size(), 0u);
  ASSERT_EQ(ex["counts"].size(), ex["layers"].size());
  for (const json& row : ex["counts"]) EXPECT_EQ(row.size(), size_t(n_expert));
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hello there"}}}}, {"max_tokens", 8}, {"temperature", 0}};
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto after_r = c.Get("/v1/step35/dashboard");
  ASSERT_TRUE(after_r);
  const json after = json::parse(after_r->body);
  EXPECT_GT(total_expert_counts(after), total_expert_counts(before));
  EXPECT_GT(after["experts"]["passes"].get<uint64_t>(), before["experts"]["passes"].get<uint64_t>());
  EXPECT_GE(after["tokens"]["generated"].get<uint64_t>(), before["tokens"]["generated"].get<uint64_t>() + 8);
  EXPECT_GT(after["time"].get<double>(), before["time"].get<double>());
  // Every routing of a pass is counted once per MoE layer: each layer's row sums the same.
  std::set<uint64_t> row_sums;
  for (const json& row : after["experts"]["counts"]) {
    uint64_t sum = 0;
    for (const json& v : row) sum += v.get<uint64_t>();
    row_sums.insert(sum);
  }
  EXPECT_EQ(row_sums.size(), 1u) << after["experts"].dump();
}
