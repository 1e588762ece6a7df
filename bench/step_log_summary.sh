#!/usr/bin/env bash
# Where a serving run's time went, from the log of `step35 serve --log-steps`: forward
# passes grouped by what they carried (decode-only passes by how many sequences decoded,
# passes with prompt chunks by their prompt tokens), with count, total and mean forward ms.
#
# usage: bench/step_log_summary.sh SERVE.log
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,6p' "$0"; exit 2; }
awk '
  /step35 serve: step [0-9]+:/ {
    for (i = 1; i <= NF; ++i) {
      if ($i == "decode") seqs = $(i + 4)
      if ($i == "prompt") prompt = $(i + 1)
      if ($i == "forward") ms = $(i + 1)
    }
    if (prompt > 0) { b = int((prompt + 31) / 32) * 32; key = sprintf("prompt %4d-%4d tokens (+ decodes)", b - 31, b) }
    else key = sprintf("decode only, %3d sequences", seqs)
    n[key]++; t[key] += ms; total += ms; steps++
  }
  END {
    if (steps == 0) { print "no --log-steps lines found" > "/dev/stderr"; exit 1 }
    printf "| passes | what they carried | forward ms total | mean | share |\n| ---: | --- | ---: | ---: | ---: |\n"
    for (k in n) printf "| %d | %s | %.0f | %.2f | %.1f %% |\n", n[k], k, t[k], t[k] / n[k], 100 * t[k] / total | "sort -t\\| -k3"
    close("sort -t\\| -k3")
    printf "| %d | all | %.0f | %.2f | 100 %% |\n", steps, total, total / steps
  }' "$1"
