"""Process registry: every running service process has a ``connector_process`` row.

The row says what the process may do (``claim_capability``: ``work_item`` for executors on the
WorkItem path, ``legacy_event`` for the compatibility path, ``none`` for ingress, materializer and
tools), which version it runs, and when it last proved it is alive (``heartbeat_at``, always the
*database* clock: a process whose own clock is skewed cannot look fresher or staler than it is).
Cutover and rollback gates read it as the source of "zero claim-capable old processes".

A registered process heartbeats every ``interval_s`` seconds and deletes its row on a clean exit. A
process killed without a chance to deregister leaves a row whose heartbeat stops; readers judge
liveness by heartbeat age (``process_list(..., fresh_within_s=...)``), and rows silent for longer
than ``prune_after_s`` are removed by any registered process (a live process that was merely
partitioned re-inserts its row at its next heartbeat).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from connector.common.runtime import cancel_task

log = logging.getLogger(__name__)

CAPABILITIES = ("work_item", "legacy_event", "none")

PROCESS_REGISTER = """
INSERT INTO connector_process (process_id, service, hostname, pid, version, claim_capability,
  started_at, heartbeat_at)
VALUES (%(process_id)s, %(service)s, %(hostname)s, %(pid)s, %(version)s, %(capability)s, now(), now())
ON CONFLICT (process_id) DO UPDATE SET heartbeat_at = now()
"""

PROCESS_HEARTBEAT = "UPDATE connector_process SET heartbeat_at = now() WHERE process_id = %(process_id)s"

PROCESS_DEREGISTER = "DELETE FROM connector_process WHERE process_id = %(process_id)s"

PROCESS_PRUNE_STALE = """
DELETE FROM connector_process
WHERE heartbeat_at < now() - make_interval(secs => %(older_than_s)s) AND process_id <> %(process_id)s
"""

PROCESS_LIST = """
SELECT process_id, service, hostname, pid, version, claim_capability, started_at, heartbeat_at,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s
FROM connector_process
WHERE (%(capability)s::text IS NULL OR claim_capability = %(capability)s::text)
  AND (%(fresh_within_s)s::float8 IS NULL
       OR heartbeat_at >= now() - make_interval(secs => %(fresh_within_s)s::float8))
ORDER BY started_at, process_id
"""


@dataclass(frozen=True, slots=True)
class ProcessRow:
    process_id: str
    service: str
    hostname: str
    pid: int
    version: str
    claim_capability: str
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float


def runtime_version() -> str:
    try:
        return metadata.version("connector-runtime")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


async def process_register(conn: AsyncConnection[Any], row: dict[str, Any]) -> None:
    await conn.execute(PROCESS_REGISTER, row)


async def process_heartbeat(conn: AsyncConnection[Any], process_id: str) -> bool:
    """True when the row was still there (False: it was pruned; the caller re-registers)."""
    cur = await conn.execute(PROCESS_HEARTBEAT, {"process_id": process_id})
    return cur.rowcount == 1


async def process_deregister(conn: AsyncConnection[Any], process_id: str) -> None:
    await conn.execute(PROCESS_DEREGISTER, {"process_id": process_id})


async def process_prune_stale(conn: AsyncConnection[Any], older_than_s: float, keep: str = "") -> int:
    cur = await conn.execute(PROCESS_PRUNE_STALE, {"older_than_s": older_than_s, "process_id": keep})
    return cur.rowcount


async def process_list(
    conn: AsyncConnection[Any], *, capability: str | None = None, fresh_within_s: float | None = None
) -> list[ProcessRow]:
    cur = await conn.execute(PROCESS_LIST, {"capability": capability, "fresh_within_s": fresh_within_s})
    return [ProcessRow(*row) for row in await cur.fetchall()]


class ProcessRegistration:
    """Register on ``start``, heartbeat in the background, deregister on ``stop``."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        service: str,
        capability: str = "none",
        interval_s: float = 5.0,
        prune_after_s: float = 300.0,
        version: str | None = None,
    ) -> None:
        if capability not in CAPABILITIES:
            raise ValueError(f"claim capability must be one of {CAPABILITIES}")
        self.pool = pool
        self.process_id = str(uuid.uuid4())
        self.interval_s = interval_s
        self.prune_after_s = prune_after_s
        self._row = {
            "process_id": self.process_id,
            "service": service,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "version": version or runtime_version(),
            "capability": capability,
        }
        self._task: asyncio.Task[None] | None = None
        self.heartbeats = 0
        self.heartbeat_failures = 0

    async def start(self) -> None:
        async with self.pool.connection() as conn:
            await process_register(conn, self._row)
        self._task = asyncio.create_task(self._beat(), name=f"process-heartbeat-{self._row['service']}")

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                async with self.pool.connection() as conn:
                    if not await process_heartbeat(conn, self.process_id):
                        await process_register(conn, self._row)
                    await process_prune_stale(conn, self.prune_after_s, keep=self.process_id)
                self.heartbeats += 1
            except Exception as exc:
                # Liveness is judged by heartbeat age: a missed beat is visible to readers, not fatal.
                self.heartbeat_failures += 1
                log.warning("process heartbeat failed", extra={"exc_type": type(exc).__name__})

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_task(task)
        try:
            async with self.pool.connection() as conn:
                await process_deregister(conn, self.process_id)
        except Exception as exc:
            log.warning("process deregistration failed", extra={"exc_type": type(exc).__name__})
