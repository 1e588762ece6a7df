#!/usr/bin/env bash
# Long-context speed and memory of step35 and llama.cpp side by side (issue 21): prefill and
# decode after DEPTH tokens already in the cache, per KV cache type, same GGUF, threads and
# machine, the two engines alternating per round. Both run flash-style attention (llama.cpp
# with -fa 1, as its default and as a quantized V cache requires). Nothing of llama.cpp is in
# the repository: point LLAMA_BIN at a build of the peer (../shared/docs/peer.md).
#
# The benchmark model with a 64K context (the generator's --ctx 65536; ~40 s, then the
# Q4_K_M conversion; llama-quantize gives the same bytes):
#   python3 ../shared/tools/make_tiny_step35.py --out /tmp/bench/medium-ctx64k-f16.gguf \
#     --name step35-medium-bench --seed 7 --layers 12 --embd 1024 --heads-full 16 --heads-swa 24 \
#     --kv-heads 2 --head-dim 128 --experts 64 --top-k 8 --dense-layers 2 --ff 2816 --moe-ff 256 \
#     --window 512 --mtp-layers 1 --vocab-pad 16384 --ctx 65536 --dtype f16 --fast --quiet
#   build/bin/step35 quantize /tmp/bench/medium-ctx64k-f16.gguf /tmp/bench/medium-ctx64k-q4_k_m.gguf Q4_K_M
#
# The commands (per type T and round):
#   step35:    step35 bench -m M -t 2 -ctk T -ctv T -d 0,8192,32768 -p 512 -n 64 -r REPS --json
#              step35 bench -m M -t 2 -ctk T -ctv T -p 4096,8192 -n 0 -r REPS --json
#   llama.cpp: llama-bench -m M -t 2 -fa 1 -ctk T -ctv T -d 0,8192,32768 -p 512 -n 64 -r REPS -o json
#              llama-bench -m M -t 2 -fa 1 -ctk T -ctv T -p 4096,8192 -n 0 -r REPS -o json
#   ik_llama.cpp (IK_BIN set): llama-bench -m M -t 2 -fa 1 -rtr 1 -ctk T -ctv T -p 4096 -n 0 -r REPS -o json
# Peak RSS of each depth run comes from /usr/bin/time (the depth-32768 run is the largest).
#
# usage: bench/compare_depth.sh MODEL.gguf
# env:   LLAMA_BIN (default /tmp/peer/llama.cpp/build/bin), IK_BIN (ik_llama.cpp's bin folder;
#        unset: skipped), STEP35 (default build/bin/step35), THREADS (default 2), TYPES
#        (default "f16 q8_0"), DEPTHS (default 0,8192,32768), PP (default 512), TG (default
#        64), LONG_PP (default 4096,8192), ROUNDS (default 2), REPS per round (default 3)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
LLAMA_BIN="${LLAMA_BIN:-/tmp/peer/llama.cpp/build/bin}"
STEP35="${STEP35:-$here/build/bin/step35}"
THREADS="${THREADS:-2}"
TYPES="${TYPES:-f16 q8_0}"
DEPTHS="${DEPTHS:-0,8192,32768}"
PP="${PP:-512}"
TG="${TG:-64}"
LONG_PP="${LONG_PP:-4096,8192}"
ROUNDS="${ROUNDS:-2}"
REPS="${REPS:-3}"
[ $# -eq 1 ] || { sed -n '2,31p' "$0"; exit 2; }
model="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Each run appends lines "ENGINE TYPE TEST TOK_PER_S" to $tmp/results and
# "ENGINE TYPE RUN PEAK_RSS_KIB" to $tmp/rss.
step35_run() {  # TYPE NAME ARGS...
  local type="$1" name="$2"; shift 2
  /usr/bin/time -f '%M' -o "$tmp/t" "$STEP35" bench -m "$model" -t "$THREADS" -ctk "$type" -ctv "$type" -r "$REPS" \
    --json "$@" > "$tmp/out.json" 2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  echo "step35 $type $name $(cat "$tmp/t")" >> "$tmp/rss"
  python3 - "$tmp/out.json" "$type" >> "$tmp/results" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for name, e in j["tests"].items():
    print("step35", sys.argv[2], name.replace(" ", ""), e["tok_per_s"])
PY
}
llama_run() {  # BIN_DIR ENGINE TYPE NAME ARGS...
  local bin="$1" engine="$2" type="$3" name="$4"; shift 4
  /usr/bin/time -f '%M' -o "$tmp/t" "$bin/llama-bench" -m "$model" -t "$THREADS" -fa 1 -ctk "$type" -ctv "$type" \
    -r "$REPS" -o json "$@" > "$tmp/out.json" 2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  echo "$engine $type $name $(cat "$tmp/t")" >> "$tmp/rss"
  python3 - "$tmp/out.json" "$type" "$engine" >> "$tmp/results" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    test = f"pp{r['n_prompt']}" if r["n_prompt"] > 0 else f"tg{r['n_gen']}"
    if r.get("n_depth", 0) > 0:
        test += f"@d{r['n_depth']}"
    print(sys.argv[3], sys.argv[2], test, r["avg_ts"])
PY
}

echo "model: $model"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "step35: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'); llama.cpp: $LLAMA_BIN${IK_BIN:+; ik_llama.cpp: $IK_BIN}"
echo "threads $THREADS, $ROUNDS rounds x $REPS repetitions per engine"
echo
: > "$tmp/results"; : > "$tmp/rss"
for ((r = 0; r < ROUNDS; ++r)); do
  for type in $TYPES; do
    step35_run "$type" depth -d "$DEPTHS" -p "$PP" -n "$TG"
    llama_run "$LLAMA_BIN" llama.cpp "$type" depth -d "$DEPTHS" -p "$PP" -n "$TG"
    step35_run "$type" long -p "$LONG_PP" -n 0
    llama_run "$LLAMA_BIN" llama.cpp "$type" long -p "$LONG_PP" -n 0
    if [ -n "${IK_BIN:-}" ]; then llama_run "$IK_BIN" ik_llama.cpp "$type" long -rtr 1 -p "$LONG_PP" -n 0; fi
  done
done
python3 - "$tmp/results" "$tmp/rss" <<'PY'
import collections, statistics as st, sys
res = collections.defaultdict(list)
for line in open(sys.argv[1]):
    engine, typ, test, tps = line.split()
    res[(typ, test, engine)].append(float(tps))
rss = collections.defaultdict(int)
for line in open(sys.argv[2]):
    engine, typ, run, kib = line.split()
    rss[(typ, run, engine)] = max(rss[(typ, run, engine)], int(kib))
types = sorted({k[0] for k in res}, key=lambda t: ["f32", "f16", "bf16", "q8_0", "q4_0"].index(t) if t in ["f32", "f16", "bf16", "q8_0", "q4_0"] else 9)
def key(test):
    kind, _, depth = test.partition("@d")
    return (int(depth or 0), kind[:2], int(kind[2:]))
for typ in types:
    tests = sorted({k[1] for k in res if k[0] == typ}, key=key)
    has_ik = any(k[2] == "ik_llama.cpp" and k[0] == typ for k in res)
    print(f"### KV cache {typ}\n")
    print("| test | step35 t/s | llama.cpp t/s | ratio |" + (" ik_llama.cpp t/s | ratio |" if has_ik else ""))
    print("|---|---:|---:|---:|" + ("---:|---:|" if has_ik else ""))
    for test in tests:
        s, l, i = (res.get((typ, test, e), []) for e in ("step35", "llama.cpp", "ik_llama.cpp"))
        def m(v):
            return f"{st.mean(v):.1f} ± {st.stdev(v) if len(v) > 1 else 0:.1f}" if v else "—"
        ratio = f"{st.mean(s) / st.mean(l):.2f}" if s and l else "—"
        row = f"| {test.replace('@d', ' @ d')} | {m(s)} | {m(l)} | {ratio} |"
        if has_ik:
            row += f" {m(i)} | {st.mean(s) / st.mean(i):.2f} |" if s and i else " — | — |"
        print(row)
    s, l = rss.get((typ, "depth", "step35"), 0), rss.get((typ, "depth", "llama.cpp"), 0)
    if s and l:
        print(f"| peak RSS of the depth run (MiB) | {s / 1024:.0f} | {l / 1024:.0f} | {s / l:.2f} |")
    print()
PY
