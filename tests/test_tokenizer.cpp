// Tokenizer: Unicode tables and UTF-8 handling, the GGUF loader (with synthetic
// vocabularies written by gguf::Writer), BPE merge order, special-token carving, the
// pre-tokenizer split rules on hand-written text, llama.cpp's goldens for the fixture
// vocabularies, byte-exact round trips and streaming UTF-8 assembly.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "support.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace step35;
using namespace step35::testing;
using V = std::vector<std::string>;
using Ids = std::vector<TokenId>;

namespace {

// ---------------------------------------------------------------------------------------
// Helpers

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(char(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string utf8(uint32_t cp) {
  std::string s;
  unicode::append_utf8(s, cp);
  return s;
}

// GPT-2 bytes_to_unicode, written out independently of the implementation.
std::string mapped(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    uint32_t cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      uint32_t k = 0;  // rank of b among the non-printable bytes
      for (uint32_t x = 0; x < b; ++x)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++k;
      cp = 0x100 + k;
    }
    out += utf8(cp);
  }
  return out;
}

std::unique_ptr<Tokenizer> load_fixture(const std::string& model) {
  auto f = gguf::File::open(fixture_model(model));
  return Tokenizer::from_gguf(*f);
}

// A synthetic vocabulary: <s>=0, </s>=1 (control), then the 256 byte tokens (id 2 + byte),
// then whatever a test adds. Every key can be changed or left out.
struct Vocab {
  std::vector<std::string> tokens{"<s>", "</s>"};
  std::vector<int32_t> types{3, 3};
  std::vector<std::string> merges;
  std::optional<std::string> model = "gpt2", pre = "deepseek-v3";
  std::optional<uint32_t> bos = 0, eos = 1, eot, pad;
  std::optional<bool> add_bos = true, add_eos;
  bool write_types = true;

  Vocab() {
    for (int b = 0; b < 256; ++b) add(mapped(std::string(1, char(b))));
  }
  TokenId add(const std::string& text, int32_t type = 1) {
    tokens.push_back(text);
    types.push_back(type);
    return TokenId(tokens.size() - 1);
  }
  TokenId byte(unsigned char b) const { return TokenId(2 + b); }

