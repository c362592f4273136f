"""Process registry: every running service process has a ``connector_process`` row (statements:
``connector.common.store.processes``; this module holds the registering actor).

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
from importlib import metadata

from psycopg_pool import AsyncConnectionPool

from connector.common.core.metrics import build_info
from connector.common.core.runtime import cancel_task
from connector.common.store.processes import (
    ProcessRow,
    process_deregister,
    process_heartbeat,
    process_list,
    process_prune_stale,
    process_register,
)

log = logging.getLogger(__name__)

CAPABILITIES = ("work_item", "legacy_event", "none")


def runtime_version() -> str:
    try:
        return metadata.version("connector-runtime")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def build_revision() -> str:
    """The source revision of this build, as ``connector_build_info`` exports it (empty: unknown)."""
    revision = build_info()[1]
    return "" if revision == "unknown" else revision


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
            "revision": build_revision(),
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


__all__ = ["CAPABILITIES", "ProcessRegistration", "ProcessRow", "process_list", "runtime_version"]
