"""The ingress registers in ``connector_process`` (service ``ingress``, claim capability ``none``) on
its own pool while it runs, heartbeats on the database clock, and deregisters on stop — also when its
start fails halfway."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from connector.common.core.process_registry import runtime_version
from connector.common.core.settings import DatabaseSettings
from connector.ingress.service import IngressService

from .conftest import install_routes, settings


async def _until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _row(conn: psycopg.AsyncConnection[Any], process_id: str) -> dict[str, Any] | None:
    async with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        await cur.execute("SELECT * FROM connector_process WHERE process_id = %s", (process_id,))
        return await cur.fetchone()


async def _count(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM connector_process WHERE service = 'ingress' AND pid = %s", (os.getpid(),)
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_ingress_registers_heartbeats_and_deregisters_on_stop(db_url: str) -> None:
    install_routes(db_url)
    svc = IngressService(DatabaseSettings(), settings(), url=db_url, serve_metrics=False, heartbeat_s=0.1)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await svc.start()
        try:
            process_id = svc.process_id
            assert process_id is not None
            row = await _row(conn, process_id)
            assert row is not None
            assert (row["service"], row["claim_capability"]) == ("ingress", "none")
            assert row["pid"] == os.getpid() and row["hostname"] == socket.gethostname()
            assert row["version"] == runtime_version()
            first = row["heartbeat_at"]

            async def beaten() -> bool:
                later = await _row(conn, process_id)
                return later is not None and later["heartbeat_at"] > first

            await _until(beaten, "a heartbeat")
            registration = svc.registration
            assert registration is not None

            async def counted() -> bool:  # the counter moves after the beat's follow-up statement
                return registration.heartbeats >= 1

            await _until(counted, "the heartbeat counted")
            assert svc.registration.heartbeat_failures == 0
        finally:
            await svc.stop()
        assert await _row(conn, process_id) is None
        assert svc.process_id is None


async def test_a_start_that_fails_leaves_no_row(db_url: str) -> None:
    install_routes(db_url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = settings(http_host="127.0.0.1", http_port=port)
        svc = IngressService(DatabaseSettings(), cfg, url=db_url, serve_metrics=False)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            before = await _count(conn)
            with pytest.raises(OSError):
                await svc.start()  # registers, then cannot bind HTTP: stops what it started
            assert await _count(conn) == before
            assert svc.registration is None and svc.pool is None
