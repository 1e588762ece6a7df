#include "server/image_fetch.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <httplib.h>

#include "server/api_error.h"

namespace step35::server {

namespace {

using Clock = std::chrono::steady_clock;

// "scheme://authority" and the path (with query) of an absolute http(s) URL; false for any
// other string.
bool split_url(const std::string& url, std::string& origin, std::string& path) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return false;
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") return false;
  const size_t path_at = url.find_first_of("/?#", scheme_end + 3);
  origin = url.substr(0, path_at);
  if (origin.size() == scheme_end + 3) return false;  // no host
  path = path_at == std::string::npos ? "/" : url.substr(path_at);
  if (path[0] != '/') path = "/" + path;
  if (const size_t hash = path.find('#'); hash != std::string::npos) path.resize(hash);
  return true;
}

// Where a redirect's Location leads: absolute as given, else on the same origin.
std::string redirect_target(const std::string& origin, const std::string& location) {
  if (location.find("://") != std::string::npos) return location;
  if (location.rfind("//", 0) == 0) return origin.substr(0, origin.find("://") + 1) + location;
  return origin + (location.empty() || location[0] != '/' ? "/" : "") + location;
}

struct OneGet {
  int status = 0;
  std::string location;
  std::vector<uint8_t> body;
  bool too_big = false, too_slow = false;
  httplib::Error error = httplib::Error::Success;
};

// One GET without following redirects; the body is kept only for a 200.
OneGet get_once(const std::string& origin, const std::string& path, const ImageFetchOptions& o,
                Clock::time_point deadline) {
  OneGet g;
  httplib::Client client(origin);
  // The socket timeouts run a little past the deadline: poll() counts whole milliseconds and can
  // wake just before it, and a read that timed out must be reported as a slow fetch, not a failed one.
  const double left_s = std::max(1e-3, std::chrono::duration<double>(deadline - Clock::now()).count()) + 0.05;
  const auto secs = time_t(left_s), usecs = time_t((left_s - double(secs)) * 1e6);
  client.set_connection_timeout(secs, usecs);
  client.set_read_timeout(secs, usecs);
  client.set_write_timeout(secs, usecs);
  client.set_follow_location(false);
  const auto res = client.Get(
      path,
      [&](const httplib::Response& r) {
        g.status = r.status;
        g.location = r.get_header_value("Location");
        if (r.status != 200) return false;
        const std::string length = r.get_header_value("Content-Length");
        if (!length.empty() && std::strtoull(length.c_str(), nullptr, 10) > o.max_bytes) return !(g.too_big = true);
        return true;
      },
      [&](const char* data, size_t n) {
        if (g.body.size() + n > o.max_bytes) return !(g.too_big = true);
        if (Clock::now() > deadline) return !(g.too_slow = true);
        g.body.insert(g.body.end(), data, data + n);
        return true;
      });
  if (!res && g.status == 0) g.error = res.error();
  return g;
}

}  // namespace

bool is_fetched_url(const std::string& url) { return url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0; }

std::vector<uint8_t> fetch_picture_bytes(const std::string& url, const ImageFetchOptions& o, const std::string& param) {
  auto fail = [&](const std::string& why) -> ApiError { return ApiError(400, "'" + param + "': " + why, param); };
  if (!o.allow)
    throw fail("this server does not fetch pictures from the network (start it with --allow-image-urls), send the "
               "picture as a base64 data: URL (data:image/png;base64,...)");
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_s));
  std::string target = url;
  for (int hop = 0;; ++hop) {
    std::string origin, path;
    if (!split_url(target, origin, path)) throw fail("not an http or https URL: " + target);
    OneGet g = get_once(origin, path, o, deadline);
    if (g.too_big) throw fail("the picture at " + target + " is larger than " + std::to_string(o.max_bytes) + " bytes");
    if (g.too_slow || Clock::now() > deadline)
      throw fail("fetching " + target + " took longer than " + std::to_string(int(o.timeout_s)) + " s");
    if (g.status == 0) throw fail("could not fetch " + target + ": " + httplib::to_string(g.error));
    if (g.status >= 300 && g.status < 400 && !g.location.empty()) {
      if (hop == o.max_redirects) throw fail("more than " + std::to_string(o.max_redirects) + " redirects from " + url);
      target = redirect_target(origin, g.location);
      continue;
    }
    if (g.status != 200) throw fail("fetching " + target + " answered HTTP " + std::to_string(g.status));
    return std::move(g.body);
  }
}

}  // namespace step35::server
