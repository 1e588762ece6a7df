// The byte-level grammar engine: UTF-8 character sets, the regex subset (checked against
// std::regex), matcher bounds, the token-trie walk (checked against feeding every token)
// and the mask() cost on a 128k-token synthetic vocabulary.
#include <gtest/gtest.h>

// GCC 12 reports a false -Wmaybe-uninitialized inside libstdc++'s <regex> (the reference
// matcher below) when optimising with the sanitizers on.
#if defined(__GNUC__) && !defined(__clang__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <regex>
#include <set>
#include <ctime>

#include "structured/gbnf.h"
#include "structured/grammar.h"
#include "structured/grammar_constraint.h"
#include "structured/json_schema.h"
#include "structured/regex_grammar.h"
#include "chat/tool_calls.h"

using namespace step35::grammar;

namespace {

// Thread CPU time in ms: the test machines are shared, so wall time would measure the
// neighbours as much as this code.
double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

std::shared_ptr<const Grammar> char_set_grammar(const CpSet& set, TextMode mode) {
  Builder b;
  const uint32_t r = b.add_rule("set");
  b.set_entry(r, emit_char_set(b, set, mode, b.ret()));
  return b.finish(r);
}

bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.feed(text) && m.complete();
}

bool in_set(const CpSet& s, uint32_t cp) {
  for (const auto& [lo, hi] : s)
    if (cp >= lo && cp <= hi) return true;
  return false;
}

// Code points worth probing for a set: every range end +-2, the UTF-8 length
// boundaries, the surrogate edges, plus random ones.
std::vector<uint32_t> probe_points(const CpSet& s, std::mt19937& rng) {
  std::vector<uint32_t> p = {0, 1, 0x7E, 0x7F, 0x80, 0x81, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000,
                             0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF};
  for (const auto& [lo, hi] : s)
    for (int64_t d = -2; d <= 2; ++d) {
      for (int64_t x : {int64_t(lo) + d, int64_t(hi) + d})
        if (x >= 0 && x <= 0x10FFFF && !(x >= 0xD800 && x <= 0xDFFF)) p.push_back(uint32_t(x));
    }
  std::uniform_int_distribution<uint32_t> any(0, 0x10FFFF);
  for (int i = 0; i < 300; ++i) {
    const uint32_t x = any(rng);
    if (!(x >= 0xD800 && x <= 0xDFFF)) p.push_back(x);
  }
  return p;
}

}  // namespace

TEST(Utf8Sets, RawSetsMatchExactlyTheirCodePoints) {
  std::mt19937 rng(7);
  std::vector<CpSet> sets = {
      {{'a', 'z'}},
      {{0x80, 0x7FF}},
      {{0x7F, 0x801}},
      {{0x100, 0x10FFFF}},
      {{0xE9, 0xE9}, {0x4E00, 0x9FA5}, {0x1F600, 0x1F64F}},
      cp_complement({{'"', '"'}, {'\\', '\\'}}),
      {{0xD000, 0xE100}},  // spans the surrogates, which never match
  };
  for (int i = 0; i < 20; ++i) {  // random multi-range sets
    CpSet s;
    std::uniform_int_distribution<uint32_t> any(0, 0x10FFFF), len(0, 5000);
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = any(rng);
      s.push_back({lo, std::min<uint32_t>(0x10FFFF, lo + len(rng))});
    }
    sets.push_back(cp_normalize(s));
  }
  for (const CpSet& s : sets) {
    auto g = char_set_grammar(s, TextMode::Raw);
    for (uint32_t cp : probe_points(s, rng))
      ASSERT_EQ(matches(g, utf8(cp)), in_set(s, cp)) << "code point " << cp;
  }
}

