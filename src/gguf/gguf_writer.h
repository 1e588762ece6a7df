// GGUF v3 writer: builds metadata and tensors in memory order and writes one file.
// Used by `step35 make-tiny`, `step35 quantize`, `step35 patch apply` and the tests
// (corrupt-file corpus).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace step35::gguf {

class Writer {
 public:
  explicit Writer(uint32_t alignment = 32) : alignment_(alignment) {}

  void set_u8(const std::string& key, uint8_t v);
  void set_u16(const std::string& key, uint16_t v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_str(const std::string& key, const std::string& v);
  void set_arr_i32(const std::string& key, const std::vector<int32_t>& v);
  void set_arr_u32(const std::string& key, const std::vector<uint32_t>& v);
  void set_arr_f32(const std::string& key, const std::vector<float>& v);
  void set_arr_bool(const std::string& key, const std::vector<bool>& v);
  void set_arr_str(const std::string& key, const std::vector<std::string>& v);
  // Generic (any Value, nested arrays included). Keys keep insertion order; setting a
  // key again replaces its value in place.
  void set(const std::string& key, const Value& v);

  // Adds a tensor; `data` must hold exactly the bytes for (type, ne).
  void add_tensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne,
                  std::vector<uint8_t> data);

  // Streaming a model too large for memory: declare each tensor without its bytes, write
  // header_bytes(), then each declared tensor's bytes in order, each followed by
  // padding_after(its size) zero bytes. to_bytes() and write() refuse declared tensors.
  void add_tensor_info(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne);
  // Header, metadata, tensor infos and the padding up to the data section.
  std::vector<uint8_t> header_bytes() const;
  uint64_t padding_after(uint64_t nbytes) const;
  uint32_t alignment() const { return alignment_; }

  // Serialises the whole file.
  std::vector<uint8_t> to_bytes() const;
  // Writes to `path` (throws Error on I/O failure).
  void write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
    uint64_t nbytes;
    bool streamed;  // declared by add_tensor_info: data stays empty
  };
  uint64_t check_tensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne) const;
  void check_no_streamed() const;
  uint32_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

// A model file being written (by Writer::write, or piece by piece in the streaming mode:
// header_bytes(), then each tensor's bytes and padding_after()). Unless commit() closes it
// successfully, the destructor removes it again: a failed or interrupted conversion leaves
// no truncated model behind. Throws Error ("cannot create PATH: ...", "write to PATH
// failed: ...") on I/O failure.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* p, size_t n);
  void write_zeros(uint64_t n);
  // Closes the file, which then stays.
  void commit();
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  uint64_t written_ = 0;
};

}  // namespace step35::gguf
