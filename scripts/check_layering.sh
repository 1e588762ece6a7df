#!/usr/bin/env bash
# Checks the folder layering of src/: the "Layout" section of README.md lists the folders
# of src/ from the bottom up, and a file in one of them may include headers only from its
# own folder and from folders listed before it. Prints every include that breaks the
# order (and every folder of src/ the README does not place) and exits 1; exits 0 when
# there is none. Usage: scripts/check_layering.sh [REPOSITORY_ROOT]
set -euo pipefail

root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
readme="$root/README.md"
[[ -f "$readme" ]] || { echo "check_layering: no README.md in $root" >&2; exit 2; }

# The order: table rows of the Layout section whose first cell is `src/NAME/`.
mapfile -t order < <(awk '/^## Layout/ { on = 1; next } on && /^## / { on = 0 } on' "$readme" |
                     sed -n 's#^| `src/\([A-Za-z0-9_]*\)/` .*#\1#p')
if [[ ${#order[@]} -eq 0 ]]; then
  echo "check_layering: README.md has no Layout table rows of the form | \`src/NAME/\` | ..." >&2
  exit 2
fi
declare -A level
for i in "${!order[@]}"; do level[${order[$i]}]=$i; done

failures=0
for dir in "$root"/src/*/; do
  name="$(basename "$dir")"
  if [[ -z "${level[$name]+set}" ]]; then
    echo "src/$name/ is not placed in README.md's Layout order (add a row | \`src/$name/\` | ... | where it belongs)"
    failures=$((failures + 1))
    continue
  fi
  own=${level[$name]}
  while IFS= read -r hit; do
    file="${hit%%:*}"
    rest="${hit#*:}"
    line="${rest%%:*}"
    target="$(sed -n 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([A-Za-z0-9_]*\)/.*|\1|p' <<<"${rest#*:}")"
    [[ -n "$target" && "$target" != "$name" ]] || continue
    if [[ -z "${level[$target]+set}" ]]; then
      [[ -d "$root/src/$target" ]] || continue  # not a folder of src/ (a library's header)
      echo "${file#"$root"/}:$line includes $target/, which README.md's Layout order does not place"
      failures=$((failures + 1))
    elif (( ${level[$target]} > own )); then
      echo "${file#"$root"/}:$line: src/$name/ includes src/$target/, which is above it in README.md's Layout order"
      failures=$((failures + 1))
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' -r "$dir" --include='*.h' --include='*.cpp' \
             --include='*.inc' || true)
done

if (( failures > 0 )); then
  echo "check_layering: $failures problem(s) with the layering (bottom up: ${order[*]})"
  exit 1
fi
echo "check_layering: src/ follows the layering (bottom up: ${order[*]})"