  std::vector<uint8_t> bytes() const {
    gguf::Writer w;
    if (model) w.set_str("tokenizer.ggml.model", *model);
    if (pre) w.set_str("tokenizer.ggml.pre", *pre);
    w.set_arr_str("tokenizer.ggml.tokens", tokens);
    if (write_types) w.set_arr_i32("tokenizer.ggml.token_type", types);
    w.set_arr_str("tokenizer.ggml.merges", merges);
    if (bos) w.set_u32("tokenizer.ggml.bos_token_id", *bos);
    if (eos) w.set_u32("tokenizer.ggml.eos_token_id", *eos);
    if (eot) w.set_u32("tokenizer.ggml.eot_token_id", *eot);
    if (pad) w.set_u32("tokenizer.ggml.padding_token_id", *pad);
    if (add_bos) w.set_bool("tokenizer.ggml.add_bos_token", *add_bos);
    if (add_eos) w.set_bool("tokenizer.ggml.add_eos_token", *add_eos);
    return w.to_bytes();
  }
  std::unique_ptr<Tokenizer> build() const {
    const std::vector<uint8_t> b = bytes();  // must outlive parsing; the tokenizer copies
    auto f = gguf::File::parse_buffer(b.data(), b.size(), "synthetic.gguf");
    return Tokenizer::from_gguf(*f);
  }
};

// Runs build() and returns the gguf::Error message ("" if none was thrown).
std::string load_error(const Vocab& v) {
  try {
    v.build();
  } catch (const gguf::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------------------
// Unicode

TEST(Unicode, Categories) {
  using C = unicode::Category;
  EXPECT_EQ(unicode::category('A'), C::LETTER);
  EXPECT_EQ(unicode::category(0xE9), C::LETTER);     // é
  EXPECT_EQ(unicode::category(0x4E2D), C::LETTER);   // 中
  EXPECT_EQ(unicode::category(0xD55C), C::LETTER);   // 한
  EXPECT_EQ(unicode::category(0x0301), C::MARK);     // combining acute
  EXPECT_EQ(unicode::category(0x0903), C::MARK);     // Devanagari visarga (Mc)
  EXPECT_EQ(unicode::category('7'), C::NUMBER);
  EXPECT_EQ(unicode::category(0xB2), C::NUMBER);     // ² (No)
  EXPECT_EQ(unicode::category(0x2167), C::NUMBER);   // Ⅷ (Nl)
  EXPECT_EQ(unicode::category(0x0664), C::NUMBER);   // Arabic-Indic four
  EXPECT_EQ(unicode::category('!'), C::PUNCT);
  EXPECT_EQ(unicode::category('_'), C::PUNCT);
  EXPECT_EQ(unicode::category(0x3002), C::PUNCT);    // 。
  EXPECT_EQ(unicode::category(0xFF0C), C::PUNCT);    // ，
  EXPECT_EQ(unicode::category('$'), C::SYMBOL);
  EXPECT_EQ(unicode::category('~'), C::SYMBOL);
  EXPECT_EQ(unicode::category(0xA9), C::SYMBOL);     // ©
  EXPECT_EQ(unicode::category(0x1F600), C::SYMBOL);  // 😀
  EXPECT_EQ(unicode::category(' '), C::SEPARATOR);
  EXPECT_EQ(unicode::category(0x3000), C::SEPARATOR);
  EXPECT_EQ(unicode::category(0x2029), C::SEPARATOR);
  EXPECT_EQ(unicode::category(0), C::OTHER);
  EXPECT_EQ(unicode::category('\n'), C::OTHER);
  EXPECT_EQ(unicode::category(0x200B), C::OTHER);    // zero width space (Cf)
  EXPECT_EQ(unicode::category(0xD800), C::OTHER);    // surrogate
  EXPECT_EQ(unicode::category(0xE000), C::OTHER);    // private use
  EXPECT_EQ(unicode::category(0x0378), C::OTHER);    // unassigned
  EXPECT_EQ(unicode::category(0x10FFFF), C::OTHER);
  EXPECT_EQ(unicode::category(0x110000), C::OTHER);
  EXPECT_EQ(unicode::category(0xFFFFFFFFu), C::OTHER);
  EXPECT_STRNE(unicode::table_version(), "");
}

TEST(Unicode, WhitespaceSetIsExactlyRegexBackslashS) {
  std::vector<uint32_t> expect = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029,
                                  0x202F, 0x205F, 0x3000};
  for (uint32_t c = 0x2000; c <= 0x200A; ++c) expect.push_back(c);
  std::vector<uint32_t> got;
  for (uint32_t c = 0; c < 0x110000; ++c)
    if (unicode::is_whitespace(c)) got.push_back(c);
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(got, expect);
}

TEST(Unicode, DecodeIsStrictAndNeverFails) {
  using S = unicode::Utf8Status;
  auto dec = [](const std::string& s) { return unicode::decode_utf8(s, 0); };
  EXPECT_EQ(dec("a").cp, uint32_t('a'));
  EXPECT_EQ(dec("\xC3\xA9").cp, 0xE9u);
  EXPECT_EQ(dec("\xC3\xA9").len, 2u);
  EXPECT_EQ(dec("\xE4\xB8\xAD").cp, 0x4E2Du);
  EXPECT_EQ(dec("\xF0\x9F\x98\x80").cp, 0x1F600u);
  EXPECT_EQ(dec("\xF4\x8F\xBF\xBF").cp, 0x10FFFFu);
  EXPECT_EQ(dec(std::string(1, '\0')).status, S::VALID);
  // Invalid: each reports one byte.
  for (const std::string s : {"\x80", "\xBF", "\xC0\xAF", "\xC1\xBF", "\xE0\x80\xAF", "\xED\xA0\x80",
                              "\xED\xBF\xBF", "\xF0\x80\x80\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80",
                              "\xFF", "\xC3(", "\xE4\xB8("}) {
    const auto c = dec(s);
    EXPECT_EQ(c.status, S::INVALID) << s.size();
    EXPECT_EQ(c.len, 1u);
    EXPECT_EQ(c.cp, uint32_t(static_cast<unsigned char>(s[0])));
  }
  // Truncated: a well-formed prefix that hits the end.
  for (const std::string s : {"\xC3", "\xE4\xB8", "\xF0\x9F\x98", "\xE0\xA0"}) EXPECT_EQ(dec(s).status, S::TRUNCATED);
  EXPECT_EQ(dec("\xE0\x80").status, S::INVALID);  // can never complete
}

TEST(Unicode, EncodeDecodeEveryScalarValue) {
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string s = utf8(cp);
    const auto c = unicode::decode_utf8(s, 0);
    ASSERT_EQ(c.status, unicode::Utf8Status::VALID) << cp;
    ASSERT_EQ(c.cp, cp);
    ASSERT_EQ(c.len, s.size());
  }
  EXPECT_EQ(utf8(0xD800), "\xEF\xBF\xBD");  // not encodable: U+FFFD
  EXPECT_EQ(utf8(0x110000), "\xEF\xBF\xBD");
  EXPECT_TRUE(unicode::is_valid_utf8("a\xC3\xA9\xF0\x9F\x98\x80"));
  EXPECT_FALSE(unicode::is_valid_utf8("a\xED\xA0\x80"));
}

// ---------------------------------------------------------------------------------------
// Loader

TEST(TokenizerLoad, FixtureVocabulary) {
  auto tok = load_fixture("tiny-a-f32.gguf");
  EXPECT_EQ(tok->n_vocab(), 513u);
  EXPECT_EQ(tok->n_merges(), 250u);
  EXPECT_EQ(tok->pre_type(), "deepseek-v3");
  EXPECT_EQ(tok->bos(), 0);
  EXPECT_EQ(tok->eos(), 1);
  EXPECT_EQ(tok->eot(), 510);
  EXPECT_EQ(tok->pad(), 2);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  EXPECT_EQ(tok->find_token("<|im_start|>"), 509);
  EXPECT_EQ(tok->find_token("<|im_end|>"), 510);
  EXPECT_EQ(tok->find_token("<think>"), 511);
  EXPECT_EQ(tok->find_token("no such token"), -1);
  EXPECT_EQ(tok->token_type(509), TokenType::CONTROL);
  EXPECT_EQ(tok->token_type(511), TokenType::USER_DEFINED);
  EXPECT_EQ(tok->eog_ids(), (Ids{1, 510}));
  EXPECT_TRUE(tok->is_eog(1));
  EXPECT_TRUE(tok->is_eog(510));
  EXPECT_FALSE(tok->is_eog(0));
  EXPECT_FALSE(tok->is_eog(509));
  // Byte tokens (id 3 + byte) are the GPT-2 byte-level alphabet.
  for (int b = 0; b < 256; ++b) {
    ASSERT_EQ(tok->token_text(3 + b), mapped(std::string(1, char(b)))) << b;
    ASSERT_EQ(tok->token_to_piece(3 + b), std::string(1, char(b)));
  }
  EXPECT_EQ(tok->token_text(3 + ' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(tok->token_text(3 + '\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(tok->token_text(3 + 0xAD), utf8(0x143));  // the last of the 68 moved bytes
}

TEST(TokenizerLoad, RejectsNonBpeModels) {
  Vocab v;
  v.model = "llama";
  const std::string e = load_error(v);
  EXPECT_TRUE(contains(e, "tokenizer.ggml.model")) << e;
  EXPECT_TRUE(contains(e, "llama")) << e;
  v.model.reset();
  EXPECT_TRUE(contains(load_error(v), "tokenizer.ggml.model")) << load_error(v);
}

TEST(TokenizerLoad, RejectsMalformedKeys) {
  {
    Vocab v;
    v.types.pop_back();
    EXPECT_TRUE(contains(load_error(v), "tokenizer.ggml.token_type")) << load_error(v);
  }
  {
    Vocab v;
    v.merges = {"a b", "nospace"};
    const std::string e = load_error(v);
    EXPECT_TRUE(contains(e, "tokenizer.ggml.merges")) << e;
    EXPECT_TRUE(contains(e, "entry 1")) << e;
  }
  {
    Vocab v;
    v.merges = {" leading"};  // the only space is at position 0
    EXPECT_TRUE(contains(load_error(v), "tokenizer.ggml.merges"));
  }
  for (const char* key : {"bos", "eos", "eot", "pad"}) {
    Vocab v;
    const uint32_t bad = uint32_t(v.tokens.size());
    if (std::string(key) == "bos") v.bos = bad;
    if (std::string(key) == "eos") v.eos = bad;
    if (std::string(key) == "eot") v.eot = bad;
    if (std::string(key) == "pad") v.pad = bad;
    const std::string e = load_error(v);
    EXPECT_TRUE(contains(e, std::string("tokenizer.ggml.") + key) && contains(e, "not a token id")) << e;
  }
  {
    Vocab v;
    v.bos.reset();  // add_bos is true
    EXPECT_TRUE(contains(load_error(v), "tokenizer.ggml.add_bos_token"));
  }
  {
    Vocab v;
    v.tokens = {};
    v.types = {};
    EXPECT_TRUE(contains(load_error(v), "tokenizer.ggml.tokens"));
  }
}

TEST(TokenizerLoad, Defaults) {
  Vocab v;
  v.write_types = false;  // all NORMAL
  v.add_bos.reset();      // deepseek-v3 without the key: BOS on
  auto tok = v.build();
  EXPECT_EQ(tok->token_type(0), TokenType::NORMAL);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->eot(), -1);
  EXPECT_EQ(tok->pad(), -1);
  EXPECT_EQ(tok->eog_ids(), (Ids{1}));

  Vocab g;
  g.pre = "gpt2";
  g.add_bos.reset();
  EXPECT_FALSE(g.build()->add_bos());
}

TEST(TokenizerLoad, PreTokenizerNames) {
  for (const auto& [name, expect] : std::vector<std::pair<std::string, std::string>>{
           {"deepseek-v3", "deepseek-v3"}, {"gpt2", "gpt2"}, {"default", "gpt2"}, {"llama3", "llama3"},
           {"llama-bpe", "llama3"}}) {
    Vocab v;
    v.pre = name;
    ::testing::internal::CaptureStderr();
    auto tok = v.build();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(tok->pre_type(), expect) << name;
    EXPECT_EQ(err, "") << name;
  }
  // Unknown or missing: deepseek-v3, with exactly one warning line.
  for (const std::optional<std::string>& name : {std::optional<std::string>("qwen2"), std::optional<std::string>()}) {
    Vocab v;
    v.pre = name;
    ::testing::internal::CaptureStderr();
    auto tok = v.build();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(tok->pre_type(), "deepseek-v3");
    EXPECT_TRUE(contains(err, "warning") && contains(err, "tokenizer.ggml.pre")) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    if (name) {
      EXPECT_TRUE(contains(err, *name)) << err;
    }
  }
}

TEST(TokenizerLoad, EndOfGenerationSet) {
  Vocab v;
  const TokenId im_end = v.add("<|im_end|>", 1);  // wrongly NORMAL: becomes control
  const TokenId eot_id = v.add("<|eot_id|>", 3);
  const TokenId sentence_end = v.add("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", 3);
  const TokenId endoftext = v.add("<|endoftext|>", 3);
  const TokenId custom = v.add("<stop>", 3);
  const TokenId other = v.add("<|im_start|>", 3);
  v.eot = uint32_t(custom);
  ::testing::internal::CaptureStderr();
  auto tok = v.build();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "<|im_end|>")) << err;
  for (TokenId id : {TokenId(1), im_end, eot_id, sentence_end, endoftext, custom}) EXPECT_TRUE(tok->is_eog(id)) << id;
  EXPECT_FALSE(tok->is_eog(other));
  EXPECT_FALSE(tok->is_eog(0));
  EXPECT_EQ(tok->token_type(im_end), TokenType::CONTROL);
  // As a control token it is no longer produced from plain text.
  EXPECT_NE(tok->encode("<|im_end|>", false, false), (Ids{im_end}));
  EXPECT_EQ(tok->encode("<|im_end|>", false, true), (Ids{im_end}));
}

