// Stop strings for streamed text: text that could still turn into a stop string is held
// back until it is certain, so a client never sees the start of a stop string that then
// completes. Also the partial-marker test the output parser uses for its tags.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace step35 {

// Length of the longest suffix of `text` that is a proper prefix of one of `markers`
// (0 when none): the bytes that must be held back because more text could complete a
// marker. Empty markers are ignored.
size_t partial_marker_suffix(std::string_view text, const std::vector<std::string>& markers);

// Earliest full occurrence of any of `markers` in `text` at or after `from`: the position
// and the index of the marker (ties at one position go to the longest marker). pos ==
// npos when none occurs.
struct MarkerMatch {
  size_t pos = std::string_view::npos;
  size_t marker = 0;
};
MarkerMatch find_first_marker(std::string_view text, const std::vector<std::string>& markers,
                              size_t from = 0);

// Streaming stop-string matcher (OpenAI `stop`, Anthropic `stop_sequences`). Feed the
// generated text in arbitrary chunks; each push returns the text that is now certain not
// to be part of a stop string. Once a stop string has matched, `stopped()` is true, the
// text before it has been returned, and the stop string and anything after it are never
// returned. finish() releases the held-back tail at the end of generation.
class StopStringMatcher {
 public:
  // Empty strings are ignored (they would match everywhere).
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  std::string push(std::string_view text);
  std::string finish();

  bool stopped() const { return stopped_; }
  // The stop string that matched ("" while none has).
  const std::string& matched() const { return matched_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace step35
