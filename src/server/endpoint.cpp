// The common path of every HTTP endpoint (server/endpoint.h): authentication, CORS,
// readiness, the mapping of errors to statuses, metrics and the access log; reading POST
// bodies; and the helpers handlers answer with (JSON, SSE, ids, clocks).
#include "server/endpoint.h"

#include <chrono>
#include <random>

#include "server/api_error.h"
#include "server/client_connection.h"
#include "server/request_validation.h"

namespace step35::server {

using nlohmann::json;

void set_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void set_event_stream(ServerContext& ctx, HttpExchange& ex, std::function<void(httplib::DataSink&)> produce) {
  httplib::Response& res = ex.res;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // A stream still being written counts as in flight (graceful shutdown waits for it), and
  // its access line is written when it ends.
  ++ctx.in_flight;
  ex.trace->streaming = true;
  ex.trace->status = 200;
  auto produce_ptr = std::make_shared<std::function<void(httplib::DataSink&)>>(std::move(produce));
  std::shared_ptr<RequestTrace> trace = ex.trace;
  res.set_chunked_content_provider(
      "text/event-stream",
      [produce_ptr](size_t, httplib::DataSink& sink) {
        (*produce_ptr)(sink);
        return true;
      },
      [&ctx, produce_ptr, trace](bool) {
        produce_ptr->operator=(nullptr);  // drops the generation run (cancelling what is left)
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - trace->start).count();
        ctx.log.access(trace->method, trace->path, trace->status, trace->prompt_tokens, trace->completion_tokens, ms);
        --ctx.in_flight;
      });
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof kChars - 1)];
  return id;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::chrono::steady_clock::time_point generation_deadline(const ServerContext& ctx) {
  using Clock = std::chrono::steady_clock;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ctx.options.timeout_s + 5));
}

namespace {

// Compares without an early exit, so the time taken does not reveal the key's prefix.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

bool authorised(const ServerContext& ctx, const httplib::Request& req) {
  if (ctx.options.api_keys.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  static const std::string kBearer = "Bearer ";
  const std::string given = auth.compare(0, kBearer.size(), kBearer) == 0 ? auth.substr(kBearer.size())
                            : req.has_header("x-api-key")                  ? req.get_header_value("x-api-key")
                                                                           : std::string();
  if (given.empty()) return false;
  bool ok = false;
  for (const std::string& key : ctx.options.api_keys) ok |= same_secret(given, key);  // every key, no early exit
  return ok;
}

}  // namespace

// CORS: a request from an allowed origin gets the headers that let a browser read the
// answer. `--cors '*'` allows any origin.
void add_cors(const ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  if (ctx.options.cors_origins.empty() || !req.has_header("Origin")) return;
  const std::string origin = req.get_header_value("Origin");
  for (const std::string& allowed : ctx.options.cors_origins) {
    if (allowed == "*" || allowed == origin) {
      res.set_header("Access-Control-Allow-Origin", allowed == "*" ? "*" : origin);
      res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate");
      return;
    }
  }
}

namespace {

// OpenAI's error shape, or Anthropic's ({"type":"error","error":{"type","message"}}) on
// the Anthropic endpoints.
void send_error(httplib::Response& res, const ApiError& e, bool anthropic) {
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
  if (anthropic) {
    const std::string type = e.status() == 503 ? "overloaded_error" : e.status() >= 500 ? "api_error" : e.type();
    set_json(res, {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}}, e.status());
  } else {
    set_json(res, e.body(), e.status());
  }
}

// Every endpoint goes through here: CORS, authentication, readiness, error mapping,
// metrics and the access log.
void run_endpoint(ServerContext& ctx, const EndpointSpec& spec, const httplib::Request& req, httplib::Response& res,
                  const std::string& body_text, bool body_ok, const Body& body) {
  ++ctx.in_flight;
  const bool anthropic = spec.name.rfind("/v1/messages", 0) == 0;
  auto trace = std::make_shared<RequestTrace>();
  trace->method = req.method;
  trace->path = req.path;
  HttpExchange ex{req, res, trace};
  add_cors(ctx, req, res);
  try {
    if (!body_ok) {
      if (res.status == 413)
        throw ApiError(413, "the request body is larger than the server's limit of " +
                                std::to_string(ctx.options.max_body_bytes) + " bytes (--max-body)");
      throw ApiError(400, "the request body could not be read");
    }
    if (spec.needs_auth && !authorised(ctx, req))
      throw ApiError(401, "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)");
    if (spec.needs_model && !ctx.ready) {
      ApiError e(503, "the model is loading");
      e.retry_after_s = 5;
      throw e;
    }
    if (spec.needs_model && ctx.draining) {
      ApiError e(503, "the server is shutting down");
      e.retry_after_s = 5;
      throw e;
    }
    body(ex, body_text);
  } catch (const ClientGone&) {
    res.status = 499;  // nobody reads it (nginx's "client closed request", for the log)
  } catch (const ApiError& e) {
    send_error(res, e, anthropic);
  } catch (const QueueFullError& e) {
    ApiError a(503, e.what());
    a.retry_after_s = 1;
    send_error(res, a, anthropic);
  } catch (const RequestError& e) {
    send_error(res, ApiError(400, e.what()), anthropic);
  } catch (const nlohmann::json::type_error& e) {
    // Handlers read typed members of the client's JSON; one of the wrong type that a
    // handler did not check itself is still the client's error, not the server's.
    send_error(res, ApiError(400, std::string("a field of the request has the wrong type: ") + e.what()), anthropic);
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, std::string("internal error: ") + e.what()), anthropic);
  }
  ctx.metrics.count_request(spec.name, res.status);
  if (!trace->streaming || res.status != 200) {
    trace->streaming = false;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - trace->start).count();
    ctx.log.access(req.method, req.path, res.status, trace->prompt_tokens, trace->completion_tokens, ms);
  }
  --ctx.in_flight;
}


}  // namespace

