#include "support.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace step35::testing {

std::string fixtures_dir() { return STEP35_FIXTURES_DIR; }
std::string fixture_model(const std::string& file) { return fixtures_dir() + "/models/" + file; }
std::string golden_path(const std::string& file) { return fixtures_dir() + "/golden/" + file; }

std::string tmp_dir() {
  std::string dir = STEP35_TEST_TMP;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<float> read_f32(const std::string& path) {
  auto bytes = read_bytes(path);
  if (bytes.size() % 4) throw std::runtime_error("not a float32 file: " + path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& data) {
  // Under a name of its own, then renamed: test cases of one binary run in parallel under
  // ctest -j and write the same inputs; a reader must never see a half-written file.
  const std::string partial = path + ".partial." + std::to_string(::getpid());
  {
    std::ofstream out(partial, std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
    if (!out) {
      std::remove(partial.c_str());
      throw std::runtime_error("cannot write " + path);
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    throw std::runtime_error("cannot write " + path);
  }
}

bool install_if_absent(const std::string& made, const std::string& path) {
  if (::link(made.c_str(), path.c_str()) == 0 || errno == EEXIST) {
    std::remove(made.c_str());
    return true;
  }
  // A file system without hard links: a rename is atomic too, only not exclusive.
  const bool renamed = std::rename(made.c_str(), path.c_str()) == 0;
  if (!renamed) std::remove(made.c_str());
  return renamed;
}

static std::string slurp_and_remove(const std::string& path) {
  std::string s;
  if (file_exists(path)) {
    auto b = read_bytes(path);
    s.assign(b.begin(), b.end());
  }
  std::remove(path.c_str());
  return s;
}

int run_command(const std::string& cmd, std::string* out, std::string* err) {
  static std::mutex mu;
  static int counter = 0;
  std::string base;
  {
    std::lock_guard<std::mutex> lock(mu);
    base = tmp_dir() + "/cmd." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  }
  std::string full = "(" + cmd + ") >" + base + ".out 2>" + base + ".err </dev/null";
  int rc = std::system(full.c_str());
  std::string o = slurp_and_remove(base + ".out");
  std::string e = slurp_and_remove(base + ".err");
  if (out) *out = o;
  if (err) *err = e;
  if (rc == -1) return -1;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

std::string step35_binary() { return STEP35_BINARY; }

std::string regenerated_fixture(const std::string& file, std::string* why, const std::string& set) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const std::string folder = set.empty() ? tmp_dir() : tmp_dir() + "/" + set;
  ::mkdir(folder.c_str(), 0755);
  const std::string out = folder + "/" + file;
  nlohmann::json manifest = read_json(fixtures_dir() + (set.empty() ? "" : "/" + set) + "/manifest.json");
  // Find the generator command for this file and the expected sha256.
  std::string gen_cmd;
  bool same_bytes = true;  // the command is the manifest's, so the file is its file
  for (const auto& c : manifest["commands"]) {
    std::string s = c.get<std::string>();
    if (s.rfind("python3 tools/make_tiny_step35.py --out " + file + " ", 0) == 0) gen_cmd = s;
  }
  if (gen_cmd.empty() && file == "tiny-b-q8_0.gguf") {
    // Not in the command list (made by llama-quantize); the generator's --dtype q8_0 output
    // holds the same tensor data (fixtures README).
    for (const auto& c : manifest["commands"]) {
      std::string s = c.get<std::string>();
      if (s.rfind("python3 tools/make_tiny_step35.py --out tiny-b-f32.gguf ", 0) == 0) {
        gen_cmd = s;
        gen_cmd.replace(gen_cmd.find("tiny-b-f32.gguf"), 15, file);
        gen_cmd.replace(gen_cmd.find(" --quiet"), 8, " --dtype q8_0 --quiet");
        same_bytes = false;
      }
    }
  }
  if (gen_cmd.empty()) {
    if (why) *why = "no generator command for " + file + " in manifest.json";
    return "";
  }
  if (file_exists(out)) return out;
  // ctest runs test processes in parallel: generate in a private folder (same file name,
  // since general.name derives from it), then rename into place atomically, so no process
  // ever reads a half-written model.
  const std::string work = folder + "/gen." + std::to_string(::getpid());
  ::mkdir(work.c_str(), 0755);
  std::string cmd = gen_cmd;
  cmd.replace(0, std::strlen("python3 tools/"), "python3 " + std::string(STEP35_SHARED_TOOLS_DIR) + "/");
  std::string err;
  int rc = run_command("cd '" + work + "' && " + cmd + " > /dev/null", nullptr, &err);
  const std::string made = work + "/" + file;
  // The generator's output must be the manifest's file, byte for byte.
  std::string sum;
  const std::string want =
      same_bytes && manifest["models"].contains(file) ? manifest["models"][file].value("sha256", "") : "";
  if (rc == 0 && !want.empty() && (run_command("sha256sum '" + made + "'", &sum) != 0 || sum.rfind(want, 0) != 0)) {
    err = "sha256 of the generated " + file + " is not the manifest's " + want;
    rc = -1;
  }
  if (rc != 0 || !install_if_absent(made, out)) {
    if (why) *why = "generator failed (" + std::to_string(rc) + "): " + err;
    std::remove(made.c_str());
    ::rmdir(work.c_str());
    return "";
  }
  ::rmdir(work.c_str());
  return out;
}

std::string tiny_q_regen_dir() {
  if (const char* env = std::getenv("STEP35_TINY_Q_DIR"); env && *env) return env;
  return tmp_dir() + "/tiny-q-regen";
}

std::vector<int32_t> lcg_tokens(int n, uint32_t state, int range) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    tokens.push_back(3 + int32_t(state >> 8) % range);
  }
  return tokens;
}

}  // namespace step35::testing
