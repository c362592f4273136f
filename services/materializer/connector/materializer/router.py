"""The routing loop: claim due receipts, plan them, write events + WorkItems, exactly once.

One ``Router`` per process runs ``concurrency`` worker tasks. Each worker repeats:

1. **claim** a batch (``receipt_claim_routable``: token + lease from the database clock, serialized
   with other claimers so batches are contiguous in due order);
2. **plan** every receipt against the cached active route (``materialization.plan_batch``): an event draft, a
   permanent failure (no route, parse failure, required field missing) or a retryable one;
3. **gate** lane receipts: a receipt that adds lane members waits while an earlier receipt of its
   namespace is still claimed by another live batch (``receipt_inflight_floor``), so batches commit
   lane members in receipt order (bounded by ``order_wait_max_s``; docs/adr/004-materializer.md);
4. **write** one transaction for the batch: share-lock and re-check the pack snapshot, fence-mark the
   receipts (materialized / failed / retry), lock the batch's lanes once (sorted), insert the events
   and WorkItems with multi-row statements, settle the lanes (re-blocking members overtaken by a late
   earlier delivery), notify executors, commit.

A bad receipt cannot poison its batch: permanent failures are decided before the transaction, and an
unexpected database error makes the batch fall back to one transaction per receipt, where only the
failing receipt backs off. A lost connection leaves the claims to expire and be re-claimed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from connector.common.core import tracing
from connector.common.core.eventlog import events
from connector.common.core.settings import MaterializerSettings
from connector.common.delivery.materialization import (
    DB_ERROR,
    NO_CLAIM_AUTHORITY,
    NO_ROUTE,
    ROUTE_UNAVAILABLE,
    EventDraft,
    Failure,
    Plan,
    RouteCompiler,
    materialize,
    plan_batch,
    work_rows,
)
from connector.common.packs.routes import ActivePack, ActiveRoute, RouteCache
from connector.common.store.events import event_id_reserve
from connector.common.store.packs import pack_active_check
from connector.common.store.receipts.routing import (
    ReceiptRow,
    receipt_claim_routable,
    receipt_inflight_floor,
    receipt_mark_failed_batch,
    receipt_mark_materialized_batch,
    receipt_mark_retry_batch,
    receipt_release_batch,
)
from connector.materializer import metrics

log = logging.getLogger(__name__)

#: Re-plans of one batch after the pack snapshot changed under it before its receipts back off.
MAX_REPLANS = 5


@dataclass(frozen=True, slots=True)
class RouterConfig:
    owner: str
    batch_size: int = 256
    lease_s: float = 30.0
    poll_interval_s: float = 1.0
    max_attempts: int = 10
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    concurrency: int = 2
    #: A pending receipt waits at most this long for the commit horizon (see store/receipts.py).
    horizon_wait_s: float = 5.0
    #: A lane receipt waits at most this long for earlier in-flight receipts (ordering gate).
    order_wait_max_s: float = 5.0

    @classmethod
    def from_settings(cls, cfg: MaterializerSettings, owner: str) -> RouterConfig:
        return cls(
            owner=owner,
            batch_size=cfg.batch_size,
            lease_s=cfg.lease_s,
            poll_interval_s=cfg.poll_interval_s,
            max_attempts=cfg.max_attempts,
            backoff_base_s=cfg.backoff_base_s,
            backoff_cap_s=cfg.backoff_cap_s,
            concurrency=cfg.concurrency,
            horizon_wait_s=cfg.horizon_wait_s,
            # A lane receipt never waits long enough to lose its own claim.
            order_wait_max_s=min(cfg.order_wait_max_s, cfg.lease_s / 3),
        )


@dataclass(slots=True)
class BatchResult:
    claimed: int = 0
    materialized: int = 0
    failed: int = 0
    retried: int = 0
    #: Fenced off: the claim had expired and another claimer won.
    lost: int = 0
    work_items: int = 0
    demoted: int = 0
    inverted: int = 0
    deferred: int = 0

    def add(self, other: BatchResult) -> None:
        for name in (
            "materialized", "failed", "retried", "lost", "work_items", "demoted", "inverted", "deferred",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(eq=False, slots=True)
class _Inflight:
    """A batch this process is routing (the in-process part of the ordering gate)."""

    min_id: int
    ids: set[int]
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SnapshotChanged(Exception):
    """The pack generation / claim authority in the database differs from the cached one."""


@dataclass(slots=True)
class _Write:
    drafts: list[EventDraft] = field(default_factory=list)
    failed: list[tuple[ReceiptRow, str, str]] = field(default_factory=list)
    retry: list[tuple[ReceiptRow, str, str, float]] = field(default_factory=list)


_TRANSIENT = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, pg_errors.LockNotAvailable)


class Router:
    """Claims and materializes receipts. ``start``/``stop`` run the workers; ``run_once`` and
    ``drain`` drive it step by step (tests, backfill-like tools)."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        cache: RouteCache,
        cfg: RouterConfig,
    ) -> None:
        self._pool = pool
        self._cache = cache
        self.cfg = cfg
        self._compiler = RouteCompiler()
        self._refresh_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._wakeups: list[asyncio.Event] = []
        #: Workers waiting for a wake-up (longest waiting first), and whether a wake-up found every
        #: worker busy (the next to finish its batch claims again before it waits).
        self._idle: list[asyncio.Event] = []
        self._missed = False
        self._stopping = False
        self._stopped = asyncio.Event()
        self._inflight: list[_Inflight] = []
        #: While tracing: the routing span of each receipt in flight (by receipt id).
        self._spans: dict[int, Any] = {}
        self._span_outcome: set[int] = set()  # receipt ids whose span has its outcome
        #: Totals since start (tests and the benchmark read them).
        self.totals = BatchResult()

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._stopping = False
        self._stopped.clear()
        self._wakeups = [asyncio.Event() for _ in range(max(1, self.cfg.concurrency))]
        self._tasks = [
            asyncio.create_task(self._worker(ev), name=f"materializer-router-{i}")
            for i, ev in enumerate(self._wakeups)
        ]

    async def stop(self) -> None:
        """Finish the batches in flight (or release them), then stop the workers."""
        self._stopping = True
        self._stopped.set()
        for ev in self._wakeups:
            ev.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def wake(self) -> None:
        """New receipts (NOTIFY) or changed routes: one idle worker claims now. Waking them all
        made every other worker send an empty claim (4 statements: docs/benchmarks.md, "SQL
        budget"), since one claim takes everything due; a full batch wakes the next worker, so a
        backlog still gets them all. With none idle, the next worker to finish its batch claims
        again before it waits (no wake-up is lost)."""
        for ev in self._idle:
            if not ev.is_set():
                ev.set()
                return
        self._missed = True

    async def refresh_routes(self, trigger: str = "check") -> None:
        async with self._refresh_lock:
            async with self._pool.connection() as conn:
                await self._cache.refresh(conn)
            metrics.ROUTE_RELOADS.labels(trigger).inc()

    async def _worker(self, wakeup: asyncio.Event) -> None:
        backoff = 0.1
        while not self._stopping:
            wakeup.clear()
            try:
                result = await self.run_once()
                backoff = 0.1
            except (psycopg.OperationalError, PoolTimeout) as exc:
                metrics.LOOP_ERRORS.labels("connection").inc()
                log.warning("routing loop: database unavailable", extra={"error_class": type(exc).__name__})
                await self._sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception as exc:
                metrics.LOOP_ERRORS.labels("unexpected").inc()
                log.error("routing loop error", extra={"error_class": type(exc).__name__})
                await self._sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if result.claimed >= self.cfg.batch_size:
                self.wake()  # a full batch: more is probably due, for a peer too
                continue
            if self._stopping:
                break
            if self._missed:  # a wake-up came while every worker was busy
                self._missed = False
                continue
            self._idle.append(wakeup)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), self.cfg.poll_interval_s)
            finally:
                self._idle.remove(wakeup)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short by ``stop``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    # ---------------------------------------------------------------------------------- one round

    async def run_once(self) -> BatchResult:
        """Claim one batch and route it. Returns what happened."""
        started = time.perf_counter()
        async with self._pool.connection() as conn:
            receipts = await receipt_claim_routable(
                conn,
                owner=self.cfg.owner,
                limit=self.cfg.batch_size,
                lease_s=self.cfg.lease_s,
                horizon_wait_s=self.cfg.horizon_wait_s,
            )
        metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
        if not receipts:
            return BatchResult()
        metrics.BATCH_SIZE.observe(len(receipts))
        result = await self.route(receipts)
        metrics.BATCH_SECONDS.observe(time.perf_counter() - started)
        self.totals.claimed += result.claimed
        self.totals.add(result)
        return result

    async def drain(self, within_s: float = 30.0) -> BatchResult:
        """Route until nothing is due (tests)."""
        deadline = time.monotonic() + within_s
        total = BatchResult()
        while time.monotonic() < deadline:
            result = await self.run_once()
            total.claimed += result.claimed
            total.add(result)
            if result.claimed == 0:
                return total
        raise TimeoutError("receipts still due after drain timeout")

    async def route(self, receipts: Sequence[ReceiptRow]) -> BatchResult:
        """Route claimed receipts (all of them end materialized, failed, retry, or released)."""
        batch = _Inflight(min(r.receipt_id for r in receipts), {r.receipt_id for r in receipts})
        self._inflight.append(batch)
        if tracing.ENABLED:
            self._start_spans(receipts)
        try:
            return await self._route(receipts, batch)
        finally:
            self._inflight.remove(batch)
            batch.done.set()
            if self._spans:
                self._end_spans(receipts)

    def _start_spans(self, receipts: Sequence[ReceiptRow]) -> None:
        """One span per receipt, continuing the trace the ingress stored on it (docs/tracing.md)."""
        for r in receipts:
            self._spans[r.receipt_id] = tracing.start_span(
                tracing.ROUTE_SPAN,
                r.traceparent,
                {
                    "connector.receipt_id": r.receipt_id,
                    "connector.namespace": r.namespace,
                    "connector.route_key": r.route_key,
                    "connector.routing_attempt": r.attempts,
                },
            )

    def _end_spans(self, receipts: Sequence[ReceiptRow]) -> None:
        for r in receipts:
            span = self._spans.pop(r.receipt_id, None)
            if span is not None:
                if r.receipt_id in self._span_outcome:
                    self._span_outcome.discard(r.receipt_id)
                else:
                    span.set_attribute("connector.outcome", "released")
                span.end()

    def _traceparents(self, drafts: Sequence[EventDraft]) -> dict[int, str | None]:
        """The context each draft's WorkItems carry: its routing span's (the receipt's own when it
        has no span)."""
        spans = self._spans
        out: dict[int, str | None] = {}
        for d in drafts:
            rid = d.receipt.receipt_id
            span = spans.get(rid)
            out[rid] = tracing.traceparent_of(span) if span is not None else d.receipt.traceparent
        return out

    def _trace_outcomes(
        self, write: _Write, live: list[EventDraft], event_ids: dict[int, int], done: set[int]
    ) -> None:
        spans = self._spans
        for d in write.drafts:  # fenced off: another claimer holds the receipt now
            span = spans.get(d.receipt.receipt_id)
            if span is not None and d.receipt.receipt_id not in done:
                self._span_outcome.add(d.receipt.receipt_id)
                span.set_attribute("connector.outcome", "lost")
        for d in live:
            span = spans.get(d.receipt.receipt_id)
            if span is not None:
                self._span_outcome.add(d.receipt.receipt_id)
                span.set_attribute("connector.outcome", "materialized")
                span.set_attribute("connector.event_id", event_ids[d.receipt.receipt_id])
                span.set_attribute("connector.work_items", len(d.work))
        for receipt, error_class, _ in write.failed:
            span = spans.get(receipt.receipt_id)
            if span is not None and receipt.receipt_id in done:
                self._span_outcome.add(receipt.receipt_id)
                span.set_attribute("connector.outcome", "failed")
                span.set_attribute("connector.error_class", error_class)
                tracing.set_error(span, error_class)
        for receipt, error_class, _, _ in write.retry:
            span = spans.get(receipt.receipt_id)
            if span is not None and receipt.receipt_id in done:
                self._span_outcome.add(receipt.receipt_id)
                span.set_attribute("connector.outcome", "retry")
                span.set_attribute("connector.error_class", error_class)
                tracing.set_error(span, error_class)

    async def _route(self, receipts: Sequence[ReceiptRow], batch: _Inflight) -> BatchResult:
        total = BatchResult(claimed=len(receipts))
        todo: list[ReceiptRow] = list(receipts)
        order_deadline = time.monotonic() + self.cfg.order_wait_max_s
        delay = 0.005
        replans = 0
        while todo:
            plans = plan_batch(todo, self._lookup, self._compiler, max_attempts=self.cfg.max_attempts)
            now, deferred = await self._order_gate(plans, batch, order_deadline)
            if now:
                try:
                    total.add(await self._write_with_retries(now))
                except SnapshotChanged:
                    metrics.SNAPSHOT_CHANGES.inc()
                    replans += 1
                    await self.refresh_routes("snapshot_changed")
                    if replans <= MAX_REPLANS:
                        continue
                    gave_up = [self._as_retry(p, ROUTE_UNAVAILABLE) for p in now]
                    total.add(await self._write(gave_up, check_snapshot=False))
            if not deferred:
                break
            total.deferred += len(deferred)
            todo = [p.receipt for p in deferred]
            if self._stopping:
                async with self._pool.connection() as conn:
                    await receipt_release_batch(conn, todo)
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
        return total

    def _lookup(self, namespace: str, route_key: str) -> tuple[ActivePack | None, ActiveRoute | None]:
        pack = self._cache.pack(namespace)
        return pack, (pack.routes.get(route_key) if pack is not None else None)

    def _as_retry(self, plan: Plan, error_class: str) -> Failure:
        return Failure(plan.receipt, error_class, "pack generation kept changing during routing")

    async def _order_gate(
        self, plans: list[Plan], batch: _Inflight, deadline: float
    ) -> tuple[list[Plan], list[Plan]]:
        """Split ``plans`` into what may be written now and lane receipts that must wait for an
        earlier receipt of their namespace still being routed elsewhere (docs/adr/004)."""
        lane_plans = [p for p in plans if isinstance(p, EventDraft) and p.has_lanes]
        if not lane_plans:
            return plans, []
        # Earlier batches of this process: wait for them to finish (no polling).
        for other in list(self._inflight):
            if other is not batch and other.min_id < batch.min_id:
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(other.done.wait(), remaining)
        # Earlier receipts claimed by other processes: defer the later lane receipts.
        mine = [rid for b in self._inflight for rid in b.ids]
        async with self._pool.connection() as conn:
            floors = await receipt_inflight_floor(conn, {p.receipt.namespace for p in lane_plans}, mine)
        if not floors:
            return plans, []
        force = time.monotonic() >= deadline
        now: list[Plan] = []
        deferred: list[Plan] = []
        late = 0
        for p in plans:
            floor = floors.get(p.receipt.namespace)
            if (
                isinstance(p, EventDraft)
                and p.has_lanes
                and floor is not None
                and floor < p.receipt.receipt_id
            ):
                late += 1
                (now if force else deferred).append(p)
            else:
                now.append(p)
        if late:
            (metrics.ORDER_WAIT_EXPIRED if force else metrics.ORDER_DEFERRALS).inc(late)
        return now, deferred

    # ---------------------------------------------------------------------------------- writes

    def _split(self, plans: Sequence[Plan]) -> _Write:
        write = _Write()
        for p in plans:
            if isinstance(p, EventDraft):
                write.drafts.append(p)
                continue
            receipt = p.receipt
            if p.permanent or receipt.attempts >= self.cfg.max_attempts:
                summary = (
                    p.summary if p.permanent else f"gave up after {receipt.attempts} attempts: {p.summary}"
                )
                write.failed.append((receipt, p.error_class, summary[:500]))
            else:
                write.retry.append((receipt, p.error_class, p.summary[:500], self._backoff(receipt.attempts)))
        return write

    def _backoff(self, attempts: int) -> float:
        delay = min(self.cfg.backoff_cap_s, self.cfg.backoff_base_s * (2 ** max(attempts - 1, 0)))
        return delay * (0.8 + 0.4 * random.random())

    async def _write_with_retries(self, plans: Sequence[Plan]) -> BatchResult:
        for attempt in range(3):
            try:
                return await self._write(plans)
            except _TRANSIENT:
                metrics.TRANSIENT_RETRIES.inc()
                await asyncio.sleep(0.01 * (attempt + 1) * (1 + random.random()))
            except SnapshotChanged:
                raise
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                # One receipt's data the database refuses must not fail its companions.
                metrics.BATCH_FALLBACKS.inc()
                log.warning(
                    "batch write failed; retrying one receipt per transaction",
                    extra={
                        "error_class": type(exc).__name__,
                        "sqlstate": exc.sqlstate,
                        "receipts": len(plans),
                    },
                )
                return await self._write_each(plans)
        return await self._write_each(plans)

    async def _write_each(self, plans: Sequence[Plan]) -> BatchResult:
        total = BatchResult()
        failing: list[Plan] = []
        for p in plans:
            try:
                total.add(await self._write([p]))
            except SnapshotChanged:
                raise
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                failing.append(
                    Failure(
                        p.receipt, DB_ERROR, f"database refused the write ({exc.sqlstate or 'no sqlstate'})"
                    )
                )
        if failing:
            total.add(await self._write(failing))
        return total

    async def _write(self, plans: Sequence[Plan], *, check_snapshot: bool = True) -> BatchResult:
        """One transaction for ``plans``; raises SnapshotChanged (nothing written) when the pack
        snapshot the plans used is no longer the database's."""
        write = self._split(plans)
        result = BatchResult()
        checked_namespaces = {
            p.receipt.namespace
            for p in plans
            if check_snapshot
            and (
                isinstance(p, EventDraft)
                or p.error_class in (NO_ROUTE, NO_CLAIM_AUTHORITY, ROUTE_UNAVAILABLE)
            )
        }
        async with self._pool.connection() as conn:
            reserved = await event_id_reserve(conn, len(write.drafts))
            event_ids = {d.receipt.receipt_id: eid for d, eid in zip(write.drafts, reserved, strict=True)}
            async with conn.transaction():
                if checked_namespaces:
                    current = await pack_active_check(conn, checked_namespaces)
                    for ns in checked_namespaces:
                        pack = self._cache.pack(ns)
                        expected = pack.snapshot if pack is not None and pack.claim_path is not None else None
                        if current.get(ns) != expected:
                            raise SnapshotChanged(ns)
                owned = await receipt_mark_materialized_batch(
                    conn,
                    [d.receipt for d in write.drafts],
                    [event_ids[d.receipt.receipt_id] for d in write.drafts],
                )
                failed = await receipt_mark_failed_batch(conn, write.failed)
                retried = await receipt_mark_retry_batch(conn, write.retry)
                live = [d for d in write.drafts if d.receipt.receipt_id in owned]
                traceparents = self._traceparents(live) if self._spans else None
                done = await materialize(conn, live, event_ids, work_rows(live, event_ids, traceparents))
        result.materialized = len(live)
        result.failed = len(failed)
        result.retried = len(retried)
        result.lost = len(plans) - len(owned) - len(failed) - len(retried)
        result.work_items = done.work_items
        result.demoted = done.demoted
        result.inverted = done.inverted
        self._count(write, result, live, owned | failed | retried)
        if self._spans:
            self._trace_outcomes(write, live, event_ids, owned | failed | retried)
        return result

    @staticmethod
    def _count(write: _Write, result: BatchResult, live: list[EventDraft], done: set[int]) -> None:
        if result.materialized:
            metrics.RECEIPTS.labels("materialized").inc(result.materialized)
            legacy = sum(1 for d in live if d.legacy_owned)
            if legacy:
                metrics.EVENTS.labels("legacy_event").inc(legacy)
            if result.materialized - legacy:
                metrics.EVENTS.labels("work_item").inc(result.materialized - legacy)
        if result.work_items:
            metrics.WORK_ITEMS.inc(result.work_items)
        scheduled = collections.Counter(w.schedule for d in live for w in d.work if w.schedule is not None)
        for outcome, n in scheduled.items():
            metrics.SCHEDULED.labels(outcome).inc(n)
        # One INFO line per routing failure (rate-limited per reason; the summary is fixed text and
        # field names, never a payload value): a failure path, not the hot one.
        for receipt, error_class, summary in write.failed:
            if receipt.receipt_id in done:
                metrics.FAILURES.labels(error_class, "true").inc()
                events("materializer").emit(
                    "routing_failed",
                    error_class,
                    "delivery routing failed (connector admin receipts failed; replay with"
                    " connector admin receipts replay RECEIPT_ID)",
                    receipt_id=receipt.receipt_id,
                    namespace=receipt.namespace,
                    route=receipt.route_key,
                    summary=summary,
                )
        for receipt, error_class, summary, delay in write.retry:
            if receipt.receipt_id in done:
                metrics.FAILURES.labels(error_class, "false").inc()
                events("materializer").emit(
                    "routing_retry",
                    error_class,
                    "delivery routing failed; it will be tried again",
                    receipt_id=receipt.receipt_id,
                    namespace=receipt.namespace,
                    route=receipt.route_key,
                    attempts=receipt.attempts,
                    retry_in_s=round(delay, 1),
                    summary=summary,
                )
        if result.failed:
            metrics.RECEIPTS.labels("failed").inc(result.failed)
        if result.retried:
            metrics.RECEIPTS.labels("retry").inc(result.retried)
        if result.lost:
            metrics.CLAIMS_LOST.inc(result.lost)
        if result.demoted:
            metrics.LANE_DEMOTIONS.inc(result.demoted)
        if result.inverted:
            metrics.LANE_INVERSIONS.inc(result.inverted)
