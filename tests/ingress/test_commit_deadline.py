"""The ingress commit deadline (issue #26 item 2, ADR 020): a provider never waits on a silent database.

``connector ingress`` runs as a real process whose database URL goes through a TCP proxy process
(tests/support/netfault.py) in front of the real PostgreSQL. After one accepted delivery the proxy's
port is black-holed (iptables DROP both ways: the server gone silent, no RST). The next delivery
joins the commit queue, its batch's statement hangs on the silent connection, and the deadline
(2 s here, below the 6 s ``tcp_user_timeout`` so the reason tells which fired) answers it 503 +
Retry-After with ``commit_deadline`` while the batch still waits (gRPC: UNAVAILABLE, reason
``COMMIT_DEADLINE``), and ``/readyz`` says 503 (no
commit for a whole deadline while deliveries wait). Once the path is back, the provider's retry is
accepted (as new, or as a duplicate when the expired batch committed after all) and ``/readyz`` 200.

Control: deadline 0 and the TCP bounds off: the same request has no answer 15 s later.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest

from connector.common.core.grpc_server import error_info
from connector.v1 import ingress_service_pb2 as pb
from connector.v1 import ingress_service_pb2_grpc as pb_grpc
from tests.ingress.processes import wait_ready
from tests.support.netfault import ProxyProcess, blackhole_off, blackhole_on

from .conftest import NAMESPACE, SECRETS, github_headers, install_routes, receipt_count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _through(db_url: str, port: int) -> str:
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    params.update(host="127.0.0.1", port=str(port))
    return psycopg.conninfo.make_conninfo("", **params)


@pytest.fixture
def proxy(db_url: str) -> Iterator[ProxyProcess]:
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    p = ProxyProcess(int(params.get("port") or 5432), str(params.get("host") or "127.0.0.1")).start()
    try:
        yield p
    finally:
        blackhole_off(p.port)
        p.stop()


def _start_ingress(
    db_url: str, proxy: ProxyProcess, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int, int]:
    install_routes(db_url)
    http_port = _free_port()
    grpc_port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(http_port)],
        env={
            **os.environ,
            **SECRETS,
            "CONNECTOR_DATABASE_URL": _through(db_url, proxy.port),
            "CONNECTOR_INGRESS_GRPC_PORT": str(grpc_port),
            "CONNECTOR_INGRESS_METRICS_PORT": str(_free_port()),
            "CONNECTOR_INGRESS_RECONCILE_ENABLED": "false",
            "CONNECTOR_INGRESS_FIGURES_FLUSH_S": "0",
            "CONNECTOR_INGRESS_POOL_TIMEOUT_S": "30",
            **env,
        },
        stderr=subprocess.DEVNULL,
    )
    wait_ready(proc, http_port)
    return proc, http_port, grpc_port


def _submit_grpc(port: int, delivery: str) -> tuple[str, str | None]:
    """SubmitDelivery over gRPC: (status code name, refusal reason)."""
    body = b'{"a":1}'
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.IngressServiceStub(channel)
        try:
            stub.SubmitDelivery(
                pb.SubmitDeliveryRequest(
                    namespace=NAMESPACE,
                    route_key="github",
                    method="POST",
                    uri=f"/v1/webhooks/{NAMESPACE}/github",
                    headers={"Content-Type": "application/json", **github_headers(body, delivery=delivery)},
                    body=body,
                ),
                timeout=60,
            )
        except grpc.RpcError as exc:
            detail = error_info(exc)
            return exc.code().name, detail.reason if detail is not None else None
        return "OK", None


def _post(port: int, delivery: str, timeout: float) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = b'{"a":1}'
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/webhooks/shop/github",
        data=body,
        headers={**github_headers(body, delivery=delivery), "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_a_silent_database_answers_503_at_the_commit_deadline(db_url: str, proxy: ProxyProcess) -> None:
    proc, port, grpc_port = _start_ingress(db_url, proxy, {"CONNECTOR_INGRESS_COMMIT_DEADLINE_S": "2"})
    try:
        assert _post(port, "deadline-warm", 30)[0] == 200
        blackhole_on(proxy.port)
        started = time.monotonic()
        status, headers, body = _post(port, "deadline-1", 60)
        took = time.monotonic() - started
        print(f"\nsilent database: {status} {body} after {took:.1f} s (deadline 2 s)")
        assert status == 503 and body.get("error") == "commit_deadline", (status, body)
        assert int(headers["Retry-After"]) > 0
        assert _submit_grpc(grpc_port, "deadline-grpc") == ("UNAVAILABLE", "COMMIT_DEADLINE")
        # /readyz reports that commits are not progressing (not only whether a connection opens).
        assert _readyz(port) == 503
        blackhole_off(proxy.port)
        # The provider's retry once the database is reachable again: accepted (new or duplicate).
        deadline = time.monotonic() + 120
        while (answer := _post(port, "deadline-1", 60))[0] != 200:
            assert time.monotonic() < deadline, f"the retry was never accepted: {answer}"
            time.sleep(0.5)
        assert _readyz(port) == 200
    finally:
        proc.kill()
        proc.wait(10)
    # warm and deadline-1 once each; the gRPC one only if its expired batch committed after all.
    assert receipt_count(db_url) in (2, 3)


def test_control_without_the_deadline_and_tcp_bounds_the_request_hangs(
    db_url: str, proxy: ProxyProcess
) -> None:
    env = {
        "CONNECTOR_INGRESS_COMMIT_DEADLINE_S": "0",
        "CONNECTOR_DB_KEEPALIVES_IDLE_S": "0",
        "CONNECTOR_DB_KEEPALIVES_INTERVAL_S": "0",
        "CONNECTOR_DB_KEEPALIVES_COUNT": "0",
        "CONNECTOR_DB_TCP_USER_TIMEOUT_MS": "0",
        # The pool's statement timeout is the server's, which a silent server never sends.
    }
    proc, port, _ = _start_ingress(db_url, proxy, env)
    try:
        assert _post(port, "control-warm", 30)[0] == 200
        blackhole_on(proxy.port)
        with pytest.raises(TimeoutError):
            answer = _post(port, "control-1", 15)
            pytest.fail(f"the control was answered: {answer}")
        print("\nsilent database, control: no answer after 15 s")
    finally:
        blackhole_off(proxy.port)
        proc.kill()
        proc.wait(10)
