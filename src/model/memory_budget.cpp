// LoadOptions::mem_budget (docs/memory.md): the dense weights stay mapped, the routed experts
// move into an expert cache sized by what the budget leaves.
#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "model/step35.h"

namespace step35 {

namespace {

std::string budget_mib(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", double(bytes) / double(1 << 20));
  return s;
}

// Forward-pass scratch besides the KV cache (activations, logits, the workspace's buffers)
// at the batch sizes the commands use.
constexpr uint64_t kScratchBytes = uint64_t(32) << 20;

}  // namespace

uint64_t Model::dense_resident_bytes(uint64_t expert_bytes) const {
  // The mapped rows a pass reads, except those repacked (their copies are read instead).
  return weight_bytes_ - expert_bytes - repacked_rows_bytes_ + repacked_bytes_;
}

// The mapping stays for the dense weights, but a fault there reads around it (read_ahead_kb,
// often MiBs) and pulls experts' pages into the page cache, which counts against the same
// memory: no read-around anywhere, and the dense tensors read ahead explicitly instead.
void Model::keep_experts_out_of_page_cache() const {
  for (const gguf::File* f : {file_.get(), mtp_file_.get()}) {
    if (!f) continue;
    f->advise(nullptr, 0, gguf::MappedFile::Access::Random);
    for (const gguf::TensorInfo& t : f->tensors())
      if (t.name.find("_exps.") == std::string::npos && t.name != "token_embd.weight")
        f->advise(t.data, size_t(t.nbytes), gguf::MappedFile::Access::WillNeed);
  }
}

void Model::start_expert_cache(const LoadOptions& opts) {
  if (file_->path().empty()) throw std::invalid_argument("a memory budget needs a model file to read experts from");
  std::vector<std::vector<offload::ExpertTensor>> blocks(layers_.size());
  uint64_t expert_bytes = 0, n_experts = 0;
  int64_t most_in_a_block = 0;
  for (size_t il = 0; il < layers_.size(); ++il) {
    LayerWeights& W = layers_[il];
    if (!W.ffn_gate_exps.present()) continue;
    const gguf::File& f = mtp_file_ && int(il) >= hp_.n_layer ? *mtp_file_ : *file_;
    const std::pair<WeightMatrix*, const char*> tensors[] = {{&W.ffn_gate_exps, "ffn_gate_exps.weight"},
                                                             {&W.ffn_up_exps, "ffn_up_exps.weight"},
                                                             {&W.ffn_down_exps, "ffn_down_exps.weight"}};
    for (const auto& [w, name] : tensors) {
      const gguf::TensorInfo* t = f.find_tensor(block_tensor_name(int(il), name));
      if (!t) throw std::invalid_argument("a memory budget needs " + block_tensor_name(int(il), name));
      auto r = std::make_unique<ResidentMatrices>();
      r->where = std::make_unique<std::atomic<const uint8_t*>[]>(size_t(w->n_mat));
      for (int64_t m = 0; m < w->n_mat; ++m) r->where[size_t(m)].store(nullptr, std::memory_order_relaxed);
      w->resident = r.get();
      blocks[il].push_back({f.part_path(t->file_index), f.data_offset(t->file_index) + t->offset, w->mat_bytes(),
                            w->n_mat, r.get()});
      resident_.push_back(std::move(r));
      expert_bytes += w->total_bytes();
    }
    most_in_a_block = std::max(most_in_a_block, W.ffn_gate_exps.n_mat);
    n_experts += uint64_t(W.ffn_gate_exps.n_mat);
  }
  if (n_experts == 0) return;  // no routed experts: nothing to stream, the budget only checks
  const uint64_t dense = dense_resident_bytes(expert_bytes);
  const uint64_t slot = offload::ExpertCache::slot_bytes_for(blocks);
  uint64_t reserved = kScratchBytes;
  const int64_t positions =
      hp_.n_ctx_train > 0 ? std::min<int64_t>(opts.mem_kv_positions, hp_.n_ctx_train) : opts.mem_kv_positions;
  for (const KvLayerShape& l : kv_layers(true))
    reserved += KvPool::position_bytes(l, opts.mem_kv_types) *
                uint64_t(l.is_swa ? std::min<int64_t>(positions, hp_.swa_window + 512) : positions);
  const uint64_t minimum = dense + uint64_t(most_in_a_block) * slot + reserved;
  if (opts.mem_budget < minimum)
    throw std::invalid_argument("--mem-budget " + budget_mib(opts.mem_budget) + " is below this model's minimum of " +
                                budget_mib(minimum) + ": dense weights " + budget_mib(dense) + " + one MoE block's " +
                                std::to_string(most_in_a_block) + " experts " +
                                budget_mib(uint64_t(most_in_a_block) * slot) + " + KV cache and scratch " +
                                budget_mib(reserved));
  const uint64_t n_slots = std::min<uint64_t>((opts.mem_budget - dense - reserved) / slot, n_experts);
  expert_cache_ = std::make_unique<offload::ExpertCache>(std::move(blocks), int64_t(n_slots));
  keep_experts_out_of_page_cache();
  if (opts.verbose)
    std::fprintf(stderr, "expert cache: %llu of %llu experts in memory (%s, %s per expert)%s\n",
                 static_cast<unsigned long long>(n_slots), static_cast<unsigned long long>(n_experts),
                 budget_mib(n_slots * slot).c_str(), budget_mib(slot).c_str(),
                 expert_cache_->stats().direct_io ? ", direct I/O" : ", buffered reads (no direct I/O here)");
}

}  // namespace step35
