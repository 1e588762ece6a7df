// GGUF reader. The input is untrusted (models are downloaded from strangers), so every
// read is bounds-checked, every size computed from file contents is overflow-checked, and
// every count is checked against the bytes that are left before anything is allocated.
// All failures are gguf::Error with a one-line message naming the file and the offset,
// key or tensor concerned.

#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>

#include "tensor/dtype.h"

namespace step35::gguf {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader reads little-endian fields with memcpy");
static_assert(sizeof(size_t) == sizeof(uint64_t), "64-bit host assumed for file offsets");

namespace {

// Each array element becomes a Value (~100 bytes), so a file of N bytes could otherwise ask
// for ~100·N bytes of memory. Real models hold well under 2M array elements in total
// (tokens + scores + types + merges); 2^24 keeps the worst case bounded.
constexpr uint64_t kMaxArrayElementsPerFile = uint64_t(1) << 24;
constexpr uint32_t kMaxDims = 4;
// Quoted names in messages are cut to this many bytes.
constexpr size_t kMaxQuotedBytes = 96;
// Smallest possible encodings, used to reject counts that cannot fit in the bytes left.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, value type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, ne[0], type, offset

std::string u64s(uint64_t v) { return std::to_string(v); }

// Untrusted bytes (key and tensor names, file names) made safe for a one-line message.
std::string quoted(std::string_view s) {
  std::string out = "'";
  size_t n = std::min(s.size(), kMaxQuotedBytes);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  if (s.size() > n) out += "...";
  out += "'";
  return out;
}

// A path given by the caller, with control characters replaced so messages stay one line.
std::string one_line(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

uint64_t min_encoded_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;       // length prefix
    case ValueType::ARRAY: return 4 + 8;    // element type + count
  }
  return 1;
}

bool is_unsigned_type(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed_type(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_integer_type(ValueType t) { return is_unsigned_type(t) || is_signed_type(t); }
bool is_float_type(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

// A value for an error message: short, one line.
std::string brief(const Value& v) {
  std::string s = v.to_string(4);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string type_desc(const Value& v) {
  if (v.type == ValueType::ARRAY) return std::string("array<") + value_type_name(v.elem_type) + ">";
  return value_type_name(v.type);
}

// Integer conversions with range checks (false when v is not an integer or out of range).
bool int_to_u64(const Value& v, uint64_t* out) {
  if (is_unsigned_type(v.type)) { *out = v.u; return true; }
  if (is_signed_type(v.type) && v.i >= 0) { *out = static_cast<uint64_t>(v.i); return true; }
  return false;
}
bool int_to_i64(const Value& v, int64_t* out) {
  if (is_signed_type(v.type)) { *out = v.i; return true; }
  if (is_unsigned_type(v.type) && v.u <= uint64_t(std::numeric_limits<int64_t>::max())) {
    *out = static_cast<int64_t>(v.u);
    return true;
  }
  return false;
}
bool int_to_u32(const Value& v, uint32_t* out) {
  uint64_t u = 0;
  if (!int_to_u64(v, &u) || u > std::numeric_limits<uint32_t>::max()) return false;
  *out = static_cast<uint32_t>(u);
  return true;
}
bool int_to_i32(const Value& v, int32_t* out) {
  int64_t i = 0;
  if (!int_to_i64(v, &i) || i < std::numeric_limits<int32_t>::min() ||
      i > std::numeric_limits<int32_t>::max()) return false;
  *out = static_cast<int32_t>(i);
  return true;
}
// F32/F64 or integer to float. A finite double beyond float's range is refused (the cast
// would be undefined behaviour); NaN and infinities pass through.
bool num_to_f32(const Value& v, float* out) {
  if (is_float_type(v.type)) {
    if (std::isfinite(v.f) && std::fabs(v.f) > double(std::numeric_limits<float>::max())) return false;
    *out = static_cast<float>(v.f);
    return true;
  }
  if (is_unsigned_type(v.type)) { *out = static_cast<float>(v.u); return true; }
  if (is_signed_type(v.type)) { *out = static_cast<float>(v.i); return true; }
  return false;
}

std::string format_float(double d, bool single) {
  // A hand-made F32 Value may hold a double beyond float's range; narrowing it would be UB.
  if (single && std::isfinite(d) && std::fabs(d) > double(std::numeric_limits<float>::max())) single = false;
  char buf[64];
  std::to_chars_result r = single ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(d))
                                  : std::to_chars(buf, buf + sizeof buf, d);
  if (r.ec != std::errc()) return "?";
  return std::string(buf, r.ptr);
}

// For `inspect`: a double-quoted string with control characters escaped.
std::string display_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += "\"";
  return out;
}

// One parsed file (one part of a split model).
struct Part {
  uint32_t version = 0;
  uint32_t alignment = kDefaultAlignment;
  std::map<std::string, Value> kv;
  std::vector<TensorInfo> tensors;
  uint64_t data_offset = 0;
};

// Bounds-checked little-endian cursor over the file bytes.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& name)
      : data_(data), size_(size), name_(one_line(name)) {}

  size_t pos() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }
  const std::string& name() const { return name_; }
  // What is being read ("key 'general.name'", "tensor 'x'"); prefixed to messages.
  void set_context(std::string ctx) { ctx_ = std::move(ctx); }

  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(name_ + ": " + (ctx_.empty() ? "" : ctx_ + ": ") + msg);
  }

