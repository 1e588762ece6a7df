// A model split into -0000K-of-0000N.gguf parts loads as one model and computes exactly
// what the single file does (through the CLI too).
#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/session.h"
#include "model/step35.h"
#include "exec/thread_pool.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

// Splits `src` into n parts: metadata in part 1, tensors dealt out in order.
std::string write_split(const std::string& src, int n) {
  auto f = gguf::File::open(src);
  const std::string prefix = tmp_dir() + "/split-tiny-a";
  const auto& tensors = f->tensors();
  const size_t per = (tensors.size() + size_t(n) - 1) / size_t(n);
  for (int part = 0; part < n; ++part) {
    gguf::Writer w;
    if (part == 0)
      for (const auto& [k, v] : f->metadata())
        if (k != "general.alignment") w.set(k, v);
    w.set_u16("split.no", uint16_t(part));
    w.set_u16("split.count", uint16_t(n));
    w.set_i32("split.tensors.count", int32_t(tensors.size()));
    for (size_t i = size_t(part) * per; i < std::min(tensors.size(), size_t(part + 1) * per); ++i) {
      const auto& t = tensors[i];
      std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
      w.add_tensor(t.name, t.type, ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    char name[64];
    std::snprintf(name, sizeof name, "-%05d-of-%05d.gguf", part + 1, n);
    w.write(prefix + name);
  }
  char first[64];
  std::snprintf(first, sizeof first, "-%05d-of-%05d.gguf", 1, n);
  return prefix + first;
}

TEST(Split, ThreePartsComputeLikeOneFile) {
  const std::string whole = fixture_model("tiny-a-f32.gguf");
  const std::string part1 = write_split(whole, 3);
  Model::LoadOptions opts;
  opts.verbose = false;
  auto a = Model::load(whole, opts), b = Model::load(part1, opts);
  EXPECT_EQ(b->file().n_files(), 3u);
  EXPECT_EQ(a->file().tensors().size(), b->file().tensors().size());
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = {0, 63, 236, 218, 246, 404, 135, 302, 473, 439};
  std::vector<float> la, lb;
  Session sa(*a, 16, 16), sb(*b, 16, 16);
  sa.forward(tokens.data(), int32_t(tokens.size()), true, la, pool);
  sb.forward(tokens.data(), int32_t(tokens.size()), true, lb, pool);
  EXPECT_EQ(la, lb);

  std::string out_whole, out_split, err;
  // The quoted binary, built by appending (GCC 12 warns falsely, -Wrestrict, about
  // "literal" + std::string temporaries).
  std::string bin = "'";
  bin.append(step35_binary()).append("'");
  const std::string args = " eval --tokens 0,63,236,218 --greedy 4";
  ASSERT_EQ(run_command(bin + args + " -m '" + whole + "'", &out_whole, &err), 0) << err;
  ASSERT_EQ(run_command(bin + args + " -m '" + part1 + "'", &out_split, &err), 0) << err;
  EXPECT_EQ(out_whole, out_split);

  // A missing part is a clear one-line error.
  std::remove((tmp_dir() + "/split-tiny-a-00003-of-00003.gguf").c_str());
  ASSERT_EQ(run_command(bin + args + " -m '" + part1 + "'", nullptr, &err), 1);
  EXPECT_NE(err.find("00003-of-00003"), std::string::npos) << err;
}

}  // namespace
