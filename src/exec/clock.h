// Seconds on the monotonic clock, the time base of the engine's and tools' durations and
// rates (its zero is arbitrary: only differences mean anything).
#pragma once

#include <chrono>

namespace step35 {

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace step35
