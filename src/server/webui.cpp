// The web pages of `step35 serve` (docs/webui.md): the chat page at /, the dashboard at
// /dashboard and their files at /webui/NAME, all compiled into the binary
// (server/webui_assets.h); and GET /v1/step35/dashboard, the JSON the dashboard polls.
//
// The pages load without an API key (they hold no data; they ask for the key when an
// endpoint answers 401); the data endpoints keep their authentication. Every page response
// carries a Content-Security-Policy without inline script, so text the model writes can
// never run as script even if a rendering bug let markup through.
#include <algorithm>
#include <chrono>
#include <string>

#include "server/api_error.h"
#include "server/endpoint.h"
#include "server/server_context.h"
#include "server/webui_assets.h"

namespace step35::server {

using nlohmann::json;

namespace {

const WebAsset* find_asset(std::string_view name) {
  for (const WebAsset& a : webui_assets())
    if (a.name == name) return &a;
  return nullptr;
}

void send_asset(httplib::Response& res, const WebAsset& asset) {
  res.set_header("Content-Security-Policy",
                 "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                 "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                 "frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("X-Frame-Options", "DENY");
  res.set_header("Referrer-Policy", "no-referrer");
  // The files change with the binary: always revalidate (cheap on localhost).
  res.set_header("Cache-Control", "no-cache");
  res.set_content(asset.bytes.data(), asset.bytes.size(), std::string(asset.content_type));
}

// A page or a file of src/server/webui/; a name that is none of them answers 404.
Body asset_body(std::string fixed_name) {
  return [fixed_name = std::move(fixed_name)](HttpExchange& ex, const std::string&) {
    const std::string name = fixed_name.empty() ? std::string(ex.req.matches[1]) : fixed_name;
    const WebAsset* asset = find_asset(name);
    if (!asset) throw ApiError(404, "no file '" + name + "' in the web pages");
    send_asset(ex.res, *asset);
  };
}

// The MoE layers' indices among all layers (the engine counts MoE layers only).
json moe_layer_indices(const ServerContext& ctx) {
  json layers = json::array();
  const HParams& hp = ctx.model->hparams();
  for (int il = 0; il < hp.n_layer; ++il)
    if (hp.layers[size_t(il)].is_moe) layers.push_back(il);
  return layers;
}

json expert_load_json(const ServerContext& ctx) {
  ExpertLoad load = ctx.engine->expert_load();
  json layers = moe_layer_indices(ctx);
  if (load.counts.empty()) {  // no pass yet: zeros for every MoE layer
    load.n_expert = ctx.model->hparams().n_expert;
    load.n_moe_layers = int32_t(layers.size());
    load.counts.assign(size_t(load.n_moe_layers) * size_t(std::max(0, load.n_expert)), 0);
  }
  json counts = json::array();
  for (int32_t l = 0; l < load.n_moe_layers; ++l) {
    json row = json::array();
    for (int32_t e = 0; e < load.n_expert; ++e) row.push_back(load.counts[size_t(l) * size_t(load.n_expert) + size_t(e)]);
    counts.push_back(std::move(row));
  }
  if (layers.size() != size_t(load.n_moe_layers) && load.n_moe_layers > 0) {
    layers = json::array();
    for (int32_t l = 0; l < load.n_moe_layers; ++l) layers.push_back(l);
  }
  return {{"n_expert", load.n_expert},
          {"layers", layers},
          {"passes", load.passes},
          {"counts", counts}};
}

// GET /v1/step35/dashboard: cumulative counters and current gauges; the page differences
// two readings for rates and for the expert load over its window.
json dashboard_json(const ServerContext& ctx) {
  const EngineStats s = ctx.engine->stats();
  const EngineOptions& eo = ctx.engine->options();
  const ServerMetrics::RoutingHints hints = ctx.metrics.routing_hints();
  json finished = json::object();
  for (int r = 0; r < 6; ++r) finished[finish_reason_name(FinishReason(r))] = s.requests_finished[r];
  json drafted = json::array(), accepted = json::array();
  for (int k = 1; k <= kMaxDrafts; ++k) {
    drafted.push_back(s.mtp_drafted[k]);
    accepted.push_back(s.mtp_accepted[k]);
  }
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return {{"object", "step35.dashboard"},
          {"time", now},
          {"model", ctx.options.model_id},
          {"n_ctx", eo.n_ctx},
          {"parallel", eo.n_parallel},
          {"requests",
           {{"running", s.running}, {"queued", s.queue_depth}, {"submitted", s.requests_submitted}, {"finished", finished}}},
          {"tokens",
           {{"prompt", s.prompt_tokens}, {"prompt_cached", s.prompt_tokens_cached}, {"generated", s.generated_tokens}}},
          {"steps", s.steps},
          {"kv",
           {{"blocks_total", s.kv_blocks_total},
            {"blocks_used", s.kv_blocks_used},
            {"blocks_cached", s.kv_blocks_cached},
            {"bytes_used", s.kv_bytes_used},
            {"bytes_total", s.kv_pool_bytes}}},
          {"prefix_cache", {{"lookups", s.prefix_lookups}, {"hits", s.prefix_hits}}},
          {"moe",
           {{"router_entropy", s.router_entropy},
            {"expert_skew", s.expert_skew},
            {"distinct_experts", s.mean_distinct_experts},
            {"adaptive_tokens", s.adaptive_tokens},
            {"adaptive_mean_k", s.adaptive_mean_k}}},
          {"mtp",
           {{"enabled", eo.mtp > 0 && ctx.model->has_mtp()},
            {"steps", s.mtp_steps},
            {"tokens", s.mtp_tokens},
            {"drafted", drafted},
            {"accepted", accepted}}},
          {"routing_hints", {{"requests", hints.requests}, {"compliant", hints.compliant}}},
          {"experts", expert_load_json(ctx)}};
}

}  // namespace

void add_webui_routes(httplib::Server& svr, ServerContext& ctx) {
  svr.Get("/v1/step35/dashboard",
          get_endpoint(ctx, {"/v1/step35/dashboard"}, [&ctx](HttpExchange& ex, const std::string&) {
            ex.res.set_header("Cache-Control", "no-store");
            set_json(ex.res, dashboard_json(ctx));
          }));
  if (!ctx.options.webui) return;
  // The pages answer while the model loads and without a key (they ask for it).
  svr.Get("/", get_endpoint(ctx, {"/", false, false}, asset_body("index.html")));
  svr.Get("/dashboard", get_endpoint(ctx, {"/dashboard", false, false}, asset_body("dashboard.html")));
  svr.Get(R"(/webui/([A-Za-z0-9_-]+\.[a-z]+))", get_endpoint(ctx, {"/webui/{file}", false, false}, asset_body("")));
}

}  // namespace step35::server
