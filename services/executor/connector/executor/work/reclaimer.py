"""The reclaimer: every ``reclaim_interval_s`` (±20 % jitter) it moves expired leases of any process
back to ``retry`` (``dead`` when attempts are exhausted) with ``work_item_reclaim_expired``, which
re-checks state, token and expiry in the same statement, so any number of reclaimers is safe. A
reclaimed item gives its concurrency slot back in the same transaction. Every
``CHECK_EVERY`` rounds it also runs the concurrency-slot check (``flow.concurrency_check``: recount
each key's slots from its processing rows, wake parked items with free slots; healthy: nothing) and
deletes idle rate-limit and concurrency key rows (``flow.flow_keys_retire``, ``flow_key_idle_s``) and
idle debounce key rows (``debounce.debounce_retire``, the same setting).
"""

from __future__ import annotations

import asyncio

import psycopg

from connector.common.store import debounce, flow, work_items
from connector.executor import figures
from connector.executor import metrics as m
from connector.executor.work.doors import ReclaimerDoor

CHECK_EVERY = 6  # reclaim rounds per concurrency-slot check (30 s at the default 5 s interval)


class Reclaimer:
    def __init__(self, engine: ReclaimerDoor) -> None:
        self.engine = engine
        self._rounds = 0
        self._key_cursors = (flow.KeyCursor(), flow.KeyCursor())  # where the idle-key walk continues
        self._debounce_cursor = debounce.DebounceCursor()

    async def run(self) -> None:
        e = self.engine
        while True:
            interval = e.cfg.reclaim_interval_s
            await asyncio.sleep(interval * (0.8 + 0.4 * e.rnd.random()))
            try:
                await self.reclaim_once()
                self._rounds += 1
                if self._rounds % CHECK_EVERY == 0:
                    await self.check_slots()
                    await self.retire_keys()
            except asyncio.CancelledError:
                raise
            except psycopg.errors.DeadlockDetected:
                m.DEADLOCK_RETRIES.inc()
                e.stats["deadlocks"] += 1
            except Exception as exc:
                e.error("reclaim", exc)

    async def reclaim_once(self) -> list[work_items.finalize.Reclaimed]:
        e = self.engine
        async with e.pool.connection() as conn:
            rows = await work_items.finalize.work_item_reclaim_expired(conn)
        if rows:
            for st in ("retry", "dead"):
                c = sum(1 for r in rows if r.state == st)
                if c:
                    m.RECLAIMED.labels(st).inc(c)
            e.stats["reclaimed"] += len(rows)
            figures.reclaimed(e.figures, rows)
            e.scheduler.mark_ready({r.installed_pack_id for r in rows})
            e.wake.set()
        return rows

    async def retire_keys(self) -> tuple[int, int]:
        """Delete idle flow key rows (a few pages per table per call)."""
        e = self.engine
        idle_s = e.cfg.flow_key_idle_s
        if idle_s <= 0:
            return (0, 0)
        async with e.pool.connection() as conn:
            rate, slots = await flow.flow_keys_retire(conn, self._key_cursors, idle_s=idle_s)
            deb = await debounce.debounce_retire(conn, self._debounce_cursor, idle_s=idle_s)
        if deb:
            m.FLOW_KEYS_RETIRED.labels("debounce").inc(deb)
        if rate:
            m.FLOW_KEYS_RETIRED.labels("rate_limit").inc(rate)
        if slots:
            m.FLOW_KEYS_RETIRED.labels("concurrency").inc(slots)
        return rate, slots

    async def check_slots(self) -> flow.SlotCheck:
        e = self.engine
        async with e.pool.connection() as conn:
            res = await flow.concurrency_check(conn)
        if res.recounted:
            m.CONCURRENCY_REPAIRS.labels("recounted").inc(res.recounted)
        if res.woken:
            m.CONCURRENCY_REPAIRS.labels("woken").inc(res.woken)
            e.scheduler.mark_ready()
            e.wake.set()
        return res
