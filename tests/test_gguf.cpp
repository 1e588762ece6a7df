// GGUF reader/writer: value round trips, split models, shipped fixtures, and a corruption
// corpus + mini-fuzz (untrusted input must only ever produce gguf::Error).

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "support.h"
#include "tensor/dtype.h"

namespace {

using step35::gguf::Error;
using step35::gguf::File;
using step35::gguf::TensorInfo;
using step35::gguf::Value;
using step35::gguf::ValueType;
using step35::gguf::Writer;
namespace st = step35::testing;

constexpr uint32_t kF32 = 0;
constexpr uint32_t kQ8_0 = 8;

// ---- helpers ----------------------------------------------------------------------------

Value vu(ValueType t, uint64_t u) {
  Value v;
  v.type = t;
  v.u = u;
  return v;
}
Value vi(ValueType t, int64_t i) {
  Value v;
  v.type = t;
  v.i = i;
  return v;
}
Value vf(ValueType t, double f) {
  Value v;
  v.type = t;
  v.f = f;
  return v;
}
Value vs(const std::string& s) {
  Value v;
  v.type = ValueType::STRING;
  v.str = s;
  return v;
}
Value varr(ValueType elem, std::vector<Value> items) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = elem;
  v.array = std::move(items);
  return v;
}

// Deep equality on the fields each type uses (f32 compared as float, bit-for-bit-ish).
bool same_value(const Value& a, const Value& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
    case ValueType::BOOL:
      return a.u == b.u;
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      return a.i == b.i;
    case ValueType::F32: return float(a.f) == float(b.f) || (std::isnan(a.f) && std::isnan(b.f));
    case ValueType::F64: return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    case ValueType::STRING: return a.str == b.str;
    case ValueType::ARRAY:
      if (a.elem_type != b.elem_type || a.array.size() != b.array.size()) return false;
      for (size_t k = 0; k < a.array.size(); k++) {
        if (!same_value(a.array[k], b.array[k])) return false;
      }
      return true;
  }
  return false;
}

std::vector<uint8_t> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t k = 0; k < n; k++) v[k] = uint8_t(seed + k * 7);
  return v;
}

// Parses a private, exactly-sized heap copy so AddressSanitizer catches any over-read.
void parse_copy(const std::vector<uint8_t>& bytes, size_t len, const std::string& name = "test.gguf") {
  std::unique_ptr<uint8_t[]> buf(new uint8_t[len == 0 ? 1 : len]);
  if (len) std::memcpy(buf.get(), bytes.data(), len);
  std::unique_ptr<File> f = File::parse_buffer(len ? buf.get() : nullptr, len, name);
  // Touch everything a caller could touch.
  for (const auto& [key, v] : f->metadata()) (void)v.to_string();
  uint64_t sum = 0;
  for (const TensorInfo& t : f->tensors()) {
    if (t.data < buf.get() || t.nbytes > len || t.data + t.nbytes > buf.get() + len) {
      throw std::logic_error("tensor data outside the buffer");
    }
    for (uint64_t k = 0; k < t.nbytes; k++) sum += t.data[k];
  }
  (void)sum;
}
void parse_copy(const std::vector<uint8_t>& bytes) { parse_copy(bytes, bytes.size()); }

// Success iff fn throws gguf::Error whose message is one line and contains every needle.
::testing::AssertionResult throws_gguf_error(const std::function<void()>& fn,
                                             const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.find('\n') != std::string::npos || msg.find('\r') != std::string::npos) {
      return ::testing::AssertionFailure() << "message is not one line: " << msg;
    }
    for (const std::string& n : needles) {
      if (msg.find(n) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << n << "\": " << msg;
      }
    }
    // STEP35_TEST_VERBOSE=1 shows every message, to review their wording.
    if (std::getenv("STEP35_TEST_VERBOSE")) std::printf("  error: %s\n", msg.c_str());
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-gguf exception: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw a non-exception";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

::testing::AssertionResult rejects(const std::vector<uint8_t>& bytes, const std::vector<std::string>& needles) {
  std::vector<std::string> all = needles;
  all.push_back("test.gguf: ");
  return throws_gguf_error([&] { parse_copy(bytes); }, all);
}

// GGUF string encoding (u64 length + bytes), used to locate fields in a file.
std::string gguf_string(const std::string& s) {
  std::string out(8, '\0');
  uint64_t n = s.size();
  std::memcpy(out.data(), &n, 8);
  return out + s;
}

size_t find_unique(const std::vector<uint8_t>& b, const std::string& needle) {
  size_t found = std::string::npos;
  int count = 0;
  for (size_t k = 0; k + needle.size() <= b.size(); k++) {
    if (std::memcmp(b.data() + k, needle.data(), needle.size()) == 0) {
      found = k;
      count++;
    }
  }
  if (count != 1) throw std::logic_error("needle found " + std::to_string(count) + " times");
  return found;
}

// Offset of the key's length prefix / its value type / its value.
size_t key_pos(const std::vector<uint8_t>& b, const std::string& key) { return find_unique(b, gguf_string(key)); }
size_t type_pos(const std::vector<uint8_t>& b, const std::string& key) { return key_pos(b, key) + 8 + key.size(); }
size_t value_pos(const std::vector<uint8_t>& b, const std::string& key) { return type_pos(b, key) + 4; }
// Offset of a tensor info's n_dims field.
size_t tinfo_pos(const std::vector<uint8_t>& b, const std::string& name) {
  return find_unique(b, gguf_string(name)) + 8 + name.size();
}

void put_u32(std::vector<uint8_t>& b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); }
void put_u64(std::vector<uint8_t>& b, size_t off, uint64_t v) { std::memcpy(b.data() + off, &v, 8); }
uint32_t get_u32_at(const std::vector<uint8_t>& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

// Builds raw bytes by hand (for inputs the Writer refuses to make).
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& raw(const void* p, size_t n) {
    const uint8_t* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& s) { u64(s.size()); return raw(s.data(), s.size()); }
};

const std::string kQ = "blk.0.attn_q.weight";  // F32 {4, 2}: 32 bytes
const std::string kK = "blk.0.attn_k.weight";  // F32 {8}: 32 bytes

// The valid small file that the corruption corpus and the fuzzer start from.
const std::vector<uint8_t>& base_file() {
  static const std::vector<uint8_t> bytes = [] {
    Writer w;
    w.set_str("general.architecture", "step35");
    w.set_u32("general.alignment", 32);
    w.set_str("general.name", "corpus");
    w.set_u32("test.k1", 7);
    w.set_u32("test.k2", 8);
    w.set_arr_str("tokenizer.ggml.tokens", {"a", "bb", "ccc"});
    w.set("test.nested", varr(ValueType::ARRAY, {varr(ValueType::U8, {vu(ValueType::U8, 1), vu(ValueType::U8, 2)}),
                                                 varr(ValueType::U8, {vu(ValueType::U8, 3)})}));
    w.set_f32("test.f", 0.5f);
    w.add_tensor(kQ, kF32, {4, 2}, pattern_bytes(32, 1));
    w.add_tensor(kK, kF32, {8}, pattern_bytes(32, 100));
    return w.to_bytes();
  }();
  return bytes;
}

