// The step35 architecture (Step 3.5 Flash): hyperparameters read from GGUF metadata,
// the tensor set, and the forward pass. Reads section by section like "The model" in
// docs/architecture.md (forward pass, "MTP heads", "GGUF: keys and tensors").
// Nothing about the released model is hard-coded: the tiny fixtures and the 196B model
// run through the same code.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/expert_executor.h"
#include "offload/expert_cache.h"
#include "exec/batch.h"
#include "exec/kv_cache.h"
#include "tensor/kernels.h"
#include "tensor/repack.h"
#include "tensor/tensor.h"
#include "tokenizer/tokenizer.h"

namespace step35 {

struct AttentionLayer;

class ThreadPool;

// architecture.md "Per-layer schedule": everything that varies per block (trunk layers and MTP
// blocks alike).
struct LayerHParams {
  bool is_swa = false;      // sliding-window attention (else full attention)
  int32_t n_head = 0;       // query heads
  int32_t n_head_kv = 0;    // key/value heads
  int32_t n_rot = 0;        // rotary dims (full layers rotate half the head)
  float rope_base = 10000;  // θ base
  bool use_rope_freqs = false;  // llama3 factors from rope_freqs.weight (full layers)
  bool is_moe = false;      // ffn_gate_inp present
  int32_t n_ff = 0;         // dense MLP width (dense layers)
  int32_t n_expert_used = 0;
  int32_t n_ff_exp = 0;
  float clamp_exp = 0;      // SwiGLU limit for routed experts (0 = off)
  float clamp_shexp = 0;    // SwiGLU limit for the shared expert and dense MLPs
};

struct HParams {
  int32_t n_vocab = 0;
  int32_t n_embd = 0;
  int32_t n_layer = 0;      // trunk layers
  int32_t n_mtp = 0;        // MTP blocks declared (block_count - n_layer)
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  float rms_eps = 1e-5f;
  int32_t swa_window = 0;
  int32_t n_ctx_train = 0;
  int32_t n_expert = 0;
  int32_t n_ff_shexp = 0;
  bool gating_sigmoid = true;      // expert_gating_func: sigmoid (2, default) or softmax (1)
  bool expert_weights_norm = false;
  float expert_weights_scale = 1.0f;
  std::vector<LayerHParams> layers;  // block_count entries (trunk, then MTP)
};

// Layer il's shapes as the attention kernels take them (attention/attention.h), its keys and
// values at `kv_layer` of the pool. The inference forward and the training forward both ask.
AttentionLayer attention_layer(const HParams& hp, int il, size_t kv_layer);

// architecture.md "GGUF: keys and tensors": the GGUF name of block `layer`'s tensor `name`:
// "blk.LAYER.NAME".
std::string block_tensor_name(int layer, const char* name);

// architecture.md "GGUF: keys and tensors": one block's tensors, in place in the mapping. Norm
// vectors are small and copied to F32 at load (they may be stored in any type).
struct LayerWeights {
  std::vector<float> attn_norm, attn_q_norm, attn_k_norm, ffn_norm;
  WeightMatrix attn_q, attn_k, attn_v, attn_gate, attn_output;
  // dense MLP
  WeightMatrix ffn_gate, ffn_up, ffn_down;
  // MoE
  WeightMatrix ffn_gate_inp;       // router {n_embd, n_expert}
  std::vector<float> exp_probs_b;  // selection bias (empty if absent)
  WeightMatrix ffn_gate_exps, ffn_up_exps, ffn_down_exps;
  WeightMatrix ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
  // MTP (architecture.md "MTP heads"): only on blocks n_layer.. with nextn tensors
  WeightMatrix nextn_eh_proj, nextn_shared_head_head, nextn_embed_tokens;
  std::vector<float> nextn_enorm, nextn_hnorm, nextn_shared_head_norm;
};

// A matrix that replaces one of the file's in forward passes (model patches, src/patch):
// a whole 2-D weight tensor or one expert's matrix of a 3-D expert tensor, n_out rows of
// n_in values of `type` (any type the kernels multiply; it may differ from the file's).
// `owner` keeps the bytes alive for as long as a forward pass may read them.
struct MatrixReplacement {
  std::string tensor;        // GGUF name, e.g. "blk.12.ffn_up_exps.weight"
  int32_t expert = -1;       // the matrix of a 3-D tensor; -1: the whole tensor
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  std::shared_ptr<const void> owner;
};

// The weights forward passes read: the file's, with replacements in effect. A pass takes
// the current one when it starts and holds it to the end, so a change made meanwhile
// (Model::set_replacements) is seen only by later passes, never halfway.
struct WeightSet {
  uint64_t version = 0;  // 0: the file's weights, as loaded
  std::vector<LayerWeights> layers;
  std::vector<MatrixReplacement> replacements;
  // Owners of the slot tables of replaced experts and of replacements' repacked copies.
  std::vector<std::unique_ptr<MatrixSlots>> slots;
  std::vector<kernels::AlignedBytes> packed;
};

// Receives named intermediates ("attn_norm_in", layer, data, n_floats) during a forward
// pass, with the same names as llama.cpp's graph so runs can be diffed layer by layer
// against the fixtures' *.layers.f32 dumps. Layer is -1 for model-level tensors.
using DumpFn = std::function<void(const std::string& name, int layer, const float* data,
                                  int64_t n_floats)>;

struct Workspace;  // model/workspace.h: scratch buffers of forward passes

struct ForwardOptions {
  Precision precision = Precision::Native;
  DumpFn dump;  // optional
};

class Model {
 public:
  struct LoadOptions {
    bool verbose = true;    // print a summary line to stderr
    bool progress = false;  // progress bar on stderr
    // Copy the Q4_K / Q6_K / IQ / TQ matrices every token uses (attention, dense and
    // shared-expert FFN, MTP projection, output) into the 16-row interleaved layout of the
    // AVX-512 kernels (tensor/repack.h) when the CPU has them.
    bool repack = true;
    // With `repack`, the routed experts: never, each one when a forward pass first routes
    // to it, or all at load (which reads the whole file then). Auto means on first use
    // when the weights, with every copy in place of the rows it copies (the IQ code
    // layouts are larger than their rows), fit in 3/4 of the memory this process may use,
    // else never: the copies are anonymous memory, which the kernel cannot drop under
    // pressure as it can the file's pages (and read them again).
    enum class ExpertRepack { Auto, Never, OnFirstUse, AtLoad };
    ExpertRepack repack_experts = ExpertRepack::Auto;
    // The environment variable STEP35_REPACK overrides both: 0 (nothing), shared (the
    // matrices every token uses; experts never), lazy (experts on first use), all (at load).

