#!/usr/bin/env bash
# Soak test of `step35 serve` over loopback: a bounded mixed load (normal, streaming,
# cancelled mid-stream, malformed) for MINUTES, with RSS sampled over time and /metrics
# read at the end. Prints client- and server-side counts, p99 latency, RSS first/max/last
# and KV blocks in use after the load, and exits non-zero when
#   - KV blocks are still in use after the load,
#   - the server's accepted requests != completed + errored + cancelled (its own counters),
#   - the server accepted a different number of requests than the client sent valid ones,
#   - a malformed request was not answered 400, or the server died.
#   bench/soak.sh MINUTES [PORT]      (env: STEP35_BUILD=build, STEP35_SOAK_MODEL, SOAK_CLIENTS=4)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:?usage: bench/soak.sh MINUTES [PORT]}
port=${2:-19700}
bin=${STEP35_BUILD:-build}/bin/step35
model=${STEP35_SOAK_MODEL:-fuzz/corpus/gguf/micro-f16.gguf}
clients=${SOAK_CLIENTS:-4}
[ -x "$bin" ] || { echo "soak: $bin not built" >&2; exit 2; }
work=$(mktemp -d /tmp/step35-soak.XXXXXX)
url=http://127.0.0.1:$port

"$bin" serve -m "$model" --host 127.0.0.1 --port "$port" -t 2 -c 4096 --parallel 4 --timeout 60 \
  2>"$work/server.log" &
server=$!
cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  [ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do curl -sf "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "$url/health" >/dev/null || { echo "soak: server did not start" >&2; cat "$work/server.log" >&2; exit 1; }

# RSS of the server every 2 s (kB).
( while kill -0 "$server" 2>/dev/null; do
    awk '/VmRSS/ {print $2}' "/proc/$server/status" 2>/dev/null >>"$work/rss"; sleep 2
  done ) &
sampler=$!

deadline=$(( $(date +%s) + minutes * 60 ))
# One client: cycles through the request kinds; one line per request in its log:
#   kind http_code curl_exit seconds
client() {
  local id=$1 i=0 kind out code rc t
  while [ "$(date +%s)" -lt "$deadline" ]; do
    i=$((i + 1))
    case $(( (i + id) % 6 )) in
      0|1) kind=normal
           body="{\"messages\":[{\"role\":\"user\",\"content\":\"soak $id $i\"}],\"max_tokens\":$(( 4 + i % 24 )),\"temperature\":0.7,\"seed\":$i}" ;;
      2|3) kind=stream
           body="{\"messages\":[{\"role\":\"user\",\"content\":\"stream $id $i\"}],\"max_tokens\":$(( 8 + i % 24 )),\"stream\":true}" ;;
      4) kind=cancel
         body="{\"messages\":[{\"role\":\"user\",\"content\":\"cancel $id $i\"}],\"max_tokens\":4000,\"ignore_eos\":true,\"stream\":true}" ;;
      5) kind=malformed
         case $(( i % 4 )) in
           0) body='{"messages": [' ;;
           1) body='{"messages": "hi"}' ;;
           2) body='{"messages":[{"role":"user","content":"x"}],"max_tokens":-5}' ;;
           3) body='{"messages":[{"role":"user","content":"x"}],"n":0}' ;;
         esac ;;
    esac
    rc=0
    if [ "$kind" = cancel ]; then
      out=$(curl -sN -o "$work/c$id.body" -w '%{http_code} %{time_total}' --max-time 0.3 \
            -H 'Content-Type: application/json' -d "$body" "$url/v1/chat/completions") || rc=$?
    else
      out=$(curl -sN -o "$work/c$id.body" -w '%{http_code} %{time_total}' --max-time 60 \
            -H 'Content-Type: application/json' -d "$body" "$url/v1/chat/completions") || rc=$?
    fi
    code=${out% *}; t=${out#* }
    if [ "$kind" = stream ] && [ "$code" = 200 ] && ! grep -q 'data: \[DONE\]' "$work/c$id.body"; then
      code=truncated
    fi
    echo "$kind $code $rc $t" >>"$work/client$id.log"
  done
}
pids=()
for c in $(seq "$clients"); do client "$c" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || true; done
kill -0 "$server" 2>/dev/null || { echo "soak: FAIL: the server died" >&2; tail -20 "$work/server.log" >&2; exit 1; }

