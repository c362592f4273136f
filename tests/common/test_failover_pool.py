"""Self-healing pools across a change of primary (issue #26 item 3, ADR 020), on a real primary and
streaming standby (tests/support/pgpair.py: initdb + pg_basebackup -R on private ports).

* **Read-only eviction.** A pool (one connection) through the multi-host URL
  (``target_session_attrs=read-write``) writes on the primary; the standby is promoted and the old
  primary fenced (``default_transaction_read_only = on`` + reload: what an operator or HA tool does
  to an old primary it cannot stop). The pooled connection's next write fails with SQLSTATE 25006;
  the pool closes it, and the very next write lands on the new primary. Control
  (``CONNECTOR_EVICT_READ_ONLY=false``): the next 20 writes all fail on the old primary.
* **ServerWatch.** After kill -9 of the primary and the standby's promotion the watch sees the new
  server once (``connector_db_failovers_seen_total``), the pool serves from the new primary and a
  LISTEN session is re-established there (a NOTIFY on the new primary arrives). Control: every
  session terminated on an unchanged server (reconnects, no failover) is not counted as one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import Notify

from connector.common.core import db
from connector.common.core.listener import Listener, ListenerConfig
from connector.common.core.server_watch import ServerWatch
from connector.common.core.settings import DatabaseSettings, PoolSettings, load
from tests.support.pgpair import PgPair

pytestmark = pytest.mark.slow


@pytest.fixture
def pair() -> Iterator[PgPair]:
    with PgPair() as p:
        p.sql(p.primary.port, "CREATE TABLE t (port int)")
        p.wait_replayed()
        yield p


async def _open(name: str, pair: PgPair, monkeypatch: pytest.MonkeyPatch, evict: bool) -> Any:
    monkeypatch.setenv("CONNECTOR_EVICT_READ_ONLY", "true" if evict else "false")
    settings = load(DatabaseSettings)
    return await db.open_pool(
        name,
        settings,
        PoolSettings(pool_min_size=1, pool_max_size=1, pool_timeout_s=30),
        url=pair.url("postgres", "postgres"),
    )


async def _write(pool: Any) -> int:
    """One write through the pool; the port of the server that took it."""
    async with pool.connection() as conn:
        cur = await conn.execute("INSERT INTO t SELECT inet_server_port() RETURNING port")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def _writes_after_fencing(pair: PgPair, pool: Any) -> list[int | str]:
    old = pair.ports[0]
    assert await _write(pool) == old
    pair.promote()
    pair.sql(old, "ALTER SYSTEM SET default_transaction_read_only = on")
    pair.sql(old, "SELECT pg_reload_conf()")
    # Until the pooled session has the reload (it applies it before its next command).
    deadline = time.monotonic() + 60
    while True:
        try:
            port = await _write(pool)
        except psycopg.errors.ReadOnlySqlTransaction:
            break
        assert port == old
        assert time.monotonic() < deadline, "the old primary never became read-only"
        await asyncio.sleep(0.05)
    outcomes: list[int | str] = []
    for _ in range(20):
        try:
            outcomes.append(await _write(pool))
        except psycopg.errors.ReadOnlySqlTransaction:
            outcomes.append("read_only")
    return outcomes


async def test_a_connection_on_a_read_only_server_is_evicted_at_once(
    pair: PgPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = await _open("evict-test", pair, monkeypatch, evict=True)
    try:
        outcomes = await _writes_after_fencing(pair, pool)
    finally:
        await db.close_pool("evict-test")
    new = pair.standby_port
    print(f"\nafter the first 25006, with eviction: {outcomes[:3]}… (new primary {new})")
    assert outcomes == [new] * 20
    assert db.READ_ONLY_EVICTIONS["evict-test"] >= 1


async def test_control_without_eviction_the_pool_keeps_the_read_only_connection(
    pair: PgPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = await _open("keep-test", pair, monkeypatch, evict=False)
    try:
        outcomes = await _writes_after_fencing(pair, pool)
    finally:
        await db.close_pool("keep-test")
    print(f"\nafter the first 25006, without eviction: {outcomes[:3]}…")
    assert outcomes == ["read_only"] * 20


async def _until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_server_watch_sees_a_failover_drains_and_re_listens(
    pair: PgPair, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pool = await _open("watch-test", pair, monkeypatch, evict=True)
    watch = ServerWatch("watch-test", pool, interval_s=0.2)
    notes: list[Notify] = []
    listener = Listener(
        load(DatabaseSettings).conninfo(pair.url("postgres", "postgres")),
        ListenerConfig(channels=("watch_test",), backoff_s=0.2, backoff_max_s=1.0, name="watch-test"),
        on_wake=notes.extend,
    )
    await listener.start(connect_now=True)
    watch.start()
    try:
        await _until(lambda: watch.server is not None, "the watch never answered")
        first = watch.server
        assert first is not None and first.port == pair.primary.port and not first.in_recovery

        # Control: every session terminated, the server unchanged: reconnects, no failover.
        opened = pool.opened
        pair.sql(
            pair.primary.port,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        checks = watch.checks
        await _until(lambda: watch.checks >= checks + 3, "the watch stopped checking")
        assert pool.opened > opened  # the pool reconnected (connector_db_reconnects_total)
        assert watch.changes == 0 and db.FAILOVERS_SEEN["watch-test"] == 0

        # The failover: kill -9 of the primary, the standby promoted.
        connects = listener.connects
        pair.kill_primary()
        pair.promote()
        await _until(lambda: watch.changes >= 1, "the watch never saw the new server")
        after = watch.server
        assert after is not None and after.port == pair.standby_port and not after.in_recovery
        assert after.timeline > first.timeline
        assert watch.changes == 1 and db.FAILOVERS_SEEN["watch-test"] == 1
        assert await _write(pool) == pair.standby_port
        await _until(lambda: listener.connects > connects and listener.connected.is_set(), "no re-LISTEN")
        deadline = time.monotonic() + 60
        while not any(n.payload == "after" for n in notes):
            assert time.monotonic() < deadline, "no notification from the new primary"
            pair.sql(pair.standby_port, "NOTIFY watch_test, 'after'")
            await asyncio.sleep(0.1)
        # One line per event: the change of server once, the LISTEN session lost and back.
        messages = [r.getMessage() for r in caplog.records]
        assert messages.count("database server changed") == 1, messages
        assert "LISTEN lost; polling until it is re-established" in messages
        assert "LISTEN re-established" in messages
    finally:
        await watch.stop()
        await listener.stop()
        await db.close_pool("watch-test")


@pytest.mark.parametrize("evict", [True, False])
async def test_an_off_hot_path_pool_checks_at_checkout_that_its_server_takes_writes(
    db_url: str, monkeypatch: pytest.MonkeyPatch, evict: bool
) -> None:
    """The admin API's kind of pool (``check=True``): a connection whose session turned read-only is
    replaced at checkout and the write succeeds; control (eviction off: the plain liveness check)
    hands out the same connection and the write fails with 25006."""
    monkeypatch.setenv("CONNECTOR_EVICT_READ_ONLY", "true" if evict else "false")
    name = f"check-test-{evict}"
    pool = await db.open_pool(
        name, load(DatabaseSettings), PoolSettings(pool_min_size=1, pool_max_size=1), url=db_url, check=True
    )
    try:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS t (port int)")
            await conn.execute("SET default_transaction_read_only = on")  # as a fenced server would
            first = conn.info.backend_pid
        try:
            async with pool.connection() as conn:
                await conn.execute("INSERT INTO t VALUES (1)")
                second = conn.info.backend_pid
            outcome = "written"
        except psycopg.errors.ReadOnlySqlTransaction:
            outcome, second = "read_only", first
    finally:
        await db.close_pool(name)
    if evict:
        assert outcome == "written" and second != first
    else:
        assert outcome == "read_only"
