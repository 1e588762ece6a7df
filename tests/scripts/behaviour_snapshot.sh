#!/usr/bin/env bash
# Records what a step35 binary prints for a fixed set of commands on every fixture model,
# so that a refactoring can be shown to leave behaviour unchanged byte for byte:
#
#   behaviour_snapshot.sh record STEP35 DIR      write the outputs of binary STEP35 into DIR
#   behaviour_snapshot.sh compare DIR_A DIR_B    exit 0 when both hold the same files, byte for byte
#   behaviour_snapshot.sh check STEP35_A STEP35_B  record both (temporary folders), then compare
#
# What is recorded (stdout and exit status only: stderr carries timings), per model in
# $STEP35_FIXTURES/models (default ../shared/fixtures next to the repository):
#   * `eval --all-logits --greedy 16` on the ids64 and long200 prompts of the fixtures'
#     goldens (every position's logits, as JSON), `--hidden` on ids64, and long200 again
#     with -b 48 (prompt chunks);
#   * greedy `run` of a text prompt with --mtp 0, 1, 2 and 3 (a model without MTP blocks
#     records the refusal), a --chat run, and a seeded sampling run with --mtp 0 and 2;
#   * `serve` with --mtp 0 and 2: two greedy chat completions sent together, and one seeded
#     completion with sampling (the continuous-batching engine's path); then streamed chat
#     (with usage), completions (streamed, with logprobs; and whole) and Anthropic messages
#     (streamed and whole), with their random ids and timestamps left out.
# Runs with 2 threads; about two minutes on two cores.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
fixtures="${STEP35_FIXTURES:-$here/../../../shared/fixtures}"
threads="${STEP35_SNAPSHOT_THREADS:-2}"

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

prompt_ids() {  # golden json -> comma-separated prompt token ids
  python3 -c 'import json,sys; print(",".join(str(t) for t in json.load(open(sys.argv[1]))["prompt_tokens"]))' "$1"
}

# Runs a command, writing its stdout and then its exit status to FILE.
capture() {
  local file="$1"
  shift
  local rc=0
  "$@" >"$file" 2>/dev/null || rc=$?
  echo "exit status $rc" >>"$file"
}

# An event stream with the JSON of each data line minus its random id and timestamp.
without_ids() {
  while IFS= read -r line; do
    if [[ "$line" == "data: {"* ]]; then
      echo "data: $(jq -c 'del(.id, .created) | if .message then .message |= del(.id) else . end' <<<"${line#data: }")"
    else
      echo "$line"
    fi
  done
}

serve_snapshot() {  # step35 model mtp out-file
  local bin="$1" model="$2" mtp="$3" out="$4"
  local log
  log="$(mktemp)"
  "$bin" serve -m "$model" --port 0 --parallel 2 -t "$threads" -c 512 --mtp "$mtp" 2>"$log" &
  local pid=$!
  local port=""
  for _ in $(seq 1 600); do
    if grep -q 'ready' "$log"; then
      port="$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$log" | head -1)"
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [[ -z "$port" ]]; then
    echo "serve did not start: $(tail -1 "$log")" >"$out"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -f "$log"
    return
  fi
  local url="http://127.0.0.1:$port/v1/chat/completions"
  local greedy1='{"messages":[{"role":"user","content":"Tell me about sliding windows."}],"temperature":0,"max_tokens":40}'
  local greedy2='{"messages":[{"role":"user","content":"Count to ten."}],"temperature":0,"max_tokens":40,"logprobs":true,"top_logprobs":2}'
  local sampled='{"messages":[{"role":"user","content":"Write a haiku."}],"temperature":0.9,"seed":11,"max_tokens":40}'
  local a b
  a="$(mktemp)" b="$(mktemp)"
  curl -s "$url" -H 'Content-Type: application/json' -d "$greedy1" >"$a" &
  local ca=$!
  curl -s "$url" -H 'Content-Type: application/json' -d "$greedy2" >"$b" &
  local cb=$!
  wait "$ca" "$cb"
  local base="http://127.0.0.1:$port"
  local chat_stream='{"messages":[{"role":"user","content":"Stream this."}],"temperature":0,"max_tokens":24,"stream":true,"stream_options":{"include_usage":true}}'
  local completion='{"prompt":"Once upon a time","temperature":0,"max_tokens":24,"logprobs":2}'
  local completion_stream='{"prompt":"Once upon a time","temperature":0,"max_tokens":24,"logprobs":1,"stream":true}'
  local message='{"model":"m","max_tokens":24,"temperature":0,"messages":[{"role":"user","content":"Hi"}]}'
  local message_stream='{"model":"m","max_tokens":24,"temperature":0,"stream":true,"messages":[{"role":"user","content":"Hi"}]}'
  {
    jq -c '{choices, usage}' "$a"
    jq -c '{choices, usage}' "$b"
    curl -s "$url" -H 'Content-Type: application/json' -d "$sampled" | jq -c '{choices, usage}'
    curl -sN "$url" -H 'Content-Type: application/json' -d "$chat_stream" | without_ids
    curl -s "$base/v1/completions" -H 'Content-Type: application/json' -d "$completion" | jq -c 'del(.id, .created)'
    curl -sN "$base/v1/completions" -H 'Content-Type: application/json' -d "$completion_stream" | without_ids
    curl -s "$base/v1/messages" -H 'Content-Type: application/json' -d "$message" | jq -c 'del(.id)'
    curl -sN "$base/v1/messages" -H 'Content-Type: application/json' -d "$message_stream" | without_ids
  } >"$out"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$log" "$a" "$b"
}

