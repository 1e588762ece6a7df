#!/bin/sh
# Peak resident memory of every rank of an expert-parallel run: starts
# `mpirun -np R step35 ARGS... --ep` and samples /proc/PID/status of the step35 processes
# until they exit. Prints one line per rank process: pid, peak VmRSS and peak RssFile
# (the mapped GGUF pages it touched), in MiB.
# usage: bench/ep_memory.sh R STEP35 ARGS...
set -eu
R=$1
bin=$2
shift 2
out=$(mktemp)
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --oversubscribe -np "$R" --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none \
  "$bin" "$@" --ep > /dev/null 2>"$out.err" &
mpid=$!
while kill -0 "$mpid" 2>/dev/null; do
  for p in $(pgrep -P "$mpid" 2>/dev/null); do
    awk -v p="$p" '/^VmRSS:/ {r=$2} /^RssFile:/ {f=$2} END {if (r) print p, r, f}' "/proc/$p/status" 2>/dev/null >> "$out" || true
  done
  sleep 0.2
done
wait "$mpid" || { cat "$out.err" >&2; exit 1; }
awk '{ if ($2 > r[$1]) r[$1] = $2; if ($3 > f[$1]) f[$1] = $3 }
     END { for (p in r) printf "pid %s: peak VmRSS %.1f MiB, RssFile %.1f MiB\n", p, r[p] / 1024, f[p] / 1024 }' "$out" | sort
rm -f "$out" "$out.err"
