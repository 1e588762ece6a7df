// The model's chat template through the interfaces a user touches: POST /apply-template
// against jinja2's renderings of the conformance conversations, the token ids a request
// runs against /tokenize of that text, the client's key order through /v1/chat/completions
// and /v1/messages, --chat-template-file for serve and run, and run --verbose-prompt.
//
// The micro model of fuzz/corpus has no template of its own, so it renders with the
// built-in Step 3.5 Flash template; tiny-a-q8_0 carries the fixtures' ChatML one.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "gguf/gguf.h"
#include "serve_process.h"
#include "server/chat_plan.h"
#include "support.h"
#include "tokenizer/tokenizer.h"

using namespace step35::testing;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(PROJECT_SOURCE_DIR) + "/tests/data/chat_templates";
std::string micro() { return std::string(PROJECT_SOURCE_DIR) + "/fuzz/corpus/gguf/micro-f16.gguf"; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class Server : public ServeProcess {
 public:
  explicit Server(const std::string& model, std::vector<std::string> extra = {})
      : ServeProcess(args(model, std::move(extra)), "server_chat_template") {}
  // POST a body given as text (so its key order is the one written), the answer as JSON.
  ordered_json post(const std::string& path, const std::string& body, int* status = nullptr) const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body, "application/json");
    if (!r) {
      ADD_FAILURE() << "no response from " << path;
      return ordered_json();
    }
    if (status) *status = r->status;
    ordered_json j = ordered_json::parse(r->body, nullptr, false);
    if (j.is_discarded()) ADD_FAILURE() << path << " answered no JSON: " << r->body;
    return j;
  }
  ordered_json ok(const std::string& path, const std::string& body) const {
    int status = 0;
    ordered_json r = post(path, body, &status);
    EXPECT_EQ(status, 200) << path << " " << body << "\n-> " << r.dump();
    return r;
  }
  std::string prompt(const std::string& body) const {
    const ordered_json r = ok("/apply-template", body);
    return r.contains("prompt") && r["prompt"].is_string() ? r["prompt"].get<std::string>() : "";
  }

 private:
  static std::vector<std::string> args(const std::string& model, std::vector<std::string> extra) {
    std::vector<std::string> a = {"-m", model, "-t", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

std::string bos_text(const std::string& model) {
  auto f = step35::gguf::File::open(model);
  auto tok = step35::Tokenizer::from_gguf(*f);
  return tok->token_to_piece(tok->bos());
}

// A conversation of the suite as a chat completion body.
ordered_json chat_body(const ordered_json& conv) {
  ordered_json body = ordered_json::object();
  body["messages"] = conv["messages"];
  if (conv.contains("tools")) body["tools"] = conv["tools"];
  body["add_generation_prompt"] = conv.value("add_generation_prompt", false);
  if (conv.contains("extra")) body["chat_template_kwargs"] = conv["extra"];
  body["max_tokens"] = 1;
  body["temperature"] = 0;
  return body;
}

// The conversations /apply-template must render as jinja2 does: all but the three where
// step35 adds to apply_chat_template on purpose (test_chat_template checks those).
bool rendered_as_jinja2(const std::string& name) {
  return name != "unknown-role" && name != "tool-call-string-arguments" && name != "thinking-disabled";
}

TEST(ServerChatTemplate, ApplyTemplateEqualsJinja2AndRequestsRunThoseTokens) {
  Server s(micro());
  const ordered_json manifest = ordered_json::parse(read_text(kData + "/manifest.json"));
  std::string suite_bos;
  for (const ordered_json& t : manifest["templates"])
    if (t["name"] == "stepfun-3.5-flash") suite_bos = t["variables"]["bos_token"].get<std::string>();
  const std::string bos = bos_text(micro());
  ASSERT_FALSE(bos.empty());
  size_t compared = 0;
  for (const auto& entry : fs::directory_iterator(kData + "/conversations")) {
    const std::string name = entry.path().stem().string();
    if (!rendered_as_jinja2(name)) continue;
    SCOPED_TRACE(name);
    const ordered_json conv = ordered_json::parse(read_text(entry.path().string()));
    // jinja2's rendering with the suite's BOS text, which the template writes first.
    std::string expected = read_text(kData + "/expected/stepfun-3.5-flash/" + name + ".txt");
    ASSERT_EQ(expected.rfind(suite_bos, 0), 0u);
    expected = bos + expected.substr(suite_bos.size());
    const std::string body = chat_body(conv).dump();
    const std::string prompt = s.prompt(body);
    EXPECT_EQ(prompt, expected);
    // The tokens a chat request runs are /tokenize of that text (special tokens parsed,
    // BOS not added again since the template wrote it): one BOS, and as many tokens as
    // the request's usage counts.
    ordered_json tokenize = ordered_json::object();
    tokenize["content"] = prompt;
    tokenize["add_special"] = false;
    tokenize["parse_special"] = true;
    const ordered_json ids = s.ok("/tokenize", tokenize.dump())["tokens"];
    ASSERT_TRUE(ids.is_array());
    const ordered_json bos_only = s.ok("/tokenize", R"({"content":"","add_special":true})")["tokens"];
    ASSERT_EQ(bos_only.size(), 1u);
    EXPECT_EQ(ids[0], bos_only[0]);
    EXPECT_NE(ids[1], bos_only[0]);
    const ordered_json chat = s.ok("/v1/chat/completions", body);
    EXPECT_EQ(chat["usage"]["prompt_tokens"], ids.size());
    ++compared;
  }
  EXPECT_GE(compared, 22u);
}

TEST(ServerChatTemplate, ClientKeyOrderReachesThePrompt) {
  Server s(micro());
  // Tool definitions and tool-call arguments in an order that is not alphabetical.
  const std::string chat = R"({"messages":[{"role":"user","content":"Weather?"},
    {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather",
     "arguments":"{\"unit\":\"celsius\",\"city\":\"Paris\",\"options\":{\"zeta\":1,\"alpha\":2}}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"20"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
     "properties":{"unit":{"type":"string"},"city":{"type":"string"}},"required":["city"]}}}]})";
  const std::string prompt = s.prompt(chat);
  EXPECT_NE(prompt.find(R"({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", )"
                        R"("properties": {"unit": {"type": "string"}, "city": {"type": "string"}}, "required": ["city"]}}})"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<parameter=unit>\ncelsius\n</parameter>\n<parameter=city>\nParis\n</parameter>\n"
                        "<parameter=options>\n{\"zeta\": 1, \"alpha\": 2}\n</parameter>\n"),
            std::string::npos)
      << prompt;
  // The same conversation through /v1/messages renders the same prompt: its token count
  // equals the chat request's, and in-process the two render byte for byte alike.
  const std::string messages = R"({"model":"m","messages":[{"role":"user","content":"Weather?"},
    {"role":"assistant","content":[{"type":"tool_use","id":"c1","name":"get_weather",
      "input":{"unit":"celsius","city":"Paris","options":{"zeta":1,"alpha":2}}}]},
    {"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"20"}]}],
    "tools":[{"name":"get_weather","description":"","input_schema":{"type":"object",
     "properties":{"unit":{"type":"string"},"city":{"type":"string"}},"required":["city"]}}]})";
  const ordered_json counted = s.ok("/v1/messages/count_tokens", messages);
  const ordered_json chat_with_description = ordered_json::parse(chat);
  ordered_json same = chat_with_description;
  same["tools"][0]["function"] = ordered_json::parse(
      R"({"name":"get_weather","description":"","parameters":{"type":"object","properties":{"unit":{"type":"string"},"city":{"type":"string"}},"required":["city"]}})");
  same["max_tokens"] = 1;
  EXPECT_EQ(counted["input_tokens"], s.ok("/v1/chat/completions", same.dump())["usage"]["prompt_tokens"]);

  const step35::ChatTemplate t("", bos_text(micro()));
  const ordered_json anthropic = ordered_json::parse(messages);
  const ordered_json converted = step35::server::anthropic_ordered_chat(step35::server::anthropic_to_openai(json::parse(messages), /*counting=*/true), anthropic);
  step35::ChatRenderOptions o;
  EXPECT_EQ(t.render(converted["messages"], converted["tools"], o), t.render(same["messages"], same["tools"], o));
  EXPECT_EQ(t.render(same["messages"], same["tools"], o), s.prompt(same.dump()));
}

