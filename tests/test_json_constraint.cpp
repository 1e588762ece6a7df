// Structured output: JSON Schema features compiled to grammars (accept / reject strings),
// schema errors, the validator, token-level generation with a real fixture tokenizer
// (every output must parse and validate, and must be able to finish), Step 3.5 tool
// calls, the reasoning wrapper, clone(), and end-to-end generation with the tiny model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <ctime>
#include <random>
#include <set>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/session.h"
#include "model/step35.h"
#include "structured/grammar_constraint.h"
#include "structured/json_constraint.h"
#include "structured/json_schema.h"
#include "chat/tool_calls.h"
#include "json_schema_check.h"
#include "engine/sampler.h"
#include "exec/thread_pool.h"
#include "support.h"
#include "tokenizer/tokenizer.h"

using namespace step35;
using grammar::GrammarConstraint;
using nlohmann::json;

namespace {

bool accepts(const json& schema, const std::string& text) {
  auto g = grammar::compile_json_schema(schema);
  grammar::Matcher m(g);
  return m.feed(text) && m.complete();
}

// Accepted by the grammar AND by the validator (the grammar must never admit a value the
// validator rejects).
void expect_accepts(const json& schema, const std::string& text) {
  EXPECT_TRUE(accepts(schema, text)) << schema.dump() << "  should accept  " << text;
  const json v = json::parse(text);
  EXPECT_EQ(step35::testing::schema_violation(schema, v), "") << schema.dump() << "  " << text;
}
void expect_rejects(const json& schema, const std::string& text) {
  EXPECT_FALSE(accepts(schema, text)) << schema.dump() << "  should reject  " << text;
}

std::string compile_error(const json& schema) {
  try {
    (void)grammar::compile_json_schema(schema);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

json J(const char* text) { return json::parse(text); }

std::string name(const char* prefix, int i) {  // (GCC 12 warns falsely on "lit" + std::string)
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Schema features (byte level).

TEST(JsonSchemaGrammar, Strings) {
  const json s = J(R"({"type":"string"})");
  for (const char* ok : {R"("abc")", R"("")", R"("a\nb")", R"("\u00e9\/")", "\"\xC3\xA9\xE2\x82\xAC\"", R"("\ud83d\ude00")",
                         R"("\"\\")"})
    expect_accepts(s, ok);
  for (const char* bad : {"abc", "\"a", "\"\n\"", "\"\t\"", R"("\x")", R"("\ud800")", R"("\udc00\ud800")", "\"\xFF\"",
                          "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", R"("a" "b")"})
    expect_rejects(s, bad);
}

TEST(JsonSchemaGrammar, NumbersIntegersBooleansNull) {
  const json i = J(R"({"type":"integer"})");
  for (const char* ok : {"0", "-5", "123456789012345678", "-0"}) expect_accepts(i, ok);
  for (const char* bad : {"01", "1.0", "1e3", "-", "1234567890123456789", "+1", "--1"}) expect_rejects(i, bad);
  const json n = J(R"({"type":"number"})");
  for (const char* ok : {"0", "-0.5", "1e10", "1.25E-7", "3.14", "2e+99"}) expect_accepts(n, ok);
  for (const char* bad : {".5", "1.", "1e", "1e100", "NaN", "01.5", "Infinity"}) expect_rejects(n, bad);
  expect_accepts(J(R"({"type":"boolean"})"), "true");
  expect_accepts(J(R"({"type":"boolean"})"), "false");
  expect_rejects(J(R"({"type":"boolean"})"), "1");
  expect_accepts(J(R"({"type":"null"})"), "null");
  const json multi = J(R"({"type":["string","null"]})");
  expect_accepts(multi, "null");
  expect_accepts(multi, R"("x")");
  expect_rejects(multi, "1");
  expect_accepts(J(R"({"type":"integer","nullable":true})"), "null");
  expect_accepts(J(R"({"type":"integer","nullable":true})"), "7");
}

TEST(JsonSchemaGrammar, WhitespaceIsBounded) {
  const json s = J(R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  for (const char* ok : {R"({"a":1})", " {\"a\": 1} ", "{\n  \"a\": 1\n}", "{\r\n\t\"a\" :  1 }", "\n\n{\"a\":1}\n",
                         "{\"a\":1}  ", "{ \n\n    \"a\":1}"})
    expect_accepts(s, ok);
  expect_rejects(s, "{   \"a\":1}");         // three spaces without a newline
  expect_rejects(s, "{\n\n\n\"a\":1}");     // three newlines
  expect_rejects(s, "{\n \n\"a\":1}");       // spaces between newlines
  expect_rejects(s, "{\n" + std::string(33, ' ') + "\"a\":1}");
  expect_accepts(s, "{\n" + std::string(32, ' ') + "\"a\":1}");
}

TEST(JsonSchemaGrammar, ObjectsPropertiesRequiredAndOrder) {
  // Generated order: the "required" array, then the other properties by key.
  const json s = J(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                       "c":{"type":"boolean"}},"required":["c","a"]})");
  expect_accepts(s, R"({"c":true,"a":1})");
  expect_accepts(s, R"({"c":true,"a":1,"b":"x"})");
  expect_rejects(s, R"({"a":1,"c":true})");
  expect_rejects(s, R"({"c":true})");
  expect_rejects(s, R"({"c":true,"a":1,"z":0})");  // extra properties are not generated
  const json closed = J(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})");
  expect_accepts(closed, "{}");
  expect_rejects(closed, R"({"a":1,"b":2})");
  const json open = J(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
                          "additionalProperties":true})");
  expect_accepts(open, R"({"a":1,"zz":[1,"x"],"ab":null,"":0,"é":1})");
  expect_rejects(open, R"({"a":1,"a":2})");  // an extra key never repeats a declared name
  expect_rejects(open, R"({"zz":1,"b":2})");  // extras come after the declared properties
  // Extra keys share prefixes with declared names, down to the bytes of one character.
  const json utf = J("{\"type\":\"object\",\"properties\":{\"\u00e91\":{\"type\":\"integer\"},\"\u4e2d\":{}},"
                     "\"additionalProperties\":true}");
  expect_accepts(utf, "{\"\xC3\xA9" "1\":1,\"\xC3\xA9" "2\":2,\"\xC3\xA8\":3,\"\xC3\xA9\":4,\"\xE4\xB8\xAE\":5}");
  expect_rejects(utf, "{\"\xC3\xA9" "1\":1,\"\xC3\xA9" "1\":2}");
  expect_rejects(utf, "{\"\xE4\xB8\xAD\":1,\"\xE4\xB8\xAD\":2}");
  expect_rejects(utf, "{\"x\":1,\"\xC3\xA9\x80\":2}");  // invalid UTF-8 in a key
  const json typed = J(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
                           "additionalProperties":{"type":"string","maxLength":3}})");
  expect_accepts(typed, R"({"id":1,"x":"abc","y":""})");
  expect_rejects(typed, R"({"id":1,"x":5})");
  expect_rejects(typed, R"({"id":1,"id":"abc"})");
  const json map = J(R"({"type":"object","additionalProperties":{"type":"number"}})");
  expect_accepts(map, R"({"x":1.5,"y":-2})");
  expect_rejects(map, R"({"x":"1"})");
  expect_accepts(J(R"({"type":"object"})"), R"({"k":[1,{"z":null}],"s":"\u0041"})");
  expect_accepts(J(R"({"required":["x"]})"), R"({"x":"anything"})");
  EXPECT_NE(compile_error(J(R"({"type":"object","required":["x"],"additionalProperties":false})")).find("never be satisfied"),
            std::string::npos);
}

TEST(JsonSchemaGrammar, Arrays) {
  const json s = J(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
  expect_accepts(s, "[1,2]");
  expect_accepts(s, "[ 1, 2, 3 ]");
  for (const char* bad : {"[1]", "[1,2,3,4]", "[]", "[1,\"a\"]", "[1,2,]"}) expect_rejects(s, bad);
  const json tuple = J(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})");
  expect_accepts(tuple, R"(["a",1])");
  expect_accepts(tuple, R"(["a"])");
  expect_rejects(tuple, R"(["a",1,2])");
  expect_rejects(tuple, R"([1,"a"])");
  const json tail = J(R"({"prefixItems":[{"type":"string"}],"items":{"type":"boolean"}})");
  expect_accepts(tail, R"(["a",true,false])");
  expect_rejects(tail, R"(["a",1])");
  const json old = J(R"({"items":[{"type":"null"}],"additionalItems":false,"minItems":1})");
  expect_accepts(old, "[null]");
  expect_rejects(old, "[null,null]");
  const json need_more = J(R"({"prefixItems":[{"type":"integer"}],"minItems":3})");  // extra items: any value
  expect_accepts(need_more, R"([1,"x",{}])");
  expect_rejects(need_more, "[1,2]");
  expect_accepts(J(R"({"type":"array"})"), R"([1,[2,[3]],{"a":[]}])");
}

TEST(JsonSchemaGrammar, EnumConstAnyOfOneOf) {
  const json e = J(R"({"enum":["red","green",1,null,{"k":[1,2]},true]})");
  for (const char* ok : {R"("red")", "1", "null", R"({"k":[1,2]})", "true"}) expect_accepts(e, ok);
  for (const char* bad : {R"("blue")", "2", R"({"k": [1,2]})", "false"}) expect_rejects(e, bad);
  const json typed = J(R"({"type":"string","enum":["a",1]})");
  expect_accepts(typed, R"("a")");
  expect_rejects(typed, "1");
  expect_accepts(J(R"({"const":"fixed"})"), R"("fixed")");
  expect_rejects(J(R"({"const":"fixed"})"), R"("other")");
  const json any = J(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})");
  expect_accepts(any, "5");
  expect_accepts(any, R"("ab")");
  expect_rejects(any, R"("abc")");
  const json one = J(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},
      "required":["kind","x"],"additionalProperties":false},{"type":"object","properties":{"kind":{"const":"b"},
      "y":{"type":"string"}},"required":["kind","y"],"additionalProperties":false}]})");
  expect_accepts(one, R"({"kind":"a","x":1})");
  expect_accepts(one, R"({"kind":"b","y":"z"})");
  expect_rejects(one, R"({"kind":"a","y":"z"})");
  // anyOf next to other keywords: each branch is merged with them.
  const json mixed = J(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
                           "anyOf":[{"required":["a"]},{"required":["b"]}]})");
  expect_accepts(mixed, R"({"a":1})");
  expect_accepts(mixed, R"({"b":2,"a":1})");
  expect_rejects(mixed, "{}");
}

