// The CLI as a user runs it: eval against a golden, run with the built-in model,
// tokenize, inspect, and clear errors (never a crash) for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "support.h"

using namespace step35::testing;

namespace {

std::string ids_csv(const nlohmann::json& ids) {
  std::string s;
  for (const auto& id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id.get<int>());
  }
  return s;
}

std::string bin() { return std::string(1, '\'').append(step35_binary()).append(1, '\''); }

// The built-in model goes to a per-build cache folder, not the user's home.
std::string env() { return "STEP35_CACHE_DIR='" + tmp_dir() + "/cache' "; }

TEST(Cli, EvalMatchesGoldenThroughTheCommandLine) {
  for (const char* threads : {"1", "2"}) {
    const auto g = read_json(golden_path("tiny-a-f32.long200.json"));
    std::string out, err;
    // The F32-cache golden needs the F32 cache (the default is F16, as llama.cpp's).
    const int rc = run_command(bin() + " eval -m '" + fixture_model("tiny-a-f32.gguf") + "' -t " + threads +
                                   " -ctk f32 -ctv f32 --greedy 32 --tokens " + ids_csv(g["prompt_tokens"]),
                               &out, &err);
    ASSERT_EQ(rc, 0) << err;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["n_vocab"], g["n_vocab"]);
    EXPECT_EQ(j["n_tokens"], g["prompt_tokens"].size());
    EXPECT_EQ(j["argmax"], g["argmax"]);
    EXPECT_EQ(j["greedy"], g["greedy"]);
    ASSERT_EQ(j["logits"].size(), 1u);
    const auto& last = j["logits"][0];
    const auto& ref = g["last_logits"];
    ASSERT_EQ(last.size(), ref.size());
    double max_abs = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      max_abs = std::max(max_abs, std::fabs(last[i].get<double>() - ref[i].get<double>()));
    EXPECT_LE(max_abs, 1e-3);
    EXPECT_NE(err.find("kv cache:"), std::string::npos) << "KV cache size is printed at load";
  }
}

// The IQ quantisations through the command line: eval on the shipped tiny-q files (IQ types
// mixed per tensor with K-quants and Q8_0). --exact: the deqf32 golden (argmax, greedy, last
// logits within 1e-3); default: llama.cpp's own quantized golden within test_golden's
// quantized criteria (last-logit rms <= 0.08, argmax agreement >= 93 %).
TEST(Cli, EvalIqQuantisationsMatchGoldens) {
  for (const char* m : {"tiny-q-iq4_xs", "tiny-q-iq2_xxs", "tiny-q-iq1_m"}) {
    for (const bool exact : {true, false}) {
      SCOPED_TRACE(std::string(m) + (exact ? " --exact" : ""));
      const auto g = read_json(golden_path(std::string(m) + (exact ? ".deqf32" : "") + ".ids64.json"));
      std::string out, err;
      const int rc = run_command(bin() + " eval -m '" + fixtures_dir() + "/models-iq/" + m + ".gguf' -t 2" +
                                     (exact ? " --exact" : "") + " --greedy 32 --tokens " + ids_csv(g["prompt_tokens"]),
                                 &out, &err);
      ASSERT_EQ(rc, 0) << err;
      const auto j = nlohmann::json::parse(out);
      const auto& last = j["logits"][0];
      const auto& ref = g["last_logits"];
      ASSERT_EQ(last.size(), ref.size());
      double max_abs = 0, sum_sq = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double d = std::fabs(last[i].get<double>() - ref[i].get<double>());
        max_abs = std::max(max_abs, d);
        sum_sq += d * d;
      }
      size_t agree = 0;
      for (size_t t = 0; t < g["argmax"].size(); ++t) agree += j["argmax"][t] == g["argmax"][t];
      if (exact) {
        EXPECT_EQ(j["argmax"], g["argmax"]);
        EXPECT_EQ(j["greedy"], g["greedy"]);
        EXPECT_LE(max_abs, 1e-3);
      } else {
        EXPECT_LE(std::sqrt(sum_sq / double(ref.size())), 0.08);
        EXPECT_GE(double(agree), 0.93 * double(g["argmax"].size()));
      }
    }
  }
}