  void need(size_t n, const char* what) const {
    if (n > remaining()) {
      fail(std::string("truncated file: ") + what + " at offset " + u64s(pos_) + " (expected " +
           u64s(n) + " bytes, " + u64s(remaining()) + " left in a file of " + u64s(size_) + ")");
    }
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    size_t len_pos = pos_;
    uint64_t len = read<uint64_t>(what);
    if (len > remaining()) {
      fail(std::string(what) + " length " + u64s(len) + " at offset " + u64s(len_pos) +
           " extends past end of file (expected at most " + u64s(remaining()) +
           " bytes, file size " + u64s(size_) + ")");
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  Value read_value(ValueType type, uint32_t depth) {
    Value v;
    v.type = type;
    switch (type) {
      case ValueType::U8: v.u = read<uint8_t>("u8 value"); break;
      case ValueType::I8: v.i = read<int8_t>("i8 value"); break;
      case ValueType::U16: v.u = read<uint16_t>("u16 value"); break;
      case ValueType::I16: v.i = read<int16_t>("i16 value"); break;
      case ValueType::U32: v.u = read<uint32_t>("u32 value"); break;
      case ValueType::I32: v.i = read<int32_t>("i32 value"); break;
      case ValueType::U64: v.u = read<uint64_t>("u64 value"); break;
      case ValueType::I64: v.i = read<int64_t>("i64 value"); break;
      case ValueType::F32: v.f = read<float>("f32 value"); break;
      case ValueType::F64: v.f = read<double>("f64 value"); break;
      // Any non-zero byte is true, as other readers do.
      case ValueType::BOOL: v.u = read<uint8_t>("bool value") != 0 ? 1 : 0; break;
      case ValueType::STRING: v.str = read_string("string"); break;
      case ValueType::ARRAY: read_array(&v, depth); break;
    }
    return v;
  }

 private:
  void read_array(Value* v, uint32_t depth) {
    size_t start = pos_;
    if (depth >= kMaxArrayDepth) {
      fail("arrays nested deeper than " + u64s(kMaxArrayDepth) + " levels at offset " + u64s(start) +
           " (expected at most " + u64s(kMaxArrayDepth) + ")");
    }
    uint32_t elem = read<uint32_t>("array element type");
    if (!valid_value_type(elem)) {
      fail("unknown array element type " + u64s(elem) + " at offset " + u64s(start) +
           " (expected 0..12)");
    }
    ValueType et = static_cast<ValueType>(elem);
    size_t count_pos = pos_;
    uint64_t count = read<uint64_t>("array count");
    // Reject before allocating: each element needs at least min_encoded_bytes.
    uint64_t max_fit = remaining() / min_encoded_bytes(et);
    if (count > max_fit) {
      fail("array count " + u64s(count) + " at offset " + u64s(count_pos) +
           " cannot fit in the file (expected at most " + u64s(max_fit) + " " +
           value_type_name(et) + " elements in the " + u64s(remaining()) + " bytes left)");
    }
    if (count > elements_left_) {
      fail("array count " + u64s(count) + " at offset " + u64s(count_pos) +
           " exceeds the limit on array elements per file (expected at most " +
           u64s(kMaxArrayElementsPerFile) + " in total)");
    }
    elements_left_ -= count;
    v->elem_type = et;
    v->array.reserve(static_cast<size_t>(count));
    for (uint64_t k = 0; k < count; k++) v->array.push_back(read_value(et, depth + 1));
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string name_;
  std::string ctx_;
  uint64_t elements_left_ = kMaxArrayElementsPerFile;
};

// Fixed header: magic, version, tensor count, key count. Sets part.version; the counts are
// checked against the bytes left before anything is allocated for them.
struct HeaderCounts {
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
};

HeaderCounts read_header(Reader& r, const uint8_t* data, Part& part) {
  r.need(4, "magic");
  if (std::memcmp(data, "GGUF", 4) != 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%02x %02x %02x %02x", data[0], data[1], data[2], data[3]);
    r.fail(std::string("bad magic ") + buf + " at offset 0 (expected \"GGUF\" = 47 47 55 46)");
  }
  r.read<uint32_t>("magic");
  uint32_t version = r.read<uint32_t>("version");
  if (version != 2 && version != 3) {
    // Versions 2 and 3 share the little-endian layout (v3 only added big-endian files).
    uint32_t swapped = ((version & 0xffu) << 24) | ((version & 0xff00u) << 8) |
                       ((version >> 8) & 0xff00u) | (version >> 24);
    if (swapped == 2 || swapped == 3) {
      r.fail("big-endian GGUF (version bytes " + u64s(version) +
             ") at offset 4 is not supported (expected a little-endian file, version 2 or 3)");
    }
    r.fail("unsupported GGUF version " + u64s(version) + " at offset 4 (expected 2 or 3)");
  }
  part.version = version;
  HeaderCounts c;
  c.n_tensors = r.read<uint64_t>("tensor count");
  size_t kv_count_pos = r.pos();
  c.n_kv = r.read<uint64_t>("key count");
  if (c.n_tensors > r.remaining() / kMinTensorInfoBytes) {
    r.fail("tensor count " + u64s(c.n_tensors) + " at offset 8 cannot fit in the file (expected at most " +
           u64s(r.remaining() / kMinTensorInfoBytes) + " for the " + u64s(r.remaining()) +
           " bytes left)");
  }
  if (c.n_kv > r.remaining() / kMinKvBytes) {
    r.fail("key count " + u64s(c.n_kv) + " at offset " + u64s(kv_count_pos) +
           " cannot fit in the file (expected at most " + u64s(r.remaining() / kMinKvBytes) +
           " for the " + u64s(r.remaining()) + " bytes left)");
  }
  return c;
}

// The n_kv key/value pairs into part.kv; returns the file offset of each key (for messages).
std::map<std::string, size_t> read_metadata(Reader& r, uint64_t n_kv, Part& part) {
  std::map<std::string, size_t> key_offsets;
  for (uint64_t k = 0; k < n_kv; k++) {
    r.set_context("key #" + u64s(k));
    size_t key_pos = r.pos();
    std::string key = r.read_string("key");
    r.set_context("key " + quoted(key));
    auto seen = key_offsets.find(key);
    if (seen != key_offsets.end()) {
      r.fail("duplicate key at offset " + u64s(key_pos) + " (expected each key once; first at offset " +
             u64s(seen->second) + ")");
    }
    size_t type_pos = r.pos();
    uint32_t type = r.read<uint32_t>("value type");
    if (!valid_value_type(type)) {
      r.fail("unknown value type " + u64s(type) + " at offset " + u64s(type_pos) + " (expected 0..12)");
    }
    Value v = r.read_value(static_cast<ValueType>(type), 0);
    key_offsets.emplace(key, key_pos);
    part.kv.emplace(std::move(key), std::move(v));
  }
  r.set_context("");
  return key_offsets;
}

// general.alignment, when present, replaces the default alignment of tensor data.
void read_alignment(Reader& r, const std::map<std::string, size_t>& key_offsets, Part& part) {
  auto align_it = part.kv.find("general.alignment");
  if (align_it == part.kv.end()) return;
  const Value& a = align_it->second;
  r.set_context("key 'general.alignment'");
  std::string at = " at offset " + u64s(key_offsets.at("general.alignment"));
  if (a.type != ValueType::U32) {
    r.fail("has type " + type_desc(a) + at + " (expected u32)");
  }
  if (a.u == 0 || (a.u & (a.u - 1)) != 0) {
    r.fail("alignment " + u64s(a.u) + at + " is not a power of two (expected 1, 2, 4, ... e.g. 32)");
  }
  part.alignment = static_cast<uint32_t>(a.u);
  r.set_context("");
}

// The t.n_dims dimensions of a tensor, each positive, their product within int64.
void read_dimensions(Reader& r, TensorInfo& t) {
  int64_t n_elements = 1;
  for (uint32_t d = 0; d < t.n_dims; d++) {
    size_t dim_pos = r.pos();
    int64_t ne = r.read<int64_t>("dimension");
    if (ne <= 0) {
      r.fail("dimension ne[" + u64s(d) + "] = " + std::to_string(ne) + " at offset " + u64s(dim_pos) +
             " (expected > 0)");
    }
    if (__builtin_mul_overflow(n_elements, ne, &n_elements)) {
      r.fail("element count overflows int64 at dimension ne[" + u64s(d) + "] = " + std::to_string(ne) +
             " at offset " + u64s(dim_pos) + " (expected a product below 2^63)");
    }
    t.ne[d] = ne;
  }
}

// One tensor info: name, shape, ggml type and data offset (relative to the data section).
TensorInfo read_tensor_info(Reader& r, const std::map<std::string, size_t, std::less<>>& tensor_offsets,
                            uint32_t alignment) {
  size_t info_pos = r.pos();
  TensorInfo t;
  t.name = r.read_string("tensor name");
  if (t.name.empty()) r.fail("empty tensor name at offset " + u64s(info_pos) + " (expected a name)");
  r.set_context("tensor " + quoted(t.name));
  auto seen = tensor_offsets.find(t.name);
  if (seen != tensor_offsets.end()) {
    r.fail("duplicate tensor name at offset " + u64s(info_pos) +
           " (expected each name once; first at offset " + u64s(seen->second) + ")");
  }
  size_t dims_pos = r.pos();
  t.n_dims = r.read<uint32_t>("n_dims");
  if (t.n_dims == 0 || t.n_dims > kMaxDims) {
    r.fail("n_dims " + u64s(t.n_dims) + " at offset " + u64s(dims_pos) + " (expected 1 to 4)");
  }
  read_dimensions(r, t);
  size_t type_pos = r.pos();
  t.type = r.read<uint32_t>("ggml type");
  const DTypeInfo* info = dtype_info(t.type);
  if (info == nullptr) {
    r.fail("unknown ggml type id " + u64s(t.type) + " at offset " + u64s(type_pos) +
           " (expected a supported type: " + dtype_names() + ")");
  }
  if (t.ne[0] % info->block_elems != 0) {
    r.fail("ne[0] = " + std::to_string(t.ne[0]) + " at offset " + u64s(dims_pos + 4) +
           " is not a multiple of the " + info->name + " block size (expected a multiple of " +
           std::to_string(info->block_elems) + ")");
  }
  std::optional<uint64_t> nbytes = tensor_nbytes(t.type, t.ne, t.n_dims);
  if (!nbytes) {
    r.fail("byte size of " + std::string(info->name) + " shape overflows at offset " + u64s(dims_pos) +
           " (expected a size below 2^64)");
  }
  t.nbytes = *nbytes;
  size_t offset_pos = r.pos();
  t.offset = r.read<uint64_t>("data offset");
  if (t.offset % alignment != 0) {
    r.fail("data offset " + u64s(t.offset) + " at offset " + u64s(offset_pos) +
           " is misaligned (expected a multiple of the alignment " + u64s(alignment) + ")");
  }
  return t;
}

void read_tensor_infos(Reader& r, uint64_t n_tensors, Part& part) {
  std::map<std::string, size_t, std::less<>> tensor_offsets;
  part.tensors.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t ti = 0; ti < n_tensors; ti++) {
    r.set_context("tensor #" + u64s(ti));
    size_t info_pos = r.pos();
    TensorInfo t = read_tensor_info(r, tensor_offsets, part.alignment);
    tensor_offsets.emplace(t.name, info_pos);
    part.tensors.push_back(std::move(t));
  }
  r.set_context("");
}

// Data section: header end rounded up to the alignment. Points each tensor at its bytes,
// which must lie inside the file.
void place_tensor_data(const Reader& r, const uint8_t* data, size_t size, Part& part) {
  uint64_t header_end = r.pos();
  uint64_t rem = header_end % part.alignment;
  uint64_t data_offset = header_end;
  if (rem != 0 && __builtin_add_overflow(header_end, uint64_t(part.alignment) - rem, &data_offset)) {
    r.fail("data section offset overflows (header ends at " + u64s(header_end) + ")");
  }
  part.data_offset = data_offset;

  for (TensorInfo& t : part.tensors) {
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_offset, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.nbytes, &end)) {
      r.fail("tensor " + quoted(t.name) + " data offset " + u64s(t.offset) + " + size " + u64s(t.nbytes) +
             " overflows (file size " + u64s(size) + ")");
    }
    if (end > size) {
      r.fail("tensor " + quoted(t.name) + " data [" + u64s(begin) + ", " + u64s(end) +
             ") extends past end of file (size " + u64s(size) + ")");
    }
    t.data = data + begin;
  }
}

