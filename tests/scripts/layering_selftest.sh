#!/usr/bin/env bash
# scripts/check_layering.sh on small made-up trees: it accepts an include of a lower
# folder, and fails on an include of a higher folder and on a folder the README does not
# place. Usage: tests/scripts/layering_selftest.sh REPOSITORY_ROOT
set -uo pipefail
check="$1/scripts/check_layering.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/low" "$tmp/src/high"
printf '# x\n\n## Layout\n\n| folder | concept |\n|---|---|\n| `src/low/` | a |\n| `src/high/` | b |\n\n## Next\n' >"$tmp/README.md"
printf '#include <vector>\n#include "low/a.h"\n' >"$tmp/src/high/b.h"
printf '#pragma once\n' >"$tmp/src/low/a.h"
fail=0
expect() {  # expected-status description
  local out rc
  out="$(bash "$check" "$tmp" 2>&1)"
  rc=$?
  if [[ $rc -ne $1 ]]; then
    echo "FAIL: $2: exit status $rc, expected $1"
    echo "$out"
    fail=1
  else
    echo "ok: $2"
  fi
}
expect 0 "an include of a lower folder"
printf '#include "high/b.h"\n' >>"$tmp/src/low/a.h"
expect 1 "an include of a higher folder"
printf '#pragma once\n' >"$tmp/src/low/a.h"
mkdir -p "$tmp/src/unplaced"
expect 1 "a folder the README does not place"
exit $fail