// ---- value round trips --------------------------------------------------------------------

std::vector<std::pair<std::string, Value>> all_value_kinds() {
  std::vector<std::pair<std::string, Value>> kv;
  kv.emplace_back("t.u8", vu(ValueType::U8, 255));
  kv.emplace_back("t.i8", vi(ValueType::I8, -128));
  kv.emplace_back("t.u16", vu(ValueType::U16, 65535));
  kv.emplace_back("t.i16", vi(ValueType::I16, -32768));
  kv.emplace_back("t.u32", vu(ValueType::U32, 4294967295u));
  kv.emplace_back("t.i32", vi(ValueType::I32, std::numeric_limits<int32_t>::min()));
  kv.emplace_back("t.f32", vf(ValueType::F32, 1.5));
  kv.emplace_back("t.f32_small", vf(ValueType::F32, double(1e-5f)));
  kv.emplace_back("t.bool_true", vu(ValueType::BOOL, 1));
  kv.emplace_back("t.bool_false", vu(ValueType::BOOL, 0));
  kv.emplace_back("t.str", vs(std::string("raw \n\x01\xff bytes \xe2\x96\x81 kept", 23)));
  kv.emplace_back("t.empty_str", vs(""));
  kv.emplace_back("t.u64_max", vu(ValueType::U64, std::numeric_limits<uint64_t>::max()));
  kv.emplace_back("t.i64_neg", vi(ValueType::I64, -42));
  kv.emplace_back("t.i64_min", vi(ValueType::I64, std::numeric_limits<int64_t>::min()));
  kv.emplace_back("t.f64", vf(ValueType::F64, 3.141592653589793));
  kv.emplace_back("t.f64_big", vf(ValueType::F64, 1e300));
  kv.emplace_back("a.u8", varr(ValueType::U8, {vu(ValueType::U8, 0), vu(ValueType::U8, 255)}));
  kv.emplace_back("a.i8", varr(ValueType::I8, {vi(ValueType::I8, -1), vi(ValueType::I8, 127)}));
  kv.emplace_back("a.u16", varr(ValueType::U16, {vu(ValueType::U16, 1)}));
  kv.emplace_back("a.i16", varr(ValueType::I16, {vi(ValueType::I16, -300)}));
  kv.emplace_back("a.u32", varr(ValueType::U32, {vu(ValueType::U32, 1), vu(ValueType::U32, 2)}));
  kv.emplace_back("a.i32", varr(ValueType::I32, {vi(ValueType::I32, -5), vi(ValueType::I32, 64)}));
  kv.emplace_back("a.f32", varr(ValueType::F32, {vf(ValueType::F32, -0.25), vf(ValueType::F32, 7.0)}));
  kv.emplace_back("a.bool", varr(ValueType::BOOL, {vu(ValueType::BOOL, 1), vu(ValueType::BOOL, 0)}));
  kv.emplace_back("a.str", varr(ValueType::STRING, {vs("x"), vs(""), vs("zz")}));
  kv.emplace_back("a.u64", varr(ValueType::U64, {vu(ValueType::U64, std::numeric_limits<uint64_t>::max())}));
  kv.emplace_back("a.i64", varr(ValueType::I64, {vi(ValueType::I64, -9)}));
  kv.emplace_back("a.f64", varr(ValueType::F64, {vf(ValueType::F64, 1e-300)}));
  kv.emplace_back("a.empty_u8", varr(ValueType::U8, {}));
  kv.emplace_back("a.empty_str", varr(ValueType::STRING, {}));
  kv.emplace_back("a.empty_arr", varr(ValueType::ARRAY, {}));
  kv.emplace_back("a.nested",
                  varr(ValueType::ARRAY, {varr(ValueType::I32, {vi(ValueType::I32, 1), vi(ValueType::I32, 2)}),
                                          varr(ValueType::I32, {vi(ValueType::I32, 3)}),
                                          varr(ValueType::STRING, {vs("mixed elem types per sub-array")}),
                                          varr(ValueType::I32, {})}));
  kv.emplace_back("a.nested3",
                  varr(ValueType::ARRAY, {varr(ValueType::ARRAY, {varr(ValueType::F64, {vf(ValueType::F64, 2.5)})})}));
  return kv;
}

void expect_kv_equal(const File& f, const std::vector<std::pair<std::string, Value>>& kv) {
  EXPECT_EQ(f.metadata().size(), kv.size());
  for (const auto& [key, v] : kv) {
    const Value* got = f.find(key);
    ASSERT_NE(got, nullptr) << key;
    EXPECT_TRUE(same_value(*got, v)) << key << ": got " << got->to_string() << ", want " << v.to_string();
  }
}

