// POST /v1/completions: a prompt string (or token ids) continued as is, no chat template.
#include <algorithm>
#include <numeric>

#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/endpoint.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/sse.h"
#include "server/streaming.h"

namespace step35::server {

using nlohmann::json;

namespace {

std::vector<int32_t> prompt_tokens(const ServerContext& ctx, const json& prompt) {
  const Tokenizer& tok = ctx.tokenizer();
  if (prompt.is_string()) return tok.encode(prompt.get<std::string>(), true, false);
  auto ids = [&](const json& arr) {
    std::vector<int32_t> out;
    for (const json& t : arr) {
      if (!t.is_number_integer()) throw ApiError(400, "'prompt' token ids must be integers", "prompt");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v >= int64_t(tok.n_vocab()))
        throw ApiError(400, "'prompt' token id " + std::to_string(v) + " is outside the vocabulary", "prompt");
      out.push_back(int32_t(v));
    }
    return out;
  };
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    return prompt[0].is_string() ? tok.encode(prompt[0].get<std::string>(), true, false) : ids(prompt[0]);
  }
  if (prompt.is_array() && !prompt.empty() && prompt[0].is_number()) return ids(prompt);
  throw ApiError(400, "'prompt' must be a string, an array of token ids, or a one-element array of either", "prompt");
}

// OpenAI's completions logprobs; text_offset counts from the start of the returned text,
// so an echoed prompt (`offset` bytes) comes first.
json completion_logprobs(const Tokenizer& tok, const std::vector<GenerateEvent>& events, size_t offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const GenerateEvent& ev : events) {
    const std::string piece = tok.token_to_piece(ev.token, false);
    tokens.push_back(piece);
    lps.push_back(ev.logprob);
    json top = json::object();
    for (const TokenLogprob& t : ev.top) top[tok.token_to_piece(t.token, false)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace

void read_response_fields(ServerContext& ctx, Fields& f, ResponsePlan& plan) {
  plan.model = f.string("model").value_or(ctx.options.model_id);
  plan.n = int(f.integer("n", 1, ctx.options.max_n).value_or(1));
  plan.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.object("stream_options")) {
    Fields s(*so, "stream_options.");
    s.only({"include_usage", "include_obfuscation"});
    plan.include_usage = s.boolean("include_usage").value_or(false);
    s.boolean("include_obfuscation");  // accepted and ignored: no obfuscation padding is sent
  }
  plan.stops = f.strings_or_string("stop", 4);
}

CompletionsPlan plan_completions(ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
          "typical_p", "seed", "stop", "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty",
          "repeat_last_n", "logprobs", "logit_bias", "echo", "suffix", "user", "ignore_eos", "min_tokens",
          "cache_prompt", "service_tier", "metadata", "store"});
  if (!f.has("prompt")) throw ApiError(400, "'prompt' is required", "prompt");
  CompletionsPlan plan;
  GenerateRequest& r = plan.request;
  r.prompt = prompt_tokens(ctx, f.raw("prompt"));
  r.sampling = sampling_from(f, ctx.options.sampling, int32_t(ctx.tokenizer().n_vocab()));
  const int64_t ctx_max = ctx.engine->options().n_ctx;
  r.max_tokens = int32_t(f.integer("max_tokens", 0, ctx_max).value_or(16));
  read_response_fields(ctx, f, plan);
  const int32_t n_logprobs = int32_t(f.integer("logprobs", 0, 20).value_or(-1));
  r.want_logprobs = n_logprobs >= 0;
  r.n_top_logprobs = std::max(n_logprobs, 0);
  plan.echo = f.boolean("echo").value_or(false);
  if (plan.echo && plan.stream) throw ApiError(400, "'echo' is not supported with 'stream'", "echo");
  plan.best_of = int(f.integer("best_of", 1, ctx.options.max_n).value_or(plan.n));
  if (plan.best_of < plan.n) throw ApiError(400, "'best_of' must be at least 'n'", "best_of");
  if (plan.best_of > plan.n && plan.stream)
    throw ApiError(400, "'best_of' larger than 'n' cannot be streamed (the best are known only at the end)", "best_of");
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  r.min_tokens = int32_t(f.integer("min_tokens", 0, ctx_max).value_or(0));
  // Accepted and ignored (docs/server.md): Step 3.5 has no fill-in-the-middle format for
  // `suffix`; the others have no meaning here.
  f.string("suffix");
  for (const char* k : {"user", "service_tier"}) f.string(k);
  for (const char* k : {"cache_prompt", "store"}) f.boolean(k);
  f.object("metadata");
  r.timeout_s = ctx.options.timeout_s;
  return plan;
}


namespace {

class CompletionStream final : public EventWriter {
 public:
  CompletionStream(const Tokenizer& tok, const CompletionsPlan& plan, std::string id, int64_t created)
      : tok_(tok), model_(plan.model), include_usage_(plan.include_usage), want_logprobs_(plan.request.want_logprobs),
        id_(std::move(id)), created_(created), offsets_(size_t(plan.n), 0) {}

