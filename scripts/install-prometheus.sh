#!/bin/sh
# Install Prometheus and promtool from Debian's `prometheus` package (used by the metrics, rules and
# live-Prometheus tests, and by CI on a fresh machine). Idempotent: does nothing when both binaries
# are already on PATH. Fails loudly (non-zero exit, message on stderr) when they cannot be installed.
set -eu

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo -n"
else
    echo "install-prometheus.sh: promtool/prometheus missing and not root (no sudo): install Debian's 'prometheus' package" >&2
    exit 1
fi

# Serialise concurrent installers (several test processes may call this at once).
exec 9>/tmp/connector-apt-prometheus.lock
flock 9
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# The package's postinst starts a service where an init system runs; the binaries are all we need.
if ! $SUDO apt-get install -y --no-install-recommends prometheus >/tmp/connector-apt-prometheus.log 2>&1; then
    $SUDO apt-get update >>/tmp/connector-apt-prometheus.log 2>&1 || true
    if ! $SUDO apt-get install -y --no-install-recommends prometheus >>/tmp/connector-apt-prometheus.log 2>&1; then
        echo "install-prometheus.sh: apt-get install prometheus failed; see /tmp/connector-apt-prometheus.log" >&2
        tail -n 20 /tmp/connector-apt-prometheus.log >&2
        exit 1
    fi
fi

for bin in promtool prometheus; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "install-prometheus.sh: '$bin' not on PATH after installing the prometheus package" >&2
        exit 1
    fi
done
