"""``connector ingress --processes N`` as real processes: N workers share one HTTP and one gRPC port
(SO_REUSEPORT), each registered; a worker killed with SIGKILL is replaced while the others keep
answering; SIGTERM stops every worker cleanly; a misconfiguration stops the supervisor instead of
restarting forever; ephemeral ports are refused."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg

from .conftest import SECRETS, github_headers, install_routes, receipt_count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port_pair() -> int:
    """A port p such that p and p + 1 are both free (worker metrics ports are base + index)."""
    for _ in range(100):
        base = _free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise AssertionError("no two adjacent free ports")


def _ingress_pids(db_url: str) -> set[int]:
    with psycopg.connect(db_url) as conn:
        return {
            int(r[0])
            for r in conn.execute(
                "SELECT pid FROM connector_process WHERE service = 'ingress'"
                " AND heartbeat_at > now() - interval '10 seconds'"
            ).fetchall()
        }


def _process_ids(db_url: str) -> set[str]:
    with psycopg.connect(db_url) as conn:
        return {str(r[0]) for r in conn.execute("SELECT process_id FROM connector_process").fetchall()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _post(port: int, delivery: str) -> int:
    body = b'{"a":1}'
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/webhooks/shop/github",
        data=body,
        headers={**github_headers(body, delivery=delivery), "Content-Type": "application/json"},
    )
    for _ in range(20):  # a connection cut by the killed worker is retried, as a provider would
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            time.sleep(0.05)
    return -1


def _metrics(port: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return bytes(r.read())
    except OSError:
        return b""


def _env(db_url: str) -> dict[str, str]:
    return {**os.environ, **SECRETS, "CONNECTOR_DATABASE_URL": db_url, "CONNECTOR_LOG_LEVEL": "INFO"}


def test_two_workers_share_the_ports_survive_a_kill_and_stop_on_sigterm(db_url: str) -> None:
    install_routes(db_url)
    http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port_pair()
    args = ["--processes", "2", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
            "--metrics-port", str(metrics_port)]  # fmt: skip
    sup = subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", "ingress", *args],
        env=_env(db_url),
        stderr=subprocess.PIPE,
        start_new_session=True,  # a failing test kills the whole group: no orphaned workers
    )
    try:
        pids = _wait(lambda: (p := _ingress_pids(db_url)) and len(p) == 2 and p, "two registered workers")
        assert sup.pid not in pids  # the supervisor itself serves nothing
        # Every worker has its own metrics endpoint: metrics port + worker index (served last).
        for port in (metrics_port, metrics_port + 1):
            assert b"connector_ingress" in _wait(lambda p=port: _metrics(p), f"metrics on {port}")
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: _post(http_port, f"a-{i}"), range(200)))
        assert answers == [200] * 200
        # SIGKILL one worker: the other keeps answering, the supervisor starts a replacement.
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            during = list(pool.map(lambda i: _post(http_port, f"b-{i}"), range(100)))
        assert during == [200] * 100
        replaced = _wait(
            lambda: (p := _ingress_pids(db_url) - {victim}) and len(p) == 2 and p, "a replacement worker"
        )
        assert victim not in replaced and (pids - {victim}) <= replaced
        assert sup.poll() is None
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=30) == 0
        logs = sup.stderr.read().decode() if sup.stderr else ""
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
    assert receipt_count(db_url) == 300  # every 200 answer is a durable receipt, exactly once
    for pid in replaced:
        assert not _alive(pid)
    with psycopg.connect(db_url) as conn:  # clean stops deregister; only the killed worker's row is left
        left = {
            int(r[0]) for r in conn.execute("SELECT pid FROM connector_process WHERE service = 'ingress'")
        }
    assert left == {victim}
    assert '"msg":"ingress worker exited; restarting"' in logs
    assert '"msg":"ingress supervisor stopped"' in logs
    assert not any(value in logs for value in SECRETS.values())


def test_a_worker_that_cannot_start_stops_the_supervisor(db_url: str) -> None:
    """The HTTP port is taken by a socket without SO_REUSEPORT: no worker can ever serve. The
    supervisor gives up after three failed starts of a worker instead of restarting forever."""
    install_routes(db_url)
    before = _process_ids(db_url)  # (the module's database may hold rows of earlier tests' killed workers)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http_port = taken.getsockname()[1]
        start = time.monotonic()
        sup = subprocess.run(
            [sys.executable, "-m", "connector.cli.main", "ingress", "--processes", "2", "--http-port",
             str(http_port), "--grpc-port", str(_free_port()), "--metrics-port", "0"],
            env=_env(db_url), capture_output=True, timeout=120,
        )  # fmt: skip
    assert sup.returncode == 1, sup.stderr.decode()[-2000:]
    assert b"keeps failing at start" in sup.stderr
    assert b"address already in use" in sup.stderr.lower()  # the worker's own log says why
    assert time.monotonic() - start < 60
    # The workers that did register stopped what they had started: no row of theirs is left.
    assert _process_ids(db_url) == before


def test_processes_need_fixed_ports(db_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "connector.cli.main", "ingress", "--workers", "2", "--http-port", "0"],
        env=_env(db_url), capture_output=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert b"needs fixed HTTP and gRPC ports" in out.stderr
