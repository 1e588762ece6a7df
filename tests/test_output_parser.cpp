// OutputParser: reasoning / content / tool-call split, streamed and not, at every chunk
// boundary; and the stop-string matcher.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "chat/output_parser.h"
#include "chat/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace step35 {
namespace {

using json = nlohmann::json;

// A byte-level vocabulary: <s>=0, </s>=1, <|im_end|>=2 (control), the 256 byte tokens
// (id 3 + byte), then the chat tags as single control tokens.
struct TagVocab {
  std::unique_ptr<Tokenizer> tok;
  TokenId think = -1, think_end = -1, call = -1, call_end = -1, im_start = -1;

  TagVocab() {
    std::vector<std::string> tokens = {"<s>", "</s>", "<|im_end|>"};
    std::vector<int32_t> types = {3, 3, 3};
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(step35::byte_level_text(uint8_t(b)));
      types.push_back(1);
    }
    const auto add = [&](const std::string& t, int32_t type) {
      tokens.push_back(t);
      types.push_back(type);
      return TokenId(tokens.size() - 1);
    };
    think = add("<think>", 4);
    think_end = add("</think>", 4);
    call = add("<tool_call>", 3);
    call_end = add("</tool_call>", 3);
    im_start = add("<|im_start|>", 3);
    gguf::Writer w;
    w.set_str("tokenizer.ggml.model", "gpt2");
    w.set_str("tokenizer.ggml.pre", "deepseek-v3");
    w.set_arr_str("tokenizer.ggml.tokens", tokens);
    w.set_arr_i32("tokenizer.ggml.token_type", types);
    w.set_arr_str("tokenizer.ggml.merges", {});
    w.set_u32("tokenizer.ggml.bos_token_id", 0);
    w.set_u32("tokenizer.ggml.eos_token_id", 1);
    const std::vector<uint8_t> bytes = w.to_bytes();
    auto f = gguf::File::parse_buffer(bytes.data(), bytes.size(), "tags.gguf");
    tok = Tokenizer::from_gguf(*f);
  }
  // Special-token ids for the tags in `text`, byte tokens for the rest.
  std::vector<TokenId> encode(const std::string& text) const { return tok->encode(text, false, true); }
};

const TagVocab& vocab() {
  static const TagVocab v;
  return v;
}

json weather_tools() {
  return json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},
                    "opts":{"type":"object"},"tags":{"type":"array","items":{"type":"string"}},
                    "unit":{"enum":["c","f"]},"note":{"type":["string","null"]}},
      "required":["city"]}}},
    {"type":"function","function":{"name":"noop","parameters":{"type":"object","properties":{}}}}
  ])");
}

// The result of feeding `chunks` as text, plus the concatenated deltas.
struct ParseRun {
  ParsedOutput result;
  std::string reasoning, content;
  std::vector<std::string> names, ids, arguments;
};

void collect(ParseRun& r, const std::vector<OutputDelta>& deltas) {
  for (const OutputDelta& d : deltas) {
    switch (d.kind) {
      case OutputDelta::Kind::Reasoning: r.reasoning += d.text; break;
      case OutputDelta::Kind::Content: r.content += d.text; break;
      case OutputDelta::Kind::ToolCallStart:
        ASSERT_EQ(size_t(d.tool_index), r.names.size());
        r.names.push_back(d.tool_name);
        r.ids.push_back(d.tool_id);
        r.arguments.emplace_back();
        break;
      case OutputDelta::Kind::ToolCallArguments:
        ASSERT_GE(d.tool_index, 0);
        ASSERT_LT(size_t(d.tool_index), r.arguments.size());
        r.arguments[size_t(d.tool_index)] += d.text;
        break;
    }
  }
}

ParseRun run_chunks(const std::vector<std::string>& chunks, const json& tools, bool in_reasoning = true) {
  OutputParserOptions o;
  o.in_reasoning = in_reasoning;
  OutputParser p(*vocab().tok, tools, o);
  ParseRun r;
  for (const std::string& c : chunks) collect(r, p.push_text(c));
  collect(r, p.finish());
  r.result = p.result();
  return r;
}

