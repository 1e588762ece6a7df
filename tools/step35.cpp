// step35: command-line entry point. Dispatches to the subcommands in tools/cmd_*.cpp.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "step35_build_info.h"
#include "tensor/kernels.h"

using namespace step35::cli;

static void print_usage() {
  std::fprintf(stderr,
               "usage: step35 <command> [options]\n"
               "\n"
               "commands:\n"
               "  run         generate text from a prompt (streams to stdout)\n"
               "  eval        run token ids as one batch, print logits/argmax/greedy as JSON\n"
               "  perplexity  perplexity of a text, KL divergence against a base model (as llama-perplexity)\n"
               "  tokenize    print the token ids of a text as JSON\n"
               "  inspect     describe a GGUF model (hyperparameters, tensors, tokenizer)\n"
               "  make-tiny   write a small random-weight step35 GGUF\n"
               "  bench       measure prompt and generation speed, memory bandwidth and the decode roofline\n"
               "  quantize    convert a GGUF to Q4_K_M, Q8_0, ... like llama-quantize\n"
               "  serve       OpenAI-compatible HTTP server with continuous batching\n"
               "  ep-plan     balance experts over ranks for expert parallelism (--ep) from recorded counts\n"
               "  finetune    train chosen experts / routers of a model on a text, write the trained slices as a patch\n"
               "  patch       inspect a patch file, or write a model with patches applied\n"
               "\n"
               "  -h, --help  this list\n"
               "  --version   the version, the commit built and the kernels this CPU gets\n"
               "\n"
               "run 'step35 <command> --help' for a command's options.\n");
}

// What a bug report needs: which step35 (version and commit), how it was built, and which
// kernels this CPU gets (chosen at run time from CPUID).
static void print_version() {
  namespace k = step35::kernels;
  std::printf("%s\n", STEP35_BUILD_INFO);
  std::printf("built with %s, %s\n", STEP35_COMPILER, STEP35_BUILD_TYPE);
  std::printf("kernels on this CPU: %s\n", k::cpu_summary().c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 1 : 0;
  }
  // The kernel level is chosen here, once, for every command: a STEP35_ISA naming a level
  // this CPU cannot run stops at once with what the CPU lacks, before any model is read.
  try {
    step35::kernels::active_isa();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step35: error: %s\n", e.what());
    return 1;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version")) {
    print_version();
    return 0;
  }
  const std::string cmd = argv[1];
  Args args(argv + 2, argv + argc);
  try {
    if (cmd == "run") return cmd_run(args);
    if (cmd == "eval") return cmd_eval(args);
    if (cmd == "perplexity") return cmd_perplexity(args);
    if (cmd == "tokenize") return cmd_tokenize(args);
    if (cmd == "inspect") return cmd_inspect(args);
    if (cmd == "make-tiny") return cmd_make_tiny(args);
    if (cmd == "bench") return cmd_bench(args);
    if (cmd == "quantize") return cmd_quantize(args);
    if (cmd == "serve") return cmd_serve(args);
    if (cmd == "ep-plan") return cmd_ep_plan(args);
    if (cmd == "finetune") return cmd_finetune(args);
    if (cmd == "patch") return cmd_patch(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step35 %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "step35: unknown command '%s'\n\n", cmd.c_str());
  print_usage();
  return 1;
}