// inspect on a mixed IQ file: per-type totals (tensors, parameters, share, bits per weight)
// and, with --tensors, each tensor's type, shape and bytes.
TEST(Cli, InspectShowsPerTypeTotalsOfAMixedIqFile) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " inspect --tensors '" + fixtures_dir() + "/models-iq/tiny-q-iq1_m.gguf'", &out, &err), 0)
      << err;
  // 13 iq1_m tensors of 2,362,368 weights at 1.75 bits; 14 q4_K; 50 tensors in all.
  EXPECT_NE(out.find("tensors:       50,"), std::string::npos) << out;
  EXPECT_NE(out.find("iq1_m         13        2362368"), std::string::npos) << out;
  EXPECT_NE(out.find("1.750"), std::string::npos) << out;
  EXPECT_NE(out.find("q4_K          14"), std::string::npos) << out;
  EXPECT_NE(out.find("blk.1.ffn_up_exps.weight                 iq1_m   {256, 256, 8}  114688 bytes"), std::string::npos)
      << out;
  EXPECT_NE(out.find("token_embd.weight                        q2_K    {256, 513}"), std::string::npos) << out;
}

// The repacked layouts (STEP35_REPACK: 0 | shared | lazy | all; tensor/repack.h) change no
// output bit: eval's logits are identical in every mode, on a Q4_K_M model (Q4_K, Q6_K) and
// on the shipped IQ files (IQ4_XS, IQ3_S, IQ2_XXS, IQ1_M in the 4-bit code layout, next to
// Q2_K..Q6_K and Q8_0 matrices); a bad value is a clear error.
TEST(Cli, RepackModesGiveIdenticalLogits) {
  const std::string fixtures = fixtures_dir();
  for (const std::string& model :
       {fixture_model("tiny-k-q4_k_m.gguf"), fixtures + "/models-iq/tiny-q-iq4_xs.gguf",
        fixtures + "/models-iq/tiny-q-iq3_s.gguf", fixtures + "/models-iq/tiny-q-iq2_xxs.gguf",
        fixtures + "/models-iq/tiny-q-iq1_m.gguf"}) {
    std::string first;
    for (const char* mode : {"0", "shared", "lazy", "all", ""}) {  // "": the default
      std::string out, err;
      ASSERT_EQ(run_command(std::string("STEP35_REPACK=") + mode + " " + bin() + " eval -m '" + model +
                                "' -t 2 --all-logits --tokens 1,7,42,300,5,9,11,12,13",
                            &out, &err),
                0)
          << model << ": " << err;
      if (std::string(mode) == "0") {
        EXPECT_EQ(err.find("repacked"), std::string::npos) << err;
        first = out;
      } else {
        EXPECT_EQ(out, first) << model << " STEP35_REPACK=" << mode;
      }
    }
  }
  std::string out, err;
  EXPECT_NE(run_command("STEP35_REPACK=yes " + bin() + " eval -m '" + fixture_model("tiny-k-q4_k_m.gguf") +
                            "' --tokens 1,2",
                        &out, &err),
            0);
  EXPECT_NE(err.find("STEP35_REPACK: expected 0, shared, lazy or all"), std::string::npos) << err;
}

TEST(Cli, EvalAllLogits) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " eval -m '" + fixture_model("tiny-b-f32.gguf") + "' --all-logits --tokens 0,5,9,12",
                        &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["logits"].size(), 4u);
  EXPECT_EQ(j["argmax"].size(), 4u);
  EXPECT_FALSE(j.contains("greedy"));
}

TEST(Cli, RunWithBuiltinTinyModel) {
  std::string out, err;
  const int rc = run_command(env() + bin() + " run -p 'Hello there' -n 16 --seed 7 -t 2", &out, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("random"), std::string::npos) << "says plainly that the weights are random";
  EXPECT_NE(err.find("timings:"), std::string::npos);
  EXPECT_NE(err.find("tok/s"), std::string::npos);
  // A fixed seed reproduces the run.
  std::string out2;
  ASSERT_EQ(run_command(env() + bin() + " run -p 'Hello there' -n 16 --seed 7 -t 1", &out2, nullptr), 0);
  EXPECT_EQ(out, out2);
}

TEST(Cli, RunGreedyAndChat) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " run -m '" + fixture_model("tiny-a-f32.gguf") +
                            "' --chat --system 'You are a test.' -p 'Hello, who are you?' -n 8 --temp 0",
                        &out, &err),
            0)
      << err;
  EXPECT_NE(err.find("prompt"), std::string::npos);
}

