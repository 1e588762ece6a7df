#include "server/metrics.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstdio>

namespace step35::server {

std::string heap_metrics() {
  std::string out;
#ifdef __GLIBC__
  const struct mallinfo2 mi = mallinfo2();
  // Another allocator in glibc's place (a sanitizer's, or one preloaded) reports nothing.
  if (mi.uordblks == 0 && mi.fordblks == 0 && mi.hblkhd == 0) return out;
  out = "# HELP step35_heap_bytes the C library's heap: in_use (allocated), free (freed, kept for reuse), mapped "
        "(large blocks mapped one by one)\n# TYPE step35_heap_bytes gauge\n";
  out += "step35_heap_bytes{kind=\"in_use\"} " + std::to_string(mi.uordblks) + "\n";
  out += "step35_heap_bytes{kind=\"free\"} " + std::to_string(mi.fordblks) + "\n";
  out += "step35_heap_bytes{kind=\"mapped\"} " + std::to_string(mi.hblkhd) + "\n";
#endif
  return out;
}

namespace {
void metric(std::string& out, const char* name, const char* type, const char* help, double value);

// Under --mem-budget (docs/memory.md): the expert cache's slots and traffic.
void append_expert_cache_metrics(std::string& out, const offload::ExpertCache& cache) {
  const offload::ExpertCacheStats s = cache.stats();
  metric(out, "step35_expert_cache_slots", "gauge", "routed experts the memory budget keeps in memory", double(s.slots));
  metric(out, "step35_expert_cache_hits_total", "counter", "experts a pass needed that were in memory", double(s.hits));
  metric(out, "step35_expert_cache_misses_total", "counter", "experts read from the model file", double(s.misses));
  metric(out, "step35_expert_cache_hit_rate", "gauge", "hits / (hits + misses) since start", s.hit_rate());
  metric(out, "step35_expert_cache_evictions_total", "counter", "experts dropped to make room", double(s.evictions));
  metric(out, "step35_expert_cache_read_bytes_total", "counter", "bytes read from the model file for experts",
         double(s.bytes_read));
  metric(out, "step35_expert_cache_read_seconds_total", "counter", "seconds passes waited for expert reads",
         s.read_seconds);
  metric(out, "step35_expert_cache_prefetched_total", "counter", "experts read ahead of the pass (next block's router)",
         double(s.prefetched));
  metric(out, "step35_expert_cache_prefetch_used_total", "counter", "experts read ahead that a pass then asked for",
         double(s.prefetch_used));
  metric(out, "step35_expert_cache_prefetch_wasted_total", "counter", "experts read ahead and evicted unused",
         double(s.prefetch_wasted));
}
}  // namespace

std::string model_memory_metrics(const Model& model) {
  std::string cache;
  if (const offload::ExpertCache* c = model.expert_cache()) append_expert_cache_metrics(cache, *c);
  return cache + "# HELP step35_expert_repacked_bytes routed experts' copies made on first use so far (of "
         "step35_expert_repack_bytes)\n# TYPE step35_expert_repacked_bytes gauge\nstep35_expert_repacked_bytes " +
         std::to_string(model.lazy_repacked_so_far()) +
         "\n# HELP step35_expert_repack_bytes bytes all routed experts' copies take once each is used\n"
         "# TYPE step35_expert_repack_bytes gauge\nstep35_expert_repack_bytes " +
         std::to_string(model.lazy_repack_bytes()) + "\n";
}

void Histogram::observe(double v) {
  for (size_t i = 0; i < kBounds.size(); ++i)
    if (v <= kBounds[i]) ++buckets_[i];
  ++count_;
  sum_ += v;
}

static std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  for (size_t i = 0; i < kBounds.size(); ++i)
    out += name + "_bucket{le=\"" + num(kBounds[i]) + "\"} " + std::to_string(buckets_[i]) + "\n";
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return out;
}

void ServerMetrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{endpoint, status}];
}

void ServerMetrics::observe_generation(const GenerateEvent& ev) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ev.n_generated > 0) ttft_.observe(ev.ttft_s);
  if (ev.n_generated > 1) tpot_.observe((ev.total_s - ev.ttft_s) / (ev.n_generated - 1));
}