// No two tensors may share bytes (a crafted file could alias a weight with another).
void check_tensors_disjoint(const Reader& r, const Part& part) {
  const uint64_t data_offset = part.data_offset;
  std::vector<size_t> order(part.tensors.size());
  for (size_t k = 0; k < order.size(); k++) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return part.tensors[a].offset < part.tensors[b].offset;
  });
  for (size_t k = 1; k < order.size(); k++) {
    const TensorInfo& prev = part.tensors[order[k - 1]];
    const TensorInfo& cur = part.tensors[order[k]];
    if (cur.offset < prev.offset + prev.nbytes) {  // cannot overflow: checked in place_tensor_data
      r.fail("tensors " + quoted(prev.name) + " [" + u64s(data_offset + prev.offset) + ", " +
             u64s(data_offset + prev.offset + prev.nbytes) + ") and " + quoted(cur.name) + " [" +
             u64s(data_offset + cur.offset) + ", " + u64s(data_offset + cur.offset + cur.nbytes) +
             ") overlap (expected disjoint data)");
    }
  }
}

Part parse_part(const uint8_t* data, size_t size, const std::string& name) {
  Reader r(data, size, name);
  Part part;
  const HeaderCounts counts = read_header(r, data, part);
  const std::map<std::string, size_t> key_offsets = read_metadata(r, counts.n_kv, part);
  read_alignment(r, key_offsets, part);
  read_tensor_infos(r, counts.n_tensors, part);
  place_tensor_data(r, data, size, part);
  check_tensors_disjoint(r, part);
  return part;
}

