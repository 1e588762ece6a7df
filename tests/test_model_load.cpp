// The model loader turns every missing, wrongly typed or inconsistent key or tensor into
// a one-line gguf::Error that names it (built here from the fixture by rewriting it).
#include <gtest/gtest.h>

#include <functional>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/step35.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

using Edit = std::function<void(std::vector<std::pair<std::string, gguf::Value>>& kv,
                                std::vector<const gguf::TensorInfo*>& tensors, gguf::Writer& extra)>;

std::string rewrite(const std::string& name, const Edit& edit) {
  static auto src = gguf::File::open(fixture_model("tiny-b-f32.gguf"));
  std::vector<std::pair<std::string, gguf::Value>> kv(src->metadata().begin(), src->metadata().end());
  std::vector<const gguf::TensorInfo*> tensors;
  for (const auto& t : src->tensors()) tensors.push_back(&t);
  gguf::Writer w;
  edit(kv, tensors, w);
  for (const auto& [k, v] : kv) w.set(k, v);
  for (const auto* t : tensors)
    w.add_tensor(t->name, t->type, std::vector<int64_t>(t->ne, t->ne + t->n_dims),
                 std::vector<uint8_t>(t->data, t->data + t->nbytes));
  const std::string path = tmp_dir() + "/" + name + ".gguf";
  w.write(path);
  return path;
}

void erase_key(std::vector<std::pair<std::string, gguf::Value>>& kv, const std::string& k) {
  kv.erase(std::remove_if(kv.begin(), kv.end(), [&](const auto& e) { return e.first == k; }), kv.end());
}
gguf::Value& key(std::vector<std::pair<std::string, gguf::Value>>& kv, const std::string& k) {
  for (auto& e : kv)
    if (e.first == k) return e.second;
  throw std::runtime_error("no key " + k);
}

void expect_error(const std::string& path, const std::string& mention) {
  try {
    Model::LoadOptions opts;
    opts.verbose = false;
    Model::load(path, opts);
    ADD_FAILURE() << path << " loaded but should not";
  } catch (const gguf::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(mention), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << "names the file: " << msg;
  }
}

TEST(ModelLoad, UnchangedRewriteLoads) {
  const std::string p = rewrite("same", [](auto&, auto&, auto&) {});
  Model::LoadOptions opts;
  opts.verbose = false;
  auto m = Model::load(p, opts);
  EXPECT_EQ(m->hparams().n_layer, 6);
  EXPECT_EQ(m->n_mtp_loaded(), 3);
}

TEST(ModelLoad, MissingRequiredKeys) {
  for (const char* k : {"general.architecture", "step35.embedding_length", "step35.block_count",
                        "step35.attention.sliding_window", "step35.attention.sliding_window_pattern",
                        "step35.attention.head_count", "step35.attention.layer_norm_rms_epsilon",
                        "tokenizer.ggml.tokens", "tokenizer.ggml.model"}) {
    expect_error(rewrite("nokey", [&](auto& kv, auto&, auto&) { erase_key(kv, k); }), k);
  }
}

TEST(ModelLoad, WronglyTypedOrInconsistentKeys) {
  expect_error(rewrite("arch", [](auto& kv, auto&, auto&) { key(kv, "general.architecture").str = "llama"; }), "step35");
  expect_error(rewrite("embd_str", [](auto& kv, auto&, auto&) {
                 gguf::Value v;
                 v.type = gguf::ValueType::STRING;
                 v.str = "64";
                 key(kv, "step35.embedding_length") = v;
               }),
               "step35.embedding_length");
  expect_error(rewrite("heads_len", [](auto& kv, auto&, auto&) { key(kv, "step35.attention.head_count").array.pop_back(); }),
               "step35.attention.head_count");
  expect_error(rewrite("heads_gqa", [](auto& kv, auto&, auto&) {
                 auto& a = key(kv, "step35.attention.head_count_kv").array;  // 4 heads, 3 KV heads
                 a[0].i = 3, a[0].u = 3;
               }),
               "not a multiple of head_count_kv");
  expect_error(rewrite("tok_model", [](auto& kv, auto&, auto&) { key(kv, "tokenizer.ggml.model").str = "llama"; }),
               "tokenizer.ggml.model");
  expect_error(rewrite("nextn", [](auto& kv, auto&, auto&) { key(kv, "step35.nextn_predict_layers").u = 99; }),
               "nextn_predict_layers");
}

TEST(ModelLoad, MissingOrMisshapenTensors) {
  expect_error(rewrite("no_q", [](auto&, auto& ts, auto&) {
                 ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto* t) { return t->name == "blk.2.attn_q.weight"; }),
                          ts.end());
               }),
               "blk.2.attn_q.weight");
  expect_error(rewrite("no_out", [](auto&, auto& ts, auto&) {
                 ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto* t) { return t->name == "output.weight"; }), ts.end());
               }),
               "output.weight");
  // A tensor with the wrong shape: swap in attn_k's data under attn_q's name.
  static gguf::TensorInfo fake;
  expect_error(rewrite("shape", [](auto&, auto& ts, auto&) {
                 const gguf::TensorInfo* k = nullptr;
                 for (auto* t : ts)
                   if (t->name == "blk.1.attn_k.weight") k = t;
                 ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto* t) { return t->name == "blk.1.attn_q.weight"; }),
                          ts.end());
                 fake = *k;
                 fake.name = "blk.1.attn_q.weight";
                 ts.push_back(&fake);
               }),
               "blk.1.attn_q.weight");
}

}  // namespace
