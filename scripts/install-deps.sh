#!/usr/bin/env bash
# Installs step35's build and test dependencies from Debian 12's packages.
set -euo pipefail
pkgs=(cmake g++ make git python3 libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
      libcpp-httplib-dev
      # optional: expert parallelism (--ep) and its tests
      openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