// Optional non-negative integer key of one part, at most `max`.
std::optional<uint64_t> part_uint(const std::map<std::string, Value>& kv, const char* key,
                                  uint64_t max, const std::string& file) {
  auto it = kv.find(key);
  if (it == kv.end()) return std::nullopt;
  uint64_t u = 0;
  if (!int_to_u64(it->second, &u) || u > max) {
    throw Error(one_line(file) + ": key " + quoted(key) + " is " + brief(it->second) + " of type " +
                type_desc(it->second) + " (expected an integer in 0.." + u64s(max) + ")");
  }
  return u;
}

// "<prefix>-00001-of-00003.gguf" split into its parts.
struct SplitName {
  std::string prefix;   // up to (not including) "-00001"
  size_t no_width = 0;  // digits used for the part number
  uint64_t no = 0;      // 1-based
  std::string count_text;
  uint64_t count = 0;
};

std::optional<SplitName> parse_split_name(const std::string& path) {
  const std::string ext = ".gguf";
  if (path.size() < ext.size() || path.compare(path.size() - ext.size(), ext.size(), ext) != 0) {
    return std::nullopt;
  }
  std::string stem = path.substr(0, path.size() - ext.size());
  auto digits_before = [&](size_t end) {
    size_t b = end;
    while (b > 0 && stem[b - 1] >= '0' && stem[b - 1] <= '9') b--;
    return b;
  };
  size_t count_end = stem.size();
  size_t count_begin = digits_before(count_end);
  // At most 9 digits so the number fits comfortably in uint64.
  if (count_begin == count_end || count_end - count_begin > 9) return std::nullopt;
  const std::string of = "-of-";
  if (count_begin < of.size() || stem.compare(count_begin - of.size(), of.size(), of) != 0) {
    return std::nullopt;
  }
  size_t no_end = count_begin - of.size();
  size_t no_begin = digits_before(no_end);
  if (no_begin == no_end || no_end - no_begin > 9 || no_begin == 0 || stem[no_begin - 1] != '-') {
    return std::nullopt;
  }
  SplitName s;
  s.prefix = stem.substr(0, no_begin - 1);
  s.no_width = no_end - no_begin;
  s.no = std::stoull(stem.substr(no_begin, s.no_width));
  s.count_text = stem.substr(count_begin);
  s.count = std::stoull(s.count_text);
  return s;
}