// ---------------------------------------------------------------------------------------
// BPE and special tokens (synthetic vocabularies: exact expected ids)

TEST(Bpe, MergesByRankThenLeftmost) {
  Vocab v;
  const TokenId bc = v.add("bc"), ab = v.add("ab"), aa = v.add("aa");
  v.merges = {"b c", "a b", "a a"};
  auto tok = v.build();
  EXPECT_EQ(tok->encode("abc", false, false), (Ids{v.byte('a'), bc}));  // "b c" ranks first
  EXPECT_EQ(tok->encode("ab", false, false), (Ids{ab}));
  EXPECT_EQ(tok->encode("aaa", false, false), (Ids{aa, v.byte('a')}));  // tie: leftmost
  EXPECT_EQ(tok->encode("aaaa", false, false), (Ids{aa, aa}));

  Vocab w;
  const TokenId bc2 = w.add("bc"), ab2 = w.add("ab");
  w.merges = {"a b", "b c"};
  EXPECT_EQ(w.build()->encode("abc", false, false), (Ids{ab2, w.byte('c')}));
  (void)bc2;
}

TEST(Bpe, ChainsThroughNonTokensAndFallsBackToBytes) {
  Vocab v;
  const TokenId xyz = v.add("xyz");  // "xy" itself is not a token
  v.merges = {"x y", "xy z"};
  auto tok = v.build();
  EXPECT_EQ(tok->encode("xyz", false, false), (Ids{xyz}));
  EXPECT_EQ(tok->encode("xy", false, false), (Ids{v.byte('x'), v.byte('y')}));
}