TEST(GgufRoundTrip, EveryValueTypeThroughParseBuffer) {
  Writer w;
  auto kv = all_value_kinds();
  for (const auto& [key, v] : kv) w.set(key, v);
  std::vector<uint8_t> bytes = w.to_bytes();
  auto f = File::parse_buffer(bytes.data(), bytes.size(), "mem.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->tensors().size(), 0u);
  EXPECT_EQ(f->n_files(), 1u);
  EXPECT_EQ(f->total_file_bytes(), bytes.size());
  expect_kv_equal(*f, kv);
}

TEST(GgufRoundTrip, EveryValueTypeThroughFileOpen) {
  Writer w;
  auto kv = all_value_kinds();
  for (const auto& [key, v] : kv) w.set(key, v);
  w.add_tensor("t", kF32, {4}, pattern_bytes(16, 3));
  std::string path = st::tmp_dir() + "/gguf_values.gguf";
  w.write(path);
  EXPECT_EQ(st::read_bytes(path), w.to_bytes());  // write() and to_bytes() agree
  auto f = File::open(path);
  EXPECT_EQ(f->path(), path);
  expect_kv_equal(*f, kv);
}

TEST(GgufRoundTrip, KeysKeepInsertionOrderAndReplaceInPlace) {
  Writer w;
  w.set_u32("z.first", 1);
  w.set_u32("a.second", 2);
  w.set_u32("z.first", 3);  // replaced in place, still first
  std::vector<uint8_t> b = w.to_bytes();
  EXPECT_LT(key_pos(b, "z.first"), key_pos(b, "a.second"));
  EXPECT_EQ(get_u32_at(b, 16), 2u);  // key count (low half of the u64)
  auto f = File::parse_buffer(b.data(), b.size());
  EXPECT_EQ(f->get_u32("z.first"), 3u);
}

TEST(GgufRoundTrip, TypedSettersAndGetters) {
  Writer w;
  w.set_u8("k.u8", 200);
  w.set_u16("k.u16", 60000);
  w.set_u32("k.u32", 4000000000u);
  w.set_i32("k.i32", -7);
  w.set_u64("k.u64", std::numeric_limits<uint64_t>::max());
  w.set_f32("k.f32", 1e-5f);
  w.set_bool("k.bool", true);
  w.set_str("k.str", "hello");
  w.set_arr_i32("k.ai32", {64, 96, -1});
  w.set_arr_u32("k.au32", {1, 2, 3});
  w.set_arr_f32("k.af32", {0.0f, 7.0f, 16.0f});
  w.set_arr_bool("k.abool", {true, false, true});
  w.set_arr_str("k.astr", {"<s>", "", "x"});
  std::vector<uint8_t> b = w.to_bytes();
  auto f = File::parse_buffer(b.data(), b.size(), "typed.gguf");
  EXPECT_EQ(f->get_u32("k.u8"), 200u);
  EXPECT_EQ(f->get_u32("k.u16"), 60000u);
  EXPECT_EQ(f->get_u32("k.u32"), 4000000000u);
  EXPECT_EQ(f->get_i64("k.i32"), -7);
  EXPECT_EQ(f->get_u64("k.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->get_f32("k.f32"), 1e-5f);
  EXPECT_EQ(f->get_f32("k.u32"), 4e9f);  // integers convert to float
  EXPECT_TRUE(f->get_bool("k.bool"));
  EXPECT_EQ(f->get_str("k.str"), "hello");
  EXPECT_EQ(f->get_i32_array("k.ai32"), (std::vector<int32_t>{64, 96, -1}));
  EXPECT_EQ(f->get_i32_array("k.au32"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(f->get_str_array("k.astr"), (std::vector<std::string>{"<s>", "", "x"}));
  EXPECT_EQ(f->get_array("k.af32", ValueType::F32).array.size(), 3u);
  EXPECT_EQ(f->opt_u32("k.u32"), std::optional<uint32_t>(4000000000u));
  EXPECT_EQ(f->opt_u32("absent"), std::nullopt);
  EXPECT_EQ(f->opt_f32("absent"), std::nullopt);
  EXPECT_EQ(f->opt_bool("absent"), std::nullopt);
  EXPECT_EQ(f->opt_str("absent"), std::nullopt);
  EXPECT_EQ(f->opt_str("k.str"), std::optional<std::string>("hello"));
  EXPECT_EQ(f->opt_bool("k.bool"), std::optional<bool>(true));
  EXPECT_EQ(f->opt_f32("k.f32"), std::optional<float>(1e-5f));
  EXPECT_TRUE(f->has("k.str"));
  EXPECT_FALSE(f->has("k.nope"));
}

TEST(GgufRoundTrip, PerLayerGetters) {
  Writer w;
  w.set_u32("l.scalar", 8);
  w.set_arr_i32("l.heads", {4, 6, 6, 4});
  w.set_arr_u32("l.u32", {1, 2, 3, 4});
  w.set_arr_i32("l.neg", {1, -2, 3, 4});
  w.set_arr_i32("l.short", {1, 2, 3});
  w.set_arr_bool("l.swa", {false, true, true, false});
  w.set_bool("l.bool_scalar", true);
  w.set_arr_f32("l.clamp", {0.0f, 0.0f, 1.5f, 1.5f});
  w.set("l.clamp64", varr(ValueType::F64, {vf(ValueType::F64, 1), vf(ValueType::F64, 2),
                                           vf(ValueType::F64, 3), vf(ValueType::F64, 4)}));
  w.set_f32("l.f_scalar", 2.5f);
  w.set_arr_str("l.strs", {"a", "b", "c", "d"});
  std::vector<uint8_t> b = w.to_bytes();
  auto f = File::parse_buffer(b.data(), b.size(), "layers.gguf");
  EXPECT_EQ(f->get_u32_per_layer("l.scalar", 4), (std::vector<uint32_t>{8, 8, 8, 8}));
  EXPECT_EQ(f->get_u32_per_layer("l.heads", 4), (std::vector<uint32_t>{4, 6, 6, 4}));
  EXPECT_EQ(f->get_u32_per_layer("l.u32", 4), (std::vector<uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(f->get_u32_per_layer("l.absent", 3, 5u), (std::vector<uint32_t>{5, 5, 5}));
  EXPECT_EQ(f->get_bool_per_layer("l.swa", 4), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(f->get_bool_per_layer("l.bool_scalar", 2), (std::vector<bool>{true, true}));
  EXPECT_EQ(f->get_bool_per_layer("l.absent", 2, false), (std::vector<bool>{false, false}));
  EXPECT_EQ(f->get_f32_per_layer("l.clamp", 4), (std::vector<float>{0, 0, 1.5f, 1.5f}));
  EXPECT_EQ(f->get_f32_per_layer("l.clamp64", 4), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(f->get_f32_per_layer("l.f_scalar", 2), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(f->get_f32_per_layer("l.absent", 2, 0.0f), (std::vector<float>{0, 0}));

  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32_per_layer("l.short", 4); },
                                {"layers.gguf", "'l.short'", "3 elements", "expected 4"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32_per_layer("l.heads", 5); }, {"'l.heads'", "expected 5"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32_per_layer("l.neg", 4); }, {"'l.neg'", "element 1", "-2"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32_per_layer("l.absent", 4); }, {"'l.absent'", "missing"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32_per_layer("l.strs", 4); }, {"'l.strs'", "array<string>"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32_per_layer("l.clamp", 4); }, {"'l.clamp'", "array<f32>"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_bool_per_layer("l.heads", 4); }, {"'l.heads'", "array<i32>"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_bool_per_layer("l.scalar", 4); }, {"'l.scalar'", "u32"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_f32_per_layer("l.heads", 4); }, {"'l.heads'", "array<i32>"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_f32_per_layer("l.clamp", 3); }, {"'l.clamp'", "expected 3"}));
}

TEST(GgufRoundTrip, GetterTypeErrorsNameKeyAndTypes) {
  Writer w;
  w.set_str("g.str", "text");
  w.set_i32("g.neg", -1);
  w.set_u64("g.big", uint64_t(1) << 40);
  w.set_u64("g.max", std::numeric_limits<uint64_t>::max());
  w.set_u32("g.u32", 3);
  w.set("g.f64_huge", vf(ValueType::F64, 1e300));
  w.set_arr_u32("g.arr", {1});
  w.set_arr_i32("g.arr_big", {1});
  w.set("g.arr_u64", varr(ValueType::U64, {vu(ValueType::U64, uint64_t(1) << 33)}));
  std::vector<uint8_t> b = w.to_bytes();
  auto f = File::parse_buffer(b.data(), b.size(), "types.gguf");
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32("g.str"); }, {"types.gguf", "'g.str'", "string", "integer"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32("g.neg"); }, {"'g.neg'", "-1", "i32"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u32("g.big"); }, {"'g.big'", "1099511627776", "u64"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_u64("g.neg"); }, {"'g.neg'", "non-negative"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_i64("g.max"); }, {"'g.max'", "int64"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_f32("g.str"); }, {"'g.str'", "string"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_f32("g.f64_huge"); }, {"'g.f64_huge'", "float range"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_bool("g.u32"); }, {"'g.u32'", "u32", "bool"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_str("g.u32"); }, {"'g.u32'", "u32", "string"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_str("g.missing"); }, {"'g.missing'", "missing"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_array("g.arr", ValueType::STRING); },
                                {"'g.arr'", "array<u32>", "array<string>"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_array("g.u32", ValueType::U32); }, {"'g.u32'", "u32", "array<u32>"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_str_array("g.arr"); }, {"'g.arr'", "array<string>"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_i32_array("g.str"); }, {"'g.str'", "array of integers"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->get_i32_array("g.arr_u64"); }, {"'g.arr_u64'", "element 0"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->opt_u32("g.str"); }, {"'g.str'"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->opt_bool("g.str"); }, {"'g.str'"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->opt_str("g.u32"); }, {"'g.u32'"}));
  EXPECT_TRUE(throws_gguf_error([&] { f->opt_f32("g.str"); }, {"'g.str'"}));
}

TEST(GgufRoundTrip, ValueToString) {
  EXPECT_EQ(vu(ValueType::U8, 255).to_string(), "255");
  EXPECT_EQ(vi(ValueType::I64, -42).to_string(), "-42");
  EXPECT_EQ(vf(ValueType::F32, 1.5).to_string(), "1.5");
  EXPECT_EQ(vf(ValueType::F32, double(1e-5f)).to_string(), "1e-05");
  EXPECT_EQ(vu(ValueType::BOOL, 1).to_string(), "true");
  EXPECT_EQ(vs("a\"b\n").to_string(), "\"a\\\"b\\n\"");
  EXPECT_EQ(varr(ValueType::STRING, {vs("a"), vs("bb")}).to_string(), "array<string>[2] [\"a\", \"bb\"]");
  std::vector<Value> many;
  for (int k = 0; k < 10; k++) many.push_back(vi(ValueType::I32, k));
  EXPECT_EQ(varr(ValueType::I32, many).to_string(), "array<i32>[10] [0, 1, 2, 3, 4, 5, 6, 7, ...]");
  EXPECT_EQ(varr(ValueType::I32, many).to_string(2), "array<i32>[10] [0, 1, ...]");
  EXPECT_EQ(varr(ValueType::U8, {}).to_string(), "array<u8>[0] []");
  EXPECT_EQ(varr(ValueType::ARRAY, {varr(ValueType::U8, {vu(ValueType::U8, 1)})}).to_string(),
            "array<array>[1] [array<u8>[1] [1]]");
  EXPECT_STREQ(step35::gguf::value_type_name(ValueType::F64), "f64");
  EXPECT_TRUE(vu(ValueType::U16, 1).is_integer());
  EXPECT_FALSE(vu(ValueType::BOOL, 1).is_integer());
  EXPECT_TRUE(vf(ValueType::F64, 1).is_float());
}

// ---- tensors ------------------------------------------------------------------------------

TEST(GgufTensors, DataPointsIntoTheMappingWithTheRightBytes) {
  for (uint32_t alignment : {32u, 64u, 1u, 4096u}) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    Writer w(alignment);
    w.set_str("general.architecture", "step35");
    std::vector<std::vector<uint8_t>> data = {pattern_bytes(4 * 3 * 2, 1), pattern_bytes(34 * 2, 2),
                                              pattern_bytes(4 * 5, 3), pattern_bytes(2 * 32, 4)};
    w.add_tensor("a", kF32, {3, 2}, data[0]);
    w.add_tensor("b.q8", kQ8_0, {32, 2}, data[1]);
    w.add_tensor("c", kF32, {5}, data[2]);
    w.add_tensor("d.f16", 1, {2, 2, 2, 4}, data[3]);
    std::vector<uint8_t> bytes = w.to_bytes();
    EXPECT_EQ(bytes.size() % alignment, 0u);
    std::string path = st::tmp_dir() + "/gguf_tensors_" + std::to_string(alignment) + ".gguf";
    w.write(path);
    auto f = File::open(path);
    EXPECT_EQ(f->alignment(), alignment);
    // general.alignment is written exactly when it is not the default.
    EXPECT_EQ(f->has("general.alignment"), alignment != 32);
    ASSERT_EQ(f->tensors().size(), 4u);
    const char* names[] = {"a", "b.q8", "c", "d.f16"};
    for (size_t k = 0; k < 4; k++) {
      const TensorInfo* t = f->find_tensor(names[k]);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t, &f->tensors()[k]);  // file order kept
      EXPECT_EQ(t->nbytes, data[k].size());
      EXPECT_EQ(t->offset % alignment, 0u);
      EXPECT_EQ((f->data_offset() + t->offset) % alignment, 0u);
      EXPECT_EQ(std::memcmp(t->data, data[k].data(), data[k].size()), 0);
      EXPECT_EQ(std::memcmp(t->data, bytes.data() + f->data_offset() + t->offset, t->nbytes), 0);
      EXPECT_EQ(t->file_index, 0u);
    }
    const TensorInfo* d = f->find_tensor("d.f16");
    EXPECT_EQ(d->n_dims, 4u);
    EXPECT_EQ(d->n_elements(), 32);
    EXPECT_EQ(d->ne[3], 4);
    const TensorInfo* c = f->find_tensor("c");
    EXPECT_EQ(c->n_dims, 1u);
    EXPECT_EQ(c->ne[1], 1);
    EXPECT_EQ(f->find_tensor("nope"), nullptr);
    // Padding is zeros.
    for (size_t k = f->find_tensor("c")->offset + 20; k < d->offset; k++) {
      EXPECT_EQ(bytes[f->data_offset() + k], 0) << k;
    }
  }
}

TEST(GgufTensors, ReaderAcceptsExplicitDefaultAlignmentKey) {
  const std::vector<uint8_t>& b = base_file();  // has general.alignment = 32 written explicitly
  auto f = File::parse_buffer(b.data(), b.size(), "test.gguf");
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_u32("general.alignment"), 32u);
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->data_offset() + 64, b.size());
}