TEST(JsonSchemaGrammar, AllOfMerges) {
  const json s = J(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                       {"properties":{"b":{"type":"string"}},"required":["b"]}]})");
  expect_accepts(s, R"({"a":1,"b":"x"})");
  expect_rejects(s, R"({"a":1})");
  // A property one side does not declare meets that side's additionalProperties.
  const json closed = J(R"({"allOf":[{"properties":{"a":{"type":"integer"}},"additionalProperties":false},
                            {"properties":{"b":{"type":"string"}}}]})");
  expect_accepts(closed, R"({"a":1})");
  expect_rejects(closed, R"({"a":1,"b":"x"})");
  EXPECT_NE(compile_error(J(R"({"allOf":[{"properties":{"a":{}},"additionalProperties":false},{"required":["b"]}]})"))
                .find("never be satisfied"),
            std::string::npos);
  const json bounds = J(R"({"allOf":[{"type":"integer","minimum":0},{"maximum":10},{"type":["integer","string"]}]})");
  expect_accepts(bounds, "5");
  expect_rejects(bounds, "11");
  expect_rejects(bounds, "-1");
  expect_rejects(bounds, R"("5")");
  EXPECT_NE(compile_error(J(R"({"allOf":[{"type":"string","pattern":"a"},{"pattern":"b"}]})")).find("pattern"),
            std::string::npos);
  expect_accepts(J(R"({"allOf":[{"enum":[1,2,3]},{"enum":[2,3,4]}]})"), "2");
  expect_rejects(J(R"({"allOf":[{"enum":[1,2,3]},{"enum":[2,3,4]}]})"), "1");
}

