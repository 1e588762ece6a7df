#!/usr/bin/env bash
# Side-by-side decode/prefill speed and peak memory of step35 and llama.cpp on the same
# GGUF, same threads, same machine, one run (issue: CPU speed). The two engines alternate
# per repetition so that drift in a shared VM hits both alike. Nothing of llama.cpp is in
# the repository: point LLAMA_BIN at a build of the peer (../shared/docs/peer.md).
# With IK_BIN set to a build of ik_llama.cpp (peer.md, "Second peer") its llama-bench runs
# in the same rounds as a third engine, with run-time repacking (-rtr 1, its fastest mode).
#
# usage: bench/compare_llama.sh MODEL.gguf
# env:   LLAMA_BIN (default /tmp/peer/llama.cpp/build/bin), IK_BIN (default: none),
#        STEP35 (default build/bin/step35),
#        THREADS (default "1 2"), ROUNDS (default 3), REPS per round (default 3),
#        PP (default 512), TG (default 128; either may be 0 to skip that test), STEP35_ARGS (extra step35 bench args)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
LLAMA_BIN="${LLAMA_BIN:-/tmp/peer/llama.cpp/build/bin}"
STEP35="${STEP35:-$here/build/bin/step35}"
THREADS="${THREADS:-1 2}"
ROUNDS="${ROUNDS:-3}"
REPS="${REPS:-3}"
PP="${PP:-512}"
TG="${TG:-128}"
[ $# -eq 1 ] || { sed -n '2,13p' "$0"; exit 2; }
model="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One measurement: prints "pp_tps tg_tps peak_rss_kib".
run_step35() {
  /usr/bin/time -f '%M' -o "$tmp/rss" "$STEP35" bench -m "$model" -p "$PP" -n "$TG" -t "$1" -r "$REPS" --json \
    ${STEP35_ARGS:-} > "$tmp/out.json" 2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  python3 - "$tmp/out.json" "$(cat "$tmp/rss")" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(j.get("pp", {}).get("tok_per_s", 0), j.get("tg", {}).get("tok_per_s", 0), sys.argv[2])  # PP=0 / TG=0: no test
PY
}
# run_llama THREADS [BIN_DIR [EXTRA_ARGS...]]: llama-bench of llama.cpp or of ik_llama.cpp.
run_llama() {
  local t="$1" bin="${2:-$LLAMA_BIN}"
  shift $(( $# < 2 ? $# : 2 ))
  /usr/bin/time -f '%M' -o "$tmp/rss" "$bin/llama-bench" -m "$model" -p "$PP" -n "$TG" -t "$t" -r "$REPS" \
    "$@" -o json > "$tmp/out.json" 2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  python3 - "$tmp/out.json" "$(cat "$tmp/rss")" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
print(pp[0] if pp else 0, tg[0] if tg else 0, sys.argv[2])
PY
}

echo "model: $model"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
echo "step35: $("$STEP35" --version 2>/dev/null | head -1) ($(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "llama.cpp: $LLAMA_BIN"
if [ -n "${IK_BIN:-}" ]; then echo "ik_llama.cpp: $IK_BIN (-rtr 1)"; fi
echo
for t in $THREADS; do
  : > "$tmp/s.txt"; : > "$tmp/l.txt"; : > "$tmp/k.txt"
  for ((r = 0; r < ROUNDS; ++r)); do
    run_step35 "$t" >> "$tmp/s.txt"
    run_llama "$t" >> "$tmp/l.txt"
    if [ -n "${IK_BIN:-}" ]; then run_llama "$t" "$IK_BIN" -rtr 1 >> "$tmp/k.txt"; fi
  done
  python3 - "$t" "$tmp/s.txt" "$tmp/l.txt" "$PP" "$TG" "$tmp/k.txt" <<'PY'
import statistics as st, sys
t, sf, lf, pp, tg, kf = sys.argv[1:7]
def load(f):
    rows = [list(map(float, l.split())) for l in open(f) if l.strip()]
    return [r[0] for r in rows], [r[1] for r in rows], max(r[2] for r in rows)
spp, stg, srss = load(sf)
lpp, ltg, lrss = load(lf)
ik = open(kf).read().strip() != ""
if ik:
    kpp, ktg, krss = load(kf)
def ms(v):
    return f"{st.mean(v):8.1f} ± {st.stdev(v) if len(v) > 1 else 0:5.1f}"
def ratio(a, b):
    return f"{st.mean(a)/st.mean(b):.2f}"
print(f"threads {t}: {len(spp)} rounds per engine")
if ik:
    print("| test | step35 t/s | llama.cpp t/s | ik_llama.cpp t/s | vs llama.cpp | vs ik_llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|")
    if pp != "0": print(f"| pp{pp} | {ms(spp)} | {ms(lpp)} | {ms(kpp)} | {ratio(spp, lpp)} | {ratio(spp, kpp)} |")
    if tg != "0": print(f"| tg{tg} | {ms(stg)} | {ms(ltg)} | {ms(ktg)} | {ratio(stg, ltg)} | {ratio(stg, ktg)} |")
    print(f"| peak RSS MiB | {srss/1024:8.0f} | {lrss/1024:8.0f} | {krss/1024:8.0f} | {srss/lrss:.2f} | {srss/krss:.2f} |")
else:
    print("| test | step35 t/s | llama.cpp t/s | ratio |")
    print("|---|---:|---:|---:|")
    if pp != "0": print(f"| pp{pp} | {ms(spp)} | {ms(lpp)} | {ratio(spp, lpp)} |")
    if tg != "0": print(f"| tg{tg} | {ms(stg)} | {ms(ltg)} | {ratio(stg, ltg)} |")
    print(f"| peak RSS MiB | {srss/1024:8.0f} | {lrss/1024:8.0f} | {srss/lrss:.2f} |")
print()
PY
done