TEST(Cli, TokenizeMatchesGolden) {
  const auto g = read_json(golden_path("tiny-a.tokenizer.json"));
  for (const auto& e : g) {
    const std::string text = e["text"];
    if (text.find('\'') != std::string::npos) continue;  // keep the shell quoting simple
    std::string out, err;
    ASSERT_EQ(run_command(bin() + " tokenize -m '" + fixture_model("tiny-a-f32.gguf") + "' -p '" + text + "'", &out, &err), 0)
        << err;
    EXPECT_EQ(nlohmann::json::parse(out), e["ids"]) << text;
  }
}

// Each KV cache type through eval, against llama.cpp's golden for that type (tiny-a, ids64;
// criteria as tests/test_golden.cpp): every position's argmax, the greedy continuation and the
// last row's logits. BF16 has no golden: it must agree with the F32 one on every argmax.
TEST(Cli, EvalWithEachCacheType) {
  struct KvCase {
    const char* golden;
    const char* ctk;
    const char* ctv;
    double max_abs;
  };
  const KvCase cases[] = {{"tiny-a-f32.ids64", "f32", "f32", 1e-3},
                          {"tiny-a-f32.kvf16fa.ids64", "f16", "f16", 1e-3},
                          {"tiny-a-f32.kvq8_0.ids64", "q8_0", "q8_0", 1e-2},
                          {"tiny-a-f32.kvq4_0.ids64", "q4_0", "q4_0", 0.3},
                          {"tiny-a-f32.ids64", "bf16", "bf16", -1}};
  for (const KvCase& c : cases) {
    const auto g = read_json(golden_path(std::string(c.golden) + ".json"));
    std::string out, err;
    ASSERT_EQ(run_command(bin() + " eval -m '" + fixture_model("tiny-a-f32.gguf") + "' -t 2 -ctk " + c.ctk + " -ctv " +
                              c.ctv + " --greedy 32 --tokens " + ids_csv(g["prompt_tokens"]),
                          &out, &err),
              0)
        << err;
    EXPECT_NE(err.find(std::string("K ") + c.ctk + ", V " + c.ctv), std::string::npos) << err;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["argmax"], g["argmax"]) << c.golden << " " << c.ctk;
    if (c.max_abs < 0) continue;
    EXPECT_EQ(j["greedy"], g["greedy"]) << c.golden;
    double max_abs = 0;
    for (size_t i = 0; i < g["last_logits"].size(); ++i)
      max_abs = std::max(max_abs, std::fabs(j["logits"][0][i].get<double>() - g["last_logits"][i].get<double>()));
    EXPECT_LE(max_abs, c.max_abs) << c.golden;
  }
}

// inspect plans a context in the chosen types: tiny-a's 2 full-attention layers of 2 KV
// heads x 32 take 2 x 2 x (34 + 18) bytes per position with q8_0 keys and q4_0 values.
TEST(Cli, InspectPlansTheCacheInItsTypes) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " inspect '" + fixture_model("tiny-a-f32.gguf") + "' -c 1000 -ctk q8_0 -ctv q4_0", &out,
                        &err),
            0)
      << err;
  EXPECT_NE(out.find("(K q8_0, V q4_0) at context 1000"), std::string::npos) << out;
  EXPECT_NE(out.find("208 bytes per position"), std::string::npos) << out;
  ASSERT_EQ(run_command(bin() + " inspect '" + fixture_model("tiny-a-f32.gguf") + "' -c 1000", &out, &err), 0) << err;
  EXPECT_NE(out.find("(K f16, V f16)"), std::string::npos) << out;
  EXPECT_NE(out.find("512 bytes per position"), std::string::npos) << out;
}

TEST(Cli, InspectDescribesTheModel) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " inspect '" + fixture_model("tiny-a-q4_k_m.gguf") + "'", &out, &err), 0) << err;
  EXPECT_NE(out.find("step35"), std::string::npos);
  EXPECT_NE(out.find("q4_K"), std::string::npos);
  EXPECT_NE(out.find("q5_0"), std::string::npos);
  EXPECT_NE(out.find("tokenizer:"), std::string::npos);
  EXPECT_NE(out.find("kv cache:"), std::string::npos);
}

