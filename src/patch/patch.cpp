#include "patch/patch.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "tensor/quants.h"

namespace step35::patch {

namespace {

// GGUF layout of a patch. general.architecture is not "step35", so loading a patch as a
// model fails with a clear message.
constexpr const char* kArch = "step35-patch";
constexpr uint32_t kVersion = 1;
const std::string kPrefix = "step35-patch.";
const std::string kTrainPrefix = "step35-patch.train.";

// Tensor name of a slice inside the patch: the base name, or for an expert
// "blk.12.ffn_up_exps.e37" (GGUF names are limited to 63 bytes).
std::string stored_name(const Slice& s) {
  if (s.expert < 0) return s.tensor;
  std::string base = s.tensor;
  const std::string suffix = ".weight";
  if (base.size() > suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0)
    base.resize(base.size() - suffix.size());
  return base + ".e" + std::to_string(s.expert);
}

uint64_t parse_hex(const std::string& s, const std::string& where) {
  if (s.empty() || s.size() > 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw PatchError(where + ": malformed hash '" + s + "'");
  return std::stoull(s, nullptr, 16);
}

size_t slice_bytes(DType t, int64_t n_in, int64_t n_out) {
  const std::optional<size_t> rb = row_bytes(t, n_in);
  if (!rb) throw PatchError(std::string("rows of ") + std::to_string(n_in) + " values cannot be stored as " + dtype_name(t));
  return *rb * size_t(n_out);
}

std::vector<uint8_t> encode(DType t, const float* values, int64_t n_in, int64_t n_out) {
  const size_t rb = slice_bytes(t, n_in, 1);
  std::vector<uint8_t> out(rb * size_t(n_out));
  for (int64_t o = 0; o < n_out; ++o)
    if (!quantize_row_ref(t, values + o * n_in, out.data() + size_t(o) * rb, n_in))
      throw PatchError(std::string("no encoder for ") + dtype_name(t));
  return out;
}

bool has_encoder(DType t) {
  const DTypeInfo& info = dtype_info(t);
  std::vector<float> zeros(size_t(info.block_elems), 0.0f);
  std::vector<uint8_t> out(info.block_bytes);
  return quantize_row_ref(t, zeros.data(), out.data(), info.block_elems);
}

}  // namespace

std::string Slice::name() const { return expert < 0 ? tensor : tensor + " expert " + std::to_string(expert); }

uint64_t slice_hash(const uint8_t* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= data[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string hash_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

BaseSlice base_slice(const Model& model, const std::string& tensor, int32_t expert) {
  BaseSlice b;
  const gguf::TensorInfo* t = model.file().find_tensor(tensor);
  if (!t) return b;
  const bool three_d = t->n_dims == 3;
  if ((expert >= 0) != three_d || t->n_dims > 3) return b;
  if (expert >= 0 && expert >= t->ne[2]) return b;
  const DTypeInfo* info = dtype_info(t->type);
  if (!info) return b;
  b.type = info->type;
  b.n_in = t->ne[0];
  b.n_out = t->ne[1];
  b.n_bytes = slice_bytes(b.type, b.n_in, b.n_out);
  b.data = t->data + (expert >= 0 ? size_t(expert) * b.n_bytes : 0);
  return b;
}

uint64_t Patch::base_hash() const {
  uint64_t h = 1469598103934665603ull;
  for (const Slice& s : slices)
    for (int i = 0; i < 8; ++i) {
      h ^= (s.base_hash >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  return h;
}

uint64_t Patch::data_bytes() const {
  uint64_t n = 0;
  for (const Slice& s : slices) n += s.data.size();
  return n;
}

Slice make_slice(const Model& model, const std::string& tensor, int32_t expert, const float* values, Storage storage) {
  const BaseSlice b = base_slice(model, tensor, expert);
  if (!b.data) throw PatchError("the model has no slice " + tensor + (expert >= 0 ? " expert " + std::to_string(expert) : ""));
  Slice s;
  s.tensor = tensor;
  s.expert = expert;
  s.n_in = b.n_in;
  s.n_out = b.n_out;
  s.base_type = b.type;
  s.base_hash = slice_hash(b.data, b.n_bytes);
  s.type = storage == Storage::F16 ? DType::F16 : storage == Storage::F32 ? DType::F32 : b.type;
  if (!has_encoder(s.type))
    throw PatchError(s.name() + ": step35 has no encoder for " + dtype_name(s.type) +
                     " (the base tensor's type); store the patch as f16 or f32 (--patch-type)");
  s.data = encode(s.type, values, s.n_in, s.n_out);
  return s;
}

std::vector<float> decode_slice(const Slice& s) {
  std::vector<float> v(size_t(s.n_in * s.n_out));
  const size_t rb = slice_bytes(s.type, s.n_in, 1);
  for (int64_t o = 0; o < s.n_out; ++o)
    dequantize_row_ref(s.type, s.data.data() + size_t(o) * rb, v.data() + o * s.n_in, s.n_in);
  return v;
}

void Patch::write(const std::string& path) const {
  gguf::Writer w;
  w.set_str("general.architecture", kArch);
  w.set_str("general.type", "step35 expert patch");
  w.set_u32(kPrefix + "version", kVersion);
  w.set_str(kPrefix + "base.name", base_name);
  w.set_str(kPrefix + "base.hash", hash_hex(base_hash()));
  std::vector<std::string> tensors, types, hashes;
  std::vector<int32_t> experts;
  for (const Slice& s : slices) {
    tensors.push_back(s.tensor);
    experts.push_back(s.expert);
    types.push_back(dtype_name(s.base_type));
    hashes.push_back(hash_hex(s.base_hash));
  }
  w.set_arr_str(kPrefix + "slice.tensor", tensors);
  w.set_arr_i32(kPrefix + "slice.expert", experts);
  w.set_arr_str(kPrefix + "slice.base_type", types);
  w.set_arr_str(kPrefix + "slice.base_hash", hashes);
  for (const auto& [k, v] : train_text) w.set_str(kTrainPrefix + k, v);
  for (const auto& [k, v] : train_numbers) {
    gguf::Value x;
    x.type = gguf::ValueType::F64;
    x.f = v;
    w.set(kTrainPrefix + k, x);
  }
  for (const Slice& s : slices)
    w.add_tensor(stored_name(s), uint32_t(s.type), {s.n_in, s.n_out}, s.data);
  // Written under a name of its own and renamed into place: whoever reads the path (a
  // server told to hot-swap it, another run writing the same patch) finds the old file or
  // the whole new one, never a partial write.
  const std::string partial = path + ".partial." + std::to_string(::getpid());
  try {
    w.write(partial);
  } catch (const gguf::Error& e) {
    throw PatchError(e.what());
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(partial.c_str());
    throw PatchError(path + ": cannot write: " + std::strerror(err));
  }
}

Patch Patch::read(const std::string& path) {
  std::unique_ptr<gguf::File> f = gguf::File::open(path);
  const std::string arch = f->get_str("general.architecture");
  if (arch != kArch)
    throw PatchError(path + ": not a step35 patch (general.architecture is '" + arch + "', expected '" + kArch + "')");
  const uint32_t version = f->get_u32(kPrefix + "version");
  if (version != kVersion)
    throw PatchError(path + ": patch format version " + std::to_string(version) + " (this step35 reads version " +
                     std::to_string(kVersion) + ")");
  Patch p;
  p.base_name = f->opt_str(kPrefix + "base.name").value_or("");
  const auto tensors = f->get_str_array(kPrefix + "slice.tensor");
  const auto experts = f->get_i32_array(kPrefix + "slice.expert");
  const auto types = f->get_str_array(kPrefix + "slice.base_type");
  const auto hashes = f->get_str_array(kPrefix + "slice.base_hash");
  if (experts.size() != tensors.size() || types.size() != tensors.size() || hashes.size() != tensors.size())
    throw PatchError(path + ": the slice.* arrays have different lengths");
  if (tensors.size() != f->tensors().size())
    throw PatchError(path + ": " + std::to_string(tensors.size()) + " slices listed but " +
                     std::to_string(f->tensors().size()) + " tensors stored");
  for (size_t i = 0; i < tensors.size(); ++i) {
    Slice s;
    s.tensor = tensors[i];
    s.expert = experts[i];
    const std::string where = path + ": slice " + s.name();
    if (s.expert < -1) throw PatchError(where + ": expert id " + std::to_string(s.expert));
    const auto bt = dtype_from_name(types[i]);
    if (!bt) throw PatchError(where + ": unknown base type '" + types[i] + "'");
    s.base_type = *bt;
    s.base_hash = parse_hex(hashes[i], where);
    const gguf::TensorInfo* t = f->find_tensor(stored_name(s));
    if (!t) throw PatchError(where + ": tensor '" + stored_name(s) + "' missing");
    if (t->n_dims != 2) throw PatchError(where + ": stored tensor has " + std::to_string(t->n_dims) + " dimensions (expected 2)");
    const DTypeInfo* info = dtype_info(t->type);
    if (!info) throw PatchError(where + ": unsupported stored type " + std::to_string(t->type));
    s.type = info->type;
    s.n_in = t->ne[0];
    s.n_out = t->ne[1];
    s.data.assign(t->data, t->data + t->nbytes);
    p.slices.push_back(std::move(s));
  }
  const std::string stored = f->opt_str(kPrefix + "base.hash").value_or("");
  if (stored != hash_hex(p.base_hash()))
    throw PatchError(path + ": base.hash " + stored + " does not match its slices (" + hash_hex(p.base_hash()) + ")");
  for (const auto& [key, value] : f->metadata()) {
    if (key.rfind(kTrainPrefix, 0) != 0) continue;
    const std::string k = key.substr(kTrainPrefix.size());
    if (value.type == gguf::ValueType::STRING)
      p.train_text[k] = value.str;
    else if (value.is_float())
      p.train_numbers[k] = value.f;
    else if (value.is_integer())
      p.train_numbers[k] = value.type == gguf::ValueType::I64 || value.type == gguf::ValueType::I32 ? double(value.i)
                                                                                                   : double(value.u);
  }
  return p;
}

void Patch::check_base(const Model& model, const std::string& label) const {
  for (const Slice& s : slices) {
    const std::string where = label + ": " + s.name();
    const BaseSlice b = base_slice(model, s.tensor, s.expert);
    if (!b.data) throw PatchError(where + ": the model has no such " + (s.expert >= 0 ? "expert" : "tensor"));
    if (b.n_in != s.n_in || b.n_out != s.n_out)
      throw PatchError(where + ": shape {" + std::to_string(s.n_in) + ", " + std::to_string(s.n_out) +
                       "} but the model's is {" + std::to_string(b.n_in) + ", " + std::to_string(b.n_out) + "}");
    if (b.type != s.base_type)
      throw PatchError(where + ": made for a " + dtype_name(s.base_type) + " tensor, the model's is " + dtype_name(b.type));
    if (slice_hash(b.data, b.n_bytes) != s.base_hash)
      throw PatchError(where + ": the model's weights differ from the ones the patch was made from (base hash " +
                       hash_hex(slice_hash(b.data, b.n_bytes)) + ", patch expects " + hash_hex(s.base_hash) + ")");
    if (s.data.size() != slice_bytes(s.type, s.n_in, s.n_out))
      throw PatchError(where + ": " + std::to_string(s.data.size()) + " bytes for " + dtype_name(s.type) + " {" +
                       std::to_string(s.n_in) + ", " + std::to_string(s.n_out) + "}");
  }
}

std::vector<MatrixReplacement> Patch::replacements(std::shared_ptr<const Patch> keep) const {
  std::vector<MatrixReplacement> out;
  for (const Slice& s : slices) {
    MatrixReplacement r;
    r.tensor = s.tensor;
    r.expert = s.expert;
    r.type = s.type;
    r.data = s.data.data();
    r.n_bytes = s.data.size();
    r.owner = keep;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::shared_ptr<const Patch>> load_and_apply(Model& model, const std::vector<std::string>& paths) {
  std::vector<std::shared_ptr<const Patch>> patches;
  std::vector<MatrixReplacement> all;
  for (const std::string& path : paths) {
    auto p = std::make_shared<const Patch>(Patch::read(path));
    p->check_base(model, path);
    for (MatrixReplacement& r : p->replacements(p)) all.push_back(std::move(r));
    patches.push_back(std::move(p));
  }
  if (!patches.empty()) model.set_replacements(std::move(all));
  return patches;
}

// ---------------------------------------------------------------------------------------
// patch apply: a new full model file

size_t apply_to_file(const Model& model, const std::vector<Patch>& patches, const std::string& out_path) {
  const gguf::File& in = model.file();
  if (in.n_files() != 1) throw PatchError("patch apply: split models are not supported (merge the parts first)");
  std::error_code ec;
  if (std::filesystem::exists(out_path, ec) && std::filesystem::equivalent(in.part_path(0), out_path, ec))
    throw PatchError("patch apply: the output " + out_path + " is the input model");
  // The winning slice per (tensor, expert), in the base tensor's type.
  std::map<std::pair<std::string, int32_t>, std::vector<uint8_t>> bytes;
  for (size_t i = 0; i < patches.size(); ++i) {
    patches[i].check_base(model, "patch " + std::to_string(i + 1));
    for (const Slice& s : patches[i].slices) {
      if (s.type == s.base_type) {
        bytes[{s.tensor, s.expert}] = s.data;
        continue;
      }
      if (!has_encoder(s.base_type))
        throw PatchError(s.name() + ": stored as " + std::string(dtype_name(s.type)) + ", and step35 has no encoder for the model's " +
                         dtype_name(s.base_type) + " to write it into the file");
      const std::vector<float> v = decode_slice(s);
      bytes[{s.tensor, s.expert}] = encode(s.base_type, v.data(), s.n_in, s.n_out);
    }
  }
  gguf::Writer w(in.alignment());
  for (const auto& [key, value] : in.metadata()) w.set(key, value);
  for (const gguf::TensorInfo& t : in.tensors())
    w.add_tensor_info(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims));
  gguf::OutputFile out(out_path);
  const std::vector<uint8_t> header = w.header_bytes();
  out.write(header.data(), header.size());
  for (const gguf::TensorInfo& t : in.tensors()) {
    const bool three_d = t.n_dims == 3;
    const size_t mat = three_d ? size_t(t.nbytes / uint64_t(t.ne[2])) : size_t(t.nbytes);
    for (int64_t e = 0; e < (three_d ? t.ne[2] : 1); ++e) {
      auto it = bytes.find({t.name, three_d ? int32_t(e) : -1});
      if (it != bytes.end())
        out.write(it->second.data(), it->second.size());
      else
        out.write(t.data + size_t(e) * mat, mat);
    }
    out.write_zeros(w.padding_after(t.nbytes));
  }
  out.commit();
  return bytes.size();
}

}  // namespace step35::patch
