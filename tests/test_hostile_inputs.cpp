// Known attack shapes against the loaders (each a real crash or CVE in a peer engine):
// GGUF size arithmetic, lengths near 2^64, tensors outside the file, wrong metadata types,
// vocab/embedding mismatch, tokenizer inputs whose token count would overflow 32 bits, and
// the same hostile files and prompts through the `step35 run` CLI. Each must end in a clear
// one-line error (gguf::Error / std::length_error; exit status 1 on the CLI), never a crash.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/step35.h"
#include "support.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"

namespace st = step35::testing;
using namespace step35;
using gguf::Error;

namespace {

// A valid two-layer step35 model of 36 KB (also the GGUF fuzzer's main seed; made by
// ../shared/tools/make_tiny_step35.py, command in fuzz/corpus/README.md).
std::string micro_model_path() { return std::string(PROJECT_SOURCE_DIR) + "/fuzz/corpus/gguf/micro-f16.gguf"; }
const std::vector<uint8_t>& micro_bytes() {
  static const std::vector<uint8_t> b = st::read_bytes(micro_model_path());
  return b;
}

// Hand-assembled little-endian GGUF bytes (the Writer refuses to write broken files).
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put<uint32_t>(3).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  // One tensor info.
  Bytes& tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(uint32_t(ne.size()));
    for (int64_t d : ne) put<int64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Bytes& pad_to(size_t align, size_t extra = 0) {
    while (b.size() % align) b.push_back(0);
    b.resize(b.size() + extra, 0);
    return *this;
  }
};

// Parses `b`, expecting a gguf::Error whose message contains `needle`.
void expect_parse_error(const std::vector<uint8_t>& b, const std::string& needle) {
  try {
    gguf::File::parse_buffer(b.data(), b.size(), "hostile.gguf");
    ADD_FAILURE() << "parsed without error; expected '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "message is not one line";
  }
}

// The micro model rewritten through the Writer, with `edit` applied to the metadata and
// tensors first (rebuilding is how a crafted-but-well-formed file is made).
struct ModelImage {
  std::vector<std::pair<std::string, gguf::Value>> kv;
  struct T {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  std::vector<T> tensors;