std::string split_part_path(const SplitName& s, uint64_t no) {
  std::string digits = u64s(no);
  if (digits.size() < s.no_width) digits.insert(0, s.no_width - digits.size(), '0');
  return s.prefix + "-" + digits + "-of-" + s.count_text + ".gguf";
}

}  // namespace

// ---------------------------------------------------------------------------------------

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "unknown";
}

bool Value::is_integer() const { return is_integer_type(type); }
bool Value::is_float() const { return is_float_type(type); }

std::string Value::to_string(size_t max_array_items) const {
  switch (type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
      return std::to_string(u);
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      return std::to_string(i);
    case ValueType::F32: return format_float(f, true);
    case ValueType::F64: return format_float(f, false);
    case ValueType::BOOL: return u ? "true" : "false";
    case ValueType::STRING: return display_string(str);
    case ValueType::ARRAY: {
      std::string out = std::string("array<") + value_type_name(elem_type) + ">[" +
                        std::to_string(array.size()) + "] [";
      size_t shown = std::min(array.size(), max_array_items);
      for (size_t k = 0; k < shown; k++) {
        if (k) out += ", ";
        out += array[k].to_string(max_array_items);
      }
      if (array.size() > shown) out += shown ? ", ..." : "...";
      out += "]";
      return out;
    }
  }
  return "?";
}