void expect_consistent(const ParseRun& r) {
  EXPECT_EQ(r.reasoning, r.result.reasoning);
  EXPECT_EQ(r.content, r.result.content);
  ASSERT_EQ(r.names.size(), r.result.tool_calls.size());
  for (size_t i = 0; i < r.names.size(); ++i) {
    EXPECT_EQ(r.names[i], r.result.tool_calls[i].name);
    EXPECT_EQ(r.ids[i], r.result.tool_calls[i].id);
    EXPECT_EQ(r.arguments[i], r.result.tool_calls[i].arguments);
    EXPECT_TRUE(json::accept(r.result.tool_calls[i].arguments)) << r.result.tool_calls[i].arguments;
  }
}

// Parses `text` whole, then split at every byte offset (two chunks), then one byte at a
// time: every way must give the same result, and the deltas must add up to it.
ParsedOutput parse_every_way(const std::string& text, const json& tools, bool in_reasoning = true) {
  const ParseRun whole = run_chunks({text}, tools, in_reasoning);
  expect_consistent(whole);
  const auto same = [&](const ParseRun& r, const std::string& how) {
    expect_consistent(r);
    EXPECT_EQ(r.result.reasoning, whole.result.reasoning) << how;
    EXPECT_EQ(r.result.content, whole.result.content) << how;
    EXPECT_EQ(r.result.truncated, whole.result.truncated) << how;
    ASSERT_EQ(r.result.tool_calls.size(), whole.result.tool_calls.size()) << how;
    for (size_t i = 0; i < r.result.tool_calls.size(); ++i) {
      EXPECT_EQ(r.result.tool_calls[i].name, whole.result.tool_calls[i].name) << how;
      EXPECT_EQ(r.result.tool_calls[i].arguments, whole.result.tool_calls[i].arguments) << how;
    }
  };
  for (size_t cut = 0; cut <= text.size(); ++cut)
    same(run_chunks({text.substr(0, cut), text.substr(cut)}, tools, in_reasoning), "cut at " + std::to_string(cut));
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  same(run_chunks(bytes, tools, in_reasoning), "byte by byte");
  return whole.result;
}

TEST(OutputParser, ReasoningThenContent) {
  const ParsedOutput r = parse_every_way("Let me think.\nStill.\n</think>\nHello there.", json::array());
  EXPECT_EQ(r.reasoning, "Let me think.\nStill.");
  EXPECT_EQ(r.content, "Hello there.");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_FALSE(r.truncated);
}

TEST(OutputParser, OnlyOneNewlineAroundThinkEndIsDropped) {
  const ParsedOutput r = parse_every_way("a\n\n</think>\n\nb\n", json::array());
  EXPECT_EQ(r.reasoning, "a\n");
  EXPECT_EQ(r.content, "\nb\n");
}

TEST(OutputParser, UnfinishedReasoningStaysReasoning) {
  const ParsedOutput r = parse_every_way("thinking </thi", json::array());
  EXPECT_EQ(r.reasoning, "thinking </thi");
  EXPECT_EQ(r.content, "");
}

TEST(OutputParser, ContentModeWithoutReasoning) {
  ParsedOutput r = parse_every_way("Just an answer <b>bold</b> < x", json::array(), false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Just an answer <b>bold</b> < x");
  // A model that opens its own think block.
  r = parse_every_way("<think>\nhmm\n</think>\nok", json::array(), false);
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "ok");
  // A stray </think> in content never shows.
  r = parse_every_way("x</think>\ny", json::array(), false);
  EXPECT_EQ(r.content, "xy");
}

TEST(OutputParser, SingleToolCallTypedParameters) {
  const std::string text =
      "I should call it.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nSan Francisco, CA\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n"
      "<parameter=metric>\ntrue\n</parameter>\n"
      "<parameter=opts>\n{\"a\": [1, {\"b\": null}], \"c\": \"d\"}\n</parameter>\n"
      "<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n"
      "<parameter=unit>\nc\n</parameter>\n"
      "<parameter=note>\nnull\n</parameter>\n"
      "</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  EXPECT_EQ(r.reasoning, "I should call it.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  const ParsedToolCall& c = r.tool_calls[0];
  EXPECT_EQ(c.name, "get_weather");
  EXPECT_EQ(c.id, "call_0");
  EXPECT_TRUE(c.known_function);
  EXPECT_EQ(c.arguments,
            R"({"city":"San Francisco, CA","days":3,"metric":true,"opts":{"a":[1,{"b":null}],"c":"d"},)"
            R"("tags":["x","y"],"unit":"c","note":null})");
  EXPECT_TRUE(r.warnings.empty());
}