TEST(Utf8Sets, InvalidUtf8NeverMatches) {
  auto g = char_set_grammar(cp_all(), TextMode::Raw);
  for (const char* bad : {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xE0\x9F\xBF", "\xED\xA0\x80", "\xED\xBF\xBF",
                          "\xF0\x80\x80\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\x80", "\xC3", "\xE2\x82"})
    EXPECT_FALSE(matches(g, bad)) << "bytes " << json(std::string(bad)).dump(-1, ' ', false, json::error_handler_t::replace);
  for (const char* good : {"\xC2\x80", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF"})
    EXPECT_TRUE(matches(g, good));
}

TEST(Utf8Sets, JsonModeUsesCanonicalEscapes) {
  const CpSet s = {{0x01, 0x01}, {'\n', '\n'}, {'"', '"'}, {'\\', '\\'}, {'a', 'a'}, {0xE9, 0xE9}};
  auto g = char_set_grammar(s, TextMode::Json);
  for (const char* ok : {"\\u0001", "\\n", "\\\"", "\\\\", "a", "\xC3\xA9"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"\x01", "\n", "\"", "\\", "\\u0022", "\\u000a", "b"}) EXPECT_FALSE(matches(g, bad)) << bad;
  auto all = char_set_grammar(cp_all(), TextMode::Json);  // every control has one canonical escape
  for (const char* ok : {"\\u0000", "\\u000b", "\\u001f", "\\t", "\\b", "\\f", "\\r", "\x7F", "/"})
    EXPECT_TRUE(matches(all, ok)) << ok;
  for (const char* bad : {"\\u001F", "\\u0009", "\\/", "\\u0041", "\x1F"}) EXPECT_FALSE(matches(all, bad)) << bad;
}

TEST(Regex, AgreesWithStdRegexOnAsciiStrings) {
  const std::vector<std::string> patterns = {
      "^abc$",      "abc",           "^a*b+c?$",          "^(ab|cd){2,3}$",     "^[a-c]{1,3}x$",
      "^[^a]b$",    "\\d+",          "^\\w{2}\\s?\\d$",   "^(?:a|b)*c$",        "x{2}",
      "^a{0,2}$",   "^(a|)b$",       "^[\\d-]+$",         "^[a-]$",             "^.{3}$",
      "a|b|^c$",    "^\\.\\*$",      "^[A-Z][a-z]+(?: [A-Z][a-z]+)*$", "^a+?b$", "colou?r",
      "^(a*)*$",    "^[\\w.-]+$",    "^\\D\\S\\W$",       "^(a|b|c){0,}d{1,}$", "^x{3,}$",
      "^[^\\d\\s]+$", "^\\x41\\u0042$", "^a{2}b{0,1}c?$",  "",                   "^$",
  };
  const std::string alphabet = "abcdxyzABCZ0123 .-*_";
  std::mt19937 rng(11);
  std::uniform_int_distribution<size_t> len(0, 8), pick(0, alphabet.size() - 1);
  std::vector<std::string> inputs = {"", "abc", "xabcx", "abab", "abcdcd", "ax", "bcx", "12", "ab 1", "c", "ac",
                                     "aaac", "colour", "color", "xx", "AB", "Foo Bar", "ab", ".*", "a-b_c.d"};
  for (int i = 0; i < 400; ++i) {
    std::string s;
    for (size_t k = len(rng); k > 0; --k) s += alphabet[pick(rng)];
    inputs.push_back(s);
  }
  for (const std::string& p : patterns) {
    auto g = compile_pattern(p);
    const std::regex ref(p, std::regex::ECMAScript);
    for (const std::string& s : inputs)
      ASSERT_EQ(grammar_matches(g, s), std::regex_search(s, ref)) << "pattern '" << p << "' on '" << s << "'";
  }
}

TEST(Regex, NamedGroupsSurrogatePairsAndUnicode) {
  EXPECT_TRUE(grammar_matches(compile_pattern("^(?<year>\\d{4})-\\d{2}$"), "2024-05"));
  EXPECT_TRUE(grammar_matches(compile_pattern("^\\uD83D\\uDE00$"), "\xF0\x9F\x98\x80"));
  EXPECT_TRUE(grammar_matches(compile_pattern("^[\\u4e00-\\u9fa5]+$"), "\xE4\xB8\xAD\xE6\x96\x87"));
  EXPECT_FALSE(grammar_matches(compile_pattern("^[\\u4e00-\\u9fa5]+$"), "abc"));
  EXPECT_TRUE(grammar_matches(compile_pattern("^.$"), "\xC3\xA9"));  // one code point, two bytes
  EXPECT_FALSE(grammar_matches(compile_pattern("^.$"), "\n"));
  EXPECT_FALSE(grammar_matches(compile_pattern("[]"), "a"));  // matches nothing at all
}

TEST(Regex, UnsupportedConstructsAreClearErrors) {
  for (const char* p : {"\\bfoo", "(?=a)", "(?!a)", "(?<=a)b", "(a)\\1", "a{2,1}", "(?i)a", "[z-a]", "a**", "\\p{L}",
                        "^a^b", "a$b", "(ab", "ab)", "\\", "a{100001}", "\\q", "[\\d-z]"}) {
    try {
      (void)parse_regex(p);
      ADD_FAILURE() << "pattern '" << p << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos) << e.what();
    }
  }
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "(";
  EXPECT_THROW(parse_regex(deep), std::invalid_argument);  // not a stack overflow
}

TEST(Formats, AcceptTheFormatAndRejectNearMisses) {
  struct Case {
    const char* format;
    std::vector<std::string> ok, bad;
  };
  const std::vector<Case> cases = {
      {"date", {"2024-02-29", "2023-12-31", "0001-01-01"}, {"2023-02-30", "2023-13-01", "2023-1-01", "2023-04-31", "20230101"}},
      {"time", {"12:30:00Z", "23:59:60+01:00", "00:00:00.123456z"}, {"24:00:00Z", "12:30Z", "12:30:00", "12:60:00Z"}},
      {"date-time", {"2024-05-01T12:30:00Z", "2024-05-01t12:30:00.5-07:30"}, {"2024-05-01 12:30:00Z", "2024-05-01T12:30:00"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"},
       {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
      {"email", {"a.b@example.com", "x_y+z@sub.domain.org"}, {"a@b", "@example.com", "a b@example.com", "a@-x.com"}},
      {"ipv4", {"192.168.0.255", "0.0.0.0", "255.255.255.255"}, {"256.1.1.1", "01.1.1.1", "1.1.1", "1.1.1.1.1"}},
  };
  for (const Case& c : cases) {
    auto g = compile_pattern(format_pattern(c.format));
    for (const std::string& s : c.ok) EXPECT_TRUE(grammar_matches(g, s)) << c.format << " " << s;
    for (const std::string& s : c.bad) EXPECT_FALSE(grammar_matches(g, s)) << c.format << " " << s;
  }
  EXPECT_EQ(format_pattern("uri"), nullptr);  // not enforced
}

TEST(Matcher, LeftRecursionIsRejectedWhenFinished) {
  Builder b;
  const uint32_t a = b.add_rule("A");
  const uint32_t c = b.add_rule("C");
  b.set_entry(c, b.alt({b.call(a, b.byte('x', b.ret())), b.byte('y', b.ret())}));  // C -> A x | y
  b.set_entry(a, b.alt({b.call(c, b.ret()), b.byte('z', b.ret())}));               // A -> C | z
  try {
    (void)b.finish(a);
    FAIL() << "left recursion accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("left recursion"), std::string::npos) << e.what();
  }
}

TEST(Matcher, EmptyLanguageIsRejected) {
  Builder b;
  const uint32_t a = b.add_rule("A");
  b.set_entry(a, b.byte('x', b.call(a, b.ret())));  // A -> x A: never ends
  EXPECT_THROW(b.finish(a), EmptyLanguage);
}

TEST(Matcher, NestingIsBoundedNotUnlimited) {
  // R -> '[' R ']' | 'x'
  Builder b;
  const uint32_t r = b.add_rule("R");
  b.set_entry(r, b.alt({b.byte('[', b.call(r, b.byte(']', b.ret()))), b.byte('x', b.ret())}));
  auto g = b.finish(r);
  EXPECT_TRUE(matches(g, "[[[x]]]"));
  Matcher m(g);
  size_t opened = 0;
  while (opened < 5000 && m.feed("[")) ++opened;
  EXPECT_GT(opened, 100u);
  EXPECT_LT(opened, size_t(kMaxDepth) + 2);
  EXPECT_TRUE(m.feed("x"));
  EXPECT_TRUE(m.feed(std::string(opened, ']')));
  EXPECT_TRUE(m.complete());
}

TEST(Matcher, AmbiguityIsBounded) {
  // 3000 identical alternatives of a loop body: each byte would keep 3000 stacks alive.
  Builder b;
  const uint32_t r = b.add_rule("R");
  const uint32_t loop = b.placeholder();
  std::vector<uint32_t> opts;
  for (int i = 0; i < 3000; ++i) opts.push_back(b.byte('a', loop));
  opts.push_back(b.byte('.', b.ret()));
  b.set_options(loop, opts);
  b.set_entry(r, loop);
  auto g = b.finish(r);
  Matcher m(g);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(m.feed(std::string(200, 'a')));
  EXPECT_TRUE(m.feed("."));
  EXPECT_TRUE(m.complete());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

TEST(Matcher, CompactionKeepsTheState) {
  auto g = compile_json_schema(json::parse(R"({"type":"string","maxLength":3000})"));
  Matcher m(g);
  ASSERT_TRUE(m.feed("\""));
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(m.feed("a"));
  const size_t before = m.n_configs();
  m.compact_if_larger(16);
  EXPECT_LT(m.n_configs(), before);
  EXPECT_EQ(m.min_remaining(), 1u);  // the closing quote
  EXPECT_TRUE(m.feed(std::string(1000, 'b')));
  EXPECT_FALSE(m.feed("c"));  // maxLength reached
  EXPECT_TRUE(m.feed("\""));
  EXPECT_TRUE(m.complete());
  Matcher f = m.fork();
  EXPECT_TRUE(f.complete());
}

// ---------------------------------------------------------------------------------------
// Token tries.

namespace {

// A vocabulary shaped like a byte-level BPE one: all 256 bytes, words with and without a
// leading space, digit groups, punctuation runs, whitespace runs, multi-byte characters,
// JSON-ish pieces, and a few special tokens.
std::shared_ptr<const TokenTrie> synthetic_vocab(size_t n, uint32_t seed, std::vector<std::string>* specials_out = nullptr) {
  std::mt19937 rng(seed);
  std::vector<std::string> pieces;
  std::vector<TokenTrie::Kind> kinds;
  std::set<std::string> seen;
  auto add = [&](const std::string& p, TokenTrie::Kind k = TokenTrie::Kind::Text) {
    if (k == TokenTrie::Kind::Text && !seen.insert(p).second) return;
    pieces.push_back(p);
    kinds.push_back(k);
  };
  add("<|im_end|>", TokenTrie::Kind::Eog);
  add("<|endoftext|>", TokenTrie::Kind::Eog);
  const std::vector<std::string> specials = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>"};
  for (const std::string& s : specials) add(s, TokenTrie::Kind::Special);
  if (specials_out) *specials_out = specials;
  for (int b = 0; b < 256; ++b) add(std::string(1, char(b)));
  const std::string punct = "{}[]\":,.;!?()-_/\\'*#@$%&+=<>|~`^";
  for (char a : punct)
    for (char c : punct) add(std::string{a, c});
  for (int k = 1; k <= 16; ++k) {
    std::string run(size_t(k), ' ');
    add(run);
    run.insert(run.begin(), '\n');
    add(run);
  }
  for (int d = 0; d < 1000; ++d) add(std::to_string(d));
  for (const char* j : {"{\"", "\":", "\": \"", "\",", "\", \"", "\"}", "},", "null", "true", "false", " {", "\\n", "\\\"",
                        "\\u00", "[{", "}]", "]}", "\":\"", "e+", "E-", ".0", "0.", "-1"})
    add(j);
  std::uniform_int_distribution<int> wl(1, 10), letter(0, 25), kind(0, 99), cjk(0x4E00, 0x9FA5), latin(0xC0, 0x24F),
      emoji(0x1F600, 0x1F64F);
  auto u8 = [](uint32_t cp) { return utf8(cp); };
  while (pieces.size() < n) {
    const int k = kind(rng);
    std::string p;
    if (k < 70) {  // words
      if (k < 45) p = " ";
      const int len = wl(rng);
      for (int i = 0; i < len; ++i) p += char('a' + letter(rng));
      if (k % 7 == 0) p[p.size() > 1 ? 1 : 0] = char(std::toupper(p[p.size() > 1 ? 1 : 0]));
    } else if (k < 80) {
      const int len = 1 + wl(rng) / 4;
      for (int i = 0; i < len; ++i) p += u8(uint32_t(cjk(rng)));
    } else if (k < 88) {
      p = u8(uint32_t(latin(rng)));
      for (int i = wl(rng) / 3; i > 0; --i) p += char('a' + letter(rng));
    } else if (k < 90) {
      p = u8(uint32_t(emoji(rng)));
    } else {  // punctuation + letters mixes
      p += punct[size_t(letter(rng)) % punct.size()];
      for (int i = wl(rng) / 2; i > 0; --i) p += char('a' + letter(rng));
    }
    add(p);
  }
  return std::make_shared<TokenTrie>(std::move(pieces), std::move(kinds));
}

// What mask() should allow, by feeding each token from a copy of the state.
std::vector<uint8_t> brute_force_allowed(const GrammarConstraint& c, const TokenTrie& trie) {
  Matcher m = c.matcher();  // a copy
  const int32_t s0 = m.state();
  std::vector<uint8_t> out(trie.n_vocab(), 0);
  const Grammar& g = m.grammar();
  for (size_t t = 0; t < trie.n_vocab(); ++t) {
    const int32_t id = int32_t(t);
    bool ok = false;
    switch (trie.kind(id)) {
      case TokenTrie::Kind::Text:
        ok = m.feed(trie.piece(id));
        break;
      case TokenTrie::Kind::Special:
        for (uint32_t s = 0; s < g.n_symbols(); ++s)
          if (g.symbol_text(s) == trie.piece(id) && m.feed_symbol(s)) ok = true;
        break;
      case TokenTrie::Kind::Eog:
        ok = m.complete();
        break;
      case TokenTrie::Kind::Never:
        break;
    }
    m.set_state(s0);
    out[t] = ok;
  }
  return out;
}

}  // namespace

TEST(TokenTrie, WalkAllowsExactlyTheTokensTheGrammarAccepts) {
  auto trie = synthetic_vocab(6000, 3);
  const std::vector<json> schemas = {
      json::object(),
      json::parse(R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},
                      "n":{"type":"integer","minimum":-50,"maximum":1234},"ok":{"type":"boolean"}},
                      "required":["name","n"],"additionalProperties":false})"),
      json::parse(R"({"type":"array","items":{"enum":["alpha","beta",12,null]},"maxItems":4})"),
      json::parse(R"({"type":"string","pattern":"^[a-z]{2,5}-\\d+$"})"),
  };
  std::mt19937 rng(5);
  for (const json& schema : schemas) {
    for (int run = 0; run < 3; ++run) {
      GrammarConstraint c(compile_json_schema(schema), trie);
      std::vector<uint8_t> allowed;
      for (int step = 0; step < 40; ++step) {
        const size_t n = c.allowed_tokens(allowed);
        allowed.resize(trie->n_vocab());  // drop the spare slot
        ASSERT_EQ(allowed, brute_force_allowed(c, *trie)) << schema.dump() << " step " << step;
        ASSERT_GT(n, 0u);
        std::vector<int32_t> ids;
        for (size_t t = 0; t < allowed.size(); ++t)
          if (allowed[t] && trie->kind(int32_t(t)) != TokenTrie::Kind::Eog) ids.push_back(int32_t(t));
        if (ids.empty()) break;
        c.accept(ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)]);
        ASSERT_FALSE(c.failed());
      }
    }
  }
}

