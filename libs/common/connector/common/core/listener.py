"""One LISTEN connection of a service loop: connect, LISTEN, deliver wake-ups, reconnect with back-off.

A ``Listener`` owns a dedicated autocommit connection (never a pool connection: a LISTEN session
must stay open) and one task. Its contract:

* **Wake-ups are hints, polling is the fallback.** ``on_wake(notes)`` gets every notification, in
  arrival order, batched: after the first one, whatever else has already arrived (and, with
  ``coalesce_s``, whatever arrives within that window) is delivered in the same call. With
  ``poll_interval_s`` set, ``on_wake([])`` is called after that long without a notification (the
  periodic fallback); with ``None`` the listener only ever wakes on notifications.
* **A reconnect may have missed notifications**: ``on_connect(conn, reconnect)`` runs after every
  successful ``LISTEN`` (``reconnect`` is False only for the first), so the owner can re-read what
  it caches or look for work.
* **Failures never end the loop**: a lost connection (or a failing callback) is reported to
  ``on_error``, the connection is closed and re-opened after ``backoff_s``, doubling up to
  ``backoff_max_s``, reset by the next successful connect.
* **A change of server re-LISTENs**: ``Listener.reconnect_all()`` (called by ``ServerWatch`` when
  the pool reaches another server) closes every live listener's session and connects again, so a
  session left on an old primary (which may be silent) does not wait for its keepalives. While a
  listener is away its owner's own polling covers (every owner also polls: notifications are
  hints). One WARNING line when a session is lost, one INFO line when it is back.
* **Test signals instead of sleeps**: ``connected`` (set while listening), ``connects``,
  ``wakeups``, ``errors``, and ``backend_pid`` (to terminate the session from a test).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection, Notify, sql

from connector.common.core.runtime import cancel_task

Conn = AsyncConnection[Any]
WakeCallback = Callable[[list[Notify]], Awaitable[None] | None]
ConnectCallback = Callable[[Conn, bool], Awaitable[None] | None]
ErrorCallback = Callable[[BaseException], None]

#: The statement of each channel (an identifier), named so a statement digest maps back to it.
LISTEN_CHANNEL = "LISTEN {}"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    channels: tuple[str, ...]
    #: ``on_wake([])`` after this long without a notification; ``None``: notifications only.
    poll_interval_s: float | None = None
    #: After a notification, keep gathering for this long before delivering (0: what has arrived).
    coalesce_s: float = 0.0
    backoff_s: float = 1.0
    backoff_max_s: float = 1.0
    name: str = "listener"


async def _call(fn: Callable[..., Awaitable[None] | None] | None, *args: Any) -> None:
    if fn is None:
        return
    result = fn(*args)
    if inspect.isawaitable(result):
        await result


class Listener:
    """See the module docstring. ``conninfo`` is a connection string (or a function returning one,
    read at every connect)."""

    _live: weakref.WeakSet[Listener] = weakref.WeakSet()
    #: Reconnects scheduled by ``reconnect_all`` (kept until done).
    _pending: set[asyncio.Task[None]] = set()

    def __init__(
        self,
        conninfo: str | Callable[[], str],
        cfg: ListenerConfig,
        *,
        on_wake: WakeCallback,
        on_connect: ConnectCallback | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        if not cfg.channels:
            raise ValueError("a listener needs at least one channel")
        self._conninfo = conninfo
        self.cfg = cfg
        self._on_wake = on_wake
        self._on_connect = on_connect
        self._on_error = on_error
        self._conn: Conn | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.connects = 0
        self.wakeups = 0
        self.errors = 0
        self.backend_pid: int | None = None

    @property
    def connection(self) -> Conn | None:
        """The listening connection (e.g. for a read inside ``on_wake``); ``None`` while away."""
        return self._conn

    async def start(self, *, connect_now: bool = False) -> None:
        """Start the loop. With ``connect_now`` the first connect and ``LISTEN`` happen here and a
        failure raises (a service that must listen before its first read); otherwise the loop
        connects (and retries) in the background."""
        if connect_now:
            await self._connect()
        self._task = asyncio.create_task(self._run(), name=self.cfg.name)
        Listener._live.add(self)

    async def stop(self) -> None:
        Listener._live.discard(self)
        task, self._task = self._task, None
        await cancel_task(task)
        await self._close()

    async def reconnect(self) -> None:
        """Drop the session and LISTEN again (in the background, with the usual back-off)."""
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_task(task)
        await self._close()
        self._task = asyncio.create_task(self._run(), name=self.cfg.name)

    @classmethod
    def reconnect_all(cls) -> None:
        """``reconnect`` every running listener of this process (a change of database server)."""
        for listener in list(cls._live):
            if listener._task is not None:
                task = asyncio.ensure_future(listener.reconnect())
                cls._pending.add(task)
                task.add_done_callback(cls._pending.discard)

    # ------------------------------------------------------------------------------------- loop

    async def _connect(self) -> None:
        conninfo = self._conninfo() if callable(self._conninfo) else self._conninfo
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        try:
            for channel in self.cfg.channels:
                await conn.execute(sql.SQL(LISTEN_CHANNEL).format(sql.Identifier(channel)))
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        self._conn = conn
        self.backend_pid = conn.info.backend_pid
        reconnect = self.connects > 0
        self.connects += 1
        self.connected.set()
        if reconnect:
            log.info("LISTEN re-established", extra={"listener": self.cfg.name})
        await _call(self._on_connect, conn, reconnect)

    async def _close(self) -> None:
        self.connected.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _next(self, conn: Conn) -> list[Notify]:
        notes: list[Notify] = []
        async for note in conn.notifies(timeout=self.cfg.poll_interval_s, stop_after=1):
            notes.append(note)
        if notes:
            async for note in conn.notifies(timeout=self.cfg.coalesce_s):
                notes.append(note)
        return notes

    async def _run(self) -> None:
        backoff = self.cfg.backoff_s
        while True:
            try:
                if self._conn is None:
                    await self._connect()
                backoff = self.cfg.backoff_s
                conn = self._conn
                assert conn is not None
                while True:
                    notes = await self._next(conn)
                    self.wakeups += 1
                    await _call(self._on_wake, notes)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                if self.connected.is_set():
                    log.warning(
                        "LISTEN lost; polling until it is re-established",
                        extra={"listener": self.cfg.name, "error_class": type(exc).__name__},
                    )
                if self._on_error is not None:
                    self._on_error(exc)
                await self._close()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.cfg.backoff_max_s)


__all__ = ["Listener", "ListenerConfig"]
