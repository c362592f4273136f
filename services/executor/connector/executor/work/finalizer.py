"""The finalizer: outcomes wait in a pending batch and are written by ``FINALIZERS`` flushers, each
with its own connection (``work_item_finalize``: one fenced statement per kind of transition, rows in
``work_id`` order; lane members in one transaction that locks their lanes first and settles them
last, ADR 003). A flusher takes the whole plain batch, or one chunk of lane members; whatever
finishes meanwhile forms the next batch. Lane chunks are small so that promotions commit early and
the claimer, the other flusher and this one keep both database cores busy (a lane advances one
member per flush). A statement that keeps failing on a healthy connection is abandoned after
``FINALIZE_GIVE_UP`` tries: the items' leases expire and a reclaim retries them. A flush is its
write (``_write``: the store call) and then its follow-ups, in this order: stale counts, the groups
the write made due again (lane promotions, circuit transitions, woken concurrency slots), the items
leaving the window, outcome counters with retries' due times and dead-letter lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from typing import Any

import psycopg
from psycopg import AsyncConnection

from connector.common.core.db import evict_if_read_only
from connector.common.core.eventlog import events
from connector.common.core.runtime import cancel_tasks
from connector.common.store import circuits, work_items
from connector.common.store.lanes import Lane, LaneKind
from connector.common.store.work_items.finalize import FailOp
from connector.executor import figures
from connector.executor import metrics as m
from connector.executor.handlers import Outcome, backoff_delay
from connector.executor.work.doors import FinalizerDoor
from connector.executor.work.inflight import InFlight

monotonic = time.monotonic

FINALIZERS = 2  # concurrent finalize flushes, one connection each (docs/executor.md: measured)
#: Hand lane members made runnable by a flush to this process in the flush's transaction
#: (docs/adr/022-lane-handoff.md); ``CONNECTOR_EXECUTOR_LANE_HANDOFF=0`` turns it off (a bench's base).
LANE_HANDOFF = os.environ.get("CONNECTOR_EXECUTOR_LANE_HANDOFF", "1") != "0"
LANE_FLUSH_MAX = 50  # lane members per flush: a round of 100 lanes splits between the two
FINALIZE_GIVE_UP = 5  # a flush whose statement fails this often (connection fine) is abandoned


#: Failure classes that say nothing about the handler target: our side could not call it (no lease
#: time left, the handler could not be loaded, the work type is unknown). Neutral for its circuit.
CIRCUIT_NEUTRAL_CLASSES = frozenset({"lease_exhausted", "handler_unavailable", "unknown_work_type"})


def circuit_outcome(out: Outcome | None) -> str:
    """What an outcome tells the handler target's circuit breaker (docs/adr/013-circuit-breakers.md):
    a **failure** is a retry — a retryable failure, a timeout, a connection error, an HTTP 5xx / 408 /
    429, an exception — the target could not do it now; a **success** is a success or a permanent
    failure (the target answered: the request was at fault, not the destination); **neutral**:
    classes that never reached the target (``CIRCUIT_NEUTRAL_CLASSES``)."""
    if out is None or out.kind == "success":
        return circuits.SUCCESS
    if out.failure_class in CIRCUIT_NEUTRAL_CLASSES:
        return circuits.NEUTRAL
    return circuits.FAILURE if out.kind == "retry" else circuits.SUCCESS


class Pending:
    """Finalizes waiting for the next flush (plain items and lane items kept apart)."""

    __slots__ = (
        "circuits",
        "complete_ids",
        "complete_tokens",
        "fail",
        "items",
        "lanes",
        "member_lanes",
        "slots",
    )

    def __init__(self) -> None:
        self.complete_ids: list[int] = []
        self.complete_tokens: list[int] = []
        self.fail = work_items.finalize.FailBatch()
        self.items: list[InFlight] = []
        self.lanes: set[Lane] = set()
        #: Each lane member's lanes (work id -> lanes): those of the members that leave processing
        #: are idle for the settle (no busy probe).
        self.member_lanes: dict[int, list[Lane]] = {}
        #: Concurrency slots the flush gives back: work id -> (pack, concurrency key).
        self.slots: dict[int, tuple[int, str]] = {}
        #: Outcomes the circuit breakers count, in finish order: work id -> (pack, circuit key, code).
        self.circuits: dict[int, tuple[int, str, str]] = {}

    def __len__(self) -> int:
        return len(self.items)


class Finalizer:
    def __init__(self, engine: FinalizerDoor) -> None:
        self.engine = engine
        self._pending = Pending()  # plain items: one batch, flushed whole
        self._lane_chunks: deque[Pending] = deque()  # lane members: chunks of <= LANE_FLUSH_MAX
        self._inflight_flushes = 0
        self._flush = asyncio.Event()
        self._flushed = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.run(), name=f"executor-finalizer-{i}") for i in range(FINALIZERS)
        ]

    async def stop(self) -> None:
        await cancel_tasks(self._tasks)

    # ---------------------------------------------------------------------------------- enqueue

    def finish(self, f: InFlight, out: Outcome | None) -> None:
        """A runner's outcome for ``f`` (``None``: success)."""
        f.done = True
        if f.lease_lost and f.cancel == "lost":
            # Cancelled because the lease was lost: nothing to write.
            self.engine.abandon(f)
            return
        p = self._slot(f)
        if f.circuit_key is not None:
            p.circuits[f.work_id] = (f.installed_pack_id, f.circuit_key, circuit_outcome(out))
        if out is None or out.kind == "success":
            p.complete_ids.append(f.work_id)
            p.complete_tokens.append(f.lease_token)
        elif out.kind == "retry":
            delay = out.delay_s
            if delay is None:
                pol = f.runtime.retry
                delay = backoff_delay(
                    f.attempt, pol.backoff_base_s, pol.backoff_cap_s, pol.jitter, self.engine.rnd
                )
            p.fail.add(
                f.work_id,
                f.lease_token,
                FailOp.RETRY,
                delay=max(0.0, float(delay)),
                failure_class=out.failure_class,
                summary=out.summary,
            )
        else:
            p.fail.add(
                f.work_id,
                f.lease_token,
                FailOp.DEAD,
                failure_class=out.failure_class,
                summary=out.summary,
            )
        p.items.append(f)
        self._flush.set()

    def release(self, f: InFlight, *, unstarted: bool) -> None:
        """Give ``f`` back, immediately claimable elsewhere (``unstarted``: refund the attempt)."""
        if f.done:
            return
        f.done = True
        p = self._slot(f)
        if f.circuit_key is not None:  # neutral: gives a probe's slot back
            p.circuits[f.work_id] = (f.installed_pack_id, f.circuit_key, circuits.NEUTRAL)
        p.fail.add(f.work_id, f.lease_token, FailOp.RELEASE, unstarted=unstarted)
        p.items.append(f)
        self._flush.set()

    def _slot(self, f: InFlight) -> Pending:
        """Where a finished item waits for its flush: the plain batch, or the newest lane chunk."""
        s_key = f.source_lane_key
        t_key = f.target_mutation_lane_key
        if s_key is None and t_key is None:
            if f.concurrency_key is not None:
                self._pending.slots[f.work_id] = (f.installed_pack_id, f.concurrency_key)
            return self._pending
        chunks = self._lane_chunks
        if not chunks or len(chunks[-1]) >= LANE_FLUSH_MAX:
            chunks.append(Pending())
        p = chunks[-1]
        mine = p.member_lanes[f.work_id] = []
        if s_key is not None:
            mine.append((f.installed_pack_id, LaneKind.SOURCE, s_key))
        if t_key is not None:
            mine.append((f.installed_pack_id, LaneKind.TARGET, t_key))
        p.lanes.update(mine)
        if f.concurrency_key is not None:
            p.slots[f.work_id] = (f.installed_pack_id, f.concurrency_key)
        return p

    def _take(self) -> Pending | None:
        if len(self._pending):
            batch, self._pending = self._pending, Pending()
            return batch
        if self._lane_chunks:
            return self._lane_chunks.popleft()
        return None

    def has_pending(self) -> bool:
        return bool(len(self._pending) or self._lane_chunks)

    async def drain(self, limit_s: float) -> None:
        """Flush until nothing is pending or in flight (or ``limit_s`` passed)."""
        end = monotonic() + limit_s
        while (self.has_pending() or self._inflight_flushes) and monotonic() < end:
            self._flushed.clear()
            self._flush.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flushed.wait(), timeout=max(0.01, end - monotonic()))

    # ------------------------------------------------------------------------------------ flush

    async def run(self) -> None:
        e = self.engine
        conn: AsyncConnection[Any] | None = None
        backoff = 0.05
        while True:
            await self._flush.wait()
            batch = self._take()
            if batch is None:
                self._flush.clear()
                if not self._inflight_flushes:
                    self._flushed.set()
                continue
            if not self.has_pending():
                self._flush.clear()
            self._inflight_flushes += 1
            failures = 0
            try:
                while True:
                    try:
                        if conn is None or conn.closed or e.outdated(conn):
                            await e.give_back(conn)
                            conn = await e.dedicated()
                        await self._flush_batch(conn, batch)
                        backoff = 0.05
                        break
                    except asyncio.CancelledError:
                        await e.give_back(conn)
                        raise
                    except psycopg.errors.DeadlockDetected:
                        m.DEADLOCK_RETRIES.inc()
                        e.stats["deadlocks"] += 1
                    except Exception as exc:
                        e.error("finalize", exc)
                        await evict_if_read_only(conn, exc)  # a read-only server: closed, replaced
                        connection_lost = conn is None or conn.closed or conn.broken
                        if connection_lost:
                            await e.give_back(conn)
                            conn = None
                        else:
                            failures += 1
                        if failures >= FINALIZE_GIVE_UP:
                            # The statement itself keeps failing (not the connection): do not wedge
                            # the process. Abandon the items; their leases expire and another
                            # claimer's reclaim retries them.
                            for f in batch.items:
                                e.abandon(f)
                            break
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 2.0)
            finally:
                self._inflight_flushes -= 1
            self._flushed.set()

    async def _flush_batch(self, conn: AsyncConnection[Any], batch: Pending) -> None:
        """The write (one ``work_item_finalize``), then what follows from what it committed."""
        t0 = monotonic()
        n = len(batch)
        res = await self._write(conn, batch)
        e = self.engine
        m.FINALIZE_SECONDS.labels("yes" if batch.lanes else "no").observe(monotonic() - t0)
        m.FINALIZE_BATCH.observe(n)
        self._count_stale(res)
        self._wake_groups(batch, res)
        self._let_go(batch)
        self._count_outcomes(batch, res)
        figures.finalized(self.engine.figures, batch.items, batch.fail, res)
        m.HELD.set(len(self.engine.held))
        self.engine.space()
        if res.handed:
            # Claimed in the finalize's transaction (a lane handoff): held like claimed rows. The
            # lease started no earlier than we sent the finalize.
            e.stats["handed_off"] = e.stats.get("handed_off", 0) + len(res.handed)
            m.LANE_HANDOFFS.inc(len(res.handed))
            await e.claimer.hold(conn, res.handed, t0 + e.cfg.lease_usable_s)

    async def _write(self, conn: AsyncConnection[Any], batch: Pending) -> work_items.finalize.FinalizeResult:
        """The batch's one store call: every transition fenced by its lease token."""
        e = self.engine
        if batch.lanes:
            # Lane members and plain items of one flush share the transaction: the plain ones just
            # ride along (no lock is taken for them).
            # The members this flush promotes are claimed by this process's own loop (woken below)
            # as far as its window allows; only what it cannot take is announced to the others.
            free = e.capacity - len(e.held) + len(batch)
            # A handoff replaces what this flush lets go, never more: the process's share of the
            # lanes (and of each pack's budget, the fair scheduler's allocation) does not grow by it.
            n = min(free, len(batch))
            handoff = (
                work_items.finalize.Handoff(n, e.owner, e.cfg.lease_s, e.claim_process)
                if e.claiming and n > 0 and LANE_HANDOFF
                else None
            )
            return await work_items.finalize.work_item_finalize(
                conn,
                batch.complete_ids,
                batch.complete_tokens,
                batch.fail,
                batch.lanes,
                notify_above=free if e.claiming else 0,
                slots=batch.slots,
                circuits=batch.circuits,
                member_lanes=batch.member_lanes,
                handoff=handoff,
            )
        return await work_items.finalize.work_item_finalize(
            conn,
            batch.complete_ids,
            batch.complete_tokens,
            batch.fail,
            slots=batch.slots,
            circuits=batch.circuits,
        )

    def _count_stale(self, res: work_items.finalize.FinalizeResult) -> None:
        """Fenced writes that matched nothing (another claimer holds the item now), and completions."""
        stats = self.engine.stats
        if res.complete_stale:
            m.STALE.labels("complete").inc(res.complete_stale)
        if res.fail_stale:
            m.STALE.labels("finalize_failure").inc(res.fail_stale)
        stats["stale"] += res.complete_stale + res.fail_stale
        stats["completed"] += len(res.completed)

    def _wake_groups(self, batch: Pending, res: work_items.finalize.FinalizeResult) -> None:
        """What the write made due in the database, told to the scheduler and the claimer: promoted
        lane members, the deferred items of a circuit that closed (each state change of a circuit is
        one line), parked items of released concurrency slots."""
        e = self.engine
        if res.promoted:
            m.LANE_PROMOTIONS.inc(res.promoted)
            e.scheduler.mark_ready({lane[0] for lane in batch.lanes})
            e.wake.set()
        for t in res.circuits:  # committed: one line per state change of a circuit
            m.CIRCUIT_TRANSITIONS.labels(m.pack_label(t.installed_pack_id), t.state).inc()
            events("executor").emit(
                "circuit_" + t.state,
                t.reason,
                f"circuit {t.state}",
                pack=m.pack_label(t.installed_pack_id),
                target=t.circuit_key,
            )
            if t.state == circuits.CLOSED:  # its deferred items come back on their own time
                e.scheduler.mark_ready({t.installed_pack_id})
                e.wake.set()
        if res.woken:  # parked items of released concurrency slots are due now
            m.SLOT_WAKEUPS.inc(res.woken)
            e.scheduler.mark_ready({slot[0] for slot in batch.slots.values()})
            e.wake.set()

    def _let_go(self, batch: Pending) -> None:
        """The batch's items leave the window."""
        held = self.engine.held
        hbp = self.engine.held_by_pack
        for f in batch.items:
            if held.pop(f.work_id, None) is not None:
                hbp[f.installed_pack_id] -= 1

    def _count_outcomes(self, batch: Pending, res: work_items.finalize.FinalizeResult) -> None:
        """Outcome counters per (pack, work type); a retry's due time told to the scheduler; one line
        per dead letter."""
        e = self.engine
        counts: dict[tuple[int, str, str], int] = {}
        if res.completed:
            kinds = {(c.installed_pack_id, c.work_type) for c in batch.items}
            if len(kinds) == 1:
                pack, work_type = kinds.pop()
                counts[(pack, work_type, "succeeded")] = len(res.completed)
            else:
                kind_of = {c.work_id: (c.installed_pack_id, c.work_type) for c in batch.items}
                for wid in res.completed:
                    k = (*kind_of[wid], "succeeded")
                    counts[k] = counts.get(k, 0) + 1
        if res.transitions:
            fail = batch.fail
            info = {
                wid: (op, delay, cls)
                for wid, op, delay, cls in zip(fail.ids, fail.ops, fail.delays, fail.classes, strict=True)
            }
            by_id = {c.work_id: c for c in batch.items}
            now = monotonic()
            for wid, st in res.transitions:
                op, delay, cls = info[wid]
                f = by_id[wid]
                label = "released" if op == FailOp.RELEASE else st
                k = (f.installed_pack_id, f.work_type, label)
                counts[k] = counts.get(k, 0) + 1
                if op != FailOp.RELEASE and cls:
                    m.failure(f.installed_pack_id, f.work_type, cls)
                if st in ("retry", "pending"):
                    due = now + delay if (op == FailOp.RETRY and delay > 0) else 0.0
                    e.scheduler.note_due(f.installed_pack_id, f.queue_class, due)
                elif st == "dead":  # committed: one line per dead letter (rate-limited per class)
                    events("executor").emit(
                        "dead_letter",
                        cls or "unknown",
                        "work item dead-lettered",
                        work_id=wid,
                        event_id=f.event_id,
                        pack=m.pack_label(f.installed_pack_id),
                        work_type=f.work_type,
                        attempt=f.attempt,
                    )
            e.wake.set()
        for (pack, work_type, label), c in counts.items():
            m.OUTCOMES.labels(m.pack_label(pack), m.work_type_label(work_type), label).inc(c)
