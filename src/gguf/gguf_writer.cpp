// GGUF v3 writer. Layout (standard, as llama.cpp writes and reads it): header, KV pairs in
// insertion order, tensor infos, zero padding to the alignment, then each tensor's bytes at
// an aligned offset, each followed by zero padding to the alignment.

#include "gguf/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <type_traits>

#include "tensor/dtype.h"

namespace step35::gguf {

static_assert(std::endian::native == std::endian::little, "the writer emits host-order fields");

namespace {

[[noreturn]] void writer_error(const std::string& msg) { throw Error("gguf writer: " + msg); }

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof v);
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

uint64_t padding(uint64_t n, uint32_t alignment) {
  uint64_t rem = n % alignment;
  return rem == 0 ? 0 : alignment - rem;
}

// Checks that a Value is encodable as its type says (ranges, element types, nesting).
void check_value(const std::string& key, const Value& v, uint32_t depth) {
  auto bad = [&](const std::string& what) { writer_error("key '" + key + "': " + what); };
  auto in_range = [&](int64_t lo, int64_t hi) {
    if (v.i < lo || v.i > hi) bad(std::string(value_type_name(v.type)) + " value " + std::to_string(v.i) + " out of range");
  };
  auto fits = [&](uint64_t hi) {
    if (v.u > hi) bad(std::string(value_type_name(v.type)) + " value " + std::to_string(v.u) + " out of range");
  };
  switch (v.type) {
    case ValueType::U8: fits(0xff); break;
    case ValueType::U16: fits(0xffff); break;
    case ValueType::U32: fits(0xffffffffu); break;
    case ValueType::U64: break;
    case ValueType::BOOL: fits(1); break;
    case ValueType::I8: in_range(-128, 127); break;
    case ValueType::I16: in_range(-32768, 32767); break;
    case ValueType::I32: in_range(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()); break;
    case ValueType::I64: break;
    case ValueType::F32:
      // Narrowing a finite double beyond float's range is undefined behaviour.
      if (std::isfinite(v.f) && std::fabs(v.f) > double(std::numeric_limits<float>::max())) {
        bad("f32 value " + std::to_string(v.f) + " out of range");
      }
      break;
    case ValueType::F64: case ValueType::STRING: break;
    case ValueType::ARRAY:
      if (depth >= kMaxArrayDepth) bad("arrays nested deeper than " + std::to_string(kMaxArrayDepth));
      for (size_t k = 0; k < v.array.size(); k++) {
        if (v.array[k].type != v.elem_type) {
          bad("array element " + std::to_string(k) + " has type " + value_type_name(v.array[k].type) +
              " (expected " + value_type_name(v.elem_type) + ")");
        }
        check_value(key, v.array[k], depth + 1);
      }
      break;
    default:
      bad("unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
  }
}

// The value's bytes without its type tag (array elements carry no per-element tag).
void put_value(std::vector<uint8_t>& out, const Value& v) {
  switch (v.type) {
    case ValueType::U8: put<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
    case ValueType::I8: put<int8_t>(out, static_cast<int8_t>(v.i)); break;
    case ValueType::U16: put<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
    case ValueType::I16: put<int16_t>(out, static_cast<int16_t>(v.i)); break;
    case ValueType::U32: put<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
    case ValueType::I32: put<int32_t>(out, static_cast<int32_t>(v.i)); break;
    case ValueType::U64: put<uint64_t>(out, v.u); break;
    case ValueType::I64: put<int64_t>(out, v.i); break;
    case ValueType::F32: put<float>(out, static_cast<float>(v.f)); break;
    case ValueType::F64: put<double>(out, v.f); break;
    case ValueType::BOOL: put<uint8_t>(out, v.u ? 1 : 0); break;
    case ValueType::STRING: put_string(out, v.str); break;
    case ValueType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.array.size());
      for (const Value& e : v.array) put_value(out, e);
      break;
  }
}

Value scalar(ValueType t) {
  Value v;
  v.type = t;
  return v;
}

// A scalar of type t holding x, in the field of Value that type uses.
template <typename T>
Value scalar_of(ValueType t, const T& x) {
  Value v = scalar(t);
  if constexpr (std::is_same_v<T, std::string>)
    v.str = x;
  else if constexpr (std::is_same_v<T, float>)
    v.f = x;
  else if constexpr (std::is_signed_v<T>)
    v.i = x;
  else
    v.u = x;  // the unsigned types and bool (1 or 0)
  return v;
}

template <typename T>
Value array_of(ValueType elem, const std::vector<T>& items) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = elem;
  v.array.reserve(items.size());
  for (const T& x : items) v.array.push_back(scalar_of(elem, x));
  return v;
}

