// The generation engine behind the server: requests (prompt tokens + sampling settings)
// go in, token events come out. One scheduler thread runs every forward pass; requests
// join and leave between steps (continuous batching).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/mtp_limits.h"
#include "engine/sampler.h"
#include "exec/kv_cache.h"
#include "structured/constraint.h"
#include "tensor/kernels.h"

namespace step35 {

class Model;

// Scheduling class (POST /v1/step35/execute routing_hint). LowLatency requests are
// admitted and stepped ahead of the others and never wait to fill a batch;
// HighThroughput ones may wait up to EngineOptions::batch_wait_ms to join a larger step.
enum class Priority : uint8_t { Normal, LowLatency, HighThroughput };

// Routed-expert policy per request. Strict: exactly the model's top-k. Adaptive (lossy,
// never the default): per token keep the smallest set of top-ranked experts whose
// normalised router weights reach `adaptive_mass`, never fewer than `adaptive_min_k`.
enum class ExpertPolicy : uint8_t { Strict, Adaptive };
// The adaptive policy's default mass and minimum (GenerateRequest, the server's options,
// the command line).
inline constexpr float kDefaultAdaptiveMass = 0.9f;
inline constexpr int32_t kDefaultAdaptiveMinK = 4;

enum class FinishReason : uint8_t {
  Stop,       // an end-of-generation token (or the constraint completed)
  Length,     // max_tokens reached
  Context,    // the sequence filled its context
  Cancelled,  // cancel() or the sink returned false
  Timeout,    // the request's deadline passed
  Error,      // see GenerateEvent::error
};
const char* finish_reason_name(FinishReason r);

// Input rows that stand in for token embeddings at a prompt's picture positions (vision).
// Those positions carry negative token ids: keys derived from the picture's content and the
// position within it, so that the prefix cache reuses cached positions of a picture only
// for the same picture. The k-th negative id of the prompt takes row k.
struct PromptEmbeddings {
  int32_t n_embd = 0;
  std::vector<float> rows;  // n_embd floats per negative token id, in prompt order
  size_t n_rows() const { return n_embd > 0 ? rows.size() / size_t(n_embd) : 0; }
};

struct GenerateRequest {
  std::vector<int32_t> prompt;       // token ids (BOS included when wanted); < 0: picture keys
  std::shared_ptr<const PromptEmbeddings> embeddings;  // the rows of the negative ids
  SamplingParams sampling;
  int32_t max_tokens = -1;           // < 0: until the context is full
  int32_t n_ctx = 0;                 // per-request context limit; 0 = the engine's
  bool ignore_eos = false;
  // End-of-generation tokens are never sampled before this many tokens were generated.
  int32_t min_tokens = 0;
  int32_t n_top_logprobs = 0;        // alternatives per token in events (0..20)
  bool want_logprobs = false;        // fill GenerateEvent::logprob
  std::shared_ptr<TokenConstraint> constraint;  // optional
  Priority priority = Priority::Normal;
  ExpertPolicy expert_policy = ExpertPolicy::Strict;
  float adaptive_mass = kDefaultAdaptiveMass;
  int32_t adaptive_min_k = kDefaultAdaptiveMinK;
  double timeout_s = 0;              // 0: none
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct GenerateEvent {
  bool done = false;                 // last event of the request
  // Token events (done == false):
  int32_t token = -1;
  float logprob = 0;                 // when want_logprobs
  std::vector<TokenLogprob> top;     // n_top_logprobs alternatives, best first
  // Final event (done == true):
  FinishReason reason = FinishReason::Stop;
  std::string error;                 // FinishReason::Error
  int32_t n_prompt = 0;              // prompt tokens
  int32_t n_cached = 0;              // of which reused from the prefix cache
  int32_t n_generated = 0;
  double ttft_s = 0;                 // submit -> first token
  double total_s = 0;
};

// What a sink answers to a token event (the answer to the final event is ignored).
enum class SinkReply : uint8_t {
  Continue,
  // The output is complete (a stop string matched, the one tool call allowed closed): the
  // request ends at this token with FinishReason::Stop, no further token is generated, and
  // the sink still gets the final event.
  Stop,
  // The client went away: the request ends with FinishReason::Cancelled, and no further
  // event (not even the final one) is delivered.
  Cancel,
};

// Receives the events of one request, on the scheduler thread: keep it short (no I/O).
// Its resources are released as soon as it answers Stop or Cancel.
using EventSink = std::function<SinkReply(const GenerateEvent&)>;

// Thrown by submit(): the queue is full (HTTP 503 + Retry-After).
class QueueFullError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Thrown by submit(): the request can never run (prompt longer than the context, bad
// sizes) (HTTP 400).
class RequestError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// What one forward pass of the scheduler carried and how long it took
// (EngineOptions::on_step, for tests and diagnostics such as `serve --log-steps`).
struct StepTrace {
  struct Chunk {
    uint64_t request_id = 0;
    Priority priority = Priority::Normal;
    int32_t n_tokens = 0;
    bool prefill = false;  // a prompt chunk (else a decode token, with any drafts)
  };
  uint64_t newest_request_id = 0;  // every request submitted up to this id was visible to the step
  std::vector<Chunk> chunks;
  uint64_t step = 0;        // passes run so far, this one included
  double forward_ms = 0.0;  // the model's forward pass alone (not sampling or output)
};

struct EngineOptions {
  int32_t n_threads = 1;
  int32_t n_ctx = 4096;           // longest sequence (prompt + generation)
  int32_t n_parallel = 4;         // sequences stepped together at most
  int32_t n_batch = 512;          // tokens per forward pass at most (decode + prompt chunks)
  int32_t max_queue = 64;         // waiting requests beyond the running ones
  int64_t kv_bytes = 0;           // KV pool size; 0 = enough for n_parallel x n_ctx
  int32_t batch_wait_ms = 20;     // how long HighThroughput requests may wait for company
  Precision precision = Precision::Native;
  KvTypes kv_types;               // cache types of keys and values (default f16, as llama.cpp)
  bool prefix_cache = true;
  int32_t mtp = 0;                // MTP drafts per step at most (0: off; needs MTP blocks)
  bool mtp_adaptive = true;       // choose K per step from acceptance and measured cost
  // One forward pass over a short dummy prompt in make_engine(), so that the first real
  // request does not pay for faulting in the weights and growing the work buffers.
  bool warm_up = false;
  // Called on the scheduler thread after every forward pass that completed (keep it short).
  std::function<void(const StepTrace&)> on_step;
  // Called on the scheduler thread once each time it runs out of work, before it sleeps (the
  // server hands memory freed by the finished requests back to the system here).
  std::function<void()> on_idle;
};

struct EngineStats {
  uint64_t requests_submitted = 0;
  uint64_t requests_finished[6] = {};  // by FinishReason
  int32_t queue_depth = 0;
  int32_t running = 0;
  uint64_t prompt_tokens = 0;          // prompt tokens computed (not counting cache hits)
  uint64_t prompt_tokens_cached = 0;   // prompt tokens served from the prefix cache
  uint64_t generated_tokens = 0;
  uint64_t steps = 0;                  // forward passes
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;          // held by running sequences
  int64_t kv_blocks_cached = 0;        // idle, kept for prefix reuse (evictable)
  uint64_t kv_bytes_used = 0;          // bytes of the blocks held by running sequences
  uint64_t prefix_lookups = 0;         // requests that looked up the cache
  uint64_t prefix_hits = 0;            // ... and reused at least one block
  // MoE health, over a sliding window of recent steps:
  double router_entropy = 0;           // mean entropy (nats) of the normalised weights of selected experts
  double expert_skew = 0;              // max / mean activation count per layer, averaged over layers
  double mean_distinct_experts = 0;    // distinct experts per MoE layer per step
  uint64_t adaptive_tokens = 0;        // tokens routed with the adaptive policy
  double adaptive_mean_k = 0;          // their mean number of experts
  // MTP speculation (requests that finished):
  uint64_t mtp_steps = 0;              // verification steps with drafts
  uint64_t mtp_drafted[kMaxDrafts + 1] = {};   // by draft position 1..kMaxDrafts
  uint64_t mtp_accepted[kMaxDrafts + 1] = {};
  uint64_t mtp_tokens = 0;             // tokens those steps produced
  int64_t kv_pool_bytes = 0;           // address space reserved for the KV pool (bytes of its cache types)
  int64_t kv_resident_bytes = 0;       // of it (and of the MTP caches) in memory: committed on first write
};

// Expert activations per MoE layer since the engine started, for the server's dashboard
// (a client differences two readings for the load over an interval).
struct ExpertLoad {
  int32_t n_expert = 0;
  int32_t n_moe_layers = 0;
  uint64_t passes = 0;             // forward passes that ran MoE layers
  std::vector<uint64_t> counts;    // [MoE layer][expert] token routings, n_moe_layers x n_expert
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Queues a request; events go to `sink`. Returns the request id. Throws QueueFullError
  // or RequestError; never blocks on a forward pass.
  virtual uint64_t submit(GenerateRequest request, EventSink sink) = 0;
  // Stops a request (no-op if it already ended). Its sink gets a final Cancelled event.
  virtual void cancel(uint64_t id) = 0;
  virtual EngineStats stats() const = 0;
  // Cumulative expert activations (empty for an engine that does not track them).
  virtual ExpertLoad expert_load() const { return {}; }
  // Stops accepting, cancels everything queued or running (each sink gets its final
  // event), and joins the scheduler thread. Idempotent.
  virtual void shutdown() = 0;
  virtual const Model& model() const = 0;
  virtual const EngineOptions& options() const = 0;
  // Runs `change` on the scheduler thread between two forward passes at a moment when no
  // request is running: from this call on, queued requests wait; the running ones finish
  // (with the weights they started with); then `change` runs, the prefix cache is emptied
  // (its blocks were computed before the change) and the queued requests start. So every
  // request runs entirely before or entirely after the change (model weight swaps,
  // POST /v1/step35/hotswap). Blocks until `change` has run and rethrows what it threw;
  // throws std::runtime_error when the engine shuts down first.
  virtual void run_exclusive(std::function<void()> change) = 0;
};

// The continuous-batching engine over a loaded model.
std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options);

// KV memory for `options` (its n_ctx, n_batch, mtp, kv_types): what one sequence needs and the
// largest pool the engine can index (2^31 - 1 blocks of a kind), in bytes. For checking
// EngineOptions::kv_bytes before make_engine.
struct KvBudget {
  int64_t per_sequence_bytes = 0;
  int64_t max_pool_bytes = 0;
};
KvBudget kv_budget(const Model& model, const EngineOptions& options);

}  // namespace step35
