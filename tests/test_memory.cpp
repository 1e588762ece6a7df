// Loading maps the file and does not copy or dequantize the weights: the process's
// anonymous memory (where a copy would live) stays far below the file size, and a forward
// pass reads the weights through the file's mapping.
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
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

// Resident anonymous memory (/proc/self/status RssAnon): heap, stacks and anonymous
// mappings, where any copy of the weights would be. Unlike the whole resident set it does
// not count page-cache pages the kernel maps in around a read of the file (a file already
// cached from an earlier run is mapped in large folios, megabytes at a time).
size_t anonymous_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("RssAnon:", 0) == 0) return size_t(std::stoull(line.substr(8))) * 1024;  // kB
  return 0;
}

// Resident bytes of this process's mappings of the file `file` (/proc/self/smaps Rss).
size_t mapped_file_bytes(const std::string& file) {
  char resolved[PATH_MAX];
  const std::string path = ::realpath(file.c_str(), resolved) ? std::string(resolved) : file;  // as smaps names it
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_file = false;
  size_t total = 0;
  while (std::getline(smaps, line)) {
    // A mapping's header line: "start-end perms offset dev inode [path]".
    const size_t dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find(' ') > dash) {
      in_file = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
      continue;
    }
    if (in_file && line.rfind("Rss:", 0) == 0) total += size_t(std::stoull(line.substr(4))) * 1024;  // kB
  }
  return total;
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
    // Made under a name of this process's own: the other Memory test may be making it too.
    const std::string made = path + ".part." + std::to_string(::getpid());
    const std::string cmd = "python3 '" + std::string(STEP35_SHARED_TOOLS_DIR) + "/make_tiny_step35.py' --out '" + made +
                            "' --seed 5 --layers 4 --embd 512 --heads-full 8 --heads-swa 8 --kv-heads 2 --head-dim 64"
                            " --experts 16 --top-k 2 --dense-layers 1 --ff 1024 --moe-ff 256 --window 32 --mtp-layers 0"
                            " --fast --quiet";
    if (run_command(cmd, nullptr, err) != 0) {
      std::remove(made.c_str());
      return "";
    }
    if (!install_if_absent(made, path)) return "";
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
  const size_t before = anonymous_bytes();  // (read_bytes' buffer is freed by now)
  Model::LoadOptions opts;
  opts.verbose = false;
  auto model = Model::load(path, opts);
  const double load_delta = double(anonymous_bytes()) - double(before);
  std::printf("[memory] file %.1f MiB: anonymous memory after load +%.2f MiB, file mapping resident %.1f MiB\n",
              double(file_size) / (1 << 20), load_delta / (1 << 20), double(mapped_file_bytes(path)) / (1 << 20));
  RecordProperty("load_delta_bytes", std::to_string(load_delta));
  EXPECT_LT(load_delta, 0.1 * double(file_size));

  // A forward pass reads the weights through the file's mapping (which shows the mapping
  // is measured at all), and still copies none of them.
  ThreadPool pool(1);
  Session session(*model, 64, 64);
  std::vector<int32_t> tokens(32);
  for (int i = 0; i < 32; ++i) tokens[size_t(i)] = 3 + i * 7;
  std::vector<float> logits;
  session.forward(tokens.data(), 32, false, logits, pool);
  const double mapped = double(mapped_file_bytes(path));
  const double run_delta = double(anonymous_bytes()) - double(before);
  std::printf("[memory] after a 32-token forward pass: file mapping resident %.1f MiB, anonymous memory +%.2f MiB\n",
              mapped / (1 << 20), run_delta / (1 << 20));
  EXPECT_GT(mapped, 0.3 * double(file_size));
  EXPECT_LT(run_delta, 0.1 * double(file_size));
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

// How the test model above is put in place: a model another test process has mapped keeps
// its name (the Memory tests measure that mapping through /proc/self/smaps), the late copy
// is dropped, and a missing model does get installed.
TEST(TestSupport, InstallIfAbsentNeverReplacesAMappedFile) {
  const std::string path = tmp_dir() + "/install-if-absent." + std::to_string(::getpid());
  const std::string late = path + ".late";
  std::remove(path.c_str());  // one a crashed run with the same pid left
  write_bytes(late, std::vector<uint8_t>(4096, 1));
  ASSERT_TRUE(install_if_absent(late, path));  // nothing there yet: installed
  EXPECT_FALSE(file_exists(late));
  EXPECT_EQ(read_bytes(path), std::vector<uint8_t>(4096, 1));

  struct stat first;
  ASSERT_EQ(::stat(path.c_str(), &first), 0);
  FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  void* map = ::mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE, ::fileno(f), 0);
  ASSERT_NE(map, MAP_FAILED);
  EXPECT_EQ(static_cast<const uint8_t*>(map)[0], 1);

  write_bytes(late, std::vector<uint8_t>(4096, 2));
  ASSERT_TRUE(install_if_absent(late, path));  // already there: the mapped file stays
  EXPECT_FALSE(file_exists(late));
  struct stat after;
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, first.st_ino);
  EXPECT_EQ(read_bytes(path), std::vector<uint8_t>(4096, 1));
  EXPECT_GT(mapped_file_bytes(path), size_t(0));  // smaps still names the mapping by its path

  ::munmap(map, 4096);
  std::fclose(f);
  std::remove(path.c_str());
}

}  // namespace
