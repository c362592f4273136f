#!/usr/bin/env bash
# The failover tests (tests/failover/) need iptables (a black-holed port: a silent server), and for
# their real-HA scenario Debian's patroni and etcd-server. Installs what is missing with apt when this
# runs as root (CI, a fresh machine), under `flock /tmp/apt.lock` (several users share dpkg here);
# otherwise says what to install. Never fails the caller: the tests say what is missing themselves.
# The packages' own services are not started (no systemd here; the tests run their own etcd and
# Patroni as the postgres user on free ports).
set -uo pipefail
missing=()
command -v iptables >/dev/null || [ -x /usr/sbin/iptables-nft ] || [ -x /usr/sbin/iptables-legacy ] || missing+=(iptables)
[ -x /usr/bin/patroni ] || missing+=(patroni)
[ -x /usr/bin/etcd ] || missing+=(etcd-server)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "install-failover: installing ${missing[*]} (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d 101: the packages' postinst must not start etcd or patroni as system services.
  (
    flock 9
    rc_policy=/usr/sbin/policy-rc.d
    created=0
    if [ ! -e "$rc_policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$rc_policy" && chmod +x "$rc_policy" && created=1; fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1; apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } \
      || echo "install-failover: apt-get install ${missing[*]} FAILED" >&2
    [ "$created" = 1 ] && rm -f "$rc_policy"
  ) 9>/tmp/apt.lock
  exit 0
fi
echo "install-failover: missing ${missing[*]}: apt-get install ${missing[*]} to run tests/failover" >&2
exit 0