std::optional<uint64_t> tensor_nbytes(uint32_t type, const int64_t* ne, size_t n_dims) {
  const DTypeInfo* info = dtype_info(type);
  if (info == nullptr || n_dims == 0 || n_dims > kMaxDims) return std::nullopt;
  for (size_t d = 0; d < n_dims; d++) {
    if (ne[d] <= 0) return std::nullopt;
  }
  if (info->block_elems <= 0 || ne[0] % info->block_elems != 0) return std::nullopt;
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(ne[0] / info->block_elems),
                             static_cast<uint64_t>(info->block_bytes), &bytes)) {
    return std::nullopt;
  }
  for (size_t d = 1; d < n_dims; d++) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(ne[d]), &bytes)) return std::nullopt;
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const std::string name = one_line(path);
  auto sys_error = [&](const char* what, int err) {
    return Error(name + ": " + what + ": " + std::error_code(err, std::generic_category()).message());
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw sys_error("cannot open", errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw sys_error("cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(name + ": not a regular file (expected a .gguf file)");
  }
  if (st.st_size <= 0) {
    ::close(fd);
    throw Error(name + ": file is empty (0 bytes; expected a GGUF file)");
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) throw sys_error(("cannot map " + u64s(size) + " bytes").c_str(), err);
  data_ = static_cast<const uint8_t*>(p);
  size_ = size;
}

bool MappedFile::release(const void* p, size_t n) const { return advise(p, n, Access::Release); }

bool MappedFile::advise(const void* p, size_t n, Access access) const {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (b < data_ || n > size_ || size_t(b - data_) > size_ - n) return false;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  // Releasing takes only the pages wholly inside the range (a page shared with a neighbour
  // may still be read); the hints cover every page the range touches.
  const bool inside = access == Access::Release;
  const uintptr_t first = (uintptr_t(b) + (inside ? page - 1 : 0)) / page * page;
  const uintptr_t last = inside ? (uintptr_t(b) + n) / page * page : uintptr_t(b) + n;
  const int advice = access == Access::Release ? MADV_DONTNEED : access == Access::Random ? MADV_RANDOM : MADV_WILLNEED;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, advice);
  return true;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---------------------------------------------------------------------------------------

std::unique_ptr<File> File::parse_buffer(const uint8_t* data, size_t size, const std::string& name) {
  // A split part parsed from memory has no siblings to load: only its own tensors appear,
  // and split.tensors.count is not checked.
  std::unique_ptr<File> f(new File());
  f->path_ = name;
  f->parse(0, data, size, name);
  f->finish();
  return f;
}

void File::release_pages(const void* p, size_t n) const { advise(p, n, MappedFile::Access::Release); }

void File::advise(const void* p, size_t n, MappedFile::Access access) const {
  for (const auto& f : files_)
    if (p == nullptr)
      f->advise(f->data(), f->size(), access);
    else if (f->advise(p, n, access))
      return;
}

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> f(new File());
  f->path_ = path;
  const std::string name = one_line(path);
  f->files_.push_back(std::make_unique<MappedFile>(path));
  f->parse(0, f->files_[0]->data(), f->files_[0]->size(), path);

  uint64_t count = part_uint(f->kv_, "split.count", 0xffff, path).value_or(1);
  if (count > 1) {
    uint64_t no = part_uint(f->kv_, "split.no", 0xffff, path).value_or(0);
    if (no != 0) {
      throw Error(name + ": this is part " + u64s(no + 1) + " of a " + u64s(count) +
                  "-part split model (split.no = " + u64s(no) +
                  "); open part 1 (the file named ...-00001-of-...gguf)");
    }
    std::optional<SplitName> sn = parse_split_name(path);
    if (!sn) {
      throw Error(name + ": split.count is " + u64s(count) +
                  " but the file name does not end in '-00001-of-" + (count < 10 ? "0000" : "") +
                  u64s(count) + ".gguf' (expected the split naming, to find the other parts)");
    }
    if (sn->no != 1 || sn->count != count) {
      throw Error(name + ": file name says part " + u64s(sn->no) + " of " + u64s(sn->count) +
                  " but its metadata says part 1 of " + u64s(count) + " (expected matching names)");
    }
    for (uint64_t k = 1; k < count; k++) {
      std::string part_path = split_part_path(*sn, k + 1);
      try {
        f->files_.push_back(std::make_unique<MappedFile>(part_path));
      } catch (const Error& e) {
        throw Error(name + ": cannot open split part " + u64s(k + 1) + " of " + u64s(count) + ": " +
                    e.what());
      }
      const MappedFile& mf = *f->files_.back();
      f->parse(static_cast<size_t>(k), mf.data(), mf.size(), part_path);
    }
  }
  f->finish();
  return f;
}

void File::parse(size_t file_index, const uint8_t* data, size_t size, const std::string& name) {
  Part part = parse_part(data, size, name);
  if (file_index == 0) {
    version_ = part.version;
    alignment_ = part.alignment;
    kv_ = std::move(part.kv);
  } else {
    // A later split part: its split keys must say where it belongs; its other metadata is
    // ignored (metadata is complete in part 1).
    const std::string pname = one_line(name);
    uint64_t want_count = part_uint(kv_, "split.count", 0xffff, path_).value_or(1);
    std::optional<uint64_t> no = part_uint(part.kv, "split.no", 0xffff, name);
    std::optional<uint64_t> count = part_uint(part.kv, "split.count", 0xffff, name);
    if (!no || *no != file_index) {
      throw Error(pname + ": key 'split.no' is " + (no ? u64s(*no) : std::string("missing")) +
                  " (expected " + u64s(file_index) + " for part " + u64s(file_index + 1) + " of " +
                  u64s(want_count) + ")");
    }
    if (!count || *count != want_count) {
      throw Error(pname + ": key 'split.count' is " + (count ? u64s(*count) : std::string("missing")) +
                  " (expected " + u64s(want_count) + ", as in part 1)");
    }
  }
  for (TensorInfo& t : part.tensors) {
    t.file_index = static_cast<uint32_t>(file_index);
    tensors_.push_back(std::move(t));
  }
  file_sizes_.push_back(size);
  data_offsets_.push_back(part.data_offset);
}

