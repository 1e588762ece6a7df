// Chat templates: format detection, the fixtures' ChatML golden, every rendering rule of
// Step 3.5's format (§6 of the spec) with exact expected strings, and message parsing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "support.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace step35;
using namespace step35::testing;
using nlohmann::json;

namespace {

const std::string kGen = "<|im_start|>assistant\n<think>\n";

std::vector<ChatMessage> parse(const std::string& text) { return ChatTemplate::messages_from_json(json::parse(text)); }

ChatMessage msg(const std::string& role, const std::string& content, const std::string& reasoning = "") {
  ChatMessage m;
  m.role = role;
  m.content = content;
  m.reasoning_content = reasoning;
  return m;
}

// What a tools section looks like around its JSON lines and instruction paragraph.
std::string tools_block(const std::string& system, const std::vector<std::string>& lines, const std::string& instr) {
  std::string s = "<|im_start|>system\n";
  if (!system.empty()) s += system + "\n\n";
  s += "# Tools\n\nYou have access to the following functions in JSONSchema format:\n\n<tools>";
  for (const auto& l : lines) s += "\n" + l;
  return s + "\n</tools>\n\n" + instr + "<|im_end|>\n";
}

// The instruction paragraph an empty template gets (read back from a render).
std::string default_instructions() {
  ChatTemplate t("");
  const std::string s = t.render({}, json::parse(R"([{"name":"f"}])"), false);
  const std::string open = "</tools>\n\n";
  const size_t a = s.find(open) + open.size();
  return s.substr(a, s.rfind("<|im_end|>") - a);
}

// ---------------------------------------------------------------------------------------
// Format detection

TEST(ChatFormatDetection, Rules) {
  EXPECT_EQ(ChatTemplate("").format(), ChatFormat::STEP35);
  EXPECT_EQ(ChatTemplate("{{- '<|im_start|>assistant\\n<think>\\n' }}").format(), ChatFormat::STEP35);
  EXPECT_EQ(ChatTemplate("{{ 'You have access to the following functions in JSONSchema format:' }}").format(),
            ChatFormat::STEP35);
  EXPECT_EQ(ChatTemplate("{{ '<|im_start|>' + m.role }}").format(), ChatFormat::CHATML);
  EXPECT_EQ(ChatTemplate("{{ messages }}").format(), ChatFormat::CHATML);  // unknown: ChatML
  // "<think>" alone (e.g. stripping old reasoning) does not make a template Step 3.5's.
  EXPECT_EQ(ChatTemplate("{{ '<|im_start|>' }}{% if '<think>' in c %}{% endif %}").format(), ChatFormat::CHATML);
  EXPECT_TRUE(ChatTemplate("", "<s>").renders_bos());
  EXPECT_FALSE(ChatTemplate("", "").renders_bos());
  EXPECT_FALSE(ChatTemplate("{{ '<|im_start|>' }}", "<s>").renders_bos());
}

// ---------------------------------------------------------------------------------------
// ChatML

TEST(ChatML, FixtureTemplateRendersTheGoldenString) {
  auto f = gguf::File::open(fixture_model("tiny-a-f32.gguf"));
  auto tok = Tokenizer::from_gguf(*f);
  ChatTemplate t(f->get_str("tokenizer.chat_template"), tok->token_to_piece(tok->bos()));
  ASSERT_EQ(t.format(), ChatFormat::CHATML);
  EXPECT_FALSE(t.renders_bos());
  const auto msgs = parse(R"([{"role":"system","content":"You are a test."},
                               {"role":"user","content":"Hello, who are you?"}])");
  const auto g = read_json(golden_path("tiny-a.tokenizer.json"));
  const auto& last = g[g.size() - 1];
  const std::string rendered = t.render(msgs);
  EXPECT_EQ(rendered, last["text"].get<std::string>());
  EXPECT_EQ(rendered,
            "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHello, who are you?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The caller adds BOS (renders_bos() is false) and parses special tokens.
  EXPECT_EQ(tok->encode(rendered, !t.renders_bos(), true), last["ids_parse_special"].get<std::vector<TokenId>>());
}

TEST(ChatML, RolesContentOnly) {
  ChatTemplate t("{{ '<|im_start|>' }}");
  std::vector<ChatMessage> m = {msg("user", " a "), msg("assistant", "b", "hidden"), msg("tool", "r")};
  m[1].tool_calls.push_back({"f", json::object()});
  EXPECT_EQ(t.render(m, json::array(), false),
            "<|im_start|>user\n a <|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>tool\nr<|im_end|>\n");
  EXPECT_THROW(t.render({msg("robot", "x")}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// Step 3.5

TEST(Step35, SystemAndUser) {
  ChatTemplate t("", "<BOS>");
  EXPECT_EQ(t.render({msg("system", "S"), msg("user", "U")}),
            "<BOS><|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n" + kGen);
  EXPECT_EQ(t.render({msg("user", "U")}), "<BOS><|im_start|>user\nU<|im_end|>\n" + kGen);
  EXPECT_EQ(t.render({msg("user", "U")}, json::array(), false), "<BOS><|im_start|>user\nU<|im_end|>\n");
  EXPECT_EQ(t.render({}), "<BOS>" + kGen);
  EXPECT_EQ(ChatTemplate("").render({msg("user", "U")}), "<|im_start|>user\nU<|im_end|>\n" + kGen);
}

TEST(Step35, ContentIsTrimmed) {
  ChatTemplate t("");
  EXPECT_EQ(t.render({msg("system", "\n S \t"), msg("user", "  hi there \n\n")}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n" + kGen);
}

TEST(Step35, LaterSystemTurnsAndObservation) {
  ChatTemplate t("");
  ChatMessage obs = msg("system", "seen");
  obs.name = "observation";
  EXPECT_EQ(t.render({msg("user", "U"), msg("system", "note"), obs}, json::array(), false),
            "<|im_start|>user\nU<|im_end|>\n<|im_start|>system\nnote<|im_end|>\n"
            "<|im_start|>observation\nseen<|im_end|>\n");
  // The first message is the system block even when named observation.
  ChatMessage first = msg("system", "S");
  first.name = "observation";
  EXPECT_EQ(t.render({first}, json::array(), false), "<|im_start|>system\nS<|im_end|>\n");
}

TEST(Step35, ReasoningOnlyAfterTheLastUserQuery) {
  ChatTemplate t("");
  const std::vector<ChatMessage> m = {msg("user", "q1"), msg("assistant", "a1", "r1"), msg("user", "q2"),
                                      msg("assistant", "a2", "r2")};
  EXPECT_EQ(t.render(m, json::array(), false),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\na2<|im_end|>\n");
  // Without reasoning the block is still written (empty) after the last query.
  EXPECT_EQ(t.render({msg("user", "q"), msg("assistant", "a")}, json::array(), false),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\na<|im_end|>\n");
  // No user message at all: nothing counts as "after the last query".
  EXPECT_EQ(t.render({msg("system", "S"), msg("assistant", "a", "r")}, json::array(), false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
}

TEST(Step35, UserMessagesThatAreToolOutputAreNotQueries) {
  ChatTemplate t("");
  const std::vector<ChatMessage> m = {msg("user", "q"), msg("assistant", "a1", "r1"),
                                      msg("user", "<tool_response>out</tool_response>"), msg("assistant", "a2", "r2")};
  EXPECT_EQ(t.render(m, json::array(), false),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\na1<|im_end|>\n"
            "<|im_start|>user\n<tool_response>out</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\na2<|im_end|>\n");
}

TEST(Step35, ReasoningSplitFromContent) {
  ChatTemplate t("");
  auto render_one = [&](const ChatMessage& a) {
    return t.render({msg("user", "q"), a}, json::array(), false).substr(std::string("<|im_start|>user\nq<|im_end|>\n").size());
  };
  EXPECT_EQ(render_one(msg("assistant", "<think>\nA\n</think>\n\nB")),
            "<|im_start|>assistant\n<think>\nA\n</think>\nB<|im_end|>\n");
  EXPECT_EQ(render_one(msg("assistant", "A</think>B")), "<|im_start|>assistant\n<think>\nA\n</think>\nB<|im_end|>\n");
  // Reasoning: before the first </think>, after the last <think> there; content: after
  // the last </think>.
  EXPECT_EQ(render_one(msg("assistant", "x<think>a</think>b</think>c")),
            "<|im_start|>assistant\n<think>\na\n</think>\nc<|im_end|>\n");
  // reasoning_content wins; the content is then used as is.
  EXPECT_EQ(render_one(msg("assistant", "C", "R")), "<|im_start|>assistant\n<think>\nR\n</think>\nC<|im_end|>\n");
  EXPECT_EQ(render_one(msg("assistant", "a</think>b", "R")),
            "<|im_start|>assistant\n<think>\nR\n</think>\na</think>b<|im_end|>\n");
  // Before the last query the split-off reasoning is dropped too.
  EXPECT_EQ(t.render({msg("assistant", "A</think>B"), msg("user", "q")}, json::array(), false),
            "<|im_start|>assistant\nB<|im_end|>\n<|im_start|>user\nq<|im_end|>\n");
}

TEST(Step35, ToolCalls) {
  ChatTemplate t("");
  ChatMessage a = msg("assistant", "Checking.");
  a.tool_calls.push_back({"get_weather", json::parse(R"({"city":"Paris","days":2,"opts":{"a":[1,"x"]},
                                                         "flag":true,"none":null,"ratio":0.5,"text":"two\nlines"})")});
  a.tool_calls.push_back({"noop", json::object()});
  a.tool_calls.push_back({"nullargs", json()});
  EXPECT_EQ(t.render({msg("user", "q"), a}, json::array(), false),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\nChecking."
            "<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n"
            "<parameter=flag>\nTrue\n</parameter>\n"
            "<parameter=none>\nNone\n</parameter>\n"
            "<parameter=opts>\n{\"a\": [1, \"x\"]}\n</parameter>\n"
            "<parameter=ratio>\n0.5\n</parameter>\n"
            "<parameter=text>\ntwo\nlines\n</parameter>\n"
            "</function>\n</tool_call>"
            "<tool_call>\n<function=noop>\n</function>\n</tool_call>"
            "<tool_call>\n<function=nullargs>\n</function>\n</tool_call><|im_end|>\n");
  // Only calls, no content; and an earlier turn keeps its calls but not its reasoning.
  ChatMessage b = msg("assistant", "", "why");
  b.tool_calls.push_back({"f", json::parse(R"({"x":[]})")});
  EXPECT_EQ(t.render({b, msg("user", "q")}, json::array(), false),
            "<|im_start|>assistant\n<tool_call>\n<function=f>\n<parameter=x>\n[]\n</parameter>\n</function>\n"
            "</tool_call><|im_end|>\n<|im_start|>user\nq<|im_end|>\n");
  ChatMessage bad = msg("assistant", "");
  bad.tool_calls.push_back({"f", json::array()});
  EXPECT_THROW(t.render({bad}), std::invalid_argument);
  ChatMessage unnamed = msg("assistant", "");
  unnamed.tool_calls.push_back({"", json::object()});
  EXPECT_THROW(t.render({unnamed}), std::invalid_argument);
}

TEST(Step35, ToolResponsesAreGrouped) {
  ChatTemplate t("");
  const std::vector<ChatMessage> m = {msg("user", "q"), msg("assistant", "a"), msg("tool", " sunny "),
                                      msg("tool", "20C"), msg("assistant", "b"), msg("tool", "x")};
  EXPECT_EQ(t.render(m),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\na<|im_end|>\n"
            "<|im_start|>tool_response\n<tool_response>sunny</tool_response><tool_response>20C</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\nb<|im_end|>\n"
            "<|im_start|>tool_response\n<tool_response>x</tool_response><|im_end|>\n" +
                kGen);
  EXPECT_EQ(t.render({msg("tool", "first")}, json::array(), false),
            "<|im_start|>tool_response\n<tool_response>first</tool_response><|im_end|>\n");
}

TEST(Step35, ToolsSection) {
  ChatTemplate t("", "<BOS>");
  const std::string instr = default_instructions();
  EXPECT_NE(instr.find("<tool_call>\n<function="), std::string::npos) << instr;
  EXPECT_NE(instr.find("<parameter="), std::string::npos) << instr;
  EXPECT_NE(instr.find("<IMPORTANT>"), std::string::npos) << instr;
  EXPECT_EQ(instr.substr(instr.size() - 12), "</IMPORTANT>") << instr;

  const std::string tools_text =
      R"([{"type":"function","function":{"name":"get_weather","description":"Météo du jour",
          "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";
  // nlohmann::json sorts keys; Python json.dumps separators; non-ASCII kept.
  const std::string sorted =
      R"({"function": {"description": "Météo du jour", "name": "get_weather", "parameters": {"properties": )"
      R"({"city": {"type": "string"}}, "required": ["city"], "type": "object"}}, "type": "function"})";
  // nlohmann::ordered_json keeps the client's order.
  const std::string ordered =
      R"({"type": "function", "function": {"name": "get_weather", "description": "Météo du jour", "parameters": )"
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})";
  const std::vector<ChatMessage> m = {msg("system", " Be brief. "), msg("user", "Weather?")};
  EXPECT_EQ(t.render(m, json::parse(tools_text)),
            "<BOS>" + tools_block("Be brief.", {sorted}, instr) + "<|im_start|>user\nWeather?<|im_end|>\n" + kGen);
  EXPECT_EQ(t.render(m, nlohmann::ordered_json::parse(tools_text)),
            "<BOS>" + tools_block("Be brief.", {ordered}, instr) + "<|im_start|>user\nWeather?<|im_end|>\n" + kGen);
  // Without a system message; two tools (a bare function object is accepted as written).
  const json two = json::parse(R"([{"name":"a"},{"type":"function","function":{"name":"b"}}])");
  EXPECT_EQ(t.render({msg("user", "U")}, two, false),
            "<BOS>" + tools_block("", {R"({"name": "a"})", R"({"function": {"name": "b"}, "type": "function"})"}, instr) +
                "<|im_start|>user\nU<|im_end|>\n");
  // Null or empty tools: no tools section.
  EXPECT_EQ(t.render({msg("user", "U")}, json(), false), "<BOS><|im_start|>user\nU<|im_end|>\n");
  EXPECT_EQ(t.render({msg("user", "U")}, json::array(), false), "<BOS><|im_start|>user\nU<|im_end|>\n");
}

TEST(Step35, InstructionsComeFromTheTemplateWhenItHasThem) {
  // A template that writes its own paragraph as one string literal after </tools>.
  const std::string src =
      "{{- \"\\n</tools>\\n\\nCall like this:\\n<tool_call>...</tool_call>\\n\\t\\\"quoted\\\"<|im_end|>\\n\" }}"
      "{{- '<|im_start|>assistant\\n<think>\\n' }}";
  ChatTemplate t(src);
  ASSERT_EQ(t.format(), ChatFormat::STEP35);
  EXPECT_EQ(t.render({}, json::parse(R"([{"name":"f"}])"), false),
            tools_block("", {R"({"name": "f"})"}, "Call like this:\n<tool_call>...</tool_call>\n\t\"quoted\""));
  // A paragraph that is not one plain literal is not used.
  const std::string split_literal = "\"\\n</tools>\\n\\nA\" + x + \"B<|im_end|>\" You have access to the following "
                                    "functions in JSONSchema format";
  EXPECT_EQ(ChatTemplate(split_literal).render({}, json::parse(R"([{"name":"f"}])"), false),
            tools_block("", {R"({"name": "f"})"}, default_instructions()));
}

TEST(Step35, RejectsBadInput) {
  ChatTemplate t("");
  EXPECT_THROW(t.render({msg("wizard", "x")}), std::invalid_argument);
  EXPECT_THROW(t.render({msg("user", "x")}, json::object()), std::invalid_argument);
  EXPECT_THROW(t.render({msg("user", "x")}, json::parse("[1]")), std::invalid_argument);
  EXPECT_THROW(t.render({msg("user", "x")}, json::parse(R"([{"type":"function"}])")), std::invalid_argument);
  EXPECT_THROW(t.render({msg("user", "x")}, json::parse(R"([{"function":{"name":""}}])")), std::invalid_argument);
  EXPECT_THROW(t.render({msg("user", "x")}, json::parse(R"([{"function":"f"}])")), std::invalid_argument);
}

TEST(Step35, TokenizesWithOneBos) {
  auto f = gguf::File::open(fixture_model("tiny-a-f32.gguf"));
  auto tok = Tokenizer::from_gguf(*f);
  ChatTemplate t("", tok->token_to_piece(tok->bos()));
  ASSERT_TRUE(t.renders_bos());
  const std::string s = t.render({msg("user", "Hello")});
  const auto ids = tok->encode(s, !t.renders_bos(), true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], tok->bos());
  EXPECT_NE(ids[1], tok->bos());
  EXPECT_EQ(ids[1], tok->find_token("<|im_start|>"));
  EXPECT_EQ(ids.back(), tok->find_token("\xC4\x8A"));  // "\n" after <think>
  EXPECT_EQ(ids[ids.size() - 2], tok->find_token("<think>"));
  EXPECT_EQ(tok->decode(ids), s);
}

// ---------------------------------------------------------------------------------------
// messages_from_json

TEST(MessagesFromJson, Shapes) {
  const auto m = parse(R"([
    {"role":"system","content":"S"},
    {"role":"developer","content":"D"},
    {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
    {"role":"assistant","content":null,"reasoning_content":"R","tool_calls":[
      {"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1,\"y\":[true]}"}},
      {"function":{"name":"g","arguments":{"k":"v"}}},
      {"name":"h","arguments":""},
      {"type":"function","function":{"name":"i"}}]},
    {"role":"tool","content":"out","name":"f","tool_call_id":"c1"},
    {"role":"user"},
    {"role":"assistant","content":"x","reasoning_content":null,"tool_calls":null,"name":null}
  ])");
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[0].content, "S");
  EXPECT_EQ(m[1].role, "system");  // developer is OpenAI's newer name for system
  EXPECT_EQ(m[2].content, "ab");
  EXPECT_EQ(m[3].content, "");
  EXPECT_EQ(m[3].reasoning_content, "R");
  ASSERT_EQ(m[3].tool_calls.size(), 4u);
  EXPECT_EQ(m[3].tool_calls[0].name, "f");
  EXPECT_EQ(m[3].tool_calls[0].arguments, json::parse(R"({"x":1,"y":[true]})"));
  EXPECT_EQ(m[3].tool_calls[1].name, "g");
  EXPECT_EQ(m[3].tool_calls[1].arguments, json::parse(R"({"k":"v"})"));
  EXPECT_EQ(m[3].tool_calls[2].name, "h");
  EXPECT_EQ(m[3].tool_calls[2].arguments, json::object());
  EXPECT_EQ(m[3].tool_calls[3].arguments, json::object());
  EXPECT_EQ(m[4].role, "tool");
  EXPECT_EQ(m[4].name, "f");
  EXPECT_EQ(m[5].content, "");
  EXPECT_TRUE(m[6].tool_calls.empty());
  EXPECT_EQ(parse("[]").size(), 0u);
}

TEST(MessagesFromJson, RejectsBadShapes) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"role":"user"})", "messages must be an array"},
      {R"([1])", "messages[0] must be an object"},
      {R"([{"role":"user","content":"a"},{"content":"x"}])", "messages[1] needs a string 'role'"},
      {R"([{"role":7}])", "messages[0] needs a string 'role'"},
      {R"([{"role":"wizard","content":"x"}])", "'wizard'"},
      {R"([{"role":"user","content":5}])", "messages[0].content must be"},
      {R"([{"role":"user","content":{"text":"x"}}])", "messages[0].content must be"},
      {R"([{"role":"user","content":["x"]}])", "messages[0].content[0] must be an object"},
      {R"([{"role":"user","content":[{"text":"x"}]}])", "messages[0].content[0] must be an object with a string 'type'"},
      {R"([{"role":"user","content":[{"type":"text"}]}])", "messages[0].content[0] (a text part) needs a string 'text'"},
      {R"([{"role":"user","content":[{"type":"text","text":3}]}])", "needs a string 'text'"},
      {R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])", "only text parts"},
      {R"([{"role":"assistant","reasoning_content":1}])", "reasoning_content must be a string"},
      {R"([{"role":"tool","content":"x","name":2}])", "name must be a string"},
      {R"([{"role":"assistant","tool_calls":{}}])", "tool_calls must be an array"},
      {R"([{"role":"assistant","tool_calls":[1]}])", "tool_calls[0] must be an object"},
      {R"([{"role":"assistant","tool_calls":[{"type":"code","function":{"name":"f"}}]}])", "type must be"},
      {R"([{"role":"assistant","tool_calls":[{"function":"f"}]}])", "function must be an object"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])", "function name"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"not json"}}]}])", "not valid JSON"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}])", "JSON object"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":5}}]}])", "object or a JSON string"},
  };
  for (const auto& [text, expect] : bad) {
    try {
      parse(text);
      ADD_FAILURE() << "no exception for " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << text << " -> " << e.what();
    }
  }
}

TEST(MessagesFromJson, RenderedEndToEnd) {
  ChatTemplate t("", "<s>");
  const auto m = parse(R"([
    {"role":"system","content":"Be brief."},
    {"role":"user","content":[{"type":"text","text":"Weather in Paris?"}]},
    {"role":"assistant","content":"<think>I should look it up.</think>Checking.","tool_calls":[
      {"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":2}"}}]},
    {"role":"tool","content":"sunny"},
    {"role":"tool","content":"20C"}
  ])");
  EXPECT_EQ(t.render(m),
            "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nI should look it up.\n</think>\nChecking.<tool_call>\n"
            "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n<|im_start|>tool_response\n<tool_response>sunny</tool_response>"
            "<tool_response>20C</tool_response><|im_end|>\n" +
                kGen);
}

}  // namespace
