// libFuzzer target: arbitrary template source (and variables) through src/jinja's parser
// and interpreter. Built by CMake with -DSTEP35_FUZZ=ON (see fuzz/run.sh); the contract is
// fuzz/jinja_contract.h. Seeds: fuzz/corpus/jinja/ (the conformance suite's published chat
// templates and a few language snippets).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "jinja_contract.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string broken;
  try {
    broken = step35::fuzzing::check_jinja_template(data, size);
  } catch (const std::exception& e) {
    broken = std::string("an exception other than jinja::Error: ") + e.what();
  }
  if (!broken.empty()) {
    std::fprintf(stderr, "fuzz_jinja: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