TEST(TokenTrie, SpecialTokensOnlyWhereTheGrammarHasTheirText) {
  std::vector<std::string> specials;
  auto trie = synthetic_vocab(2000, 4, &specials);
  auto id_of = [&](const std::string& piece) {
    for (size_t t = 0; t < trie->n_vocab(); ++t)
      if (trie->piece(int32_t(t)) == piece && trie->kind(int32_t(t)) == TokenTrie::Kind::Special) return int32_t(t);
    return int32_t(-1);
  };
  const int32_t open = id_of("<tool_call>"), close = id_of("</tool_call>"), think = id_of("<think>");
  ASSERT_GE(open, 0);
  auto has_special = [&](const std::string& text) { return id_of(text) >= 0; };
  const json tools = json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"x":{"type":"integer"}},"required":["x"]}}}])");
  GrammarConstraint c(step35::compile_tool_calls(tools, "", has_special), trie);
  std::vector<uint8_t> allowed;
  c.allowed_tokens(allowed);
  EXPECT_TRUE(allowed[size_t(open)]);
  EXPECT_FALSE(allowed[size_t(close)]);
  EXPECT_FALSE(allowed[size_t(think)]);
  c.accept(open);
  ASSERT_FALSE(c.failed());
  for (char ch : std::string("\n<function=f>\n<parameter=x>\n42\n</parameter>\n</function>\n")) {
    c.allowed_tokens(allowed);
    EXPECT_FALSE(allowed[size_t(open)]);
    // find the single-byte token for ch
    int32_t byte_tok = -1;
    for (size_t t = 0; t < trie->n_vocab() && byte_tok < 0; ++t)
      if (trie->kind(int32_t(t)) == TokenTrie::Kind::Text && trie->piece(int32_t(t)) == std::string(1, ch)) byte_tok = int32_t(t);
    ASSERT_TRUE(allowed[size_t(byte_tok)]) << "byte " << int(ch);
    c.accept(byte_tok);
  }
  c.allowed_tokens(allowed);
  EXPECT_TRUE(allowed[size_t(close)]);
  c.accept(close);
  EXPECT_TRUE(c.complete());
}