TEST(Cli, BadInputGivesClearErrors) {
  struct BadCase {
    std::string args;
    int want_rc;
    std::string want_in_err;
  };
  const std::string m = "-m '" + fixture_model("tiny-a-f32.gguf") + "'";
  // A corrupt model: a real file cut in half, and a file that is not GGUF at all.
  const std::string cut = tmp_dir() + "/cut.gguf", junk = tmp_dir() + "/junk.gguf";
  auto bytes = read_bytes(fixture_model("tiny-a-f32.gguf"));
  bytes.resize(bytes.size() / 2);
  write_bytes(cut, bytes);
  write_bytes(junk, std::vector<uint8_t>{'n', 'o', 't', ' ', 'g', 'g', 'u', 'f'});
  const std::vector<BadCase> cases = {
      {"eval " + m + " --tokens 1,x,3", 2, "--tokens"},
      {"eval " + m + " --tokens 99999", 1, "vocabulary"},
      {"eval " + m, 2, "--tokens"},
      {"eval -m '" + cut + "' --tokens 1", 1, "cut.gguf"},
      {"eval -m '" + junk + "' --tokens 1", 1, "junk.gguf"},
      {"eval -m /nonexistent.gguf --tokens 1", 1, "nonexistent"},
      {"run " + m + " -p hi --temp -1", 2, "--temp"},
      {"run " + m + " -p hi --bogus", 2, "unknown option"},
      {"run " + m + " -p 'a long prompt that will not fit' -c 4", 2, "context"},
      {"run " + m + " -p hi -n abc", 2, "--n-predict"},
      {"frobnicate", 1, "unknown command"},
      {"run " + m + " -p hi --mtp 5", 2, "--mtp"},
      {"run -m '" + fixture_model("tiny-k-q4_k_m.gguf") + "' -p hi --mtp 2", 2, "no MTP"},
      {"bench " + m + " -p 0 -n 4 --mtp-synthetic-accept 0.5", 2, "--mtp"},
      {"bench " + m + " -p 0 -n 4 --expert-policy loose", 2, "--expert-policy"},
      {"eval " + m + " --tokens 1 -ctk q5_1", 2, "--cache-type-k expects f32, f16, bf16, q8_0 or q4_0"},
      {"serve " + m + " -ctv q4_K", 2, "--cache-type-v expects"},
      {"eval -m '" + fixture_model("tiny-b-f32.gguf") + "' --tokens 1 -ctk q8_0", 1, "multiple of 32"},
      {"inspect '" + fixture_model("tiny-b-f32.gguf") + "' -ctv q4_0", 1, "value heads that are a multiple of 32"},
      {"bench " + m + " -p 8 -n 0 -d 5000", 2, "depth 5000"},
      {"bench " + m + " -p 0 -n 4 -d 16 --mtp 1", 2, "-d"},
  };
  for (const auto& c : cases) {
    std::string out, err;
    const int rc = run_command(env() + bin() + " " + c.args, &out, &err);
    EXPECT_EQ(rc, c.want_rc) << c.args << "\n" << err;
    EXPECT_NE(err.find(c.want_in_err), std::string::npos) << c.args << "\n" << err;
    // One line (plus at most a usage text for unknown commands), never a crash trace.
    EXPECT_EQ(err.find("terminate called"), std::string::npos) << err;
    EXPECT_EQ(err.find("Sanitizer"), std::string::npos) << err;
  }
}