TEST(JsonSchemaGrammar, ReferencesAndRecursion) {
  const json tree = J(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"],
      "additionalProperties":false}},"$ref":"#/$defs/node"})");
  expect_accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})");
  expect_rejects(tree, R"({"v":1,"kids":[{"v":2},{"v":3},{"v":4}]})");
  const json old = J(R"({"definitions":{"s":{"type":"string"}},"type":"array","items":{"$ref":"#/definitions/s"}})");
  expect_accepts(old, R"(["a","b"])");
  const json list = J(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},
                          "required":["next"]})");
  expect_accepts(list, R"({"next":{"next":{"next":null}}})");
  const json with_siblings = J(R"({"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","maxLength":2})");
  expect_accepts(with_siblings, R"("ab")");
  expect_rejects(with_siblings, R"("abc")");
  EXPECT_NE(compile_error(J(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})"))
                .find("left recursion"),
            std::string::npos);
  EXPECT_NE(compile_error(J(R"({"$ref":"#/$defs/missing"})")).find("does not resolve"), std::string::npos);
  EXPECT_NE(compile_error(J(R"({"$ref":"https://example.com/s.json"})")).find("local"), std::string::npos);
  EXPECT_NE(compile_error(J(R"({"$ref":"#","type":"object"})")).find("deeper"), std::string::npos);  // infinite merge
}

TEST(JsonSchemaGrammar, StringLengthsPatternsFormats) {
  const json len = J(R"({"type":"string","minLength":2,"maxLength":3})");
  for (const char* ok : {R"("ab")", "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"", R"("\n\u0041")", R"("\ud83d\ude00x")"})
    expect_accepts(len, ok);
  for (const char* bad : {R"("a")", R"("abcd")", R"("\ud83d\ude00\ud83d\ude00xy")"}) expect_rejects(len, bad);
  const json pat = J(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})");
  expect_accepts(pat, R"("AB-123")");
  expect_rejects(pat, R"("ab-123")");
  expect_rejects(pat, R"("AB-1234")");
  expect_accepts(J(R"({"type":"string","pattern":"abc"})"), R"("xxabcyy")");  // unanchored: search
  expect_accepts(J(R"({"type":"string","pattern":"^a\"b\\\\$"})"), R"("a\"b\\")");  // escaped in JSON
  expect_accepts(J(R"({"type":"string","format":"date"})"), R"("2024-02-29")");
  expect_rejects(J(R"({"type":"string","format":"date"})"), R"("2024-02-30")");
  expect_accepts(J(R"({"type":"string","format":"date-time"})"), R"("2024-05-01T12:30:00Z")");
  expect_accepts(J(R"({"type":"string","format":"uuid"})"), R"("123e4567-e89b-12d3-a456-426614174000")");
  expect_accepts(J(R"({"type":"string","format":"email"})"), R"("a.b@example.com")");
  expect_rejects(J(R"({"type":"string","format":"email"})"), R"("not an email")");
  expect_accepts(J(R"({"type":"string","format":"uri"})"), R"("anything at all")");  // not enforced
  EXPECT_NE(compile_error(J(R"({"type":"string","format":"date","maxLength":5})")).find("format"), std::string::npos);
  EXPECT_NE(compile_error(J(R"j({"type":"string","pattern":"(?=a)"})j")).find("lookaround"), std::string::npos);
}

TEST(JsonSchemaGrammar, IntegerRangesAreExact) {
  struct Case {
    const char* schema;
    int64_t lo, hi;
  };
  for (const Case& c : {Case{R"({"type":"integer","minimum":-123,"maximum":4567})", -123, 4567},
                        Case{R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})", 1, 99},
                        Case{R"({"type":"integer","minimum":5,"exclusiveMinimum":true,"maximum":1009})", 6, 1009},
                        Case{R"({"type":"integer","minimum":-9.5,"maximum":-0.5})", -9, -1},
                        Case{R"({"type":"integer","minimum":0,"maximum":0})", 0, 0}}) {
    auto g = grammar::compile_json_schema(J(c.schema));
    for (int64_t x = -300; x <= 5000; ++x) {
      grammar::Matcher m(g);
      const bool ok = m.feed(std::to_string(x)) && m.complete();
      ASSERT_EQ(ok, x >= c.lo && x <= c.hi) << c.schema << " " << x;
    }
  }
  const json big = J(R"({"type":"integer","minimum":1000000000000})");
  expect_accepts(big, "1000000000000");
  expect_accepts(big, "999999999999999999");
  expect_rejects(big, "999999999999");
  expect_rejects(big, "-5");
  EXPECT_NE(compile_error(J(R"({"type":"integer","minimum":5,"maximum":3})")).find("never be satisfied"), std::string::npos);
}

TEST(JsonSchemaGrammar, NumberBoundsAreSound) {
  const json s = J(R"({"type":"number","minimum":-2.5,"maximum":10})");
  for (const char* ok : {"-2", "10", "9.999", "0.5", "-1.75", "0"}) expect_accepts(s, ok);
  for (const char* bad : {"11", "-3", "10.5", "1e2", "-2.75"}) expect_rejects(s, bad);
  // Every accepted decimal is in range (a sound subset of the range).
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> whole(-30, 30), frac(0, 999), digits(0, 3);
  auto g = grammar::compile_json_schema(s);
  const json excl = J(R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1.5})");
  auto ge = grammar::compile_json_schema(excl);
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string t = std::to_string(whole(rng));
    const int d = digits(rng);
    if (d > 0) {
      t += '.';
      t += std::to_string(frac(rng)).substr(0, size_t(d));
    }
    const double v = std::stod(t);
    grammar::Matcher m(g), me(ge);
    if (m.feed(t) && m.complete()) {
      ++accepted;
      ASSERT_TRUE(v >= -2.5 && v <= 10) << t;
    }
    if (me.feed(t) && me.complete()) {
      ASSERT_TRUE(v > 0 && v < 1.5) << t;
    }
  }
  EXPECT_GT(accepted, 300);
}

TEST(JsonSchemaGrammar, ErrorsNameTheKeywordAndPath) {
  struct Case {
    const char* schema;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"a":{"not":{"type":"string"}}}})", {"'not'", "#/properties/a"}},
      {R"({"type":"array","items":{"type":"integer","multipleOf":3}})", {"'multipleOf'", "#/items"}},
      {R"({"type":"array","uniqueItems":true})", {"uniqueItems"}},
      {R"({"type":"object","patternProperties":{"x":{}}})", {"patternProperties"}},
      {R"({"if":{"type":"string"},"then":{}})", {"'if'"}},
      {R"({"type":5})", {"'type'"}},
      {R"({"type":"strin"})", {"'type'", "strin"}},
      {R"({"type":"string","minLength":-1})", {"minLength"}},
      {R"({"enum":"abc"})", {"enum"}},
      {R"({"type":"array","maxItems":1000000,"items":{"type":"integer"}})", {"100000"}},
      {R"({"properties":{"a":{"$ref":7}}})", {"$ref", "#/properties/a"}},
      {R"({"anyOf":[]})", {"anyOf"}},
      {R"({"type":"string","pattern":"a{2,1}"})", {"pattern"}},
  };
  for (const Case& c : cases) {
    const std::string err = compile_error(J(c.schema));
    ASSERT_FALSE(err.empty()) << c.schema << " compiled";
    for (const std::string& p : c.parts) EXPECT_NE(err.find(p), std::string::npos) << c.schema << ": " << err;
  }
  EXPECT_FALSE(compile_error(json(5)).empty());
  EXPECT_EQ(compile_error(J(R"({"type":"array","uniqueItems":false,"title":"t","x-extra":1})")), "");
}

TEST(JsonSchemaGrammar, HugeOrDeepSchemasFailCleanly) {
  json deep = J(R"({"type":"integer"})");
  for (int i = 0; i < 100; ++i) deep = json{{"type", "object"}, {"properties", {{"a", deep}}}, {"required", {"a"}}};
  EXPECT_NE(compile_error(deep).find("deeper"), std::string::npos);
  // (Built by the parser, which is iterative: copying such a document recursively would
  // overflow the stack in nlohmann::json itself.)
  const std::string deep_text = std::string(20000, '[') + std::string(20000, ']');
  const json doc = json::parse(deep_text);
  const json nested_enum = json::parse("{\"enum\":[" + deep_text + "]}");
  EXPECT_NE(compile_error(nested_enum).find("nests deeper"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(nested_enum, 1).find("nests deeper"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(json::object(), doc).find("nests deeper"), std::string::npos);
  json refs = {{"$defs", json::object()}};  // a chain of 200 references
  for (int i = 0; i < 200; ++i)
    refs["$defs"][name("d", i)] = i == 199 ? J(R"({"type":"null"})") : json{{"$ref", name("#/$defs/d", i + 1)}};
  refs["$ref"] = "#/$defs/d0";
  EXPECT_NE(compile_error(refs).find("deeper"), std::string::npos);
  json wide = {{"type", "object"}, {"properties", json::object()}};  // many properties: fine
  for (int i = 0; i < 2000; ++i) wide["properties"][name("p", i)] = J(R"({"type":"string","maxLength":4})");
  EXPECT_EQ(compile_error(wide), "");
  json many_long = {{"type", "object"}, {"properties", json::object()}};  // 30 x 100000 counted characters
  for (int i = 0; i < 30; ++i) many_long["properties"][name("p", i)] = J(R"({"type":"string","maxLength":100000})");
  EXPECT_NE(compile_error(many_long).find("too large"), std::string::npos);
  const std::string huge_pattern = compile_error(J(R"({"properties":{"p":{"type":"string","pattern":"^(?:[^a]{9999}){9999}$"}}})"));
  EXPECT_NE(huge_pattern.find("too large"), std::string::npos) << huge_pattern;
  EXPECT_NE(huge_pattern.find("#/properties/p"), std::string::npos) << huge_pattern;
}

// ---------------------------------------------------------------------------------------
// Validator.

TEST(JsonSchemaValidate, KeywordsAndReasons) {
  const json person = J(R"({"type":"object","properties":{"name":{"type":"string","minLength":1},
      "age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},
      "required":["name"],"additionalProperties":false})");
  EXPECT_EQ(step35::testing::schema_violation(person, J(R"({"name":"x","age":3,"tags":["a"]})")), "");
  EXPECT_EQ(step35::testing::schema_violation(person, J(R"({"name":"x","age":3.0})")), "");  // integral float is an integer
  EXPECT_NE(step35::testing::schema_violation(person, J(R"({"age":3})")).find("missing required"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(person, J(R"({"name":"x","age":-1})")).find("/age"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(person, J(R"({"name":"x","age":1.5})")).find("integer"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(person, J(R"({"name":"x","tags":["c"]})")).find("/tags/0"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(person, J(R"({"name":"x","tags":["a","a","b"]})")).find("maxItems"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(person, J(R"({"name":"x","zz":1})")).find("zz"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(person, J(R"({"name":""})")).find("minLength"), std::string::npos);
  const json one = J(R"({"oneOf":[{"type":"integer"},{"type":"number"}]})");
  EXPECT_NE(step35::testing::schema_violation(one, 5).find("exactly one"), std::string::npos);
  EXPECT_EQ(step35::testing::schema_violation(one, 5.5), "");
  EXPECT_EQ(step35::testing::schema_violation(J(R"({"type":"string","pattern":"b+"})"), "abbc"), "");
  EXPECT_NE(step35::testing::schema_violation(J(R"({"type":"string","pattern":"^b+$"})"), "abbc"), "");
  EXPECT_NE(step35::testing::schema_violation(J(R"({"type":"string","format":"date"})"), "2023-02-30"), "");
  EXPECT_EQ(step35::testing::schema_violation(J(R"({"type":"string","maxLength":1})"), "\xF0\x9F\x98\x80"), "");  // one code point
  EXPECT_NE(step35::testing::schema_violation(J(R"({"type":"number","exclusiveMaximum":1})"), 1), "");
  EXPECT_NE(step35::testing::schema_violation(J(R"({"maximum":1,"exclusiveMaximum":true})"), 1), "");
  EXPECT_EQ(step35::testing::schema_violation(J(R"({"type":"string","nullable":true})"), nullptr), "");
  EXPECT_NE(step35::testing::schema_violation(J(R"({"prefixItems":[{"type":"string"}],"items":false})"), J(R"(["a",1])")), "");
  EXPECT_NE(step35::testing::schema_violation(J(R"({"not":{}})"), 1).find("'not'"), std::string::npos);
  EXPECT_NE(step35::testing::schema_violation(J(R"({"$ref":"#"})"), 1).find("too deeply"), std::string::npos);  // no stack overflow
  const json tree = J(R"({"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#"}}},"additionalProperties":false})");
  EXPECT_EQ(step35::testing::schema_violation(tree, J(R"({"kids":[{"kids":[]},{}]})")), "");
  EXPECT_NE(step35::testing::schema_violation(tree, J(R"({"kids":[{"kid":[]}]})")).find("/kids/0"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Token level, with the tiny-a fixture tokenizer (byte-level BPE, 513 tokens).

namespace {

const Tokenizer& fixture_tokenizer() {
  static std::unique_ptr<gguf::File> file = gguf::File::open(step35::testing::fixture_model("tiny-a-f32.gguf"));
  static std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(*file);
  return *tok;
}

bool is_special_type(const Tokenizer& tok, int32_t t) {
  const TokenType ty = tok.token_type(t);
  return ty == TokenType::CONTROL || ty == TokenType::USER_DEFINED || ty == TokenType::UNKNOWN;
}

struct Generation {
  std::string text;
  bool ended = false;  // an EOG token was chosen
  int steps = 0;
};

// Random logits, masked; softmax sampling for `free_steps` tokens, then the allowed token
// that leaves the fewest bytes to complete (so every run must be able to finish).
// Checks the mask invariants at every step.
Generation generate(GrammarConstraint& c, const Tokenizer& tok, uint32_t seed, int free_steps, int max_steps,
                    bool allow_special_tags = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 3.0f);
  const size_t V = tok.n_vocab();
  std::vector<float> logits(V);
  Generation g;
  for (; g.steps < max_steps; ++g.steps) {
    for (float& v : logits) v = noise(rng);
    c.mask(logits.data(), V);
    std::vector<int32_t> allowed;
    bool eog_allowed = false, other_allowed = false;
    for (size_t t = 0; t < V; ++t) {
      if (std::isinf(logits[t])) continue;
      allowed.push_back(int32_t(t));
      if (tok.is_eog(int32_t(t))) {
        eog_allowed = true;
      } else {
        other_allowed = true;
        if (!allow_special_tags) {
          EXPECT_FALSE(is_special_type(tok, int32_t(t))) << "special token " << t << " allowed";
        }
      }
    }
    EXPECT_EQ(eog_allowed, c.complete()) << "after " << g.text;
    EXPECT_TRUE(other_allowed || c.complete()) << "dead end after " << g.text;
    if (allowed.empty()) break;
    int32_t next = -1;
    if (g.steps < free_steps) {
      float mx = -INFINITY;
      for (int32_t t : allowed) mx = std::max(mx, logits[size_t(t)]);
      std::vector<double> w;
      for (int32_t t : allowed) w.push_back(std::exp(double(logits[size_t(t)] - mx)));
      next = allowed[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
    } else {
      uint64_t best = UINT64_MAX;
      for (int32_t t : allowed) {
        const uint64_t d = c.min_remaining_after(t);
        if (d < best || (d == best && logits[size_t(t)] > logits[size_t(next)])) {
          best = d;
          next = t;
        }
      }
    }
    if (tok.is_eog(next)) {
      g.ended = true;
      break;
    }
    c.accept(next);
    EXPECT_FALSE(c.failed());
    g.text += tok.token_to_piece(next);
  }
  return g;
}

GrammarConstraint& as_grammar(TokenConstraint& c) { return dynamic_cast<GrammarConstraint&>(c); }

const std::vector<json>& random_schemas() {
  static const std::vector<json> s = {
      json::object(),
      J(R"({"type":"object"})"),
      J(R"({"type":"object","properties":{"name":{"type":"string","maxLength":20},
          "age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"},
          "tags":{"type":"array","items":{"enum":["a","bb","ccc"]},"maxItems":3}},
          "required":["name","age"],"additionalProperties":false})"),
      J(R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
          "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["value"]}},
          "$ref":"#/$defs/node"})"),
      J(R"({"type":"array","items":{"anyOf":[{"type":"null"},{"type":"boolean"},{"const":"k"},
          {"type":"object","properties":{"x":{"type":"number","minimum":-2.5,"maximum":10}},"required":["x"]}]},
          "minItems":1,"maxItems":4})"),
      J(R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},
          "when":{"type":"string","format":"date-time"},"id":{"type":"string","format":"uuid"}},
          "required":["code","when","id"]})"),
      J(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer","exclusiveMinimum":-5,
          "exclusiveMaximum":5},{"type":"boolean"}],"items":false,"minItems":3})"),
      J(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
          "additionalProperties":{"type":"string","maxLength":5}})"),
      J(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
          {"properties":{"b":{"type":["string","null"]}},"required":["b"]}]})"),
      J(R"({"type":"string","minLength":3,"maxLength":10})"),
      J(R"({"type":"array","items":{"type":"number"},"minItems":2,"maxItems":5})"),
      J(R"({"enum":[1,"a",null,{"k":[1,2]},true,"quote\"d"]})"),
      J(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number","minimum":0}},
          "required":["kind","r"],"additionalProperties":false},{"type":"object","properties":{"kind":{"const":"rect"},
          "w":{"type":"integer"},"h":{"type":"integer","nullable":true}},"required":["kind","w","h"],
          "additionalProperties":false}]})"),
      J(R"({"type":"object","properties":{"d":{"type":"string","format":"date"},"ip":{"type":"string","format":"ipv4"},
          "t":{"type":"string","format":"time"}},"required":["d","ip","t"]})"),
  };
  return s;
}

}  // namespace