TEST(TokenTrie, MaskCostOnA128kVocabulary) {
  // Not a timed assertion: prints the cost (thread CPU time) so it can be tracked; the
  // numbers are in docs/structured-output.md.
  auto trie_pieces = synthetic_vocab(128896, 1);
  std::vector<std::string> pieces;
  std::vector<TokenTrie::Kind> kinds;
  for (size_t t = 0; t < trie_pieces->n_vocab(); ++t) {
    pieces.push_back(trie_pieces->piece(int32_t(t)));
    kinds.push_back(trie_pieces->kind(int32_t(t)));
  }
  double t0 = cpu_ms();
  auto trie = std::make_shared<const TokenTrie>(std::move(pieces), std::move(kinds));
  std::printf("[perf] synthetic vocab: %zu tokens, %zu trie nodes, trie built in %.1f ms\n", trie->n_vocab(),
              trie->n_nodes(), cpu_ms() - t0);
  const json person = json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
      "email":{"type":"string","format":"email"},"bio":{"type":"string","maxLength":200},
      "tags":{"type":"array","items":{"type":"string"},"maxItems":5}},
      "required":["name","age","email","bio","tags"],"additionalProperties":false})");
  struct State {
    const char* name;
    json schema;
    std::string prefix;
  };
  const std::vector<State> states = {
      {"object start", person, ""},
      {"after '{'", person, "{"},
      {"in a free string", person, "{\"name\": \"Ada Lovel"},
      {"in a counted string", person, "{\"name\": \"Ada\", \"age\": 36, \"email\": \"ada@x.org\", \"bio\": \"Wrote the first"},
      {"in an integer", person, "{\"name\": \"Ada\", \"age\": 3"},
      {"in an email", person, "{\"name\": \"Ada\", \"age\": 36, \"email\": \"ada@ex"},
      {"any JSON, in a string", json::object(), "{\"a\": [1, {\"b\": \"some te"},
      {"any JSON, after ','", json::object(), "{\"a\": [1, 2,"},
  };
  std::vector<float> logits(trie->n_vocab());
  for (const State& s : states) {
    t0 = cpu_ms();
    GrammarConstraint c(compile_json_schema(s.schema), trie);
    const double compile_ms = cpu_ms() - t0;
    for (char ch : s.prefix) c.accept(int32_t(7 + uint8_t(ch)));  // single-byte tokens: 2 EOG + 5 specials first
    ASSERT_FALSE(c.failed()) << s.name;
    std::fill(logits.begin(), logits.end(), 0.0f);
    t0 = cpu_ms();
    c.mask(logits.data(), logits.size());
    const double first = cpu_ms() - t0;
    const int reps = 20;
    t0 = cpu_ms();
    for (int r = 0; r < reps; ++r) c.mask(logits.data(), logits.size());
    const double repeated = (cpu_ms() - t0) / reps;
    const size_t n_allowed = size_t(std::count_if(logits.begin(), logits.end(), [](float v) { return v == 0.0f; }));
    std::printf("[perf] mask() %-24s first %6.2f ms, repeated %5.2f ms, %6zu tokens allowed (grammar built in %.2f ms)\n",
                s.name, first, repeated, n_allowed, compile_ms);
    EXPECT_GT(n_allowed, 0u);
  }
}

