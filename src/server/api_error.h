// An error answered to an HTTP client: status code plus OpenAI's error object
// ({"error":{"message","type","param","code"}}).
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace step35::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "")
      : std::runtime_error(message), status_(status), param_(std::move(param)), type_(std::move(type)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  // OpenAI's error type for the status when none was given.
  std::string type() const;
  nlohmann::json body() const;
  // Seconds for a Retry-After header (503 only; 0 = none).
  int retry_after_s = 0;

 private:
  int status_;
  std::string param_, type_;
};

}  // namespace step35::server
