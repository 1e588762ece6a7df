// GGUF v3 container: a memory-mapped, validated, read-only view of one model
// (possibly split over several files). Tensor data is exposed in place; nothing is
// copied or dequantized at load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace step35::gguf {

// Any malformed or unreadable input. what() is one line naming the file, the offset
// or key, and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Data alignment of a file without a general.alignment key.
constexpr uint32_t kDefaultAlignment = 32;
// Arrays nested deeper than this are rejected by the reader (parsing is recursive; real
// files use 1 level) and refused by the writer.
constexpr uint32_t kMaxArrayDepth = 8;

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars keep their exact type; integer and float accessors convert
// with range checks. Arrays hold their element type and the elements (nested arrays allowed).
struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;      // unsigned integers and bool
  int64_t i = 0;       // signed integers
  double f = 0.0;      // floats
  std::string str;     // STRING
  ValueType elem_type = ValueType::U8;  // ARRAY
  std::vector<Value> array;             // ARRAY

  bool is_integer() const;
  bool is_float() const;
  std::string to_string(size_t max_array_items = 8) const;  // for `inspect`
};

// Bytes of a tensor of ggml type `type` with shape ne[0..n_dims): nullopt for an unsupported
// type, n_dims outside 1..4, a dimension <= 0, ne[0] not a multiple of the type's block
// size, or a size that overflows uint64.
std::optional<uint64_t> tensor_nbytes(uint32_t type, const int64_t* ne, size_t n_dims);

// Tensor info as stored, plus where its bytes are.
struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] fastest varying; unused dims are 1
  uint32_t type = 0;             // ggml type id (see tensor/dtype.h)
  uint64_t offset = 0;           // relative to its file's data section
  uint64_t nbytes = 0;           // computed from type and shape (overflow-checked)
  const uint8_t* data = nullptr; // points into the mapping
  uint32_t file_index = 0;       // which split file holds it

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// A read-only memory mapping of one file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the whole pages inside [p, p + n) from this process's resident set if they lie in
  // this mapping (true then). A later read maps them again from the page cache, so the
  // bytes stay valid; only memory is given back.
  bool release(const void* p, size_t n) const;
  // How the bytes [p, p + n) will be read, if they lie in this mapping (true then): Random
  // stops the kernel reading around a fault (pages of other tensors that then fill the page
  // cache), WillNeed starts reading the whole range now, Release is release().
  enum class Access { Random, WillNeed, Release };
  bool advise(const void* p, size_t n, Access access) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A parsed model: metadata of the first file, tensors of all split files.
class File {
 public:
  // Opens `path`. If it is the first part of a split model (split.count > 1), the other
  // parts are found next to it by the `-0000K-of-0000N.gguf` naming and opened too.
  static std::unique_ptr<File> open(const std::string& path);
  // Parses an in-memory buffer (used by tests and fuzzers). `name` appears in errors.
  static std::unique_ptr<File> parse_buffer(const uint8_t* data, size_t size,
                                            const std::string& name = "<buffer>");

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  size_t n_files() const { return file_sizes_.size(); }  // 1 for parse_buffer
  uint64_t total_file_bytes() const;
  // Path of part i of a model opened from disk ("" for parse_buffer).
  std::string part_path(size_t file_index) const;
  // Byte offset of the data section (header end rounded up to the alignment) in file i.
  uint64_t data_offset(size_t file_index = 0) const;

  // Metadata.
  const std::map<std::string, Value>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed getters: throw Error naming the key when missing or of the wrong type.
  uint32_t get_u32(std::string_view key) const;   // any integer type in range
  uint64_t get_u64(std::string_view key) const;   // any non-negative integer type
  int64_t get_i64(std::string_view key) const;    // any integer type in range
  float get_f32(std::string_view key) const;      // F32/F64 (or integer)
  bool get_bool(std::string_view key) const;
  const std::string& get_str(std::string_view key) const;
  const Value& get_array(std::string_view key, ValueType elem_type) const;
  // Optional variants: nullopt when absent, Error when present with the wrong type.
  std::optional<uint32_t> opt_u32(std::string_view key) const;
  std::optional<float> opt_f32(std::string_view key) const;
  std::optional<bool> opt_bool(std::string_view key) const;
  std::optional<std::string> opt_str(std::string_view key) const;
  // Per-layer "scalar or array" keys (llama.cpp's u32-or-array rule): a scalar is
  // repeated n times; an array must have exactly n elements. Missing -> Error unless
  // a default is given.
  std::vector<uint32_t> get_u32_per_layer(std::string_view key, size_t n,
                                          std::optional<uint32_t> dflt = std::nullopt) const;
  std::vector<float> get_f32_per_layer(std::string_view key, size_t n,
                                       std::optional<float> dflt = std::nullopt) const;
  std::vector<bool> get_bool_per_layer(std::string_view key, size_t n,
                                       std::optional<bool> dflt = std::nullopt) const;
  // String array (e.g. tokenizer.ggml.tokens).
  std::vector<std::string> get_str_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;

  // Gives back the resident memory of file bytes this process no longer reads (weights it
  // keeps a converted copy of): see MappedFile::release. No-op for a parsed buffer.
  void release_pages(const void* p, size_t n) const;
  // MappedFile::advise on the file holding [p, p + n); every file's whole mapping with p null.
  void advise(const void* p, size_t n, MappedFile::Access access) const;

  // Tensors.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  File() = default;
  void parse(size_t file_index, const uint8_t* data, size_t size, const std::string& name);
  void finish();

  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<uint64_t> file_sizes_;    // one per parsed part (also for parse_buffer)
  std::vector<uint64_t> data_offsets_;  // one per parsed part
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace step35::gguf