# KV blocks in use once the load is over (cancelled sequences are freed asynchronously).
metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
kv_used=
for _ in $(seq 100); do kv_used=$(metric step35_kv_blocks_used); [ "${kv_used%.*}" = 0 ] && break; sleep 0.1; done
running=$(metric step35_running_sequences)
curl -s "$url/metrics" >"$work/metrics"
kill "$sampler" 2>/dev/null || true

cat "$work"/client*.log >"$work/all.log"
count() { awk "$1" "$work/all.log" | wc -l; }
# A cancel request cut by curl's --max-time (exit 28) was cancelled by the client; one that
# finished first counts as completed.
completed=$(count '(($1=="normal"||$1=="stream") && $2==200) || ($1=="cancel" && $3==0 && $2==200)')
errored=$(count '(($1=="normal"||$1=="stream") && $2!=200) || ($1=="cancel" && $3==0 && $2!=200)')
cancelled=$(count '$1=="cancel" && $3!=0')
malformed=$(count '$1=="malformed"')
malformed_400=$(count '$1=="malformed" && $2==400')
valid_sent=$((completed + errored + cancelled))
p99=$(awk '$1=="normal" && $2==200 {print $4}' "$work/all.log" | sort -g | awk '{a[NR]=$1} END {if (NR) {i=int(NR*0.99); if (i<1) i=1; print a[i]} else print "n/a"}')
rss_first=$(head -1 "$work/rss"); rss_max=$(sort -n "$work/rss" | tail -1); rss_last=$(tail -1 "$work/rss")

srv() { awk -v n="$1" '$1 == n {s += $2} END {printf "%d", s}' "$work/metrics"; }
accepted=$(srv step35_requests_submitted_total)
fin_cancel=$(awk '$1 ~ /^step35_requests_finished_total\{reason="cancelled"\}/ {printf "%d", $2}' "$work/metrics")
fin_err=$(awk '$1 ~ /^step35_requests_finished_total\{reason="(error|timeout)"\}/ {s += $2} END {printf "%d", s}' "$work/metrics")
fin_all=$(awk '$1 ~ /^step35_requests_finished_total\{/ {s += $2} END {printf "%d", s}' "$work/metrics")
fin_done=$((fin_all - fin_cancel - fin_err))

echo "soak: ${minutes} min, $clients clients, model $model"
echo "client: completed $completed  errored $errored  cancelled $cancelled  malformed $malformed (rejected 400: $malformed_400)"
echo "server: accepted $accepted  completed $fin_done  errored $fin_err  cancelled $fin_cancel"
echo "latency p99 (normal requests): ${p99} s"
echo "rss kB: first $rss_first  max $rss_max  last $rss_last  (samples: $(wc -l <"$work/rss"))"
# Ten evenly spaced samples, to tell a plateau (allocator pools warming up) from a leak.
echo "rss kB over time: $(awk '{a[NR]=$1} END {for (k = 1; k <= 10; ++k) printf "%s ", a[int((NR - 1) * k / 10) + 1]}' "$work/rss")"
echo "kv blocks in use after load: $kv_used  running sequences: $running"
fail=0
[ "${kv_used%.*}" = 0 ] || { echo "FAIL: KV blocks still in use after the load"; fail=1; }
[ "$accepted" -eq "$fin_all" ] || { echo "FAIL: server accepted $accepted != completed + errored + cancelled $fin_all"; fail=1; }
[ "$accepted" -eq "$valid_sent" ] || { echo "FAIL: server accepted $accepted != client valid requests $valid_sent"; fail=1; }
[ "$malformed" -eq "$malformed_400" ] || { echo "FAIL: malformed requests not all answered 400"; fail=1; }
[ "$errored" -eq 0 ] || { echo "FAIL: $errored valid requests failed"; fail=1; }
[ "$fin_cancel" -le "$cancelled" ] || { echo "FAIL: server cancelled $fin_cancel > client cancels $cancelled"; fail=1; }
[ "$fail" -eq 0 ] && echo "soak: OK"
exit $fail
