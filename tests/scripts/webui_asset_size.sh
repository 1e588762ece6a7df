#!/usr/bin/env bash
# The web pages' files (src/server/webui/) compressed one by one with gzip -9: prints each
# size and the total, and fails when the total is over LIMIT bytes.
# usage: tests/scripts/webui_asset_size.sh DIR LIMIT
set -euo pipefail
dir="$1"
limit="$2"
total=0
raw=0
for f in "$dir"/*; do
  [[ -f "$f" ]] || continue
  n=$(gzip -9 -c "$f" | wc -c)
  r=$(wc -c <"$f")
  printf '%8d %8d  %s\n' "$r" "$n" "$(basename "$f")"
  total=$((total + n))
  raw=$((raw + r))
done
printf '%8d %8d  total (bytes, then gzip -9 bytes; limit %d)\n' "$raw" "$total" "$limit"
if ((total > limit)); then
  echo "the web pages are ${total} bytes compressed, over the limit of ${limit}" >&2
  exit 1
fi
