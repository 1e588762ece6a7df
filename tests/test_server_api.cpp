// `step35 serve` as agents and their clients use it, over HTTP against the real binary:
// every field of OpenAI's chat completions reference at once, the
// implemented extensions (logit_bias, min_tokens, typical_p, grammar, parallel tool calls,
// legacy functions, prefill), reasoning control (reasoning_budget, reasoning_effort,
// enable_thinking, server defaults), correct endings (stop strings, truncated tool calls,
// streamed arguments, text_offset, clients that leave, body limits), /v1/responses,
// /v1/messages/count_tokens, /props, CORS and API keys.
//
// tiny-a-q8_0 renders ChatML (no reasoning); the micro model of fuzz/corpus renders the
// Step 3.5 format with <think> / </think> tokens, for the reasoning tests.
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
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

namespace {

std::string tiny() { return fixture_model("tiny-a-q8_0.gguf"); }
std::string micro() { return std::string(PROJECT_SOURCE_DIR) + "/fuzz/corpus/gguf/micro-f16.gguf"; }

class Server : public ServeProcess {
 public:
  explicit Server(std::vector<std::string> extra = {}, const std::string& model = tiny())
      : ServeProcess(args(model, std::move(extra)), "server_api") {}
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(120, 0);
    return c;
  }
  json post(const std::string& path, const json& body, int* status = nullptr, const httplib::Headers& headers = {}) const {
    auto r = client().Post(path.c_str(), headers, body.dump(), "application/json");
    if (!r) {
      ADD_FAILURE() << "no response from " << path;
      return json();
    }
    if (status) *status = r->status;
    const json j = json::parse(r->body, nullptr, false);
    if (j.is_discarded()) ADD_FAILURE() << path << " answered no JSON: " << r->body;
    return j;
  }
  // A 200 answer (the test fails otherwise).
  json ok(const std::string& path, const json& body) const {
    int status = 0;
    json r = post(path, body, &status);
    EXPECT_EQ(status, 200) << path << " " << body.dump() << "\n-> " << r.dump();
    return r;
  }
  // The raw text of a streamed answer (curl, so the body is exactly what was sent).
  std::string stream(const std::string& path, const json& body) const {
    std::string out;
    const std::string file = tmp_dir() + "/api_body_" + std::to_string(port()) + ".json";
    std::ofstream(file) << body.dump();
    EXPECT_EQ(run_command("curl -sN " + url(path) + " -H 'Content-Type: application/json' --data-binary @" + file, &out), 0);
    return out;
  }
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    const size_t at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + name.size() + 2));
  }
  // The metric once it reaches `want` (the engine counts a request just after its final
  // event, which may be after the answer arrived), or its value after 2 s.
  double metric_reaching(const std::string& name, double want) const {
    double v = metric(name);
    for (int i = 0; i < 200 && v != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      v = metric(name);
    }
    return v;
  }

 private:
  static std::vector<std::string> args(const std::string& model, std::vector<std::string> extra) {
    std::vector<std::string> a = {"-m", model, "-t", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

json user(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

json chat(const std::string& text, int max_tokens) {
  return {{"messages", user(text)}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// `data:` payloads of an SSE body, and the `event:` names.
std::vector<json> sse_data(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string payload = body.substr(at + 6, end - at - 6);
    if (payload != "[DONE]") out.push_back(json::parse(payload));
    at = end;
  }
  return out;
}

std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  for (size_t at = 0; (at = body.find("event: ", at)) != std::string::npos; at += 7)
    out.push_back(body.substr(at + 7, body.find('\n', at) - at - 7));
  return out;
}

std::string text_of(const json& message_content) { return message_content.is_null() ? "" : message_content.get<std::string>(); }

// Text as a JSON answer carries it (invalid UTF-8 replaced by U+FFFD).
std::string as_sent(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

// The token pieces of a chat answer's logprobs.
std::vector<std::string> pieces(const json& answer) {
  std::vector<std::string> out;
  for (const json& e : answer["choices"][0]["logprobs"]["content"]) {
    std::string p;
    for (int b : e["bytes"]) p += char(b);
    out.push_back(p);
  }
  return out;
}

const json kWeather = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":
    {"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo","Reykjavik"]},
     "days":{"type":"integer","minimum":1,"maximum":9}},"required":["city","days"]}}}])");

}  // namespace