void File::finish() {
  const std::string name = one_line(path_);
  tensor_index_.clear();
  for (size_t k = 0; k < tensors_.size(); k++) {
    auto [it, inserted] = tensor_index_.emplace(tensors_[k].name, k);
    if (!inserted) {  // duplicates within one part were rejected while parsing it
      throw Error(name + ": tensor " + quoted(tensors_[k].name) + " appears in split part " +
                  u64s(tensors_[it->second].file_index + 1) + " and again in part " +
                  u64s(tensors_[k].file_index + 1) + " (expected each name once)");
    }
  }
  uint64_t count = part_uint(kv_, "split.count", 0xffff, path_).value_or(1);
  bool all_parts = count <= 1 || file_sizes_.size() == count;
  std::optional<uint64_t> total =
      part_uint(kv_, "split.tensors.count", uint64_t(std::numeric_limits<int32_t>::max()), path_);
  if (all_parts && total && *total != tensors_.size()) {
    throw Error(name + ": key 'split.tensors.count' is " + u64s(*total) + " but the " +
                u64s(file_sizes_.size()) + " file(s) hold " + u64s(tensors_.size()) +
                " tensors (expected equal)");
  }
}

uint64_t File::total_file_bytes() const {
  uint64_t total = 0;
  for (uint64_t s : file_sizes_) total += s;
  return total;
}

std::string File::part_path(size_t file_index) const {
  return file_index < files_.size() ? files_[file_index]->path() : std::string();
}

uint64_t File::data_offset(size_t file_index) const {
  if (file_index >= data_offsets_.size()) {
    throw Error(one_line(path_) + ": no split part " + u64s(file_index + 1) + " (expected 1.." +
                u64s(data_offsets_.size()) + ")");
  }
  return data_offsets_[file_index];
}

// ---------------------------------------------------------------------------------------
// Metadata getters.

const Value* File::find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void key_error(const std::string& file, std::string_view key, const std::string& what) {
  throw Error(one_line(file) + ": key " + quoted(key) + " " + what);
}

[[noreturn]] void missing_key(const std::string& file, std::string_view key) {
  key_error(file, key, "is missing (expected it to be present)");
}

[[noreturn]] void wrong_value(const std::string& file, std::string_view key, const Value& v,
                              const char* expected) {
  if (v.type == ValueType::ARRAY) {  // the elements say little; the type and count say it all
    key_error(file, key, "has type " + type_desc(v) + " with " + std::to_string(v.array.size()) +
                             " elements (expected " + expected + ")");
  }
  key_error(file, key, "is " + brief(v) + " of type " + type_desc(v) + " (expected " + expected + ")");
}

[[noreturn]] void wrong_element(const std::string& file, std::string_view key, size_t index,
                                const Value& v, const char* expected) {
  key_error(file, key, "element " + std::to_string(index) + " is " + brief(v) + " of type " +
                           type_desc(v) + " (expected " + expected + ")");
}

const char* kExpectU32 = "an integer in 0..4294967295";
const char* kExpectI32 = "an integer in -2147483648..2147483647";
const char* kExpectU64 = "a non-negative integer";
const char* kExpectI64 = "an integer in the int64 range";
const char* kExpectF32 = "a number (f32, f64 or integer) in the float range";
const char* kExpectFloatElem = "an f32 or f64 in the float range";

// Checks the per-layer array length (exactly one element per layer).
void check_layer_count(const std::string& file, std::string_view key, const Value& v, size_t n) {
  if (v.array.size() != n) {
    key_error(file, key, "has " + std::to_string(v.array.size()) + " elements of type " +
                             value_type_name(v.elem_type) + " (expected " + std::to_string(n) +
                             ", one per layer, or a scalar)");
  }
}

bool bool_value(const Value& v, bool* out) {
  if (v.type != ValueType::BOOL) return false;
  *out = v.u != 0;
  return true;
}
// The elements of an array<bool> (its element type already checked).
bool bool_element(const Value& v, bool* out) {
  *out = v.u != 0;
  return true;
}
bool is_bool_type(ValueType t) { return t == ValueType::BOOL; }

// How a value becomes a T: `to` fails for a value out of T's range or of the wrong type,
// `expected` names what would have been accepted.
template <typename T>
struct Conversion {
  bool (*to)(const Value& v, T* out);
  const char* expected;
};

// Key `key` of `file` (v, null when missing) as a T; a missing key or a value the
// conversion rejects throws.
template <typename T>
T required_value(const std::string& file, std::string_view key, const Value* v, const Conversion<T>& conv) {
  if (!v) missing_key(file, key);
  T out{};
  if (!conv.to(*v, &out)) wrong_value(file, key, *v, conv.expected);
  return out;
}

