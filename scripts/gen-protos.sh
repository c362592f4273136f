#!/usr/bin/env bash
# Regenerate connector.v1 Python code from protos/ (grpcio-tools; buf has no local grpc-python plugin).
# Usage: scripts/gen-protos.sh [OUT_DIR]   (default: libs/common, i.e. libs/common/connector/v1)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-libs/common}"
py="${PYTHON:-.venv/bin/python}"
mkdir -p "$out/connector/v1"
"$py" -m grpc_tools.protoc -I protos \
  --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" \
  protos/connector/v1/*.proto
[ -f "$out/connector/v1/__init__.py" ] || printf '"""Generated from protos/connector/v1 (scripts/gen-protos.sh). Do not edit."""\n' > "$out/connector/v1/__init__.py"
