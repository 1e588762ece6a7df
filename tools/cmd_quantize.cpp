// step35 quantize: converts a step35 GGUF to another file type with llama-quantize's
// per-tensor recipe and encoders (src/quantize/quantize.h); progress and a summary on stderr.
#include <cstdio>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "quantize/quantize.h"

namespace step35::cli {

static int quantize_main(const Args& args) {
  ArgParser p("quantize",
              "Quantizes a step35 GGUF as llama-quantize does without an importance matrix: the same type\n"
              "for every tensor and the same bytes. Input tensors may be F32, F16, BF16 or already quantized\n"
              "(dequantized first, with a warning). A split input is read whole; the output is one file.\n"
              "Of the IQ types, IQ4_NL and IQ4_XS need no importance matrix and are written; the others are not.");
  p.positional("IN", "input GGUF (first part of a split model)");
  p.positional("OUT", "output GGUF (must not be the input)");
  p.positional("TYPE", "target file type, case-insensitive: " + file_type_names() +
                           "\n      (Q3_K, Q4_K, Q5_K are llama-quantize's aliases of the _M mixes)");
  QuantizeOptions opts;
  opts.n_threads = default_threads();
  add_threads_flag(p, opts.n_threads);
  if (!p.parse(args)) return 0;
  if (p.positionals().size() != 3) throw UsageError("expected IN OUT TYPE (see --help)");
  const std::string& in = p.positionals()[0];
  const std::string& out = p.positionals()[1];
  const std::string& type_name = p.positionals()[2];
  const auto type = file_type_from_name(type_name);
  if (!type) {
    std::string why = "unknown TYPE '" + type_name + "'";
    if (type_name.size() > 1 && (type_name[0] == 'I' || type_name[0] == 'i'))
      why += " (IQ types other than IQ4_NL and IQ4_XS need an importance matrix, which step35 quantize does not use)";
    throw UsageError(why + "; expected one of " + file_type_names());
  }
  opts.type = *type;
  opts.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };

  const QuantizeSummary s = quantize_gguf(in, out, opts);
  const double mib = 1024.0 * 1024.0;
  std::fprintf(stderr, "\nwrote %s: %s, %zu tensors (%zu converted, %zu copied, %zu fallbacks)\n", out.c_str(),
               file_type_name(*type), s.n_tensors, s.n_quantized, s.n_tensors - s.n_quantized, s.n_fallback);
  std::fprintf(stderr, "  tensor data %.2f MiB -> %.2f MiB (%.2f -> %.2f bits per weight), file %llu bytes\n",
               double(s.input_bytes) / mib, double(s.output_bytes) / mib,
               s.n_elements ? 8.0 * double(s.input_bytes) / double(s.n_elements) : 0.0,
               s.n_elements ? 8.0 * double(s.output_bytes) / double(s.n_elements) : 0.0,
               (unsigned long long)s.output_file_bytes);
  for (const auto& [name, t] : s.by_type)
    std::fprintf(stderr, "  %-7s %5zu tensors %10.2f MiB  %5.2f bits per weight\n", name.c_str(), t.tensors,
                 double(t.bytes) / mib, t.elements ? 8.0 * double(t.bytes) / double(t.elements) : 0.0);
  std::fprintf(stderr, "  time %.2f s with %d thread%s\n", s.seconds, opts.n_threads, opts.n_threads > 1 ? "s" : "");
  return 0;
}

int cmd_quantize(const Args& args) { return run_guarded("quantize", quantize_main, args); }

}  // namespace step35::cli