// A shipped IQ model damaged three ways: cut inside the last tensor's blocks, one tensor's
// type id changed to another IQ type (whose bytes for the same shape overrun the next
// tensor), and to an id no ggml type has. Each is one line on stderr naming the file and
// the tensor, exit status 1, no crash.
TEST(Cli, CorruptIqModelsGiveOneLineErrors) {
  const std::string src = fixtures_dir() + "/models-iq/tiny-q-iq2_xxs.gguf";
  const auto orig = read_bytes(src);
  // The type field of a tensor info: name (u64 length + bytes), n_dims, ne[n_dims], type.
  auto type_offset = [&](const std::string& name) {
    std::string needle(8, '\0');
    const uint64_t len = name.size();
    std::memcpy(needle.data(), &len, 8);
    needle += name;
    const auto it = std::search(orig.begin(), orig.end(), needle.begin(), needle.end());
    EXPECT_NE(it, orig.end()) << name;
    const size_t pos = size_t(it - orig.begin()) + needle.size();
    uint32_t n_dims;
    std::memcpy(&n_dims, orig.data() + pos, 4);
    return pos + 4 + 8 * size_t(n_dims);
  };
  const std::string t = "blk.1.ffn_up_exps.weight";
  const size_t toff = type_offset(t);
  uint32_t type;
  std::memcpy(&type, orig.data() + toff, 4);
  ASSERT_EQ(type, 16u);  // iq2_xxs
  struct Damage {
    std::string file;
    std::vector<uint8_t> bytes;
    std::vector<std::string> want;
  };
  std::vector<Damage> damages;
  damages.push_back({"iq-cut.gguf", std::vector<uint8_t>(orig.begin(), orig.end() - 100), {"past end of file"}});
  auto retyped = orig;
  const uint32_t iq3_s = 21, unknown = 24;
  std::memcpy(retyped.data() + toff, &iq3_s, 4);
  damages.push_back({"iq-retyped.gguf", retyped, {t, "overlap"}});
  std::memcpy(retyped.data() + toff, &unknown, 4);
  damages.push_back({"iq-unknown.gguf", retyped, {t, "unknown ggml type id 24"}});
  for (const Damage& d : damages) {
    const std::string path = tmp_dir() + "/" + d.file;
    write_bytes(path, d.bytes);
    for (const char* cmd : {"eval --tokens 0,5", "inspect"}) {
      std::string out, err;
      const std::string args = std::string(cmd) == "inspect" ? " inspect '" + path + "'" : " eval -m '" + path + "' --tokens 0,5";
      EXPECT_EQ(run_command(bin() + args, &out, &err), 1) << args << "\n" << err;
      EXPECT_NE(err.find(d.file), std::string::npos) << err;
      for (const std::string& w : d.want) EXPECT_NE(err.find(w), std::string::npos) << args << "\n" << err;
      EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
      EXPECT_EQ(err.find("Sanitizer"), std::string::npos) << err;
    }
  }
}

// The option rows of a command's --help, as README tables write them: `names VALUE` | help
// (with its default), '|' escaped (scripts/cli_reference.sh prints the same).
std::vector<std::string> help_rows(const std::string& help) {
  auto escape = [](std::string t) {
    for (size_t at = t.find('|'); at != std::string::npos; at = t.find('|', at + 2)) t.insert(at, 1, '\\');
    return t;
  };
  std::vector<std::string> rows;
  std::istringstream in(help);
  std::string line, names;
  bool options = false;
  while (std::getline(in, line)) {
    if (line == "options:") {
      options = true;
    } else if (options && line.rfind("  -", 0) == 0) {
      names = line.substr(2);
    } else if (options && line.rfind("      ", 0) == 0 && names != "-h, --help") {
      rows.push_back("| `" + escape(names) + "` | " + escape(line.substr(6)) + " |");
    }
  }
  return rows;
}

// --version names the project version, the commit the binary was built from (the build
// regenerates it: a hash left from configure time would fail here after a commit) and the
// kernels this CPU gets; `step35 version` is the same.
TEST(Cli, VersionNamesTheBuild) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " --version", &out, &err), 0) << err;
  std::smatch m;
  const std::regex first(R"(^step35 ([0-9]+\.[0-9]+\.[0-9]+) \(commit ([0-9a-f]{7}|unknown)(-dirty)?\)\n)");
  ASSERT_TRUE(std::regex_search(out, m, first)) << out;
  EXPECT_EQ(m[1].str(), STEP35_PROJECT_VERSION);
  const std::string commit = m[2].str();
  std::string head;
  const std::string git = "git -C '" + std::string(PROJECT_SOURCE_DIR) + "' rev-parse --short=7 HEAD";
  if (run_command(git, &head, nullptr) == 0 && !head.empty()) {
    head.erase(head.find_last_not_of("\n") + 1);
    EXPECT_EQ(commit, head) << "the binary's commit is not the checkout's HEAD (rebuild?)";
  }
  EXPECT_NE(out.find("\nbuilt with "), std::string::npos) << out;
  EXPECT_NE(out.find("\nkernels on this CPU: "), std::string::npos) << out;
  std::string again;
  ASSERT_EQ(run_command(bin() + " version", &again, nullptr), 0);
  EXPECT_EQ(again, out);
  std::string usage;
  ASSERT_EQ(run_command(bin() + " --help", nullptr, &usage), 0);
  EXPECT_NE(usage.find("--version"), std::string::npos) << usage;
}