TEST(OutputParser, StringParametersStayRawText) {
  const std::string text =
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
      "</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"42"})");
}

TEST(OutputParser, MultiLineStringValueKeepsInnerNewlines) {
  const std::string text =
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nline 1\n\nline <3> </param\n\n"
      "</parameter>\n</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments)["city"], "line 1\n\nline <3> </param\n");
}

TEST(OutputParser, UnparseableTypedValueFallsBackToString) {
  const std::string text =
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n"
      "<parameter=days>\nthree\n</parameter>\n<parameter=opts>\n{\"a\": \n</parameter>\n"
      "</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"X","days":"three","opts":"{\"a\": "})");
}

TEST(OutputParser, ParallelCallsAndContentBefore) {
  const std::string text =
      "r\n</think>\nChecking two cities.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>\n";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  EXPECT_EQ(r.reasoning, "r");
  EXPECT_EQ(r.content, "Checking two cities.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(r.tool_calls[1].name, "noop");
  EXPECT_EQ(r.tool_calls[1].id, "call_1");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
}

TEST(OutputParser, ToolCallEndsReasoning) {
  const std::string text = "plan\n<tool_call>\n<function=noop>\n</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  EXPECT_EQ(r.reasoning, "plan");
  ASSERT_EQ(r.tool_calls.size(), 1u);
}

TEST(OutputParser, WithoutToolsTagsAreContent) {
  const std::string text = "</think>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, json::array());
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<tool_call>\n<function=noop>\n</function>\n</tool_call>");
}

TEST(OutputParser, UnknownFunctionIsReportedAsUnknown) {
  const std::string text =
      "</think>\n<tool_call>\n<function=launch>\n<parameter=n>\n5\n</parameter>\n<parameter=s>\nhi\n"
      "</parameter>\n</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_FALSE(r.tool_calls[0].known_function);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"n":5,"s":"hi"})");
  EXPECT_FALSE(r.warnings.empty());
}

TEST(OutputParser, UnclosedCallAtEndKeepsWhatWasParsed) {
  ParsedOutput r = parse_every_way(
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", weather_tools());
  EXPECT_TRUE(r.truncated);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"Par"})");
  EXPECT_EQ(r.content, "");
  // Ended before the name was complete: no call, nothing leaks.
  r = parse_every_way("</think>\nok\n<tool_call>\n<function=get_wea", weather_tools());
  EXPECT_TRUE(r.truncated);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "ok");
  // Ended right after </function>.
  r = parse_every_way("</think>\n<tool_call>\n<function=noop>\n</function>\n</tool_", weather_tools());
  EXPECT_TRUE(r.truncated);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
}

TEST(OutputParser, StrayTextInsideCallIsSkipped) {
  const std::string text =
      "</think>\n<tool_call>\nsure!\n<function=get_weather>\noops\n<parameter=city>\nRome\n</parameter>\n"
      "junk</function>\n</tool_call>after";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(r.content, "after");
  EXPECT_FALSE(r.warnings.empty());
}

TEST(OutputParser, RepeatedParameterKeepsFirst) {
  const std::string text =
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n"
      "<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"A"})");
}

TEST(OutputParser, MissingFunctionCloseIsTolerated) {
  const std::string text =
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</tool_call>";
  const ParsedOutput r = parse_every_way(text, weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"A"})");
  EXPECT_FALSE(r.truncated);
}

TEST(OutputParser, MultiByteCharactersSplitAcrossChunks) {
  const std::string text = "d\xC3\xA9j\xC3\xA0 \xE2\x82\xAC\n</think>\n\xF0\x9F\x98\x80 ok";
  const ParsedOutput r = parse_every_way(text, json::array());
  EXPECT_EQ(r.reasoning, "d\xC3\xA9j\xC3\xA0 \xE2\x82\xAC");
  EXPECT_EQ(r.content, "\xF0\x9F\x98\x80 ok");
  // No delta ever splits a character.
  OutputParser p(*vocab().tok, json::array());
  std::vector<OutputDelta> all;
  for (char c : text)
    for (OutputDelta& d : p.push_text(std::string(1, c))) all.push_back(d);
  for (OutputDelta& d : p.finish()) all.push_back(d);
  for (const OutputDelta& d : all) {
    ASSERT_FALSE(d.text.empty());
    EXPECT_NE(uint8_t(d.text.back()) & 0xC0, 0xC0) << "delta ends with a lead byte";
  }
}

