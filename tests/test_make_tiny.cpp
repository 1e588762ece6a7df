// `step35 make-tiny`: deterministic output, clear errors, and a file with every key and
// tensor the step35 spec lists (../shared/docs/step35-model.md §4.2-4.4), of the right
// shapes and types.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numbers>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tinymodel/make_tiny.h"
#include "model/session.h"
#include "model/step35.h"
#include "engine/sampler.h"
#include "exec/thread_pool.h"
#include "support.h"
#include "tensor/dtype.h"
#include "tensor/quants.h"
#include "tokenizer/tokenizer.h"

using namespace step35;
using namespace step35::testing;

namespace {

std::string bin() {
  // Appended piecewise: GCC 12's -Wrestrict misfires on "literal" + std::string&&.
  std::string s = "'";
  s += step35_binary();
  s += "'";
  return s;
}

// Each TEST may run as its own process in parallel (ctest -j): every file name used
// below is unique to one test.
std::string tmp_file(const std::string& name) { return tmp_dir() + "/make_tiny." + name + ".gguf"; }

struct CliResult {
  int rc = 0;
  std::string out, err;
  nlohmann::json summary;
};

CliResult make_tiny(const std::string& args) {
  CliResult r;
  r.rc = run_command(bin() + " make-tiny " + args, &r.out, &r.err);
  if (r.rc == 0) r.summary = nlohmann::json::parse(r.out);
  return r;
}

// The tiny preset's shape (make_tiny.cpp kTiny): what the file must describe.
constexpr int kLayers = 8, kMtp = 1, kBlocks = kLayers + kMtp;
constexpr int64_t kEmbd = 256, kHeadDim = 32, kHeadsFull = 8, kHeadsSwa = 12, kKv = 2;
constexpr int64_t kFf = 704, kExperts = 32, kFfExp = 64, kFfShexp = 64;
bool layer_is_swa(int il) { return il >= kLayers || il % 4 != 0; }
bool layer_is_moe(int il) { return il >= 2 && il < kLayers; }

const char* const kTypes[] = {"f32", "f16", "bf16", "q8_0"};

struct Expected {
  std::vector<int64_t> ne;
  bool f32;  // always F32 (norms, router, bias, rope_freqs), else the matrix type
};

// Every tensor of the tiny preset (§4.3), by name.
std::map<std::string, Expected> expected_tensors(int64_t n_vocab) {
  std::map<std::string, Expected> t;
  const int64_t E = kEmbd, D = kHeadDim;
  t["token_embd.weight"] = {{E, n_vocab}, false};
  t["rope_freqs.weight"] = {{D / 2}, true};
  t["output_norm.weight"] = {{E}, true};
  t["output.weight"] = {{E, n_vocab}, false};
  for (int il = 0; il < kBlocks; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const int64_t H = layer_is_swa(il) ? kHeadsSwa : kHeadsFull;
    t[b + "attn_norm.weight"] = {{E}, true};
    t[b + "attn_q.weight"] = {{E, H * D}, false};
    t[b + "attn_k.weight"] = {{E, kKv * D}, false};
    t[b + "attn_v.weight"] = {{E, kKv * D}, false};
    t[b + "attn_q_norm.weight"] = {{D}, true};
    t[b + "attn_k_norm.weight"] = {{D}, true};
    t[b + "attn_gate.weight"] = {{E, H}, false};
    t[b + "attn_output.weight"] = {{H * D, E}, false};
    t[b + "ffn_norm.weight"] = {{E}, true};
    if (layer_is_moe(il)) {
      t[b + "ffn_gate_inp.weight"] = {{E, kExperts}, true};
      t[b + "exp_probs_b.bias"] = {{kExperts}, true};
      t[b + "ffn_gate_exps.weight"] = {{E, kFfExp, kExperts}, false};
      t[b + "ffn_up_exps.weight"] = {{E, kFfExp, kExperts}, false};
      t[b + "ffn_down_exps.weight"] = {{kFfExp, E, kExperts}, false};
      t[b + "ffn_gate_shexp.weight"] = {{E, kFfShexp}, false};
      t[b + "ffn_up_shexp.weight"] = {{E, kFfShexp}, false};
      t[b + "ffn_down_shexp.weight"] = {{kFfShexp, E}, false};
    } else {
      t[b + "ffn_gate.weight"] = {{E, kFf}, false};
      t[b + "ffn_up.weight"] = {{E, kFf}, false};
      t[b + "ffn_down.weight"] = {{kFf, E}, false};
    }
    if (il >= kLayers) {
      t[b + "nextn.eh_proj.weight"] = {{2 * E, E}, false};
      t[b + "nextn.enorm.weight"] = {{E}, true};
      t[b + "nextn.hnorm.weight"] = {{E}, true};
      t[b + "nextn.shared_head_norm.weight"] = {{E}, true};
      t[b + "nextn.shared_head_head.weight"] = {{E, n_vocab}, false};
    }
  }
  return t;
}

// The whole file in one read (support's read_bytes goes byte by byte, slow in Debug).
std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<uint8_t> data(size_t(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(data.data()), std::streamsize(data.size()));
  return data;
}

std::vector<float> dequantize(const gguf::TensorInfo& t) {
  std::vector<float> v(size_t(t.n_elements()));
  dequantize_row_ref(DType(t.type), t.data, v.data(), t.n_elements());
  return v;
}

void mean_std(const std::vector<float>& v, size_t begin, size_t end, double* mean, double* std_dev) {
  double s = 0, ss = 0;
  for (size_t i = begin; i < end; ++i) s += v[i], ss += double(v[i]) * v[i];
  const double n = double(end - begin);
  *mean = s / n;
  *std_dev = std::sqrt(std::max(0.0, ss / n - *mean * *mean));
}

TEST(MakeTiny, EveryTypeIsDeterministic) {
  for (const char* type : kTypes) {
    const std::string a = tmp_file(std::string("det-a-") + type), b = tmp_file(std::string("det-b-") + type);
    // Same --name: the default general.name comes from the file name.
    const CliResult ra = make_tiny("--out '" + a + "' --type " + type + " --seed 5 --name det");
    ASSERT_EQ(ra.rc, 0) << ra.err;
    const CliResult rb = make_tiny("--out '" + b + "' --type=" + type + " --seed=5 --name det");
    ASSERT_EQ(rb.rc, 0) << rb.err;
    const auto bytes_a = file_bytes(a), bytes_b = file_bytes(b);
    EXPECT_EQ(bytes_a.size(), ra.summary["bytes"].get<uint64_t>()) << type;
    EXPECT_TRUE(bytes_a == bytes_b) << type << ": same arguments, different bytes";
    EXPECT_EQ(ra.summary["path"], a);
    EXPECT_EQ(ra.summary["type"], type);
    EXPECT_EQ(ra.summary["layers"], kLayers);
    EXPECT_EQ(ra.summary["n_mtp"], kMtp);
    EXPECT_EQ(ra.summary["n_vocab"], 1000);
    EXPECT_GT(ra.summary["params"].get<uint64_t>(), 14000000u);
    EXPECT_LT(ra.summary["params"].get<uint64_t>(), 14500000u);
    if (std::string(type) == "f32") {
      EXPECT_LT(bytes_a.size(), 58u << 20);  // a small file
    }
    std::remove(a.c_str());
    std::remove(b.c_str());
  }
}

TEST(MakeTiny, SeedChangesTheWeightsOnly) {
  const std::string a = tmp_file("seed-1"), b = tmp_file("seed-2");
  ASSERT_EQ(make_tiny("--out '" + a + "' --seed 1 --name s --type q8_0").rc, 0);
  ASSERT_EQ(make_tiny("--out '" + b + "' --seed 2 --name s --type q8_0").rc, 0);
  const auto fa = gguf::File::open(a), fb = gguf::File::open(b);
  ASSERT_EQ(fa->tensors().size(), fb->tensors().size());
  EXPECT_EQ(fa->get_str_array("tokenizer.ggml.tokens"), fb->get_str_array("tokenizer.ggml.tokens"));
  for (size_t k = 0; k < fa->tensors().size(); ++k) {
    const auto& ta = fa->tensors()[k];
    const auto& tb = fb->tensors()[k];
    ASSERT_EQ(ta.name, tb.name);
    ASSERT_EQ(ta.nbytes, tb.nbytes);
    if (ta.name == "rope_freqs.weight") {
      EXPECT_EQ(0, std::memcmp(ta.data, tb.data, ta.nbytes));  // computed, not random
    } else {
      EXPECT_NE(0, std::memcmp(ta.data, tb.data, ta.nbytes)) << ta.name << " did not change with the seed";
    }
  }
  // The seed reaches the full 64-bit range.
  const std::string c = tmp_file("seed-max");
  const CliResult r = make_tiny("--out '" + c + "' --seed 18446744073709551615");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.summary["seed"].get<uint64_t>(), 18446744073709551615ull);
  for (const auto& p : {a, b, c}) std::remove(p.c_str());
}

