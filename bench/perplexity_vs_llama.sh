#!/usr/bin/env bash
# step35 perplexity against llama-perplexity on the same model, text and context: final PPL
# of both engines, and the KL-divergence statistics of a model against a base in all four
# pairings (base written by either engine, read by either). Prints markdown tables (the
# ones in docs/fidelity.md). Not a speed measurement: safe on a busy machine. Nothing of
# llama.cpp is in the repository: point LLAMA_BIN at a build of the peer (../shared/docs/peer.md).
#
# usage: bench/perplexity_vs_llama.sh ppl MODEL.gguf [ARGS...]         final PPL, e.g. ARGS = -c 128 --chunks 40
#        bench/perplexity_vs_llama.sh kld BASE.gguf MODEL.gguf [ARGS...] KL statistics of MODEL against BASE
# env:   LLAMA_BIN (default /tmp/peer/llama.cpp/build/bin), STEP35 (default build/bin/step35),
#        TEXT (default /usr/share/common-licenses/GPL-3), THREADS (default 1),
#        LLAMA_ARGS (default "-ctk f32 -ctv f32 -fa off": llama.cpp's F32 KV cache without flash
#        attention; set it empty for llama.cpp's defaults), STEP35_ARGS (default "-ctk f32 -ctv f32":
#        the same cache in step35; set it empty for its default F16 cache, llama.cpp's default too)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
LLAMA_BIN="${LLAMA_BIN:-/tmp/peer/llama.cpp/build/bin}"
STEP35="${STEP35:-$here/build/bin/step35}"
TEXT="${TEXT:-/usr/share/common-licenses/GPL-3}"
THREADS="${THREADS:-1}"
LLAMA_ARGS="${LLAMA_ARGS--ctk f32 -ctv f32 -fa off}"
STEP35_ARGS="${STEP35_ARGS--ctk f32 -ctv f32}"
usage() { sed -n '2,15p' "$0"; exit 2; }
[ $# -ge 2 ] || usage
mode="$1"
shift
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

final() { grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$1" | sed 's/Final estimate: PPL = //'; }

if [ "$mode" = ppl ]; then
  model="$1"
  shift
  # shellcheck disable=SC2086
  "$LLAMA_BIN/llama-perplexity" -m "$model" -f "$TEXT" "$@" -t "$THREADS" $LLAMA_ARGS > "$tmp/llama.out" 2>&1 ||
    { tail -5 "$tmp/llama.out" >&2; exit 1; }
  "$STEP35" perplexity -m "$model" -f "$TEXT" "$@" -t "$THREADS" $STEP35_ARGS > "$tmp/step35.out" 2> "$tmp/step35.err" ||
    { cat "$tmp/step35.err" >&2; exit 1; }
  python3 - "$(basename "$model")" "$*" "$(final "$tmp/llama.out")" "$(final "$tmp/step35.out")" <<'PY'
import sys
name, args, llama, step = sys.argv[1:5]
l, s = float(llama.split()[0]), float(step.split()[0])
print(f"| {name} | `{args}` | {llama} | {step} | {s / l - 1:+.2e} |")
PY
elif [ "$mode" = kld ]; then
  [ $# -ge 2 ] || usage
  base_model="$1"
  model="$2"
  shift 2
  # shellcheck disable=SC2086
  "$LLAMA_BIN/llama-perplexity" -m "$base_model" -f "$TEXT" "$@" -t "$THREADS" $LLAMA_ARGS \
    --kl-divergence-base "$tmp/llama.kld" > "$tmp/base_llama.out" 2>&1 || { tail -5 "$tmp/base_llama.out" >&2; exit 1; }
  "$STEP35" perplexity -m "$base_model" -f "$TEXT" "$@" -t "$THREADS" $STEP35_ARGS --kl-divergence-base "$tmp/step35.kld" \
    > /dev/null 2> "$tmp/base_step35.err" || { cat "$tmp/base_step35.err" >&2; exit 1; }
  for base in llama step35; do
    # llama.cpp's logger thread sometimes loses the last lines of stdout at exit: run again then.
    for attempt in 1 2 3; do
      # shellcheck disable=SC2086
      "$LLAMA_BIN/llama-perplexity" -m "$model" -t "$THREADS" $LLAMA_ARGS --kl-divergence-base "$tmp/$base.kld" \
        --kl-divergence > "$tmp/kl_llama_on_$base.out" 2>/dev/null || { echo "llama-perplexity failed" >&2; exit 1; }
      grep -q '^Same top p' "$tmp/kl_llama_on_$base.out" && break
    done
    "$STEP35" perplexity -m "$model" -t "$THREADS" $STEP35_ARGS --kl-divergence-base "$tmp/$base.kld" --kl-divergence \
      > "$tmp/kl_step35_on_$base.out" 2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  done
  python3 - "$tmp" "$(basename "$base_model")" "$(basename "$model")" "$*" <<'PY'
import math, re, sys
tmp, base, model, args = sys.argv[1:5]
def figures(path):
    out = {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^(Mean PPL\(Q\)|Mean PPL\(base\)|Mean ln\(PPL\(Q\)/PPL\(base\)\)|Mean PPL\(Q\)/PPL\(base\)|"
                     r"Mean PPL\(Q\)-PPL\(base\)|Mean    KLD|Maximum KLD|99\.9%   KLD|99\.0%   KLD|95\.0%   KLD|"
                     r"90\.0%   KLD|Median  KLD|10\.0%   KLD| 5\.0%   KLD| 1\.0%   KLD| 0\.1%   KLD|Minimum KLD|"
                     r"RMS Δp|Same top p)\s*:\s*(-?[0-9.]+)", line)
        if m:
            out[m.group(1).strip()] = float(m.group(2))
    return out
def same2(x, ref):  # same to 2 significant digits: within half a unit of ref's 2nd digit
    if ref == 0:
        return x == 0
    return abs(x - ref) <= 0.5 * 10 ** (math.floor(math.log10(abs(ref))) - 1) + 1e-12
runs = [("llama", "llama"), ("step35", "llama"), ("step35", "step35"), ("llama", "step35")]
got = {r: figures(f"{tmp}/kl_{r[0]}_on_{r[1]}.out") for r in runs}
print(f"{model} against {base}, `{args}`\n")
print("| figure | llama.cpp (own base) | step35 (llama.cpp's base) | step35 (own base) | llama.cpp (step35's base) | step35 own vs llama.cpp own, 2 significant digits |")
print("|---|---:|---:|---:|---:|---|")
for key in got[runs[0]]:
    vals = [got[r].get(key, float("nan")) for r in runs]
    print(f"| {key} | " + " | ".join(f"{v:g}" for v in vals) + f" | {'same' if same2(vals[2], vals[0]) else 'differs'} |")
PY
else
  usage
fi