TEST(JsonConstraintTokens, RandomGenerationAlwaysParsesAndValidates) {
  const Tokenizer& tok = fixture_tokenizer();
  int runs = 0;
  size_t total_bytes = 0;
  for (size_t si = 0; si < random_schemas().size(); ++si) {
    const json& schema = random_schemas()[si];
    for (uint32_t seed = 1; seed <= 25; ++seed) {
      auto c = make_json_constraint(schema, tok);
      const int free_steps = int((seed * 37) % 90);
      const Generation g = generate(as_grammar(*c), tok, seed * 1000 + uint32_t(si), free_steps, 3000);
      ASSERT_TRUE(g.ended) << "schema " << si << " seed " << seed << " did not finish: " << g.text;
      json v;
      try {
        v = json::parse(g.text);
      } catch (const json::exception& e) {
        FAIL() << "schema " << si << " seed " << seed << ": does not parse: " << e.what() << "\n" << g.text;
      }
      ASSERT_EQ(step35::testing::schema_violation(schema, v), "") << "schema " << si << " seed " << seed << "\n" << g.text;
      ++runs;
      total_bytes += g.text.size();
    }
  }
  std::printf("[json] %d random generations, %zu bytes, all parse and validate\n", runs, total_bytes);
}

TEST(JsonConstraintTokens, EogOnlyWhenCompleteAndCloneIsIndependent) {
  const Tokenizer& tok = fixture_tokenizer();
  auto c = make_json_constraint(J(R"({"type":"array","items":{"type":"integer"}})"), tok);
  auto feed = [&](TokenConstraint& k, const std::string& text) {
    for (int32_t t : tok.encode(text, false, false)) k.accept(t);
  };
  const size_t V = tok.n_vocab();
  auto allowed = [&](TokenConstraint& k, int32_t t) {
    std::vector<float> lg(V, 0.0f);
    k.mask(lg.data(), V);
    return !std::isinf(lg[size_t(t)]);
  };
  const int32_t eos = tok.eos();
  EXPECT_FALSE(c->complete());
  EXPECT_FALSE(allowed(*c, eos));
  feed(*c, "[1, 2");
  EXPECT_FALSE(allowed(*c, eos));
  auto copy = c->clone();
  feed(*c, "]");
  EXPECT_TRUE(c->complete());
  EXPECT_TRUE(allowed(*c, eos));
  EXPECT_FALSE(copy->complete());  // the clone did not see "]"
  EXPECT_FALSE(allowed(*copy, eos));
  feed(*copy, "3, 4]");
  EXPECT_TRUE(copy->complete());
  // A token the mask forbids puts the constraint in a failed state that only allows EOG.
  auto bad = make_json_constraint(J(R"({"type":"integer"})"), tok);
  feed(*bad, "x");
  EXPECT_FALSE(bad->complete());
  EXPECT_TRUE(allowed(*bad, tok.eog_ids()[0]));
  EXPECT_FALSE(allowed(*bad, tok.encode("1", false, false)[0]));
}

