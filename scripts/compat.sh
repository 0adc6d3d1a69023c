#!/usr/bin/env bash
# Drift: agent CLIs change weekly. Runs each supervised CLI's tests (the real CLI against
# its scripted fake API) against the newest version published on npm, beside the version
# ralph-dev pins, and prints a version matrix: what passed, what broke. The README shows
# the last one (README.md, "Agent CLI versions").
#
#   scripts/compat.sh                 # every CLI's newest version
#   scripts/compat.sh codex           # one CLI
#   RALPH_DEV_COMPAT_PINNED=1 scripts/compat.sh   # the pinned versions again too (CI runs
#                                                 # them already: scripts/test.sh)
#   RALPH_DEV_COMPAT_VERSIONS="codex=0.172.0" scripts/compat.sh codex   # a given version
#
# Each version is installed once under ~/.cache/ralph-dev/compat/NAME-VERSION, the
# tests' whole output left in NAME-VERSION.log beside it. The tests
# run with RALPH_DEV_COMPAT=1, which lets a CLI test take a version other than the pinned
# one. Exit status: 0 when every newest version passed, 1 otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh --test >/dev/null
export PATH="$ROOT/.venv/bin:$HOME/.local/bin:$PATH"
export RALPH_DEV_LINEAR_SCHEMA=${RALPH_DEV_LINEAR_SCHEMA:-$ROOT/../shared/linear/schema.graphql}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/ralph-dev/compat
PINNED_CLAUDE=$(sed -n 's/^CLAUDE_CODE_VERSION=\([^ ]*\).*/\1/p' scripts/setup.sh)
PINNED_CODEX=$(sed -n 's/^CODEX_VERSION=\([^ ]*\).*/\1/p' scripts/setup.sh)
PINNED_GEMINI=$(sed -n 's/^GEMINI_VERSION=\([^ ]*\).*/\1/p' scripts/setup.sh)

# name|npm package|program|variable the tests read|pinned|its tests
CLIS=(
  "claude|@anthropic-ai/claude-code|claude|RALPH_DEV_CLAUDE_BIN|$PINNED_CLAUDE|tests/test_claude_smoke.py tests/test_claude_limits.py tests/test_claude_questions.py"
  "codex|@openai/codex|codex|RALPH_DEV_CODEX_BIN|$PINNED_CODEX|tests/test_codex_smoke.py"
  "gemini|@google/gemini-cli|gemini|RALPH_DEV_GEMINI_BIN|$PINNED_GEMINI|tests/test_gemini_smoke.py"
)

wanted_version() {  # NAME PACKAGE: RALPH_DEV_COMPAT_VERSIONS's, else npm's newest
  local name=$1 package=$2 pair
  for pair in ${RALPH_DEV_COMPAT_VERSIONS:-}; do
    if [ "${pair%%=*}" = "$name" ]; then echo "${pair#*=}"; return; fi
  done
  npm view "$package" version 2>/dev/null || echo "unknown"
}

install_version() {  # PACKAGE VERSION PROGRAM DIR: the program's path, installed once
  local package=$1 version=$2 program=$3 dir=$4
  if [ ! -x "$dir/node_modules/.bin/$program" ]; then
    mkdir -p "$dir"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "$package@$version" >/dev/null)
  fi
  echo "$dir/node_modules/.bin/$program"
}

run_tests() {  # LOG VARIABLE PROGRAM TESTS...: "N passed, M failed" from pytest's summary,
  # and the tests that broke; the whole output in LOG
  local log=$1 variable=$2 program=$3 summary broke
  shift 3
  env "$variable=$program" RALPH_DEV_COMPAT=1 \
    python -m pytest -q -p no:cacheprovider -n "${RALPH_DEV_TEST_WORKERS:-2}" "$@" >"$log" 2>&1 || true
  summary=$(tail -n 1 "$log")
  broke=$(sed -n 's/^\(FAILED\|ERROR\) tests\/\([^ ]*\).*/\2/p' "$log" | sed 's/.*:://' | paste -sd, - | sed 's/,/, /g')
  echo "$(echo "${summary//=/}" | sed 's/^ *//; s/ in [0-9.]*s.*$//')${broke:+ (broke: $broke)}"
}

only=${1:-}
rows=()
broke=0
for entry in "${CLIS[@]}"; do
  IFS='|' read -r name package program variable pinned tests <<<"$entry"
  [ -z "$only" ] || [ "$only" = "$name" ] || continue
  newest=$(wanted_version "$name" "$package")
  pinned_result="tested by scripts/test.sh"
  if [ "${RALPH_DEV_COMPAT_PINNED:-0}" = 1 ]; then
    # shellcheck disable=SC2086  # the test files are words
    pinned_result=$(run_tests "$CACHE/$name-$pinned.log" "$variable" \
      "$(install_version "$package" "$pinned" "$program" "$CACHE/$name-$pinned")" $tests)
  fi
  if [ "$newest" = "unknown" ]; then
    newest_result="npm view $package failed: no registry?"
    broke=1
  elif [ "$newest" = "$pinned" ]; then
    newest_result="(the pinned one)"
  else
    # shellcheck disable=SC2086
    newest_result=$(run_tests "$CACHE/$name-$newest.log" "$variable" \
      "$(install_version "$package" "$newest" "$program" "$CACHE/$name-$newest")" $tests)
    case "$newest_result" in *failed*|*error*|"") broke=1 ;; esac
  fi
  rows+=("| $name | $pinned: $pinned_result | $newest: $newest_result |")
done

echo "Agent CLI versions, $(date -u +%Y-%m-%d) (scripts/compat.sh):"
echo
echo "| CLI | pinned | newest on npm |"
echo "| --- | --- | --- |"
printf '%s\n' "${rows[@]}"
exit "$broke"
