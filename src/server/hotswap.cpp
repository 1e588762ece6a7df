// POST /v1/step35/hotswap {"patch": PATH}: validate a patch file against the loaded model
// (shapes, types, base hash; 400 and nothing changed on a mismatch), then swap its slices
// in between requests: Engine::run_exclusive lets the running requests finish with the
// weights they started with, installs the new set (Model::set_replacements, which also
// reaches the expert-parallel ranks before their next work), and starts the queued
// requests on it. POST /v1/step35/hotswap/revert takes the last swap back ({"all": true}:
// every swap, back to the patches the server started with). Admin only: with API keys set
// one is required (as everywhere), without any only loopback clients may swap.
#include <cmath>

#include "gguf/gguf.h"
#include "server/api_error.h"
#include "server/endpoint.h"
#include "server/request_validation.h"
#include "server/server_context.h"

namespace step35::server {

namespace {

using json = nlohmann::json;

void require_admin(const ServerContext& ctx, const httplib::Request& req) {
  // The endpoint wrapper has checked the API key when there is one.
  if (!ctx.options.api_keys.empty()) return;
  const std::string& a = req.remote_addr;
  if (a == "127.0.0.1" || a == "::1" || a == "::ffff:127.0.0.1") return;
  throw ApiError(403, "hot-swap is an admin operation: start the server with --api-key, or call it from this host", "",
                 "permission_error");
}

// The replacements of the startup patches and of the given swapped patches, in order.
std::vector<MatrixReplacement> compose(const std::vector<MatrixReplacement>& startup,
                                       const std::vector<HotSwapState::Active>& stack) {
  std::vector<MatrixReplacement> all = startup;
  for (const HotSwapState::Active& a : stack)
    for (MatrixReplacement& r : a.patch->replacements(a.patch)) all.push_back(std::move(r));
  return all;
}

json active_list(const std::vector<HotSwapState::Active>& stack) {
  json list = json::array();
  for (const HotSwapState::Active& a : stack)
    list.push_back({{"patch", a.path}, {"slices", a.patch->slices.size()}, {"bytes", a.patch->data_bytes()},
                    {"base_hash", patch::hash_hex(a.patch->base_hash())}});
  return list;
}

// Installs `all` between requests; an invalid set changes nothing (400).
void install(ServerContext& ctx, std::vector<MatrixReplacement> all) {
  try {
    ctx.engine->run_exclusive([&] { ctx.model->set_replacements(std::move(all)); });
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), "patch");
  }
}

}  // namespace

void handle_hotswap(ServerContext& ctx, const std::string& body_text, HttpExchange& ex) {
  require_admin(ctx, ex.req);
  const json body = parse_body(body_text);
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object", "patch");
  // The deployment guides' form also names the expert; a patch carries its own (layer,
  // expert) slices, so a separate id could only contradict it: refuse it rather than ignore it.
  if (body.contains("expert_id"))
    throw ApiError(400, "'expert_id' is not used: a patch file names its own slices (layer and expert); send {\"patch\": PATH}",
                   "expert_id");
  Fields(body).only({"patch", "weights_path"});
  if (body.contains("patch") && body.contains("weights_path"))
    throw ApiError(400, "give 'patch' or 'weights_path', not both", "weights_path");
  // "weights_path" is the name the Step 3.5 deployment guides use for the same thing.
  const char* key = body.contains("patch") ? "patch" : "weights_path";
  if (!body.contains(key) || !body[key].is_string() || body[key].get<std::string>().empty())
    throw ApiError(400, "'patch' (the path of a patch file from step35 finetune) is required", "patch");
  const std::string path = body[key].get<std::string>();
  HotSwapState& hs = ctx.hotswap;
  std::lock_guard<std::mutex> swap_lock(hs.swap_mu);
  auto reject = [&hs] {
    std::lock_guard<std::mutex> lock(hs.mu);
    ++hs.rejected;
  };
  HotSwapState::Active next;
  next.path = path;
  try {
    auto p = std::make_shared<const patch::Patch>(patch::Patch::read(path));
    p->check_base(*ctx.model, path);
    next.patch = std::move(p);
  } catch (const patch::PatchError& e) {
    reject();
    throw ApiError(400, e.what(), "patch");
  } catch (const gguf::Error& e) {
    reject();
    throw ApiError(400, e.what(), "patch");
  }
  std::vector<MatrixReplacement> startup;
  std::vector<HotSwapState::Active> stack;
  {
    std::lock_guard<std::mutex> lock(hs.mu);
    if (!hs.have_startup) {
      hs.startup = ctx.model->weights()->replacements;
      hs.have_startup = true;
    }
    startup = hs.startup;
    stack = hs.stack;
  }
  stack.push_back(next);
  try {
    install(ctx, compose(startup, stack));
  } catch (const ApiError&) {
    reject();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(hs.mu);
    hs.stack = stack;
    ++hs.swaps;
  }
  const uint64_t version = ctx.model->weights()->version;
  ctx.log.event("hotswap",
                "hot-swapped " + path + " (" + std::to_string(next.patch->slices.size()) + " slices; weights version " +
                    std::to_string(version) + ", " + std::to_string(stack.size()) + " active)",
                {{"patch", path}, {"slices", next.patch->slices.size()}, {"weights_version", version},
                 {"active", stack.size()}});
  set_json(ex.res, {{"status", "ok"},
                    {"patch", path},
                    {"slices", next.patch->slices.size()},
                    {"bytes", next.patch->data_bytes()},
                    {"weights_version", version},
                    {"active", active_list(stack)}});
}

