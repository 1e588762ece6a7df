// Loading maps the file and does not copy or dequantize the weights: resident memory
// after load stays far below the file size until a forward pass touches the pages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "model/session.h"
#include "model/step35.h"
#include "runtime/thread_pool.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * size_t(sysconf(_SC_PAGESIZE));
}

// GCC defines __SANITIZE_ADDRESS__; clang (before 16) only answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define STEP35_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STEP35_UNDER_ASAN 1
#endif
#endif

TEST(Memory, LoadDoesNotCopyWeights) {
#if defined(STEP35_UNDER_ASAN)
  GTEST_SKIP() << "resident memory is not meaningful under AddressSanitizer (shadow memory, quarantine)";
#endif
  // A model big enough that metadata and norms are a small fraction: ~80 MB of F32.
  const std::string path = tmp_dir() + "/memory-test-f32.gguf";
  if (!file_exists(path)) {
    const std::string cmd = "python3 '" + std::string(STEP35_SHARED_TOOLS_DIR) + "/make_tiny_step35.py' --out '" + path + ".part" +
                            "' --seed 5 --layers 4 --embd 512 --heads-full 8 --heads-swa 8 --kv-heads 2 --head-dim 64"
                            " --experts 16 --top-k 2 --dense-layers 1 --ff 1024 --moe-ff 256 --window 32 --mtp-layers 0"
                            " --fast --quiet";
    std::string err;
    if (run_command(cmd, nullptr, &err) != 0 || std::rename((path + ".part").c_str(), path.c_str()) != 0)
      GTEST_SKIP() << "cannot generate the test model: " << err;
  }
  const size_t file_size = read_bytes(path).size();
  ASSERT_GT(file_size, size_t(50) << 20);
  // Drop this process's own pages of the file (read_bytes above used a private buffer).
  const size_t before = resident_bytes();
  Model::LoadOptions opts;
  opts.verbose = false;
  auto model = Model::load(path, opts);
  const size_t after_load = resident_bytes();
  const double load_delta = double(after_load) - double(before);
  std::printf("[memory] file %.1f MiB, resident after load +%.2f MiB\n", double(file_size) / (1 << 20),
              load_delta / (1 << 20));
  RecordProperty("load_delta_bytes", std::to_string(load_delta));
  EXPECT_LT(load_delta, 0.1 * double(file_size));

  // A forward pass touches the weights it uses; resident memory grows accordingly (this
  // shows the measurement sees mapped pages at all).
  ThreadPool pool(1);
  Session session(*model, 64, 64);
  std::vector<int32_t> tokens(32);
  for (int i = 0; i < 32; ++i) tokens[size_t(i)] = 3 + i * 7;
  std::vector<float> logits;
  session.forward(tokens.data(), 32, false, logits, pool);
  const double run_delta = double(resident_bytes()) - double(before);
  std::printf("[memory] resident after a 32-token forward pass +%.2f MiB\n", run_delta / (1 << 20));
  EXPECT_GT(run_delta, load_delta + 0.3 * double(file_size));
}

}  // namespace