  bool token(httplib::DataSink& sink, int i, const GenerateEvent& ev, const TextDelta& d) override {
    const bool lp = want_logprobs_ && !tok_.is_eog(ev.token);
    if (d.content.empty() && !lp) return true;
    json logprobs = nullptr;
    if (lp) {
      logprobs = completion_logprobs(tok_, {ev}, offsets_[size_t(i)]);
      offsets_[size_t(i)] += tok_.token_to_piece(ev.token, false).size();
    }
    return sse_write(sink, sse_data(chunk(i, d.content, std::move(logprobs), nullptr)));
  }

  bool done(httplib::DataSink& sink, int i, const GenerateEvent& ev, const TextDelta& d, const ChoiceText& t) override {
    usage_.add(ev);
    return sse_write(sink, sse_data(chunk(i, d.content, nullptr, openai_finish_reason(ev, t))));
  }

  bool end(httplib::DataSink& sink) override {
    if (include_usage_) {
      const json u = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                      {"choices", json::array()}, {"usage", usage_.openai()}};
      sse_write(sink, sse_data(u));
    }
    sse_write(sink, sse_done());
    return true;
  }

 private:
  json chunk(int i, const std::string& text, json logprobs, json finish) const {
    json c = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
              {"choices", json::array({{{"index", i}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish}}})}};
    if (include_usage_) c["usage"] = nullptr;
    return c;
  }

  const Tokenizer& tok_;
  std::string model_;
  bool include_usage_, want_logprobs_;
  std::string id_;
  int64_t created_;
  std::vector<size_t> offsets_;  // text_offset of each choice's next token
  Usage usage_;
};

}  // namespace

void handle_completions(ServerContext& ctx, const json& body, HttpExchange& ex) {
  CompletionsPlan plan = plan_completions(ctx, body);
  GenerateRequest& r = plan.request;
  const Tokenizer& tok = ctx.tokenizer();
  const std::string echo_text = plan.echo ? tok.decode(r.prompt, false) : "";
  if (r.max_tokens == 0) {
    // Nothing to generate: answer with the prompt's usage (and its echo).
    json choices = json::array();
    for (int i = 0; i < plan.n; ++i)
      choices.push_back({{"index", i}, {"text", echo_text}, {"logprobs", nullptr}, {"finish_reason", "length"}});
    set_json(ex.res, {{"id", random_id("cmpl-")}, {"object", "text_completion"}, {"created", unix_time()},
                      {"model", plan.model}, {"choices", choices},
                      {"usage", {{"prompt_tokens", r.prompt.size()}, {"completion_tokens", 0},
                                 {"total_tokens", r.prompt.size()}}}});
    return;
  }
  // best_of ranks the candidates by the log-probability of their tokens.
  const bool show_logprobs = r.want_logprobs;
  const int candidates = plan.best_of;
  if (candidates > plan.n) r.want_logprobs = true;
  std::vector<ChoiceText> texts;
  for (int i = 0; i < candidates; ++i) {
    ChoiceTextOptions o;
    o.stops = plan.stops;
    texts.emplace_back(tok, std::move(o));
  }
  auto gen = std::make_shared<Generation>(ctx, ex, r, candidates, std::move(texts));
  const std::string id = random_id("cmpl-");
  const int64_t created = unix_time();
  // (best_of > n cannot stream: plan_completions refused it.)
  if (plan.stream) return stream(gen, ex, std::make_shared<CompletionStream>(tok, plan, id, created));
  std::vector<std::vector<GenerateEvent>> events(static_cast<size_t>(candidates));
  std::vector<double> score(static_cast<size_t>(candidates), 0.0);
  const std::vector<GenerateEvent> finals = gen->collect(ex, [&](int i, const GenerateEvent& ev, const TextDelta&) {
    if (r.want_logprobs && !tok.is_eog(ev.token)) {
      events[size_t(i)].push_back(ev);
      score[size_t(i)] += ev.logprob;
    }
    return true;
  });
  std::vector<int> order(static_cast<size_t>(candidates));
  std::iota(order.begin(), order.end(), 0);
  if (candidates > plan.n)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
  Usage usage;
  for (const GenerateEvent& ev : finals) usage.add(ev);  // every candidate counts
  json choices = json::array();
  for (int k = 0; k < plan.n; ++k) {
    const int i = order[size_t(k)];
    const ChoiceText& t = gen->text(i);
    choices.push_back({{"index", k},
                       {"text", echo_text + t.content()},
                       {"logprobs", show_logprobs ? completion_logprobs(tok, events[size_t(i)], echo_text.size())
                                                  : json(nullptr)},
                       {"finish_reason", openai_finish_reason(finals[size_t(i)], t)}});
  }
  set_json(ex.res, {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", plan.model},
                    {"choices", choices}, {"usage", usage.openai()}});
}

}  // namespace step35::server
