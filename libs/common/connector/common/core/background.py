"""A periodic database job of a service process (upkeep, retention): its own autocommit connection
outside the service's pool, a task started and stopped with the service, a loop that survives
connection loss, and failures reported at most once per ``REPORT_EVERY_S`` per key.

Subclasses implement ``run_once()`` and say how their connection is made (``connect()``) and how a
failure is reported (``report()``); the loop, the lifecycle and the rate limit are here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import psycopg

from connector.common.core.runtime import cancel_task

REPORT_EVERY_S = 300.0

# One process at a time on a job's object, across all processes: a session advisory lock
# ``(class, key)`` on the job's own connection, tried and never waited for.
SESSION_LOCK_TRY = "SELECT pg_try_advisory_lock(%s, %s)"
SESSION_LOCK_RELEASE = "SELECT pg_advisory_unlock(%s, %s)"


async def session_lock_try(conn: psycopg.AsyncConnection[Any], key_class: int, key: int) -> bool:
    cur = await conn.execute(SESSION_LOCK_TRY, (key_class, key))
    row = await cur.fetchone()
    return bool(row and row[0])


async def session_lock_release(conn: psycopg.AsyncConnection[Any], key_class: int, key: int) -> None:
    await conn.execute(SESSION_LOCK_RELEASE, (key_class, key))


class BackgroundJob:
    """Run ``run_once`` every ``interval_s`` (±``jitter``) on a dedicated connection."""

    #: Task and ``application_name`` suffix, e.g. ``upkeep``.
    kind = "job"

    def __init__(
        self,
        url: str,
        service: str,
        *,
        interval_s: float,
        jitter: float = 0.0,
        first_after_interval: bool = False,
    ) -> None:
        self.url = url
        self.service = service
        self.interval_s = interval_s
        self.jitter = jitter
        self.first_after_interval = first_after_interval
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._reported_at: dict[str, float] = {}

    # -- to implement ------------------------------------------------------------------------

    async def run_once(self) -> Any:
        raise NotImplementedError

    async def setup(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Session settings of a new connection (none by default)."""

    def on_failure(self, exc: BaseException) -> None:
        """A round failed (already rate-limited per exception class); log it."""

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"{self.service}-{self.kind}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_task(task)
        await self.close()

    async def open_connection(self) -> psycopg.AsyncConnection[Any]:
        """A new autocommit connection named after the service and the job, then ``setup``."""
        conn = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, application_name=f"connector-{self.service}-{self.kind}"
        )
        await self.setup(conn)
        return conn

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await self.open_connection()
        return self._conn

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await conn.close()

    def _pause(self) -> float:
        return self.interval_s * (random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0)

    async def _loop(self) -> None:
        if self.first_after_interval:
            await asyncio.sleep(self._pause())
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost, timeout, server restart: retried next round
                await self.close()
                if self.should_report(type(exc).__name__):
                    self.on_failure(exc)
            await asyncio.sleep(self._pause())

    def should_report(self, key: str) -> bool:
        """True at most once per ``REPORT_EVERY_S`` for ``key`` (keeps repeated failures quiet)."""
        now = time.monotonic()
        if now - self._reported_at.get(key, -1e9) < REPORT_EVERY_S:
            return False
        self._reported_at[key] = now
        return True
