#!/usr/bin/env bash
# Refresh the console screenshots shown in docs/console.md from real deliveries: `connector up` over a
# fresh database, `connector demo send` (and --fail: dead letters), a circuit opened and the pack paused
# with `connector admin`, a rollback and a cutover started, every page in Debian's chromium
# (scripts/console_screenshots.py; nothing is written into a table directly). The browser test's own
# screenshots (tests/console/test_browser.py, a seeded scene) stay CI artefacts under
# build/console-screenshots/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-browser.sh
.venv/bin/python scripts/console_screenshots.py --out docs/console "$@"
echo "docs/console/ refreshed"
