#!/usr/bin/env bash
# Runs a test command at one kernel level (src/tensor/kernels.h: Isa): asks step35 whether
# this CPU can run LEVEL, then runs COMMAND with STEP35_ISA=LEVEL. A level the CPU lacks is
# a skip (exit 77, ctest's SKIP_RETURN_CODE) that says which features are missing.
# Usage: tests/scripts/at_isa_level.sh LEVEL STEP35_BINARY COMMAND [ARGS...]
set -euo pipefail
level="$1" step35="$2"
shift 2
if ! why="$(STEP35_ISA="$level" "$step35" --version 2>&1)"; then
  echo "skipped at $level: $why"
  exit 77
fi
echo "at kernel level $level: $(grep 'kernels on this CPU' <<<"$why")"
export STEP35_ISA="$level"
exec "$@"