// A request that sets every field of OpenAI's chat completions reference gets 200, and so
// does one with every common extension; a typo of a field name still gets the 400.
TEST(ServerApi, EveryChatCompletionsFieldIsAccepted) {
  Server s;
  const json every = {
      {"model", "m"},
      {"messages", {{{"role", "developer"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}},
      {"audio", {{"voice", "alloy"}, {"format", "mp3"}}},
      {"frequency_penalty", 0.1},
      {"function_call", "auto"},
      {"functions", {{{"name", "f"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}},
      {"logit_bias", {{"5", 1}, {"7", -100}}},
      {"logprobs", true},
      {"top_logprobs", 2},
      {"max_completion_tokens", 8},
      {"max_tokens", 8},
      {"metadata", {{"a", "b"}}},
      {"modalities", {"text"}},
      {"n", 2},
      {"parallel_tool_calls", true},
      {"prediction", {{"type", "content"}, {"content", "hello"}}},
      {"presence_penalty", 0.1},
      {"prompt_cache_key", "k"},
      {"reasoning_effort", "low"},
      {"response_format", {{"type", "text"}}},
      {"safety_identifier", "s"},
      {"seed", 7},
      {"service_tier", "auto"},
      {"stop", {"\n\n"}},
      {"store", false},
      {"stream", false},
      {"stream_options", {{"include_usage", true}}},
      {"temperature", 0.5},
      {"tool_choice", "auto"},
      {"tools", {{{"type", "function"}, {"function", {{"name", "g"}, {"parameters", {{"type", "object"}}}}}}}},
      {"top_p", 0.9},
      {"user", "u"},
      {"verbosity", "low"},
      {"web_search_options", {{"search_context_size", "low"}}}};
  json r = s.ok("/v1/chat/completions", every);
  EXPECT_EQ(r["choices"].size(), 2u);
  const json extensions = {{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Well"}}}},
                           {"max_tokens", 6},
                           {"chat_template_kwargs", {{"enable_thinking", true}, {"custom", 1}}},
                           {"cache_prompt", true},
                           {"typical_p", 0.9},
                           {"min_tokens", 2},
                           {"continue_final_message", true},
                           {"add_generation_prompt", false},
                           {"top_k", 20},
                           {"min_p", 0.05},
                           {"repetition_penalty", 1.1},
                           {"repeat_last_n", 32},
                           {"reasoning_budget", 16}};
  s.ok("/v1/chat/completions", extensions);
  json grammar = chat("hi", 6);
  grammar["grammar"] = "root ::= [a-z ]+";
  s.ok("/v1/chat/completions", grammar);
  json typo = chat("hi", 4);
  typo["temprature"] = 0.5;
  int status = 0;
  json e = s.post("/v1/chat/completions", typo, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["message"], "unknown field 'temprature'");
  EXPECT_EQ(e["error"]["param"], "temprature");
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"logit_bias", {{"99999", 1}}}, {"logit_bias", {{"3", 500}}}, {"reasoning_effort", "extreme"},
           {"typical_p", 2}, {"min_tokens", -1}, {"chat_template_kwargs", {{"enable_thinking", "no"}}},
           {"grammar", "root ::= oops"}}) {
    json bad = chat("hi", 4);
    bad[field] = value;
    s.post("/v1/chat/completions", bad, &status);
    EXPECT_EQ(status, 400) << field << " " << value.dump();
  }
  json both = every;
  both["messages"].push_back({{"role", "assistant"}, {"content", "x"}});
  both["continue_final_message"] = true;
  both["add_generation_prompt"] = true;
  s.post("/v1/chat/completions", both, &status);
  EXPECT_EQ(status, 400);
}

// logit_bias moves the choice of tokens, min_tokens holds back the end, typical_p samples
// reproducibly; on /v1/completions, whose answer lists the tokens.
TEST(ServerApi, LogitBiasMinTokensTypicalP) {
  Server s;
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 0}};
  json biased = base;
  biased["logit_bias"] = {{"300", 100}};
  const json b = s.ok("/v1/completions", biased);
  const std::string piece300 = s.ok("/detokenize", {{"tokens", {300}}, {"special", false}})["content"];
  ASSERT_EQ(b["choices"][0]["logprobs"]["tokens"].size(), 6u);
  for (const json& t : b["choices"][0]["logprobs"]["tokens"]) EXPECT_EQ(t, piece300);
  // End of generation (id 1) pushed to the top: the answer ends at once, or after min_tokens.
  json ends = base;
  ends["logit_bias"] = {{"1", 100}};
  ends["max_tokens"] = 20;
  json r = s.ok("/v1/completions", ends);
  EXPECT_EQ(r["choices"][0]["text"], "");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  ends["min_tokens"] = 4;
  r = s.ok("/v1/completions", ends);
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"].size(), 4u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  json typical = base;
  typical["temperature"] = 1.0;
  typical["typical_p"] = 0.5;
  typical["seed"] = 11;
  EXPECT_EQ(s.ok("/v1/completions", typical)["choices"][0]["text"], s.ok("/v1/completions", typical)["choices"][0]["text"]);
}

