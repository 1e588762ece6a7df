// Tokenizer against llama.cpp's goldens (every string of every fixture vocabulary, with
// and without special-token parsing, and detokenized bytes), plus the pre-tokenizer split
// rule of §5 on hand-written text and byte-exact round trips of arbitrary input.
#include <gtest/gtest.h>

#include <random>

#include "gguf/gguf.h"
#include "support.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace step35;
using namespace step35::testing;

namespace {

std::vector<uint8_t> unhex(const std::string& h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(uint8_t(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::unique_ptr<Tokenizer> load(const std::string& model) {
  std::string path = fixture_model(model), why;
  if (!file_exists(path)) path = regenerated_fixture(model, &why);
  if (path.empty()) return nullptr;
  auto f = gguf::File::open(path);
  return Tokenizer::from_gguf(*f);
}

void check_goldens(const std::string& set, const std::string& model) {
  auto tok = load(model);
  ASSERT_TRUE(tok);
  const auto g = read_json(golden_path(set + ".tokenizer.json"));
  ASSERT_EQ(g.size(), 21u);
  for (const auto& e : g) {
    const auto bytes = unhex(e["text_hex"].get<std::string>());
    const std::string text(bytes.begin(), bytes.end());
    const auto ids = tok->encode(text, true, false);
    EXPECT_EQ(ids, e["ids"].get<std::vector<int32_t>>()) << set << ": " << text;
    const auto ids_sp = tok->encode(text, true, true);
    EXPECT_EQ(ids_sp, e["ids_parse_special"].get<std::vector<int32_t>>()) << set << " (special): " << text;
    const auto detok = unhex(e["detok_hex"].get<std::string>());
    EXPECT_EQ(tok->decode(ids), std::string(detok.begin(), detok.end())) << text;
    const auto detok_sp = unhex(e["detok_parse_special_hex"].get<std::string>());
    EXPECT_EQ(tok->decode(ids_sp), std::string(detok_sp.begin(), detok_sp.end())) << text;
  }
}

TEST(TokenizerGolden, TinyA) { check_goldens("tiny-a", "tiny-a-f32.gguf"); }
TEST(TokenizerGolden, TinyB) { check_goldens("tiny-b", "tiny-b-f32.gguf"); }
TEST(TokenizerGolden, TinyK) { check_goldens("tiny-k", "tiny-k-q4_k_m.gguf"); }

TEST(TokenizerGolden, TextPromptsAndSpecialIds) {
  for (const char* m : {"tiny-a-f32", "tiny-b-f32", "tiny-k-f32"}) {
    auto tok = load(std::string(m) + ".gguf");
    if (!tok) GTEST_SKIP() << "cannot make " << m;
    const auto g = read_json(golden_path(std::string(m) + ".text.json"));
    EXPECT_EQ(tok->encode(g["text"].get<std::string>(), true, false), g["prompt_tokens"].get<std::vector<int32_t>>()) << m;
    EXPECT_EQ(tok->bos(), 0);
    EXPECT_EQ(tok->eos(), 1);
    EXPECT_TRUE(tok->is_eog(1));
    EXPECT_TRUE(tok->is_eog(tok->find_token("<|im_end|>")));
    EXPECT_FALSE(tok->is_eog(tok->find_token("<|im_start|>")));
  }
}

// The ChatML fixture template renders the exact string of the last tokenizer golden.
TEST(ChatTemplateGolden, ChatMLMatchesFixture) {
  auto f = gguf::File::open(fixture_model("tiny-a-f32.gguf"));
  ChatTemplate t(f->get_str("tokenizer.chat_template"));
  EXPECT_EQ(t.format(), ChatFormat::CHATML);
  const auto msgs = ChatTemplate::messages_from_json(nlohmann::json::parse(
      R"([{"role":"system","content":"You are a test."},{"role":"user","content":[{"type":"text","text":"Hello, who are you?"}]}])"));
  const auto g = read_json(golden_path("tiny-a.tokenizer.json"));
  EXPECT_EQ(t.render(msgs), g[20]["text"].get<std::string>());
}

TEST(ChatTemplate, Step35Format) {
  ChatTemplate t("", "<BOS>");
  EXPECT_EQ(t.format(), ChatFormat::STEP35);
  const auto msgs = ChatTemplate::messages_from_json(nlohmann::json::parse(R"([
    {"role":"system","content":"  Be brief. "},
    {"role":"user","content":"Weather in Paris?"},
    {"role":"assistant","content":"<think>old thought</think>Checking.","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":2}"}}]},
    {"role":"tool","content":"sunny"},
    {"role":"tool","content":"20C"}
  ])"));
  const auto tools = nlohmann::json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])");
  const std::string s = t.render(msgs, tools);
  EXPECT_TRUE(t.starts_with_bos(s));
  // System block: the system text as sent (the template does not trim it), then the tools
  // section with each tool's JSON.
  EXPECT_EQ(s.rfind("<BOS><|im_start|>system\n  Be brief. \n\n# Tools\n\nYou have access to the following functions in "
                    "JSONSchema format:\n\n<tools>\n", 0), 0u) << s;
  EXPECT_NE(s.find("\"name\": \"get_weather\""), std::string::npos) << s;
  EXPECT_NE(s.find("</tools>"), std::string::npos);
  EXPECT_NE(s.find("<IMPORTANT>"), std::string::npos);
  // The assistant turn after the last user message keeps its reasoning; the call follows.
  EXPECT_NE(s.find("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\nold thought\n</think>\n"
                   "Checking."), std::string::npos) << s;
  EXPECT_NE(s.find("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("<|im_start|>tool_response\n<tool_response>sunny</tool_response><tool_response>20C</tool_response>"
                   "<|im_end|>\n<|im_start|>assistant\n<think>\n"),
            std::string::npos)
      << s;
  const std::string gen = "<|im_start|>assistant\n<think>\n";
  EXPECT_EQ(s.substr(s.size() - gen.size()), gen);
}

TEST(ChatTemplate, EarlierAssistantTurnsDropReasoning) {
  ChatTemplate t("", "");
  std::vector<ChatMessage> m = {{"user", "a", "", {}, ""}, {"assistant", "b", "thought", {}, ""}, {"user", "c", "", {}, ""}};
  EXPECT_EQ(t.render(m), "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, RejectsBadMessages) {
  for (const char* bad : {R"({"role":"user"})", R"([1])", R"([{"content":"x"}])", R"([{"role":"wizard","content":"x"}])",
                          R"([{"role":"user","content":5}])", R"([{"role":"user","content":[{"type":"text"}]}])",
                          R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"not json"}}]}])"}) {
    EXPECT_THROW(ChatTemplate::messages_from_json(nlohmann::json::parse(bad)), std::invalid_argument) << bad;
  }
}

