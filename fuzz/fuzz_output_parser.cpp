// libFuzzer entry point: arbitrary model output through the server's OutputParser (the
// tool-call and reasoning parser). Built with -DSTEP35_FUZZ=ON; run by fuzz/run.sh.
//
// Input: byte 0 = options (bit 0 in_reasoning, bit 1 tools declared, bits 2-7 chunk size
// seed), the rest = generated text. Checks, besides "no crash, no hang, no exception":
// the same text fed whole, in chunks and as tokens (tags as special tokens) gives the same
// result; the streamed deltas concatenate to the result; every call's arguments are a
// JSON object; no tag the parser handles ever appears in reasoning or content.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "chat/output_parser.h"
#include "tokenizer/tokenizer.h"

using nlohmann::json;
using step35::Tokenizer;
using step35::OutputDelta;
using step35::OutputParser;
using step35::OutputParserOptions;
using step35::ParsedOutput;

namespace {

// Byte tokens plus the chat tags as single special tokens.
std::unique_ptr<Tokenizer> make_tokenizer() {
  std::vector<std::string> tokens = {"<s>", "</s>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(step35::byte_level_text(uint8_t(b)));
    types.push_back(1);
  }
  for (const char* tag : {"<think>", "</think>"}) {
    tokens.emplace_back(tag);
    types.push_back(4);
  }
  for (const char* tag : {"<tool_call>", "</tool_call>", "<|im_start|>"}) {
    tokens.emplace_back(tag);
    types.push_back(3);
  }
  step35::gguf::Writer w;
  w.set_str("tokenizer.ggml.model", "gpt2");
  w.set_str("tokenizer.ggml.pre", "deepseek-v3");
  w.set_arr_str("tokenizer.ggml.tokens", tokens);
  w.set_arr_i32("tokenizer.ggml.token_type", types);
  w.set_arr_str("tokenizer.ggml.merges", {});
  w.set_u32("tokenizer.ggml.bos_token_id", 0);
  w.set_u32("tokenizer.ggml.eos_token_id", 1);
  const std::vector<uint8_t> bytes = w.to_bytes();
  auto f = step35::gguf::File::parse_buffer(bytes.data(), bytes.size(), "fuzz.gguf");
  return Tokenizer::from_gguf(*f);
}

const json& tools() {
  static const json t = json::parse(R"([
    {"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
      "s":{"type":"string"},"i":{"type":"integer"},"o":{"type":"object"},"e":{"enum":["a","b"]}}}}},
    {"type":"function","function":{"name":"g","parameters":{"type":"object"}}}])");
  return t;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "check failed: %s\n", what);
    std::abort();
  }
}

struct Collected {
  std::string reasoning, content;
  std::vector<std::string> names, arguments;
};

void collect(Collected& c, const std::vector<OutputDelta>& deltas) {
  for (const OutputDelta& d : deltas) {
    switch (d.kind) {
      case OutputDelta::Kind::Reasoning: c.reasoning += d.text; break;
      case OutputDelta::Kind::Content: c.content += d.text; break;
      case OutputDelta::Kind::ToolCallStart:
        check(size_t(d.tool_index) == c.names.size(), "call indexes count from 0");
        c.names.push_back(d.tool_name);
        c.arguments.emplace_back();
        break;
      case OutputDelta::Kind::ToolCallArguments:
        check(d.tool_index >= 0 && size_t(d.tool_index) < c.arguments.size(), "fragment of a started call");
        c.arguments[size_t(d.tool_index)] += d.text;
        break;
    }
  }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// Dropping a stray think tag joins the text around it: "<tool_</think>call>" shows as
// "<tool_call>" (one newline after the tag goes too; by design: the parser never re-reads text it has released). The tag
// checks below apply only to inputs where that cannot happen.
bool removal_forms_tags(const std::string& text) {
  std::string stripped;
  for (size_t pos = 0; pos < text.size();) {
    if (text.compare(pos, 7, "<think>") == 0 || text.compare(pos, 8, "</think>") == 0) {
      pos += text[pos + 1] == '/' ? 8 : 7;
      if (pos < text.size() && text[pos] == '\n') ++pos;  // dropped with the tag
    } else {
      stripped += text[pos++];
    }
  }
  return count(stripped, "<think>") + count(stripped, "</think>") > 0 ||
         count(stripped, "<tool_call>") != count(text, "<tool_call>");
}

void check_result(const Collected& c, const ParsedOutput& r, bool tools_on, bool tags_checked) {
  check(c.reasoning == r.reasoning, "reasoning deltas add up");
  check(c.content == r.content, "content deltas add up");
  check(c.names.size() == r.tool_calls.size(), "one start per call");
  for (size_t i = 0; i < c.names.size(); ++i) {
    check(c.names[i] == r.tool_calls[i].name, "names match");
    check(c.arguments[i] == r.tool_calls[i].arguments, "argument fragments add up");
    const json a = json::parse(r.tool_calls[i].arguments, nullptr, false);
    check(!a.is_discarded() && a.is_object(), "arguments are a JSON object");
  }
  if (!tags_checked) return;
  for (const char* tag : {"<think>", "</think>"}) {
    check(r.content.find(tag) == std::string::npos, "no think tag in content");
    check(r.reasoning.find(tag) == std::string::npos, "no think tag in reasoning");
  }
  if (tools_on) check(r.content.find("<tool_call>") == std::string::npos, "no call tag in content");
}

bool same(const ParsedOutput& a, const ParsedOutput& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.truncated != b.truncated) return false;
  if (a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> tok = make_tokenizer();
  if (size < 1) return 0;
  const uint8_t opts = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  OutputParserOptions o;
  o.in_reasoning = (opts & 1) != 0;
  const bool tools_on = (opts & 2) != 0;
  const json declared = tools_on ? tools() : json::array();
  const bool tags_checked = !removal_forms_tags(text);

  // Whole.
  OutputParser whole(*tok, declared, o);
  Collected cw;
  collect(cw, whole.push_text(text));
  collect(cw, whole.finish());
  check_result(cw, whole.result(), tools_on, tags_checked);

  // Chunks of varying size.
  OutputParser chunked(*tok, declared, o);
  Collected cc;
  uint32_t seed = opts >> 2;
  for (size_t pos = 0; pos < text.size();) {
    seed = seed * 1103515245u + 12345u;
    const size_t n = 1 + (seed >> 16) % 7;
    collect(cc, chunked.push_text(std::string_view(text).substr(pos, n)));
    pos += n;
  }
  collect(cc, chunked.finish());
  check_result(cc, chunked.result(), tools_on, tags_checked);
  check(same(whole.result(), chunked.result()), "chunked == whole");

  // Tokens: tags as single special tokens. Other control tokens (<s>, <|im_start|>) are
  // dropped and </s>, <|im_end|> end the output, so compare only inputs without them.
  if (text.find("<|im_") == std::string::npos && text.find("<s>") == std::string::npos &&
      text.find("</s>") == std::string::npos) {
    OutputParser tokens(*tok, declared, o);
    Collected ct;
    for (step35::TokenId id : tok->encode(text, false, true)) collect(ct, tokens.push(id));
    collect(ct, tokens.finish());
    check_result(ct, tokens.result(), tools_on, tags_checked);
    check(same(whole.result(), tokens.result()), "tokens == whole");
  }
  return 0;
}
