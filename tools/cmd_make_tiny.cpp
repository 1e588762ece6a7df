// step35 make-tiny: writes a random-weight step35 GGUF (src/tinymodel/make_tiny.h) and prints
// one JSON line describing it.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "tinymodel/make_tiny.h"
#include "tensor/dtype.h"

namespace step35::cli {

static int make_tiny_main(const Args& args) {
  ArgParser p("make-tiny",
              "Writes a random-weight step35 GGUF with the real model's proportions (deterministic: the\n"
              "same options give a byte-identical file) and prints a JSON summary line.\n"
              "Presets: tiny (8 layers + 1 MTP block, ~14 M parameters) and bench (the benchmark shape of\n"
              "../shared/docs/peer.md: 12 layers + 1 MTP block, 713 M parameters).");
  TinyModelOptions opts;
  std::string out, type = dtype_name(opts.weight_type);
  p.option("--out", "FILE", "output .gguf path (required)", out);
  p.option("--preset", "NAME", "tiny (14M parameters, ~57 MB in F32) or bench (the benchmark shape of "
           "../shared/docs/peer.md)", opts.preset);
  p.option("--seed", "S", "weight seed (unsigned 64-bit)", opts.seed);
  p.option("--type", "TYPE", "storage type of the weight matrices: f32, f16, bf16 or q8_0 (norms, router, biases and "
           "rope_freqs stay f32)", type);
  p.option("--name", "NAME", "general.name", opts.name, "the output file name without .gguf");
  p.option("--hot-experts", "H", "router bias that makes a few experts hot, as trained routers do: each MoE block's "
           "experts in a seeded random order, rank r biased by -H*ln(1+r) (0.2 on the bench preset: a cache of 27 % of "
           "the experts then holds 85 % of decode picks instead of 40 %; docs/memory.md)", opts.hot_experts, 0, 10, "0: the near-even spread of a random router");
  if (!p.parse(args)) return 0;

  if (out.empty()) throw UsageError("--out FILE is required (see --help)");
  if (opts.preset != "tiny" && opts.preset != "bench")
    throw UsageError("--preset expects tiny or bench, got '" + opts.preset + "'");
  const auto t = dtype_from_name(type);
  if (!t || (*t != DType::F32 && *t != DType::F16 && *t != DType::BF16 && *t != DType::Q8_0))
    throw UsageError("--type expects f32, f16, bf16 or q8_0, got '" + type + "'");
  opts.weight_type = *t;
  if (p.has("name") && opts.name.empty()) throw UsageError("--name must not be empty");

  const double t0 = now_seconds();
  TinyModelSummary s;
  make_tiny_model(opts, out, &s);  // I/O errors propagate: exit status 1
  nlohmann::json j = {
      {"path", out},
      {"preset", opts.preset},
      {"type", dtype_name(opts.weight_type)},
      {"seed", opts.seed},
      {"bytes", s.bytes},
      {"params", s.params},
      {"tensors", s.n_tensors},
      {"layers", s.n_layer},
      {"n_mtp", s.n_mtp},
      {"block_count", s.n_layer + s.n_mtp},
      {"n_vocab", s.n_vocab},
      {"n_merges", s.n_merges},
      {"seconds", double(int64_t((now_seconds() - t0) * 1000.0)) / 1000.0},
  };
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int cmd_make_tiny(const Args& args) { return run_guarded("make-tiny", make_tiny_main, args); }

}  // namespace step35::cli
