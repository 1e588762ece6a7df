#!/usr/bin/env bash
# Installs step35's build and test dependencies from Debian 12's packages.
set -euo pipefail
pkgs=(cmake g++ make git python3 libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
      libcpp-httplib-dev
      # stb_image: the picture decoder of the vision tower (the one llama.cpp uses)
      libstb-dev
      # lld: a faster linker for the test executables (CMake uses it where installed)
      lld
      # the reference renderer the Jinja conformance tests compare with, live
      python3-jinja2
      # fuzzing (-DSTEP35_FUZZ=ON: clang's libFuzzer + sanitizer runtimes) and curl for bench/soak.sh
      clang libclang-rt-14-dev llvm curl
      # optional: expert parallelism (--ep) and its tests
      openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -ne 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The server's client tests use the official openai and @anthropic-ai/sdk npm packages
# (pinned in tests/node/package-lock.json); without node/npm those tests are skipped.
if command -v npm >/dev/null 2>&1; then
  (cd "$(dirname "$0")/../tests/node" && npm ci --no-audit --no-fund --silent)
else
  echo "npm not found: tests/node (openai and anthropic client tests) will be skipped" >&2
fi