TEST(Bpe, MappedBytesAndMultibyteCharacters) {
  Vocab v;
  const std::string e_acute = mapped("\xC3\xA9");  // é as two mapped bytes
  const TokenId e_id = v.add(e_acute);
  const TokenId sp_e = v.add(mapped(" ") + e_acute);
  v.merges = {mapped("\xC3") + " " + mapped("\xA9"), mapped(" ") + " " + e_acute};
  auto tok = v.build();
  EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (Ids{e_id}));
  EXPECT_EQ(tok->encode("a \xC3\xA9", false, false), (Ids{v.byte('a'), sp_e}));
  EXPECT_EQ(tok->decode({sp_e}), " \xC3\xA9");
}

TEST(Bpe, LongPieceIsLogLinear) {
  Vocab v;
  v.add(mapped("  "));
  v.add(mapped("    "));
  v.merges = {mapped(" ") + " " + mapped(" "), mapped("  ") + " " + mapped("  ")};
  auto tok = v.build();
  // "a" + 10000 spaces + "b": pieces "a", 9999 spaces, " b"; the run becomes 2499 x 4
  // spaces, one pair and one single space.
  const std::string s = "a" + std::string(10000, ' ') + "b";
  const Ids ids = tok->encode(s, false, false);
  EXPECT_EQ(ids.size(), 1u + 2501u + 2u);
  EXPECT_EQ(tok->decode(ids), s);
  const std::string big(200000, ' ');
  EXPECT_EQ(tok->decode(tok->encode(big, false, false)), big);
}

TEST(SpecialTokens, CarvingRules) {
  Vocab v;
  const TokenId ctl = v.add("<|c|>", 3);
  const TokenId tag = v.add("<tag>", 4);
  const TokenId tagx = v.add("<tag>x", 4);
  const TokenId unk = v.add("<unk>", 2);
  const TokenId unused = v.add("<unused>", 5);
  auto tok = v.build();
  // USER_DEFINED always; longest first.
  EXPECT_EQ(tok->encode("<tag>x<tag>", false, false), (Ids{tagx, tag}));
  EXPECT_EQ(tok->encode("a<tag>", false, false), (Ids{v.byte('a'), tag}));
  // CONTROL (and UNKNOWN) only with parse_special.
  EXPECT_EQ(tok->encode("<|c|>", false, true), (Ids{ctl}));
  EXPECT_EQ(tok->encode("<unk>", false, true), (Ids{unk}));
  const Ids plain = tok->encode("<|c|>", false, false);
  EXPECT_EQ(plain.size(), 5u);  // bytes: no merges in this vocabulary
  EXPECT_EQ(tok->decode(plain), "<|c|>");
  // UNUSED tokens are never carved.
  EXPECT_EQ(tok->encode("<unused>", false, true).size(), 8u);
  // Adjacent and at both ends; BOS only with add_special.
  EXPECT_EQ(tok->encode("<|c|><|c|>a<|c|>", true, true), (Ids{0, ctl, ctl, v.byte('a'), ctl}));
  EXPECT_EQ(tok->encode("", true, true), (Ids{0}));
  EXPECT_EQ(tok->encode("", false, true), (Ids{}));
  // Text around a carved token is pre-tokenized on its own: " a" keeps its space.
  EXPECT_EQ(tok->encode("x<tag> a", false, false), (Ids{v.byte('x'), tag, v.byte(' '), v.byte('a')}));
  (void)unused;
}

