#!/usr/bin/env bash
# Refresh the console screenshots shown in docs/console.md: run the browser test (it writes every
# page at 1280 px light and dark and at 390 px into build/console-screenshots/), then copy the ones
# the document shows into docs/console/. The scene is tests/console/stage.py: seeded data, no secret.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -p no:cacheprovider tests/console/test_browser.py
mkdir -p docs/console
for name in overview-1280 overview-1280-dark deliveries-1280 delivery-1280 delivery-390 failures-1280 \
  failure-group-1280 bulk-estimate-1280 bulk-job-1280 lanes-1280 cutover-1280 processes-1280 lanes-390; do
  cp "build/console-screenshots/$name.png" "docs/console/$name.png"
done
echo "docs/console/ refreshed"