TEST(GgufTensors, WriterValidates) {
  Writer w;
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", kF32, {4}, std::vector<uint8_t>(15)); },
                                {"'x'", "15", "16"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", 99, {4}, std::vector<uint8_t>(16)); }, {"'x'", "99"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", kQ8_0, {16}, std::vector<uint8_t>(17)); },
                                {"'x'", "block"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", kF32, {}, {}); }, {"'x'", "dimensions"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", kF32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)); },
                                {"'x'", "dimensions"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", kF32, {0}, {}); }, {"'x'"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", kF32, {int64_t(1) << 62, 4}, {}); }, {"'x'"}));
  w.add_tensor("x", kF32, {4}, std::vector<uint8_t>(16));
  EXPECT_TRUE(throws_gguf_error([&] { w.add_tensor("x", kF32, {4}, std::vector<uint8_t>(16)); }, {"duplicate"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.set("bad", varr(ValueType::U8, {vi(ValueType::I32, 1)})); }, {"'bad'"}));
  EXPECT_TRUE(throws_gguf_error([&] { w.set("bad", vu(ValueType::U8, 256)); }, {"'bad'"}));
  EXPECT_TRUE(throws_gguf_error([&] { Writer(3).to_bytes(); }, {"alignment 3"}));
  EXPECT_TRUE(throws_gguf_error([&] { Writer(0).to_bytes(); }, {"alignment 0"}));
  Writer wa(64);
  wa.set_u32("general.alignment", 32);
  EXPECT_TRUE(throws_gguf_error([&] { wa.to_bytes(); }, {"general.alignment"}));
  EXPECT_TRUE(throws_gguf_error([&] { Writer().write(st::tmp_dir() + "/no/such/dir/x.gguf"); },
                                {"/no/such/dir/x.gguf"}));
}