    // The MTP sidecar: a GGUF that holds only the MTP blocks (plus copies of the embedding,
    // output norm, output and rope_freqs), beside a main file without them, as
    // Step-3.7-Flash is released. A path; empty: a file named mtp-*.gguf in the model's
    // folder when the model has no MTP block of its own (kNoMtpSidecar: never look).
    std::string mtp_model;

    // docs/memory.md: the bytes the process may keep in memory (0: no budget, the file is
    // mapped and the page cache decides). Under a budget the dense weights stay mapped and
    // the routed experts are read into an expert cache (src/offload) that takes what is left
    // after them, the KV cache of `mem_kv_positions` positions of `mem_kv_types` (all the
    // sequences the caller will hold at once) and scratch; the experts are not repacked. A
    // budget without room for one MoE block's experts is a std::invalid_argument naming the
    // minimum.
    uint64_t mem_budget = 0;
    int64_t mem_kv_positions = 0;
    KvTypes mem_kv_types;
  };
  static constexpr const char* kNoMtpSidecar = "none";
  // Throws gguf::Error with a one-line message for anything malformed or unsupported.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opts);
  static std::unique_ptr<Model> load(const std::string& path) { return load(path, LoadOptions{}); }
  // The same from a GGUF image in memory (tests and fuzzers). The model points into
  // `data`, which must outlive it; `name` appears in error messages.
  static std::unique_ptr<Model> load_buffer(const uint8_t* data, size_t size, const std::string& name,
                                            const LoadOptions& opts);