TEST(ServerChatTemplate, TemplateErrorsAreBadRequests) {
  Server s(micro());
  int status = 0;
  // Step 3.5's template reads messages[0].role: an empty list is refused before it.
  s.post("/apply-template", R"({"messages":[]})", &status);
  EXPECT_EQ(status, 400);
  const ordered_json r =
      s.post("/apply-template", R"({"messages":[{"role":"user","content":"q"}],"add_generation_prompt":true,"continue_final_message":true})", &status);
  EXPECT_EQ(status, 400) << r.dump();
}

TEST(ServerChatTemplate, ChatTemplateFileOverridesTheModels) {
  // tiny-a-q8_0 carries ChatML; the file gives it Step 3.5's template.
  const std::string file = kData + "/templates/stepfun-3.5-flash.jinja";
  Server s(fixture_model("tiny-a-q8_0.gguf"), {"--chat-template-file", file});
  const std::string prompt = s.prompt(R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(prompt, bos_text(fixture_model("tiny-a-q8_0.gguf")) + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  httplib::Client c("127.0.0.1", s.port());
  auto props = c.Get("/props");
  ASSERT_TRUE(props);
  EXPECT_EQ(json::parse(props->body)["chat_template"], read_text(file));
}

TEST(ServerChatTemplate, BadTemplateFileStopsTheServerWithItsPosition) {
  const std::string bad = tmp_dir() + "/bad_template.jinja";
  std::ofstream(bad) << "{% for m in messages %}\n{{ m.content }\n{% endfor %}";
  std::string out, err;
  const int status = run_command(step35_binary() + " serve -m " + micro() + " --port 0 --chat-template-file " + bad, &out, &err);
  EXPECT_EQ(status, 1) << err;
  EXPECT_NE(err.find(bad + ": 2:14: syntax error"), std::string::npos) << err;
  EXPECT_EQ(run_command(step35_binary() + " serve -m " + micro() + " --port 0 --chat-template-file " + bad + ".missing", &out, &err), 1);
  EXPECT_NE(err.find("cannot read chat template file"), std::string::npos) << err;
}

TEST(RunChatTemplate, VerbosePromptShowsTheRenderedPrompt) {
  std::string out, err;
  ASSERT_EQ(run_command(step35_binary() + " run -m " + micro() + " --chat --system 'Be brief.' -p ' hi ' -n 1 --verbose-prompt", &out, &err), 0) << err;
  EXPECT_NE(err.find("prompt:\n" + bos_text(micro()) + "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n hi <|im_end|>\n"
                     "<|im_start|>assistant\n<think>\n\n"),
            std::string::npos)
      << err;
  // --chat-template-file replaces the model's template.
  const std::string tmpl = tmp_dir() + "/run_template.jinja";
  std::ofstream(tmpl) << "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
  ASSERT_EQ(run_command(step35_binary() + " run -m " + micro() + " --chat -p hello -n 1 --verbose-prompt --chat-template-file " + tmpl, &out, &err), 0) << err;
  EXPECT_NE(err.find("prompt:\n[user] hello\n\n"), std::string::npos) << err;
  EXPECT_EQ(run_command(step35_binary() + " run -m " + micro() + " -p hello -n 1 --chat-template-file " + tmpl, &out, &err), 2) << err;
}

}  // namespace
