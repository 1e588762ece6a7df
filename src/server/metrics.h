// Server-side metrics for GET /metrics (Prometheus text format): HTTP requests by
// endpoint and status, TTFT / time-per-output-token histograms, routing-hint
// compliance; rendered together with the engine's own statistics.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/engine.h"
#include "model/step35.h"

namespace step35::server {

class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                      1,     2.5,  5,     10,   30,   60,  120};
  void observe(double v);
  // Prometheus lines for `name` (buckets, sum, count).
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::array<uint64_t, kBounds.size()> buckets_ = {};
  uint64_t count_ = 0;
  double sum_ = 0;
};

// The model's memory that changes while serving: routed experts repacked on first use.
std::string model_memory_metrics(const Model& model);
// The C library's heap (glibc's mallinfo2: in use, freed and kept, mapped); "" elsewhere.
std::string heap_metrics();

class ServerMetrics {
 public:
  void count_request(const std::string& endpoint, int status);
  // One finished generation (a choice): its TTFT and time per output token.
  void observe_generation(const GenerateEvent& final_event);
  // A /v1/step35/execute request: did it run under the routing hint it asked for?
  void count_routing(bool compliant);
  // One request's pictures: how many, how many went through the vision tower (the others
  // came from its cache), and how long placing them took.
  void count_images(size_t n, size_t encoded, double encode_ms);
  struct RoutingHints {
    uint64_t requests = 0, compliant = 0;
  };
  RoutingHints routing_hints() const;
  std::string render(const EngineStats& engine, bool ready) const;

 private:
  void append_server_metrics(std::string& out, const EngineStats& engine) const;

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_, tpot_;
  uint64_t routed_ = 0, routed_compliant_ = 0;
  uint64_t images_ = 0, images_encoded_ = 0;
  double image_encode_s_ = 0;
  // The previous scrape, for the tokens/s gauge.
  mutable double last_scrape_s_ = 0;
  mutable uint64_t last_generated_ = 0;
};

}  // namespace step35::server