TEST(MakeTiny, BadArgumentsFailWithAMessage) {
  const std::string out = tmp_file("bad");
  struct Case {
    std::string args;
    int rc;
    std::string needle;  // in stderr
  };
  const std::vector<Case> cases = {
      {"", 2, "--out"},
      {"--out '" + out + "' --bogus", 2, "--bogus"},
      {"--out '" + out + "' --type q4_0", 2, "--type"},
      {"--out '" + out + "' --type", 2, "--type"},
      {"--out '" + out + "' --preset huge", 2, "--preset"},
      {"--out '" + out + "' --seed -1", 2, "--seed"},
      {"--out '" + out + "' --seed 12x", 2, "--seed"},
      {"--out '" + out + "' --seed 18446744073709551616", 2, "--seed"},
      {"--out '" + out + "' --name ''", 2, "--name"},
      {"--out '" + out + "' extra", 2, "extra"},
      {"--out '" + tmp_dir() + "/no/such/dir/x.gguf'", 1, "no/such/dir"},
      {"--out '" + tmp_dir() + "'", 1, "cannot create"},  // a directory
  };
  for (const Case& c : cases) {
    std::string o, e;
    const int rc = run_command(bin() + " make-tiny " + c.args, &o, &e);
    EXPECT_EQ(rc, c.rc) << c.args << "\n" << e;
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.args << ": stderr was: " << e;
    EXPECT_TRUE(o.empty()) << c.args << ": unexpected stdout " << o;
  }
  EXPECT_FALSE(file_exists(out));  // nothing written by a failed run
  std::string o, e;
  EXPECT_EQ(run_command(bin() + " make-tiny --help", &o, &e), 0);
  for (const char* flag : {"--out", "--preset", "--seed", "--type", "--name"})
    EXPECT_NE(o.find(flag), std::string::npos) << flag << " missing from --help";
}

