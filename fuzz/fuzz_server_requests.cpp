// libFuzzer entry point: request bodies for every model endpoint of `step35 serve` through
// the handlers' validation and planning code; the input format and the contract are in
// fuzz/server_request_contract.h (tests/test_regressions.cpp replays the seeds and past
// findings through the same contract).
#include <cstdio>
#include <cstdlib>

#include "server_request_contract.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  step35::server::ServerContext& ctx = step35::fuzzing::request_context(STEP35_FIXTURES_DIR);
  const std::string broken = step35::fuzzing::check_server_request(ctx, data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "contract broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
