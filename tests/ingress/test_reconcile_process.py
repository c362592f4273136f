"""Reconciliation with ``connector ingress`` as real processes (docs/reconcile.md): the database
stopped for the ingress (a proxy cut), deliveries refused, then recovered by the next pass with
exactly one receipt each; a reconciler killed with -9 in the middle of a pass, and the next process
resuming from the checkpoint with nothing listed twice, skipped or duplicated.

The fake sender API (``fake_provider``) and the database proxy run in the test's event loop; the
blocking waits on the processes run in threads so they keep serving."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psycopg
import pytest
import stripe

from tests.ingress.processes import wait_ready

from .conftest import NAMESPACE, SECRETS, install_routes
from .fake_provider import TOKEN, FakeProvider
from .proxy import TcpProxy
from .test_reconcile import TOKEN_ENV, by_delivery, state, stripe_route


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ingress:
    """One ``connector ingress`` process."""

    def __init__(self, db_url: str) -> None:
        self.http_port = _free_port()
        env = {
            **os.environ,
            **SECRETS,
            TOKEN_ENV: TOKEN,
            "CONNECTOR_DATABASE_URL": db_url,
            "CONNECTOR_INGRESS_GRPC_PORT": str(_free_port()),
            "CONNECTOR_INGRESS_METRICS_PORT": str(_free_port()),
            "CONNECTOR_INGRESS_RECONCILE_TICK_S": "0.2",
            "CONNECTOR_INGRESS_POOL_TIMEOUT_S": "1",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(self.http_port)],
            env=env,
            stderr=subprocess.PIPE,
        )

    async def ready(self) -> None:
        await asyncio.to_thread(wait_ready, self.proc, self.http_port)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.stderr.read().decode() if self.proc.stderr else ""


@pytest.fixture
def processes() -> Iterator[list[Ingress]]:
    started: list[Ingress] = []
    yield started
    for p in started:
        p.stop()


async def wait_db(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


def reconciled_since(db_url: str, route: str, seconds: float) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO connector_reconcile_state (namespace, route_key, created_at)"
            " VALUES (%s, %s, now() - make_interval(secs => %s))",
            (NAMESPACE, route, seconds),
        )


async def test_deliveries_refused_while_the_database_was_stopped_are_recovered_once_each(
    db_url: str, provider: FakeProvider, processes: list[Ingress]
) -> None:
    parts = urlsplit(db_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    install_routes(db_url, [stripe_route(provider.url)])
    ingress = Ingress(proxy.url(db_url))
    processes.append(ingress)
    try:
        await ingress.ready()
        await wait_db(lambda: (state(db_url, "stripe") or {}).get("last_clean_pass_at") is not None)
        await proxy.cut()  # the database is gone for the ingress
        refused: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as http:
            for n in range(6):
                event = provider.add_event(f"evt_stopped_{n}", int(time.time()))
                body = json.dumps(event, indent=2)
                header = stripe.WebhookSignature.generate_signature_header(body, SECRETS["INGRESS_T_STRIPE"])
                url = f"http://127.0.0.1:{ingress.http_port}/v1/webhooks/{NAMESPACE}/stripe"
                async with http.post(
                    url,
                    data=body.encode(),
                    headers={"Stripe-Signature": header, "Content-Type": "application/json"},
                ) as r:
                    assert r.status == 503, await r.text()
                refused.append(event)
        assert by_delivery(db_url) == {}  # nothing of them was made durable
        cleaned = (state(db_url, "stripe") or {})["last_clean_pass_at"]
        await proxy.restore()
        await wait_db(lambda: len(by_delivery(db_url)) == len(refused))
        # One more clean pass after the recovery: still exactly one receipt each.
        await wait_db(lambda: (state(db_url, "stripe") or {}).get("last_clean_pass_at") != cleaned)
        await wait_db(lambda: (state(db_url, "stripe") or {}).get("last_clean_pass_at") != cleaned)
        rows = by_delivery(db_url)
        assert sorted(rows) == sorted(e["id"] for e in refused)
        assert all(len(v) == 1 and v[0]["origin"] == "reconciled" for v in rows.values()), rows
    finally:
        logs = ingress.stop()
        await proxy.cut()
    assert TOKEN not in logs and SECRETS["INGRESS_T_STRIPE"] not in logs


async def test_kill_9_mid_pass_resumes_from_the_checkpoint(
    db_url: str, provider: FakeProvider, processes: list[Ingress]
) -> None:
    now = int(time.time())
    events = [provider.add_event(f"evt_k_{n}", now - 60 + n) for n in range(9)]  # 3 pages of 3
    install_routes(db_url, [stripe_route(provider.url, interval="1h")])
    reconciled_since(db_url, "stripe", 3600)
    provider.gate[2] = asyncio.Event()  # page 2 is held: the pass stops in the middle
    provider.gate_reached[2] = asyncio.Event()
    first = Ingress(db_url)
    processes.append(first)
    await first.ready()
    await asyncio.wait_for(provider.gate_reached[2].wait(), 60)
    await wait_db(lambda: (state(db_url, "stripe") or {}).get("pass_cursor") is not None)
    checkpoint = state(db_url, "stripe")
    assert checkpoint is not None
    assert checkpoint["pass_cursor"] == events[-3]["id"]  # newest first: page 1 ends at the 7th
    assert sorted(by_delivery(db_url)) == sorted(e["id"] for e in events[-3:])
    first.proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(first.proc.wait, 20)
    listed_before = len(provider.requests)

    second = Ingress(db_url)
    processes.append(second)
    await second.ready()
    await wait_db(lambda: len(by_delivery(db_url)) == len(events))
    await wait_db(lambda: (state(db_url, "stripe") or {}).get("pass_cursor") is None)
    rows = by_delivery(db_url)
    assert all(len(v) == 1 for v in rows.values()), rows
    after = [r for r in provider.requests[listed_before:] if r.path == "/v1/events"]
    # The second process resumed at the checkpoint: page 1 was never listed again.
    assert after and after[0].query.get("starting_after") == checkpoint["pass_cursor"], after
    final = state(db_url, "stripe")
    assert final is not None and final["watermark"] is not None and final["last_error_class"] is None
    provider.gate[2].set()