TEST(JsonConstraintTokens, BoundsForceTheClosingToken) {
  const Tokenizer& tok = fixture_tokenizer();
  const size_t V = tok.n_vocab();
  auto allowed_pieces = [&](TokenConstraint& c) {
    std::vector<float> lg(V, 0.0f);
    c.mask(lg.data(), V);
    std::vector<std::string> out;
    for (size_t t = 0; t < V; ++t)
      if (!std::isinf(lg[t])) out.push_back(tok.is_eog(int32_t(t)) ? std::string("<EOG>") : tok.token_to_piece(int32_t(t)));
    return out;
  };
  auto feed = [&](TokenConstraint& c, const std::string& text) {
    for (int32_t t : tok.encode(text, false, false)) c.accept(t);
  };
  // maxLength reached: only the closing quote (possibly followed by more bytes in the
  // same token) can come next.
  auto s = make_json_constraint(J(R"({"type":"string","maxLength":3})"), tok);
  feed(*s, "\"abc");
  for (const std::string& p : allowed_pieces(*s)) EXPECT_EQ(p[0], '"') << p;
  // maxItems reached: only whitespace or ']'.
  auto a = make_json_constraint(J(R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"maxItems":2})"), tok);
  feed(*a, "[1,2");
  for (const std::string& p : allowed_pieces(*a)) EXPECT_TRUE(p[0] == ']' || p[0] == ' ' || p[0] == '\n' || p[0] == '\t' || p[0] == '\r') << p;
  // The required properties are written before the object may close.
  auto o = make_json_constraint(J(R"({"type":"object","properties":{"a":{"type":"null"}},"required":["a"]})"), tok);
  feed(*o, "{");
  for (const std::string& p : allowed_pieces(*o)) EXPECT_NE(p[0], '}') << p;
}