TEST(SpecialTokens, BosAndEosFlags) {
  Vocab v;
  v.add_bos = false;
  v.add_eos = true;
  auto tok = v.build();
  EXPECT_EQ(tok->encode("a", true, false), (Ids{v.byte('a'), 1}));
  EXPECT_EQ(tok->encode("a", false, false), (Ids{v.byte('a')}));
}

TEST(Decode, TokenTypes) {
  Vocab v;
  const TokenId ctl = v.add("<|c|>", 3);
  const TokenId user = v.add("<u>", 4);
  const TokenId unused = v.add("[PAD9]", 5);
  const TokenId normal = v.add(mapped(" hi"));
  const TokenId foreign = v.add("\xE4\xB8\xAD");  // 中: not in the byte alphabet, kept as written
  auto tok = v.build();
  EXPECT_EQ(tok->token_to_piece(ctl, true), "<|c|>");
  EXPECT_EQ(tok->token_to_piece(ctl, false), "");
  EXPECT_EQ(tok->token_to_piece(0, true), "<s>");
  EXPECT_EQ(tok->token_to_piece(user, false), "<u>");
  EXPECT_EQ(tok->token_to_piece(unused, true), "");
  EXPECT_EQ(tok->token_to_piece(normal, false), " hi");
  EXPECT_EQ(tok->token_to_piece(foreign), "\xE4\xB8\xAD");
  EXPECT_EQ(tok->decode({0, ctl, normal, user}, true), "<s><|c|> hi<u>");
  EXPECT_EQ(tok->decode({0, ctl, normal, user}, false), " hi<u>");
  EXPECT_THROW(tok->token_to_piece(-1), std::out_of_range);
  EXPECT_THROW(tok->token_to_piece(TokenId(tok->n_vocab())), std::out_of_range);
}

// ---------------------------------------------------------------------------------------
// Pre-tokenizer split rules

class DeepseekV3Split : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tok_ = load_fixture("tiny-a-f32.gguf").release(); }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static V split(const std::string& s) { return tok_->pre_tokenize(s); }
  static Tokenizer* tok_;
};
Tokenizer* DeepseekV3Split::tok_ = nullptr;