void ServerMetrics::count_routing(bool compliant) {
  std::lock_guard<std::mutex> lk(mu_);
  ++routed_;
  routed_compliant_ += compliant;
}

void ServerMetrics::count_images(size_t n, size_t encoded, double encode_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  images_ += n;
  images_encoded_ += encoded;
  image_encode_s_ += encode_ms / 1000.0;
}

ServerMetrics::RoutingHints ServerMetrics::routing_hints() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {routed_, routed_compliant_};
}

namespace {
void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + num(value) + "\n";
}

// Engine requests by outcome, and the tokens and passes they cost.
void append_request_metrics(std::string& out, const EngineStats& s) {
  out += "# HELP step35_requests_finished_total engine requests by finish reason\n"
         "# TYPE step35_requests_finished_total counter\n";
  for (int r = 0; r < 6; ++r)
    out += std::string("step35_requests_finished_total{reason=\"") + finish_reason_name(FinishReason(r)) + "\"} " +
           std::to_string(s.requests_finished[r]) + "\n";
  metric(out, "step35_requests_submitted_total", "counter", "engine requests submitted (one per choice)", double(s.requests_submitted));
  metric(out, "step35_queue_depth", "gauge", "requests waiting to start", s.queue_depth);
  metric(out, "step35_running_sequences", "gauge", "sequences being stepped", s.running);
  metric(out, "step35_prompt_tokens_total", "counter", "prompt tokens computed (cache hits excluded)", double(s.prompt_tokens));
  metric(out, "step35_prompt_tokens_cached_total", "counter", "prompt tokens reused from the prefix cache", double(s.prompt_tokens_cached));
  metric(out, "step35_generated_tokens_total", "counter", "tokens generated", double(s.generated_tokens));
  metric(out, "step35_steps_total", "counter", "forward passes", double(s.steps));
}

// The KV pool (blocks and bytes) and the prefix cache over it.
void append_kv_metrics(std::string& out, const EngineStats& s) {
  metric(out, "step35_kv_blocks_total", "gauge", "KV cache blocks in the pool", double(s.kv_blocks_total));
  metric(out, "step35_kv_blocks_used", "gauge", "KV blocks held by running sequences", double(s.kv_blocks_used));
  metric(out, "step35_kv_blocks_cached", "gauge", "idle KV blocks kept for prefix reuse (evictable)", double(s.kv_blocks_cached));
  metric(out, "step35_kv_blocks_free", "gauge", "KV blocks neither used nor cached",
         double(s.kv_blocks_total - s.kv_blocks_used - s.kv_blocks_cached));
  metric(out, "step35_kv_bytes_total", "gauge", "bytes of the KV pool (in its cache types)", double(s.kv_pool_bytes));
  metric(out, "step35_kv_bytes_used", "gauge", "bytes of the KV blocks held by running sequences", double(s.kv_bytes_used));
  metric(out, "step35_kv_bytes_resident", "gauge",
         "bytes of the KV pool and MTP caches in memory (committed on first write, kept when freed)",
         double(s.kv_resident_bytes));
  metric(out, "step35_prefix_cache_lookups_total", "counter", "requests that looked up the prefix cache", double(s.prefix_lookups));
  metric(out, "step35_prefix_cache_hits_total", "counter", "lookups that reused at least one block", double(s.prefix_hits));
  metric(out, "step35_prefix_cache_hit_rate", "gauge", "hits / lookups",
         s.prefix_lookups ? double(s.prefix_hits) / double(s.prefix_lookups) : 0.0);
}

// How the MoE router spreads tokens over experts.
void append_router_metrics(std::string& out, const EngineStats& s) {
  metric(out, "step35_router_entropy_nats", "gauge", "mean entropy of the normalised weights of the selected experts (recent steps)", s.router_entropy);
  metric(out, "step35_expert_activation_skew", "gauge", "max / mean expert activation count per MoE layer (recent steps)", s.expert_skew);
  metric(out, "step35_distinct_experts_per_step", "gauge", "distinct routed experts per MoE layer per step (recent steps)", s.mean_distinct_experts);
  metric(out, "step35_adaptive_tokens_total", "counter", "tokens routed with the adaptive expert policy", double(s.adaptive_tokens));
  metric(out, "step35_adaptive_mean_experts", "gauge", "mean routed experts per adaptive token", s.adaptive_mean_k);
}

