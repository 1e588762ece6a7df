// Loading maps the file and does not copy or dequantize the weights: resident memory
// after load stays far below the file size until a forward pass touches the pages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <vector>

#include "gguf/gguf.h"
#include "model/session.h"
#include "model/step35.h"
#include "exec/thread_pool.h"
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

// A model big enough that metadata and norms are a small fraction: ~80 MB of F32. Empty
// string when it cannot be made.
std::string f32_test_model(std::string* err) {
  const std::string path = tmp_dir() + "/memory-test-f32.gguf";
  if (!file_exists(path)) {
    const std::string cmd = "python3 '" + std::string(STEP35_SHARED_TOOLS_DIR) + "/make_tiny_step35.py' --out '" + path + ".part" +
                            "' --seed 5 --layers 4 --embd 512 --heads-full 8 --heads-swa 8 --kv-heads 2 --head-dim 64"
                            " --experts 16 --top-k 2 --dense-layers 1 --ff 1024 --moe-ff 256 --window 32 --mtp-layers 0"
                            " --fast --quiet";
    if (run_command(cmd, nullptr, err) != 0 || std::rename((path + ".part").c_str(), path.c_str()) != 0) return "";
  }
  return path;
}

// Skips where resident memory means nothing, and makes the test model (in `path`).
class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(STEP35_UNDER_ASAN)
    GTEST_SKIP() << "resident memory is not meaningful under AddressSanitizer (shadow memory, quarantine)";
#endif
    std::string err;
    path = f32_test_model(&err);
    if (path.empty()) GTEST_SKIP() << "cannot generate the test model: " << err;
  }
  std::string path;
};

TEST_F(Memory, LoadDoesNotCopyWeights) {
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

// gguf::File::release_pages (used after repacking weights): the released pages leave the
// resident set, and the bytes read the same afterwards.
TEST_F(Memory, ReleasedFilePagesLeaveResidentSetAndStayReadable) {
  auto file = gguf::File::open(path);
  const gguf::TensorInfo* big = nullptr;
  for (const auto& t : file->tensors())
    if (!big || t.nbytes > big->nbytes) big = &t;
  ASSERT_NE(big, nullptr);
  ASSERT_GT(big->nbytes, size_t(4) << 20);
  auto checksum = [&] {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < big->nbytes; i += 64) h = (h ^ big->data[i]) * 1099511628211ull;
    return h;
  };
  const uint64_t sum = checksum();  // maps every page of the tensor
  const size_t touched = resident_bytes();
  file->release_pages(big->data, big->nbytes);
  const size_t released = resident_bytes();
  std::printf("[memory] tensor %s %.1f MiB: resident %.1f -> %.1f MiB after release\n", big->name.c_str(),
              double(big->nbytes) / (1 << 20), double(touched) / (1 << 20), double(released) / (1 << 20));
  EXPECT_GT(double(touched) - double(released), 0.9 * double(big->nbytes));
  EXPECT_EQ(checksum(), sum);
  // Bytes outside any mapping (a parsed buffer): nothing happens.
  std::vector<uint8_t> buffer(1 << 16, 7);
  file->release_pages(buffer.data(), buffer.size());
  EXPECT_EQ(buffer[12345], 7);
}

}  // namespace
