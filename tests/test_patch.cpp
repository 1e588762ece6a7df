// Patch files (src/patch) and in-memory replacements (Model::set_replacements), through
// the CLI a user runs (step35 finetune / patch / eval --patch) and the library:
// untouched weights byte-identical in an applied model, `eval --patch` equal to the
// applied model bit for bit, repacked experts, quantized bases stored in their own type
// or F32, mismatched patches refused with a one-line error, and forward passes that never
// see half a change.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "gguf/gguf.h"
#include "model/session.h"
#include "model/step35.h"
#include "patch/patch.h"
#include "exec/thread_pool.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

std::string bin() { return step35_binary(); }

// A training text written here (any text does for these tests: a few steps only).
std::string text_file() {
  const std::string path = tmp_dir() + "/patch_text.txt";
  if (!file_exists(path)) {
    std::string t;
    for (int i = 0; i < 30; ++i)
      t += "Patch files keep only the trained slices; every other weight stays as it is in the model. " +
           std::to_string(i * 7919 % 1000) + " experts were routed here.\n";
    write_bytes(path, std::vector<uint8_t>(t.begin(), t.end()));
  }
  return path;
}

// Runs a short finetune and returns the patch path (made once per name).
std::string make_patch(const std::string& model_file, const std::string& groups, const std::string& name,
                       const std::string& extra = "") {
  static std::map<std::string, std::string> made;
  auto it = made.find(name);
  if (it != made.end()) return it->second;
  const std::string out = tmp_dir() + "/" + name + ".gguf";
  std::string err;
  const std::string cmd = bin() + " finetune -m " + fixture_model(model_file) + " -f " + text_file() + " --train '" +
                          groups + "' --out " + out + " --steps 3 -c 32 -b 2 --lr 1e-2 --warmup 0 -t 1 --eval-windows 2 " + extra;
  EXPECT_EQ(run_command(cmd, nullptr, &err), 0) << cmd << "\n" << err;
  made[name] = out;
  return out;
}

std::string eval(const std::string& model, const std::string& extra, int expect_rc = 0, std::string* err_out = nullptr) {
  std::string out, err;
  const std::string cmd = bin() + " eval -m " + model + " --tokens 0,17,250,3,99,5,60,7,300,9,10,211,12,133,14,15 "
                          "--all-logits -t 1 " + extra;
  EXPECT_EQ(run_command(cmd, &out, &err), expect_rc) << cmd << "\n" << err;
  if (err_out) *err_out = err;
  return out;
}

std::unique_ptr<Model> load(const std::string& path) {
  Model::LoadOptions o;
  o.verbose = false;
  return Model::load(path, o);
}

}  // namespace

