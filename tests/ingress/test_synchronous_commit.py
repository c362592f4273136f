"""An ack that survives failover, on demand (issue #26 item 1, ADR 020): with
``CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT`` the receipt batch commits with ``SET LOCAL
synchronous_commit`` at that level, and the ingress says whether the server can honour it.

A real primary + streaming standby (tests/support/pgpair.py) whose *server default* is
``synchronous_commit = local`` and whose ``synchronous_standby_names`` names the standby. Two real
ingress processes: A with ``CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT=on``, B unset (the server's local).

* While the standby is connected as ``sync``: A acks (200), is ready, and
  ``connector_db_synchronous_standby_ready{service="ingress"}`` is 1.
* Once the standby is stopped: A's next delivery waits for a standby that does not answer and is
  answered 503 ``commit_deadline`` (its commit is not acked as durable), A's ``/readyz`` turns 503 and
  the metric 0. The control, B, acked a delivery at once in the same state just before: the
  difference is the per-transaction level, not the server.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from connector.common.store import migrate
from tests.ingress.processes import wait_ready
from tests.support.pgpair import PgPair

from .conftest import SECRETS, github_headers, install_routes

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ingress:
    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.http_port = _free_port()
        self.metrics_port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(self.http_port)],
            env={
                **os.environ,
                **SECRETS,
                "CONNECTOR_DATABASE_URL": url,
                "CONNECTOR_INGRESS_GRPC_PORT": str(_free_port()),
                "CONNECTOR_INGRESS_METRICS_PORT": str(self.metrics_port),
                "CONNECTOR_INGRESS_RECONCILE_ENABLED": "false",
                "CONNECTOR_INGRESS_FIGURES_FLUSH_S": "0",
                "CONNECTOR_INGRESS_COMMIT_DEADLINE_S": "2",
                "CONNECTOR_SERVER_WATCH_INTERVAL_S": "0.2",
                **env,
            },
            stderr=subprocess.DEVNULL,
        )

    def post(self, delivery: str) -> tuple[int, dict[str, Any]]:
        body = b'{"a":1}'
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/webhooks/shop/github",
            data=body,
            headers={**github_headers(body, delivery=delivery), "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def readyz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/readyz", timeout=30) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def sync_ready(self) -> float | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        m = re.search(r'^connector_db_synchronous_standby_ready\{service="ingress"\} (\S+)$', text, re.M)
        return float(m.group(1)) if m else None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def pair() -> Iterator[PgPair]:
    with PgPair(settings={"synchronous_commit": "local"}) as p:
        p.synchronous(True)
        url = p.direct(p.primary.port)
        migrate.upgrade(url)
        install_routes(url)
        yield p


def test_acks_wait_for_the_synchronous_standby_and_readiness_says_when_there_is_none(pair: PgPair) -> None:
    url = pair.url("postgres", "postgres")
    a = Ingress(url, {"CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT": "on"})
    b = Ingress(url, {})
    try:
        wait_ready(a.proc, a.http_port, timeout=60)
        wait_ready(b.proc, b.http_port, timeout=60)
        assert a.post("sync-1")[0] == 200
        _until(lambda: a.sync_ready() == 1.0, "the metric never said 1 with a sync standby")
        assert b.sync_ready() is None  # not asked for: not exported

        pair.stop_standby()
        # Control first: the server's own level (local) acks at once without the standby. (After
        # A's commit starts waiting, B's would wait too: a committing NOTIFY holds PostgreSQL's
        # notification-queue lock until its synchronous-replication wait ends.)
        assert b.post("local-1")[0] == 200
        status, body = a.post("sync-2")
        print(f"\nstandby stopped: synchronous_commit=on answered {status} {body}")
        assert status == 503 and body.get("error") == "commit_deadline", (status, body)
        _until(lambda: a.sync_ready() == 0.0, "the metric never said 0 without a standby")
        _until(lambda: a.readyz() == 503, "/readyz stayed 200 without a synchronous standby")
    finally:
        a.stop()
        b.stop()