struct TensorLayout {
  const std::string* name;
  uint32_t type;
  const std::vector<int64_t>* ne;
  uint64_t nbytes;
};

// Header, KV pairs, tensor infos and the padding before the data section.
std::vector<uint8_t> build_header(uint32_t alignment, const std::vector<std::pair<std::string, Value>>& kv,
                                  const std::vector<TensorLayout>& tensors) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    writer_error("alignment " + std::to_string(alignment) + " is not a power of two");
  }
  bool has_alignment_key = false;
  for (const auto& [key, v] : kv) {
    check_value(key, v, 0);
    if (key == "general.alignment") {
      if (v.type != ValueType::U32 || v.u != alignment) {
        writer_error("key 'general.alignment' is " + v.to_string() + " but the writer aligns to " +
                     std::to_string(alignment) + " (expected a matching u32)");
      }
      has_alignment_key = true;
    }
  }
  // The default alignment needs no key; any other is recorded for readers.
  bool add_alignment_key = !has_alignment_key && alignment != kDefaultAlignment;

  std::vector<uint8_t> out;
  put_bytes(out, "GGUF", 4);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors.size());
  put<uint64_t>(out, kv.size() + (add_alignment_key ? 1 : 0));
  for (const auto& [key, v] : kv) {
    put_string(out, key);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    put_value(out, v);
  }
  if (add_alignment_key) {
    put_string(out, "general.alignment");
    put<uint32_t>(out, static_cast<uint32_t>(ValueType::U32));
    put<uint32_t>(out, alignment);
  }
  uint64_t offset = 0;
  for (const TensorLayout& t : tensors) {
    put_string(out, *t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne->size()));
    for (int64_t d : *t.ne) put<int64_t>(out, d);
    put<uint32_t>(out, t.type);
    put<uint64_t>(out, offset);
    offset += t.nbytes + padding(t.nbytes, alignment);
  }
  out.resize(out.size() + padding(out.size(), alignment), 0);
  return out;
}

}  // namespace

void Writer::set_u8(const std::string& key, uint8_t v) { set(key, scalar_of(ValueType::U8, v)); }
void Writer::set_u16(const std::string& key, uint16_t v) { set(key, scalar_of(ValueType::U16, v)); }
void Writer::set_u32(const std::string& key, uint32_t v) { set(key, scalar_of(ValueType::U32, v)); }
void Writer::set_i32(const std::string& key, int32_t v) { set(key, scalar_of(ValueType::I32, v)); }
void Writer::set_u64(const std::string& key, uint64_t v) { set(key, scalar_of(ValueType::U64, v)); }
void Writer::set_f32(const std::string& key, float v) { set(key, scalar_of(ValueType::F32, v)); }
void Writer::set_bool(const std::string& key, bool v) { set(key, scalar_of(ValueType::BOOL, v)); }
void Writer::set_str(const std::string& key, const std::string& v) { set(key, scalar_of(ValueType::STRING, v)); }
void Writer::set_arr_i32(const std::string& key, const std::vector<int32_t>& v) {
  set(key, array_of(ValueType::I32, v));
}
void Writer::set_arr_u32(const std::string& key, const std::vector<uint32_t>& v) {
  set(key, array_of(ValueType::U32, v));
}
void Writer::set_arr_f32(const std::string& key, const std::vector<float>& v) {
  set(key, array_of(ValueType::F32, v));
}
void Writer::set_arr_bool(const std::string& key, const std::vector<bool>& v) {
  set(key, array_of(ValueType::BOOL, v));
}
void Writer::set_arr_str(const std::string& key, const std::vector<std::string>& v) {
  set(key, array_of(ValueType::STRING, v));
}

void Writer::set(const std::string& key, const Value& v) {
  check_value(key, v, 0);  // fail at the call that introduced the bad value
  for (auto& entry : kv_) {
    if (entry.first == key) {
      entry.second = v;
      return;
    }
  }
  kv_.emplace_back(key, v);
}

