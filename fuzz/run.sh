#!/usr/bin/env bash
# Builds (if needed) and runs every libFuzzer target for SECONDS each, one per core at a
# time (STEP35_FUZZ_JOBS sets how many), then prints one line per target: executions,
# corpus size, and whether it found anything.
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

# One target per core at a time (libFuzzer runs one thread); the lines come out in order.
jobs=${STEP35_FUZZ_JOBS:-$(nproc)}
results=$build/logs/results
mkdir -p "$results"
rm -f "$results"/*

run_target() {  # BIN: runs it, writes its line and its exit status to $results/NAME.{line,rc}
  local bin=$1 name short seeds work artifacts log rc=0 execs rate corpus result=ok
  name=$(basename "$bin")
  short=${name#fuzz_}
  seeds=fuzz/corpus/$short
  work=$build/corpus/$short
  artifacts=$build/artifacts/$short/
  log=$build/logs/$short.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  [ -d "$seeds" ] || seeds=
  # A dictionary of the tokens worth inserting (fuzz/corpus/<target>.dict), where there is one.
  dict=()
  [ -f "fuzz/corpus/$short.dict" ] && dict=(-dict="fuzz/corpus/$short.dict")
  ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" -max_total_time="$seconds" -max_len="$(max_len_for "$name")" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$artifacts" -print_final_stats=1 "${dict[@]}" "$work" $seeds >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  corpus=$(find "$work" -type f | wc -l)
  [ "$rc" -eq 0 ] || result="FAILED (rc $rc, see $log; inputs in $artifacts)"
  printf '%-22s %10s %8s %10s  %s\n' "$name" "${execs:-?}" "${rate:-?}" "$corpus" "$result" >"$results/$name.line"
  echo "$rc" >"$results/$name.rc"
}

names=()
for bin in "$build"/bin/fuzz_*; do
  name=$(basename "$bin")
  [[ "$name" =~ $filter ]] || continue
  names+=("$name")
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_target "$bin" &
done
wait

status=0
printf '%-22s %10s %8s %10s  %s\n' target execs exec/s corpus result
for name in "${names[@]}"; do
  if [ -f "$results/$name.line" ]; then
    cat "$results/$name.line"
    [ "$(cat "$results/$name.rc")" -eq 0 ] || status=1
  else
    echo "$name: no result (the runner itself failed)"
    status=1
  fi
done
exit $status
