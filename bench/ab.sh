#!/usr/bin/env bash
# Paired A/B of two step35 builds (or one build under two environments) on this noisy
# shared machine: runs A and B alternately, one short `step35 bench` each, PAIRS times, and
# reports the median of the per-pair B/A ratios with its quartiles. The machine's speed
# drifts by 20-40 % over minutes; adjacent runs see nearly the same machine, so the paired
# ratio is far steadier than either engine's own mean.
#
# usage: bench/ab.sh MODEL.gguf
# env:   A, B (binaries; default build/bin/step35 for both), A_ENV, B_ENV (extra environment
#        for each side, e.g. B_ENV="STEP35_REPACK=0"), PAIRS (default 12), THREADS (default 2),
#        PP (default 0), TG (default 128), PARALLEL (N: measure batched decoding of N
#        sequences through the serving engine, `bench --parallel N`, total t/s; default off),
#        ARGS (extra bench args)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
A="${A:-$here/build/bin/step35}"
B="${B:-$here/build/bin/step35}"
PAIRS="${PAIRS:-12}"
THREADS="${THREADS:-2}"
PP="${PP:-0}"
TG="${TG:-128}"
PARALLEL="${PARALLEL:-}"
[ $# -eq 1 ] || { sed -n '2,13p' "$0"; exit 2; }
model="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One measurement: prints the pp or tg rate of one bench run (tg when TG > 0), or with
# PARALLEL the total rate of N sequences generating 128 tokens each together.
run_one() {
  local bin="$1" envs="$2"
  local what=(-p "$PP" -n "$TG")
  [ -n "$PARALLEL" ] && what=(-p 0 -n 0 --parallel "$PARALLEL")  # (-n 0: 128 tokens each, no single tg)
  env $envs "$bin" bench -m "$model" "${what[@]}" -t "$THREADS" -r 2 --json ${ARGS:-} > "$tmp/out.json" \
    2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  python3 - "$tmp/out.json" "$TG" "$PARALLEL" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if sys.argv[3]:
    print(r["parallel"][0]["total_tok_per_s"])
else:
    key = "tg" if int(sys.argv[2]) > 0 else "pp"
    print(r[key]["tok_per_s"])
PY
}

: > "$tmp/pairs"
for i in $(seq 1 "$PAIRS"); do
  # Alternate which side goes first so that a drift within a pair does not favour one.
  if [ $((i % 2)) -eq 1 ]; then
    a=$(run_one "$A" "${A_ENV:-}"); b=$(run_one "$B" "${B_ENV:-}")
  else
    b=$(run_one "$B" "${B_ENV:-}"); a=$(run_one "$A" "${A_ENV:-}")
  fi
  echo "$a $b" >> "$tmp/pairs"
  printf 'pair %2d: A %7.1f  B %7.1f  B/A %.3f\n' "$i" "$a" "$b" "$(python3 -c "print($b/$a)")"
done
python3 - "$tmp/pairs" <<'PY'
import statistics, sys
pairs = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
ratios = sorted(b / a for a, b in pairs)
q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
wins = sum(r > 1 for r in ratios)
print(f"B/A over {len(ratios)} pairs: median {q[1]:.3f} (quartiles {q[0]:.3f} .. {q[2]:.3f}), "
      f"B faster in {wins}; A mean {statistics.mean(a for a, _ in pairs):.1f}, "
      f"B mean {statistics.mean(b for _, b in pairs):.1f} t/s")
PY