void append_mtp_metrics(std::string& out, const EngineStats& s) {
  metric(out, "step35_mtp_steps_total", "counter", "MTP verification steps with drafts", double(s.mtp_steps));
  metric(out, "step35_mtp_tokens_total", "counter", "tokens those MTP steps produced", double(s.mtp_tokens));
  // Per draft position k (1..3): drafts proposed, drafts accepted, and their ratio (the
  // acceptance rate the adaptive-K controller works from).
  struct PositionSeries {
    const char *name, *type, *help;
  };
  const PositionSeries series[] = {
      {"step35_mtp_drafts_total", "counter", "MTP drafts proposed, by draft position"},
      {"step35_mtp_accepted_total", "counter", "MTP drafts accepted, by draft position"},
      {"step35_mtp_acceptance_rate", "gauge", "accepted / proposed MTP drafts, by draft position"}};
  for (int which = 0; which < 3; ++which) {
    const PositionSeries& ps = series[which];
    out += std::string("# HELP ") + ps.name + " " + ps.help + "\n# TYPE " + ps.name + " " + ps.type + "\n";
    for (int k = 1; k <= kMaxDrafts; ++k) {
      const double drafted = double(s.mtp_drafted[k]), accepted = double(s.mtp_accepted[k]);
      const double value = which == 0 ? drafted : which == 1 ? accepted : (drafted > 0 ? accepted / drafted : 0.0);
      out += std::string(ps.name) + "{position=\"" + std::to_string(k) + "\"} " + num(value) + "\n";
    }
  }
}
}  // namespace

// What the server itself counts (under mu_): HTTP requests, latencies, the generation rate
// since the previous scrape, routing hints and pictures.
void ServerMetrics::append_server_metrics(std::string& out, const EngineStats& s) const {
  std::lock_guard<std::mutex> lk(mu_);
  out += "# HELP step35_http_requests_total HTTP requests by endpoint and status\n"
         "# TYPE step35_http_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "step35_http_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) +
           "\"} " + std::to_string(n) + "\n";
  out += ttft_.render("step35_time_to_first_token_seconds", "submit to first generated token, per choice");
  out += tpot_.render("step35_time_per_output_token_seconds", "mean time per generated token after the first, per choice");
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const double dt = now - last_scrape_s_;
  const double rate = last_scrape_s_ > 0 && dt > 0 && s.generated_tokens >= last_generated_
                          ? double(s.generated_tokens - last_generated_) / dt
                          : 0.0;
  last_scrape_s_ = now;
  last_generated_ = s.generated_tokens;
  metric(out, "step35_generation_tokens_per_second", "gauge", "tokens generated per second since the previous scrape", rate);
  metric(out, "step35_routing_hint_requests_total", "counter", "execute requests with a routing hint", double(routed_));
  metric(out, "step35_routing_hint_compliance", "gauge",
         "share of execute requests served under the routing hint they asked for (1 when none yet)",
         routed_ ? double(routed_compliant_) / double(routed_) : 1.0);
  metric(out, "step35_images_total", "counter", "pictures in requests (--mmproj)", double(images_));
  metric(out, "step35_images_encoded_total", "counter",
         "of them, pictures that went through the vision tower (the others came from its cache)",
         double(images_encoded_));
  metric(out, "step35_image_encode_seconds_total", "counter",
         "time spent placing them: decoding excluded, encoding, layout and tokens included", image_encode_s_);
}

std::string ServerMetrics::render(const EngineStats& s, bool ready) const {
  std::string out;
  metric(out, "step35_ready", "gauge", "1 once the model is loaded", ready ? 1 : 0);
  append_server_metrics(out, s);
  append_request_metrics(out, s);
  append_kv_metrics(out, s);
  append_router_metrics(out, s);
  append_mtp_metrics(out, s);
  return out;
}

}  // namespace step35::server