  ModelImage() {
    auto f = gguf::File::parse_buffer(micro_bytes().data(), micro_bytes().size(), "micro.gguf");
    for (const auto& [k, v] : f->metadata())
      if (k != "general.alignment") kv.emplace_back(k, v);
    for (const gguf::TensorInfo& t : f->tensors())
      tensors.push_back({t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                         std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  }
  void set(const std::string& key, gguf::Value v) {
    for (auto& [k, old] : kv)
      if (k == key) { old = std::move(v); return; }
    kv.emplace_back(key, std::move(v));
  }
  T& tensor(const std::string& name) {
    for (T& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  std::vector<uint8_t> bytes() const {
    gguf::Writer w;
    for (const auto& [k, v] : kv) w.set(k, v);
    for (const T& t : tensors) w.add_tensor(t.name, t.type, t.ne, t.data);
    return w.to_bytes();
  }
};

gguf::Value str_value(const std::string& s) {
  gguf::Value v;
  v.type = gguf::ValueType::STRING;
  v.str = s;
  return v;
}
gguf::Value f32_value(float f) {
  gguf::Value v;
  v.type = gguf::ValueType::F32;
  v.f = f;
  return v;
}
gguf::Value u32_array(std::vector<uint32_t> xs) {
  gguf::Value v;
  v.type = gguf::ValueType::ARRAY;
  v.elem_type = gguf::ValueType::U32;
  for (uint32_t x : xs) {
    gguf::Value e;
    e.type = gguf::ValueType::U32;
    e.u = x;
    v.array.push_back(e);
  }
  return v;
}

// Loads a model image, expecting gguf::Error mentioning `needle`.
void expect_load_error(const std::vector<uint8_t>& b, const std::string& needle) {
  Model::LoadOptions opts;
  opts.verbose = false;
  try {
    Model::load_buffer(b.data(), b.size(), "hostile.gguf", opts);
    ADD_FAILURE() << "loaded without error; expected '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

constexpr uint32_t kF32 = 0;

}  // namespace

// ---- the base case: the attacks below fail for their own reason, not a broken base ----

TEST(HostileGguf, MicroModelLoadsFromMemoryAndRewritten) {
  Model::LoadOptions opts;
  opts.verbose = false;
  auto m = Model::load_buffer(micro_bytes().data(), micro_bytes().size(), "micro.gguf", opts);
  EXPECT_EQ(m->hparams().n_layer, 2);
  EXPECT_EQ(m->hparams().n_vocab, 273);
  const std::vector<uint8_t> b = ModelImage().bytes();
  EXPECT_NO_THROW(Model::load_buffer(b.data(), b.size(), "rewritten.gguf", opts));
}

// ---- GGUF container -----------------------------------------------------------------------

TEST(HostileGguf, TensorByteSizeOverflows64Bits) {
  // 2^32 x 2^30 f32 elements = 2^62 elements (fits int64) but 2^64 bytes (does not fit).
  Bytes a;
  a.header(1, 0).tensor("w", {int64_t(1) << 32, int64_t(1) << 30}, kF32, 0).pad_to(32, 64);
  expect_parse_error(a.b, "overflows");
  // Element count itself overflowing int64: 2^31 * 2^31 * 4.
  Bytes b;
  b.header(1, 0).tensor("w", {int64_t(1) << 31, int64_t(1) << 31, 4}, kF32, 0).pad_to(32, 64);
  expect_parse_error(b.b, "element count overflows");
  // The largest single dimension.
  Bytes c;
  c.header(1, 0).tensor("w", {std::numeric_limits<int64_t>::max()}, 8 /* q8_0 */, 0).pad_to(32, 64);
  expect_parse_error(c.b, "not a multiple");  // ne[0] % 32 != 0 is caught before the size
}

TEST(HostileGguf, NegativeAndZeroDimensions) {
  for (int64_t d : {int64_t(0), int64_t(-1), std::numeric_limits<int64_t>::min()}) {
    Bytes a;
    a.header(1, 0).tensor("w", {4, d}, kF32, 0).pad_to(32, 64);
    expect_parse_error(a.b, "expected > 0");
  }
}

TEST(HostileGguf, StringLengthsNear2To64) {
  for (uint64_t len : {~uint64_t(0), ~uint64_t(0) - 7, uint64_t(1) << 63, uint64_t(1) << 40}) {
    Bytes key;  // key name length
    key.header(0, 1).put<uint64_t>(len);
    key.b.resize(key.b.size() + 64, 'a');
    expect_parse_error(key.b, "extends past end of file");
    Bytes val;  // string value length
    val.header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(len);
    val.b.resize(val.b.size() + 64, 'a');
    expect_parse_error(val.b, "extends past end of file");
    Bytes name;  // tensor name length
    name.header(1, 0).put<uint64_t>(len);
    name.b.resize(name.b.size() + 64, 'a');
    expect_parse_error(name.b, "extends past end of file");
  }
}

TEST(HostileGguf, ArrayCountsNear2To64) {
  for (uint32_t elem : {0u /* u8 */, 8u /* string */, 9u /* array */, 12u /* f64 */}) {
    for (uint64_t count : {~uint64_t(0), ~uint64_t(0) / 8 + 1, uint64_t(1) << 32}) {
      Bytes a;
      a.header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(elem).put<uint64_t>(count);
      a.b.resize(a.b.size() + 256, 0);
      expect_parse_error(a.b, "cannot fit in the file");
    }
  }
  // Tensor and key counts near 2^64 are refused before anything is reserved.
  Bytes t;
  t.header(~uint64_t(0), 0).pad_to(32, 64);
  expect_parse_error(t.b, "tensor count");
  Bytes k;
  k.header(0, ~uint64_t(0) / 2).pad_to(32, 64);
  expect_parse_error(k.b, "key count");
}

TEST(HostileGguf, TensorOffsetsPastTheFile) {
  // Offset + size past the end, offset wrapping around 2^64, size right to the last byte.
  Bytes a;
  a.header(1, 0).tensor("w", {8}, kF32, 32).pad_to(32, 32);
  expect_parse_error(a.b, "extends past end of file");
  Bytes b;
  b.header(1, 0).tensor("w", {8}, kF32, ~uint64_t(0) - 31).pad_to(32, 64);
  expect_parse_error(b.b, "overflows");
  Bytes ok;  // exactly fits: accepted, and its data is the last 32 bytes
  ok.header(1, 0).tensor("w", {8}, kF32, 0).pad_to(32, 32);
  auto f = gguf::File::parse_buffer(ok.b.data(), ok.b.size(), "ok.gguf");
  EXPECT_EQ(f->tensors()[0].data + 32, ok.b.data() + ok.b.size());
}

TEST(HostileGguf, TooManyDimsUnknownTypeMisalignedDuplicateOverlapping) {
  Bytes dims;
  dims.header(1, 0).tensor("w", {1, 1, 1, 1, 1}, kF32, 0).pad_to(32, 64);
  expect_parse_error(dims.b, "n_dims 5");
  Bytes dims_huge;
  dims_huge.header(1, 0).str("w").put<uint32_t>(0xffffffffu).pad_to(32, 64);
  expect_parse_error(dims_huge.b, "n_dims 4294967295");
  for (uint32_t type : {4u, 5u, 31u, 999u, 0xffffffffu}) {  // 4, 5: removed q4_2 / q4_3
    Bytes t;
    t.header(1, 0).tensor("w", {32}, type, 0).pad_to(32, 256);
    expect_parse_error(t.b, "unknown ggml type id");
  }
  Bytes mis;
  mis.header(1, 0).tensor("w", {4}, kF32, 1).pad_to(32, 64);
  expect_parse_error(mis.b, "misaligned");
  Bytes dup;
  dup.header(2, 0).tensor("w", {4}, kF32, 0).tensor("w", {4}, kF32, 32).pad_to(32, 64);
  expect_parse_error(dup.b, "duplicate tensor name");
  Bytes overlap;  // two tensors aliasing the same bytes
  overlap.header(2, 0).tensor("a", {16}, kF32, 0).tensor("b", {16}, kF32, 32).pad_to(32, 128);
  expect_parse_error(overlap.b, "overlap");
}

// ---- step35 model loader --------------------------------------------------------------------

TEST(HostileModel, RequiredKeysOfTheWrongType) {
  {
    ModelImage m;
    m.set("step35.embedding_length", str_value("16"));
    expect_load_error(m.bytes(), "step35.embedding_length");
  }
  {
    ModelImage m;
    m.set("step35.block_count", f32_value(2.0f));
    expect_load_error(m.bytes(), "step35.block_count");
  }
  {
    ModelImage m;
    m.set("general.architecture", u32_array({1, 2}));
    expect_load_error(m.bytes(), "general.architecture");
  }
  {
    ModelImage m;  // per-layer array with the wrong length
    m.set("step35.attention.head_count", u32_array({2, 2, 2}));
    expect_load_error(m.bytes(), "step35.attention.head_count");
  }
  {
    ModelImage m;
    m.set("tokenizer.ggml.tokens", u32_array({1, 2, 3}));
    expect_load_error(m.bytes(), "tokenizer.ggml.tokens");
  }
  {
    ModelImage m;  // out-of-range values of the right type
    gguf::Value v;
    v.type = gguf::ValueType::U32;
    v.u = 0xffffffffu;
    m.set("step35.block_count", v);
    expect_load_error(m.bytes(), "step35.block_count");
  }
}

TEST(HostileModel, VocabularyLargerThanEmbeddingRows) {
  // 273 tokens but only 200 embedding/output rows: an id >= 200 would read past the table.
  ModelImage m;
  for (const char* name : {"token_embd.weight", "output.weight"}) {
    ModelImage::T& t = m.tensor(name);
    const size_t row = t.data.size() / size_t(t.ne[1]);
    t.ne[1] = 200;
    t.data.resize(row * 200);
  }
  expect_load_error(m.bytes(), "tokenizer has 273 tokens");
}

TEST(HostileModel, TensorShapeDisagreesWithMetadata) {
  ModelImage m;
  gguf::Value v;
  v.type = gguf::ValueType::U32;
  v.u = 32;  // tensors are {16, ...}
  m.set("step35.embedding_length", v);
  expect_load_error(m.bytes(), "has shape");
}

TEST(HostileModel, EveryTruncationOfTheMicroModelIsRefused) {
  // Every prefix of a valid file (a download cut short) is a clean gguf::Error.
  const std::vector<uint8_t>& full = micro_bytes();
  Model::LoadOptions opts;
  opts.verbose = false;
  for (size_t n = 0; n < full.size(); n += (n < 9000 ? 7 : 997)) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + ptrdiff_t(n));
    EXPECT_THROW(Model::load_buffer(cut.data(), cut.size(), "cut.gguf", opts), Error) << n << " bytes";
  }
}

// ---- tokenizer ------------------------------------------------------------------------------

TEST(HostileTokenizer, InputWhoseTokenCountCouldOverflow32BitsIsRefused) {
  auto f = gguf::File::parse_buffer(micro_bytes().data(), micro_bytes().size(), "micro.gguf");
  auto tok = Tokenizer::from_gguf(*f);
  // 2^31 bytes can become 2^31 tokens (one per byte), past int32 positions and ids. The
  // text is a reserved, never-touched mapping: the check must come before any scan.
  const size_t n = size_t(1) << 31;
  void* p = mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::string_view huge(static_cast<const char*>(p), n);
  EXPECT_THROW(tok->encode(huge, true, true), std::length_error);
  EXPECT_THROW(tok->encode(huge.substr(0, Tokenizer::kMaxEncodeBytes + 1), false, false), std::length_error);
  munmap(p, n);
  EXPECT_LT(Tokenizer::kMaxEncodeBytes, size_t(std::numeric_limits<int32_t>::max()));
}

TEST(HostileTokenizer, InvalidUtf8RoundTripsByteExactly) {
  // Byte-level BPE: any bytes encode (lone continuation bytes, overlongs, surrogates,
  // 0xFF, truncated sequences) and decode back to exactly the same bytes.
  auto f = gguf::File::parse_buffer(micro_bytes().data(), micro_bytes().size(), "micro.gguf");
  auto tok = Tokenizer::from_gguf(*f);
  for (std::string s : {std::string("\xff"), std::string("\x80\x80"), std::string("\xc0\xaf"),
                        std::string("\xed\xa0\x80"), std::string("ab\xe2\x82"), std::string("\xf4\x90\x80\x80"),
                        std::string("x\0y", 3)}) {
    std::vector<TokenId> ids = tok->encode(s, false, true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(tok->decode(ids), s);
  }
  EXPECT_THROW(tok->decode({-1}), std::out_of_range);
  EXPECT_THROW(tok->decode({273}), std::out_of_range);
}

// ---- the CLI on hostile input ---------------------------------------------------------------

namespace {
std::string bin() { return st::step35_binary(); }
}  // namespace

TEST(HostileCli, CorruptModelFilesGiveAClearErrorAndExitStatus1) {
  const std::string dir = st::tmp_dir();
  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  files.push_back({"empty.gguf", {}});
  files.push_back({"not-gguf.gguf", {'h', 'e', 'l', 'l', 'o', '\n'}});
  files.push_back({"truncated.gguf", std::vector<uint8_t>(micro_bytes().begin(), micro_bytes().begin() + 5000)});
  Bytes huge;
  huge.header(1, 0).tensor("w", {int64_t(1) << 32, int64_t(1) << 30}, kF32, 0).pad_to(32, 64);
  files.push_back({"overflow.gguf", huge.b});
  ModelImage wrong;
  wrong.set("step35.embedding_length", str_value("16"));
  files.push_back({"wrong-type.gguf", wrong.bytes()});
  for (const auto& [name, bytes] : files) {
    const std::string path = dir + "/hostile-" + name;
    st::write_bytes(path, bytes);
    std::string out, err;
    const int rc = st::run_command(bin() + " run -m '" + path + "' -p hi -n 2", &out, &err);
    EXPECT_EQ(rc, 1) << name << ": " << err;
    EXPECT_NE(err.find("error"), std::string::npos) << name << ": " << err;
    EXPECT_NE(err.find("hostile-" + name), std::string::npos) << "the message names the file: " << err;
    EXPECT_EQ(err.find("Sanitizer"), std::string::npos) << err;
  }
  std::string out, err;
  EXPECT_EQ(st::run_command(bin() + " run -m '" + dir + "/no-such-file.gguf' -p hi -n 2", &out, &err), 1);
  EXPECT_NE(err.find("no-such-file.gguf"), std::string::npos) << err;
}

TEST(HostileCli, InvalidUtf8PromptIsAcceptedByteForByte) {
  // The tokenizer is byte-level: an invalid-UTF-8 prompt is not an error, it is tokenized
  // byte for byte (documented in docs/reliability.md). Generated bytes are printed as they
  // are decoded, so stdout may hold invalid UTF-8 too.
  std::string out, err;
  const int rc = st::run_command(bin() + " run -m '" + micro_model_path() + "' -p \"$(printf '\\377\\376\\303')\" -n 4 --seed 1",
                                 &out, &err);
  EXPECT_EQ(rc, 0) << err;
  std::string tok_out;
  ASSERT_EQ(st::run_command(bin() + " tokenize -m '" + micro_model_path() + "' -p \"$(printf '\\377\\376\\303')\"", &tok_out, &err), 0)
      << err;
  EXPECT_FALSE(tok_out.empty());
}

TEST(HostileCli, PromptLongerThanTheContextIsAClearError) {
  std::string out, err;
  const int rc = st::run_command(bin() + " run -m '" + micro_model_path() + "' -c 16 -n 2 -p '" + std::string(200, 'x') +
                                 " " + std::string(200, 'y') + "'", &out, &err);
  EXPECT_NE(rc, 0);
  EXPECT_EQ(rc, 2) << "a usage error: " << err;
  EXPECT_NE(err.find("does not fit the context"), std::string::npos) << err;
  // A prompt that fits runs.
  EXPECT_EQ(st::run_command(bin() + " run -m '" + micro_model_path() + "' -c 64 -n 2 -p hello", &out, &err), 0) << err;
}
