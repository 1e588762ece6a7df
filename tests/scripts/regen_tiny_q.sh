#!/usr/bin/env bash
# Regenerates the twelve tiny-q fixture models that ../shared/fixtures does not ship (IQ1_S,
# IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS, IQ3_M, IQ4_NL, Q3_K_M, Q4_0, Q5_K_M, MXFP4_MOE, iq3_s_attnq8)
# exactly as the fixtures were made: the F32 model from the reference generator, then
# llama.cpp's llama-quantize with the shipped importance matrix, run in the output folder
# (llama-quantize stores the imatrix file name in the GGUF). Every file is checked against
# the sha256 in fixtures/manifest.json; a mismatch is an error and the file is removed.
# tests/test_golden.cpp (GoldenRegenerated.*) runs them against their ids64 goldens and
# skips, saying so, while they are absent.
#
# usage: tests/scripts/regen_tiny_q.sh [OUT_DIR]
#   OUT_DIR  default: build/tests/tmp/tiny-q-regen (where the tests look; or set
#            STEP35_TINY_Q_DIR for both)
# env: LLAMA_BIN (default /tmp/peer/llama.cpp/build/bin; ../shared/docs/peer.md), PYTHON (python3)
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
fixtures="$(cd "$here/../shared/fixtures" && pwd)"
tools="$(cd "$here/../shared/tools" && pwd)"
LLAMA_BIN="${LLAMA_BIN:-/tmp/peer/llama.cpp/build/bin}"
PYTHON="${PYTHON:-python3}"
out="${1:-${STEP35_TINY_Q_DIR:-$here/build/tests/tmp/tiny-q-regen}}"

if [ ! -x "$LLAMA_BIN/llama-quantize" ]; then
  echo "regen_tiny_q: no llama-quantize in $LLAMA_BIN (set LLAMA_BIN; see ../shared/docs/peer.md)" >&2
  exit 2
fi
mkdir -p "$out"
cd "$out"

# One line per step from manifest.json: "gen|CMD", then "quant|FILE|SHA256|CMD" for every
# unshipped tiny-q file made by llama-quantize, and "sha|FILE|SHA256" for the F32 model.
plan="$("$PYTHON" - "$fixtures/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
models = m["models"]
for c in m["commands"]:
    if c.startswith("python3 tools/make_tiny_step35.py --out tiny-q-f32.gguf "):
        print("gen|" + c[len("python3 tools/"):])
        print("sha|tiny-q-f32.gguf|" + models["tiny-q-f32.gguf"]["sha256"])
for c in m["commands"]:
    if not c.startswith("$LLAMA_BIN/llama-quantize ") or " tiny-q-f32.gguf " not in c:
        continue
    target = c.split()[-3]
    if models[target]["shipped"]:
        continue
    print("quant|%s|%s|%s" % (target, models[target]["sha256"], c[len("$LLAMA_BIN/"):]))
EOF
)"

check_sha() {  # FILE SHA256
  local got
  got="$(sha256sum "$1" | cut -d' ' -f1)"
  if [ "$got" != "$2" ]; then
    echo "regen_tiny_q: $1: sha256 $got, expected $2 (manifest.json)" >&2
    rm -f "$1"
    return 1
  fi
}

failed=0
made=0
while IFS='|' read -r kind a b c; do
  case "$kind" in
    gen)
      if [ ! -f tiny-q-f32.gguf ]; then
        # shellcheck disable=SC2086  # the manifest's command line, split as the shell would
        "$PYTHON" "$tools"/$a > /dev/null
      fi ;;
    sha) check_sha "$a" "$b" || exit 1 ;;
    quant)
      if [ -f "$a" ] && check_sha "$a" "$b" 2> /dev/null; then continue; fi
      cp "$fixtures/models-iq/tiny-q.imatrix.gguf" .
      # shellcheck disable=SC2086
      if ! eval "\"$LLAMA_BIN\"/$c" > "$a.log" 2>&1; then
        echo "regen_tiny_q: llama-quantize failed for $a (log: $out/$a.log)" >&2
        failed=1
        continue
      fi
      if check_sha "$a" "$b"; then made=$((made + 1)); else failed=1; fi ;;
  esac
done <<< "$plan"
n="$(ls tiny-q-*.gguf 2> /dev/null | grep -vc -e '-f32.gguf' -e imatrix || true)"
echo "regen_tiny_q: $n unshipped tiny-q files in $out ($made made now), sha256 as in manifest.json"
exit $failed