// ---------------------------------------------------------------------------------------
// GBNF (llama.cpp's grammar notation)

namespace {

bool gbnf_matches(const std::string& grammar, const std::string& text) {
  return grammar_matches(compile_gbnf(grammar), text);
}

// The message of the std::invalid_argument `grammar` throws ("" when it compiles).
std::string gbnf_error(const std::string& grammar) {
  try {
    compile_gbnf(grammar);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Gbnf, MatchesTheLanguageOfLlamaCppStyleGrammars) {
  // Arithmetic, written the way llama.cpp's grammars/arithmetic.gbnf is.
  const std::string arith = R"gbnf(root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)gbnf";
  EXPECT_TRUE(gbnf_matches(arith, "1+2=3\n"));
  EXPECT_TRUE(gbnf_matches(arith, "(a_1 *2)=b\nx=y\n"));
  EXPECT_FALSE(gbnf_matches(arith, "1+2=3"));
  EXPECT_FALSE(gbnf_matches(arith, "A=1\n"));
  // Alternatives over lines, comments, escapes, negated classes, any character, counts.
  const std::string g = "# a comment\n"
                        "root ::= greeting \" \" name tail? # trailing comment\n"
                        "greeting ::= \"hi\" |\n  \"hello\" | \"\\u00e9t\\xE9\"\n"
                        "name ::= [^ \\n0-9]{2,4}\n"
                        "tail ::= (\n  \"!\" | \".\"\n)\n";
  EXPECT_TRUE(gbnf_matches(g, "hi bob"));
  EXPECT_TRUE(gbnf_matches(g, "hello Ézra!"));
  EXPECT_TRUE(gbnf_matches(g, "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC\xE2\x82\xAC."));  // code points, not bytes
  EXPECT_FALSE(gbnf_matches(g, "hi b"));        // {2,4}: too short
  EXPECT_FALSE(gbnf_matches(g, "hi bobby"));    // too long
  EXPECT_FALSE(gbnf_matches(g, "hi b0b"));      // a digit is excluded
  EXPECT_FALSE(gbnf_matches(g, "hi bob!?"));  // "bob!" then no tail; "bob!?" too long
  EXPECT_TRUE(gbnf_matches("root ::= . . \"x\"{0} [a]{1,}", "\xF0\x9F\x98\x80" "za"));
  EXPECT_TRUE(gbnf_matches("root ::= \"\"", ""));
}

TEST(Gbnf, ErrorsNameWhereAndWhat) {
  EXPECT_NE(gbnf_error("root = \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a\"\nx ::= \"b").find("line 2"), std::string::npos);
  EXPECT_NE(gbnf_error("a ::= \"x\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= missing").find("undefined rule 'missing'"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= [z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a\"{3000}").find("repetitions"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= * \"a\"").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= <think>").find("token references"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= ( \"a\"").find("expected ')'"), std::string::npos);
  EXPECT_FALSE(gbnf_error("root ::= root \"a\" | \"b\"").empty());  // left recursion
  EXPECT_NE(gbnf_error("root ::= \"a\" \"b\"\n\"c\"").find("line 2"), std::string::npos);  // a rule ends at the newline
}
