"""The claimer: the only scanner of this process. It discovers which (pack, queue class) groups have
ready rows, asks the scheduler how many of the free window each gets, claims them in one statement
(``work_item_claim_plain_batch``; the circuit, rate or flow statement when a group carries flow keys;
all but the flow statement by their generic plans, ``work_items.claim.CLAIM_PLANS``),
loads the generation's handlers and the batch's event facts, and hands the items to the runners. It
sleeps on ``engine.wake`` (space, a NOTIFY, a due retry) with
``poll_interval_s`` as the fallback. Which statement each group needs, and when the rows a claim
deferred are due, is ``claim_levels.ClaimLevels``; what the claimer may read and change of the
engine is its door (``doors.ClaimerDoor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from psycopg import AsyncConnection

from connector.common.core.db import evict_if_read_only
from connector.common.store import work_items
from connector.common.store.debounce import debounce_covered_batch
from connector.common.store.packs import pack_generation_manifest, pack_names
from connector.common.store.work_items.claim import EVENT_ROW_BODY, EVENT_ROW_CONTENT_TYPE
from connector.executor import metrics as m
from connector.executor.handlers import EventFact
from connector.executor.work.claim_levels import CIRCUIT, FLOW, PLAIN, RATE, ClaimLevels
from connector.executor.work.doors import ClaimerDoor
from connector.executor.work.inflight import InFlight
from connector.executor.work.scheduler import Group, GroupKey

__all__ = ["CIRCUIT", "DUE_PROBE_S", "FLOW", "FLOW_RECHECK_S", "PLAIN", "RATE", "Claimer"]

monotonic = time.monotonic

# How long a group found carrying flow keys keeps the flow claim statement before the plain one looks
# again (one plain batch per group and interval: the keyed candidates it meets are left untouched).
# Read when the claimer is built (``ClaimLevels.recheck_s``).
FLOW_RECHECK_S = 60.0

# A flow group that yields fewer than asked with nothing deferred by that claim may still hold items
# a previous claim deferred to their budget's time: the claim cannot see them (they are not due), so
# the claimer asks discovery at once for the group's next due time instead of learning it at the next
# poll (a claimed item was late by up to ``poll_interval_s``: p90 ~400 ms with 100 keys at 10/s). At
# most one such discovery per this interval (seconds), so a group whose due rows another process
# holds for an instant cannot make the claimer spin. Read when the claimer is built
# (``ClaimLevels.probe_s``).
DUE_PROBE_S = 0.005


class Claimer:
    def __init__(self, engine: ClaimerDoor) -> None:
        self.engine = engine
        self.levels = ClaimLevels(recheck_s=FLOW_RECHECK_S, probe_s=DUE_PROBE_S, stats=engine.stats)
        # The plan mode of the claim connection (``work_items.claim.CLAIM_PLANS``): True generic (plain and
        # rate claims), False the server's (flow claims), None not set since it was taken.
        self._generic: bool | None = None

    @property
    def _flow(self) -> dict[GroupKey, int]:
        """The groups that need more than the plain statement (read by tests)."""
        return self.levels.levels

    @property
    def _flow_until(self) -> float:
        """When they are forgotten (read by tests)."""
        return self.levels.until

    async def run(self) -> None:
        e = self.engine
        conn: AsyncConnection[Any] | None = None
        next_discover = 0.0
        backoff = 0.1
        sched = e.scheduler
        hints_seen = sched.hints
        while e.claiming:
            try:
                if conn is None or conn.closed or e.outdated(conn):
                    await e.give_back(conn)
                    conn = await e.dedicated()
                    self._generic = None
                now = monotonic()
                if now >= next_discover or e.rediscover:
                    e.rediscover = False
                    hints_seen = sched.hints  # discovery reads the rows as they are from here on
                    await self._discover(conn, now)
                    next_discover = now + e.cfg.poll_interval_s
                free = e.capacity - len(e.held)
                if free <= 0 or (free < e.min_claim and e.ready):
                    e.wake.clear()
                    await self._wait(e.cfg.poll_interval_s)
                    continue
                alloc = sched.allocate(min(free, e.cfg.claim_batch), e.held_by_pack, now)
                if not alloc:
                    if sched.hints == hints_seen:
                        e.wake.clear()
                        due = sched.next_due()
                        timeout = min(next_discover - now, (due - now) if due else 1e9)
                        await self._wait(max(0.0, timeout))
                    if sched.hints != hints_seen:
                        # A hint since the last discovery or claim was sent (NOTIFY, lane
                        # promotion, reclaim, retry): any group may have due rows again, and
                        # discovery finds new groups. A wake-up without one only freed space in
                        # the window: the groups a claim left with rows are still ready, the others
                        # stay empty until a hint, the poll or a due time says otherwise (no
                        # discovery statement per finalize batch: tests/test_sql_budget.py).
                        sched.mark_ready()
                        hints_seen = sched.hints
                        next_discover = 0.0
                    continue
                hints_seen = sched.hints  # so does the claim: a hint from now on may be news to it
                await self._claim(conn, alloc)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                e.error("claim", exc)
                await evict_if_read_only(conn, exc)  # a read-only server: closed, replaced
                if conn is not None and (conn.closed or conn.broken):
                    await e.give_back(conn)
                    conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        if conn is not None and self._generic and not conn.closed:
            with contextlib.suppress(Exception):  # the pool's next user gets the server's plan mode
                await conn.execute(work_items.claim.CLAIM_PLANS[False])
        await e.give_back(conn)

    async def _wait(self, limit_s: float) -> bool:
        """Wait for a wake-up (True) or ``limit_s`` seconds (False)."""
        wake = self.engine.wake
        if wake.is_set():
            return True
        try:
            await asyncio.wait_for(wake.wait(), timeout=limit_s)
            return True
        except TimeoutError:
            return False

    async def _discover(self, conn: AsyncConnection[Any], now: float) -> None:
        e = self.engine
        rows = await work_items.claim.work_item_ready_groups(conn)
        new = {r[0] for r in rows} - e.known_packs
        if new:
            names = await pack_names(conn)
            m.PACK_NAMES.update(names)  # the metrics' pack label is the name
            if e.cfg.pack_weights or e.cfg.pack_budgets:
                e.scheduler.set_pack_names(names)
        e.known_packs |= new
        # Paused groups stay out of the allocation (no window share spent on them); the claim
        # statement is what enforces a pause, whatever this process knows.
        e.scheduler.set_paused({(g.pack, g.queue_class) for g in rows if g.paused})
        e.scheduler.observe([(g.pack, g.queue_class, g.due_in) for g in rows if not g.paused], now)
        self.levels.discovered({(g.pack, g.queue_class): g.need for g in rows if g.keyed}, now)

    async def _claim(self, conn: AsyncConnection[Any], alloc: list[tuple[Group, int]]) -> None:
        """One claim for ``alloc`` through the statement its groups need; what each group yielded goes
        to the scheduler and the claim levels, the claimed items to the runners."""
        e = self.engine
        levels = self.levels
        t0 = monotonic()
        level = levels.level((g.key for g, _ in alloc), t0)
        if self._generic is not (level != FLOW):
            await conn.execute(work_items.claim.CLAIM_PLANS[level != FLOW])
            self._generic = level != FLOW
        held_back: dict[GroupKey, int] = {}
        due_in: dict[GroupKey, float] = {}
        keyed: dict[GroupKey, int] = {}
        debounced: dict[GroupKey, int] = {}
        rows = await self._statement(conn, alloc, level, t0, held_back, due_in, keyed, debounced)
        m.CLAIM_SECONDS.observe(monotonic() - t0)
        m.CLAIM_STATEMENTS.labels("rows" if rows else "empty").inc()
        m.CLAIM_BATCH.observe(len(rows))
        e.stats["claims"] += 1
        e.stats["claimed"] += len(rows)
        if held_back:
            self._count_held_back(held_back, debounced)
            levels.deferred(due_in, t0)
        if keyed:  # left to the flow statement: the group is not drained, ask again at once
            for key, c in keyed.items():
                held_back[key] = held_back.get(key, 0) + c
        short = self._record(alloc, level, rows, held_back)
        if short and levels.probe(short, due_in, t0):
            e.rediscover = True
        levels.tell_due(e.scheduler)
        if rows:
            # The lease started no earlier than we sent the claim; the margin is never used.
            await self.hold(conn, rows, t0 + e.cfg.lease_usable_s)

    async def _statement(
        self,
        conn: AsyncConnection[Any],
        alloc: list[tuple[Group, int]],
        level: int,
        now: float,
        held_back: dict[GroupKey, int],
        due_in: dict[GroupKey, float],
        keyed: dict[GroupKey, int],
        debounced: dict[GroupKey, int],
    ) -> list[tuple[Any, ...]]:
        """The claim statement of ``level``; the groups whose keyed candidates it left go up a level."""
        e = self.engine
        packs = [g.pack for g, _ in alloc]
        qcs = [g.queue_class for g, _ in alloc]
        limits = [n for _, n in alloc]
        if level == PLAIN or level == CIRCUIT:
            needs: dict[GroupKey, int] = {}
            claim = (
                work_items.claim.work_item_claim_plain_batch
                if level == PLAIN
                else work_items.claim.work_item_claim_circuit_batch
            )
            rows = await claim(
                conn,
                packs,
                qcs,
                limits,
                owner=e.owner,
                lease_s=e.cfg.lease_s,
                keyed=keyed,
                needs=needs,
                process=e.claim_process,
            )
            if keyed:
                self.levels.left(level, keyed, needs, now)
        elif level == RATE:
            rows = await work_items.claim.work_item_claim_rate_batch(
                conn,
                packs,
                qcs,
                limits,
                owner=e.owner,
                lease_s=e.cfg.lease_s,
                held_back=held_back,
                due_in=due_in,
                keyed=keyed,
                process=e.claim_process,
            )
            if keyed:  # candidates with other flow keys: the flow statement's
                self.levels.left(RATE, keyed, {}, now)
        else:  # FLOW
            rows = await work_items.claim.work_item_claim_batch(
                conn,
                packs,
                qcs,
                limits,
                owner=e.owner,
                lease_s=e.cfg.lease_s,
                held_back=held_back,
                due_in=due_in,
                debounced=debounced,
                process=e.claim_process,
            )
        return rows

    def _count_held_back(self, held_back: dict[GroupKey, int], debounced: dict[GroupKey, int]) -> None:
        """Rate-limited candidates are not claimed but the group is not drained: they count as
        yielded so the scheduler keeps asking (they moved to their budget's time, or their key was
        busy in another claim for an instant). Debounced ones (coalesced, parked behind a newer
        item, or their key busy) likewise."""
        for (pack, qc), c in held_back.items():
            d = debounced.get((pack, qc), 0)
            if c > d:
                m.RATE_LIMITED.labels(m.pack_label(pack), qc).inc(c - d)
            if d:
                m.DEBOUNCE_HELD.labels(m.pack_label(pack), qc).inc(d)
        self.engine.stats["rate_limited"] += sum(held_back.values()) - sum(debounced.values())

    def _record(
        self,
        alloc: list[tuple[Group, int]],
        level: int,
        rows: list[tuple[Any, ...]],
        held_back: dict[GroupKey, int],
    ) -> list[GroupKey]:
        """Tell the scheduler what each group yielded (claimed or held back); the groups of a rate or
        flow claim that yielded fewer than asked."""
        sched = self.engine.scheduler
        short: list[GroupKey] = []
        if len(alloc) == 1:
            g, n = alloc[0]
            yielded = len(rows) + held_back.get(g.key, 0)
            sched.record(g, n, yielded)
            if level and yielded < n:
                short.append(g.key)
            if rows:
                m.CLAIMED.labels(m.pack_label(g.pack), g.queue_class).inc(len(rows))
            return short
        got: dict[GroupKey, int] = {}
        for r in rows:
            k = (r[_PACK], r[_QUEUE_CLASS])
            got[k] = got.get(k, 0) + 1
        for g, n in alloc:
            c = got.get(g.key, 0)
            yielded = c + held_back.get(g.key, 0)
            sched.record(g, n, yielded)
            if level and yielded < n:
                short.append(g.key)
            if c:
                m.CLAIMED.labels(m.pack_label(g.pack), g.queue_class).inc(c)
        return short

    async def hold(self, conn: AsyncConnection[Any], rows: list[tuple[Any, ...]], deadline: float) -> None:
        """The claimed rows (of a claim, or handed off by a lane finalize) become held items (their
        handlers and event facts loaded), ready for the runners; idle runners are woken."""
        e = self.engine
        registry = e.registry
        lookup = registry.lookup
        held = e.held
        hbp = e.held_by_pack
        claimed = []
        need_event: list[InFlight] = []
        covering: list[InFlight] = []
        for r in rows:
            f = InFlight(r, deadline)
            if not registry.loaded(f.installed_pack_id, f.generation):
                await self._load_generation(conn, f.installed_pack_id, f.generation)
            rt = lookup(f.installed_pack_id, f.generation, f.work_type)
            f.runtime = rt
            if rt.needs_event:
                need_event.append(f)
            if f.debounce_key is not None:
                covering.append(f)
            held[f.work_id] = f
            hbp[f.installed_pack_id] = hbp.get(f.installed_pack_id, 0) + 1
            claimed.append(f)
        if need_event or covering:
            try:
                if need_event:
                    await self._attach_events(conn, need_event)
                if covering:
                    await self._attach_covered(conn, covering)
            except Exception:
                # Claimed but not runnable: give them back rather than run without their context.
                for f in claimed:
                    e.finalizer.release(f, unstarted=True)
                raise
        e.ready.extend(claimed)
        m.HELD.set(len(held))
        idle = e.idle
        for _ in range(min(len(claimed), len(idle))):
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)

    async def _load_generation(self, conn: AsyncConnection[Any], pack: int, generation: int) -> None:
        e = self.engine
        found = await pack_generation_manifest(conn, pack, generation)
        if found is None:
            e.registry.install_broken(pack, generation, "the pack generation has no manifest row")
            return
        doc, name = found
        try:
            e.registry.install(pack, generation, doc, name)
        except Exception as exc:  # a stored manifest this version cannot read: fail closed, retry
            e.error("manifest", exc)
            e.registry.install_broken(
                pack, generation, f"the pack generation's manifest is not valid here ({type(exc).__name__})"
            )

    async def _attach_events(self, conn: AsyncConnection[Any], items: list[InFlight]) -> None:
        rows = await work_items.claim.work_item_event_batch(conn, sorted({f.event_id for f in items}))
        by_id: dict[int, tuple[Any, ...]] = {int(r[0]): r for r in rows}
        for f in items:
            r = by_id.get(f.event_id)
            if r is None:
                continue
            f.event = EventFact(*r[:EVENT_ROW_BODY])
            body = r[EVENT_ROW_BODY]
            f.payload = bytes(body) if body is not None else None
            f.content_type = r[EVENT_ROW_CONTENT_TYPE]

    async def _attach_covered(self, conn: AsyncConnection[Any], items: list[InFlight]) -> None:
        """What each debounced execution covers: one read per claimed batch (docs/packs.md#debounce)."""
        covered = await debounce_covered_batch(conn, [f.work_id for f in items])
        for f in items:
            got = covered.get(f.work_id)
            if got:
                f.coalesced_work_ids = tuple(w for w, _ in got)
                f.coalesced_event_ids = tuple(ev for _, ev in got)
                if f.attempt == 1:
                    m.COALESCED.labels(m.pack_label(f.installed_pack_id)).inc(len(got))


# Positions of a claimed row (work_items.claim.ClaimedRow) the group count reads.
_PACK = work_items.claim.CLAIM_COLUMNS.index("installed_pack_id")
_QUEUE_CLASS = work_items.claim.CLAIM_COLUMNS.index("queue_class")