void handle_hotswap_revert(ServerContext& ctx, const std::string& body_text, HttpExchange& ex) {
  require_admin(ctx, ex.req);
  const json body = body_text.empty() ? json::object() : parse_body(body_text);
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object (or empty)");
  Fields(body).only({"all"});
  if (body.contains("all") && !body["all"].is_boolean()) throw ApiError(400, "'all' must be true or false", "all");
  const bool all = body.value("all", false);
  HotSwapState& hs = ctx.hotswap;
  std::lock_guard<std::mutex> swap_lock(hs.swap_mu);
  std::vector<MatrixReplacement> startup;
  std::vector<HotSwapState::Active> kept;
  {
    std::lock_guard<std::mutex> lock(hs.mu);
    startup = hs.startup;
    kept = hs.stack;
  }
  if (kept.empty()) throw ApiError(400, "no hot-swapped patch to revert");
  json reverted = json::array();
  do {
    reverted.push_back(kept.back().path);
    kept.pop_back();
  } while (all && !kept.empty());
  install(ctx, compose(startup, kept));
  {
    std::lock_guard<std::mutex> lock(hs.mu);
    hs.stack = kept;
    ++hs.reverts;
  }
  const uint64_t version = ctx.model->weights()->version;
  ctx.log.event("hotswap_revert",
                "reverted " + std::to_string(reverted.size()) + " hot-swap" + (reverted.size() == 1 ? "" : "s") +
                    " (weights version " + std::to_string(version) + ", " + std::to_string(kept.size()) + " active)",
                {{"reverted", reverted}, {"weights_version", version}, {"active", kept.size()}});
  set_json(ex.res, {{"status", "ok"},
                    {"reverted", reverted},
                    {"weights_version", version},
                    {"active", active_list(kept)}});
}

void handle_hotswap_list(ServerContext& ctx, HttpExchange& ex) {
  require_admin(ctx, ex.req);
  HotSwapState& hs = ctx.hotswap;
  std::lock_guard<std::mutex> lock(hs.mu);
  set_json(ex.res, {{"weights_version", ctx.model->weights()->version}, {"active", active_list(hs.stack)}});
}

void apply_startup_patches(ServerContext& ctx) {
  std::vector<std::shared_ptr<const patch::Patch>> patches;
  try {
    patches = patch::load_and_apply(*ctx.model, ctx.options.patches);
  } catch (const patch::PatchError& e) {
    throw std::runtime_error(std::string("--patch: ") + e.what());
  } catch (const gguf::Error& e) {
    throw std::runtime_error(std::string("--patch: ") + e.what());
  }
  HotSwapState& hs = ctx.hotswap;
  {
    std::lock_guard<std::mutex> lock(hs.mu);
    hs.startup = ctx.model->weights()->replacements;
    hs.have_startup = true;
  }
  size_t slices = 0;
  uint64_t bytes = 0;
  json files = json::array();
  for (size_t i = 0; i < patches.size(); ++i) {
    slices += patches[i]->slices.size();
    bytes += patches[i]->data_bytes();
    files.push_back({{"patch", ctx.options.patches[i]}, {"base_hash", patch::hash_hex(patches[i]->base_hash())}});
  }
  std::string names;
  for (const std::string& path : ctx.options.patches) names += (names.empty() ? "" : ", ") + path;
  ctx.log.event("patches",
                "patches applied: " + names + " (" + std::to_string(slices) + " slices, " +
                    std::to_string(bytes) + " bytes)",
                {{"patches", files}, {"slices", slices}, {"bytes", bytes}});
}

std::string hotswap_metrics(ServerContext& ctx) {
  HotSwapState& hs = ctx.hotswap;
  std::lock_guard<std::mutex> lock(hs.mu);
  std::string s;
  s += "# HELP step35_hotswaps_total Patches swapped into the running model (POST /v1/step35/hotswap), by result.\n";
  s += "# TYPE step35_hotswaps_total counter\n";
  s += "step35_hotswaps_total{result=\"ok\"} " + std::to_string(hs.swaps) + "\n";
  s += "step35_hotswaps_total{result=\"rejected\"} " + std::to_string(hs.rejected) + "\n";
  s += "# HELP step35_hotswap_reverts_total Successful POST /v1/step35/hotswap/revert calls.\n";
  s += "# TYPE step35_hotswap_reverts_total counter\n";
  s += "step35_hotswap_reverts_total " + std::to_string(hs.reverts) + "\n";
  s += "# HELP step35_active_patches Hot-swapped patches in effect (not counting --patch at start).\n";
  s += "# TYPE step35_active_patches gauge\n";
  s += "step35_active_patches " + std::to_string(hs.stack.size()) + "\n";
  s += "# HELP step35_active_patch One series per hot-swapped patch in effect, in order.\n";
  s += "# TYPE step35_active_patch gauge\n";
  for (size_t i = 0; i < hs.stack.size(); ++i) {
    std::string path;
    for (char c : hs.stack[i].path) {  // a Prometheus label value: escape \ " and newlines
      if (c == '\n') {
        path += "\\n";
        continue;
      }
      if (c == '\\' || c == '"') path += '\\';
      path += c;
    }
    s += "step35_active_patch{position=\"" + std::to_string(i + 1) + "\",patch=\"" + path + "\",base_hash=\"" +
         patch::hash_hex(hs.stack[i].patch->base_hash()) + "\"} 1\n";
  }
  s += "# HELP step35_weights_version Weight sets installed since start (each swap or revert adds one).\n";
  s += "# TYPE step35_weights_version gauge\n";
  s += "step35_weights_version " + std::to_string(ctx.model->weights()->version) + "\n";
  return s;
}

}  // namespace step35::server
