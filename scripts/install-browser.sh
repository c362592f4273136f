#!/usr/bin/env bash
# The console's browser tests (tests/console/test_browser.py) drive Debian's chromium through
# Playwright (the Python package brings its driver, never a browser). Installs chromium and
# chromium-driver with apt when /usr/bin/chromium is missing and this runs as root (CI, a fresh
# machine); otherwise says what to install. Never fails the caller: the browser tests fail with the
# same message if there is no browser.
set -uo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "install-browser: installing chromium and chromium-driver (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  if apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
    echo "install-browser: $(/usr/bin/chromium --version 2>/dev/null || echo 'chromium installed')" >&2
    exit 0
  fi
  echo "install-browser: apt-get install chromium chromium-driver FAILED" >&2
  exit 0
fi
echo "install-browser: no /usr/bin/chromium: install Debian's chromium (apt-get install chromium chromium-driver) to run the console's browser tests" >&2
exit 0