TEST(MakeTiny, LibraryRejectsBadOptions) {
  const std::string out = tmp_file("lib-bad");
  TinyModelOptions o;
  o.preset = "medium";
  EXPECT_THROW(make_tiny_model(o, out), std::invalid_argument);
  o.preset = "tiny";
  o.weight_type = DType::Q4_K;
  EXPECT_THROW(make_tiny_model(o, out), std::invalid_argument);
  EXPECT_FALSE(file_exists(out));
  o.weight_type = DType::F32;
  EXPECT_THROW(make_tiny_model(o, tmp_dir() + "/no/such/dir/x.gguf"), std::runtime_error);
}

TEST(MakeTiny, FileHasTheStep35KeysAndTensors) {
  for (const char* type : kTypes) {
    SCOPED_TRACE(type);
    const std::string path = tmp_file(std::string("layout-") + type);
    const CliResult r = make_tiny("--out '" + path + "' --type " + type);
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto f = gguf::File::open(path);
    const DType matrix_type = *dtype_from_name(type);

    // §4.2 keys.
    EXPECT_EQ(f->get_str("general.architecture"), "step35");
    EXPECT_EQ(f->get_str("general.name"), "make_tiny.layout-" + std::string(type));  // from the file name
    EXPECT_EQ(f->get_u32("general.alignment"), 32u);
    const std::map<std::string, uint32_t> file_types = {{"f32", 0}, {"f16", 1}, {"q8_0", 7}, {"bf16", 32}};
    EXPECT_EQ(f->get_u32("general.file_type"), file_types.at(type));
    EXPECT_EQ(f->get_u32("step35.block_count"), uint32_t(kBlocks));
    EXPECT_EQ(f->get_u32("step35.nextn_predict_layers"), uint32_t(kMtp));
    EXPECT_EQ(f->get_u32("step35.context_length"), 4096u);
    EXPECT_EQ(f->get_u32("step35.embedding_length"), uint32_t(kEmbd));
    EXPECT_EQ(f->get_u32("step35.feed_forward_length"), uint32_t(kFf));
    EXPECT_EQ(f->get_u32("step35.attention.key_length"), uint32_t(kHeadDim));
    EXPECT_EQ(f->get_u32("step35.attention.value_length"), uint32_t(kHeadDim));
    EXPECT_FLOAT_EQ(f->get_f32("step35.attention.layer_norm_rms_epsilon"), 1e-5f);
    EXPECT_EQ(f->get_u32("step35.attention.sliding_window"), 32u);
    EXPECT_FLOAT_EQ(f->get_f32("step35.rope.freq_base"), 5e6f);
    EXPECT_FLOAT_EQ(f->get_f32("step35.rope.freq_base_swa"), 1e4f);
    EXPECT_FALSE(f->has("step35.rope.dimension_count"));  // the loader derives the rotary dims
    EXPECT_EQ(f->get_u32("step35.expert_count"), uint32_t(kExperts));
    EXPECT_EQ(f->get_u32("step35.expert_used_count"), 4u);
    EXPECT_EQ(f->get_u32("step35.expert_feed_forward_length"), uint32_t(kFfExp));
    EXPECT_EQ(f->get_u32("step35.expert_shared_feed_forward_length"), uint32_t(kFfShexp));
    EXPECT_EQ(f->get_u32("step35.expert_gating_func"), 2u);
    EXPECT_FLOAT_EQ(f->get_f32("step35.expert_weights_scale"), 3.0f);
    EXPECT_TRUE(f->get_bool("step35.expert_weights_norm"));
    EXPECT_EQ(f->get_u32("step35.leading_dense_block_count"), 2u);

    // Per-layer arrays: block_count entries, of the element types llama.cpp reads.
    EXPECT_EQ(f->get_array("step35.attention.head_count", gguf::ValueType::I32).array.size(), size_t(kBlocks));
    EXPECT_EQ(f->get_array("step35.attention.head_count_kv", gguf::ValueType::I32).array.size(), size_t(kBlocks));
    EXPECT_EQ(f->get_array("step35.attention.sliding_window_pattern", gguf::ValueType::BOOL).array.size(),
              size_t(kBlocks));
    EXPECT_EQ(f->get_array("step35.swiglu_clamp_exp", gguf::ValueType::F32).array.size(), size_t(kBlocks));
    EXPECT_EQ(f->get_array("step35.swiglu_clamp_shexp", gguf::ValueType::F32).array.size(), size_t(kBlocks));
    const auto heads = f->get_u32_per_layer("step35.attention.head_count", kBlocks);
    const auto heads_kv = f->get_u32_per_layer("step35.attention.head_count_kv", kBlocks);
    const auto swa = f->get_bool_per_layer("step35.attention.sliding_window_pattern", kBlocks);
    const auto clamp_exp = f->get_f32_per_layer("step35.swiglu_clamp_exp", kBlocks);
    const auto clamp_shexp = f->get_f32_per_layer("step35.swiglu_clamp_shexp", kBlocks);
    for (int il = 0; il < kBlocks; ++il) {
      EXPECT_EQ(bool(swa[size_t(il)]), layer_is_swa(il)) << "layer " << il;
      EXPECT_EQ(heads[size_t(il)], uint32_t(layer_is_swa(il) ? kHeadsSwa : kHeadsFull)) << "layer " << il;
      EXPECT_EQ(heads_kv[size_t(il)], uint32_t(kKv));
      // The release's pattern (§1): routed 7 on the last two trunk layers, shared 16 on the last.
      EXPECT_FLOAT_EQ(clamp_exp[size_t(il)], il == 6 || il == 7 ? 7.0f : 0.0f) << "layer " << il;
      EXPECT_FLOAT_EQ(clamp_shexp[size_t(il)], il == 7 ? 16.0f : 0.0f) << "layer " << il;
    }

    // §4.3 tensors: exactly the expected set, shapes and types.
    const int64_t V = int64_t(f->get_str_array("tokenizer.ggml.tokens").size());
    const auto want = expected_tensors(V);
    std::set<std::string> got;
    for (const auto& t : f->tensors()) {
      got.insert(t.name);
      auto it = want.find(t.name);
      if (it == want.end()) {
        ADD_FAILURE() << "unexpected tensor " << t.name;
        continue;
      }
      const Expected& e = it->second;
      ASSERT_EQ(t.n_dims, e.ne.size()) << t.name;
      for (size_t d = 0; d < e.ne.size(); ++d) EXPECT_EQ(t.ne[d], e.ne[d]) << t.name << " dim " << d;
      const DType want_type = e.f32 ? DType::F32 : matrix_type;
      EXPECT_EQ(t.type, uint32_t(want_type)) << t.name;
      EXPECT_EQ(t.offset % 32, 0u) << t.name;
    }
    for (const auto& [name, e] : want) EXPECT_TRUE(got.count(name)) << "missing tensor " << name;
    EXPECT_EQ(r.summary["tensors"].get<size_t>(), want.size());
    std::remove(path.c_str());
  }
}

