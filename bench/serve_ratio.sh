#!/usr/bin/env bash
# Serving scale-up of `step35 serve` measured in pairs: one server, then PAIRS times one
# level of N = 1 client right before one of N = NMAX clients (bench/serve_load, streaming,
# random prompts); each pair's aggregate tokens/s ratio NMAX / 1, and their median. On a
# machine whose speed drifts by 20-40 % within minutes, two levels measured back to back
# see nearly the same machine, so the paired ratio is steadier than one run of
# bench/compare_serve.sh. One unrecorded level of N = NMAX clients warms the server up.
#
# usage: bench/serve_ratio.sh MODEL.gguf
# env:   BIN (default build/bin), THREADS (default 2), NMAX (default 8), PAIRS (default 10),
#        REQUESTS per client (default 2), PROMPT_WORDS (default 16), MAX_TOKENS (default 128),
#        PARALLEL (default 16), CTX (default 1024), PORT (default 18490), SERVE_ARGS (extra)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$here/build/bin}"
THREADS="${THREADS:-2}"
NMAX="${NMAX:-8}"
PAIRS="${PAIRS:-10}"
REQUESTS="${REQUESTS:-2}"
PROMPT_WORDS="${PROMPT_WORDS:-16}"
MAX_TOKENS="${MAX_TOKENS:-128}"
PARALLEL="${PARALLEL:-16}"
CTX="${CTX:-1024}"
PORT="${PORT:-18490}"
[ $# -eq 1 ] || { sed -n '2,12p' "$0"; exit 2; }
model="$1"
log="$(mktemp)"
# shellcheck disable=SC2086
"$BIN/step35" serve -m "$model" -t "$THREADS" --parallel "$PARALLEL" -c "$CTX" --host 127.0.0.1 --port "$PORT" \
  ${SERVE_ARGS:-} > "$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; rm -f "$log"' EXIT
# shellcheck source=bench/serve_wait.sh
. "$here/bench/serve_wait.sh"
wait_ready "$PORT" "$server_pid" || { cat "$log" >&2; exit 1; }
# One unrecorded level first: experts repacked on first use and pages faulted in would
# otherwise count against the first pair.
"$BIN/step35_serve_load" --url "http://127.0.0.1:$PORT" --clients "$NMAX" --requests 1 \
  --prompt-words "$PROMPT_WORDS" --max-tokens "$MAX_TOKENS" > /dev/null
echo "model: $model; threads $THREADS; N = 1 then N = $NMAX, $REQUESTS requests per client, $PAIRS pairs"
echo "| pair | N = 1 t/s | N = $NMAX t/s | ratio |"
echo "| ---: | ---: | ---: | ---: |"
ratios=()
for i in $(seq "$PAIRS"); do
  read -r one many < <("$BIN/step35_serve_load" --url "http://127.0.0.1:$PORT" --clients "1,$NMAX" \
    --requests "$REQUESTS" --prompt-words "$PROMPT_WORDS" --max-tokens "$MAX_TOKENS" |
    awk -F'|' -v n="$NMAX" '$2 + 0 == 1 && $2 ~ /[0-9]/ { a = $4 } $2 + 0 == n { b = $4 } END { print a + 0, b + 0 }')
  r="$(awk -v a="$one" -v b="$many" 'BEGIN { printf "%.2f", (a > 0 ? b / a : 0) }')"
  ratios+=("$r")
  echo "| $i | $one | $many | $r |"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "median ratio N = %s / N = 1 over %d pairs: %.2f (range %.2f .. %.2f)\n", "'"$NMAX"'", NR, m, v[1], v[NR] }'
