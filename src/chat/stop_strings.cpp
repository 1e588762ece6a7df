#include "chat/stop_strings.h"

#include <algorithm>

namespace step35 {

size_t partial_marker_suffix(std::string_view text, const std::vector<std::string>& markers) {
  size_t best = 0;
  for (const std::string& m : markers) {
    if (m.empty()) continue;
    // Proper prefixes only: a full occurrence is the caller's find_first_marker's job.
    const size_t longest = std::min(text.size(), m.size() - 1);
    for (size_t len = longest; len > best; --len) {
      if (text.compare(text.size() - len, len, m, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

MarkerMatch find_first_marker(std::string_view text, const std::vector<std::string>& markers, size_t from) {
  MarkerMatch best;
  for (size_t i = 0; i < markers.size(); ++i) {
    if (markers[i].empty()) continue;
    const size_t pos = text.find(markers[i], from);
    if (pos == std::string_view::npos) continue;
    if (best.pos == std::string_view::npos || pos < best.pos ||
        (pos == best.pos && markers[i].size() > markers[best.marker].size())) {
      best.pos = pos;
      best.marker = i;
    }
  }
  return best;
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings) {
  for (std::string& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  const MarkerMatch m = find_first_marker(held_, stops_);
  std::string out;
  if (m.pos != std::string_view::npos) {
    stopped_ = true;
    matched_ = stops_[m.marker];
    out = held_.substr(0, m.pos);
    held_.clear();
    return out;
  }
  const size_t keep = partial_marker_suffix(held_, stops_);
  out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::finish() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace step35