// A stop string ends the generation at the token that completes it: the same request gives
// the same completion_tokens every time, no token after it is generated, and /metrics
// counts the requests as stopped, not cancelled.
TEST(ServerApi, StopStringEndsGenerationAtOnce) {
  Server s;
  json full_body = chat("Tell me a story", 40);
  full_body["logprobs"] = true;
  full_body["ignore_eos"] = true;
  const json full = s.ok("/v1/chat/completions", full_body);
  const std::vector<std::string> p = pieces(full);
  ASSERT_EQ(p.size(), 40u);
  std::string text;
  for (const auto& x : p) text += x;
  // Two ASCII characters from the second half, and the token that completes them.
  std::string stop;
  for (size_t i = text.size() / 2; i + 1 < text.size() && stop.empty(); ++i)
    if (uint8_t(text[i]) > 0x20 && uint8_t(text[i]) < 0x7f && uint8_t(text[i + 1]) > 0x20 && uint8_t(text[i + 1]) < 0x7f)
      stop = text.substr(i, 2);
  ASSERT_FALSE(stop.empty()) << text;
  size_t completes = 0;
  for (std::string so_far; completes < p.size(); ++completes) {
    so_far += p[completes];
    if (so_far.find(stop) != std::string::npos) break;
  }
  const double stopped_before = s.metric("step35_requests_finished_total{reason=\"stop\"}");
  const double cancelled_before = s.metric("step35_requests_finished_total{reason=\"cancelled\"}");
  const double generated_before = s.metric("step35_generated_tokens_total");
  json body = chat("Tell me a story", 40);
  body["ignore_eos"] = true;
  body["stop"] = stop;
  for (int i = 0; i < 3; ++i) {
    const json r = s.ok("/v1/chat/completions", body);
    EXPECT_EQ(r["usage"]["completion_tokens"], int(completes + 1)) << stop;
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(text_of(r["choices"][0]["message"]["content"]), as_sent(text.substr(0, text.find(stop))));
  }
  EXPECT_EQ(s.metric_reaching("step35_requests_finished_total{reason=\"stop\"}", stopped_before + 3) - stopped_before, 3);
  EXPECT_EQ(s.metric("step35_requests_finished_total{reason=\"cancelled\"}") - cancelled_before, 0);
  EXPECT_EQ(s.metric("step35_generated_tokens_total") - generated_before, 3 * double(completes + 1));
  // Streamed: the same cut, and nothing after the stop string.
  body["stream"] = true;
  std::string streamed;
  for (const json& c : sse_data(s.stream("/v1/chat/completions", body)))
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
      streamed += c["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(as_sent(streamed), as_sent(text.substr(0, text.find(stop))));
}

// A forced tool call streams its arguments as they are generated, in several deltas that
// concatenate to the final JSON; cut by max_tokens, the call comes back as text with
// finish_reason "length"; parallel_tool_calls: false keeps one call.
TEST(ServerApi, ToolCallEndingsAndStreamedArguments) {
  Server s;
  json body = chat("weather?", 200);
  body["tools"] = kWeather;
  body["tool_choice"] = "required";
  const json whole = s.ok("/v1/chat/completions", body);
  ASSERT_EQ(whole["choices"][0]["finish_reason"], "tool_calls") << whole.dump();
  const std::string arguments = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
  // Streamed: the first delta of the call names it; the arguments follow in pieces.
  body["stream"] = true;
  std::vector<std::string> fragments;
  std::string name;
  for (const json& c : sse_data(s.stream("/v1/chat/completions", body))) {
    if (c["choices"].empty() || !c["choices"][0]["delta"].contains("tool_calls")) continue;
    for (const json& tc : c["choices"][0]["delta"]["tool_calls"]) {
      if (tc["index"] != 0) continue;
      if (tc.contains("id")) name = tc["function"]["name"];
      const std::string a = tc["function"]["arguments"];
      if (!a.empty()) fragments.push_back(a);
    }
  }
  EXPECT_EQ(name, "get_weather");
  std::string joined;
  for (const auto& f : fragments) joined += f;
  EXPECT_EQ(joined, arguments);
  // The city's value is split over several deltas: one delta ends inside the string.
  const std::string city = json::parse(arguments)["city"];
  ASSERT_GE(city.size(), 4u);
  bool inside_value = false;
  std::string so_far;
  for (const auto& f : fragments) {
    so_far += f;
    const size_t at = so_far.find("\"city\":\"");
    if (at != std::string::npos && so_far.size() > at + 8 && so_far.size() < at + 8 + city.size()) inside_value = true;
  }
  EXPECT_TRUE(inside_value) << joined;
  // Cut off: no call, the markup as text, "length".
  body["stream"] = false;
  body["max_tokens"] = 12;
  const json cut = s.ok("/v1/chat/completions", body);
  const json& msg = cut["choices"][0]["message"];
  EXPECT_FALSE(msg.contains("tool_calls")) << cut.dump();
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
  EXPECT_NE(text_of(msg["content"]).find("<tool_call>"), std::string::npos) << cut.dump();
  // parallel_tool_calls: false: output that makes two calls (a grammar spells them out)
  // ends after the first.
  const std::string call = "<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nOslo\\n</parameter>\\n"
                           "<parameter=days>\\n3\\n</parameter>\\n</function>\\n</tool_call>";
  json two = chat("weather?", 300);
  two["tools"] = kWeather;
  two["grammar"] = "root ::= \"" + call + "\" \"" + call + "\"";
  const json several = s.ok("/v1/chat/completions", two);
  ASSERT_EQ(several["choices"][0]["message"]["tool_calls"].size(), 2u) << several.dump();
  two["parallel_tool_calls"] = false;
  const json one = s.ok("/v1/chat/completions", two);
  ASSERT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u) << one.dump();
  EXPECT_EQ(one["choices"][0]["message"]["tool_calls"][0]["function"], several["choices"][0]["message"]["tool_calls"][0]["function"]);
  EXPECT_EQ(one["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_LT(one["usage"]["completion_tokens"].get<int>(), several["usage"]["completion_tokens"].get<int>());
  // Legacy functions: the call as function_call.
  json legacy = chat("weather?", 200);
  legacy["functions"] = json::array({kWeather[0]["function"]});
  legacy["function_call"] = {{"name", "get_weather"}};
  const json f = s.ok("/v1/chat/completions", legacy);
  EXPECT_EQ(f["choices"][0]["finish_reason"], "function_call") << f.dump();
  EXPECT_EQ(f["choices"][0]["message"]["function_call"]["name"], "get_weather");
  EXPECT_FALSE(f["choices"][0]["message"].contains("tool_calls"));
}

// GBNF grammars constrain the output; a broken one is a 400 that says where.
TEST(ServerApi, GrammarField) {
  Server s;
  json body = chat("yes or no?", 50);
  body["grammar"] = "root ::= (\"yes\" | \"no\") \"!\"";
  for (int seed = 1; seed <= 3; ++seed) {
    body["seed"] = seed;
    body["temperature"] = 1.0;
    const json r = s.ok("/v1/chat/completions", body);
    const std::string content = text_of(r["choices"][0]["message"]["content"]);
    EXPECT_TRUE(content == "yes!" || content == "no!") << content;
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  }
  body["grammar"] = "root ::= \"a\"\nroot ::= \"b\"";
  int status = 0;
  const json e = s.post("/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("line 2"), std::string::npos) << e.dump();
  EXPECT_EQ(e["error"]["param"], "grammar");
}

// Reasoning control on a model whose template opens a think block.
TEST(ServerApi, ReasoningBudgetEffortAndThinkingSwitch) {
  Server s({"--reasoning-effort-budgets", "2,5,-1"}, micro());
  json body = chat("think", 14);
  body["ignore_eos"] = true;
  const json free_run = s.ok("/v1/chat/completions", body);
  const std::string all_reasoning = free_run["choices"][0]["message"]["reasoning_content"];
  auto reasoning_and_content = [&](const json& extra) {
    json b = body;
    for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
    const json r = s.ok("/v1/chat/completions", b);
    const json& m = r["choices"][0]["message"];
    EXPECT_EQ(r["usage"]["completion_tokens"], 14) << r.dump();
    return std::make_pair(m.contains("reasoning_content") ? m["reasoning_content"].get<std::string>() : std::string("<none>"),
                          text_of(m["content"]));
  };
  const auto [r3, c3] = reasoning_and_content({{"reasoning_budget", 3}});
  const auto [low, c_low] = reasoning_and_content({{"reasoning_effort", "low"}});
  const auto [medium, c_medium] = reasoning_and_content({{"reasoning_effort", "medium"}});
  // Greedy: each budget cuts the same reasoning, later for a larger budget; the answer
  // follows the forced end of the think block.
  EXPECT_LT(r3.size(), all_reasoning.size());
  EXPECT_EQ(all_reasoning.rfind(r3, 0), 0u) << r3 << " | " << all_reasoning;
  EXPECT_EQ(r3.rfind(low, 0), 0u);
  EXPECT_EQ(medium.rfind(r3, 0), 0u);
  EXPECT_LT(low.size(), medium.size());
  EXPECT_FALSE(c3.empty());
  // Thinking off: no reasoning, a longer prompt (the closed think block), an answer.
  for (const json& off : {json{{"reasoning_effort", "none"}}, json{{"chat_template_kwargs", {{"enable_thinking", false}}}},
                          json{{"reasoning_budget", 0}}}) {
    json b = body;
    for (auto it = off.begin(); it != off.end(); ++it) b[it.key()] = it.value();
    const json r = s.ok("/v1/chat/completions", b);
    EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content")) << off.dump() << r.dump();
    EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), free_run["usage"]["prompt_tokens"].get<int>());
  }
  // Streamed with a budget: reasoning deltas first, then content.
  json sb = body;
  sb["reasoning_budget"] = 3;
  sb["stream"] = true;
  std::string streamed_reasoning, streamed_content;
  for (const json& c : sse_data(s.stream("/v1/chat/completions", sb))) {
    if (c["choices"].empty()) continue;
    const json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) {
      EXPECT_TRUE(streamed_content.empty());
      streamed_reasoning += d["reasoning_content"].get<std::string>();
    }
    if (d.contains("content")) streamed_content += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed_reasoning, r3);
  EXPECT_EQ(streamed_content, c3);
  // Structured output after a budgeted think block still parses.
  json structured = chat("json", 300);
  structured["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "flag"}, {"schema",
      {{"type", "object"}, {"properties", {{"ok", {{"type", "boolean"}}}}}, {"required", {"ok"}},
       {"additionalProperties", false}}}}}};
  structured["reasoning_budget"] = 2;
  const json j = s.ok("/v1/chat/completions", structured);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j.dump();
  EXPECT_TRUE(json::parse(text_of(j["choices"][0]["message"]["content"]), nullptr, false).is_object()) << j.dump();
}

