"""The lease keeper: every ``lease_s / 3`` it renews every held, undecided item in one fenced
statement (``work_item_renew_lease_batch``) and enforces handler timeouts. An item whose renewal
matched nothing was fenced by another claimer: its handler is cancelled (async) or its late result
is rejected by the fenced finalize (sync). Without a successful renewal within the lease (database
unreachable, or a renewal hung on a silent connection) the lease watch (``lease_watch.py``) presumes
the lease lost, on its own timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from connector.common.store import work_items
from connector.executor import metrics as m
from connector.executor.work.doors import LeaseKeeperDoor
from connector.executor.work.inflight import InFlight

monotonic = time.monotonic


class LeaseKeeper:
    def __init__(self, engine: LeaseKeeperDoor) -> None:
        self.engine = engine

    async def run(self) -> None:
        e = self.engine
        interval = max(0.05, e.cfg.lease_s / 3.0)
        # A fixed cadence (not an interval after each renewal returned): two confirmations are one
        # interval apart however long the statements take, which is what the lease watch's default
        # margin assumes (lease_watch.py); after a renewal that hung, the next one goes at once.
        due = monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, due - monotonic()))
            due = max(due + interval, monotonic())
            try:
                await self.renew_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                e.error("renew", exc)

    async def renew_once(self) -> None:
        e = self.engine
        live = sorted((f for f in e.held.values() if not f.done), key=lambda f: f.work_id)
        self._enforce_timeouts(live)
        if not live:
            return
        ids = [f.work_id for f in live]
        tokens = [f.lease_token for f in live]
        t0 = monotonic()
        async with e.pool.connection() as conn:
            renewed = await work_items.finalize.work_item_renew_lease_batch(
                conn, ids, tokens, lease_s=e.cfg.lease_s
            )
        deadline = t0 + e.cfg.lease_usable_s  # lease_watch.py: the margin is never used
        lost = 0
        for f in live:
            if f.work_id in renewed:
                f.renewed(deadline)
            elif not f.done and e.held.get(f.work_id) is f:
                lost += 1
                self.lose(f)
        if renewed:
            m.RENEWED.inc(len(renewed))
        if lost:
            m.STALE.labels("renew").inc(lost)
            e.stats["stale"] += lost

    def lose(self, f: InFlight) -> None:
        """This process no longer holds the lease: abandon the item."""
        e = self.engine
        f.lease_lost = True
        if not f.started:
            with contextlib.suppress(ValueError):
                e.ready.remove(f)
            e.abandon(f)
            return
        handler = f.runtime.handler
        if f.task is not None and getattr(handler, "is_async", True):
            f.cancel = "lost"
            f.task.cancel()
        # A sync handler cannot be interrupted: its late result is written fenced (and rejected).

    def _enforce_timeouts(self, live: list[InFlight]) -> None:
        now = monotonic()
        for f in live:
            if f.task is None or f.cancel is not None:
                continue
            rt = f.runtime
            if f.t0 and now - f.t0 > rt.timeout_s:
                f.cancel = "timeout"
                f.task.cancel()