// Validates a new tensor's name, type and shape; returns its byte size.
uint64_t Writer::check_tensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne) const {
  if (name.empty()) writer_error("empty tensor name");
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) writer_error("duplicate tensor '" + name + "'");
  }
  if (ne.empty() || ne.size() > 4) {
    writer_error("tensor '" + name + "' has " + std::to_string(ne.size()) + " dimensions (expected 1 to 4)");
  }
  const DTypeInfo* info = dtype_info(ggml_type);
  if (info == nullptr) writer_error("tensor '" + name + "' has unknown ggml type " + std::to_string(ggml_type));
  int64_t n_elements = 1;
  for (int64_t d : ne) {
    if (d <= 0 || __builtin_mul_overflow(n_elements, d, &n_elements)) {
      writer_error("tensor '" + name + "' has an invalid shape (dimensions must be > 0, product < 2^63)");
    }
  }
  if (ne[0] % info->block_elems != 0) {
    writer_error("tensor '" + name + "' ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " +
                 info->name + " block size " + std::to_string(info->block_elems));
  }
  // The reader's overflow-checked size computation, so what is written is what is read.
  std::optional<uint64_t> nbytes = tensor_nbytes(ggml_type, ne.data(), ne.size());
  if (!nbytes) writer_error("tensor '" + name + "' byte size overflows");
  // Cross-check with the tensor module's row size (overflow-checked there too).
  std::optional<size_t> row = row_bytes(info->type, ne[0]);
  if (!row || *row * static_cast<uint64_t>(n_elements / ne[0]) != *nbytes) {
    writer_error("tensor '" + name + "' byte size disagrees with row_bytes()");
  }
  return *nbytes;
}

void Writer::add_tensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne,
                        std::vector<uint8_t> data) {
  const uint64_t nbytes = check_tensor(name, ggml_type, ne);
  if (data.size() != nbytes) {
    const DTypeInfo* info = dtype_info(ggml_type);
    int64_t n_elements = 1;
    for (int64_t d : ne) n_elements *= d;  // checked by check_tensor
    writer_error("tensor '" + name + "' has " + std::to_string(data.size()) + " bytes of data (expected " +
                 std::to_string(nbytes) + " for " + info->name + " with " + std::to_string(n_elements) +
                 " elements)");
  }
  tensors_.push_back(PendingTensor{name, ggml_type, ne, std::move(data), nbytes, false});
}

void Writer::add_tensor_info(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne) {
  const uint64_t nbytes = check_tensor(name, ggml_type, ne);
  tensors_.push_back(PendingTensor{name, ggml_type, ne, {}, nbytes, true});
}

std::vector<uint8_t> Writer::header_bytes() const {
  std::vector<TensorLayout> layout;
  layout.reserve(tensors_.size());
  for (const PendingTensor& t : tensors_) layout.push_back({&t.name, t.type, &t.ne, t.nbytes});
  return build_header(alignment_, kv_, layout);
}

uint64_t Writer::padding_after(uint64_t nbytes) const { return padding(nbytes, alignment_); }

void Writer::check_no_streamed() const {
  for (const PendingTensor& t : tensors_) {
    if (t.streamed) writer_error("tensor '" + t.name + "' was declared without data (stream it after header_bytes())");
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  check_no_streamed();
  std::vector<uint8_t> out = header_bytes();
  for (const PendingTensor& t : tensors_) {
    put_bytes(out, t.data.data(), t.data.size());
    out.resize(out.size() + padding(t.data.size(), alignment_), 0);
  }
  return out;
}

void Writer::write(const std::string& path) const {
  check_no_streamed();
  // Header first (may throw on invalid metadata before anything is created).
  const std::vector<uint8_t> header = header_bytes();
  OutputFile out(path);
  out.write(header.data(), header.size());
  // Tensor data is written straight from each buffer (no second copy of a whole model).
  for (const PendingTensor& t : tensors_) {
    out.write(t.data.data(), t.data.size());
    out.write_zeros(padding(t.data.size(), alignment_));
  }
  out.commit();
}

OutputFile::OutputFile(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw Error("cannot create " + path + ": " + std::strerror(errno));
  std::setvbuf(f_, nullptr, _IOFBF, 4 << 20);
}

OutputFile::~OutputFile() {
  if (f_) {
    std::fclose(f_);
    std::remove(path_.c_str());
  }
}

void OutputFile::write(const void* p, size_t n) {
  if (n != 0 && std::fwrite(p, 1, n, f_) != n) throw Error("write to " + path_ + " failed: " + std::strerror(errno));
  written_ += n;
}

void OutputFile::write_zeros(uint64_t n) {
  static const uint8_t zeros[256] = {};
  while (n > 0) {
    const size_t chunk = n < sizeof zeros ? size_t(n) : sizeof zeros;
    write(zeros, chunk);
    n -= chunk;
  }
}

void OutputFile::commit() {
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) {
    const int err = errno;
    std::remove(path_.c_str());
    throw Error("write to " + path_ + " failed: " + std::strerror(err));
  }
}

}  // namespace step35::gguf
