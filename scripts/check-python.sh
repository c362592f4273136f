#!/usr/bin/env bash
# Python static checks: ruff check, ruff format --check, mypy. Every check runs; the script fails if
# any failed. Configuration lives in pyproject.toml ([tool.ruff], [tool.mypy]); generated code
# (libs/common/connector/v1) and migrations are excluded there, not here.
# Usage: scripts/check-python.sh [PATH...]   (default: libs services)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(libs services)

fail=0
echo "check-python: ruff check ${paths[*]}"
"$venv/bin/ruff" check --no-cache "${paths[@]}" || fail=1
echo "check-python: ruff format --check ${paths[*]}"
"$venv/bin/ruff" format --check --no-cache "${paths[@]}" || fail=1
# Type-check the shipped code; tests and benchmarks are linted by ruff (pyproject excludes them from mypy).
typed=()
for p in "${paths[@]}"; do
  case "$p" in tests|tests/*|benchmarks|benchmarks/*) ;; *) typed+=("$p") ;; esac
done
if [ ${#typed[@]} -gt 0 ]; then
  echo "check-python: mypy ${typed[*]}"
  "$venv/bin/mypy" "${typed[@]}" || fail=1
fi
exit "$fail"