TEST_F(DeepseekV3Split, Digits) {
  EXPECT_EQ(split("12345"), (V{"123", "45"}));
  EXPECT_EQ(split("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(split("123456"), (V{"123", "456"}));
  EXPECT_EQ(split("abc 2024!"), (V{"abc", " ", "202", "4", "!"}));
  EXPECT_EQ(split("3.14159"), (V{"3", ".", "141", "59"}));
  EXPECT_EQ(split("-42"), (V{"-", "42"}));
  EXPECT_EQ(split("$100"), (V{"$", "100"}));
  EXPECT_EQ(split("x\xC2\xB2"), (V{"x", "\xC2\xB2"}));  // ² is a number
  EXPECT_EQ(split("\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4"), (V{"\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4"}));  // ١٢٣٤
  EXPECT_EQ(split("1e10"), (V{"1", "e", "10"}));
}

TEST_F(DeepseekV3Split, ContractionsAreNotSpecial) {
  // No contraction alternative: "'t" is ASCII punctuation + letters (rule 3a).
  EXPECT_EQ(split("don't"), (V{"don", "'t"}));
  EXPECT_EQ(split("I'm you'll he'd"), (V{"I", "'m", " you", "'ll", " he", "'d"}));
  EXPECT_EQ(split("'s"), (V{"'s"}));
  EXPECT_EQ(split("O'Neil's"), (V{"O", "'Neil", "'s"}));
}

TEST_F(DeepseekV3Split, CjkRuns) {
  EXPECT_EQ(split("中文测试"), (V{"中文测试"}));
  EXPECT_EQ(split("abc中文def"), (V{"abc", "中文", "def"}));
  EXPECT_EQ(split("中文测试，日本語のテスト。"), (V{"中文测试", "，", "日本語のテスト", "。"}));
  EXPECT_EQ(split("Hello世界 and 世界!"), (V{"Hello", "世界", " and", " ", "世界", "!"}));
  EXPECT_EQ(split("カタカナとひらがな"), (V{"カタカナとひらがな"}));
  // Outside the three ranges: Hangul and CJK extension A are ordinary letters.
  EXPECT_EQ(split(" 한국어"), (V{" 한국어"}));
  EXPECT_EQ(split("\xE3\x90\x80中"), (V{"\xE3\x90\x80", "中"}));  // U+3400 then U+4E2D
  EXPECT_EQ(split("龥龦"), (V{"龥", "龦"}));  // U+9FA5 is the last of the range
}

TEST_F(DeepseekV3Split, LettersMarksPunctuation) {
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("Hello, World! 123 foo\n\nbar"),
            (V{"Hello", ",", " World", "!", " ", "123", " foo", "\n\n", "bar"}));
  EXPECT_EQ(split("...hello"), (V{"...", "hello"}));
  EXPECT_EQ(split("(parens) [x]"), (V{"(parens", ")", " [", "x", "]"}));
  EXPECT_EQ(split("a-b_c/d"), (V{"a", "-b", "_c", "/d"}));
  EXPECT_EQ(split("end.\n"), (V{"end", ".\n"}));
  EXPECT_EQ(split("!!\r\n\r\nx"), (V{"!!\r\n\r\n", "x"}));
  EXPECT_EQ(split("caf\xC3\xA9 na\xC3\xAFve"), (V{"caf\xC3\xA9", " na\xC3\xAFve"}));
  EXPECT_EQ(split("cafe\xCC\x81 x"), (V{"cafe\xCC\x81", " x"}));       // e + combining acute
  EXPECT_EQ(split(" \xCC\x81" "abc"), (V{" \xCC\x81" "abc"}));           // a mark starts a run
  EXPECT_EQ(split("\xCC\x81\xCC\x81"), (V{"\xCC\x81\xCC\x81"}));
  EXPECT_EQ(split("emoji \xF0\x9F\x98\x80\xF0\x9F\x9A\x80 ok"), (V{"emoji", " \xF0\x9F\x98\x80\xF0\x9F\x9A\x80", " ok"}));
  EXPECT_EQ(split("\xF0\x9F\x98\x80x"), (V{"\xF0\x9F\x98\x80", "x"}));
  EXPECT_EQ(split("\xC2\xA9\xC2\xAE\xE2\x84\xA2 \xE2\x86\x92 \xE2\x88\x9E"),
            (V{"\xC2\xA9\xC2\xAE\xE2\x84\xA2", " \xE2\x86\x92", " \xE2\x88\x9E"}));
  // '~' is a Unicode symbol (Sm): "~/" is one punctuation/symbol run.
  EXPECT_EQ(split("~/path ~tilde"), (V{"~/", "path", " ~", "tilde"}));
  // A non-letter, non-punctuation char (here NBSP, a control char, an invalid byte) may
  // lead a letter run.
  EXPECT_EQ(split("a\xC2\xA0" "b"), (V{"a", "\xC2\xA0" "b"}));
  EXPECT_EQ(split("\x01" "abc"), (V{"\x01" "abc"}));
  EXPECT_EQ(split("a\xFF" "b"), (V{"a", "\xFF" "b"}));
}

TEST_F(DeepseekV3Split, Whitespace) {
  EXPECT_EQ(split("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split("a   "), (V{"a", "   "}));
  EXPECT_EQ(split("   "), (V{"   "}));
  EXPECT_EQ(split(" a"), (V{" a"}));
  EXPECT_EQ(split("a \n"), (V{"a", " \n"}));
  EXPECT_EQ(split("a\n\nb"), (V{"a", "\n\n", "b"}));
  EXPECT_EQ(split("a\r\nb"), (V{"a", "\r\n", "b"}));
  EXPECT_EQ(split("a \r\n b"), (V{"a", " \r\n", " b"}));
  EXPECT_EQ(split("a\n  \n   b"), (V{"a", "\n  \n", "  ", " b"}));
  EXPECT_EQ(split("x\ty"), (V{"x", "\ty"}));
  EXPECT_EQ(split("x\t\ty"), (V{"x", "\t", "\ty"}));
  EXPECT_EQ(split("def f():\n    return 1\n"),
            (V{"def", " f", "():\n", "   ", " return", " ", "1", "\n"}));
  EXPECT_EQ(split("a \xE3\x80\x80" "b"), (V{"a", " ", "\xE3\x80\x80" "b"}));  // ideographic space
  EXPECT_EQ(split("!  "), (V{"!", "  "}));
  EXPECT_EQ(split(" !"), (V{" !"}));
  EXPECT_EQ(split("  !"), (V{" ", " !"}));
}

TEST(OtherSplitRules, Gpt2) {
  Vocab v;
  v.pre = "gpt2";
  auto tok = v.build();
  EXPECT_EQ(tok->pre_tokenize("Hello world's 123  x!!"), (V{"Hello", " world", "'s", " 123", " ", " x", "!!"}));
  EXPECT_EQ(tok->pre_tokenize("I'M"), (V{"I", "'", "M"}));  // contractions are lower-case only
  EXPECT_EQ(tok->pre_tokenize("they're we've"), (V{"they", "'re", " we", "'ve"}));
  EXPECT_EQ(tok->pre_tokenize("a\n\nb  "), (V{"a", "\n", "\n", "b", "  "}));
  EXPECT_EQ(tok->pre_tokenize("12345"), (V{"12345"}));
  EXPECT_EQ(tok->pre_tokenize("caf\xC3\xA9\xCC\x81"), (V{"caf\xC3\xA9", "\xCC\x81"}));  // marks are not \p{L}
}

TEST(OtherSplitRules, Llama3) {
  Vocab v;
  v.pre = "llama3";
  auto tok = v.build();
  EXPECT_EQ(tok->pre_tokenize("I'M abc12345"), (V{"I", "'M", " abc", "123", "45"}));
  EXPECT_EQ(tok->pre_tokenize("a\n\n b"), (V{"a", "\n\n", " b"}));
  EXPECT_EQ(tok->pre_tokenize("(hello) !!\n"), (V{"(hello", ")", " !!\n"}));
  EXPECT_EQ(tok->pre_tokenize("a   b"), (V{"a", "  ", " b"}));
}

// ---------------------------------------------------------------------------------------
// llama.cpp goldens

void check_tokenizer_goldens(const std::string& set, const std::string& model) {
  auto tok = load_fixture(model);
  const auto g = read_json(golden_path(set + ".tokenizer.json"));
  ASSERT_EQ(g.size(), 21u);
  size_t ok_ids = 0, ok_special = 0, ok_detok = 0, ok_detok_special = 0;
  for (const auto& e : g) {
    const std::string text = unhex(e["text_hex"].get<std::string>());
    ASSERT_EQ(text, e["text"].get<std::string>());
    const Ids ids = tok->encode(text, true, false);
    const Ids ids_special = tok->encode(text, true, true);
    ok_ids += ids == e["ids"].get<Ids>();
    ok_special += ids_special == e["ids_parse_special"].get<Ids>();
    EXPECT_EQ(ids, e["ids"].get<Ids>()) << set << ": " << text;
    EXPECT_EQ(ids_special, e["ids_parse_special"].get<Ids>()) << set << " (parse_special): " << text;
    const std::string detok = tok->decode(e["ids"].get<Ids>(), true);
    const std::string detok_special = tok->decode(e["ids_parse_special"].get<Ids>(), true);
    ok_detok += detok == unhex(e["detok_hex"].get<std::string>());
    ok_detok_special += detok_special == unhex(e["detok_parse_special_hex"].get<std::string>());
    EXPECT_EQ(detok, unhex(e["detok_hex"].get<std::string>())) << text;
    EXPECT_EQ(detok_special, unhex(e["detok_parse_special_hex"].get<std::string>())) << text;
  }
  std::printf("[golden] %s: ids %zu/21, ids_parse_special %zu/21, detok %zu/21, detok_parse_special %zu/21\n",
              set.c_str(), ok_ids, ok_special, ok_detok, ok_detok_special);
}

TEST(TokenizerGoldens, TinyA) { check_tokenizer_goldens("tiny-a", "tiny-a-f32.gguf"); }
TEST(TokenizerGoldens, TinyB) { check_tokenizer_goldens("tiny-b", "tiny-b-f32.gguf"); }

TEST(TokenizerGoldens, TextPrompts) {
  for (const std::string m : {"tiny-a-f32", "tiny-b-f32"}) {
    auto tok = load_fixture(m + ".gguf");
    const auto g = read_json(golden_path(m + ".text.json"));
    const std::string text = g["text"].get<std::string>();
    EXPECT_EQ(tok->encode(text, true, false), g["prompt_tokens"].get<Ids>()) << m;
    EXPECT_EQ(tok->decode(g["prompt_tokens"].get<Ids>()), tok->token_to_piece(0) + text) << m;
  }
}

// ---------------------------------------------------------------------------------------
// Round trips

std::string random_bytes(std::mt19937& rng, size_t n) {
  // A mix that stresses the decoder: ASCII, valid multi-byte characters, encoded
  // surrogates, overlong forms, stray continuation bytes, NUL bytes and raw random bytes.
  static const char* const kPieces[] = {"a", " ", "\n", "\r\n", "\t", "'s", "1", "!", "\xC3\xA9", "\xCC\x81",
                                        "\xE4\xB8\xAD", "\xE3\x81\x82", "\xF0\x9F\x98\x80", "\xED\xA0\x80",
                                        "\xED\xBF\xBF", "\xC0\xAF", "\xE0\x80\x80", "\x80", "\xF4\x90\x80\x80",
                                        "\xC2\xA0", "<|im_start|>", "<think>", "</think>", "<|im_end|>"};
  std::string s;
  while (s.size() < n) {
    const uint32_t r = rng() % 4;
    if (r == 0) {
      s.push_back(char(rng() % 256));
    } else if (r == 1) {
      s.push_back('\0');
    } else {
      s += kPieces[rng() % (sizeof(kPieces) / sizeof(kPieces[0]))];
    }
  }
  s.resize(n);  // may cut a sequence: fine, that is more invalid input
  return s;
}

TEST(RoundTrip, RandomBytes) {
  auto tok = load_fixture("tiny-a-f32.gguf");
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 400; ++iter) {
    const std::string s = random_bytes(rng, rng() % 300);
    const bool special = iter % 2 == 0;
    const Ids ids = tok->encode(s, false, special);
    ASSERT_EQ(tok->decode(ids, true), s) << iter;
    std::string joined;
    for (const std::string& p : tok->pre_tokenize(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
  for (const std::string& s : {std::string("\xED\xA0\x80\xED\xB0\x80 x", 8), std::string("a\0b\0\0", 5),
                              std::string("\xC0\xAF\xFF\xFE"), std::string(1, '\0'), std::string("\xF0\x9F\x98")}) {
    EXPECT_EQ(tok->decode(tok->encode(s, false, false)), s);
    EXPECT_EQ(tok->decode(tok->encode(s, true, false)), tok->token_to_piece(0) + s);
  }
}

TEST(RoundTrip, HundredKilobytes) {
  auto tok = load_fixture("tiny-b-f32.gguf");
  std::mt19937 rng(99);
  for (int k = 0; k < 3; ++k) {
    const std::string s = random_bytes(rng, 100 * 1024);
    EXPECT_EQ(tok->decode(tok->encode(s, false, k == 1)), s);
  }
  std::string uniform(100 * 1024, '\0');
  for (char& c : uniform) c = char(rng() % 256);
  EXPECT_EQ(tok->decode(tok->encode(uniform, false, false)), uniform);
}

TEST(RoundTrip, OneMegabyteOfTextFinishes) {
  auto tok = load_fixture("tiny-a-f32.gguf");
  std::mt19937 rng(7);
  static const char* const kWords[] = {"the", " quick", " brown", " fox", " 12345", " 3.14", ";", " (x)",
                                       " \xE4\xB8\xAD\xE6\x96\x87", " \xF0\x9F\x98\x80", "\n", "\n\n",
                                       "    ", "\t", " caf\xC3\xA9", " don't", "!!!", "~"};
  std::string text;
  while (text.size() < (1u << 20)) text += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok->encode(text, true, false);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(tok->decode(ids), tok->token_to_piece(0) + text);
  std::printf("[tokenizer] 1 MiB of text: %zu tokens in %.0f ms\n", ids.size(),
              std::chrono::duration<double, std::milli>(t1 - t0).count());
}

// ---------------------------------------------------------------------------------------
// Streaming

TEST(Utf8Stream, EverySplitGivesTheSameBytes) {
  const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80" "b\xFF" "c\xED\xA0\x80" "d\xE0\x80";
  for (size_t i = 0; i <= s.size(); ++i) {
    for (size_t j = i; j <= s.size(); ++j) {
      Utf8Stream st;
      std::string out = st.push(s.substr(0, i));
      out += st.push(s.substr(i, j - i));
      out += st.push(s.substr(j));
      out += st.flush();
      ASSERT_EQ(out, s) << i << " " << j;
    }
  }
}

TEST(Utf8Stream, NeverEmitsPartialSequences) {
  const std::string s = "x\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80y\xE3\x81\x82\xE3\x81\x84";
  // Byte by byte and at every cut point: each chunk of a valid input is valid by itself.
  Utf8Stream st;
  std::string all;
  for (char c : s) {
    const std::string out = st.push(std::string(1, c));
    EXPECT_TRUE(unicode::is_valid_utf8(out));
    all += out;
  }
  EXPECT_EQ(st.flush(), "");
  EXPECT_EQ(all, s);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    Utf8Stream t;
    const std::string a = t.push(s.substr(0, cut));
    const std::string b = t.push(s.substr(cut));
    EXPECT_TRUE(unicode::is_valid_utf8(a)) << cut;
    EXPECT_TRUE(unicode::is_valid_utf8(b)) << cut;
    EXPECT_EQ(a + b, s);
    EXPECT_EQ(t.flush(), "");
  }
}

TEST(Utf8Stream, InvalidBytesPassThrough) {
  Utf8Stream st;
  EXPECT_EQ(st.push("\xFF"), "\xFF");
  EXPECT_EQ(st.push("\xE0\x80"), "\xE0\x80");  // can never complete
  EXPECT_EQ(st.push("\xC3"), "");                // could still complete
  EXPECT_EQ(st.push("("), "\xC3(");              // ... but did not
  EXPECT_EQ(st.push("\xE4\xB8"), "");
  EXPECT_EQ(st.push("\xAD"), "\xE4\xB8\xAD");
  EXPECT_EQ(st.push("\xF0\x9F"), "");
  EXPECT_EQ(st.flush(), "\xF0\x9F");
  EXPECT_EQ(st.flush(), "");
}

TEST(Utf8Stream, WithTokenPieces) {
  // Byte tokens of a 4-byte character decoded one at a time.
  auto tok = load_fixture("tiny-a-f32.gguf");
  const std::string s = "ok \xF0\x9F\x9A\x80 \xE4\xB8\xAD";
  Utf8Stream st;
  std::string out;
  for (TokenId id : tok->encode(s, false, false)) {
    const std::string piece = st.push(tok->token_to_piece(id));
    EXPECT_TRUE(unicode::is_valid_utf8(piece));
    out += piece;
  }
  out += st.flush();
  EXPECT_EQ(out, s);
}

}  // namespace
