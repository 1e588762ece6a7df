#!/usr/bin/env bash
# Long agent soak of `step35 serve`: SOAK_CLIENTS clients (default 8) play multi-turn agent
# sessions for MINUTES over loopback (chat completions, Anthropic messages and responses;
# tools, forced tool calls and tool results growing the context to its limit, reasoning,
# streaming, cancellations, disconnects mid-stream, one hot-swap and its revert around the
# middle), driven by bench/soak_agents.mjs (Node 20, built-ins only). The server is started
# here on a free port (-c 4096 --parallel 8 -t 2) and its RSS sampled every 2 s.
# Targets (exit 1 when one fails):
#   - no crash: the server alive after the load, exit status 0 on SIGTERM;
#   - no lost requests: /metrics accepted = completed + errored + cancelled; no errors;
#   - anonymous RSS at the end (idle) <= 1.02 x that after the first 1/12 of the run (5 of 60
#     min), less what grows by design up to a bound /metrics reports: experts repacked on
#     first use (step35_expert_repacked_bytes) and KV pages committed on a block's first
#     write (step35_kv_bytes_resident) in between; the unadjusted ratio is printed too;
#   - step35_kv_blocks_used and step35_running_sequences back to 0 when idle;
#   - p99 time to the full answer (non-cancelled turns) of the last 1/6 of the run
#     <= 1.2 x that of the first 1/6 (10 of 60 min); time to first token is reported;
#   - the hot-swap and the revert answered 200 and counted in /metrics.
#   bench/soak_agents.sh MINUTES [MODEL]   (MODEL empty: the built-in tiny model)
#   env: STEP35_BUILD=build, SOAK_CLIENTS=8, SOAK_THREADS=2, SOAK_CTX=4096, SOAK_TIMEOUT=300 (serve
#   --timeout), SOAK_PATCH (a ready patch for MODEL; otherwise one is made once and kept in
#   /tmp/step35-soak-patches/, keyed by the model's path, size and mtime)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:?usage: bench/soak_agents.sh MINUTES [MODEL]}
[[ $minutes =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "soak_agents: MINUTES must be a number" >&2; exit 2; }
model=${2:-}
bin=${STEP35_BUILD:-build}/bin/step35
clients=${SOAK_CLIENTS:-8}
[ -x "$bin" ] || { echo "soak_agents: $bin not built" >&2; exit 2; }
command -v node >/dev/null || { echo "soak_agents: node (20+) not found" >&2; exit 2; }
work=$(mktemp -d /tmp/step35-soak-agents.XXXXXX)

margs=()
[ -n "$model" ] && margs=(-m "$model")
"$bin" serve "${margs[@]}" --host 127.0.0.1 --port 0 -t "${SOAK_THREADS:-2}" -c "${SOAK_CTX:-4096}" \
  --parallel 8 --timeout "${SOAK_TIMEOUT:-300}" 2>"$work/server.log" &
server=$!
sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  if kill -0 "$server" 2>/dev/null; then kill -KILL "$server" 2>/dev/null || true; fi
  wait "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The port from the server's 'listening on http://HOST:PORT' line (loading a model: <= 120 s).
url=
for _ in $(seq 1200); do
  url=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$work/server.log" | head -1 | sed 's/^listening on //') || true
  [ -n "$url" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
[ -n "$url" ] || { echo "soak_agents: the server did not start" >&2; cat "$work/server.log" >&2; exit 1; }
for _ in $(seq 1200); do curl -sf "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "$url/health" >/dev/null || { echo "soak_agents: $url/health never answered" >&2; tail "$work/server.log" >&2; exit 1; }

# The patch for the hot-swap: a 2-step finetune of the top expert of layer 3 of the served
# model (the built-in one lives in the server's cache folder), made before the load starts.
base=$model
if [ -z "$base" ]; then
  if [ -n "${STEP35_CACHE_DIR:-}" ]; then base=$STEP35_CACHE_DIR
  elif [ -n "${XDG_CACHE_HOME:-}" ]; then base=$XDG_CACHE_HOME/step35
  elif [ -n "${HOME:-}" ]; then base=$HOME/.cache/step35
  else base=/tmp/step35-cache; fi
  base=$base/tiny-random-v2-f32.gguf
fi
patch_dir=/tmp/step35-soak-patches
mkdir -p "$patch_dir"
patch=${SOAK_PATCH:-$patch_dir/$(stat -c '%n %s %Y' "$base" 2>/dev/null | sha256sum | cut -c1-16).gguf}
patch_args=()
if [ -s "$patch" ]; then
  patch_args=(--patch "$patch")
  echo "soak_agents: reusing the patch $patch for $base"
else
  for i in $(seq 200); do
    echo "The agent reads src/cache.cpp, runs the tests and fixes the failing function number $i."
  done >"$work/train.txt"
  patch_start=$(date +%s.%N)
  if "$bin" finetune -m "$base" -f "$work/train.txt" --train "experts=3:top1" --steps 2 -c 32 -b 1 -t 2 \
       --out "$work/patch.gguf" >"$work/finetune.log" 2>&1 && mv "$work/patch.gguf" "$patch"; then
    patch_args=(--patch "$patch")
    echo "soak_agents: patch for $base made in $(awk -v a="$patch_start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s (before the load), kept as $patch"
  else
    echo "soak_agents: FAIL: could not make a patch (no hot-swap):" >&2; tail -3 "$work/finetune.log" >&2
  fi
fi

# Anonymous RSS of the server every 2 s: "epoch_ms kB". Anonymous, because that is where a
# leak shows: the model file's pages also count in VmRSS and grow, by design, as requests
# route to experts not read before (they are file-backed, the kernel can drop them).
( while kill -0 "$server" 2>/dev/null; do
    kb=$(awk '/RssAnon/ {print $2}' "/proc/$server/status" 2>/dev/null) || true
    [ -n "$kb" ] && echo "$(date +%s%3N) $kb" >>"$work/rss"
    sleep 2
  done ) &
sampler=$!

load_rc=0
timeout "$(awk -v m="$minutes" 'BEGIN {printf "%d", m * 60 + 400}')" node bench/soak_agents.mjs --url "$url" --minutes "$minutes" --clients "$clients" \
  "${patch_args[@]}" --rss "$work/rss" --out "$work/summary.json" || load_rc=$?

alive=1
kill -0 "$server" 2>/dev/null || alive=0
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
sampler=
exit_rc=dead
if [ "$alive" = 1 ]; then
  kill -TERM "$server"
  for _ in $(seq 300); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$server" 2>/dev/null; then exit_rc=hung
  else exit_rc=0; wait "$server" || exit_rc=$?; fi
else
  wait "$server" || exit_rc=$?
fi
echo "| server alive after the load, exit on SIGTERM | $([ "$alive" = 1 ] && [ "$exit_rc" = 0 ] && echo ok || echo FAIL) | alive $alive, exit $exit_rc |"
[ "${#patch_args[@]}" -gt 0 ] || echo "| patch made | FAIL | see above |"

desc=${model:-built-in tiny model}
if [ "$load_rc" = 0 ] && [ "$alive" = 1 ] && [ "$exit_rc" = 0 ] && [ "${#patch_args[@]}" -gt 0 ]; then
  echo "soak_agents: OK: $minutes min, $clients clients, $desc: no crash, no lost request, RSS, KV, p99 and hot-swap within targets"
  exit 0
fi
[ "$alive" = 1 ] || tail -20 "$work/server.log" >&2
echo "soak_agents: FAIL: $minutes min, $clients clients, $desc (load check exit $load_rc, server alive $alive, SIGTERM exit $exit_rc)"
exit 1