// The README's command-line reference is the --help texts, flag for flag and word for word:
// for every subcommand `step35 --help` lists, the README section's table holds exactly the
// rows of its --help (scripts/cli_reference.sh prints them), so the reference cannot drift
// from the help, and the help (defaults taken from the options structs) not from the code.
TEST(Cli, ReadmeMatchesHelp) {
  const std::string readme_path = std::string(PROJECT_SOURCE_DIR) + "/README.md";
  const auto readme_bytes = read_bytes(readme_path);
  const std::string readme(readme_bytes.begin(), readme_bytes.end());
  std::string usage;
  ASSERT_EQ(run_command(bin() + " --help", nullptr, &usage), 0);
  std::vector<std::string> commands;
  std::regex cmd_re("\\n  ([a-z][a-z0-9-]*)  ");
  for (auto it = std::sregex_iterator(usage.begin(), usage.end(), cmd_re); it != std::sregex_iterator(); ++it)
    commands.push_back((*it)[1]);
  ASSERT_GE(commands.size(), 6u) << usage;
  for (const std::string& cmd : commands) {
    const size_t start = readme.find("### `step35 " + cmd);
    ASSERT_NE(start, std::string::npos) << cmd << " has no README section";
    const size_t end = readme.find("\n#", start + 1);
    std::vector<std::string> documented;
    std::istringstream section(readme.substr(start, end == std::string::npos ? std::string::npos : end - start));
    for (std::string line; std::getline(section, line);)
      if (line.rfind("| `", 0) == 0) documented.push_back(line);
    std::string help;
    ASSERT_EQ(run_command(bin() + " " + cmd + " --help", &help, nullptr), 0) << cmd;
    const std::vector<std::string> expected = help_rows(help);
    EXPECT_FALSE(expected.empty()) << cmd;
    EXPECT_EQ(documented, expected) << "README's table for step35 " << cmd
                                    << " differs from its --help (scripts/cli_reference.sh prints the rows)";
  }
}

// The lossy adaptive expert policy through bench: fewer experts kept per token, and the
// drift against the strict policy reported; a mass of 1 keeps every expert (no drift).
TEST(Cli, BenchAdaptiveExpertPolicyReportsDrift) {
  const std::string base = bin() + " bench -m '" + fixture_model("tiny-a-q8_0.gguf") + "' -p 8 -n 4 -r 1 -t 1 --json";
  std::string out, err;
  ASSERT_EQ(run_command(base + " --expert-policy adaptive --adaptive-mass 0.3 --adaptive-min-k 1", &out, &err), 0)
      << err;
  auto j = nlohmann::json::parse(out)["expert_policy"];
  const int top_k = j["top_k"].get<int>();
  ASSERT_GT(top_k, 1);
  EXPECT_LT(j["experts_per_token"].get<double>(), double(top_k));
  EXPECT_GE(j["experts_per_token"].get<double>(), 1.0);
  EXPECT_GT(j["drift_max_abs"].get<double>(), 0.0);
  EXPECT_GE(j["argmax_agreement"].get<double>(), 0.0);
  EXPECT_LE(j["argmax_agreement"].get<double>(), 1.0);
  ASSERT_EQ(run_command(base + " --expert-policy adaptive --adaptive-mass 1", &out, &err), 0) << err;
  j = nlohmann::json::parse(out)["expert_policy"];
  EXPECT_EQ(j["experts_per_token"].get<double>(), double(top_k));
  EXPECT_EQ(j["drift_max_abs"].get<double>(), 0.0);
  EXPECT_EQ(j["argmax_agreement"].get<double>(), 1.0);
}

// bench --parallel: N sequences decode together through the engine; every level reports
// positive rates, and more sequences touch more distinct experts per step.
TEST(Cli, BenchParallelReportsBatchedDecoding) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " bench -m '" + fixture_model("tiny-a-q8_0.gguf") +
                            "' -p 0 -n 12 -r 1 -t 2 --parallel 1,4 --parallel-prompt 5 --json",
                        &out, &err),
            0)
      << err;
  const auto par = nlohmann::json::parse(out)["parallel"];
  ASSERT_EQ(par.size(), 2u);
  EXPECT_EQ(par[0]["sequences"].get<int>(), 1);
  EXPECT_EQ(par[1]["sequences"].get<int>(), 4);
  for (const auto& lvl : par) {
    EXPECT_EQ(lvl["prompt_tokens"].get<int>(), 5);
    EXPECT_EQ(lvl["gen_tokens"].get<int>(), 12);
    EXPECT_GT(lvl["total_tok_per_s"].get<double>(), 0.0);
    EXPECT_GT(lvl["decode_tok_per_s"].get<double>(), 0.0);
  }
  EXPECT_GT(par[1]["distinct_experts"].get<double>(), par[0]["distinct_experts"].get<double>());
  // Bad values are usage errors.
  EXPECT_EQ(run_command(bin() + " bench -p 0 -n 4 --parallel 0", &out, &err), 2);
}

