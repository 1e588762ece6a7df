#!/usr/bin/env bash
# Builds (if needed) and runs every libFuzzer target for SECONDS each, then prints one line
# per target: executions, corpus size, and whether it found anything.
#   fuzz/run.sh SECONDS [TARGET_REGEX]
# Build dir: build-fuzz (clang, -DSTEP35_FUZZ=ON). Seeds: fuzz/corpus/<target>/ (read-only);
# new inputs go to build-fuzz/corpus/<target>/; crashes to build-fuzz/artifacts/<target>/.
# Exit status: non-zero when a target crashed (turn the artifact into a regression test in
# tests/test_regressions.cpp) or failed to start.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET_REGEX]}
filter=${2:-.}
build=${STEP35_FUZZ_BUILD:-build-fuzz}

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DSTEP35_FUZZ=ON -DSTEP35_BUILD_TESTS=OFF >/dev/null
fi
nice -n 10 cmake --build "$build" -j2 --target fuzz_all >/dev/null

# Longest accepted input per target (the GGUF seeds are whole micro models).
max_len_for() {
  case "$1" in
    fuzz_gguf) echo 65536 ;;
    fuzz_jinja) echo 32768 ;;  # the gpt-oss chat template alone is 16.7 KB
    *) echo 8192 ;;
  esac
}

status=0
printf '%-22s %10s %8s %10s  %s\n' target execs exec/s corpus result
for bin in "$build"/bin/fuzz_*; do
  name=$(basename "$bin")
  [[ "$name" =~ $filter ]] || continue
  short=${name#fuzz_}
  seeds=fuzz/corpus/$short
  work=$build/corpus/$short
  artifacts=$build/artifacts/$short/
  log=$build/logs/$short.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  [ -d "$seeds" ] || seeds=
  rc=0
  ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" -max_total_time="$seconds" -max_len="$(max_len_for "$name")" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$artifacts" -print_final_stats=1 "$work" $seeds >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  corpus=$(find "$work" -type f | wc -l)
  result=ok
  if [ "$rc" -ne 0 ]; then
    result="FAILED (rc $rc, see $log; inputs in $artifacts)"
    status=1
  fi
  printf '%-22s %10s %8s %10s  %s\n' "$name" "${execs:-?}" "${rate:-?}" "$corpus" "$result"
done
exit $status