TEST(PatchCli, InspectListsSlicesAndSettings) {
  const std::string p = make_patch("tiny-a-f32.gguf", "experts=3:1,3:4;router=5;shared=6", "pa_f32");
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " patch inspect " + p + " --json -m " + fixture_model("tiny-a-f32.gguf"), &out, &err),
            0) << err;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["slices"].size(), 10u);  // 2 experts x 3 + router + 3 shared
  EXPECT_EQ(j["slices"][0]["tensor"], "blk.3.ffn_gate_exps.weight");
  EXPECT_EQ(j["slices"][0]["expert"], 1);
  EXPECT_EQ(j["slices"][0]["type"], "f32");
  EXPECT_EQ(j["training"]["steps"], 3.0);
  EXPECT_EQ(j["training"]["groups"], "experts=3:1,3:4;router=5;shared=6");
  EXPECT_TRUE(j["training"].contains("train_loss_after"));
  EXPECT_EQ(j["base_name"], "tiny-a-f32");
  EXPECT_TRUE(j.contains("fits"));
  // Against another model: a one-line error naming the slice.
  ASSERT_EQ(run_command(bin() + " patch inspect " + p + " -m " + fixture_model("tiny-b-f32.gguf"), &out, &err), 1);
  EXPECT_NE(err.find("blk.3.ffn_gate_exps.weight expert 1"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(PatchCli, ApplyKeepsEveryUntouchedByte) {
  const std::string base_path = fixture_model("tiny-a-f32.gguf");
  const std::string p = make_patch("tiny-a-f32.gguf", "experts=3:1,3:4;router=5;shared=6", "pa_f32");
  const std::string out = tmp_dir() + "/pa_applied.gguf";
  std::string err;
  ASSERT_EQ(run_command(bin() + " patch apply -m " + base_path + " --patch " + p + " --out " + out, nullptr, &err), 0)
      << err;
  auto base = gguf::File::open(base_path);
  auto applied = gguf::File::open(out);
  const patch::Patch pt = patch::Patch::read(p);
  std::map<std::pair<std::string, int32_t>, const patch::Slice*> slices;
  for (const patch::Slice& s : pt.slices) slices[{s.tensor, s.expert}] = &s;
  ASSERT_EQ(applied->tensors().size(), base->tensors().size());
  size_t replaced = 0, kept = 0;
  for (const gguf::TensorInfo& t : base->tensors()) {
    const gguf::TensorInfo* a = applied->find_tensor(t.name);
    ASSERT_NE(a, nullptr) << t.name;
    ASSERT_EQ(a->type, t.type);
    ASSERT_EQ(a->nbytes, t.nbytes);
    const int64_t n_mat = t.n_dims == 3 ? t.ne[2] : 1;
    const size_t mat = size_t(t.nbytes / uint64_t(n_mat));
    for (int64_t e = 0; e < n_mat; ++e) {
      auto it = slices.find({t.name, t.n_dims == 3 ? int32_t(e) : -1});
      const uint8_t* want = it != slices.end() ? it->second->data.data() : t.data + size_t(e) * mat;
      EXPECT_EQ(std::memcmp(a->data + size_t(e) * mat, want, mat), 0) << t.name << " matrix " << e;
      (it != slices.end() ? replaced : kept) += 1;
    }
  }
  EXPECT_EQ(replaced, pt.slices.size());
  EXPECT_GT(kept, 100u);
  // The trained slices really differ from the base's.
  const auto base_model = load(base_path);
  for (const patch::Slice& s : pt.slices) {
    const auto b = patch::base_slice(*base_model, s.tensor, s.expert);
    EXPECT_NE(std::memcmp(b.data, s.data.data(), s.data.size()), 0) << s.name();
  }
  // Same metadata keys and values.
  EXPECT_EQ(applied->metadata().size(), base->metadata().size());
}

TEST(PatchCli, EvalWithPatchEqualsAppliedModelBitForBit) {
  const std::string base_path = fixture_model("tiny-a-f32.gguf");
  const std::string p = make_patch("tiny-a-f32.gguf", "experts=3:1,3:4;router=5;shared=6", "pa_f32");
  const std::string out = tmp_dir() + "/pa_applied2.gguf";
  ASSERT_EQ(run_command(bin() + " patch apply -m " + base_path + " --patch " + p + " --out " + out), 0);
  for (const std::string mode : {"", "--exact"}) {
    const std::string patched = eval(base_path, "--patch " + p + " " + mode);
    EXPECT_EQ(patched, eval(out, mode)) << mode;
    EXPECT_NE(patched, eval(base_path, mode)) << mode;
  }
}

TEST(PatchCli, QuantizedBaseInItsOwnTypeOrF32) {
  // tiny-a-q4_k_m's MoE tensors are q5_0 / q8_0 (embd 128 is no multiple of 256).
  const std::string base_path = fixture_model("tiny-a-q4_k_m.gguf");
  const std::string pq = make_patch("tiny-a-q4_k_m.gguf", "experts=7:3;router=6;shared=7", "pq_base");
  const std::string pf = make_patch("tiny-a-q4_k_m.gguf", "experts=7:3;router=6;shared=7", "pq_f32", "--patch-type f32");
  const patch::Patch a = patch::Patch::read(pq), b = patch::Patch::read(pf);
  for (const patch::Slice& s : a.slices) EXPECT_EQ(s.type, s.base_type) << s.name();
  bool other = false;
  for (const patch::Slice& s : b.slices) {
    EXPECT_EQ(s.type, DType::F32);
    other = other || s.base_type != DType::F32;
  }
  EXPECT_TRUE(other);
  const std::string applied = tmp_dir() + "/pq_applied.gguf";
  ASSERT_EQ(run_command(bin() + " patch apply -m " + base_path + " --patch " + pq + " --out " + applied), 0);
  const std::string base_native = eval(base_path, "");
  for (const std::string mode : {"", "--exact"}) {
    EXPECT_EQ(eval(base_path, "--patch " + pq + " " + mode), eval(applied, mode)) << mode;
    // F32 slices on a quantized model: each replaced expert multiplies in its own format.
    EXPECT_NE(eval(base_path, "--patch " + pf + " " + mode), eval(base_path, mode)) << mode;
  }
  // Applying the F32 patch to the file re-encodes its slices into the tensors' types.
  const std::string applied_f = tmp_dir() + "/pq_applied_f32.gguf";
  ASSERT_EQ(run_command(bin() + " patch apply -m " + base_path + " --patch " + pf + " --out " + applied_f), 0);
  auto f = gguf::File::open(applied_f);
  auto g = gguf::File::open(base_path);
  for (const gguf::TensorInfo& t : g->tensors()) EXPECT_EQ(f->find_tensor(t.name)->type, t.type) << t.name;
}

TEST(PatchCli, IqBasesStoredInTheirTypeWhereThereIsAnEncoder) {
  // tiny-q-iq4_xs's experts are iq4_xs (step35 encodes it): the patch keeps that type and
  // --patch equals the applied file. iq2_xxs has no encoder: refused before training with the
  // flag to use, and an F16 patch runs in memory but cannot be written into the file.
  const std::string iq4 = fixtures_dir() + "/models-iq/tiny-q-iq4_xs.gguf";
  const std::string iq2 = fixtures_dir() + "/models-iq/tiny-q-iq2_xxs.gguf";
  const std::string p4 = tmp_dir() + "/pi_iq4_xs.gguf";
  std::string err;
  const std::string train = " finetune -f " + text_file() + " --train experts=1:top2 --steps 2 -c 32 -b 1 --lr 1e-2 -t 1 --eval-windows 2 --out ";
  ASSERT_EQ(run_command(bin() + train + p4 + " -m " + iq4, nullptr, &err), 0) << err;
  const patch::Patch a = patch::Patch::read(p4);
  ASSERT_EQ(a.slices.size(), 6u);
  for (const patch::Slice& s : a.slices) EXPECT_EQ(s.type, DType::IQ4_XS) << s.name();
  const std::string applied = tmp_dir() + "/pi_iq4_xs_applied.gguf";
  ASSERT_EQ(run_command(bin() + " patch apply -m " + iq4 + " --patch " + p4 + " --out " + applied), 0);
  const std::string patched = eval(iq4, "--patch " + p4);
  EXPECT_EQ(patched, eval(applied, ""));
  EXPECT_NE(patched, eval(iq4, ""));

  const std::string p2 = tmp_dir() + "/pi_iq2_xxs.gguf";
  std::remove(p2.c_str());  // made by an earlier run (the scratch folder persists)
  EXPECT_EQ(run_command(bin() + train + p2 + " -m " + iq2, nullptr, &err), 1);
  EXPECT_NE(err.find("no encoder for iq2_xxs"), std::string::npos) << err;
  EXPECT_NE(err.find("--patch-type"), std::string::npos) << err;
  EXPECT_FALSE(file_exists(p2));
  ASSERT_EQ(run_command(bin() + train + p2 + " -m " + iq2 + " --patch-type f16", nullptr, &err), 0) << err;
  EXPECT_NE(eval(iq2, "--patch " + p2), eval(iq2, ""));
  EXPECT_EQ(run_command(bin() + " patch apply -m " + iq2 + " --patch " + p2 + " --out " + tmp_dir() + "/pi_no.gguf", nullptr, &err), 1);
  EXPECT_NE(err.find("no encoder for the model's iq2_xxs"), std::string::npos) << err;
}

TEST(PatchCli, RepackedExpertsGiveTheSameLogits) {
  // tiny-k-q4_k_m: q4_K experts with rows in groups of 16, repacked (on AVX-512 VNNI) at
  // load, on first use, or not at all; the replaced experts are repacked too.
  const std::string base_path = fixture_model("tiny-k-q4_k_m.gguf");
  const std::string p = make_patch("tiny-k-q4_k_m.gguf", "experts=1:0,3:2;shared=2", "pk_base");
  for (const patch::Slice& s : patch::Patch::read(p).slices) EXPECT_EQ(s.type, s.base_type);
  const std::string ref = eval(base_path, "--patch " + p);
  EXPECT_NE(ref, eval(base_path, ""));
  for (const char* mode : {"0", "shared", "lazy", "all"}) {
    std::string out, err;
    const std::string cmd = std::string("STEP35_REPACK=") + mode + " " + bin() + " eval -m " + base_path +
                            " --patch " + p + " --tokens 0,17,250,3,99,5,60,7,300,9,10,211,12,133,14,15 --all-logits -t 1";
    ASSERT_EQ(run_command(cmd, &out, &err), 0) << err;
    EXPECT_EQ(out, ref) << "STEP35_REPACK=" << mode;
  }
  const std::string applied = tmp_dir() + "/pk_applied.gguf";
  ASSERT_EQ(run_command(bin() + " patch apply -m " + base_path + " --patch " + p + " --out " + applied), 0);
  EXPECT_EQ(eval(applied, ""), ref);
}

TEST(PatchCli, LaterPatchWins) {
  const std::string base_path = fixture_model("tiny-a-f32.gguf");
  const std::string a = make_patch("tiny-a-f32.gguf", "experts=4:2", "pw_a");
  const std::string b = make_patch("tiny-a-f32.gguf", "experts=4:2", "pw_b", "--seed 9 --lr 3e-2");
  EXPECT_NE(eval(base_path, "--patch " + a), eval(base_path, "--patch " + b));
  EXPECT_EQ(eval(base_path, "--patch " + a + " --patch " + b), eval(base_path, "--patch " + b));
}

TEST(PatchCli, RefusesPatchesThatDoNotFit) {
  const std::string p = make_patch("tiny-a-f32.gguf", "experts=3:1,3:4;router=5;shared=6", "pa_f32");
  std::string err;
  // Another type of the same model.
  eval(fixture_model("tiny-a-q8_0.gguf"), "--patch " + p, 2, &err);
  EXPECT_NE(err.find("made for a f32 tensor, the model's is q8_0"), std::string::npos) << err;
  // Same shapes and types, other bytes: the base hash.
  const std::string other = tmp_dir() + "/pr_other.gguf";
  ASSERT_EQ(run_command(bin() + " patch apply -m " + fixture_model("tiny-a-f32.gguf") + " --patch " + p + " --out " + other), 0);
  eval(other, "--patch " + p, 2, &err);
  EXPECT_NE(err.find("differ from the ones the patch was made from"), std::string::npos) << err;
  // A model file is not a patch.
  eval(fixture_model("tiny-a-f32.gguf"), "--patch " + fixture_model("tiny-b-f32.gguf"), 2, &err);
  EXPECT_NE(err.find("not a step35 patch"), std::string::npos) << err;
  // A truncated patch: an error, not a crash.
  const auto bytes = read_bytes(p);
  const std::string cut = tmp_dir() + "/pr_cut.gguf";
  write_bytes(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(bytes.size() / 2)));
  eval(fixture_model("tiny-a-f32.gguf"), "--patch " + cut, 2, &err);
  EXPECT_NE(err.find("step35 eval: --patch: " + cut + ": "), std::string::npos) << err;
  // apply refuses too, and leaves no output behind.
  const std::string never = tmp_dir() + "/pr_never.gguf";
  EXPECT_NE(run_command(bin() + " patch apply -m " + fixture_model("tiny-a-q8_0.gguf") + " --patch " + p + " --out " +
                            never, nullptr, &err), 0);
  EXPECT_FALSE(file_exists(never));
}

// ---------------------------------------------------------------------------------------
// Model::set_replacements

namespace {

std::vector<float> logits_of(Session& s, ThreadPool& pool, const std::vector<int32_t>& toks) {
  s.cache().clear();
  std::vector<float> out;
  s.forward(toks.data(), int32_t(toks.size()), true, out, pool);
  return out;
}

}  // namespace

TEST(Replacements, RejectsBadEntriesAndChangesNothing) {
  auto m = load(fixture_model("tiny-a-f32.gguf"));
  const uint64_t v0 = m->weights()->version;
  std::vector<float> expert(size_t(128 * 32), 0.5f);
  auto r = [&](std::string tensor, int32_t e, size_t bytes) {
    MatrixReplacement x;
    x.tensor = std::move(tensor);
    x.expert = e;
    x.type = DType::F32;
    x.data = reinterpret_cast<const uint8_t*>(expert.data());
    x.n_bytes = bytes;
    return x;
  };
  const MatrixReplacement good = r("blk.3.ffn_up_exps.weight", 2, expert.size() * 4);
  for (const MatrixReplacement& bad : {r("blk.3.ffn_up_exps.weight", 16, expert.size() * 4),
                                       r("blk.3.ffn_up_exps.weight", -1, expert.size() * 4),
                                       r("blk.3.ffn_up_exps.weight", 2, expert.size() * 4 - 4),
                                       r("blk.3.ffn_gate_inp.weight", 2, expert.size() * 4),
                                       r("blk.1.ffn_up_exps.weight", 2, expert.size() * 4),  // dense layer
                                       r("blk.99.ffn_up_exps.weight", 2, expert.size() * 4),
                                       r("output.weight", -1, expert.size() * 4),
                                       r("blk.3.attn_norm.weight", -1, 512)}) {
    EXPECT_THROW(m->set_replacements({good, bad}), std::invalid_argument) << bad.tensor << " " << bad.expert;
    EXPECT_EQ(m->weights()->version, v0);
  }
  m->set_replacements({good});
  EXPECT_GT(m->weights()->version, v0);
  EXPECT_TRUE(m->weights()->layers[3].ffn_up_exps.replaced(2));
  EXPECT_FALSE(m->weights()->layers[3].ffn_up_exps.replaced(1));
  EXPECT_FALSE(m->layer(3).ffn_up_exps.replaced(2));  // the file's weights stay as loaded
}

TEST(Replacements, EmptySetRestoresTheFileWeights) {
  auto m = load(fixture_model("tiny-a-f32.gguf"));
  const std::string p = make_patch("tiny-a-f32.gguf", "experts=3:1,3:4;router=5;shared=6", "pa_f32");
  const std::vector<int32_t> toks = {0, 17, 250, 3, 99, 5, 60, 7};
  ThreadPool pool(1);
  Session s(*m, 64, 64);
  const auto base = logits_of(s, pool, toks);
  patch::load_and_apply(*m, {p});
  const auto patched = logits_of(s, pool, toks);
  EXPECT_NE(base, patched);
  m->set_replacements({});
  EXPECT_EQ(logits_of(s, pool, toks), base);
}

// One thread swaps between two weight sets as fast as it can while another runs forward
// passes: every pass's logits are exactly those of one set or the other.
TEST(Replacements, PassNeverSeesHalfASwap) {
  auto m = load(fixture_model("tiny-a-f32.gguf"));
  const auto pt = std::make_shared<const patch::Patch>(
      patch::Patch::read(make_patch("tiny-a-f32.gguf", "experts=3:1,3:4;router=5;shared=6", "pa_f32")));
  const std::vector<MatrixReplacement> with = pt->replacements(pt);
  const std::vector<int32_t> toks = {0, 17, 250, 3, 99, 5, 60, 7, 300, 9, 10, 211};
  ThreadPool pool(1);
  Session s(*m, 64, 64);
  const auto base = logits_of(s, pool, toks);
  m->set_replacements(with);
  const auto patched = logits_of(s, pool, toks);
  ASSERT_NE(base, patched);
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    while (!stop) {
      m->set_replacements(swaps % 2 ? with : std::vector<MatrixReplacement>{});
      ++swaps;
    }
  });
  int n_base = 0, n_patched = 0;
  for (int i = 0; i < 60; ++i) {
    const auto got = logits_of(s, pool, toks);
    if (got == base)
      ++n_base;
    else if (got == patched)
      ++n_patched;
    else
      ADD_FAILURE() << "pass " << i << " saw mixed weights";
  }
  stop = true;
  swapper.join();
  EXPECT_GT(swaps.load(), 10);
  EXPECT_EQ(n_base + n_patched, 60);
}
