"""The executor core: one claim loop, N workers, one finalizer, a lease keeper, a reclaimer.

Data flow of one item (no per-item round trip anywhere)::

  claim loop ──(claim statement: a batch for several groups)──▶ held + ready deque
  worker     ──(handler)──▶ outcome appended to the pending finalize batch
  finalizer  ──(one fenced UPDATE per batch; lane items: lock → update → settle)──▶ rows final
  lease keeper ──(one fenced renew per interval for every held item)──▶ leases extended / lost

Admission: ``held`` (claimed and not yet finalized) never exceeds ``capacity = workers + prefetch``;
the scheduler (``scheduler.py``) splits the free part of that window between (pack, queue class)
groups. Every time decision against the database uses the database clock (``clock_timestamp()`` in
the statements); this process only measures local intervals with ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import AsyncConnection, Notify
from psycopg_pool import AsyncConnectionPool

from connector.common.listener import Listener, ListenerConfig
from connector.common.schema import CHANNEL_WORK
from connector.common.store import work_items
from connector.common.store.lanes import Lane, LaneKind
from connector.common.store.work_items import EVENT_ROW_BODY, EVENT_ROW_CONTENT_TYPE, FailOp
from connector.executor import metrics as m
from connector.executor.handlers import (
    EventFact,
    HandlerContext,
    Outcome,
    backoff_delay,
    classify,
    sanitize_summary,
)
from connector.executor.handlers.registry import HandlerRegistry, WorkTypeRuntime
from connector.executor.scheduler import Scheduler

log = logging.getLogger(__name__)

monotonic = time.monotonic  # the only clock this module reads (local intervals, never compared to the DB)

FINALIZERS = 2  # concurrent finalize flushes, one connection each (docs/executor.md: measured)
LANE_FLUSH_MAX = 50  # lane members per flush: a round of 100 lanes splits between the two
FINALIZE_GIVE_UP = 5  # a flush whose statement fails this often (connection fine) is abandoned


@dataclass
class EngineConfig:
    workers: int = 16
    claim_batch: int = 64
    prefetch: int = -1  # -1: claim_batch
    lease_s: float = 30.0
    poll_interval_s: float = 0.5
    reclaim_interval_s: float = 5.0
    shutdown_grace_s: float = 10.0
    queue_class_weights: dict[str, float] = field(default_factory=dict)
    pack_weights: dict[str, float] = field(default_factory=dict)
    pack_max_inflight: int = 0
    pack_budgets: dict[str, int] = field(default_factory=dict)
    fair: bool = True
    handler_threads: int = 0  # 0: workers

    @property
    def capacity(self) -> int:
        return self.workers + (self.claim_batch if self.prefetch < 0 else self.prefetch)


class _Pending:
    """Finalizes waiting for the next flush (plain items and lane items kept apart)."""

    __slots__ = ("complete_ids", "complete_tokens", "ctxs", "fail", "lanes")

    def __init__(self) -> None:
        self.complete_ids: list[int] = []
        self.complete_tokens: list[int] = []
        self.fail = work_items.FailBatch()
        self.ctxs: list[HandlerContext] = []
        self.lanes: set[Lane] = set()

    def __len__(self) -> int:
        return len(self.ctxs)


def _unknown_outcome(rt: WorkTypeRuntime) -> Outcome:
    if rt.unknown:
        return Outcome.fail("unknown_work_type", "the pack generation declares no such work type")
    return Outcome.retry(
        None, "handler_unavailable", sanitize_summary(rt.unavailable or "handler unavailable")
    )


class Engine:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        cfg: EngineConfig,
        *,
        owner: str,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.pool = pool
        self.cfg = cfg
        self.owner = owner
        self.capacity = cfg.capacity
        self.scheduler = Scheduler(
            capacity=self.capacity,
            queue_class_weights=cfg.queue_class_weights,
            pack_weights=cfg.pack_weights,
            pack_max_inflight=cfg.pack_max_inflight,
            pack_budgets=cfg.pack_budgets,
            fair=cfg.fair,
        )
        self.threads = ThreadPoolExecutor(
            max_workers=cfg.handler_threads or cfg.workers, thread_name_prefix="connector-handler"
        )
        self.registry = HandlerRegistry(self.threads)
        self.held: dict[int, HandlerContext] = {}
        self.held_by_pack: dict[int, int] = {}
        self.ready: deque[HandlerContext] = deque()
        self.running = 0
        self._idle: deque[asyncio.Future[None]] = deque()
        self._pending = _Pending()  # plain items: one batch, flushed whole
        self._lane_chunks: deque[_Pending] = deque()  # lane members: chunks of <= LANE_FLUSH_MAX
        self._inflight_flushes = 0
        self._wake = asyncio.Event()
        self._flush = asyncio.Event()
        self._flushed = asyncio.Event()
        self._claiming = True
        self._stopping = False
        self._draining = False
        self._rediscover = False  # a NOTIFY arrived: look for new groups at the next iteration
        self._idle_workers = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._workers: list[asyncio.Task[Any]] = []
        self._claim_task: asyncio.Task[Any] | None = None
        self._finalizer_tasks: list[asyncio.Task[Any]] = []
        self._keeper_task: asyncio.Task[Any] | None = None
        self._listener: Listener | None = None
        self._rnd = random.Random()
        self._on_error = on_error
        self._min_claim = max(1, min(cfg.claim_batch, self.capacity) // 4)
        self.known_packs: set[int] = set()
        # Test signals (instead of sleeps): counts that tests may wait on.
        self.stats = {
            "claims": 0,
            "claimed": 0,
            "completed": 0,
            "stale": 0,
            "reclaimed": 0,
            "abandoned": 0,
            "deadlocks": 0,
        }

    # ---------------------------------------------------------------------------------------------
    # lifecycle
    # ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        m.SLOTS.set(self.cfg.workers)
        m.SLOTS_IN_USE.set_function(lambda: self.running)
        self._finalizer_tasks = [
            asyncio.create_task(self._finalizer(), name=f"executor-finalizer-{i}") for i in range(FINALIZERS)
        ]
        self._keeper_task = asyncio.create_task(self._lease_keeper(), name="executor-lease-keeper")
        self._tasks.append(asyncio.create_task(self._reclaimer(), name="executor-reclaimer"))
        self._listener = Listener(
            str(self.pool.conninfo),
            ListenerConfig(channels=(CHANNEL_WORK,), name="executor-listener"),
            on_wake=self._on_notify,
            on_connect=self._on_listen,
            on_error=lambda exc: self._error("listen", exc),
        )
        await self._listener.start()
        self._workers = [
            asyncio.create_task(self._worker(), name=f"executor-worker-{i}") for i in range(self.cfg.workers)
        ]
        self._claim_task = asyncio.create_task(self._claim_loop(), name="executor-claim-loop")

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; give running handlers ``grace_s`` to finish; release everything else
        (immediately claimable elsewhere); flush; stop the loops."""
        grace = self.cfg.shutdown_grace_s if grace_s is None else grace_s
        self._claiming = False
        self._wake.set()
        if self._claim_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._claim_task
        # Prefetched items never started: give them back at once.
        while self.ready:
            ctx = self.ready.popleft()
            self._release(ctx, unstarted=True)
        if self.running:
            self._idle_workers.clear()
            self._draining = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle_workers.wait(), timeout=grace)
        self._stopping = True
        for ctx in list(self.held.values()):
            if ctx._started and not ctx._done:
                ctx._cancel = "shutdown"
                if ctx._task is not None:
                    ctx._task.cancel()
        for fut in self._idle:
            if not fut.done():
                fut.set_result(None)
        for t in self._workers:
            t.cancel()
        for t in self._workers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        # Whatever is still held and not finalized (cancelled handlers, sync handlers still in a
        # thread) is released.
        for ctx in list(self.held.values()):
            if not ctx._done:
                self._release(ctx, unstarted=not ctx._started)
        await self._drain_finalizer(max(2.0, grace))
        loops = [t for t in (*self._finalizer_tasks, self._keeper_task, *self._tasks) if t is not None]
        for t in loops:
            t.cancel()
        for t in loops:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._listener is not None:
            await self._listener.stop()
        await self.registry.close()
        self.threads.shutdown(wait=False, cancel_futures=True)

    def _has_pending(self) -> bool:
        return bool(len(self._pending) or self._lane_chunks)

    async def _drain_finalizer(self, limit_s: float) -> None:
        end = monotonic() + limit_s
        while (self._has_pending() or self._inflight_flushes) and monotonic() < end:
            self._flushed.clear()
            self._flush.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flushed.wait(), timeout=max(0.01, end - monotonic()))

    def _error(self, loop: str, exc: BaseException) -> None:
        m.ERRORS.labels(loop).inc()
        log.warning("executor loop error", extra={"loop": loop, "exc_type": type(exc).__name__})
        if self._on_error is not None:
            self._on_error(loop, exc)

    async def _dedicated(self) -> AsyncConnection[Any]:
        conn = await self.pool.getconn()
        return conn

    async def _return(self, conn: AsyncConnection[Any] | None) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):
                await self.pool.putconn(conn)

    # ---------------------------------------------------------------------------------------------
    # claim loop (the only scanner in this process)
    # ---------------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        conn: AsyncConnection[Any] | None = None
        next_discover = 0.0
        backoff = 0.1
        sched = self.scheduler
        while self._claiming:
            try:
                if conn is None or conn.closed:
                    await self._return(conn)
                    conn = await self._dedicated()
                now = monotonic()
                if now >= next_discover or self._rediscover:
                    self._rediscover = False
                    await self._discover(conn, now)
                    next_discover = now + self.cfg.poll_interval_s
                free = self.capacity - len(self.held)
                if free <= 0 or (free < self._min_claim and self.ready):
                    self._wake.clear()
                    await self._wait(self.cfg.poll_interval_s)
                    continue
                alloc = sched.allocate(min(free, self.cfg.claim_batch), self.held_by_pack, now)
                if not alloc:
                    self._wake.clear()
                    due = sched.next_due()
                    timeout = min(next_discover - now, (due - now) if due else 1e9)
                    if await self._wait(max(0.0, timeout)):
                        sched.mark_ready()
                        next_discover = 0.0
                    continue
                await self._claim(conn, alloc)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._error("claim", exc)
                if conn is not None and (conn.closed or conn.broken):
                    await self._return(conn)
                    conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        await self._return(conn)

    async def _wait(self, limit_s: float) -> bool:
        """Wait for a wake-up (True) or ``limit_s`` seconds (False)."""
        if self._wake.is_set():
            return True
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=limit_s)
            return True
        except TimeoutError:
            return False

    async def _discover(self, conn: AsyncConnection[Any], now: float) -> None:
        rows = await work_items.work_item_ready_groups(conn)
        new = {r[0] for r in rows} - self.known_packs
        if new:
            names = await work_items.pack_names(conn)
            m.PACK_NAMES.update(names)  # the metrics' pack label is the name
            if self.cfg.pack_weights or self.cfg.pack_budgets:
                self.scheduler.set_pack_names(names)
        self.known_packs |= new
        self.scheduler.observe(rows, now)

    async def _claim(self, conn: AsyncConnection[Any], alloc: list[tuple[Any, int]]) -> None:
        packs = [g.pack for g, _ in alloc]
        qcs = [g.queue_class for g, _ in alloc]
        limits = [n for _, n in alloc]
        t0 = monotonic()
        rows = await work_items.work_item_claim_batch(
            conn, packs, qcs, limits, owner=self.owner, lease_s=self.cfg.lease_s
        )
        dt = monotonic() - t0
        m.CLAIM_SECONDS.observe(dt)
        m.CLAIM_STATEMENTS.labels("rows" if rows else "empty").inc()
        m.CLAIM_BATCH.observe(len(rows))
        self.stats["claims"] += 1
        self.stats["claimed"] += len(rows)
        deadline = t0 + self.cfg.lease_s  # the lease started no earlier than we sent the claim
        if len(alloc) == 1:
            g, n = alloc[0]
            self.scheduler.record(g, n, len(rows))
            if rows:
                m.CLAIMED.labels(m.pack_label(g.pack), g.queue_class).inc(len(rows))
        else:
            got: dict[tuple[int, str], int] = {}
            for r in rows:
                k = (r[2], r[4])
                got[k] = got.get(k, 0) + 1
            for g, n in alloc:
                c = got.get(g.key, 0)
                self.scheduler.record(g, n, c)
                if c:
                    m.CLAIMED.labels(m.pack_label(g.pack), g.queue_class).inc(c)
        if not rows:
            return
        registry = self.registry
        lookup = registry.lookup
        held = self.held
        hbp = self.held_by_pack
        ctxs = []
        need_event: list[HandlerContext] = []
        for r in rows:
            ctx = HandlerContext(r, deadline)
            if not registry.loaded(ctx.installed_pack_id, ctx.generation):
                await self._load_generation(conn, ctx.installed_pack_id, ctx.generation)
            rt = lookup(ctx.installed_pack_id, ctx.generation, ctx.work_type)
            ctx._handler = rt
            if rt.needs_event:
                need_event.append(ctx)
            held[ctx.work_id] = ctx
            hbp[ctx.installed_pack_id] = hbp.get(ctx.installed_pack_id, 0) + 1
            ctxs.append(ctx)
        if need_event:
            try:
                await self._attach_events(conn, need_event)
            except Exception:
                # Claimed but not runnable: give them back rather than run without their context.
                for ctx in ctxs:
                    self._release(ctx, unstarted=True)
                raise
        self.ready.extend(ctxs)
        m.HELD.set(len(held))
        idle = self._idle
        for _ in range(min(len(ctxs), len(idle))):
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)

    async def _load_generation(self, conn: AsyncConnection[Any], pack: int, generation: int) -> None:
        found = await work_items.pack_generation_manifest(conn, pack, generation)
        if found is None:
            self.registry.install_broken(pack, generation, "the pack generation has no manifest row")
            return
        doc, name = found
        try:
            self.registry.install(pack, generation, doc, name)
        except Exception as exc:  # a stored manifest this version cannot read: fail closed, retry
            self._error("manifest", exc)
            self.registry.install_broken(
                pack, generation, f"the pack generation's manifest is not valid here ({type(exc).__name__})"
            )

    async def _attach_events(self, conn: AsyncConnection[Any], ctxs: list[HandlerContext]) -> None:
        rows = await work_items.work_item_event_batch(conn, sorted({c.event_id for c in ctxs}))
        by_id: dict[int, tuple[Any, ...]] = {int(r[0]): r for r in rows}
        for ctx in ctxs:
            r = by_id.get(ctx.event_id)
            if r is None:
                continue
            ctx.event = EventFact(*r[:EVENT_ROW_BODY])
            body = r[EVENT_ROW_BODY]
            ctx.payload = bytes(body) if body is not None else None
            ctx.content_type = r[EVENT_ROW_CONTENT_TYPE]

    # ---------------------------------------------------------------------------------------------
    # workers
    # ---------------------------------------------------------------------------------------------

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        ready = self.ready
        idle = self._idle
        me = asyncio.current_task()
        finish = self._finish
        n = 0
        while True:
            if not ready:
                fut = loop.create_future()
                idle.append(fut)
                await fut
                continue
            ctx = ready.popleft()
            if ctx.lease_lost:
                self._abandon(ctx)
                continue
            rt = ctx._handler
            self.running += 1
            ctx._started = True
            ctx._task = me
            try:
                handler = rt.handler
                if handler is None:
                    out: Outcome | None = _unknown_outcome(rt)
                else:
                    ctx._t0 = t0 = monotonic()
                    try:
                        out = await handler(ctx)
                    finally:
                        m.handler_seconds(ctx.installed_pack_id, ctx.work_type).observe(monotonic() - t0)
            except asyncio.CancelledError:
                reason = ctx._cancel
                if reason is None or reason == "shutdown" or me is None:
                    self.running -= 1
                    ctx._task = None
                    raise
                me.uncancel()
                out = (
                    None
                    if reason == "lost"
                    else Outcome.retry(None, "timeout", "the handler overran its timeout")
                )
            except Exception as exc:
                out = classify(exc, ctx.payload)
            self.running -= 1
            ctx._task = None
            finish(ctx, out)
            if self._draining and not self.running:
                self._idle_workers.set()
            n += 1
            if n & 31 == 0:
                await asyncio.sleep(0)  # handlers that never suspend must not starve the other loops

    def _finish(self, ctx: HandlerContext, out: Outcome | None) -> None:
        ctx._done = True
        if ctx.lease_lost and ctx._cancel == "lost":
            # Cancelled because the lease was lost: nothing to write.
            self._abandon(ctx)
            return
        p = self._slot(ctx)
        if out is None or out.kind == "success":
            p.complete_ids.append(ctx.work_id)
            p.complete_tokens.append(ctx.lease_token)
        elif out.kind == "retry":
            delay = out.delay_s
            if delay is None:
                pol = ctx._handler.retry
                delay = backoff_delay(
                    ctx.attempt, pol.backoff_base_s, pol.backoff_cap_s, pol.jitter, self._rnd
                )
            p.fail.add(
                ctx.work_id,
                ctx.lease_token,
                FailOp.RETRY,
                delay=max(0.0, float(delay)),
                failure_class=out.failure_class,
                summary=out.summary,
            )
        else:
            p.fail.add(
                ctx.work_id,
                ctx.lease_token,
                FailOp.DEAD,
                failure_class=out.failure_class,
                summary=out.summary,
            )
        p.ctxs.append(ctx)
        self._flush.set()

    def _release(self, ctx: HandlerContext, *, unstarted: bool) -> None:
        if ctx._done:
            return
        ctx._done = True
        p = self._slot(ctx)
        p.fail.add(ctx.work_id, ctx.lease_token, FailOp.RELEASE, unstarted=unstarted)
        p.ctxs.append(ctx)
        self._flush.set()

    def _slot(self, ctx: HandlerContext) -> _Pending:
        """Where a finished item waits for its flush: the plain batch, or the newest lane chunk."""
        s_key = ctx.source_lane_key
        t_key = ctx.target_mutation_lane_key
        if s_key is None and t_key is None:
            return self._pending
        chunks = self._lane_chunks
        if not chunks or len(chunks[-1]) >= LANE_FLUSH_MAX:
            chunks.append(_Pending())
        p = chunks[-1]
        if s_key is not None:
            p.lanes.add((ctx.installed_pack_id, LaneKind.SOURCE, s_key))
        if t_key is not None:
            p.lanes.add((ctx.installed_pack_id, LaneKind.TARGET, t_key))
        return p

    def _take(self) -> _Pending | None:
        if len(self._pending):
            batch, self._pending = self._pending, _Pending()
            return batch
        if self._lane_chunks:
            return self._lane_chunks.popleft()
        return None

    def _abandon(self, ctx: HandlerContext) -> None:
        ctx._done = True
        if self.held.pop(ctx.work_id, None) is not None:
            self.held_by_pack[ctx.installed_pack_id] -= 1
            m.ABANDONED.inc()
            self.stats["abandoned"] += 1
            self._space()

    def _space(self) -> None:
        if not self._wake.is_set() and (self.capacity - len(self.held) >= self._min_claim or not self.ready):
            self._wake.set()

    # ---------------------------------------------------------------------------------------------
    # finalizers: FINALIZERS flushers, each with its own connection. A flusher takes the whole plain
    # batch, or one chunk of lane members; whatever finishes meanwhile forms the next batch. Lane
    # chunks are small so that promotions commit early and the claim loop, the other flusher and
    # this one keep both database cores busy (a lane advances one member per flush).
    # ---------------------------------------------------------------------------------------------

    async def _finalizer(self) -> None:
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
            if not self._has_pending():
                self._flush.clear()
            self._inflight_flushes += 1
            failures = 0
            try:
                while True:
                    try:
                        if conn is None or conn.closed:
                            await self._return(conn)
                            conn = await self._dedicated()
                        await self._flush_batch(conn, batch)
                        backoff = 0.05
                        break
                    except asyncio.CancelledError:
                        await self._return(conn)
                        raise
                    except psycopg.errors.DeadlockDetected:
                        m.DEADLOCK_RETRIES.inc()
                        self.stats["deadlocks"] += 1
                    except Exception as exc:
                        self._error("finalize", exc)
                        connection_lost = conn is None or conn.closed or conn.broken
                        if connection_lost:
                            await self._return(conn)
                            conn = None
                        else:
                            failures += 1
                        if failures >= FINALIZE_GIVE_UP:
                            # The statement itself keeps failing (not the connection): do not wedge
                            # the process. Abandon the items; their leases expire and another
                            # claimer's reclaim retries them.
                            for ctx in batch.ctxs:
                                self._abandon(ctx)
                            break
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 2.0)
            finally:
                self._inflight_flushes -= 1
            self._flushed.set()

    async def _flush_batch(self, conn: AsyncConnection[Any], batch: _Pending) -> None:
        t0 = monotonic()
        n = len(batch)
        if batch.lanes:
            # Lane members and plain items of one flush share the transaction: the plain ones just
            # ride along (no lock is taken for them).
            # The members this flush promotes are claimed by this process's own loop (woken below)
            # as far as its window allows; only what it cannot take is announced to the others.
            free = self.capacity - len(self.held) + len(batch)
            res = await work_items.work_item_finalize(
                conn,
                batch.complete_ids,
                batch.complete_tokens,
                batch.fail,
                batch.lanes,
                notify_above=free if self._claiming else 0,
            )
        else:
            res = await work_items.work_item_finalize(
                conn, batch.complete_ids, batch.complete_tokens, batch.fail
            )
        m.FINALIZE_SECONDS.labels("yes" if batch.lanes else "no").observe(monotonic() - t0)
        m.FINALIZE_BATCH.observe(n)
        if res.complete_stale:
            m.STALE.labels("complete").inc(res.complete_stale)
        if res.fail_stale:
            m.STALE.labels("finalize_failure").inc(res.fail_stale)
        self.stats["stale"] += res.complete_stale + res.fail_stale
        self.stats["completed"] += len(res.completed)
        if res.promoted:
            m.LANE_PROMOTIONS.inc(res.promoted)
            self.scheduler.mark_ready({lane[0] for lane in batch.lanes})
            self._wake.set()
        held = self.held
        hbp = self.held_by_pack
        for ctx in batch.ctxs:
            if held.pop(ctx.work_id, None) is not None:
                hbp[ctx.installed_pack_id] -= 1
        counts: dict[tuple[int, str, str], int] = {}
        if res.completed:
            kinds = {(c.installed_pack_id, c.work_type) for c in batch.ctxs}
            if len(kinds) == 1:
                pack, work_type = kinds.pop()
                counts[(pack, work_type, "succeeded")] = len(res.completed)
            else:
                kind_of = {c.work_id: (c.installed_pack_id, c.work_type) for c in batch.ctxs}
                for wid in res.completed:
                    k = (*kind_of[wid], "succeeded")
                    counts[k] = counts.get(k, 0) + 1
        if res.transitions:
            fail = batch.fail
            info = {
                wid: (op, delay, cls)
                for wid, op, delay, cls in zip(fail.ids, fail.ops, fail.delays, fail.classes, strict=True)
            }
            by_id = {c.work_id: c for c in batch.ctxs}
            now = monotonic()
            for wid, st in res.transitions:
                op, delay, cls = info[wid]
                ctx = by_id[wid]
                label = "released" if op == FailOp.RELEASE else st
                k = (ctx.installed_pack_id, ctx.work_type, label)
                counts[k] = counts.get(k, 0) + 1
                if op != FailOp.RELEASE and cls:
                    m.failure(ctx.installed_pack_id, ctx.work_type, cls)
                if st in ("retry", "pending"):
                    due = now + delay if (op == FailOp.RETRY and delay > 0) else 0.0
                    self.scheduler.note_due(ctx.installed_pack_id, ctx.queue_class, due)
            self._wake.set()
        for (pack, work_type, label), c in counts.items():
            m.OUTCOMES.labels(m.pack_label(pack), m.work_type_label(work_type), label).inc(c)
        m.HELD.set(len(held))
        self._space()

    # ---------------------------------------------------------------------------------------------
    # lease keeper: renew every held, undecided item in one fenced statement; enforce timeouts
    # ---------------------------------------------------------------------------------------------

    async def _lease_keeper(self) -> None:
        interval = max(0.05, self.cfg.lease_s / 3.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._renew_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._error("renew", exc)
            self._expire_local()

    async def _renew_once(self) -> None:
        live = sorted((c for c in self.held.values() if not c._done), key=lambda c: c.work_id)
        self._enforce_timeouts(live)
        if not live:
            return
        ids = [c.work_id for c in live]
        tokens = [c.lease_token for c in live]
        t0 = monotonic()
        async with self.pool.connection() as conn:
            renewed = await work_items.work_item_renew_lease_batch(
                conn, ids, tokens, lease_s=self.cfg.lease_s
            )
        deadline = t0 + self.cfg.lease_s
        lost = 0
        for c in live:
            if c.work_id in renewed:
                c._deadline = deadline
            elif not c._done and self.held.get(c.work_id) is c:
                lost += 1
                self._lose(c)
        if renewed:
            m.RENEWED.inc(len(renewed))
        if lost:
            m.STALE.labels("renew").inc(lost)
            self.stats["stale"] += lost

    def _lose(self, ctx: HandlerContext) -> None:
        """This process no longer holds the lease: abandon the item."""
        ctx.lease_lost = True
        if not ctx._started:
            with contextlib.suppress(ValueError):
                self.ready.remove(ctx)
            self._abandon(ctx)
            return
        handler = ctx._handler.handler
        if ctx._task is not None and getattr(handler, "is_async", True):
            ctx._cancel = "lost"
            ctx._task.cancel()
        # A sync handler cannot be interrupted: its late result is written fenced (and rejected).

    def _expire_local(self) -> None:
        """No successful renewal within the lease (database unreachable): presume the lease lost."""
        now = monotonic()
        for c in list(self.held.values()):
            if not c._done and c._deadline <= now:
                self._lose(c)

    def _enforce_timeouts(self, live: list[HandlerContext]) -> None:
        now = monotonic()
        for c in live:
            if c._task is None or c._cancel is not None:
                continue
            rt = c._handler
            if c._t0 and now - c._t0 > rt.timeout_s:
                c._cancel = "timeout"
                c._task.cancel()

    # ---------------------------------------------------------------------------------------------
    # reclaimer and listener callbacks
    # ---------------------------------------------------------------------------------------------

    async def _reclaimer(self) -> None:
        while True:
            interval = self.cfg.reclaim_interval_s
            await asyncio.sleep(interval * (0.8 + 0.4 * self._rnd.random()))
            try:
                await self.reclaim_once()
            except asyncio.CancelledError:
                raise
            except psycopg.errors.DeadlockDetected:
                m.DEADLOCK_RETRIES.inc()
                self.stats["deadlocks"] += 1
            except Exception as exc:
                self._error("reclaim", exc)

    async def reclaim_once(self) -> list[work_items.Reclaimed]:
        async with self.pool.connection() as conn:
            rows = await work_items.work_item_reclaim_expired(conn)
        if rows:
            for st in ("retry", "dead"):
                c = sum(1 for r in rows if r.state == st)
                if c:
                    m.RECLAIMED.labels(st).inc(c)
            self.stats["reclaimed"] += len(rows)
            self.scheduler.mark_ready({r.installed_pack_id for r in rows})
            self._wake.set()
        return rows

    def _on_notify(self, notes: list[Notify]) -> None:
        self.scheduler.mark_ready()
        if any(note.payload != "lanes" for note in notes):  # lane promotions stay within known groups
            self._rediscover = True
        self._wake.set()

    def _on_listen(self, conn: AsyncConnection[Any], reconnect: bool) -> None:
        # Anything may have happened while we were not listening.
        self.scheduler.mark_ready()
        self._wake.set()


def engine_config_from_settings(cfg: Any, **overrides: Any) -> EngineConfig:
    from connector.executor.scheduler import parse_budgets, parse_weights

    ec = EngineConfig(
        workers=cfg.workers,
        claim_batch=cfg.claim_batch,
        prefetch=getattr(cfg, "prefetch", -1),
        lease_s=cfg.lease_s,
        poll_interval_s=cfg.poll_interval_s,
        reclaim_interval_s=getattr(cfg, "reclaim_interval_s", 5.0),
        shutdown_grace_s=cfg.shutdown_grace_s,
        queue_class_weights=parse_weights(getattr(cfg, "queue_class_weights", "")),
        pack_weights=parse_weights(getattr(cfg, "pack_weights", "")),
        pack_max_inflight=getattr(cfg, "pack_max_inflight", 0),
        pack_budgets=parse_budgets(getattr(cfg, "pack_budgets", "")),
        handler_threads=getattr(cfg, "handler_threads", 0),
    )
    for k, v in overrides.items():
        setattr(ec, k, v)
    return ec
