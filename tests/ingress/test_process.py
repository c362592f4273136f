"""``connector ingress`` as a real process: starts from the environment, registers in
``connector_process``, serves, stops on SIGTERM (and deregisters)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import psycopg

from tests.ingress.processes import wait_ready

from .conftest import SECRETS, github_headers, install_routes, receipt_count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _registered(db_url: str, pid: int) -> list[tuple[str, str]]:
    with psycopg.connect(db_url) as conn:
        return [
            (str(r[0]), str(r[1]))
            for r in conn.execute(
                "SELECT service, claim_capability FROM connector_process WHERE pid = %s", (pid,)
            ).fetchall()
        ]


def test_connector_ingress_process_serves_and_stops_on_sigterm(db_url: str) -> None:
    install_routes(db_url)
    http_port = _free_port()
    env = {
        **os.environ,
        **SECRETS,
        "CONNECTOR_DATABASE_URL": db_url,
        "CONNECTOR_INGRESS_GRPC_PORT": str(_free_port()),
        "CONNECTOR_INGRESS_METRICS_PORT": str(_free_port()),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(http_port)],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(proc, http_port)
        body = b'{"a":1}'
        request = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/v1/webhooks/shop/github",
            data=body,
            headers={**github_headers(body, delivery="proc-1"), "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
        assert _registered(db_url, proc.pid) == [("ingress", "none")]  # registered before ready
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        logs = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert receipt_count(db_url) == 1
    assert _registered(db_url, proc.pid) == []  # deregistered on the clean stop
    assert '"msg":"ingress started"' in logs and '"msg":"ingress stopped"' in logs
    assert not any(value in logs for value in SECRETS.values())