TEST(OutputParser, TagsHeldBackUntilCertain) {
  OutputParser p(*vocab().tok, weather_tools(), OutputParserOptions{false, "id_"});
  ParseRun r;
  collect(r, p.push_text("Hi <tool"));
  EXPECT_EQ(r.content, "Hi");  // the space could precede a call; "<tool" could be a tag
  collect(r, p.push_text("box> there"));
  EXPECT_EQ(r.content, "Hi <toolbox> there");
  collect(r, p.push_text(" <tool_call>\n<function=noop>"));
  ASSERT_EQ(r.names.size(), 1u);
  EXPECT_EQ(r.names[0], "noop");
  EXPECT_EQ(r.ids[0], "id_0");
  EXPECT_EQ(r.content, "Hi <toolbox> there");
  collect(r, p.push_text("\n</function>\n</tool_call>"));
  EXPECT_EQ(r.arguments[0], "{}");
  collect(r, p.finish());
  r.result = p.result();
  expect_consistent(r);
}

// A string parameter streams as it is generated (OpenAI's incremental arguments deltas):
// only what may still be the newline and </parameter> that end the value is held back.
// Other parameters go out whole once their value is complete.
TEST(OutputParser, ArgumentsStreamAsTheyAreGenerated) {
  OutputParser p(*vocab().tok, weather_tools());
  std::vector<OutputDelta> d = p.push_text("</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOs");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, OutputDelta::Kind::ToolCallStart);
  EXPECT_EQ(d[1].kind, OutputDelta::Kind::ToolCallArguments);
  EXPECT_EQ(d[1].text, R"({"city":"Os)");
  d = p.push_text("lo \"2\"\n");  // the newline may end the value: held
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, R"(lo \"2\")");
  d = p.push_text("x\n</param");  // it did not; the new one might, with the partial tag
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, R"(\nx)");
  d = p.push_text("eter>\n");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "\"");
  d = p.push_text("<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, R"(,"days":2})");
  EXPECT_EQ(p.result().tool_calls[0].arguments, R"({"city":"Oslo \"2\"\nx","days":2})");
  EXPECT_TRUE(p.finish().empty());
  EXPECT_TRUE(p.push_text("more").empty());
}

// A streamed string value cut by the end of generation is closed as far as it got.
TEST(OutputParser, StreamedValueCutByTheEndIsClosed) {
  OutputParser p(*vocab().tok, weather_tools());
  ParseRun r;
  collect(r, p.push_text("</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar\n</para"));
  collect(r, p.finish());
  r.result = p.result();
  expect_consistent(r);
  EXPECT_TRUE(r.result.truncated);
  EXPECT_EQ(r.result.tool_calls[0].arguments, R"({"city":"Par\n</para"})");
}

TEST(OutputParser, SpecialTokensAndSpelledTagsGiveTheSameResult) {
  const TagVocab& v = vocab();
  const std::string text =
      "why\n</think>\nok\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n"
      "</function>\n</tool_call>";
  const std::vector<TokenId> special = v.encode(text);
  ASSERT_NE(std::find(special.begin(), special.end(), v.call), special.end());
  const std::vector<TokenId> spelled = v.tok->encode(text, false, false);
  ASSERT_EQ(std::find(spelled.begin(), spelled.end(), v.call), spelled.end());
  for (const std::vector<TokenId>* ids : {&special, &spelled}) {
    OutputParser p(*v.tok, weather_tools());
    ParseRun r;
    for (TokenId t : *ids) collect(r, p.push(t));
    collect(r, p.push(2));  // <|im_end|>: end of generation
    EXPECT_TRUE(p.finished());
    r.result = p.result();
    expect_consistent(r);
    EXPECT_EQ(r.result.reasoning, "why");
    EXPECT_EQ(r.result.content, "ok");
    ASSERT_EQ(r.result.tool_calls.size(), 1u);
    EXPECT_EQ(r.result.tool_calls[0].arguments, R"({"city":"Lima"})");
  }
}