// Server-wide defaults: --reasoning-budget 0 switches reasoning off unless a request turns
// it back on; --temp 0 makes a request without a temperature greedy; /props shows the
// sampling defaults (--top-k, --top-p, --min-p).
TEST(ServerApi, ServerDefaults) {
  Server s({"--reasoning-budget", "0", "--temp", "0", "--top-k", "5", "--top-p", "0.75", "--min-p", "0.125"}, micro());
  json body = {{"messages", user("hello")}, {"max_tokens", 8}};
  const json quiet = s.ok("/v1/chat/completions", body);
  EXPECT_FALSE(quiet["choices"][0]["message"].contains("reasoning_content"));
  json greedy = body;
  greedy["temperature"] = 0;
  EXPECT_EQ(s.ok("/v1/chat/completions", greedy)["choices"][0]["message"]["content"],
            quiet["choices"][0]["message"]["content"]);
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  EXPECT_TRUE(s.ok("/v1/chat/completions", body)["choices"][0]["message"].contains("reasoning_content"));
  const json props = s.client().Get("/props") ? json::parse(s.client().Get("/props")->body) : json();
  EXPECT_EQ(props["default_generation_settings"]["params"]["temperature"], 0.0);
  EXPECT_EQ(props["default_generation_settings"]["params"]["top_k"], 5);
  EXPECT_EQ(props["default_generation_settings"]["params"]["top_p"], 0.75);
  EXPECT_EQ(props["default_generation_settings"]["params"]["min_p"], 0.125);
  EXPECT_EQ(props["default_generation_settings"]["params"]["reasoning_budget"], 0);
  EXPECT_EQ(props["chat_format"], "step35");
}

