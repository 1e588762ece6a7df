// Pictures given by http(s) URL (`serve --allow-image-urls`). Off by default: fetching lets
// any client make the server open connections to whatever it can reach (other hosts of a
// private network included), so an operator turns it on knowingly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace step35::server {

struct ImageFetchOptions {
  bool allow = false;                 // --allow-image-urls
  double timeout_s = 10;              // the whole fetch, redirects included
  size_t max_bytes = size_t(20) << 20;  // the picture file at most
  int max_redirects = 3;
};

// Whether a URL names a picture to fetch (http: or https:), as opposed to a data: URL.
bool is_fetched_url(const std::string& url);

// The bytes behind an http(s) URL, within the options' time and size (redirects followed up
// to max_redirects, each re-checked for its scheme). ApiError 400 with `param` for a fetch
// that is not allowed, fails, answers other than 200, or goes past a limit.
std::vector<uint8_t> fetch_picture_bytes(const std::string& url, const ImageFetchOptions& options,
                                         const std::string& param);

}  // namespace step35::server
