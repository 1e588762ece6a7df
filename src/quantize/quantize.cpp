// The per-tensor type recipe of llama-quantize (llama.cpp de3ff81, src/llama-quant.cpp) for
// the file types step35 writes, as it applies to arch step35, stated rule by rule. Rules that
// cannot fire for step35 (Falcon, the Llama 70B attn_v bump, the IQ file types that need an
// importance matrix, TQ*/MXFP4 file types, imatrix-only cases) are left out. Without an importance matrix and without user
// overrides, llama-quantize decides in four steps:
//
//   1. Is the tensor quantized at all?       (tensor_is_quantizable)
//   2. The file type's base type ...         (file_type_base)
//   3. ... adjusted per tensor kind, layer and model shape (mix_type)
//   4. ... and replaced by a smaller-block type when the row length does not fit (fit_row_length).
//
// Step 3 keeps counters across tensors, so tensors are visited in llama-quantize's order:
// by block number (tensors outside blk.N first), then by name.
#include "quantize/quantize.h"

#include <algorithm>
#include <charconv>
#include <numeric>
#include <stdexcept>

#include "gguf/gguf.h"
#include "tensor/type_traits.h"

namespace step35 {

namespace {

struct FileTypeName {
  const char* name;
  FileType type;
};
// Canonical names first: file_type_name() returns the first match.
constexpr FileTypeName kFileTypeNames[] = {
    {"F32", FileType::F32},       {"F16", FileType::F16},       {"BF16", FileType::BF16},
    {"Q8_0", FileType::Q8_0},     {"Q4_0", FileType::Q4_0},     {"Q4_1", FileType::Q4_1},
    {"Q5_0", FileType::Q5_0},     {"Q5_1", FileType::Q5_1},     {"Q2_K", FileType::Q2_K},
    {"Q3_K_S", FileType::Q3_K_S}, {"Q3_K_M", FileType::Q3_K_M}, {"Q3_K_L", FileType::Q3_K_L},
    {"Q4_K_S", FileType::Q4_K_S}, {"Q4_K_M", FileType::Q4_K_M}, {"Q5_K_S", FileType::Q5_K_S},
    {"Q5_K_M", FileType::Q5_K_M}, {"Q6_K", FileType::Q6_K},     {"IQ4_NL", FileType::IQ4_NL},
    {"IQ4_XS", FileType::IQ4_XS},
    // llama-quantize's aliases.
    {"Q3_K", FileType::Q3_K_M},   {"Q4_K", FileType::Q4_K_M},   {"Q5_K", FileType::Q5_K_M},
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// The N of a "blk.N." name (llama-quantize reads it with sscanf "blk.%d."), nullopt otherwise.
std::optional<int> block_number(std::string_view name) {
  constexpr std::string_view prefix = "blk.";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const char* begin = name.data() + prefix.size();
  const char* end = name.data() + name.size();
  int n = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, n);
  if (ec != std::errc() || ptr == begin) return std::nullopt;
  return n;
}

// ggml_n_dims: trailing dimensions of size 1 do not count, so a [4096, 1] weight is 1-D.
int effective_dims(const int64_t* ne) {
  for (int d = 3; d >= 1; --d)
    if (ne[d] > 1) return d + 1;
  return 1;
}

// ---- step 1: which tensors are quantized -------------------------------------------------

// Only 2-D/3-D weights; never norms, the MoE router (ffn_gate_inp, kept F32 so expert
// choice is exact) or anything not named *weight (exp_probs_b.bias). 1-D tensors such as
// rope_freqs are excluded by the first rule.
bool tensor_is_quantizable(const TensorDesc& t) {
  if (effective_dims(t.ne) < 2) return false;
  if (!ends_with(t.name, "weight")) return false;
  if (contains(t.name, "_norm.weight")) return false;
  if (contains(t.name, "ffn_gate_inp.weight")) return false;
  return true;
}

// ---- step 3: the mixes -------------------------------------------------------------------

// The kinds the rules tell apart, matched on the name in this order (the first match wins).
enum class Kind { TokenEmbd, AttnQkv, AttnKvB, AttnV, AttnK, AttnQ, AttnOutput, FfnUp, FfnGate, FfnDown, Output, Other };

Kind tensor_kind(std::string_view name) {
  if (name == "output.weight") return Kind::Output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Kind::TokenEmbd;
  if (contains(name, "attn_qkv.weight")) return Kind::AttnQkv;
  if (contains(name, "attn_kv_b.weight")) return Kind::AttnKvB;
  if (contains(name, "attn_v.weight")) return Kind::AttnV;
  if (contains(name, "attn_k.weight")) return Kind::AttnK;
  if (contains(name, "attn_q.weight")) return Kind::AttnQ;
  if (contains(name, "attn_output.weight")) return Kind::AttnOutput;
  // Substrings: also the routed (_exps) and shared (_shexp) experts.
  if (contains(name, "ffn_up")) return Kind::FfnUp;
  if (contains(name, "ffn_gate")) return Kind::FfnGate;
  if (contains(name, "ffn_down")) return Kind::FfnDown;
  return Kind::Other;
}

// attn_v and the fused tensors that contain V get the attn_v rules and share its counter.
bool is_attn_v_like(Kind k) { return k == Kind::AttnV || k == Kind::AttnQkv || k == Kind::AttnKvB; }

// "Use more bits" layers of the _M mixes: the first and last eighth of the layers, and
// every third layer in between.
bool use_more_bits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

struct MixState {
  const QuantizeModelInfo& info;
  FileType ft;
  bool tied_embeddings;  // no output.weight: token_embd doubles as the output matrix
  int n_attn_v = 0;      // attn_v-like tensors in the model
  int i_attn_v = 0;      // ... seen so far
  int i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;
};

// The layer an FFN rule looks at: in an MoE model the tensor's own block number (experts
// are not in layer order in every model), else the running count of that kind of tensor.
// The layer count is block_count, so MTP blocks count as layers.
int ffn_layer(const MixState& st, int counter, const std::string& name) {
  if (std::max(1, st.info.n_expert) == 1) return counter;
  const std::optional<int> blk = block_number(name);
  if (!blk) throw std::runtime_error("cannot determine the layer of tensor " + name + " (expected a blk.N. prefix)");
  if (*blk < 0 || *blk >= st.info.n_layer_all)
    throw std::runtime_error("bad layer " + std::to_string(*blk) + " for tensor " + name + ": must be in [0, " +
                             std::to_string(st.info.n_layer_all) + ")");
  return *blk;
}

DType mix_type(MixState& st, const TensorDesc& t, DType type) {
  const FileType ft = st.ft;
  const Kind kind = tensor_kind(t.name);
  const int n_layer = st.info.n_layer_all;
  const bool eight_experts = st.info.n_expert == 8;
  const bool iq4 = ft == FileType::IQ4_NL || ft == FileType::IQ4_XS;

  // The output matrix (and a tied token embedding): Q6_K unless the file is Q8_0, Q8_0 when
  // the row does not fit the base type's block.
  if (kind == Kind::Output || (st.tied_embeddings && kind == Kind::TokenEmbd)) {
    if (t.ne[0] % dtype_info(type).block_elems != 0) return DType::Q8_0;
    if (type != DType::Q8_0) return DType::Q6_K;
    return type;
  }
  // An untied token embedding keeps the base type for every file type here.
  if (kind == Kind::TokenEmbd) return type;

  if (is_attn_v_like(kind)) {
    const int i = st.i_attn_v++;
    if (ft == FileType::Q2_K) type = st.info.n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
    else if (ft == FileType::Q3_K_M) type = i < 2 ? DType::Q5_K : DType::Q4_K;
    else if (ft == FileType::Q3_K_L) type = DType::Q5_K;
    else if (iq4 && st.info.n_gqa >= 4) type = DType::Q5_K;
    else if ((ft == FileType::Q4_K_M || ft == FileType::Q5_K_M) && use_more_bits(i, st.n_attn_v)) type = DType::Q6_K;
    else if (ft == FileType::Q4_K_S && i < 4) type = DType::Q5_K;
    // Eight-expert models (Mixtral's shape): V is small, so it gets Q8_0 whatever the mix.
    if (eight_experts) type = DType::Q8_0;
    return type;
  }
  if (kind == Kind::AttnK) {
    if (eight_experts) type = DType::Q8_0;  // as attn_v
    return type;
  }
  if (kind == Kind::AttnQ) return type;  // only IQ mixes change attn_q

  if (kind == Kind::FfnDown) {
    const int i = ffn_layer(st, st.i_ffn_down, t.name);
    ++st.i_ffn_down;
    if (ft == FileType::Q2_K) type = DType::Q3_K;
    else if (ft == FileType::Q3_K_M) type = i < n_layer / 16 ? DType::Q5_K : DType::Q4_K;
    else if (ft == FileType::Q3_K_L) type = DType::Q5_K;
    else if (ft == FileType::Q4_K_M) { if (use_more_bits(i, n_layer)) type = DType::Q6_K; }
    // Without an importance matrix (always, here) the IQ4 types give the first eighth Q5_K.
    else if (iq4 && i < n_layer / 8) type = DType::Q5_K;
    else if (ft == FileType::Q5_K_M) { if (use_more_bits(i, n_layer)) type = DType::Q6_K; }
    else if (ft == FileType::Q4_K_S) { if (i < n_layer / 8) type = DType::Q5_K; }
    return type;
  }
  if (kind == Kind::AttnOutput) {
    if (eight_experts) {
      if (ft == FileType::Q2_K || ft == FileType::Q3_K_S || ft == FileType::Q3_K_M || ft == FileType::Q4_K_S ||
          ft == FileType::Q4_K_M || iq4)
        type = DType::Q5_K;
    } else {
      if (ft == FileType::Q2_K) type = DType::Q3_K;
      else if (ft == FileType::Q3_K_M) type = DType::Q4_K;
      else if (ft == FileType::Q3_K_L) type = DType::Q5_K;
    }
    return type;
  }
  if (kind == Kind::FfnGate) {
    // No rule for these file types, but the layer is still checked (and may throw).
    ffn_layer(st, st.i_ffn_gate++, t.name);
    return type;
  }
  if (kind == Kind::FfnUp) {
    ffn_layer(st, st.i_ffn_up++, t.name);
    return type;
  }
  return type;  // attn_gate, MTP eh_proj / shared head, ...
}

// ---- step 4: row-length fallbacks --------------------------------------------------------

// A quantized type needs whole blocks per row. If the row length does not fit, a 256-block
// K-quant falls back to the 32-block type of similar size; if even that does not fit, F16.
DType fit_row_length(const TensorDesc& t, DType type, TensorChoice* choice) {
  const int64_t block = dtype_info(type).block_elems;
  if (t.ne[0] % block == 0) return type;
  DType fallback = type_traits(type).short_row_type;  // itself where no smaller block has a type
  if (t.ne[0] % dtype_info(fallback).block_elems != 0) fallback = DType::F16;
  choice->fallback = true;
  choice->note = "ncols " + std::to_string(t.ne[0]) + " not divisible by " + std::to_string(block) + " (" +
                 dtype_name(type) + ") -> " + dtype_name(fallback);
  return fallback;
}

bool is_block_quantized(DType t) { return dtype_info(t).block_elems > 1; }

}  // namespace

std::optional<FileType> file_type_from_name(std::string_view name) {
  for (const auto& e : kFileTypeNames)
    if (iequals(e.name, name)) return e.type;
  return std::nullopt;
}

const char* file_type_name(FileType t) {
  for (const auto& e : kFileTypeNames)
    if (e.type == t) return e.name;
  return "?";
}

std::string file_type_names() {
  std::string s;
  for (const auto& e : kFileTypeNames) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

DType file_type_base(FileType t) {
  switch (t) {
    case FileType::F32: return DType::F32;
    case FileType::F16: return DType::F16;
    case FileType::BF16: return DType::BF16;
    case FileType::Q8_0: return DType::Q8_0;
    case FileType::Q4_0: return DType::Q4_0;
    case FileType::Q4_1: return DType::Q4_1;
    case FileType::Q5_0: return DType::Q5_0;
    case FileType::Q5_1: return DType::Q5_1;
    case FileType::Q2_K: return DType::Q2_K;
    case FileType::Q3_K_S:
    case FileType::Q3_K_M:
    case FileType::Q3_K_L: return DType::Q3_K;
    case FileType::Q4_K_S:
    case FileType::Q4_K_M: return DType::Q4_K;
    case FileType::Q5_K_S:
    case FileType::Q5_K_M: return DType::Q5_K;
    case FileType::Q6_K: return DType::Q6_K;
    case FileType::IQ4_NL: return DType::IQ4_NL;
    case FileType::IQ4_XS: return DType::IQ4_XS;
  }
  throw std::invalid_argument("unknown file type " + std::to_string(uint32_t(t)));
}

QuantizeModelInfo quantize_model_info(const gguf::File& f) {
  const std::string& arch = f.get_str("general.architecture");
  if (arch != "step35")
    throw gguf::Error(f.path() + ": architecture '" + arch + "' is not step35 (this recipe is step35's)");
  QuantizeModelInfo info;
  const uint32_t n_layer_all = f.get_u32("step35.block_count");
  if (n_layer_all == 0 || n_layer_all > 4096)
    throw gguf::Error(f.path() + ": step35.block_count " + std::to_string(n_layer_all) + " is out of range");
  info.n_layer_all = int(n_layer_all);
  info.n_expert = int(std::min<uint32_t>(f.opt_u32("step35.expert_count").value_or(0), 1u << 20));
  const std::vector<uint32_t> heads = f.get_u32_per_layer("step35.attention.head_count", n_layer_all);
  const std::vector<uint32_t> heads_kv = f.get_u32_per_layer("step35.attention.head_count_kv", n_layer_all, heads[0]);
  info.n_gqa = heads_kv[0] == 0 ? 0 : int(heads[0] / heads_kv[0]);
  return info;
}

std::vector<TensorChoice> choose_tensor_types(const std::vector<TensorDesc>& tensors, const QuantizeModelInfo& info,
                                              FileType ft) {
  const DType base = file_type_base(ft);
  MixState st{info, ft, true};
  for (const TensorDesc& t : tensors) {
    const Kind kind = tensor_kind(t.name);
    if (is_attn_v_like(kind)) ++st.n_attn_v;
    if (kind == Kind::Output) st.tied_embeddings = false;
  }
  // llama-quantize's visiting order: block number (-1 outside blocks), then name.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::vector<int> blk(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) blk[i] = block_number(tensors[i].name).value_or(-1);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (blk[a] != blk[b]) return blk[a] < blk[b];
    return tensors[a].name < tensors[b].name;
  });

  std::vector<TensorChoice> choices(tensors.size());
  for (size_t i : order) {
    const TensorDesc& t = tensors[i];
    TensorChoice& c = choices[i];
    if (!tensor_is_quantizable(t)) {
      c.type = t.type;  // copied as it is
      continue;
    }
    DType type = base;
    // The mixes and the fallbacks apply only when the file type is a quantized one.
    if (is_block_quantized(base)) {
      type = mix_type(st, t, type);
      type = fit_row_length(t, type, &c);
    }
    c.type = type;
  }
  return choices;
}

}  // namespace step35