// Completions: best_of keeps the best of several candidates (all counted in usage),
// text_offset counts the echoed prompt, suffix is accepted.
TEST(ServerApi, CompletionsBestOfEchoAndOffsets) {
  Server s;
  json body = {{"prompt", "Once upon"}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 3}, {"ignore_eos", true},
               {"best_of", 3}, {"n", 1}, {"suffix", "The end."}};
  const json r = s.ok("/v1/completions", body);
  EXPECT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["usage"]["completion_tokens"], 15);
  EXPECT_EQ(r["choices"][0]["logprobs"], nullptr);
  int status = 0;
  body["n"] = 4;
  s.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400);  // best_of < n
  body["n"] = 1;
  body["stream"] = true;
  s.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400);  // best_of > n cannot stream
  const json echo = s.ok("/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 3}, {"temperature", 0},
                                              {"echo", true}, {"logprobs", 1}});
  const std::string text = echo["choices"][0]["text"];
  const json& lp = echo["choices"][0]["logprobs"];
  ASSERT_EQ(lp["text_offset"].size(), 3u);
  const size_t prompt_len = text.size() - [&] {
    size_t n = 0;
    for (const json& t : lp["tokens"]) n += t.get<std::string>().size();
    return n;
  }();
  EXPECT_EQ(text.rfind("Once upon", 0), 0u);
  EXPECT_EQ(lp["text_offset"][0].get<size_t>(), prompt_len);
  // text_offset counts the bytes of each token's piece. A piece that is not UTF-8 on its own
  // (a byte of a multi-byte character) reaches the client as U+FFFD, 3 bytes, whatever its
  // own 1-3 bytes: the random tiny model emits such pieces (with the default F16 cache the
  // first token of this continuation is one).
  for (size_t i = 0; i + 1 < lp["tokens"].size(); ++i) {
    const std::string piece = lp["tokens"][i];
    const size_t step = lp["text_offset"][i + 1].get<size_t>() - lp["text_offset"][i].get<size_t>();
    if (piece == "\xEF\xBF\xBD") {
      EXPECT_GE(step, 1u) << i;
      EXPECT_LE(step, 3u) << i;
    } else {
      EXPECT_EQ(step, piece.size()) << i << " " << piece;
    }
  }
}