TEST(MakeTiny, RopeFreqsAreLlama3Factors) {
  const std::string path = tmp_file("rope");
  ASSERT_EQ(make_tiny("--out '" + path + "'").rc, 0);
  const auto f = gguf::File::open(path);
  const auto* t = f->find_tensor("rope_freqs.weight");
  ASSERT_NE(t, nullptr);
  const auto ff = dequantize(*t);
  ASSERT_EQ(ff.size(), size_t(kHeadDim / 2));
  // §2.4 with R = head_dim / 2 = 16 rotary dims on full layers, base 5e6, factor 2, low 1,
  // high 32, original context 1024 (a quarter of the 4096 training context).
  const int R = int(kHeadDim / 2);
  for (int i = 0; i < R / 2; ++i) {
    const double wl = 2 * std::numbers::pi / std::pow(5e6, -2.0 * i / R);
    double want;
    if (wl < 1024.0 / 32) {
      want = 1;
    } else if (wl > 1024.0) {
      want = 2;
    } else {
      const double s = (1024.0 / wl - 1) / 31;
      want = 1 / ((1 - s) / 2 + s);
    }
    EXPECT_NEAR(ff[size_t(i)], want, 1e-6) << "entry " << i;
  }
  // All three regimes occur, and the unused tail is 1.0 padding.
  EXPECT_FLOAT_EQ(ff[0], 1.0f);
  EXPECT_GT(ff[2], 1.0f);
  EXPECT_LT(ff[2], 2.0f);
  EXPECT_FLOAT_EQ(ff[size_t(R / 2 - 1)], 2.0f);
  for (int i = R / 2; i < R; ++i) EXPECT_FLOAT_EQ(ff[size_t(i)], 1.0f);
  std::remove(path.c_str());
}

