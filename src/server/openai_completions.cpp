// POST /v1/completions: a prompt string (or token ids) continued as is, no chat template.
#include <chrono>

#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/generation.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/sse.h"

namespace step35::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

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

json completion_logprobs(const Tokenizer& tok, const std::vector<GenerateEvent>& events) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
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
    s.only({"include_usage"});
    plan.include_usage = s.boolean("include_usage").value_or(false);
  }
  plan.stops = f.strings_or_string("stop", 4);
}

CompletionsPlan plan_completions(ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
          "stop", "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "repeat_last_n", "logprobs",
          "echo", "user", "ignore_eos"});
  if (!f.has("prompt")) throw ApiError(400, "'prompt' is required", "prompt");
  CompletionsPlan plan;
  GenerateRequest& r = plan.request;
  r.prompt = prompt_tokens(ctx, f.raw("prompt"));
  r.sampling = sampling_from(f);
  const int64_t ctx_max = ctx.engine->options().n_ctx;
  r.max_tokens = int32_t(f.integer("max_tokens", 0, ctx_max).value_or(16));
  read_response_fields(ctx, f, plan);
  const int32_t n_logprobs = int32_t(f.integer("logprobs", 0, 20).value_or(-1));
  r.want_logprobs = n_logprobs >= 0;
  r.n_top_logprobs = std::max(n_logprobs, 0);
  plan.echo = f.boolean("echo").value_or(false);
  if (plan.echo && plan.stream) throw ApiError(400, "'echo' is not supported with 'stream'", "echo");
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  f.string("user");
  r.timeout_s = ctx.options.timeout_s;
  return plan;
}

void handle_completions(ServerContext& ctx, const json& body, httplib::Response& res) {
  CompletionsPlan plan = plan_completions(ctx, body);
  GenerateRequest& r = plan.request;
  const int n = plan.n;
  const bool stream = plan.stream, include_usage = plan.include_usage, echo = plan.echo;
  const auto& stops = plan.stops;
  const std::string& model = plan.model;
  const Tokenizer& tok = ctx.tokenizer();
  const std::string echo_text = echo ? tok.decode(r.prompt, false) : "";
  if (r.max_tokens == 0) {
    // Nothing to generate: answer with the prompt's usage (and its echo).
    json choices = json::array();
    for (int i = 0; i < n; ++i)
      choices.push_back({{"index", i}, {"text", echo_text}, {"logprobs", nullptr}, {"finish_reason", "length"}});
    set_json(res, {{"id", random_id("cmpl-")}, {"object", "text_completion"}, {"created", unix_time()},
                   {"model", model}, {"choices", choices},
                   {"usage", {{"prompt_tokens", r.prompt.size()}, {"completion_tokens", 0},
                              {"total_tokens", r.prompt.size()}}}});
    return;
  }
  auto run = std::make_shared<GenerationRun>(*ctx.engine, replicate(r, n));
  auto texts = std::make_shared<std::vector<ChoiceText>>();
  for (int i = 0; i < n; ++i) texts->emplace_back(tok, stops);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(ctx.options.timeout_s + 5));
  const std::string id = random_id("cmpl-");
  const int64_t created = unix_time();
  auto usage = [](int32_t p, int32_t cached, int64_t c) {
    return json{{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  };

  if (!stream) {
    std::vector<std::vector<GenerateEvent>> events(static_cast<size_t>(n));
    std::vector<GenerateEvent> finals(static_cast<size_t>(n));
    const bool ok = drive(
        *run, *texts, deadline,
        [&](int i, const GenerateEvent& ev, const TextDelta&) {
          if (r.want_logprobs && !tok.is_eog(ev.token)) events[size_t(i)].push_back(ev);
          return true;
        },
        [&](int i, const GenerateEvent& ev, const TextDelta&) {
          finals[size_t(i)] = ev;
          ctx.metrics.observe_generation(ev);
          return true;
        });
    if (!ok) throw ApiError(408, "the request timed out");
    json choices = json::array();
    int32_t n_prompt = 0, n_cached = 0;
    int64_t n_completion = 0;
    for (int i = 0; i < n; ++i) {
      const GenerateEvent& ev = finals[size_t(i)];
      if (ev.reason == FinishReason::Timeout) throw ApiError(408, "the request timed out");
      if (ev.reason == FinishReason::Error) throw ApiError(500, "generation failed: " + ev.error);
      const ChoiceText& t = (*texts)[size_t(i)];
      choices.push_back({{"index", i},
                         {"text", echo_text + t.content()},
                         {"logprobs", r.want_logprobs ? completion_logprobs(tok, events[size_t(i)]) : json(nullptr)},
                         {"finish_reason", openai_finish_reason(ev, t.stopped())}});
      n_prompt = ev.n_prompt;
      n_cached = std::max(n_cached, ev.n_cached);
      n_completion += ev.n_generated;
    }
    set_json(res, {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                   {"choices", choices}, {"usage", usage(n_prompt, n_cached, n_completion)}});
    return;
  }

  auto first = std::make_shared<ChoiceEvent>();
  if (!run->next(*first, deadline)) throw ApiError(408, "the request timed out");
  if (first->event.done && first->event.reason == FinishReason::Timeout) throw ApiError(408, "the request timed out");
  if (first->event.done && first->event.reason == FinishReason::Error)
    throw ApiError(500, "generation failed: " + first->event.error);
  const bool want_logprobs = r.want_logprobs;
  set_event_stream(ctx, res, [&ctx, run, texts, first, deadline, id, created, model, include_usage, want_logprobs,
                         usage](httplib::DataSink& sink) {
    const Tokenizer& tok = ctx.tokenizer();
    auto chunk = [&](int i, const std::string& text, json logprobs, json finish) {
      json c = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                {"choices", json::array({{{"index", i}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish}}})}};
      if (include_usage) c["usage"] = nullptr;
      return c;
    };
    int32_t n_prompt = 0, n_cached = 0;
    int64_t n_completion = 0;
    auto on_token = [&](int i, const GenerateEvent& ev, const TextDelta& d) {
      const bool lp = want_logprobs && !tok.is_eog(ev.token);
      if (d.content.empty() && !lp) return true;
      return sse_write(sink, sse_data(chunk(i, d.content, lp ? completion_logprobs(tok, {ev}) : json(nullptr), nullptr)));
    };
    auto on_done = [&](int i, const GenerateEvent& ev, const TextDelta& d) {
      ctx.metrics.observe_generation(ev);
      n_prompt = ev.n_prompt;
      n_cached = std::max(n_cached, ev.n_cached);
      n_completion += ev.n_generated;
      return sse_write(sink, sse_data(chunk(i, d.content, nullptr, openai_finish_reason(ev, (*texts)[size_t(i)].stopped()))));
    };
    bool ok;
    ChoiceText& t = (*texts)[size_t(first->index)];
    if (!first->event.done) {
      const TextDelta d = t.push(first->event.token);
      ok = on_token(first->index, first->event, d);
      if (d.stop_matched) run->stop(first->index);
    } else {
      run->mark_done(first->index);
      ok = on_done(first->index, first->event, t.finish());
    }
    if (ok) ok = drive(*run, *texts, deadline, on_token, on_done);
    if (!ok) {
      run->cancel_all();
      sink.done();
      return;
    }
    if (include_usage) {
      json u = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                {"choices", json::array()}, {"usage", usage(n_prompt, n_cached, n_completion)}};
      sse_write(sink, sse_data(u));
    }
    sse_write(sink, sse_done());
    sink.done();
  });
}

}  // namespace step35::server