record() {
  local bin dir
  bin="$(realpath "$1")"
  dir="$2"
  mkdir -p "$dir"
  local text="The quick brown fox jumps over the lazy dog. Sliding windows look at recent tokens only."
  for model in "$fixtures"/models/*.gguf; do
    local name
    name="$(basename "$model" .gguf)"
    echo "  $name" >&2
    for prompt in ids64 long200; do
      local golden="$fixtures/golden/$name.$prompt.json"
      [[ -f "$golden" ]] || continue
      local ids
      ids="$(prompt_ids "$golden")"
      capture "$dir/$name.eval.$prompt.txt" "$bin" eval -m "$model" --tokens "$ids" --all-logits --greedy 16 -t "$threads"
      if [[ "$prompt" == ids64 ]]; then
        capture "$dir/$name.eval.$prompt.hidden.txt" "$bin" eval -m "$model" --tokens "$ids" --hidden -t "$threads"
      else
        capture "$dir/$name.eval.$prompt.b48.txt" "$bin" eval -m "$model" --tokens "$ids" --all-logits -b 48 -t "$threads"
      fi
    done
    for k in 0 1 2 3; do
      capture "$dir/$name.run.mtp$k.txt" "$bin" run -m "$model" -p "$text" --temp 0 -n 48 --mtp "$k" -t "$threads"
    done
    capture "$dir/$name.run.chat.txt" "$bin" run -m "$model" -p "Hello there" --chat --temp 0 -n 32 -t "$threads"
    capture "$dir/$name.run.sampled.mtp0.txt" "$bin" run -m "$model" -p "$text" --seed 7 --temp 0.8 -n 48 --mtp 0 -t "$threads"
    capture "$dir/$name.run.sampled.mtp2.txt" "$bin" run -m "$model" -p "$text" --seed 7 --temp 0.8 -n 48 --mtp 2 -t "$threads"
  done
  # The serving engine on one model with MTP blocks (tiny-a) and one with three (tiny-b).
  for name in tiny-a-q8_0 tiny-b-f32; do
    [[ -f "$fixtures/models/$name.gguf" ]] || continue
    for k in 0 2; do
      echo "  serve $name --mtp $k" >&2
      serve_snapshot "$bin" "$fixtures/models/$name.gguf" "$k" "$dir/$name.serve.mtp$k.txt"
    done
  done
}

compare() {
  local a="$1" b="$2"
  if diff -rq "$a" "$b"; then
    echo "identical: $(ls "$a" | wc -l) outputs"
  else
    echo "DIFFERENT (see above)"
    return 1
  fi
}

[[ $# -eq 3 ]] || usage
case "$1" in
  record) record "$2" "$3" ;;
  compare) compare "$2" "$3" ;;
  check)
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "recording $2" >&2
    record "$2" "$tmp/a"
    echo "recording $3" >&2
    record "$3" "$tmp/b"
    compare "$tmp/a" "$tmp/b"
    ;;
  *) usage ;;
esac
