"""Claim admission of one registered WorkItem executor (docs/cutover.md, gates 3 and 4).

The process's ``connector_process`` row names the admitting receipt of every generation whose
authority is ``work_item/work_item_active`` as this process last observed it
(``admitted_receipt_ids``). The claim statements admit a generation for this process only while its
row names that exact receipt (``work_items.claim.AUTHORITY_ROWS`` with ``process``), and rollback
counts the live processes whose row names one of the generation's receipts as claim-capable for it
(``cutover.proofs.work_item_idle_proof``: blocker ``work_item_claimer_running``).

A round (``store.processes.PROCESS_ADMIT``: one statement reading the authority rows ``FOR SHARE``)
runs at start, before the engine claims — so a process started during a rollback never names that
generation and holds off its claims — then on every ``connector_packs`` notification (every
authority change sends one at commit) and every ``interval_s`` (a missed notification, an authority
row written without one, a pruned and re-inserted row); it writes the row only when the set changed.
A round that adds a receipt wakes the claimer.

The test control ``CONNECTOR_TEST_ADMISSION_IGNORES_PHASE`` (tests/executor/controls) breaks the
round: it names every generation's admitting receipt whatever its phase.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from connector.common.core.listener import Listener, ListenerConfig
from connector.common.core.runtime import cancel_task
from connector.common.store import processes
from connector.common.store.vocabulary import CHANNEL_PACKS

log = logging.getLogger(__name__)


class Admission:
    """Keep this process's admitted receipts current (see the module docstring)."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        process_id: str,
        *,
        interval_s: float = 5.0,
        on_admit: Callable[[], None] | None = None,
    ) -> None:
        self.pool = pool
        self.process_id = process_id
        self.interval_s = interval_s
        self.on_admit = on_admit
        self.admitted: frozenset[int] = frozenset()
        self.rounds = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listener: Listener | None = None

    async def round(self) -> frozenset[int]:
        async with self.pool.connection() as conn:
            ids = await processes.process_admit(conn, self.process_id)
        self.rounds += 1
        if ids is None:  # unchanged
            return self.admitted
        new = frozenset(ids)
        added = new - self.admitted
        if new != self.admitted:
            log.info(
                "claim admission changed",
                extra={"admitted_receipts": sorted(new), "dropped": sorted(self.admitted - new)},
            )
        self.admitted = new
        if added and self.on_admit is not None:
            self.on_admit()
        return new

    async def start(self) -> None:
        """The first round (raises on failure: the process must not claim unadmitted), then the loop."""
        self._listener = Listener(
            str(self.pool.conninfo),
            ListenerConfig(channels=(CHANNEL_PACKS,), name="executor-admission"),
            on_wake=lambda notes: self._wake.set(),
            on_connect=self._on_connect,
        )
        await self._listener.start(connect_now=True)
        await self.round()
        self._task = asyncio.create_task(self._loop(), name="executor-admission")

    def _on_connect(self, conn: Any, reconnect: bool) -> None:
        if reconnect:  # anything may have changed while we were not listening
            self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Fail closed: a failed round keeps the row as it is; a dropped generation was already
                # dropped, and a new one is admitted only by a round that succeeds.
                log.warning("claim admission round failed", extra={"exc_type": type(exc).__name__})
                await asyncio.sleep(0.5)
                self._wake.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_task(task)
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
