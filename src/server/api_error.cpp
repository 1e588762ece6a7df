#include "server/api_error.h"

namespace step35::server {

std::string ApiError::type() const {
  if (!type_.empty()) return type_;
  switch (status_) {
    case 400: case 413: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 503: return "overloaded_error";
    default: return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::json ApiError::body() const {
  nlohmann::json err = {{"message", what()}, {"type", type()}, {"code", status_}};
  err["param"] = param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_);
  return {{"error", err}};
}

}  // namespace step35::server
