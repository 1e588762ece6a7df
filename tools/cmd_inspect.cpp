// step35 inspect: architecture, hyperparameters, per-layer schedule, tensor types and
// bytes, tokenizer summary, and the KV cache a given context would need; for an mmproj
// file, the vision tower.
#include <cstdio>
#include <map>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "engine/generator.h"
#include "gguf/gguf.h"
#include "tensor/dtype.h"
#include "vision/step3vl_encoder.h"

namespace step35::cli {

namespace {

// Per ggml type: tensors, parameters, bytes, share of the tensor bytes and bits per weight
// (a mixed file such as a community IQ quantisation holds five or six types).
void print_tensor_types(const gguf::File& f) {
  struct TypeTotals {
    size_t tensors = 0;
    uint64_t elements = 0, bytes = 0;
  };
  std::map<std::string, TypeTotals> by_type;
  TypeTotals all;
  for (const auto& t : f.tensors()) {
    uint64_t elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) elements *= uint64_t(t.ne[d]);
    for (TypeTotals* e : {&by_type[dtype_info(t.type) ? dtype_info(t.type)->name : "?"], &all}) {
      e->tensors++;
      e->elements += elements;
      e->bytes += t.nbytes;
    }
  }
  auto bpw = [](const TypeTotals& e) { return e.elements ? 8.0 * double(e.bytes) / double(e.elements) : 0.0; };
  std::printf("\ntensors:       %zu, %.2f M parameters, %.2f MiB, %.2f bits per weight\n", all.tensors,
              double(all.elements) / 1e6, double(all.bytes) / (1 << 20), bpw(all));
  std::printf("  %-8s %7s %14s %12s %7s %8s\n", "type", "tensors", "parameters", "MiB", "bytes", "bits/w");
  for (const auto& [name, e] : by_type)
    std::printf("  %-8s %7zu %14llu %12.2f %6.1f%% %8.3f\n", name.c_str(), e.tensors, (unsigned long long)e.elements,
                double(e.bytes) / (1 << 20), all.bytes ? 100.0 * double(e.bytes) / double(all.bytes) : 0.0, bpw(e));
}

// --metadata, --tensors.
void print_metadata_and_tensors(const gguf::File& f, const ArgParser& p) {
  if (p.has("metadata")) {
    std::printf("\nmetadata:\n");
    for (const auto& [k, v] : f.metadata()) std::printf("  %s = %s\n", k.c_str(), v.to_string().c_str());
  }
  if (p.has("tensors")) {
    std::printf("\n");
    for (const auto& t : f.tensors()) {
      std::printf("  %-40s %-7s {", t.name.c_str(), dtype_info(t.type) ? dtype_info(t.type)->name : "?");
      for (uint32_t d = 0; d < t.n_dims; ++d) std::printf("%s%lld", d ? ", " : "", (long long)t.ne[d]);
      std::printf("}  %llu bytes\n", (unsigned long long)t.nbytes);
    }
  }
}

// A vision tower (`clip` architecture, an mmproj file): what the server and run need to know.
int inspect_mmproj(const std::string& path, const ArgParser& p) {
  std::unique_ptr<vision::Step3vlEncoder> tower;
  try {
    tower = vision::Step3vlEncoder::load(path);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const gguf::File& f = tower->file();
  const vision::Step3vlConfig& c = tower->config();
  std::printf("file:          %s (%.1f MiB, GGUF v%u)\n", path.c_str(), double(f.total_file_bytes()) / (1 << 20),
              f.version());
  std::printf("architecture:  clip (vision tower, projector %s)  name: %s\n",
              f.opt_str("clip.projector_type").value_or("step3vl").c_str(), f.opt_str("general.name").value_or("-").c_str());
  std::printf("encoder:       %d layers, width %d, %d heads, %.2f M parameters; projects to %d (the text model's "
              "embedding)\n",
              tower->n_layers(), tower->width(), tower->n_heads(), double(tower->n_params()) / 1e6,
              tower->projection_dim());
  std::printf("pictures:      patch %d, overview %d px (%d tokens), slices %d px (%d tokens), longest side kept %d px\n",
              c.patch_size, c.image_size, c.tokens_per_side(c.image_size) * c.tokens_per_side(c.image_size),
              c.slice_size, c.tokens_per_side(c.slice_size) * c.tokens_per_side(c.slice_size), c.preproc_image_size);
  print_tensor_types(f);
  print_metadata_and_tensors(f, p);
  return 0;
}

}  // namespace

static int inspect_main(const Args& args) {
  ArgParser p("inspect", "Describes a step35 GGUF model, or a vision tower (a step3vl mmproj GGUF).");
  p.positional("MODEL", "GGUF file (first part of a split model)");
  p.flag("-m,--model", "FILE", "same as MODEL");
  int32_t n_ctx = 0;
  std::string mtp_model;
  add_mtp_model_flag(p, mtp_model);
  p.option("-c,--ctx-size", "N", "context size for the KV cache estimate", n_ctx, 1, 1 << 30,
           "the model's training context");
  KvTypes kv_types;
  add_kv_cache_flags(p, kv_types);
  p.flag("--metadata", "", "also list every metadata key");
  p.flag("--tensors", "", "also list every tensor");
  if (!p.parse(args)) return 0;
  std::string path = p.positionals().empty() ? p.str("model") : p.positionals()[0];
  if (path.empty()) throw UsageError("MODEL is required");
  if (gguf::File::open(path)->opt_str("general.architecture") == "clip") return inspect_mmproj(path, p);
  auto model = load_model(path, true, mtp_model);
  KvPool::block_bytes(model->kv_layers(), KvPool::kDefaultBlockSize, kv_types);  // types the heads cannot take: error now
  const gguf::File& f = model->file();
  const HParams& hp = model->hparams();
  const Tokenizer& tok = model->tokenizer();

  std::printf("file:          %s (%zu part%s, %.1f MiB, GGUF v%u, alignment %u)\n", path.c_str(), f.n_files(),
              f.n_files() > 1 ? "s" : "", double(f.total_file_bytes()) / (1 << 20), f.version(), f.alignment());
  std::printf("architecture:  %s  name: %s\n", f.get_str("general.architecture").c_str(),
              f.opt_str("general.name").value_or("-").c_str());
  std::printf("layers:        %d trunk + %d MTP declared (%d MTP loaded)\n", hp.n_layer, hp.n_mtp,
              model->n_mtp_loaded());
  if (!model->mtp_sidecar_path().empty()) std::printf("mtp sidecar:   %s\n", model->mtp_sidecar_path().c_str());
  std::printf("embedding:     %d   vocab: %d   head dim: %d (K) / %d (V)\n", hp.n_embd, hp.n_vocab,
              hp.head_dim_k, hp.head_dim_v);
  std::printf("attention:     sliding window %d, rms eps %g, context (training) %d\n", hp.swa_window,
              double(hp.rms_eps), hp.n_ctx_train);
  std::printf("experts:       %d, gating %s, weights %snormalised, scale %g, shared ff %d\n", hp.n_expert,
              hp.gating_sigmoid ? "sigmoid" : "softmax", hp.expert_weights_norm ? "" : "not ",
              double(hp.expert_weights_scale), hp.n_ff_shexp);
  std::printf("\n  il  attn  heads  kv  rot  rope base   ffn    ff/exp  top-k  clamp exp/shexp\n");
  for (size_t il = 0; il < hp.layers.size(); ++il) {
    const LayerHParams& L = hp.layers[il];
    std::printf("  %2zu  %-4s  %5d  %2d  %3d  %-10g  %-5s  %6d  %5d  %g / %g%s\n", il, L.is_swa ? "swa" : "full",
                L.n_head, L.n_head_kv, L.n_rot, double(L.rope_base), L.is_moe ? "moe" : "dense",
                L.is_moe ? L.n_ff_exp : L.n_ff, L.is_moe ? L.n_expert_used : 0, double(L.clamp_exp),
                double(L.clamp_shexp), int(il) >= hp.n_layer ? "  (MTP)" : "");
  }
  print_tensor_types(f);
  std::printf("\ntokenizer:     %zu tokens, %zu merges, pre-tokenizer '%s', bos %d, eos %d, add_bos %s, "
              "%zu end-of-generation ids\n",
              tok.n_vocab(), tok.n_merges(), tok.pre_type().c_str(), tok.bos(), tok.eos(),
              tok.add_bos() ? "yes" : "no", tok.eog_ids().size());
  std::printf("chat template: %s\n", f.has("tokenizer.chat_template") ? "embedded" : "none (Step 3.5 format)");
  if (!p.has("ctx-size")) n_ctx = hp.n_ctx_train;
  // Same layout as the cache `run` would allocate (its default batch), without allocating it.
  const int32_t batch = GeneratorOptions{}.n_batch;
  const auto shapes = model->kv_layers();
  const auto [n_full_blocks, n_swa_blocks] = KvPool::blocks_for_sequence(shapes, n_ctx, hp.swa_window, batch);
  const auto [full_block_bytes, swa_block_bytes] = KvPool::block_bytes(shapes, KvPool::kDefaultBlockSize, kv_types);
  size_t full = 0, swa = 0, full_position = 0;
  for (const auto& s : shapes) {
    (s.is_swa ? swa : full)++;
    if (!s.is_swa) full_position += KvPool::position_bytes(s, kv_types);
  }
  const double bytes = double(n_full_blocks) * double(full_block_bytes) + double(n_swa_blocks) * double(swa_block_bytes);
  std::printf("kv cache:      %.1f MiB (K %s, V %s) at context %d: %zu full layers x %d + %zu SWA layers x %lld "
              "positions; %zu bytes per position of the full layers (%.1f MiB per 1K positions)\n",
              bytes / (1 << 20), dtype_name(kv_types.k), dtype_name(kv_types.v), n_ctx, full, n_ctx, swa,
              (long long)std::min<int64_t>(n_ctx, n_swa_blocks * KvPool::kDefaultBlockSize), full_position,
              double(full_position) * 1024.0 / (1 << 20));
  print_metadata_and_tensors(f, p);
  return 0;
}

int cmd_inspect(const Args& args) { return run_guarded("inspect", inspect_main, args); }

}  // namespace step35::cli
