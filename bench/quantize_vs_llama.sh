#!/usr/bin/env bash
# Quantizes GGUF models with `step35 quantize` and with llama.cpp's llama-quantize to the
# same file types and compares the results tensor by tensor (tools/gguf_compare.py).
# Nothing of llama.cpp is part of the repository: point LLAMA_BIN at a build of the peer
# (../shared/docs/peer.md). Outputs go to $OUT_DIR (default /tmp/bench-quant).
#
# usage: bench/quantize_vs_llama.sh MODEL.gguf [TYPE ...]     (default types: all)
# env:   LLAMA_BIN (default /tmp/peer/llama.cpp/build/bin), STEP35 (default build/bin/step35),
#        THREADS (default 2), OUT_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
LLAMA_BIN="${LLAMA_BIN:-/tmp/peer/llama.cpp/build/bin}"
STEP35="${STEP35:-$here/build/bin/step35}"
THREADS="${THREADS:-2}"
OUT_DIR="${OUT_DIR:-/tmp/bench-quant}"
[ $# -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
model="$1"; shift
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K)
mkdir -p "$OUT_DIR"
base="$(basename "$model" .gguf)"
failed=0
for t in "${types[@]}"; do
  lower="$(echo "$t" | tr 'A-Z' 'a-z')"
  ours="$OUT_DIR/$base.$lower.step35.gguf"
  theirs="$OUT_DIR/$base.$lower.llama.gguf"
  s0=$(date +%s.%N)
  "$STEP35" quantize "$model" "$ours" "$t" -t "$THREADS" 2> "$OUT_DIR/$base.$lower.step35.log"
  s1=$(date +%s.%N)
  "$LLAMA_BIN/llama-quantize" "$model" "$theirs" "$t" "$THREADS" > "$OUT_DIR/$base.$lower.llama.log" 2>&1
  s2=$(date +%s.%N)
  if result=$(python3 "$here/tools/gguf_compare.py" --quiet "$ours" "$theirs"); then status=same; else status=DIFFERENT; failed=1; fi
  printf '%-8s %-9s step35 %7.2f s  llama %7.2f s  %s\n' "$t" "$status" "$(awk "BEGIN{print $s1 - $s0}")" \
    "$(awk "BEGIN{print $s2 - $s1}")" "$(echo "$result" | tail -1)"
  [ "$status" = same ] || echo "$result" | head -20
done
exit $failed
