// Expert patch files: a small GGUF holding only fine-tuned slices of a step35 model (one
// expert's matrix of a 3-D expert tensor, or a whole router / shared-expert matrix), the
// identity of the base model they replace (a hash of each replaced slice's bytes), and
// the training settings. docs/finetune.md describes the format.
//
// A patch is applied in memory (Model::set_replacements: `--patch`, hot-swap) or written
// into a new full model file (`step35 patch apply`).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/step35.h"
#include "tensor/dtype.h"

namespace step35::patch {

// A patch that cannot be read, or does not fit a model. One line naming the patch and the
// slice or field.
class PatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Slice {
  std::string tensor;        // the base tensor, e.g. "blk.12.ffn_up_exps.weight"
  int32_t expert = -1;       // the matrix of a 3-D tensor; -1: the whole tensor
  DType type = DType::F32;   // stored type
  int64_t n_in = 0, n_out = 0;
  DType base_type = DType::F32;  // the base tensor's type
  uint64_t base_hash = 0;    // of the base slice's bytes (slice_hash)
  std::vector<uint8_t> data; // n_out rows of n_in values of `type`

  std::string name() const;  // "blk.12.ffn_up_exps.weight expert 37"
};

// How a patch stores its slices: in the base tensor's type (re-quantized with step35's
// encoders) or in F16 / F32.
enum class Storage { BaseType, F16, F32 };

class Patch {
 public:
  std::vector<Slice> slices;
  std::string base_name;  // general.name of the base model (informational)
  // Training settings and figures (string keys, number or string values), stored as
  // step35-patch.train.* keys.
  std::map<std::string, std::string> train_text;
  std::map<std::string, double> train_numbers;

  // Reads a patch file; throws PatchError (or gguf::Error for a malformed GGUF).
  static Patch read(const std::string& path);
  // Writes it (throws PatchError on I/O failure).
  void write(const std::string& path) const;
  // The combined identity of the base slices (a hash of all slice hashes, in order).
  uint64_t base_hash() const;
  // Checks every slice against `model`'s file: the tensor exists with the slice's shape
  // and type, and the replaced bytes hash to base_hash. Throws PatchError for the first
  // mismatch; `label` names the patch in the message.
  void check_base(const Model& model, const std::string& label) const;
  // The slices as replacements for Model::set_replacements (sharing this patch's bytes;
  // the patch must outlive them unless `keep` owns it).
  std::vector<MatrixReplacement> replacements(std::shared_ptr<const Patch> keep) const;
  uint64_t data_bytes() const;
};

// 64-bit FNV-1a of a byte range (slice identity).
uint64_t slice_hash(const uint8_t* data, size_t n);
std::string hash_hex(uint64_t h);

// The bytes of a slice in the model's file (null if the tensor or expert does not exist).
struct BaseSlice {
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  DType type = DType::F32;
  int64_t n_in = 0, n_out = 0;
};
BaseSlice base_slice(const Model& model, const std::string& tensor, int32_t expert);

// A slice of `model` with new values (n_out x n_in F32), encoded for `storage`. Throws
// PatchError when the base type has no encoder (then store F16 or F32).
Slice make_slice(const Model& model, const std::string& tensor, int32_t expert, const float* values, Storage storage);
// The values a slice stores, decoded to F32 (n_out x n_in).
std::vector<float> decode_slice(const Slice& s);

// Writes the base model with the patches applied (in order; later slices win) to out_path:
// every other tensor and every untouched expert byte-identical to the input. A slice
// stored in another type than its tensor is re-encoded into the tensor's type (PatchError
// when that type has no encoder). Returns the number of slices written.
size_t apply_to_file(const Model& model, const std::vector<Patch>& patches, const std::string& out_path);

// Loads patch files, checks them against the model and installs them all (later files
// win) with Model::set_replacements. Returns the loaded patches.
std::vector<std::shared_ptr<const Patch>> load_and_apply(Model& model, const std::vector<std::string>& paths);

}  // namespace step35::patch