TEST(Cli, BenchReportsSpeedAndRoofline) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " bench -m '" + fixture_model("tiny-a-q8_0.gguf") +
                            "' -p 16 -n 4 -r 2 -t 1,2 --json --membw --membw-mib 64",
                        &out, &err),
            0)
      << err;
  std::istringstream lines(out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(j["threads"].get<int>(), n);
    EXPECT_EQ(j["pp"]["tokens"].get<int>(), 16);
    EXPECT_EQ(j["tg"]["tokens"].get<int>(), 4);
    EXPECT_GT(j["pp"]["tok_per_s"].get<double>(), 0);
    EXPECT_GT(j["tg"]["tok_per_s"].get<double>(), 0);
    EXPECT_EQ(j["tg"]["samples"].size(), 2u);
    EXPECT_GT(j["peak_rss_bytes"].get<double>(), 1e6);
    EXPECT_GT(j["membw_bytes_per_s"].get<double>(), 1e8);
    EXPECT_GT(j["active_bytes_per_token"].get<double>(), 1e5);
    EXPECT_GT(j["tg_share_of_roofline"].get<double>(), 0);
  }
  EXPECT_EQ(n, 2);
  // The table form.
  ASSERT_EQ(run_command(bin() + " bench -m '" + fixture_model("tiny-a-q8_0.gguf") + "' -p 8 -n 2 -r 1 -t 1", &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("| pp8 |"), std::string::npos) << out;
  EXPECT_NE(out.find("| tg2 |"), std::string::npos) << out;
  // Speculative tg with simulated acceptance reports the MTP statistics.
  ASSERT_EQ(run_command(bin() + " bench -m '" + fixture_model("tiny-b-f32.gguf") +
                            "' -p 0 -n 16 -r 1 -t 1 --mtp 2 --mtp-synthetic-accept 0.8 --verify-cost --json",
                        &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_GT(j["mtp"]["mean_tokens_per_step"].get<double>(), 1.3);
  EXPECT_EQ(j["verify_cost"].size(), 4u);
  EXPECT_GT(j["verify_cost"][3]["distinct_experts"].get<double>(), j["verify_cost"][0]["distinct_experts"].get<double>());
  EXPECT_EQ(run_command(bin() + " bench -t 0", &out, &err), 2);
  EXPECT_NE(err.find("-t"), std::string::npos);
}

// bench -d: pp and tg after DEPTH tokens in the cache (past tiny-a's 16-token window, so the
// cache goes back to the depth after every repetition with its window blocks still held).
TEST(Cli, BenchAtDepth) {
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " bench -m '" + fixture_model("tiny-a-q8_0.gguf") +
                            "' -p 8 -n 2 -d 0,40 -r 2 -t 2 -ctk q8_0 -ctv q8_0 --json",
                        &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["cache_type_k"], "q8_0");
  EXPECT_EQ(j["cache_type_v"], "q8_0");
  EXPECT_GT(j["kv_cache_bytes"].get<double>(), 0);
  for (const char* key : {"pp8", "tg2"}) {
    EXPECT_GT(j["tests"][key]["tok_per_s"].get<double>(), 0) << key;
    EXPECT_EQ(j["tests"][std::string(key) + " @ d40"]["samples"].size(), 2u) << key;
  }
  EXPECT_EQ(j["tests"].size(), 4u);
  EXPECT_EQ(j["pp"], j["tests"]["pp8"]);  // the first depth also at the top level
  ASSERT_EQ(run_command(bin() + " bench -m '" + fixture_model("tiny-a-q8_0.gguf") + "' -p 8 -n 2 -d 40 -r 1 -t 1 -ctk q8_0",
                        &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("| pp8 @ d40 |"), std::string::npos) << out;
  EXPECT_NE(out.find("| tg2 @ d40 |"), std::string::npos) << out;
  EXPECT_NE(out.find("KV q8_0/f16"), std::string::npos) << out;
}

}  // namespace
