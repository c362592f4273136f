"""Every bind host setting is honoured: ``connector ingress|materializer|executor`` as real processes.

Each service is started from the environment with port 0 (ephemeral) for every listener; its
"<service> started" log line names the bound ports, and the process's own listening sockets (psutil)
show the address each one is bound to. Three settings per service:

- defaults: every listener on 127.0.0.1;
- every ``*_HOST`` = 0.0.0.0: every listener on 0.0.0.0;
- one listener's host 0.0.0.0, the others 127.0.0.1 (one case per listener): catches a listener
  that follows another listener's host or a fixed one instead of its own setting (the ingress
  metrics endpoint used to bind the HTTP host; the executor's gRPC and metrics listeners always
  bound 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import pytest

ANY = "0.0.0.0"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Service:
    name: str
    prefix: str
    #: listener -> (host env var suffix, port env var suffix, log field with the bound port)
    listeners: dict[str, tuple[str, str, str]]


SERVICES = {
    "ingress": Service(
        "ingress",
        "CONNECTOR_INGRESS_",
        {
            "http": ("HTTP_HOST", "HTTP_PORT", "http_port"),
            "grpc": ("GRPC_HOST", "GRPC_PORT", "grpc_port"),
            "metrics": ("METRICS_HOST", "METRICS_PORT", "metrics_port"),
        },
    ),
    "materializer": Service(
        "materializer",
        "CONNECTOR_MATERIALIZER_",
        {
            "grpc": ("GRPC_HOST", "GRPC_PORT", "grpc_port"),
            "metrics": ("METRICS_HOST", "METRICS_PORT", "metrics_port"),
        },
    ),
    "executor": Service(
        "executor",
        "CONNECTOR_EXECUTOR_",
        {
            "grpc": ("GRPC_HOST", "GRPC_PORT", "grpc_port"),
            "metrics": ("METRICS_HOST", "METRICS_PORT", "metrics_port"),
        },
    ),
}


@contextmanager
def _running(service: Service, db_url: str, hosts: dict[str, str | None]) -> Iterator[tuple[int, dict]]:
    """Start ``connector <service>`` (hosts None = setting unset), yield (pid, started log record)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(service.prefix)}
    env["CONNECTOR_DATABASE_URL"] = db_url
    for listener, (host_var, port_var, _field) in service.listeners.items():
        env[service.prefix + port_var] = "0"
        host = hosts.get(listener)
        if host is not None:
            env[service.prefix + host_var] = host
    proc = subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", service.name],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = threading.Event()
    record: dict = {}
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if not started.is_set() and f'"msg":"{service.name} started"' in line:
                record.update(json.loads(line))
                started.set()
        started.set()  # stream closed: the process ended (checked below)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(60), "no start line within 60 s"
        assert record, f"{service.name} exited before it started: {''.join(lines)[-2000:]}"
        yield proc.pid, record
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)


def _ipv4_view(ip: str) -> str:
    """The IPv4 address a listening socket accepts on. gRPC core binds IPv4 hosts on a dual-stack
    IPv6 socket (``IPV6_V6ONLY`` off): ``0.0.0.0`` becomes ``::`` (every IPv4 and IPv6 address) and
    ``127.0.0.1`` becomes the v4-mapped ``::ffff:127.0.0.1`` (loopback only)."""
    if ip == "::":
        return ANY
    return ip.removeprefix("::ffff:")


def _listening(pid: int) -> dict[int, str]:
    """Port -> bound (IPv4) address of every TCP socket the process listens on."""
    return {
        c.laddr.port: _ipv4_view(c.laddr.ip)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def _cases() -> Iterator[object]:
    for name, svc in SERVICES.items():
        names = list(svc.listeners)
        yield pytest.param(name, dict.fromkeys(names), id=f"{name}-defaults")
        yield pytest.param(name, dict.fromkeys(names, ANY), id=f"{name}-all-any")
        # One listener on 0.0.0.0, the others on 127.0.0.1: a listener that follows another
        # listener's host (or a fixed one) instead of its own setting fails one of these.
        for only in names:
            hosts = {n: (ANY if n == only else LOOPBACK) for n in names}
            yield pytest.param(name, hosts, id=f"{name}-only-{only}-any")


@pytest.mark.parametrize(("name", "hosts"), list(_cases()))
def test_every_listener_binds_its_own_host_setting(db_url: str, name: str, hosts: dict) -> None:
    service = SERVICES[name]
    with _running(service, db_url, hosts) as (pid, started):
        listening = _listening(pid)
        bound = {}
        for listener, (_host_var, _port_var, field) in service.listeners.items():
            port = int(started[field])
            assert port > 0, f"{listener}: no bound port in the start line"
            assert port in listening, f"{listener} port {port} is not listening: {listening}"
            bound[listener] = listening[port]
    expected = {listener: host or LOOPBACK for listener, host in hosts.items()}
    assert bound == expected
    # No listener of the service is left out of the settings (every open port is one of them).
    assert sorted(listening) == sorted(int(started[f]) for _h, _p, f in service.listeners.values())
