#!/usr/bin/env bash
# Serving throughput of `step35 serve` and llama.cpp's llama-server on the same GGUF and
# threads (issue: server benchmark): N concurrent streaming clients (bench/serve_load) for
# each N, both servers on loopback, one after the other in one run; then the low_latency
# probe against step35 (TTFT alone vs under the heaviest load).
#
# MIX=long is the agents' mix instead (issue 21): 8 clients, prompts of 4096 token ids whose
# first 3072 are the same in every request (a long system prompt and tool schemas resent),
# 128 generated tokens, both servers with 8 sequences of 4352 positions and the same cache
# type (CTK; llama-server with -fa on, which a quantized V cache needs); the table has TTFT
# and aggregate tokens/s per engine.
#
# usage: bench/compare_serve.sh MODEL.gguf
# env:   LLAMA_BIN (default /tmp/peer/llama.cpp/build/bin), BIN (default build/bin),
#        THREADS (default 2), CLIENTS (default 1,4,8,16), REQUESTS per client (default 3),
#        PROMPT_WORDS (default 16), MAX_TOKENS (default 128), LLAMA_NP (default 8),
#        STEP35_PARALLEL (default 16), CTX per sequence (default 1024), PORT (default 18480;
#        step35 uses PORT+1), SKIP_LLAMA (set: measure step35 only), CTK (KV cache type of
#        keys and values for both servers, default f16), MIX (short, the default, or long)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
LLAMA_BIN="${LLAMA_BIN:-/tmp/peer/llama.cpp/build/bin}"
BIN="${BIN:-$here/build/bin}"
THREADS="${THREADS:-2}"
CLIENTS="${CLIENTS:-1,4,8,16}"
REQUESTS="${REQUESTS:-3}"
PROMPT_WORDS="${PROMPT_WORDS:-16}"
MAX_TOKENS="${MAX_TOKENS:-128}"
LLAMA_NP="${LLAMA_NP:-8}"
STEP35_PARALLEL="${STEP35_PARALLEL:-16}"
CTX="${CTX:-1024}"
PORT="${PORT:-18480}"
CTK="${CTK:-f16}"
MIX="${MIX:-short}"
PROMPT_ARGS=(--prompt-words "$PROMPT_WORDS")
if [ "$MIX" = long ]; then
  CLIENTS="${CLIENTS_LONG:-8}"
  PROMPT_ARGS=(--prompt-tokens 4096 --shared-prefix-tokens 3072)
  LLAMA_NP=8
  STEP35_PARALLEL=8
  CTX=4352
elif [ "$MIX" != short ]; then
  echo "MIX must be short or long" >&2; exit 2
fi
[ $# -eq 1 ] || { sed -n '2,18p' "$0"; exit 2; }
model="$1"
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; true; }
trap cleanup EXIT

# shellcheck source=bench/serve_wait.sh
. "$here/bench/serve_wait.sh"
load() {
  "$BIN/step35_serve_load" --url "http://127.0.0.1:$PORT" --clients "$CLIENTS" --requests "$REQUESTS" \
    "${PROMPT_ARGS[@]}" --max-tokens "$MAX_TOKENS" "$@"
}

echo "model: $model; threads $THREADS; KV cache $CTK; mix $MIX: prompts ${PROMPT_ARGS[*]}, $MAX_TOKENS generated tokens each"
echo
if [ -z "${SKIP_LLAMA:-}" ]; then
echo "## llama-server -np $LLAMA_NP"
"$LLAMA_BIN/llama-server" -m "$model" -t "$THREADS" -np "$LLAMA_NP" -c $((CTX * LLAMA_NP)) \
  -fa on -ctk "$CTK" -ctv "$CTK" --host 127.0.0.1 --port "$PORT" > /tmp/compare_serve.llama.log 2>&1 &
server_pid=$!
wait_ready "$PORT" "$server_pid"
load
cleanup; server_pid=""
fi
PORT=$((PORT + 1))  # the peer's socket may linger a moment after it exits
echo
echo "## step35 serve --parallel $STEP35_PARALLEL"
"$BIN/step35" serve -m "$model" -t "$THREADS" --parallel "$STEP35_PARALLEL" -c "$CTX" \
  -ctk "$CTK" -ctv "$CTK" --host 127.0.0.1 --port "$PORT" > /tmp/compare_serve.step35.log 2>&1 &
server_pid=$!
wait_ready "$PORT" "$server_pid"
load --probe-low-latency
echo
echo "step35 metrics after the run (distinct experts per step, MoE health):"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^step35_(moe|expert|distinct|router|kv_|prefix|prompt_tokens)' || true
