#!/usr/bin/env bash
# Proto contract checks: buf lint (STANDARD, buf.yaml), buf breaking (FILE) against a git base, and
# drift of the committed generated Python (libs/common/connector/v1) against a fresh regeneration.
#
# buf comes from the npm registry (@bufbuild/buf, pinned below) into .tools/ (git-ignored); set BUF
# to use another binary. BUF_BREAKING_AGAINST is a buf input to compare with (default: the previous
# commit, ".git#ref=HEAD~1"; on a branch use e.g. ".git#branch=main"); "none" skips the breaking
# check, loudly. Usage: scripts/check-protos.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=1.75.0
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHON

buf="${BUF:-.tools/node_modules/.bin/buf}"
if [ -z "${BUF:-}" ] && { [ ! -x "$buf" ] || [ "$("$buf" --version 2>/dev/null)" != "$BUF_VERSION" ]; }; then
  command -v npm >/dev/null || { echo "check-protos: npm is needed to install buf (@bufbuild/buf)" >&2; exit 1; }
  echo "check-protos: installing @bufbuild/buf@$BUF_VERSION into .tools/"
  npm install --prefix .tools --no-audit --no-fund --silent "@bufbuild/buf@$BUF_VERSION" >&2
fi

fail=0

echo "check-protos: buf lint (STANDARD)"
"$buf" lint || fail=1

against="${BUF_BREAKING_AGAINST:-.git#ref=HEAD~1}"
if [ "$against" = none ]; then
  echo "check-protos: buf breaking SKIPPED (BUF_BREAKING_AGAINST=none)"
elif [ "$against" = ".git#ref=HEAD~1" ] && ! git rev-parse -q --verify 'HEAD~1^{commit}' >/dev/null 2>&1; then
  echo "check-protos: buf breaking SKIPPED (no previous commit in this clone: shallow or first commit)"
else
  echo "check-protos: buf breaking (FILE) against $against"
  "$buf" breaking --against "$against" || fail=1
fi

echo "check-protos: generated code drift (scripts/gen-protos.sh vs libs/common/connector/v1)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
scripts/gen-protos.sh "$tmp"
if ! diff -rq -x __pycache__ "$tmp/connector/v1" libs/common/connector/v1; then
  echo "check-protos: generated code is out of date: run ./dev protos and commit the result" >&2
  fail=1
fi

exit "$fail"
