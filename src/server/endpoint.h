// What every endpoint goes through and answers with. Routes are made with get_endpoint /
// post_endpoint / chat_endpoint, which run the common path (CORS, the API key, readiness,
// errors mapped to statuses in the API's own shape, metrics, the access log) around the
// handler; handlers answer with set_json or set_event_stream. server.cpp wires the routes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/server_context.h"

namespace step35::server {

// A handler: the exchange and the request body as sent ("" for GET).
using Body = std::function<void(HttpExchange&, const std::string& body)>;
// A handler of a chat-template endpoint: the parsed body (the same in the client's key
// order is HttpExchange::ordered_body, what the template renders).
using ChatBody = std::function<void(HttpExchange&, const nlohmann::json& body)>;
struct EndpointSpec {
  std::string name;       // for metrics
  bool needs_model = true;
  bool needs_auth = true;
};
// Routes through the common path. POST bodies are read up to --max-body whatever their
// content type (413 past it); chat_endpoint parses the body, refusing JSON nested past the
// limit (request_validation.h) before anything else reads it.
httplib::Server::Handler get_endpoint(ServerContext& ctx, EndpointSpec spec, Body body);
httplib::Server::HandlerWithContentReader post_endpoint(ServerContext& ctx, EndpointSpec spec, Body body);
httplib::Server::HandlerWithContentReader chat_endpoint(ServerContext& ctx, EndpointSpec spec, ChatBody handler);
// The CORS headers of an allowed origin (--cors), on any answer.
void add_cors(const ServerContext& ctx, const httplib::Request& req, httplib::Response& res);

void set_json(httplib::Response& res, const nlohmann::json& body, int status = 200);
// Starts an SSE response whose body `produce` writes; the exchange's access log line is
// written when it ends.
void set_event_stream(ServerContext& ctx, HttpExchange& ex, std::function<void(httplib::DataSink&)> produce);
std::string random_id(const char* prefix);
int64_t unix_time();
// How long a handler waits for its generation: the request timeout plus a margin (the
// engine times the request out first and says so).
std::chrono::steady_clock::time_point generation_deadline(const ServerContext& ctx);

}  // namespace step35::server