// A per-layer key: a scalar (for every layer) or an array of one element per layer whose
// element type passes elem_type_ok.
template <typename T>
struct PerLayer {
  Conversion<T> scalar;
  bool (*elem_type_ok)(ValueType t);
  const char* expected_array;
  Conversion<T> element;
};

template <typename T>
std::vector<T> values_per_layer(const std::string& file, std::string_view key, const Value* v, size_t n,
                                std::optional<T> dflt, const PerLayer<T>& rule) {
  if (!v) {
    if (dflt) return std::vector<T>(n, *dflt);
    missing_key(file, key);
  }
  if (v->type != ValueType::ARRAY) return std::vector<T>(n, required_value(file, key, v, rule.scalar));
  if (!rule.elem_type_ok(v->elem_type)) wrong_value(file, key, *v, rule.expected_array);
  check_layer_count(file, key, *v, n);
  std::vector<T> out(n);
  for (size_t k = 0; k < n; k++) {
    T value{};
    if (!rule.element.to(v->array[k], &value)) wrong_element(file, key, k, v->array[k], rule.element.expected);
    out[k] = value;
  }
  return out;
}

}  // namespace

uint32_t File::get_u32(std::string_view key) const {
  return required_value(path_, key, find(key), Conversion<uint32_t>{int_to_u32, kExpectU32});
}

uint64_t File::get_u64(std::string_view key) const {
  return required_value(path_, key, find(key), Conversion<uint64_t>{int_to_u64, kExpectU64});
}

int64_t File::get_i64(std::string_view key) const {
  return required_value(path_, key, find(key), Conversion<int64_t>{int_to_i64, kExpectI64});
}

float File::get_f32(std::string_view key) const {
  return required_value(path_, key, find(key), Conversion<float>{num_to_f32, kExpectF32});
}

bool File::get_bool(std::string_view key) const {
  return required_value(path_, key, find(key), Conversion<bool>{bool_value, "a bool"});
}

const std::string& File::get_str(std::string_view key) const {
  const Value* v = find(key);
  if (!v) missing_key(path_, key);
  if (v->type != ValueType::STRING) wrong_value(path_, key, *v, "a string");
  return v->str;
}

const Value& File::get_array(std::string_view key, ValueType elem_type) const {
  const Value* v = find(key);
  if (!v) missing_key(path_, key);
  if (v->type != ValueType::ARRAY || v->elem_type != elem_type) {
    std::string expected = std::string("array<") + value_type_name(elem_type) + ">";
    key_error(path_, key, "has type " + type_desc(*v) + " (expected " + expected + ")");
  }
  return *v;
}

std::optional<uint32_t> File::opt_u32(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_u32(key);
}

std::optional<float> File::opt_f32(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_f32(key);
}

std::optional<bool> File::opt_bool(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_bool(key);
}

std::optional<std::string> File::opt_str(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_str(key);
}

std::vector<uint32_t> File::get_u32_per_layer(std::string_view key, size_t n,
                                              std::optional<uint32_t> dflt) const {
  const PerLayer<uint32_t> rule{{int_to_u32, kExpectU32}, is_integer_type, "an integer or an array of integers",
                                {int_to_u32, kExpectU32}};
  return values_per_layer(path_, key, find(key), n, dflt, rule);
}

std::vector<float> File::get_f32_per_layer(std::string_view key, size_t n,
                                           std::optional<float> dflt) const {
  const PerLayer<float> rule{{num_to_f32, kExpectF32}, is_float_type, "a number or an array of f32/f64",
                             {num_to_f32, kExpectFloatElem}};
  return values_per_layer(path_, key, find(key), n, dflt, rule);
}

std::vector<bool> File::get_bool_per_layer(std::string_view key, size_t n,
                                           std::optional<bool> dflt) const {
  const PerLayer<bool> rule{{bool_value, "a bool"}, is_bool_type, "a bool or an array of bool",
                            {bool_element, "a bool"}};
  return values_per_layer(path_, key, find(key), n, dflt, rule);
}

std::vector<std::string> File::get_str_array(std::string_view key) const {
  const Value& v = get_array(key, ValueType::STRING);
  std::vector<std::string> out;
  out.reserve(v.array.size());
  for (const Value& e : v.array) out.push_back(e.str);
  return out;
}

std::vector<int32_t> File::get_i32_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) missing_key(path_, key);
  if (v->type != ValueType::ARRAY || !is_integer_type(v->elem_type)) {
    wrong_value(path_, key, *v, "an array of integers");
  }
  std::vector<int32_t> out(v->array.size());
  for (size_t k = 0; k < out.size(); k++) {
    if (!int_to_i32(v->array[k], &out[k])) wrong_element(path_, key, k, v->array[k], kExpectI32);
  }
  return out;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace step35::gguf