TEST(JsonConstraintTokens, LogitsBeyondTheVocabularyAreMasked) {
  const Tokenizer& tok = fixture_tokenizer();
  auto c = make_json_constraint(json::object(), tok);
  std::vector<float> lg(tok.n_vocab() + 16, 1.0f);
  c->mask(lg.data(), lg.size());
  for (size_t t = tok.n_vocab(); t < lg.size(); ++t) EXPECT_TRUE(std::isinf(lg[t]));
}

// ---------------------------------------------------------------------------------------
// Tool calls.

namespace {

const json& test_tools() {
  static const json t = J(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},
      "days":{"type":"integer","minimum":1,"maximum":7}},"required":["city"]}}},
    {"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{
      "a":{"type":"integer"},"b":{"type":"number"}},"required":["a","b"]}}},
    {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
      "query":{"type":"string","maxLength":30},"filters":{"type":"object","properties":{
        "limit":{"type":"integer","minimum":1,"maximum":10},"exact":{"type":"boolean"}},"required":["limit"],
        "additionalProperties":false},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},
      "required":["query","filters"]}}},
    {"type":"function","function":{"name":"no_args"}},
    {"type":"function","function":{"name":"note","parameters":{"type":"object","properties":{
      "text":{"type":"string"},"when":{"type":"string","format":"date"}},"required":["text"]}}}
  ])");
  return t;
}

struct ParsedCall {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;  // raw value text
};

// The Step 3.5 tool-call text format (spec §6); "" error when it parses.
std::string parse_calls(const std::string& text, std::vector<ParsedCall>& out) {
  size_t pos = 0;
  auto skip_ws = [&] {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t' || text[pos] == '\r')) ++pos;
  };
  auto expect = [&](const std::string& s) {
    if (text.compare(pos, s.size(), s) != 0) return false;
    pos += s.size();
    return true;
  };
  skip_ws();
  while (pos < text.size()) {
    ParsedCall call;
    if (!expect("<tool_call>\n<function=")) return "expected <tool_call> at " + std::to_string(pos);
    size_t e = text.find(">\n", pos);
    if (e == std::string::npos) return "unterminated function name";
    call.name = text.substr(pos, e - pos);
    pos = e + 2;
    while (expect("<parameter=")) {
      e = text.find(">\n", pos);
      if (e == std::string::npos) return "unterminated parameter name";
      const std::string key = text.substr(pos, e - pos);
      pos = e + 2;
      e = text.find("\n</parameter>\n", pos);
      if (e == std::string::npos) return "unterminated parameter value";
      call.params.push_back({key, text.substr(pos, e - pos)});
      pos = e + 14;
    }
    if (!expect("</function>\n</tool_call>")) return "expected </function> at " + std::to_string(pos);
    out.push_back(call);
    skip_ws();
  }
  return out.empty() ? "no call" : "";
}

// Every call names a tool, every parameter is declared and decodes (raw text or JSON) to
// a value its schema accepts, every required parameter is present.
std::string check_calls(const std::vector<ParsedCall>& calls, const json& tools, const std::string& only_name) {
  for (const ParsedCall& c : calls) {
    const json* fn = nullptr;
    for (const json& t : tools)
      if (t["function"]["name"] == c.name) fn = &t["function"];
    if (!fn) return "unknown function " + c.name;
    if (!only_name.empty() && c.name != only_name) return "called " + c.name + " instead of " + only_name;
    const json params = fn->value("parameters", json::object());
    const json props = params.value("properties", json::object());
    std::set<std::string> seen;
    for (const auto& [key, raw] : c.params) {
      if (!props.contains(key)) return c.name + ": unknown parameter " + key;
      if (!seen.insert(key).second) return c.name + ": repeated parameter " + key;
      json v;
      if (tool_parameter_is_raw_string(props[key])) {
        v = raw;
      } else {
        try {
          v = json::parse(raw);
        } catch (const json::exception&) {
          return c.name + "." + key + ": not JSON: " + raw;
        }
      }
      const std::string err = step35::testing::schema_violation(props[key], v);
      if (!err.empty()) return c.name + "." + key + ": " + err;
    }
    for (const json& r : params.value("required", json::array()))
      if (!seen.count(r.get<std::string>())) return c.name + ": missing " + r.get<std::string>();
  }
  return "";
}

}  // namespace

TEST(ToolCallConstraint, RandomCallsParseWithTheFormatAndTypes) {
  const Tokenizer& tok = fixture_tokenizer();
  int n_calls = 0;
  std::set<std::string> names_seen;
  for (const std::string only : {"", "search", "note"}) {
    for (uint32_t seed = 1; seed <= 30; ++seed) {
      auto c = make_tool_call_constraint(test_tools(), only, tok);
      const Generation g = generate(as_grammar(*c), tok, seed * 77, int(seed * 13 % 120), 4000);
      ASSERT_TRUE(g.ended) << g.text;
      std::vector<ParsedCall> calls;
      const std::string perr = parse_calls(g.text, calls);
      ASSERT_EQ(perr, "") << g.text;
      ASSERT_EQ(check_calls(calls, test_tools(), only), "") << g.text;
      n_calls += int(calls.size());
      for (const ParsedCall& pc : calls) names_seen.insert(pc.name);
    }
  }
  EXPECT_GE(names_seen.size(), 4u);
  std::printf("[tools] %d generated calls parse and validate (%zu functions seen)\n", n_calls, names_seen.size());
}

TEST(ToolCallConstraint, RawTextValuesStopAtTheClosingTag) {
  const Tokenizer& tok = fixture_tokenizer();
  const json tools = J(R"([{"type":"function","function":{"name":"note","parameters":{"type":"object",
      "properties":{"text":{"type":"string"}},"required":["text"]}}}])");
  auto g = compile_tool_calls(tools, "", nullptr);
  auto ok = [&](const std::string& s) {
    grammar::Matcher m(g);
    return m.feed(s) && m.complete();
  };
  const std::string head = "<tool_call>\n<function=note>\n<parameter=text>\n";
  const std::string tail = "\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(ok(head + "multi\nline </param text\n</parameterX" + tail));
  EXPECT_TRUE(ok(head + "" + tail));
  EXPECT_TRUE(ok(head + "\n\n" + tail));
  EXPECT_FALSE(ok(head + "a\n</parameter>\nb" + tail));  // the value cannot contain the closing tag
  EXPECT_TRUE(ok(head + "x" + tail + "\n" + head + "y" + tail));  // parallel calls
  EXPECT_FALSE(ok(head + "x" + tail + "\n\n\n" + head + "y" + tail));
  EXPECT_FALSE(ok("<tool_call>\n<function=other>\n</function>\n</tool_call>"));
  EXPECT_FALSE(ok("<tool_call>\n<function=note>\n</function>\n</tool_call>"));  // missing required
  // Enumerated raw values: exactly the strings (values of other types cannot be raw text).
  const json e = J(R"([{"type":"function","function":{"name":"pick","parameters":{"type":"object",
      "properties":{"c":{"type":"string","enum":["red",1,"dark blue"]},"n":{"type":"integer","maximum":9}}}}}])");
  auto ge = compile_tool_calls(e, "", nullptr);
  auto ok_e = [&](const std::string& s) {
    grammar::Matcher m(ge);
    return m.feed(s) && m.complete();
  };
  const std::string call = "<tool_call>\n<function=pick>\n";
  const std::string end = "</function>\n</tool_call>";
  EXPECT_TRUE(ok_e(call + "<parameter=c>\ndark blue\n</parameter>\n" + end));
  EXPECT_FALSE(ok_e(call + "<parameter=c>\n1\n</parameter>\n" + end));
  EXPECT_FALSE(ok_e(call + "<parameter=c>\n\"red\"\n</parameter>\n" + end));
  EXPECT_TRUE(ok_e(call + "<parameter=n>\n-3\n</parameter>\n" + end));
  EXPECT_FALSE(ok_e(call + "<parameter=n>\n10\n</parameter>\n" + end));
  EXPECT_TRUE(ok_e(call + end));  // nothing required
  (void)tok;
}