TEST(MakeTiny, TokenizerVocabularyAndChatTemplate) {
  const std::string path = tmp_file("tok");
  ASSERT_EQ(make_tiny("--out '" + path + "'").rc, 0);
  const auto f = gguf::File::open(path);
  EXPECT_EQ(f->get_str("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_str("tokenizer.ggml.pre"), "deepseek-v3");
  const auto tokens = f->get_str_array("tokenizer.ggml.tokens");
  const auto types = f->get_i32_array("tokenizer.ggml.token_type");
  const auto merges = f->get_str_array("tokenizer.ggml.merges");
  ASSERT_EQ(tokens.size(), types.size());
  EXPECT_EQ(tokens.size(), 1000u);
  EXPECT_GE(merges.size(), 700u);
  EXPECT_EQ(tokens[0], "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
  EXPECT_EQ(tokens[1], "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(types[size_t(i)], 3) << i;  // CONTROL
  EXPECT_EQ(tokens[3 + 'A'], "A");          // byte tokens: id = 3 + byte
  EXPECT_EQ(tokens[3 + ' '], "\xC4\xA0");   // space -> U+0120
  EXPECT_EQ(tokens[3 + '\n'], "\xC4\x8A");  // LF -> U+010A
  std::map<std::string, int32_t> type_of;
  for (size_t i = 0; i < tokens.size(); ++i) type_of[tokens[i]] = types[i];
  EXPECT_EQ(type_of.at("<|im_start|>"), 3);
  EXPECT_EQ(type_of.at("<|im_end|>"), 3);
  EXPECT_EQ(type_of.at("<think>"), 4);  // USER_DEFINED
  EXPECT_EQ(type_of.at("</think>"), 4);
  EXPECT_EQ(type_of.size(), tokens.size());  // no duplicate strings
  EXPECT_EQ(f->get_u32("tokenizer.ggml.bos_token_id"), 0u);
  EXPECT_EQ(f->get_u32("tokenizer.ggml.eos_token_id"), 1u);
  EXPECT_EQ(tokens[f->get_u32("tokenizer.ggml.eot_token_id")], "<|im_end|>");
  const std::string tmpl = f->get_str("tokenizer.chat_template");
  EXPECT_NE(tmpl.find("<|im_start|>"), std::string::npos);
  EXPECT_NE(tmpl.find("add_generation_prompt"), std::string::npos);
  // Every merge joins two existing tokens into an existing token.
  for (const std::string& m : merges) {
    const size_t sp = m.find(' ', 1);
    ASSERT_NE(sp, std::string::npos) << m;
    EXPECT_TRUE(type_of.count(m.substr(0, sp)) && type_of.count(m.substr(sp + 1)) &&
                type_of.count(m.substr(0, sp) + m.substr(sp + 1)))
        << m;
  }

  // The engine's tokenizer reads it, the merges compress English, and text round-trips.
  const auto tok = Tokenizer::from_gguf(*f);
  const std::string text = "The keeper climbed the steps to light the lamp, and 2048 ships sailed past!\n";
  const auto ids = tok->encode(text, false, false);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(tok->decode(ids), text);
  const auto chat = tok->encode("<|im_start|>user\nhi<|im_end|>", false, true);
  EXPECT_EQ(tokens[size_t(chat.front())], "<|im_start|>");
  EXPECT_EQ(tokens[size_t(chat.back())], "<|im_end|>");
  std::remove(path.c_str());
}

TEST(MakeTiny, WeightStatisticsAndTypesShareValues) {
  const std::string p32 = tmp_file("stats-f32"), p16 = tmp_file("stats-f16"), p8 = tmp_file("stats-q8_0");
  ASSERT_EQ(make_tiny("--out '" + p32 + "' --seed 3 --name s").rc, 0);
  ASSERT_EQ(make_tiny("--out '" + p16 + "' --seed 3 --name s --type f16").rc, 0);
  ASSERT_EQ(make_tiny("--out '" + p8 + "' --seed 3 --name s --type q8_0").rc, 0);
  const auto f32 = gguf::File::open(p32), f16 = gguf::File::open(p16), q8 = gguf::File::open(p8);
  double mean, sd;

  // Matrices: N(0, 1/sqrt(fan_in)); residual writers at gain 0.5.
  const auto q = dequantize(*f32->find_tensor("blk.1.attn_q.weight"));
  mean_std(q, 0, q.size(), &mean, &sd);
  EXPECT_NEAR(mean, 0.0, 0.003);
  EXPECT_NEAR(sd, 1.0 / std::sqrt(double(kEmbd)), 0.03 / std::sqrt(double(kEmbd)));
  const auto o = dequantize(*f32->find_tensor("blk.1.attn_output.weight"));
  mean_std(o, 0, o.size(), &mean, &sd);
  EXPECT_NEAR(sd, 0.5 / std::sqrt(double(kHeadsSwa * kHeadDim)), 0.02 / std::sqrt(double(kHeadsSwa * kHeadDim)));
  // Norms: 1 + 0.1 N(0, 1).
  const auto n = dequantize(*f32->find_tensor("blk.3.ffn_norm.weight"));
  mean_std(n, 0, n.size(), &mean, &sd);
  EXPECT_NEAR(mean, 1.0, 0.04);
  EXPECT_NEAR(sd, 0.1, 0.03);
  // Routed experts share a base matrix: experts 0 and 1 correlate at 1 - 0.3^2 = 0.91.
  const auto g = dequantize(*f32->find_tensor("blk.2.ffn_gate_exps.weight"));
  const size_t per = size_t(kEmbd * kFfExp);
  double s01 = 0, s00 = 0, s11 = 0;
  for (size_t i = 0; i < per; ++i) s01 += g[i] * g[per + i], s00 += g[i] * g[i], s11 += g[per + i] * g[per + i];
  EXPECT_NEAR(s01 / std::sqrt(s00 * s11), 0.91, 0.03);

  // The F16 and Q8_0 files hold the same values as the F32 one, rounded.
  for (const char* name : {"blk.2.ffn_gate_exps.weight", "token_embd.weight", "blk.8.nextn.eh_proj.weight"}) {
    const auto a = dequantize(*f32->find_tensor(name));
    const auto b = dequantize(*f16->find_tensor(name));
    const auto c = dequantize(*q8->find_tensor(name));
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.size(), c.size());
    double max_err8 = 0, max_abs = 0;
    size_t bad16 = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_abs = std::max(max_abs, double(std::fabs(a[i])));
      // f16 rounding: half an ulp (2^-11 relative), or half the subnormal step 2^-24
      if (std::fabs(b[i] - a[i]) > std::fabs(a[i]) * 0x1p-11 + 0x1p-25) bad16++;
      max_err8 = std::max(max_err8, double(std::fabs(c[i] - a[i])));
    }
    EXPECT_EQ(bad16, 0u) << name;
    EXPECT_LT(max_err8, max_abs / 127.0) << name;  // half a Q8_0 step is <= amax / 254
  }
  // Non-matrix tensors stay F32 and identical across types.
  for (const char* name : {"blk.2.ffn_gate_inp.weight", "blk.2.exp_probs_b.bias", "output_norm.weight"}) {
    const auto* a = f32->find_tensor(name);
    const auto* c = q8->find_tensor(name);
    ASSERT_EQ(a->nbytes, c->nbytes) << name;
    EXPECT_EQ(0, std::memcmp(a->data, c->data, a->nbytes)) << name;
  }
  for (const auto& p : {p32, p16, p8}) std::remove(p.c_str());
}

// The engine loads every type of the tiny model and runs it: a prompt as one batch, then
// greedy steps through the KV cache, past the SWA window, with finite logits throughout.
TEST(MakeTiny, EngineLoadsAndRunsEveryType) {
  for (const char* type : kTypes) {
    const std::string path = tmp_file(std::string("run-") + type);
    const CliResult r = make_tiny("--out '" + path + "' --type " + type + " --seed 3");
    ASSERT_EQ(r.rc, 0) << r.err;
    Model::LoadOptions opts;
    opts.verbose = false;
    std::unique_ptr<Model> model;
    try {
      model = Model::load(path, opts);
    } catch (const std::exception& e) {
      FAIL() << type << ": Model::load failed: " << e.what();
    }
    const HParams& hp = model->hparams();
    EXPECT_EQ(hp.n_layer, kLayers) << type;
    EXPECT_EQ(hp.n_mtp, kMtp) << type;
    EXPECT_EQ(hp.n_embd, kEmbd) << type;
    EXPECT_EQ(hp.n_vocab, r.summary["n_vocab"].get<int>()) << type;
    ASSERT_EQ(hp.layers.size(), size_t(kBlocks)) << type;
    for (int il = 0; il < kBlocks; ++il) {
      EXPECT_EQ(hp.layers[size_t(il)].is_swa, layer_is_swa(il)) << type << " layer " << il;
      EXPECT_EQ(hp.layers[size_t(il)].is_moe, layer_is_moe(il)) << type << " layer " << il;
    }
    EXPECT_TRUE(model->has_mtp()) << type;

    const size_t V = size_t(hp.n_vocab);
    const std::vector<int32_t> prompt = {0, 45, 300, 12, 999, 7, 260, 3};
    const int n_steps = 40;  // 8 + 40 positions: beyond the 32-token window
    ThreadPool pool(2);
    Session session(*model, int32_t(prompt.size()) + n_steps, 16);
    std::vector<float> logits;
    session.forward(prompt.data(), int32_t(prompt.size()), true, logits, pool);
    ASSERT_EQ(logits.size(), prompt.size() * V) << type;
    for (size_t i = 0; i < logits.size(); ++i) ASSERT_TRUE(std::isfinite(logits[i])) << type << " logit " << i;
    // Random weights still give a non-degenerate distribution.
    double lo = logits[0], hi = logits[0];
    for (size_t i = 0; i < V; ++i) lo = std::min(lo, double(logits[i])), hi = std::max(hi, double(logits[i]));
    EXPECT_GT(hi - lo, 1e-3) << type;

    int32_t next = Sampler::argmax(logits.data() + (prompt.size() - 1) * V, V);
    std::vector<float> step;
    for (int i = 0; i < n_steps; ++i) {
      ASSERT_GE(next, 0);
      ASSERT_LT(size_t(next), V);
      session.forward(&next, 1, false, step, pool);
      ASSERT_EQ(step.size(), V) << type;
      for (size_t k = 0; k < V; ++k) ASSERT_TRUE(std::isfinite(step[k])) << type << " step " << i;
      next = Sampler::argmax(step.data(), V);
    }
    model.reset();
    std::remove(path.c_str());
  }
}

}  // namespace
