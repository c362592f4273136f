"""Retention of retired deliveries and expired admin request ids (docs/adr/009-retention.md: the
retirement rule and why a delivery goes whole, the sweep and its plans, settings, metrics).

Contract: a delivery (a receipt, its events, their WorkItems) is deleted whole or not at all, and
only once *retired*: the receipt ``materialized`` and accepted before ``now() - delivered_s``; every
event WorkItem-owned with no legacy history and no legacy outcome receipt, and with at least one
WorkItem; every WorkItem ``succeeded`` (or ``cancelled``, or ``coalesced`` by debounce), never
fenced or reconciled (the statements are store/deliveries.py's). A sweep walks the receipts by
primary key in chunks of ``batch``, one transaction per chunk (classify, then delete WorkItems,
events, receipts in foreign-key order, each delete re-checking its part, so a row that changed rolls
the chunk back for the next sweep), and stops at the first chunk younger than the cutoff. Admin
request ids older than ``admin_requests_s`` go in the same sweep; a retention of 0 keeps that kind
forever. One sweeper at a time: the session advisory lock ``(RETENTION_LOCK_CLASS, 0)``, tried (a
busy round is skipped) on its own connection.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from prometheus_client import Counter, Gauge, Histogram

from connector.common.core.background import BackgroundJob, session_lock_release, session_lock_try
from connector.common.core.metrics import LATENCY_BUCKETS, registry
from connector.common.store import admin_requests, deliveries, receipts

log = logging.getLogger("connector.retention")

RETENTION_LOCK_CLASS = 7234103
RETENTION_LOCK_OBJECT = 0

TABLES = (
    "connector_work_item",
    "connector_event",
    "connector_ingress_receipt",
    "connector_admin_request",
)
RESULTS = ("done", "busy", "error")
# Why an old receipt's delivery is kept, first matching reason (fixed vocabulary, in this order).
KEEP_REASONS = (
    "not_materialized",  # pending, routing, retry or failed receipt
    "legacy_owned",  # an event is owned by the legacy Event claim path
    "legacy_history",  # an event carries a legacy state (executed or reconciled under legacy ownership)
    "legacy_outcome",  # a legacy outcome receipt references an event (permanent fact)
    "dead_letter",  # a WorkItem is dead
    "unfinished",  # a WorkItem is pending, blocked, processing, retry, awaiting or reconciled
    "rollback_fenced",  # a succeeded WorkItem was once fenced or reconciled (fence / proof bookkeeping)
    "no_work_item",  # an event has no WorkItem yet (may still be backfilled)
    "changed",  # the delivery changed between classification and delete; re-checked next sweep
    "locked",  # a row of the chunk was locked by another transaction; re-checked next sweep
)

#: Retention runs in the executor (ADR 009): its families are the executor's (``connector retention
#: sweep`` records them too, unserved).
_REGISTRY = registry("executor")
RETENTION_DELETED = Counter(
    "connector_retention_deleted_total", "Rows deleted by the retention sweep", ["table"], registry=_REGISTRY
)
RETENTION_SWEEP_SECONDS = Histogram(
    "connector_retention_sweep_seconds",
    "Duration of retention sweeps (lock held)",
    buckets=(*LATENCY_BUCKETS, 30.0, 60.0, 300.0, 900.0),
    registry=_REGISTRY,
)
RETENTION_RUNS = Counter(
    "connector_retention_runs_total",
    "Retention sweep rounds by result (done, busy, error)",
    ["result"],
    registry=_REGISTRY,
)
RETENTION_OLDEST_AGE = Gauge(
    "connector_retention_oldest_receipt_age_seconds",
    "Age of the oldest ingress receipt left after the last sweep (0: none)",
    registry=_REGISTRY,
)
for _table in TABLES:
    RETENTION_DELETED.labels(_table)
for _result in RESULTS:
    RETENTION_RUNS.labels(_result)


# --------------------------------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------------------------------

DATABASE_CUTOFF = "SELECT now() - make_interval(secs => %(s)s::float8)"


# --------------------------------------------------------------------------------------------------
# Configuration and results
# --------------------------------------------------------------------------------------------------


class _RetentionSettings(Protocol):
    retention_delivered_s: float
    retention_admin_requests_s: float
    retention_interval_s: float
    retention_batch: int


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    #: Retired deliveries accepted longer ago than this are deleted (0 = keep forever).
    delivered_s: float = 604_800.0
    #: Admin request ids older than this are deleted (0 = keep forever).
    admin_requests_s: float = 86_400.0
    interval_s: float = 60.0
    batch: int = 1_000

    def __post_init__(self) -> None:
        if self.delivered_s < 0 or self.admin_requests_s < 0:
            raise ValueError("retention periods must be >= 0 (0 = keep forever)")
        if self.interval_s <= 0:
            raise ValueError("retention interval must be > 0")
        if self.batch < 1:
            raise ValueError("retention batch must be >= 1")

    @classmethod
    def from_settings(cls, s: _RetentionSettings) -> RetentionConfig:
        return cls(
            delivered_s=float(s.retention_delivered_s),
            admin_requests_s=float(s.retention_admin_requests_s),
            interval_s=float(s.retention_interval_s),
            batch=int(s.retention_batch),
        )

    @property
    def enabled(self) -> bool:
        return self.delivered_s > 0 or self.admin_requests_s > 0


@dataclass(slots=True)
class SweepResult:
    """What one sweep did (or, with ``dry_run``, would do): counts only, never ids."""

    dry_run: bool = False
    #: done / busy / error
    result: str = "done"
    cutoff: dt.datetime | None = None
    chunks: int = 0
    receipts_scanned: int = 0
    #: Receipts older than the cutoff among those scanned.
    receipts_old: int = 0
    #: Retired deliveries deleted (or that would be): one per receipt.
    deliveries: int = 0
    #: Rows deleted (or that would be) per table.
    deleted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    #: Old receipts whose delivery was kept, by the first reason (KEEP_REASONS).
    kept: Tally[str] = field(default_factory=Tally)
    oldest_receipt_age_s: float = 0.0
    seconds: float = 0.0

    @property
    def deleted_rows(self) -> int:
        return sum(self.deleted.values())


Progress = Callable[[SweepResult], None]


class _Changed(Exception):
    """A chunk's delete did not match its classification: roll the chunk back."""