TEST(ToolCallConstraint, MalformedToolsAreRejected) {
  const Tokenizer& tok = fixture_tokenizer();
  EXPECT_THROW(make_tool_call_constraint(json::object(), "", tok), std::invalid_argument);
  EXPECT_THROW(make_tool_call_constraint(json::array(), "", tok), std::invalid_argument);
  EXPECT_THROW(make_tool_call_constraint(J(R"([{"type":"function","function":{}}])"), "", tok), std::invalid_argument);
  EXPECT_THROW(make_tool_call_constraint(J(R"([{"type":"function","function":{"name":"a>b"}}])"), "", tok),
               std::invalid_argument);
  EXPECT_THROW(make_tool_call_constraint(test_tools(), "missing", tok), std::invalid_argument);
  EXPECT_THROW(make_tool_call_constraint(J(R"([{"type":"function","function":{"name":"f","parameters":
                   {"type":"object","properties":{"x":{"not":{}}}}}}])"), "", tok),
               std::invalid_argument);
  EXPECT_TRUE(tool_parameter_is_raw_string(J(R"({"type":"string"})")));
  EXPECT_TRUE(tool_parameter_is_raw_string(J(R"({"enum":["a","b"]})")));
  EXPECT_FALSE(tool_parameter_is_raw_string(J(R"({"type":["string","null"]})")));
  EXPECT_FALSE(tool_parameter_is_raw_string(J(R"({"type":"integer"})")));
  EXPECT_FALSE(tool_parameter_is_raw_string(J(R"({"not":{}})")));
}

// ---------------------------------------------------------------------------------------
// Reasoning wrapper.

TEST(AfterTokenConstraint, FreeUntilTriggerWithBudget) {
  const Tokenizer& tok = fixture_tokenizer();
  const int32_t think_end = tok.find_token("</think>");
  ASSERT_GE(think_end, 0);
  const size_t V = tok.n_vocab();
  auto count_allowed = [&](TokenConstraint& c, std::vector<float>& lg) {
    std::fill(lg.begin(), lg.end(), 0.0f);
    c.mask(lg.data(), V);
    return std::count_if(lg.begin(), lg.end(), [](float v) { return !std::isinf(v); });
  };
  std::vector<float> lg(V);
  auto c = make_after_token_constraint(think_end, 3, make_json_constraint(J(R"({"type":"boolean"})"), tok));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(count_allowed(*c, lg), long(V - tok.eog_ids().size()));  // everything but EOG
    for (int32_t e : tok.eog_ids()) EXPECT_TRUE(std::isinf(lg[size_t(e)]));
    c->accept(100 + i);
  }
  EXPECT_EQ(count_allowed(*c, lg), 1);  // budget spent: only </think>
  EXPECT_FALSE(std::isinf(lg[size_t(think_end)]));
  auto fork = c->clone();
  c->accept(think_end);
  EXPECT_FALSE(c->complete());
  count_allowed(*c, lg);
  EXPECT_TRUE(std::isinf(lg[size_t(think_end)]));  // inside the JSON now
  for (int32_t t : tok.encode(" true", false, false)) c->accept(t);
  EXPECT_TRUE(c->complete());
  count_allowed(*c, lg);
  EXPECT_FALSE(std::isinf(lg[size_t(tok.eog_ids()[0])]));
  EXPECT_FALSE(fork->complete());
  EXPECT_EQ(count_allowed(*fork, lg), 1);
  // No budget: the trigger may come any time.
  auto free = make_after_token_constraint(think_end, -1, make_json_constraint(J(R"({"type":"null"})"), tok));
  for (int i = 0; i < 50; ++i) free->accept(200);
  EXPECT_GT(count_allowed(*free, lg), 100);
  free->accept(think_end);
  for (int32_t t : tok.encode("null", false, false)) free->accept(t);
  EXPECT_TRUE(free->complete());
  EXPECT_THROW(make_after_token_constraint(-1, 0, make_json_constraint(json::object(), tok)), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// End to end: the tiny model's own logits, greedy and sampled.

namespace {

struct ModelRun {
  std::string text;
  bool ended = false;
  int tokens = 0;
};

ModelRun run_model(const Model& model, ThreadPool& pool, TokenConstraint& c, const std::string& prompt, bool parse_special,
                   float temperature, uint64_t seed, int max_tokens) {
  const Tokenizer& tok = model.tokenizer();
  const size_t V = size_t(model.hparams().n_vocab);
  SamplingParams sp;
  sp.temperature = temperature;
  sp.seed = seed;
  Sampler sampler(sp, V);
  std::vector<int32_t> ids = tok.encode(prompt, true, parse_special);
  Session session(model, int32_t(ids.size()) + max_tokens + 1, 256);
  std::vector<float> logits;
  session.forward(ids.data(), int32_t(ids.size()), false, logits, pool);
  ModelRun r;
  for (; r.tokens < max_tokens; ++r.tokens) {
    c.mask(logits.data(), V);
    const int32_t next = sampler.sample(logits.data());
    sampler.accept(next);
    if (tok.is_eog(next)) {
      r.ended = true;
      break;
    }
    c.accept(next);
    r.text += tok.token_to_piece(next);
    session.forward(&next, 1, false, logits, pool);
  }
  return r;
}

}  // namespace

TEST(JsonConstraintModel, TinyModelOutputValidates) {
  Model::LoadOptions opts;
  opts.verbose = false;
  auto model = Model::load(step35::testing::fixture_model("tiny-a-f32.gguf"), opts);
  const Tokenizer& tok = model->tokenizer();
  ThreadPool pool(2);
  // Bounded schemas, so that even a degenerate greedy model has to finish.
  const json person = J(R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
      "age":{"type":"integer","minimum":0,"maximum":120},"active":{"type":"boolean"},
      "tags":{"type":"array","items":{"enum":["x","y","zz"]},"maxItems":3}},
      "required":["name","age","active","tags"],"additionalProperties":false})");
  for (int mode = 0; mode < 4; ++mode) {
    auto c = make_json_constraint(person, tok);
    const ModelRun r = run_model(*model, pool, *c, "Reply with a person as JSON:", false, mode == 0 ? 0.0f : 0.9f,
                                 uint64_t(mode), 2000);
    ASSERT_TRUE(r.ended) << "mode " << mode << ": " << r.text;
    const json v = json::parse(r.text);
    EXPECT_EQ(step35::testing::schema_violation(person, v), "") << r.text;
    std::printf("[model] %s: %d tokens, %zu bytes: %s\n", mode == 0 ? "greedy " : "sampled", r.tokens, r.text.size(),
                v.dump(-1, ' ', true).c_str());
  }
  // Reasoning first (the prompt opens <think>), a budget of 4 free tokens, then JSON.
  const int32_t think_end = tok.find_token("</think>");
  auto wrapped = make_after_token_constraint(think_end, 4, make_json_constraint(person, tok));
  auto& inner_view = *wrapped;
  const ModelRun r = run_model(*model, pool, inner_view, "<|im_start|>assistant\n<think>\n", true, 0.0f, 0, 2000);
  ASSERT_TRUE(r.ended) << r.text;
  const size_t cut = r.text.find("</think>");
  ASSERT_NE(cut, std::string::npos) << r.text;
  EXPECT_EQ(step35::testing::schema_violation(person, json::parse(r.text.substr(cut + 8))), "") << r.text;
  // A tool call, greedy.
  const json tools = J(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string","maxLength":10},"days":{"type":"integer","minimum":1,"maximum":7}},
      "required":["city","days"]}}}])");
  auto tc = make_tool_call_constraint(tools, "", tok);
  const ModelRun t = run_model(*model, pool, *tc, "Call a tool:", false, 0.0f, 0, 2000);
  ASSERT_TRUE(t.ended) << t.text;
  std::vector<ParsedCall> calls;
  ASSERT_EQ(parse_calls(t.text, calls), "") << t.text;
  EXPECT_EQ(check_calls(calls, tools, ""), "") << t.text;
}