TEST(GgufTensors, NestingLimitIsEightLevels) {
  Value v = varr(ValueType::U8, {vu(ValueType::U8, 9)});
  for (int level = 1; level < 8; level++) v = varr(ValueType::ARRAY, {v});
  Writer w;
  w.set("deep8", v);  // 8 levels: accepted by both sides
  std::vector<uint8_t> b = w.to_bytes();
  auto f = File::parse_buffer(b.data(), b.size());
  EXPECT_TRUE(same_value(*f->find("deep8"), v));
  Value v9 = varr(ValueType::ARRAY, {v});
  EXPECT_TRUE(throws_gguf_error([&] { w.set("deep9", v9); }, {"'deep9'", "nested"}));
}

// ---- split models -------------------------------------------------------------------------

struct SplitSpec {
  int count = 3;
  int tensors_count = 6;                 // split.tensors.count written in every part
  int wrong_no_part = -1;                // this part gets a wrong split.no
  std::string duplicate_in_part3 = "";   // a tensor name of another part, repeated in part 3
  bool skip_part3 = false;
};

std::vector<uint8_t> split_tensor_data(int k) { return pattern_bytes(size_t(16 * (k + 1)), uint8_t(k * 31)); }

// Writes <prefix>-0000K-of-00003.gguf: part 1 has the metadata and t0, t1; part 2 has t2, t3;
// part 3 has t4, t5.
std::string write_split(const std::string& prefix, const SplitSpec& spec) {
  for (int p = 0; p < spec.count; p++) {
    if (p == 2 && spec.skip_part3) continue;
    Writer w;
    if (p == 0) {
      w.set_str("general.architecture", "step35");
      w.set_u32("step35.block_count", 2);
    } else {
      w.set_str("part.only", "not merged");
    }
    w.set_u16("split.no", uint16_t(p == spec.wrong_no_part ? p + 1 : p));
    w.set_u16("split.count", uint16_t(spec.count));
    w.set_i32("split.tensors.count", spec.tensors_count);
    for (int k = 2 * p; k < 2 * p + 2; k++) {
      w.add_tensor(std::string("t").append(std::to_string(k)), kF32, {4 * (k + 1)}, split_tensor_data(k));
    }
    if (p == 2 && !spec.duplicate_in_part3.empty()) {
      w.add_tensor(spec.duplicate_in_part3, kF32, {4}, pattern_bytes(16, 0));
    }
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", p + 1, spec.count);
    w.write(prefix + suffix);
  }
  return prefix + "-00001-of-0000" + std::to_string(spec.count) + ".gguf";
}

TEST(GgufSplit, ThreePartsMerge) {
  std::string prefix = st::tmp_dir() + "/gguf_split_ok";
  std::string first = write_split(prefix, SplitSpec{});
  auto f = File::open(first);
  EXPECT_EQ(f->n_files(), 3u);
  ASSERT_EQ(f->tensors().size(), 6u);
  EXPECT_EQ(f->get_str("general.architecture"), "step35");
  EXPECT_FALSE(f->has("part.only"));  // metadata comes from part 1
  uint64_t total = 0;
  for (int p = 0; p < 3; p++) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "-%05d-of-00003.gguf", p + 1);
    std::vector<uint8_t> raw = st::read_bytes(prefix + suffix);
    total += raw.size();
    for (int k = 2 * p; k < 2 * p + 2; k++) {
      const TensorInfo* t = f->find_tensor(std::string("t").append(std::to_string(k)));
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->file_index, uint32_t(p));
      std::vector<uint8_t> want = split_tensor_data(k);
      ASSERT_EQ(t->nbytes, want.size());
      EXPECT_EQ(std::memcmp(t->data, want.data(), want.size()), 0);
      // Offsets are relative to the part's own data section.
      EXPECT_EQ(std::memcmp(raw.data() + f->data_offset(p) + t->offset, want.data(), want.size()), 0);
    }
  }
  EXPECT_EQ(f->total_file_bytes(), total);
}

TEST(GgufSplit, Errors) {
  const std::string dir = st::tmp_dir();
  {
    std::string first = write_split(dir + "/gguf_split_missing", SplitSpec{.skip_part3 = true});
    std::remove((dir + "/gguf_split_missing-00003-of-00003.gguf").c_str());  // from an earlier run
    EXPECT_TRUE(throws_gguf_error([&] { File::open(first); },
                                  {"gguf_split_missing-00001-of-00003.gguf", "part 3 of 3",
                                   "gguf_split_missing-00003-of-00003.gguf"}));
  }
  {
    write_split(dir + "/gguf_split_p2", SplitSpec{});
    EXPECT_TRUE(throws_gguf_error([&] { File::open(dir + "/gguf_split_p2-00002-of-00003.gguf"); },
                                  {"part 2 of a 3-part", "part 1"}));
  }
  {
    std::string first = write_split(dir + "/gguf_split_no", SplitSpec{.wrong_no_part = 1});
    EXPECT_TRUE(throws_gguf_error([&] { File::open(first); },
                                  {"gguf_split_no-00002-of-00003.gguf", "split.no", "is 2", "expected 1"}));
  }
  {
    std::string first = write_split(dir + "/gguf_split_total", SplitSpec{.tensors_count = 7});
    EXPECT_TRUE(throws_gguf_error([&] { File::open(first); }, {"split.tensors.count", "7", "6 tensors"}));
  }
  {
    std::string first = write_split(dir + "/gguf_split_dup", SplitSpec{.tensors_count = 7, .duplicate_in_part3 = "t1"});
    EXPECT_TRUE(throws_gguf_error([&] { File::open(first); }, {"'t1'", "part 1", "part 3"}));
  }
  {
    // split.count > 1 but a name without the -0000K-of-0000N pattern.
    std::string first = write_split(dir + "/gguf_split_named", SplitSpec{});
    std::string renamed = dir + "/gguf_split_renamed.gguf";
    st::write_bytes(renamed, st::read_bytes(first));
    EXPECT_TRUE(throws_gguf_error([&] { File::open(renamed); }, {"gguf_split_renamed.gguf", "-00001-of-"}));
  }
  {
    // The same part parsed from memory stands alone (no siblings to load, no total check).
    std::vector<uint8_t> b = st::read_bytes(write_split(dir + "/gguf_split_mem", SplitSpec{}));
    auto f = File::parse_buffer(b.data(), b.size());
    EXPECT_EQ(f->tensors().size(), 2u);
  }
}