# --------------------------------------------------------------------------------------------------
# The sweep (caller holds the lock, or runs a dry run)
# --------------------------------------------------------------------------------------------------


# The sweeper's session: a chunk may take a while; a row some transaction holds (an FK insert, a
# cutover) makes the chunk fail fast and be re-checked by the next sweep, never queued for.
SESSION_SETTINGS = ("SET statement_timeout = '300s'", "SET lock_timeout = '5s'")


async def connect(url: str, application_name: str = "connector-retention") -> psycopg.AsyncConnection[Any]:
    """The sweeper's own autocommit connection. Statements are never prepared: each chunk's arrays
    get a plan for the table as it is (ADR 008)."""
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, prepare_threshold=None, application_name=application_name
    )
    for statement in SESSION_SETTINGS:
        await conn.execute(statement)
    return conn


async def try_lock(conn: psycopg.AsyncConnection[Any]) -> bool:
    return await session_lock_try(conn, RETENTION_LOCK_CLASS, RETENTION_LOCK_OBJECT)


async def unlock(conn: psycopg.AsyncConnection[Any]) -> None:
    await session_lock_release(conn, RETENTION_LOCK_CLASS, RETENTION_LOCK_OBJECT)


async def _scalar(conn: psycopg.AsyncConnection[Any], query: str, params: dict[str, Any]) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def sweep(
    conn: psycopg.AsyncConnection[Any],
    *,
    delivered_s: float,
    admin_requests_s: float,
    batch: int,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> SweepResult:
    """One sweep over ``conn`` (autocommit). The caller holds the advisory lock (``try_lock``) unless
    this is a dry run, which deletes nothing and counts what the sweep would delete."""
    t0 = time.perf_counter()
    res = SweepResult(dry_run=dry_run)
    if delivered_s > 0:
        res.cutoff = await _scalar(conn, DATABASE_CUTOFF, {"s": delivered_s})
        after = 0
        while True:
            rows: list[tuple[Any, ...]] = []
            retired: list[tuple[Any, ...]] = []
            if dry_run:
                rows = await deliveries.receipt_chunk_classify(conn, after, batch, res.cutoff)
                retired = _tally(res, rows)
                _count(res, retired)
            else:
                done: tuple[int, int, int] | None = None
                try:
                    async with conn.transaction():
                        rows = await deliveries.receipt_chunk_classify(conn, after, batch, res.cutoff)
                        retired = _tally(res, rows)
                        if retired:
                            done = await _delete(conn, res.cutoff, retired)
                except (psycopg.errors.ForeignKeyViolation, _Changed):
                    # Something referenced or changed a delivery after it was classified: nothing
                    # of the chunk was deleted; its receipts are re-checked by the next sweep.
                    res.kept["changed"] += len(retired)
                except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
                    # A row of the chunk is locked by another transaction for longer than the
                    # lock timeout (a cutover's backfill, say): skip the chunk, never wait.
                    res.kept["locked"] += len(retired)
                if done is not None:  # committed
                    _record(res, *done)
            if not rows:
                break
            res.chunks += 1
            after = int(rows[-1][0])
            if progress is not None:
                progress(res)
            if not any(r[1] for r in rows):  # the whole chunk is younger than the cutoff
                break
    if admin_requests_s > 0:
        if dry_run:
            n = await admin_requests.admin_request_count_expired(conn, admin_requests_s)
        else:
            n = await admin_requests.admin_request_delete_expired(conn, admin_requests_s)
            RETENTION_DELETED.labels("connector_admin_request").inc(n)
        res.deleted["connector_admin_request"] += n
    res.oldest_receipt_age_s = await receipts.admin.receipt_oldest_age(conn)
    res.seconds = time.perf_counter() - t0
    return res


def _tally(res: SweepResult, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Count the chunk's receipts; return the retired ones."""
    res.receipts_scanned += len(rows)
    retired = []
    for r in rows:
        if not r[1]:
            continue
        res.receipts_old += 1
        if r[2] is None:
            retired.append(r)
        else:
            res.kept[str(r[2])] += 1
    return retired


def _count(res: SweepResult, retired: list[tuple[Any, ...]]) -> None:
    res.deliveries += len(retired)
    res.deleted["connector_ingress_receipt"] += len(retired)
    res.deleted["connector_event"] += sum(len(r[3]) for r in retired)
    res.deleted["connector_work_item"] += sum(len(r[4]) for r in retired)


async def _delete(
    conn: psycopg.AsyncConnection[Any], cutoff: dt.datetime | None, retired: list[tuple[Any, ...]]
) -> tuple[int, int, int]:
    """Inside the chunk's transaction: the retired deliveries, in foreign-key order. Returns the
    WorkItems, events and receipts deleted."""
    event_ids = [int(e) for r in retired for e in r[3]]
    work_ids = [int(w) for r in retired for w in r[4]]
    receipt_ids = [int(r[0]) for r in retired]
    n_items = n_events = 0
    if work_ids:
        n_items = await deliveries.work_item_delete_retired(conn, work_ids)
    if event_ids:
        n_events = await deliveries.event_delete_retired(conn, event_ids)
    n_receipts = await deliveries.receipt_delete_retired(conn, receipt_ids, cutoff)
    if (n_items, n_events, n_receipts) != (len(work_ids), len(event_ids), len(receipt_ids)):
        # A row left out by its delete's own predicate without a foreign key to refuse the rest
        # (the schema's keys make this unreachable): never commit part of a chunk's deliveries.
        raise _Changed
    return n_items, n_events, n_receipts


def _record(res: SweepResult, n_items: int, n_events: int, n_receipts: int) -> None:
    res.deliveries += n_receipts
    res.deleted["connector_work_item"] += n_items
    res.deleted["connector_event"] += n_events
    res.deleted["connector_ingress_receipt"] += n_receipts
    RETENTION_DELETED.labels("connector_work_item").inc(n_items)
    RETENTION_DELETED.labels("connector_event").inc(n_events)
    RETENTION_DELETED.labels("connector_ingress_receipt").inc(n_receipts)


# --------------------------------------------------------------------------------------------------
# One locked round (the service loop and the CLI) and the service loop
# --------------------------------------------------------------------------------------------------


async def run_locked(
    conn: psycopg.AsyncConnection[Any],
    *,
    delivered_s: float,
    admin_requests_s: float,
    batch: int,
    progress: Progress | None = None,
) -> SweepResult:
    """Take the lock (busy: return at once with ``result = 'busy'``), sweep, release; metrics."""
    if not await try_lock(conn):
        RETENTION_RUNS.labels("busy").inc()
        return SweepResult(result="busy")
    try:
        res = await sweep(
            conn, delivered_s=delivered_s, admin_requests_s=admin_requests_s, batch=batch, progress=progress
        )
    except BaseException:
        RETENTION_RUNS.labels("error").inc()
        with contextlib.suppress(Exception):
            await unlock(conn)
        raise
    await unlock(conn)
    RETENTION_RUNS.labels("done").inc()
    RETENTION_SWEEP_SECONDS.observe(res.seconds)
    RETENTION_OLDEST_AGE.set(res.oldest_receipt_age_s)
    return res


class Retention(BackgroundJob):
    """The retention loop of one service process (the executor runs it). The first round runs one
    interval after start (never in the start-up rush); ±10 % jitter keeps replicas started
    together from trying at the same moment."""

    kind = "retention"

    def __init__(self, url: str, cfg: RetentionConfig, service: str = "executor") -> None:
        super().__init__(url, service, interval_s=cfg.interval_s, jitter=0.1, first_after_interval=True)
        self.cfg = cfg

    def start(self) -> None:
        if self.cfg.enabled:
            super().start()

    async def open_connection(self) -> psycopg.AsyncConnection[Any]:
        return await connect(self.url, f"connector-{self.service}-retention")

    async def run_once(self) -> SweepResult:
        try:
            conn = await self.connection()
        except Exception:
            RETENTION_RUNS.labels("error").inc()
            raise
        res = await run_locked(
            conn,
            delivered_s=self.cfg.delivered_s,
            admin_requests_s=self.cfg.admin_requests_s,
            batch=self.cfg.batch,
        )
        if res.deleted_rows:
            log.info(
                "retention sweep deleted retired deliveries",
                extra={
                    "deliveries": res.deliveries,
                    "work_items": res.deleted["connector_work_item"],
                    "events": res.deleted["connector_event"],
                    "receipts": res.deleted["connector_ingress_receipt"],
                    "admin_requests": res.deleted["connector_admin_request"],
                    "receipts_kept_old": sum(res.kept.values()),
                    "chunks": res.chunks,
                    "seconds": round(res.seconds, 3),
                },
            )
        return res

    def on_failure(self, exc: BaseException) -> None:
        log.warning(
            "retention sweep failed; retried next interval",
            extra={"exc_type": type(exc).__name__, "sqlstate": getattr(exc, "sqlstate", None)},
        )


__all__ = [
    "KEEP_REASONS",
    "RETENTION_LOCK_CLASS",
    "Retention",
    "RetentionConfig",
    "SweepResult",
    "connect",
    "run_locked",
    "sweep",
    "try_lock",
    "unlock",
]