TEST(OutputParser, OtherControlTokensAreDropped) {
  const TagVocab& v = vocab();
  OutputParser p(*v.tok, json::array(), OutputParserOptions{false, "c"});
  for (TokenId t : v.encode("a<|im_start|>b")) p.push(t);
  p.push(1);  // </s>
  EXPECT_EQ(p.result().content, "ab");
  OutputParser q(*v.tok, json::array());
  EXPECT_THROW(q.push(-1), std::out_of_range);
  EXPECT_THROW(q.push(TokenId(v.tok->n_vocab())), std::out_of_range);
}

TEST(OutputParser, NoTagEverLeaksIntoContent) {
  // Random mixes of tags, partial tags and text: the content never holds a complete tag
  // the parser handles, whatever the split.
  const std::vector<std::string> parts = {"<tool_call>", "</tool_call>", "<think>", "</think>", "<function=noop>",
                                          "</function>", "<parameter=city>", "</parameter>", "<tool", "</th",
                                          "\n", " ", "x", "<", ">", "{\"a\":1}", "\xC3", "\xA9"};
  uint64_t state = 12345;
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    for (int i = 0; i < 12; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += parts[(state >> 33) % parts.size()];
    }
    for (bool reasoning : {true, false}) {
      const ParseRun r = run_chunks({text}, weather_tools(), reasoning);
      expect_consistent(r);
      for (const char* tag : {"<tool_call>", "<think>", "</think>"}) {
        EXPECT_EQ(r.result.content.find(tag), std::string::npos) << text;
        EXPECT_EQ(r.result.reasoning.find(tag), std::string::npos) << text;
      }
      std::vector<std::string> bytes;
      for (char c : text) bytes.emplace_back(1, c);
      const ParseRun s = run_chunks(bytes, weather_tools(), reasoning);
      expect_consistent(s);
      EXPECT_EQ(s.result.content, r.result.content) << text;
      EXPECT_EQ(s.result.reasoning, r.result.reasoning) << text;
      ASSERT_EQ(s.result.tool_calls.size(), r.result.tool_calls.size()) << text;
    }
  }
}

TEST(OutputParser, DeeplyNestedValueIsKeptAsString) {
  const std::string deep(5000, '[');
  const std::string text =
      "</think>\n<tool_call>\n<function=get_weather>\n<parameter=tags>\n" + deep + "\n</parameter>\n</function>\n</tool_call>";
  const ParseRun r = run_chunks({text}, weather_tools());
  ASSERT_EQ(r.result.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(r.result.tool_calls[0].arguments)["tags"], deep);
}

// ---- stop strings ----

TEST(StopStrings, PartialSuffix) {
  EXPECT_EQ(partial_marker_suffix("abc<to", {"<tool_call>"}), 3u);
  EXPECT_EQ(partial_marker_suffix("abc", {"<tool_call>"}), 0u);
  EXPECT_EQ(partial_marker_suffix("ab", {"abc", "b"}), 2u);
  EXPECT_EQ(partial_marker_suffix("x<tool_call>", {"<tool_call>"}), 0u);  // full: not partial
  EXPECT_EQ(partial_marker_suffix("x", {""}), 0u);
  const MarkerMatch m = find_first_marker("xxabcd", {"bcd", "abc", "ab"});
  EXPECT_EQ(m.pos, 2u);
  EXPECT_EQ(m.marker, 1u);  // longest of those starting at 2
}

TEST(StopStrings, MatchAcrossChunks) {
  StopStringMatcher m({"STOP", "\n\n"});
  EXPECT_EQ(m.push("hello ST"), "hello ");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("OR"), "STOR");  // no longer a prefix of STOP
  EXPECT_EQ(m.push("Y S"), "Y ");
  EXPECT_EQ(m.push("TOP and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(m.push("x"), "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopStrings, FinishReleasesHeldText) {
  StopStringMatcher m({"</end>"});
  EXPECT_EQ(m.push("a</en"), "a");
  EXPECT_EQ(m.finish(), "</en");
  EXPECT_FALSE(m.stopped());
  StopStringMatcher none({""});
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.push("abc"), "abc");
}

TEST(StopStrings, EverySplitGivesTheSameText) {
  const std::string text = "one two\n\nthree";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    StopStringMatcher m({"\n\n", "xyz"});
    std::string got = m.push(text.substr(0, cut));
    got += m.push(text.substr(cut));
    got += m.finish();
    EXPECT_EQ(got, "one two") << cut;
    EXPECT_EQ(m.matched(), "\n\n");
  }
}

}  // namespace
}  // namespace step35
