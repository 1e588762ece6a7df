#!/usr/bin/env bash
# Prints the option tables of README's command-line reference, made from the binary's own
# --help texts: one markdown table per subcommand, each row `names VALUE` | help (default).
# The README's tables must be exactly these (tests/test_cli.cpp: Cli.ReadmeMatchesHelp), so
# after changing a flag, paste this script's output for that command into the README.
# Usage: scripts/cli_reference.sh [STEP35_BINARY [COMMAND ...]]
set -euo pipefail
bin="${1:-build/bin/step35}"
shift || true
commands=("$@")
if [[ ${#commands[@]} -eq 0 ]]; then
  mapfile -t commands < <("$bin" --help 2>&1 | sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p')
fi
for cmd in "${commands[@]}"; do
  echo "### \`step35 $cmd\`"
  echo
  echo "| option | meaning |"
  echo "|---|---|"
  # After "options:", each flag is a line "  NAMES [VALUE]" followed by "      HELP".
  "$bin" "$cmd" --help | awk '
    /^options:/ { on = 1; next }
    !on { next }
    /^      / { sub(/^      /, ""); gsub(/\|/, "\\|"); if (names != "-h, --help") print "| `" names "` | " $0 " |"; next }
    /^  -/ { names = substr($0, 3); gsub(/\|/, "\\|", names) }'
  echo
done