// A non-streamed request whose client goes away is cancelled (its KV freed) at once, not
// run to its end; a body over 8 KiB sent as curl -d sends it (form-encoded) is read like
// any other up to --max-body.
TEST(ServerApi, ClientGoneAndBodyLimits) {
  Server s({"--max-body", "100000"});
  // 8 choices of 4000 tokens (half of them queued behind the other half): seconds of work
  // even on a fast machine, so the client's 0.5 s is long before the end.
  json body = chat("a long story", 4000);
  body["ignore_eos"] = true;
  body["n"] = 8;
  const std::string file = tmp_dir() + "/api_gone_" + std::to_string(s.port()) + ".json";
  std::ofstream(file) << body.dump();
  run_command("curl -s --max-time 0.5 " + s.url("/v1/chat/completions") + " -H 'Content-Type: application/json' --data-binary @" + file);
  double running = -1, cancelled = -1;
  for (int i = 0; i < 100; ++i) {
    running = s.metric("step35_running_sequences");
    cancelled = s.metric("step35_requests_finished_total{reason=\"cancelled\"}");
    if (running == 0 && cancelled == 8) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(running, 0);
  EXPECT_EQ(cancelled, 8);
  EXPECT_EQ(s.metric("step35_kv_blocks_used"), 0);
  EXPECT_EQ(s.metric("step35_requests_finished_total{reason=\"length\"}"), 0);  // it did not run to its end
  // 20 KB as curl -d sends it (application/x-www-form-urlencoded).
  json big = chat("hi", 2);
  big["user"] = std::string(20000, 'u');
  std::ofstream(file) << big.dump();
  std::string out;
  run_command("curl -s -w ' %{http_code}' " + s.url("/v1/chat/completions") + " -d @" + file, &out);
  EXPECT_EQ(out.substr(out.size() - 4), " 200") << out.substr(0, 300);
  big["user"] = std::string(200000, 'u');
  std::ofstream(file) << big.dump();
  run_command("curl -s -w ' %{http_code}' " + s.url("/v1/chat/completions") + " -d @" + file, &out);
  EXPECT_EQ(out.substr(out.size() - 4), " 413") << out.substr(0, 300);
}

// /v1/responses: text, incomplete at max_output_tokens, previous_response_id, the stored
// response by id, streaming events in order, function tools.
TEST(ServerApi, ResponsesEndpoint) {
  Server s;
  const json chat_answer = s.ok("/v1/chat/completions", chat("Hello there", 12));
  json body = {{"model", "m"}, {"input", "Hello there"}, {"max_output_tokens", 12}, {"temperature", 0}};
  const json r = s.ok("/v1/responses", body);
  EXPECT_EQ(r["object"], "response");
  EXPECT_TRUE(r["id"].get<std::string>().rfind("resp_", 0) == 0);
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].back()["type"], "message");
  const json text = r["output"].back()["content"][0]["text"];
  EXPECT_EQ(text, chat_answer["choices"][0]["message"]["content"]);
  EXPECT_FALSE(r.contains("output_text"));  // computed by OpenAI's clients, not sent
  EXPECT_EQ(r["usage"]["output_tokens"], 12);
  EXPECT_EQ(r["usage"]["input_tokens"], chat_answer["usage"]["prompt_tokens"]);
  // The same conversation continued by id: the earlier turn is in the prompt.
  const json next = s.ok("/v1/responses", {{"input", "And then?"}, {"previous_response_id", r["id"]}, {"max_output_tokens", 4}});
  EXPECT_GT(next["usage"]["input_tokens"].get<int>(), r["usage"]["input_tokens"].get<int>() + 12);
  EXPECT_EQ(next["previous_response_id"], r["id"]);
  auto got = s.client().Get(("/v1/responses/" + r["id"].get<std::string>()).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["output"], r["output"]);
  int status = 0;
  s.post("/v1/responses", {{"input", "x"}, {"previous_response_id", "resp_nope"}}, &status);
  EXPECT_EQ(status, 400);
  const json unstored = s.ok("/v1/responses", {{"input", "x"}, {"max_output_tokens", 2}, {"store", false}});
  EXPECT_EQ(s.client().Get(("/v1/responses/" + unstored["id"].get<std::string>()).c_str())->status, 404);
  // Streaming: created first, completion last, sequence numbers in order, deltas add up.
  body["stream"] = true;
  const std::string raw = s.stream("/v1/responses", body);
  const std::vector<std::string> events = sse_events(raw);
  const std::vector<json> data = sse_data(raw);
  ASSERT_GE(events.size(), 6u) << raw;
  EXPECT_EQ(events.front(), "response.created");
  EXPECT_EQ(events[1], "response.in_progress");
  EXPECT_EQ(events.back(), "response.incomplete");
  std::string deltas;
  for (size_t i = 0; i < data.size(); ++i) {
    EXPECT_EQ(data[i]["type"], events[i]);
    EXPECT_EQ(data[i]["sequence_number"], int(i));
    if (events[i] == "response.output_text.delta") deltas += data[i]["delta"].get<std::string>();
  }
  EXPECT_EQ(deltas, text);
  EXPECT_EQ(data.back()["response"]["output"].back()["content"][0]["text"], text);
  // A forced function call.
  const json tools = {{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeather[0]["function"]["parameters"]}}};
  const json called = s.ok("/v1/responses", {{"input", "weather?"}, {"tools", tools}, {"tool_choice", "required"},
                                             {"temperature", 0}, {"max_output_tokens", 200}});
  ASSERT_EQ(called["output"].back()["type"], "function_call") << called.dump();
  const json& call = called["output"].back();
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_TRUE(json::parse(call["arguments"].get<std::string>()).contains("city"));
  // Its result sent back by call_id continues the conversation.
  const json answered = s.ok("/v1/responses", {{"previous_response_id", called["id"]}, {"tools", tools},
                                               {"input", {{{"type", "function_call_output"}, {"call_id", call["call_id"]},
                                                           {"output", "sunny"}}}},
                                               {"max_output_tokens", 3}});
  EXPECT_GT(answered["usage"]["input_tokens"].get<int>(), called["usage"]["input_tokens"].get<int>());
  s.post("/v1/responses", {{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, &status);
  EXPECT_EQ(status, 400);
}

// Anthropic: count_tokens agrees with the prompt a request runs; an assistant prefill is
// continued, not closed; thinking budgets map to reasoning; service_tier is accepted.
TEST(ServerApi, AnthropicCountTokensPrefillThinking) {
  Server s;
  const json messages = {{{"role", "user"}, {"content", "Hello there"}}};
  const json body = {{"model", "m"}, {"max_tokens", 6}, {"temperature", 0}, {"system", "be brief"},
                     {"messages", messages}, {"service_tier", "auto"}};
  const json m = s.ok("/v1/messages", body);
  const json counted = s.ok("/v1/messages/count_tokens", {{"model", "m"}, {"system", "be brief"}, {"messages", messages}});
  EXPECT_EQ(counted["input_tokens"], m["usage"]["input_tokens"]);
  // Prefill: the same continuation as chat's continue_final_message.
  json prefill = body;
  prefill["messages"].push_back({{"role", "assistant"}, {"content", "Once upon"}});
  const json p = s.ok("/v1/messages", prefill);
  json cont = {{"messages", {{{"role", "system"}, {"content", "be brief"}}, messages[0],
                             {{"role", "assistant"}, {"content", "Once upon"}}}},
               {"continue_final_message", true}, {"max_tokens", 6}, {"temperature", 0}};
  const json c = s.ok("/v1/chat/completions", cont);
  EXPECT_EQ(p["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
  EXPECT_EQ(p["content"][0]["text"], c["choices"][0]["message"]["content"]);
  // The prefill adds its own tokens and nothing else: no end of turn, no new turn.
  const int prefill_tokens = s.ok("/tokenize", {{"content", "Once upon"}, {"add_special", false}})["count"];
  EXPECT_LE(p["usage"]["input_tokens"].get<int>(), m["usage"]["input_tokens"].get<int>() + prefill_tokens + 1);
  json count_prefill = {{"model", "m"}, {"system", "be brief"}, {"messages", prefill["messages"]}};
  EXPECT_EQ(s.ok("/v1/messages/count_tokens", count_prefill)["input_tokens"], p["usage"]["input_tokens"]);
  // Thinking on the Step 3.5 format.
  Server r({}, micro());
  json think = {{"model", "m"}, {"max_tokens", 12}, {"temperature", 0}, {"messages", messages},
                {"thinking", {{"type", "enabled"}, {"budget_tokens", 3}}}};
  const json t = r.ok("/v1/messages", think);
  ASSERT_GE(t["content"].size(), 1u);
  EXPECT_EQ(t["content"][0]["type"], "thinking") << t.dump();
  think["thinking"] = {{"type", "disabled"}};
  const json d = r.ok("/v1/messages", think);
  for (const json& block : d["content"]) EXPECT_NE(block["type"], "thinking") << d.dump();
  int status = 0;
  r.post("/v1/messages", {{"max_tokens", 4}, {"messages", messages}, {"thinking", {{"type", "enabled"}}}}, &status);
  EXPECT_EQ(status, 400);  // budget_tokens missing
}

// /props, CORS, API keys from a file and from the environment.
TEST(ServerApi, PropsCorsAndKeys) {
  const std::string keys = tmp_dir() + "/api_keys.txt";
  std::ofstream(keys) << "# team keys\nfirst-key\n\n  second-key  \n";
  {
    Server s({"--api-key-file", keys, "--cors", "https://app.example, https://other.example"});
    auto c = s.client();
    EXPECT_EQ(c.Get("/props")->status, 401);
    for (const char* k : {"first-key", "second-key"}) {
      auto r = c.Get("/props", {{"Authorization", std::string("Bearer ") + k}});
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200) << k;
      const json p = json::parse(r->body);
      EXPECT_EQ(p["n_ctx"], 4096);
      EXPECT_EQ(p["total_slots"], 4);
      EXPECT_EQ(p["chat_format"], "chatml");
      EXPECT_NE(p["chat_template"].get<std::string>().find("im_start"), std::string::npos);
    }
    EXPECT_EQ(c.Get("/props", {{"Authorization", "Bearer nope"}})->status, 401);
    // /version (vLLM's) needs no key, like /health; /props' build_info says the same.
    auto v = c.Get("/version");
    ASSERT_TRUE(v);
    EXPECT_EQ(v->status, 200) << v->body;
    const json version = json::parse(v->body);
    EXPECT_TRUE(std::regex_match(version["version"].get<std::string>(), std::regex(R"([0-9]+\.[0-9]+\.[0-9]+)")))
        << v->body;
    EXPECT_EQ(version["build_info"], "step35 " + version["version"].get<std::string>() + " (commit " +
                                         version["commit"].get<std::string>() + ")");
    const json p = json::parse(c.Get("/props", {{"Authorization", "Bearer first-key"}})->body);
    EXPECT_EQ(p["build_info"], version["build_info"]);
    // Preflight without a key; the allowed origin is echoed, another is not.
    httplib::Request pre;
    pre.method = "OPTIONS";
    pre.path = "/v1/chat/completions";
    pre.headers = {{"Origin", "https://app.example"}, {"Access-Control-Request-Method", "POST"},
                   {"Access-Control-Request-Headers", "authorization, content-type"}};
    auto opt = c.send(pre);
    ASSERT_TRUE(opt);
    EXPECT_EQ(opt->status, 204);
    EXPECT_EQ(opt->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
    EXPECT_NE(opt->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
    EXPECT_EQ(opt->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
    auto allowed = c.Get("/health", {{"Origin", "https://other.example"}});
    EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "https://other.example");
    auto refused = c.Get("/health", {{"Origin", "https://evil.example"}});
    EXPECT_FALSE(refused->has_header("Access-Control-Allow-Origin"));
    auto denied = c.Get("/v1/models", {{"Origin", "https://app.example"}});
    EXPECT_EQ(denied->status, 401);
    EXPECT_EQ(denied->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  }
  // STEP35_API_KEY when no key is given on the command line (the child inherits it).
  setenv("STEP35_API_KEY", "env-key", 1);
  Server s;
  unsetenv("STEP35_API_KEY");
  auto c = s.client();
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/v1/models", {{"x-api-key", "env-key"}})->status, 200);
}

// /v1/responses on a model whose template opens a think block: the reasoning comes back as
// a reasoning item before the message (the same texts as chat's reasoning_content and
// content for the same budget), its tokens counted in output_tokens_details; streamed, as
// reasoning_text deltas in an item of its own ahead of the message's; effort "none" has no
// reasoning item.
TEST(ServerApi, ResponsesReasoningItems) {
  Server s({"--reasoning-effort-budgets", "2,5,-1"}, micro());
  json chat_body = chat("think", 14);
  chat_body["reasoning_effort"] = "medium";
  const json c = s.ok("/v1/chat/completions", chat_body);
  const json& m = c["choices"][0]["message"];
  ASSERT_TRUE(m.contains("reasoning_content")) << c.dump();
  const std::string reasoning = m["reasoning_content"], content = text_of(m["content"]);
  const json body = {{"input", "think"}, {"max_output_tokens", 14}, {"temperature", 0}, {"reasoning", {{"effort", "medium"}}}};
  const json r = s.ok("/v1/responses", body);
  ASSERT_GE(r["output"].size(), 1u) << r.dump();
  const json& item = r["output"][0];
  EXPECT_EQ(item["type"], "reasoning") << r.dump();
  EXPECT_EQ(item["content"][0]["type"], "reasoning_text");
  EXPECT_EQ(item["content"][0]["text"], reasoning);
  EXPECT_EQ(r["reasoning"]["effort"], "medium");
  if (!content.empty()) {
    ASSERT_EQ(r["output"].size(), 2u) << r.dump();
    EXPECT_EQ(r["output"][1]["type"], "message");
    EXPECT_EQ(r["output"][1]["content"][0]["text"], content);
  }
  EXPECT_EQ(r["usage"]["output_tokens"], c["usage"]["completion_tokens"]);
  const int reasoning_tokens = r["usage"]["output_tokens_details"]["reasoning_tokens"];
  EXPECT_GE(reasoning_tokens, 5);  // the budget, and the forced end of the think block
  EXPECT_LT(reasoning_tokens, r["usage"]["output_tokens"].get<int>());
  // Streamed: the reasoning item (index 0) is opened, filled and closed before the message.
  json streamed_body = body;
  streamed_body["stream"] = true;
  const std::string raw = s.stream("/v1/responses", streamed_body);
  const std::vector<std::string> events = sse_events(raw);
  const std::vector<json> data = sse_data(raw);
  ASSERT_EQ(events.size(), data.size());
  std::string reasoning_deltas, text_deltas;
  size_t last_reasoning = 0, first_text = events.size();
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i] == "response.reasoning_text.delta") {
      EXPECT_EQ(data[i]["output_index"], 0);
      reasoning_deltas += data[i]["delta"].get<std::string>();
      last_reasoning = i;
    }
    if (events[i] == "response.output_text.delta") {
      text_deltas += data[i]["delta"].get<std::string>();
      first_text = std::min(first_text, i);
    }
  }
  EXPECT_EQ(reasoning_deltas, reasoning);
  EXPECT_EQ(text_deltas, content);
  if (!content.empty()) {
    EXPECT_LT(last_reasoning, first_text);
  }
  const json& final_output = data.back()["response"]["output"];
  ASSERT_GE(final_output.size(), 1u);
  EXPECT_EQ(final_output[0]["type"], "reasoning");
  EXPECT_EQ(final_output[0]["content"][0]["text"], reasoning);
  // Reasoning off: no reasoning item, and no reasoning tokens.
  json off = body;
  off["reasoning"] = {{"effort", "none"}};
  const json quiet = s.ok("/v1/responses", off);
  for (const json& o : quiet["output"]) EXPECT_NE(o["type"], "reasoning") << quiet.dump();
  EXPECT_EQ(quiet["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
}