  const HParams& hparams() const { return hp_; }

  // Replaces matrices in every forward pass that starts after this call; passes already
  // running finish with the weights they started with. `replacements` is the complete set
  // wanted on top of the file's weights (later entries win over earlier ones for the same
  // matrix; an empty list restores the file's weights). Every entry is checked first
  // (tensor name, expert, byte size for its type and shape): a bad one throws
  // std::invalid_argument naming it, and nothing changes. Replaced Q4_K/Q6_K matrices are
  // repacked like the file's. Thread-safe.
  void set_replacements(std::vector<MatrixReplacement> replacements);
  // The weights a pass starting now would read.
  std::shared_ptr<const WeightSet> weights() const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::File& file() const { return *file_; }
  // The MTP sidecar the MTP blocks came from (empty: none, they are in file()).
  const std::string& mtp_sidecar_path() const { return mtp_sidecar_path_; }
  const LayerWeights& layer(int il) const { return layers_[size_t(il)]; }
  const WeightMatrix& token_embd() const { return token_embd_; }
  const WeightMatrix& output() const { return output_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const std::vector<float>& rope_freqs() const { return rope_freqs_; }  // empty if absent
  bool has_mtp() const { return n_mtp_loaded_ > 0; }
  int32_t n_mtp_loaded() const { return n_mtp_loaded_; }
  // Bytes of all weight tensors (file size minus metadata).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Bytes of the repacked copies made at load (LoadOptions::repack), 0 if none.
  uint64_t repacked_bytes() const { return repacked_bytes_; }
  // Bytes the routed experts' copies take once all are repacked on first use (0: not
  // repacked on first use), and how many of those bytes are repacked so far.
  uint64_t lazy_repack_bytes() const { return lazy_bytes_; }
  uint64_t lazy_repacked_so_far() const { return lazy_done_bytes_.load(std::memory_order_relaxed); }
  // Repacks those of the n experts of MoE block il (expert ids) that are repacked on first
  // use and not yet, on `pool`. The forward pass calls it before computing them; several
  // passes may call it at once.
  // Under a memory budget it also reads those not in the expert cache and keeps them there
  // until the returned lease is dropped (std::runtime_error when a read fails).
  offload::ExpertCache::Lease prepare_experts(int il, const int32_t* experts, int64_t n, ThreadPool& pool) const;
  // The expert cache of a model loaded under a memory budget (null: none).
  const offload::ExpertCache* expert_cache() const { return expert_cache_.get(); }
  // The same for every expert of every MoE block: the state a server reaches once its
  // traffic has routed to each expert (bench times that state, as a peer that repacks at
  // load does).
  void prepare_all_experts(ThreadPool& pool) const;
  // Weight bytes one decode token reads: everything but the embedding table and the
  // experts, plus n_expert_used of the routed experts per MoE layer (the roofline input).
  uint64_t active_weight_bytes_per_token() const;

  // KV layer shapes of the trunk (and, with `with_mtp`, the MTP blocks after it).
  std::vector<KvLayerShape> kv_layers(bool with_mtp = false) const;

  // One forward pass over `chunks` (each continues its own sequence in `kv`, whose layers
  // are kv_layers()). Writes the chunks' K/V, advances each seq->n_pos, and fills `out`.
  // Sliding-window blocks that fell out of the window stay until the caller releases them
  // (KvPool::trim_swa), so it can first hand them to a prefix cache.
  // Throws std::length_error / std::out_of_range for chunks that do not fit or bad token
  // ids (before touching any cache), std::runtime_error when the pool lacks blocks.
  void forward(KvPool& kv, const std::vector<SeqChunk>& chunks, BatchOutput& out, Workspace& ws,
               ThreadPool& pool, const ForwardOptions& opts = {}) const;

  // architecture.md "MTP heads": MTP block k (0-based) over `chunks`: token x_p paired with the
  // hidden state in row p of h_in (all chunks' tokens in order, n_embd floats each: the trunk's
  // output at p-1 for block 0, or the previous block's output). `kv` holds only this block's layer
  // (mtp_kv_layer(k)). Logit rows come from the block's own head (or the trunk's); hidden rows are
  // the block's output before the head's norm (the next block's input).
  void forward_mtp(int k, KvPool& kv, const std::vector<SeqChunk>& chunks, const float* h_in, BatchOutput& out,
                   Workspace& ws, ThreadPool& pool, const ForwardOptions& opts = {}) const;
  // Expert parallelism: routed experts that `x` does not compute locally are handed to it
  // (nullptr: all local, the default). The observer sees every MoE block's expert counts.
  // Neither is owned; both must outlive the forward passes that use them.
  void set_expert_executor(ExpertExecutor* x) { experts_ = x; }
  void set_expert_observer(ExpertCountObserver* o) { expert_observer_ = o; }

  KvLayerShape mtp_kv_layer(int k) const {
    const LayerHParams& L = hp_.layers[size_t(hp_.n_layer + k)];
    return {L.is_swa, L.n_head_kv, hp_.head_dim_k, hp_.head_dim_v};
  }

 private:
  Model() = default;
  static std::unique_ptr<Model> load_parsed(std::unique_ptr<gguf::File> file, std::unique_ptr<gguf::File> mtp_file,
                                            const LoadOptions& opts);
  void load_hparams();
  // Takes the MTP blocks' hyperparameters from the sidecar after checking it fits.
  void adopt_mtp_sidecar_hparams();
  void load_tensors(const LoadOptions& opts);
  // Gives the kernel back the file pages of a matrix that now lives in a copy.
  void release_pages(const void* p, size_t n) const;
  void repack_weights(LoadOptions::ExpertRepack experts);
  // What repacking every matrix that can be repacked would add to the resident weights
  // (copies minus the file rows they replace; 0 where a copy is no larger).
  uint64_t repack_growth_bytes() const;
  // LoadOptions::mem_budget: the expert cache, or the error naming the minimum budget.
  void start_expert_cache(const LoadOptions& opts);
  void keep_experts_out_of_page_cache() const;
  // Bytes of the resident weights besides the routed experts (dense weights and their copies).
  uint64_t dense_resident_bytes(uint64_t expert_bytes) const;

  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<gguf::File> mtp_file_;  // the MTP sidecar, if the blocks come from one
  std::string mtp_sidecar_path_;
  std::unique_ptr<Tokenizer> tokenizer_;
  HParams hp_;
  std::vector<LayerWeights> layers_;
  WeightMatrix token_embd_, output_;
  std::vector<float> output_norm_;
  std::vector<float> rope_freqs_;  // empty if absent
  int32_t n_mtp_loaded_ = 0;
  uint64_t weight_bytes_ = 0;
  std::vector<kernels::AlignedBytes> packed_;  // owners of the WeightMatrix::packed copies
  uint64_t repacked_bytes_ = 0;
  uint64_t repacked_rows_bytes_ = 0;  // the file rows those copies replace
  std::vector<std::unique_ptr<ResidentMatrices>> resident_;  // expert residency, per tensor
  std::unique_ptr<offload::ExpertCache> expert_cache_;
  // Experts repacked on first use: their address space, and one LazyPacked per tensor.
  std::unique_ptr<kernels::ReservedBytes> lazy_space_;
  std::vector<std::unique_ptr<LazyPacked>> lazy_packed_;
  uint64_t lazy_bytes_ = 0;
  mutable std::atomic<uint64_t> lazy_done_bytes_{0};
  mutable std::mutex lazy_mu_;  // one pass repacks at a time
  ExpertExecutor* experts_ = nullptr;
  ExpertCountObserver* expert_observer_ = nullptr;
  // The weights passes read (the file's until set_replacements), and a version counter.
  mutable std::mutex weights_mu_;
  std::shared_ptr<const WeightSet> weights_;
  uint64_t weights_version_ = 0;

  friend class ForwardPass;
};

}  // namespace step35