// ---------------------------------------------------------------------------------------
// Costs with a vocabulary of the real size.

namespace {

// A 128,896-token byte-level vocabulary (like Step 3.5's), for the per-request costs.
std::unique_ptr<Tokenizer> big_tokenizer() {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(step35::byte_level_text(uint8_t(b)));
    types.push_back(1);
  }
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> len(1, 9), letter(0, 25), space(0, 1);
  while (tokens.size() < 128896 - 4) {
    std::string raw = space(rng) ? " " : "";
    for (int i = len(rng); i > 0; --i) raw += char('a' + letter(rng));
    if (!seen.insert(raw).second) continue;
    std::string m;
    for (char c : raw) m += step35::byte_level_text(uint8_t(c));
    tokens.push_back(m);
    types.push_back(1);
  }
  for (const char* sp : {"<|im_end|>", "<think>", "</think>", "<tool_call>"}) {
    tokens.push_back(sp);
    types.push_back(sp[1] == '|' ? 3 : 4);
  }
  gguf::Writer w;
  w.set_str("tokenizer.ggml.model", "gpt2");
  w.set_str("tokenizer.ggml.pre", "deepseek-v3");
  w.set_arr_str("tokenizer.ggml.tokens", tokens);
  w.set_arr_i32("tokenizer.ggml.token_type", types);
  w.set_arr_str("tokenizer.ggml.merges", {});
  w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(tokens.size() - 4));
  const std::vector<uint8_t> bytes = w.to_bytes();
  auto f = gguf::File::parse_buffer(bytes.data(), bytes.size(), "big.gguf");
  return Tokenizer::from_gguf(*f);
}

double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

}  // namespace

TEST(JsonConstraintTokens, PerRequestCostOnA128kVocabulary) {
  // Not timed assertions: the numbers go to docs/structured-output.md.
  auto tok = big_tokenizer();
  const json schema = J(R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},
      "age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"]})");
  double t0 = cpu_ms();
  auto first = make_json_constraint(schema, *tok);
  const double first_ms = cpu_ms() - t0;
  t0 = cpu_ms();
  auto second = make_json_constraint(schema, *tok);
  const double second_ms = cpu_ms() - t0;
  t0 = cpu_ms();
  auto tools = make_tool_call_constraint(test_tools(), "", *tok);
  const double tools_ms = cpu_ms() - t0;
  std::vector<float> lg(tok->n_vocab(), 0.0f);
  for (int32_t t : tok->encode("{\"name\": \"Ad", false, false)) second->accept(t);
  second->mask(lg.data(), lg.size());
  t0 = cpu_ms();
  for (int i = 0; i < 10; ++i) second->mask(lg.data(), lg.size());
  const double mask_ms = (cpu_ms() - t0) / 10;
  std::printf("[perf] 128k vocabulary: make_json_constraint first %.1f ms (builds the token trie), then %.1f ms; "
              "make_tool_call_constraint %.1f ms; mask() in a string %.2f ms\n",
              first_ms, second_ms, tools_ms, mask_ms);
  EXPECT_FALSE(second->complete());
}

// The nesting check that runs on JSON text before it is parsed (request bodies, tool-call
// arguments, model output): brackets inside strings, escaped quotes and malformed text.
TEST(JsonTextDepth, CountsBracketsOutsideStringsOnly) {
  using step35::grammar::json_text_depth;
  EXPECT_EQ(json_text_depth("", 10), 0u);
  EXPECT_EQ(json_text_depth("42", 10), 0u);
  EXPECT_EQ(json_text_depth("[]", 10), 1u);
  EXPECT_EQ(json_text_depth("{\"a\":[1,{\"b\":[]}],\"c\":{}}", 10), 4u);
  EXPECT_EQ(json_text_depth("[\"[[[[{{{{\"]", 10), 1u);
  EXPECT_EQ(json_text_depth("[\"\\\"[[[[\"]", 10), 1u);          // an escaped quote does not end the string
  EXPECT_EQ(json_text_depth("[\"\\\\\",[[]]]", 10), 3u);          // an escaped backslash does not escape the quote
  EXPECT_EQ(json_text_depth("]]]][[", 10), 2u);                   // malformed: closers never go below zero
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_EQ(json_text_depth(deep, 256), 257u);                    // stops reading past the limit
  EXPECT_EQ(json_text_depth(std::string(256, '[') + std::string(256, ']'), 256), 256u);
  // The DOM depth of any JSON the parser accepts.
  for (const char* text : {"[[1],[[2]],{\"x\":[[[{}]]]}]", "{\"k\":\"}]\",\"v\":[{\"w\":[0]}]}"}) {
    const auto doc = nlohmann::json::parse(text);
    EXPECT_EQ(json_text_depth(text, 100), step35::grammar::json_depth(doc, 100)) << text;
  }
}