class PreTokenizer : public ::testing::Test {
 protected:
  void SetUp() override { tok = load("tiny-a-f32.gguf"); }
  std::vector<std::string> split(const std::string& s) { return tok->pre_tokenize(s); }
  std::unique_ptr<Tokenizer> tok;
};

TEST_F(PreTokenizer, UsesDeepseekV3) { EXPECT_EQ(tok->pre_type(), "deepseek-v3"); }

TEST_F(PreTokenizer, DigitsInGroupsOfThree) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("12345"), (V{"123", "45"}));
  EXPECT_EQ(split("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(split("abc 2024!"), (V{"abc", " ", "202", "4", "!"}));
  EXPECT_EQ(split("3.14"), (V{"3", ".", "14"}));
}

TEST_F(PreTokenizer, CjkRunsAreSplitOut) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("中文测试"), (V{"中文测试"}));
  EXPECT_EQ(split("abc中文def"), (V{"abc", "中文", "def"}));
  EXPECT_EQ(split("日本語のテスト。"), (V{"日本語のテスト", "。"}));
  // Hangul is not in the CJK class: it is a letter run of rule 3b.
  EXPECT_EQ(split(" 한국어"), (V{" 한국어"}));
}

TEST_F(PreTokenizer, LettersPunctuationAndContractions) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  // No contraction rule: the apostrophe + letters alternative (3a) takes "'t".
  EXPECT_EQ(split("don't"), (V{"don", "'t"}));
  // Rule 3a needs punctuation directly before letters; at "..." the greedy 3c wins first.
  EXPECT_EQ(split("...hello"), (V{"...", "hello"}));
  EXPECT_EQ(split("(parens)"), (V{"(parens", ")"}));
  EXPECT_EQ(split("a-b_c"), (V{"a", "-b", "_c"}));
  EXPECT_EQ(split("café naïve"), (V{"café", " naïve"}));
  // Combining mark (U+0301) stays with its letter.
  EXPECT_EQ(split("cafe\xcc\x81 x"), (V{"cafe\xcc\x81", " x"}));
  EXPECT_EQ(split("emoji 😀🚀 ok"), (V{"emoji", " 😀🚀", " ok"}));
}

TEST_F(PreTokenizer, WhitespaceRuns) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split("a   "), (V{"a", "   "}));
  EXPECT_EQ(split("a\n\nb"), (V{"a", "\n\n", "b"}));
  EXPECT_EQ(split("a \r\n b"), (V{"a", " \r\n", " b"}));
  EXPECT_EQ(split("x\ty"), (V{"x", "\ty"}));
  EXPECT_EQ(split("end.\n"), (V{"end", ".\n"}));
}

TEST_F(PreTokenizer, RoundTripsArbitraryBytes) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(size_t(rng() % 200), '\0');
    for (char& c : s) c = char(rng() % 256);
    const auto ids = tok->encode(s, false, iter % 2 == 0);
    EXPECT_EQ(tok->decode(ids), s);
    std::string joined;
    for (const auto& p : tok->pre_tokenize(s)) joined += p;
    EXPECT_EQ(joined, s);
  }
  // Encoded surrogates, NUL bytes, overlong forms.
  for (std::string s : {std::string("\xed\xa0\x80 x", 5), std::string("a\0b", 3), std::string("\xc0\xaf\xff\xfe")})
    EXPECT_EQ(tok->decode(tok->encode(s, false, false)), s);
}

TEST_F(PreTokenizer, LongInputsStayFast) {
  // 100k spaces and 1 MB of mixed text: linear-ish BPE, no quadratic blow-up.
  const std::string spaces(100000, ' ');
  EXPECT_EQ(tok->decode(tok->encode(spaces, false, false)), spaces);
  std::string big;
  while (big.size() < (1 << 20)) big += "The quick brown fox 12345 jumps; 中文 😀 \n";
  EXPECT_EQ(tok->decode(tok->encode(big, false, false)), big);
}

TEST(Utf8Stream, NeverEmitsPartialSequences) {
  const std::string s = "aé中😀b\xff" "c";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    Utf8Stream st;
    std::string a = st.push(s.substr(0, cut));
    std::string b = st.push(s.substr(cut));
    a += b + st.flush();
    EXPECT_EQ(a, s);
  }
  Utf8Stream st;
  EXPECT_EQ(st.push("\xe4\xb8"), "");
  EXPECT_EQ(st.push("\xad"), "中");
}

}  // namespace
