// Engine interface helpers (the continuous-batching engine itself: scheduler.cpp).
#include "engine/engine.h"

namespace step35 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Context: return "context";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "?";
}

}  // namespace step35