httplib::Server::Handler get_endpoint(ServerContext& ctx, EndpointSpec spec, Body body) {
  return [&ctx, spec = std::move(spec), body = std::move(body)](const httplib::Request& req, httplib::Response& res) {
    run_endpoint(ctx, spec, req, res, "", true, body);
  };
}

// POST bodies are read here, through httplib's content reader: httplib's own reading
// answers an application/x-www-form-urlencoded body (what `curl -d` sends) over 8 KiB with
// 413 whatever --max-body says (a limit compiled into the library). Read here the limit is
// --max-body for every content type, chunked bodies included.
httplib::Server::HandlerWithContentReader post_endpoint(ServerContext& ctx, EndpointSpec spec, Body body) {
  return [&ctx, spec = std::move(spec), body = std::move(body)](const httplib::Request& req, httplib::Response& res,
                                                               const httplib::ContentReader& reader) {
    std::string text;
    bool too_large = false;
    bool ok = reader([&](const char* data, size_t n) {
      if (text.size() + n > ctx.options.max_body_bytes) {
        too_large = true;
        return false;
      }
      text.append(data, n);
      return true;
    });
    if (too_large) res.status = 413;
    if (!ok && res.status == 413) res.set_header("Connection", "close");  // the rest of the body is unread
    run_endpoint(ctx, spec, req, res, text, ok, body);
  };
}

// The parsed body, and the same body in the client's key order as HttpExchange::ordered_body
// (what the template renders, so tool definitions and arguments keep that order).
httplib::Server::HandlerWithContentReader chat_endpoint(ServerContext& ctx, EndpointSpec spec, ChatBody handler) {
  return post_endpoint(ctx, std::move(spec), [handler = std::move(handler)](HttpExchange& ex, const std::string& body) {
    const json parsed = parse_body(body);
    const nlohmann::ordered_json ordered = parse_body_ordered(body);
    ex.ordered_body = &ordered;
    handler(ex, parsed);
  });
}

}  // namespace step35::server
