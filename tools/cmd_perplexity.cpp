// step35 perplexity: perplexity of a model over a text, and KL divergence against a base
// model's saved log-probabilities, by llama-perplexity's procedure and in its output layout
// (src/perplexity/). Results on stdout, progress on stderr.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "perplexity/base_file.h"
#include "perplexity/chunk_runner.h"
#include "perplexity/measure.h"
#include "perplexity/report.h"
#include "exec/thread_pool.h"

namespace step35::cli {

namespace {

using namespace step35::perplexity;


// The whole file, less one trailing newline (llama.cpp's -f drops it too).
std::string read_text_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot read text file " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) throw std::runtime_error("cannot read text file " + path + ": " + std::strerror(err));
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::vector<int32_t> tokenize_text(const Model& model, const std::string& path, const std::string& text) {
  std::fprintf(stderr, "perplexity: tokenizing the input ..\n");
  const double t0 = now_seconds();
  std::vector<int32_t> tokens = model.tokenizer().encode(text, true, false);
  std::fprintf(stderr, "perplexity: %s: %zu bytes, %zu tokens (tokenized in %.0f ms)\n", path.c_str(), text.size(),
               tokens.size(), (now_seconds() - t0) * 1e3);
  return tokens;
}

void check_ctx_fits(const Model& model, int32_t n_ctx) {
  const int32_t n_ctx_train = model.hparams().n_ctx_train;
  if (n_ctx > n_ctx_train)
    throw UsageError("-c " + std::to_string(n_ctx) + " is larger than the model's context of " +
                     std::to_string(n_ctx_train) + " tokens");
}

// Timing of the first chunk as an estimate of the whole run (stderr), as llama.cpp does.
void print_eta(double seconds_per_chunk, int32_t n_chunk) {
  std::fprintf(stderr, "perplexity: %.2f seconds per pass - ETA ", seconds_per_chunk);
  int total = int(seconds_per_chunk * n_chunk);
  if (total >= 3600) {
    std::fprintf(stderr, "%d hours ", total / 3600);
    total %= 3600;
  }
  std::fprintf(stderr, "%.2f minutes\n", total / 60.0);
}

void print_stdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// An empty line, then `s` (two writes: GCC 12 warns falsely on "\n" + std::string).
void print_stdout_after_blank_line(const std::string& s) {
  print_stdout("\n");
  print_stdout(s);
}

void print_done(int32_t n_chunk, int32_t n_ctx, double t0) {
  const double dt = now_seconds() - t0;
  const double n_tokens = double(n_chunk) * n_ctx;
  std::fprintf(stderr, "perplexity: %d chunks of %d tokens in %.2f s (%.1f tokens/s)\n", n_chunk, n_ctx, dt,
               dt > 0 ? n_tokens / dt : 0.0);
}

// perplexity's settings, with their defaults (what --help shows).
struct Options {
  int32_t n_ctx = 512;     // llama-perplexity's default -c
  int32_t n_batch = 2048;  // llama.cpp's default -b
  int32_t max_chunks = std::numeric_limits<int32_t>::max();
  int32_t n_threads = default_threads();
  bool exact = false;
  KvTypes kv_types;         // llama-perplexity's default: f16 keys and values
  std::string mem_budget;
  Precision precision() const { return exact ? Precision::Exact : Precision::Native; }
};

int run_perplexity(const ArgParser& p, const Model& model, const std::string& text, const Options& o) {
  const int32_t n_ctx = o.n_ctx;
  check_ctx_fits(model, n_ctx);
  const std::vector<int32_t> tokens = tokenize_text(model, p.str("file"), text);
  if (int64_t(tokens.size()) < 2 * int64_t(n_ctx))
    throw std::runtime_error(p.str("file") + " tokenizes to only " + std::to_string(tokens.size()) +
                             " tokens; a context of " + std::to_string(n_ctx) + " needs at least " +
                             std::to_string(2 * int64_t(n_ctx)) + " (lower -c or use a longer text)");
  const int32_t n_chunk = std::min<int32_t>(o.max_chunks, int32_t(tokens.size() / size_t(n_ctx)));
  const int32_t batch = std::min(o.n_batch, n_ctx);
  std::fprintf(stderr, "perplexity: calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d, n_seq=1\n",
               n_chunk, n_ctx, batch);

  std::unique_ptr<BaseFileWriter> base;
  if (p.has("kl-divergence-base")) {
    base = std::make_unique<BaseFileWriter>(p.str("kl-divergence-base"), n_ctx, model.hparams().n_vocab, n_chunk,
                                            tokens.data());
    std::fprintf(stderr, "perplexity: saving the log-probabilities of every scored token to %s\n",
                 p.str("kl-divergence-base").c_str());
  }
  ChunkRunner runner(model, n_ctx, batch, o.precision(), o.kv_types);
  ThreadPool pool(o.n_threads);
  const double t0 = now_seconds();
  const PerplexitySums sums =
      measure_perplexity(runner, pool, tokens, n_chunk, base.get(), [&](int32_t c, const PerplexitySums& s) {
        if (c == 0) print_eta(now_seconds() - t0, n_chunk);
        print_stdout(running_estimate(c, s));
      });
  print_stdout_after_blank_line(final_estimate(sums));
  if (base) base->close();
  print_done(n_chunk, n_ctx, t0);
  return 0;
}

int run_kl_divergence(const ArgParser& p, const Model& model, BaseFileReader& base, const std::string* text,
                      const Options& o) {
  const std::string base_path = p.str("kl-divergence-base");
  const BaseHeader& h = base.header();
  const int32_t n_vocab = model.hparams().n_vocab;
  if (h.n_vocab != n_vocab)
    throw std::runtime_error("base file " + base_path + " was made with a vocabulary of " + std::to_string(h.n_vocab) +
                             " tokens, this model has " + std::to_string(n_vocab));
  if (p.has("ctx-size") && o.n_ctx != h.n_ctx)
    throw std::runtime_error("base file " + base_path + " was made with a context of " + std::to_string(h.n_ctx) +
                             " tokens, not -c " + p.str("ctx-size") + " (omit -c to use the base's)");
  if (h.n_ctx > model.hparams().n_ctx_train)
    throw std::runtime_error("base file " + base_path + " was made with a context of " + std::to_string(h.n_ctx) +
                             " tokens, larger than this model's context of " +
                             std::to_string(model.hparams().n_ctx_train));
  if (text) {
    // The base holds the tokens it was computed on; a text given here must be that text.
    const std::vector<int32_t> tokens = tokenize_text(model, p.str("file"), *text);
    for (size_t i = 0; i < h.tokens.size(); ++i) {
      if (i >= tokens.size())
        throw std::runtime_error("base file " + base_path + " does not match " + p.str("file") + ": the base holds " +
                                 std::to_string(h.tokens.size()) + " tokens, the text only " +
                                 std::to_string(tokens.size()));
      if (tokens[i] != h.tokens[i])
        throw std::runtime_error("base file " + base_path + " does not match " + p.str("file") + ": token " +
                                 std::to_string(i) + " is " + std::to_string(h.tokens[i]) + " in the base, " +
                                 std::to_string(tokens[i]) + " in the text");
    }
  }
  const int32_t n_chunk = std::min(o.max_chunks, h.n_chunk);
  const int32_t batch = std::min(o.n_batch, h.n_ctx);
  std::fprintf(stderr, "kl_divergence: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=1\n", n_chunk,
               h.n_ctx, batch);
  ChunkRunner runner(model, h.n_ctx, batch, o.precision(), o.kv_types);
  ThreadPool pool(o.n_threads);
  const double t0 = now_seconds();
  print_stdout_after_blank_line(kl_table_header());
  KlMeasurement m = measure_kl_divergence(runner, pool, base, n_chunk, [&](int32_t c, const KlSums& s) {
    if (c == 0) print_eta(now_seconds() - t0, n_chunk);
    print_stdout(kl_chunk_line(c, s));
  });
  print_stdout_after_blank_line(kl_summary(m.sums, m.kld, m.p_diff));
  if (m.sums.count < kMinPositionsForSummary)
    std::fprintf(stderr, "perplexity: only %zu scored tokens: no closing statistics below %zu (as llama.cpp)\n",
                 m.sums.count, kMinPositionsForSummary);
  print_done(n_chunk, h.n_ctx, t0);
  return 0;
}

}  // namespace

static int perplexity_main(const Args& args) {
  ArgParser p("perplexity",
              "Perplexity of the model over a text, by llama-perplexity's procedure: the text is tokenized\n"
              "with BOS and cut into chunks of N tokens; each chunk runs from an empty context with its first\n"
              "token replaced by BOS, and the tokens of its second half are scored. Prints the running\n"
              "estimate [1]x,[2]y,... and 'Final estimate: PPL = X +/- E' on stdout, progress on stderr.\n"
              "With --kl-divergence-base FILE it also saves the log-probabilities of every scored token\n"
              "(llama-perplexity's file format); adding --kl-divergence reads such a file instead and reports\n"
              "this model's KL divergence, top-token agreement and perplexity change against that base.");
  p.flag("-m,--model", "FILE", "GGUF model");
  p.flag("-f,--file", "TEXT", "text file (one trailing newline is dropped, as llama.cpp does); optional with "
                              "--kl-divergence, where it must match the base's tokens");
  Options o;
  p.option("-c,--ctx-size", "N", "tokens per chunk, at most the model's context; with --kl-divergence the base's",
           o.n_ctx, 3, 1 << 30);
  p.option("--chunks", "K", "score at most K chunks", o.max_chunks, 1, std::numeric_limits<int32_t>::max(), "all");
  p.option("-b,--batch-size", "N", "most tokens per forward pass", o.n_batch, 1, 1 << 20);
  add_threads_flag(p, o.n_threads);
  p.option("--exact", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)",
           o.exact);
  add_kv_cache_flags(p, o.kv_types);
  add_mem_budget_flag(p, o.mem_budget);
  p.flag("--kl-divergence-base", "FILE",
         "without --kl-divergence: save the base log-probabilities there; with it: read them");
  p.flag("--kl-divergence", "", "report KL divergence and the other statistics against --kl-divergence-base");
  if (!p.parse(args)) return 0;
  if (!p.has("model")) throw UsageError("-m MODEL is required");
  const bool kl = p.has("kl-divergence");
  if (kl && !p.has("kl-divergence-base"))
    throw UsageError("--kl-divergence needs --kl-divergence-base FILE (the base model's saved log-probabilities)");
  if (!kl && !p.has("file")) throw UsageError("-f TEXT is required");
  // The text and the base are read before the model: a wrong path fails at once.
  std::unique_ptr<std::string> text;
  if (p.has("file")) text = std::make_unique<std::string>(read_text_file(p.str("file")));
  std::unique_ptr<BaseFileReader> base;
  if (kl) base = std::make_unique<BaseFileReader>(p.str("kl-divergence-base"));
  auto model = load_model(p.str("model"), false, "", {parse_mem_size(o.mem_budget), o.n_ctx, o.kv_types});
  return kl ? run_kl_divergence(p, *model, *base, text.get(), o) : run_perplexity(p, *model, *text, o);
}

int cmd_perplexity(const Args& args) { return run_guarded("perplexity", perplexity_main, args); }

}  // namespace step35::cli
