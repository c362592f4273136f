"""The shared LISTEN actor against the real server: delivery in order and batched, the fallback poll,
reconnect after the session is terminated (with ``on_connect(reconnect=True)``), and a callback
that fails does not end the loop. Every wait is on a signal (an event or a counter), never a sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import Notify

from connector.common.core.listener import Listener, ListenerConfig

TIMEOUT = 10.0


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[Notify]] = []
        self.connects: list[bool] = []
        self.errors: list[str] = []
        self.changed = asyncio.Event()
        self.fail_next = False

    def on_wake(self, notes: list[Notify]) -> None:
        self.batches.append(notes)
        self.changed.set()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("callback failure")

    async def on_connect(self, conn: Any, reconnect: bool) -> None:
        self.connects.append(reconnect)
        self.changed.set()

    def on_error(self, exc: BaseException) -> None:
        self.errors.append(type(exc).__name__)

    def payloads(self) -> list[str]:
        return [n.payload for b in self.batches for n in b]

    async def until(self, check: Any) -> None:
        async def wait() -> None:
            while not check():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), TIMEOUT)


async def _notify(url: str, *pairs: tuple[str, str]) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for channel, payload in pairs:
            await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def _listener(url: str, rec: Recorder, **kw: Any) -> Listener:
    cfg = ListenerConfig(channels=("chan_a", "chan_b"), backoff_s=0.05, backoff_max_s=0.2, **kw)
    return Listener(url, cfg, on_wake=rec.on_wake, on_connect=rec.on_connect, on_error=rec.on_error)


async def test_delivers_every_notification_in_order_from_both_channels(db_url: str) -> None:
    rec = Recorder()
    listener = _listener(db_url, rec)
    await listener.start(connect_now=True)
    try:
        assert rec.connects == [False]
        # One transaction: delivered together at commit, so they arrive in one packet.
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            for i in range(5):
                await conn.execute("SELECT pg_notify(%s, %s)", ("chan_a" if i % 2 else "chan_b", str(i)))
            await conn.commit()
        await rec.until(lambda: len(rec.payloads()) >= 5)
        assert rec.payloads() == ["0", "1", "2", "3", "4"]
        assert {n.channel for b in rec.batches for n in b} == {"chan_a", "chan_b"}
        assert all(rec.batches), "no empty wake-up without a poll interval"
        assert len(rec.batches) < 5, "notifications that arrived together are delivered together"
    finally:
        await listener.stop()
    assert not listener.connected.is_set()


async def test_poll_interval_wakes_without_notifications(db_url: str) -> None:
    rec = Recorder()
    listener = _listener(db_url, rec, poll_interval_s=0.05)
    await listener.start()
    try:
        await rec.until(lambda: sum(1 for b in rec.batches if not b) >= 3)
        assert rec.payloads() == []
    finally:
        await listener.stop()


async def test_reconnects_after_the_session_is_terminated(db_url: str) -> None:
    rec = Recorder()
    listener = _listener(db_url, rec)
    await listener.start()
    try:
        await asyncio.wait_for(listener.connected.wait(), TIMEOUT)
        first_pid = listener.backend_pid
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
        await rec.until(lambda: rec.connects == [False, True])
        assert listener.backend_pid != first_pid
        assert listener.errors >= 1 and rec.errors
        await _notify(db_url, ("chan_a", "after"))
        await rec.until(lambda: "after" in rec.payloads())
    finally:
        await listener.stop()


async def test_a_failing_callback_does_not_end_the_loop(db_url: str) -> None:
    rec = Recorder()
    rec.fail_next = True
    listener = _listener(db_url, rec)
    await listener.start(connect_now=True)
    try:
        await _notify(db_url, ("chan_a", "one"))
        await rec.until(lambda: rec.errors == ["RuntimeError"] and len(rec.connects) == 2)
        await _notify(db_url, ("chan_b", "two"))
        await rec.until(lambda: "two" in rec.payloads())
        assert rec.payloads() == ["one", "two"]
    finally:
        await listener.stop()


async def test_connect_now_raises_when_the_database_refuses(db_url: str) -> None:
    rec = Recorder()
    bad = db_url.rsplit("/", 1)[0] + "/no_such_database_for_listener"
    listener = _listener(bad, rec)
    try:
        await listener.start(connect_now=True)
    except psycopg.OperationalError:
        pass
    else:  # pragma: no cover - the assertion below reports it
        await listener.stop()
        raise AssertionError("start(connect_now=True) must raise when it cannot connect")
    assert rec.connects == []
