#!/usr/bin/env bash
# Picture encoding speed and peak memory of step35 and llama.cpp's llama-mtmd-cli on the same
# mmproj, text model and picture, same threads, one run, alternating per round (issue 37:
# "image encoding at least 1.5x faster than llama.cpp's mtmd encode"). Nothing of llama.cpp
# is in the repository: point LLAMA_BIN at a build of the peer (../shared/docs/peer.md).
# step35's figure is the tower's time as `step35 eval` reports it ("encoded in X ms":
# preprocessing and every chunk through the tower); llama.cpp's is its "mtmd
# batch encoding done in X ms" line (the tower alone; its preprocessing is not in it).
#
# usage: bench/vision_vs_llama.sh TEXT.gguf MMPROJ.gguf PICTURE
# env:   LLAMA_BIN (default /tmp/llama.cpp/build/bin), STEP35 (default build/bin/step35),
#        THREADS (default 2), ROUNDS (default 3)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
LLAMA_BIN="${LLAMA_BIN:-/tmp/llama.cpp/build/bin}"
STEP35="${STEP35:-$here/build/bin/step35}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-3}"
[ $# -eq 3 ] || { sed -n '2,12p' "$0"; exit 2; }
text="$1" mmproj="$2" picture="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One measurement each: prints "encode_ms peak_rss_kib".
run_step35() {
  /usr/bin/time -f '%M' -o "$tmp/rss" "$STEP35" eval -m "$text" --mmproj "$mmproj" --image "$picture" \
    --prompt '<__media__>' -t "$THREADS" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  echo "$(grep -o 'encoded in [0-9.]* ms' "$tmp/err" | grep -o '[0-9.]*') $(cat "$tmp/rss")"
}
run_llama() {
  /usr/bin/time -f '%M' -o "$tmp/rss" "$LLAMA_BIN/llama-mtmd-cli" -m "$text" --mmproj "$mmproj" --image "$picture" \
    -p 'x' -n 1 -t "$THREADS" --temp 0 >/dev/null 2>"$tmp/err" || { tail -5 "$tmp/err" >&2; exit 1; }
  # "mtmd batch encoding done in X ms" (this tree), or per slice "image slice encoded in X ms".
  echo "$(grep -oE '(encoding done|slice encoded) in [0-9.]+ ms' "$tmp/err" | grep -oE '[0-9.]+' | awk '{s += $1} END {print s}') $(cat "$tmp/rss")"
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), threads $THREADS"
echo "| round | step35 encode ms | llama.cpp encode ms | ratio (llama / step35) | step35 peak RSS MiB | llama.cpp peak RSS MiB |"
echo "|---:|---:|---:|---:|---:|---:|"
for r in $(seq "$ROUNDS"); do
  read -r s_ms s_rss < <(run_step35)
  read -r l_ms l_rss < <(run_llama)
  awk -v r="$r" -v s="$s_ms" -v l="$l_ms" -v sr="$s_rss" -v lr="$l_rss" \
    'BEGIN {printf "| %d | %.0f | %.0f | %.2f | %.0f | %.0f |\n", r, s, l, l / s, sr / 1024, lr / 1024}'
done