// ---- shipped fixtures ---------------------------------------------------------------------

TEST(GgufFixtures, ShippedModelsOpen) {
  const char* files[] = {"tiny-a-f32.gguf", "tiny-a-f16.gguf", "tiny-a-q8_0.gguf",
                         "tiny-a-q4_k_m.gguf", "tiny-b-f32.gguf", "tiny-k-q4_k_m.gguf"};
  for (const char* name : files) {
    SCOPED_TRACE(name);
    std::string path = st::fixture_model(name);
    ASSERT_TRUE(st::file_exists(path)) << path;
    auto f = File::open(path);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->get_str("general.architecture"), "step35");
    EXPECT_GT(f->tensors().size(), 0u);
    std::vector<uint8_t> raw = st::read_bytes(path);
    EXPECT_EQ(f->total_file_bytes(), raw.size());
    for (const TensorInfo& t : f->tensors()) {
      uint64_t begin = f->data_offset(t.file_index) + t.offset;
      ASSERT_LE(begin + t.nbytes, raw.size()) << t.name;
      EXPECT_EQ(std::memcmp(t.data, raw.data() + begin, t.nbytes), 0) << t.name;
      EXPECT_EQ(f->find_tensor(t.name), &t);
    }
  }
  auto a = File::open(st::fixture_model("tiny-a-f32.gguf"));
  std::vector<std::string> tokens = a->get_str_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.size(), 513u);
  EXPECT_EQ(a->get_array("tokenizer.ggml.tokens", ValueType::STRING).array.size(), 513u);
  uint32_t n_layer = a->get_u32("step35.block_count");
  EXPECT_EQ(a->get_u32_per_layer("step35.attention.head_count", n_layer).size(), n_layer);
  EXPECT_EQ(a->get_bool_per_layer("step35.attention.sliding_window_pattern", n_layer).size(), n_layer);
}

