// step35 patch inspect|apply: look into a patch file (optionally checking it against a
// model), or write a model with patches applied into a new GGUF.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "patch/patch.h"

namespace step35::cli {

namespace {

struct PatchSettings {
  std::string model, out;
  std::vector<std::string> patches;
  bool json = false;
};

ArgParser patch_parser(PatchSettings& ps) {
  ArgParser p("patch inspect|apply",
              "inspect FILE: the slices of a patch (tensor, expert, stored and base type, shape, bytes, base hash)\n"
              "and its training settings; with -m, also whether it fits that model.\n"
              "apply: writes the model with the patches applied (later ones win) to --out; every other tensor and\n"
              "every untouched expert is byte-identical to the model.");
  p.positional("ACTION", "inspect or apply");
  p.positional("[FILE]", "inspect: the patch file");
  p.option("-m,--model", "FILE", "the base model (apply: required; inspect: check the patch against it)", ps.model);
  p.option("--patch", "FILE", "apply: a patch file (repeatable)", ps.patches);
  p.option("--out", "FILE", "apply: the patched model to write", ps.out);
  p.option("--json", "inspect: print JSON", ps.json);
  return p;
}

int inspect(const PatchSettings& ps, const std::string& path) {
  const patch::Patch pt = patch::Patch::read(path);
  std::string fits;
  if (!ps.model.empty()) {
    Model::LoadOptions lo;
    lo.verbose = false;
    lo.repack = false;
    auto model = Model::load(ps.model, lo);
    pt.check_base(*model, path);  // throws with the first mismatch
    fits = ps.model;
  }
  if (ps.json) {
    nlohmann::json j;
    j["base_name"] = pt.base_name;
    j["base_hash"] = patch::hash_hex(pt.base_hash());
    j["bytes"] = pt.data_bytes();
    nlohmann::json slices = nlohmann::json::array();
    for (const patch::Slice& s : pt.slices)
      slices.push_back({{"tensor", s.tensor}, {"expert", s.expert}, {"type", dtype_name(s.type)},
                        {"base_type", dtype_name(s.base_type)}, {"shape", {s.n_in, s.n_out}},
                        {"bytes", s.data.size()}, {"base_hash", patch::hash_hex(s.base_hash)}});
    j["slices"] = slices;
    nlohmann::json train = nlohmann::json::object();
    for (const auto& [k, v] : pt.train_text) train[k] = v;
    for (const auto& [k, v] : pt.train_numbers) train[k] = v;
    j["training"] = train;
    if (!fits.empty()) j["fits"] = fits;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("patch:      %s\nbase:       %s (hash %s)\nslices:     %zu, %.2f MiB\n", path.c_str(),
              pt.base_name.c_str(), patch::hash_hex(pt.base_hash()).c_str(), pt.slices.size(),
              double(pt.data_bytes()) / (1 << 20));
  for (const patch::Slice& s : pt.slices)
    std::printf("  %-44s %-6s (base %-5s) {%lld, %lld} %10zu bytes  base hash %s\n", s.name().c_str(),
                dtype_name(s.type), dtype_name(s.base_type), static_cast<long long>(s.n_in),
                static_cast<long long>(s.n_out), s.data.size(), patch::hash_hex(s.base_hash).c_str());
  std::printf("training:\n");
  for (const auto& [k, v] : pt.train_text) std::printf("  %-20s %s\n", k.c_str(), v.c_str());
  for (const auto& [k, v] : pt.train_numbers) std::printf("  %-20s %g\n", k.c_str(), v);
  if (!fits.empty()) std::printf("fits:       %s\n", fits.c_str());
  return 0;
}

int apply(const PatchSettings& ps) {
  if (ps.model.empty()) throw UsageError("apply: -m MODEL is required");
  if (ps.out.empty()) throw UsageError("apply: --out FILE is required");
  const std::vector<std::string>& paths = ps.patches;
  if (paths.empty()) throw UsageError("apply: at least one --patch FILE is required");
  Model::LoadOptions lo;
  lo.verbose = false;
  lo.repack = false;
  auto model = Model::load(ps.model, lo);
  std::vector<patch::Patch> patches;
  for (const std::string& path : paths) patches.push_back(patch::Patch::read(path));
  const size_t n = patch::apply_to_file(*model, patches, ps.out);
  std::fprintf(stderr, "wrote %s: %s with %zu slices replaced from %zu patch%s\n", ps.out.c_str(),
               ps.model.c_str(), n, paths.size(), paths.size() == 1 ? "" : "es");
  return 0;
}

int patch_main(const Args& args) {
  PatchSettings ps;
  ArgParser p = patch_parser(ps);
  if (!p.parse(args)) return 0;
  const auto& pos = p.positionals();
  if (pos.empty()) throw UsageError("expected 'inspect FILE' or 'apply' (see --help)");
  if (pos[0] == "inspect") {
    if (pos.size() < 2) throw UsageError("inspect: which patch file?");
    return inspect(ps, pos[1]);
  }
  if (pos[0] == "apply") {
    if (pos.size() > 1) throw UsageError("apply: unexpected argument '" + pos[1] + "'");
    return apply(ps);
  }
  throw UsageError("unknown action '" + pos[0] + "' (expected inspect or apply)");
}

}  // namespace

int cmd_patch(const Args& args) { return run_guarded("patch", patch_main, args); }

}  // namespace step35::cli