TEST(GgufFixtures, RewriteKeepsEverything) {
  // Reader -> Writer -> reader on a real model keeps every key and every tensor byte.
  auto a = File::open(st::fixture_model("tiny-a-f32.gguf"));
  Writer w(a->alignment());
  for (const auto& [key, v] : a->metadata()) w.set(key, v);
  for (const TensorInfo& t : a->tensors()) {
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    w.add_tensor(t.name, t.type, ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  std::vector<uint8_t> b = w.to_bytes();
  EXPECT_EQ(b.size(), a->total_file_bytes());  // same layout rules as the generator
  auto f = File::parse_buffer(b.data(), b.size(), "rewritten.gguf");
  ASSERT_EQ(f->metadata().size(), a->metadata().size());
  for (const auto& [key, v] : a->metadata()) EXPECT_TRUE(same_value(*f->find(key), v)) << key;
  ASSERT_EQ(f->tensors().size(), a->tensors().size());
  for (size_t k = 0; k < a->tensors().size(); k++) {
    const TensorInfo& x = a->tensors()[k];
    const TensorInfo& y = f->tensors()[k];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.offset, y.offset);
    EXPECT_EQ(x.nbytes, y.nbytes);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << x.name;
  }
}

// ---- corruption corpus --------------------------------------------------------------------

TEST(GgufCorrupt, BaseFileIsValid) { EXPECT_NO_THROW(parse_copy(base_file())); }

TEST(GgufCorrupt, HeaderFields) {
  const std::vector<uint8_t>& base = base_file();
  auto b = base;
  b[0] = 'X';
  EXPECT_TRUE(rejects(b, {"bad magic", "offset 0", "GGUF"}));
  b = base;
  put_u32(b, 4, 1);
  EXPECT_TRUE(rejects(b, {"version 1", "offset 4", "expected 2 or 3"}));
  b = base;
  put_u32(b, 4, 99);
  EXPECT_TRUE(rejects(b, {"version 99", "offset 4"}));
  b = base;
  put_u32(b, 4, 0x03000000);
  EXPECT_TRUE(rejects(b, {"big-endian", "offset 4"}));
  b = base;
  put_u32(b, 4, 2);  // v2 has the same layout
  EXPECT_NO_THROW(parse_copy(b));
  b = base;
  put_u64(b, 8, uint64_t(1) << 40);
  EXPECT_TRUE(rejects(b, {"tensor count 1099511627776", "offset 8", "cannot fit"}));
  b = base;
  put_u64(b, 8, std::numeric_limits<uint64_t>::max());  // -1 as int64
  EXPECT_TRUE(rejects(b, {"tensor count", "cannot fit"}));
  b = base;
  put_u64(b, 16, uint64_t(1) << 61);
  EXPECT_TRUE(rejects(b, {"key count 2305843009213693952", "offset 16", "cannot fit"}));
  b = base;
  put_u64(b, 8, 3);  // one more tensor than there are infos
  EXPECT_TRUE(rejects(b, {}));
}

TEST(GgufCorrupt, TruncationAtEveryOffset) {
  const std::vector<uint8_t>& base = base_file();
  // The last tensor ends exactly at the end of the file, so every shorter prefix is broken.
  for (size_t len = 0; len < base.size(); len++) {
    EXPECT_TRUE(throws_gguf_error([&] { parse_copy(base, len); }, {"test.gguf: "})) << "length " << len;
  }
  // A few through File::open on real files too.
  for (size_t len : {size_t(1), size_t(3), size_t(23), size_t(100), base.size() - 1}) {
    std::string path = st::tmp_dir() + "/gguf_trunc.gguf";
    st::write_bytes(path, std::vector<uint8_t>(base.begin(), base.begin() + long(len)));
    EXPECT_TRUE(throws_gguf_error([&] { File::open(path); }, {path})) << len;
  }
}

TEST(GgufCorrupt, StringAndArrayLengths) {
  const std::vector<uint8_t>& base = base_file();
  auto b = base;
  put_u64(b, value_pos(b, "general.name"), uint64_t(1) << 63);
  EXPECT_TRUE(rejects(b, {"'general.name'", "9223372036854775808", "past end of file"}));
  b = base;
  put_u64(b, value_pos(b, "general.name"), std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(rejects(b, {"'general.name'", "18446744073709551615", "past end of file"}));
  b = base;
  put_u64(b, key_pos(b, "general.architecture"), std::numeric_limits<uint64_t>::max() - 3);
  EXPECT_TRUE(rejects(b, {"key #0", "offset 24", "past end of file"}));
  b = base;
  size_t tokens = value_pos(b, "tokenizer.ggml.tokens");  // u32 elem type, u64 count
  put_u64(b, tokens + 4, uint64_t(1) << 62);
  EXPECT_TRUE(rejects(b, {"'tokenizer.ggml.tokens'", "array count 4611686018427387904", "cannot fit"}));
  b = base;
  put_u64(b, tokens + 4, 4);  // one more string than present: runs into the next key
  EXPECT_THROW(parse_copy(b), Error);
  b = base;
  put_u32(b, tokens, 13);
  EXPECT_TRUE(rejects(b, {"'tokenizer.ggml.tokens'", "element type 13"}));
  b = base;
  put_u64(b, value_pos(b, "test.nested") + 4, uint64_t(1) << 60);  // array of arrays: 12 bytes minimum each
  EXPECT_TRUE(rejects(b, {"'test.nested'", "cannot fit"}));
  b = base;
  put_u32(b, type_pos(b, "test.k1"), 13);
  EXPECT_TRUE(rejects(b, {"'test.k1'", "unknown value type 13"}));
  b = base;
  put_u32(b, type_pos(b, "test.k1"), 9);  // u32 value 7 read as array element type 7 (bool) ...
  EXPECT_THROW(parse_copy(b), Error);
}

TEST(GgufCorrupt, NestedArraysTooDeep) {
  Bytes x;
  x.raw("GGUF", 4).u32(3).u64(0).u64(1).str("test.deep").u32(9);
  for (int level = 0; level < 99; level++) x.u32(9).u64(1);
  x.u32(0).u64(0);
  EXPECT_TRUE(rejects(x.b, {"'test.deep'", "nested deeper than 8"}));
}

TEST(GgufCorrupt, DuplicateKeysAndTensors) {
  const std::vector<uint8_t>& base = base_file();
  auto b = base;
  b[key_pos(b, "test.k2") + 8 + 6] = '1';  // "test.k2" -> "test.k1"
  EXPECT_TRUE(rejects(b, {"'test.k1'", "duplicate key"}));
  b = base;
  b[find_unique(b, gguf_string(kK)) + 8 + 11] = 'q';  // attn_k -> attn_q
  EXPECT_TRUE(rejects(b, {"'" + kQ + "'", "duplicate tensor name"}));
}

TEST(GgufCorrupt, Alignment) {
  const std::vector<uint8_t>& base = base_file();
  auto b = base;
  put_u32(b, value_pos(b, "general.alignment"), 0);
  EXPECT_TRUE(rejects(b, {"'general.alignment'", "alignment 0", "power of two"}));
  b = base;
  put_u32(b, value_pos(b, "general.alignment"), 3);
  EXPECT_TRUE(rejects(b, {"'general.alignment'", "alignment 3", "power of two"}));
  b = base;
  put_u32(b, type_pos(b, "general.alignment"), 5);  // i32
  EXPECT_TRUE(rejects(b, {"'general.alignment'", "type i32", "expected u32"}));
  b = base;
  put_u32(b, value_pos(b, "general.alignment"), 64);  // tensor 2 at offset 32 is now misaligned
  EXPECT_TRUE(rejects(b, {"'" + kK + "'", "misaligned", "64"}));
  b = base;
  put_u32(b, value_pos(b, "general.alignment"), 0x80000000u);  // huge but valid: offset 32 misaligned
  EXPECT_TRUE(rejects(b, {"'" + kK + "'", "alignment 2147483648"}));
}

TEST(GgufCorrupt, TensorInfos) {
  const std::vector<uint8_t>& base = base_file();
  const std::string q = "'" + kQ + "'";
  const std::string k = "'" + kK + "'";
  size_t qi = tinfo_pos(base, kQ);  // n_dims, ne[0], ne[1], type, offset
  size_t ki = tinfo_pos(base, kK);  // n_dims, ne[0], type, offset
  auto b = base;
  put_u32(b, qi, 5);
  EXPECT_TRUE(rejects(b, {q, "n_dims 5", "offset " + std::to_string(qi), "1 to 4"}));
  b = base;
  put_u32(b, qi, 0);
  EXPECT_TRUE(rejects(b, {q, "n_dims 0"}));
  b = base;
  put_u64(b, qi + 12, 0);
  EXPECT_TRUE(rejects(b, {q, "ne[1] = 0", "offset " + std::to_string(qi + 12), "> 0"}));
  b = base;
  put_u64(b, qi + 4, uint64_t(-4));
  EXPECT_TRUE(rejects(b, {q, "ne[0] = -4"}));
  b = base;
  put_u64(b, qi + 4, uint64_t(1) << 32);
  put_u64(b, qi + 12, uint64_t(1) << 32);
  EXPECT_TRUE(rejects(b, {q, "overflows int64"}));
  b = base;
  put_u64(b, qi + 4, uint64_t(1) << 62);  // 2^62 elements fit int64, 2^64 bytes do not
  put_u64(b, qi + 12, 1);
  EXPECT_TRUE(rejects(b, {q, "byte size", "overflows"}));
  b = base;
  put_u32(b, qi + 20, 99);
  EXPECT_TRUE(rejects(b, {q, "unknown ggml type id 99", "offset " + std::to_string(qi + 20)}));
  b = base;
  put_u32(b, qi + 20, 8);  // q8_0 with ne[0] = 4
  EXPECT_TRUE(rejects(b, {q, "not a multiple", "32"}));
  b = base;
  put_u64(b, ki + 16, 33);
  EXPECT_TRUE(rejects(b, {k, "data offset 33", "misaligned", "multiple of the alignment 32"}));
  b = base;
  put_u64(b, ki + 16, uint64_t(1) << 20);
  EXPECT_TRUE(rejects(b, {k, "extends past end of file", "size " + std::to_string(base.size())}));
  b = base;
  put_u64(b, ki + 16, 0xffffffffffffffe0ull);  // aligned, but data_start + offset wraps
  EXPECT_TRUE(rejects(b, {k, "overflows"}));
  b = base;
  put_u64(b, ki + 16, 0);  // both tensors at [0, 32)
  EXPECT_TRUE(rejects(b, {q, k, "overlap"}));
  b = base;
  put_u64(b, ki + 4, 16);  // k grows to 64 bytes from offset 32: past EOF
  EXPECT_TRUE(rejects(b, {k, "past end of file"}));
  b = base;
  put_u64(b, qi + 12, 3);  // q grows to 48 bytes: overlaps k at 32
  put_u64(b, ki + 16, 32);
  put_u64(b, ki + 4, 4);   // keep k inside the file
  EXPECT_TRUE(rejects(b, {q, k, "overlap"}));
  b = base;
  put_u64(b, qi - 8 - kQ.size(), 0);
  EXPECT_TRUE(rejects(b, {"tensor #0", "empty tensor name"}));
}

// IQ tensors: a type id that does not match the bytes the tensor has, an id in the gaps
// between the IQ ids, a row that is not whole super-blocks, and a file cut inside the last
// grid-indexed block all end in a one-line error naming the tensor (the codebook indices
// inside a block cannot go wrong: every bit pattern is a valid index, tests/test_quants.cpp).
TEST(GgufCorrupt, IqTensors) {
  const std::string a = "blk.0.ffn_up.weight", b = "blk.0.ffn_down.weight";
  Writer w;
  w.set_str("general.architecture", "step35");
  w.set_u32("general.alignment", 32);
  w.add_tensor(a, 16, {256, 2}, pattern_bytes(2 * 66, 3));  // iq2_xxs: 66 bytes per 256
  w.add_tensor(b, 20, {64, 1}, pattern_bytes(2 * 18, 5));   // iq4_nl: 18 bytes per 32, last
  const std::vector<uint8_t> base = w.to_bytes();
  ASSERT_NO_THROW(parse_copy(base));
  auto f = File::parse_buffer(base.data(), base.size(), "iq.gguf");
  EXPECT_EQ(f->find_tensor(a)->nbytes, 132u);
  EXPECT_EQ(f->find_tensor(b)->nbytes, 36u);
  const size_t ai = tinfo_pos(base, a), bi = tinfo_pos(base, b);  // n_dims, ne..., type, offset
  const std::string qa = "'" + a + "'", qb = "'" + b + "'";
  auto c = base;
  put_u32(c, ai + 20, 21);  // iq3_s: 220 bytes for the same shape, runs into the next tensor
  EXPECT_TRUE(rejects(c, {qa, qb, "overlap"}));
  c = base;
  put_u32(c, bi + 20, 23);  // iq4_xs needs rows of 256: ne[0] = 64 is not
  EXPECT_TRUE(rejects(c, {qb, "ne[0] = 64", "iq4_xs block size", "256"}));
  c = base;
  put_u64(c, bi + 4, 256);  // iq4_nl over 256 values: 144 bytes, past the end of the file
  EXPECT_TRUE(rejects(c, {qb, "extends past end of file"}));
  for (uint32_t gap : {15u, 24u, 25u, 26u, 27u, 28u, 31u, 33u, 36u}) {
    c = base;
    put_u32(c, ai + 20, gap);
    EXPECT_TRUE(rejects(c, {qa, "unknown ggml type id " + std::to_string(gap), "iq2_xxs", "tq2_0"})) << gap;
  }
  // Cut inside the last block of the last tensor (the file ends with alignment padding, so
  // cut relative to where the tensor's data ends).
  const size_t b_end = size_t(f->find_tensor(b)->data - base.data()) + 36;
  EXPECT_TRUE(throws_gguf_error([&] { parse_copy(base, b_end - 5); }, {qb, "past end of file"}));
  Writer w2;  // the grid-indexed IQ2_XXS tensor last
  w2.set_str("general.architecture", "step35");
  w2.add_tensor(b, 20, {64, 1}, pattern_bytes(36, 5));
  w2.add_tensor(a, 16, {256, 2}, pattern_bytes(132, 3));
  const std::vector<uint8_t> iq_last = w2.to_bytes();
  auto f2 = File::parse_buffer(iq_last.data(), iq_last.size(), "iq_last.gguf");
  const size_t a_end = size_t(f2->find_tensor(a)->data - iq_last.data()) + 132;
  for (size_t cut : {size_t(1), size_t(33), size_t(65), size_t(131)})
    EXPECT_TRUE(throws_gguf_error([&] { parse_copy(iq_last, a_end - cut); }, {qa, "past end of file"})) << cut;
}

TEST(GgufCorrupt, NamesInMessagesStayOneLine) {
  auto b = base_file();
  size_t key = key_pos(b, "test.k2");
  b[key + 8 + 4] = '\n';  // "test\nk2"
  put_u32(b, key + 8 + 7, 77);
  EXPECT_TRUE(rejects(b, {"'test\\x0ak2'", "unknown value type 77"}));
}

TEST(GgufCorrupt, UnreadableFiles) {
  std::string empty = st::tmp_dir() + "/gguf_empty.gguf";
  st::write_bytes(empty, {});
  EXPECT_TRUE(throws_gguf_error([&] { File::open(empty); }, {empty, "empty"}));
  std::string missing = st::tmp_dir() + "/gguf_does_not_exist.gguf";
  EXPECT_TRUE(throws_gguf_error([&] { File::open(missing); }, {missing, "cannot open"}));
  EXPECT_TRUE(throws_gguf_error([&] { File::open(st::tmp_dir()); }, {"not a regular file"}));
  EXPECT_TRUE(throws_gguf_error([&] { step35::gguf::MappedFile m(missing); }, {missing}));
  EXPECT_TRUE(throws_gguf_error([&] { File::parse_buffer(nullptr, 0, "null.gguf"); }, {"null.gguf", "truncated"}));
}

TEST(GgufCorrupt, MiniFuzz) {
  const std::vector<uint8_t>& base = base_file();
  auto f = File::parse_buffer(base.data(), base.size());
  const size_t header = f->data_offset();
  std::mt19937_64 rng(20240611);
  int parsed = 0, rejected = 0;
  // STEP35_FUZZ_ITERS raises the count for a longer local run; CI uses the fixed 2000.
  int iters = 2000;
  if (const char* env = std::getenv("STEP35_FUZZ_ITERS")) iters = std::max(1, std::atoi(env));
  for (int iter = 0; iter < iters; iter++) {
    std::vector<uint8_t> b = base;
    int n_mut = 1 + int(rng() % 4);
    for (int m = 0; m < n_mut; m++) {
      // Mostly the header, where the parser lives; sometimes anywhere.
      size_t pos = (rng() % 4 != 0) ? size_t(rng() % header) : size_t(rng() % b.size());
      switch (rng() % 6) {
        case 0: b[pos] = uint8_t(rng()); break;
        case 1: b[pos] ^= uint8_t(1u << (rng() % 8)); break;
        case 2: b[pos] = 0; break;
        case 3: b[pos] = 0xff; break;
        case 4:  // a wild 8-byte field
          if (pos + 8 <= b.size()) {
            const uint64_t wild[] = {0, 1, uint64_t(1) << 31, uint64_t(1) << 32, uint64_t(1) << 62,
                                     uint64_t(1) << 63, ~uint64_t(0), ~uint64_t(0) - 7, rng()};
            put_u64(b, pos, wild[rng() % 9]);
          }
          break;
        case 5:  // truncate
          b.resize(pos);
          break;
      }
      if (b.empty()) break;
    }
    try {
      parse_copy(b);
      parsed++;
    } catch (const Error& e) {
      rejected++;
      std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << iter << ": non-gguf exception: " << e.what();
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("mini-fuzz: %d parsed, %d rejected\n", parsed, rejected);
}

}  // namespace
