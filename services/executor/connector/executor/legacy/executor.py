"""The legacy executor: claims and executes the legacy-owned Events of one pack generation while its
claim authority admits the legacy path (docs/cutover.md).

* **Admission is the database's**: every claim, scheduler-lease acquisition and reclaim statement
  joins the authority row ``FOR SHARE`` and requires ``legacy_active``; when the phase changes the
  executor stops claiming, finishes or loses what it holds and sets ``drained``.
* **One claimer per generation**: claims require the generation's scheduler lease under this
  process's current token; other legacy processes stand by.
* **What runs**: for each work type of the event's route fan-out, in order, unless its latest receipt
  is final or ``unknown`` (quarantined), a WorkItem owns it, or an earlier lane member holds it. The
  handler kinds and ``HandlerContext`` are the WorkItem path's; the idempotency key is the same.
* **Outcomes** are one fenced finalize per event: its legacy state and one versioned outcome receipt
  per work type that reached an outcome; a failure whose class says the effect is unknown, or an
  attempt past the maximum, is ``unknown`` (quarantined until an operator resolves it).

Statements: ``connector.common.store.legacy`` and ``store.authority``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge
from psycopg import AsyncConnection, Notify
from psycopg_pool import AsyncConnectionPool

from connector.common.core.db import evict_if_read_only
from connector.common.core.eventlog import events
from connector.common.core.listener import Listener, ListenerConfig
from connector.common.core.runtime import cancel_tasks
from connector.common.store import authority, work_items
from connector.common.store import legacy as legacy_store
from connector.common.store.packs import pack_generation_manifest
from connector.common.store.vocabulary import CHANNEL_PACKS, CHANNEL_WORK
from connector.common.store.work_items.claim import EVENT_ROW_BODY, EVENT_ROW_CONTENT_TYPE
from connector.executor.handlers import (
    EventFact,
    HandlerContext,
    Outcome,
    backoff_delay,
    classify,
    sanitize_summary,
)
from connector.executor.handlers.registry import HandlerRegistry, WorkTypeRuntime
from connector.executor.legacy.outcomes import legacy_outcome_project, outcome_digest
from connector.executor.metrics import REGISTRY

log = logging.getLogger(__name__)

Conn = AsyncConnection[Any]

#: Failure classes a handler uses to say "I cannot tell whether the effect happened".
AMBIGUOUS_FAILURE_CLASSES = frozenset({"outcome_unknown"})

CLAIMED = Counter(
    "connector_legacy_claimed_total", "Events claimed on the legacy Event path", registry=REGISTRY
)
OUTCOMES = Counter(
    "connector_legacy_outcomes_total",
    "Legacy work type outcomes written as receipts",
    ["outcome"],
    registry=REGISTRY,
)
STALE = Counter(
    "connector_legacy_stale_total", "Legacy writes refused by the lease token", ["op"], registry=REGISTRY
)
ADMITTED = Gauge(
    "connector_legacy_admitted", "1 while this generation admits the legacy path", registry=REGISTRY
)


# --------------------------------------------------------------------------------------------------
# The legacy executor
# --------------------------------------------------------------------------------------------------


class LegacyNotAdmitted(Exception):
    """The generation's claim authority does not admit the legacy Event path (fail closed)."""


@dataclass
class LegacyConfig:
    workers: int = 4
    claim_batch: int = 16
    lease_s: float = 30.0
    poll_interval_s: float = 0.5
    reconcile_interval_s: float = 5.0
    shutdown_grace_s: float = 10.0


@dataclass(slots=True)
class _TypeRun:
    work_type: str
    work_id: int
    queue_class: str
    source_lane_key: str | None
    target_lane_key: str | None
    #: ``run`` | ``done`` (a receipt is final) | ``quarantined`` (unknown receipt) | ``work_item``
    #: (the WorkItem path owns it) | ``lane_wait`` (an earlier lane member is not finished)
    decision: str
    prior_outcome: str | None


@dataclass(slots=True)
class _Held:
    event_id: int
    token: int
    attempt: int
    deadline: float
    lost: bool = False
    task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class _TypeResult:
    work_type: str
    outcome: str  # succeeded | failed | unknown | retry
    failure_class: str | None = None
    summary: str | None = None
    delay_s: float = 0.0


class LegacyExecutor:
    """Claims and executes legacy-owned Events of one pack generation (see the module docstring)."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        installed_pack_id: int,
        generation: int,
        owner: str,
        cfg: LegacyConfig | None = None,
    ) -> None:
        self.pool = pool
        self.pack = installed_pack_id
        self.generation = generation
        self.owner = owner
        self.cfg = cfg or LegacyConfig()
        self.actor = f"legacy:{owner}"
        self.threads = ThreadPoolExecutor(max_workers=self.cfg.workers, thread_name_prefix="connector-legacy")
        self.registry = HandlerRegistry(self.threads)
        self.held: dict[int, _Held] = {}
        self.admitted = False
        self.lease_token: int | None = None
        #: Set once the generation stopped admitting the legacy path and nothing is held any more.
        self.drained = asyncio.Event()
        self._wake = asyncio.Event()
        self._tick = asyncio.Event()
        self._stopping = False
        self._claiming = True
        self._tasks: list[asyncio.Task[Any]] = []
        self._listener: Listener | None = None
        self._routes: dict[str, Any] = {}
        self.stats = {"claimed": 0, "finalized": 0, "stale": 0, "reclaimed": 0, "receipts": 0}

    # -------------------------------------------------------------------------------- admission

    async def admission(self, conn: Conn) -> tuple[bool, str]:
        row = await authority.claim_authority_get(conn, self.pack, self.generation)
        if row is None:
            return False, f"pack {self.pack} generation {self.generation} has no claim authority"
        if row["claim_path"] != "legacy_event" or row["phase"] != "legacy_active":
            return False, (
                f"pack {self.pack} generation {self.generation} is {row['claim_path']}/{row['phase']},"
                " not legacy_event/legacy_active: the legacy Event path may not claim it"
            )
        if row["receipt_kind"] != "rollback":
            return False, (
                f"pack {self.pack} generation {self.generation} has no rollback receipt admitting the"
                " legacy Event path"
            )
        return True, ""

    async def start(self) -> None:
        async with self.pool.connection() as conn:
            ok, why = await self.admission(conn)
            if not ok:
                raise LegacyNotAdmitted(why)
            found = await pack_generation_manifest(conn, self.pack, self.generation)
            if found is None:
                raise LegacyNotAdmitted(f"pack {self.pack} generation {self.generation} has no manifest")
            self.registry.install(self.pack, self.generation, found[0], found[1])
            # Repair first: a predecessor may have died between a finalize and its projection.
            await legacy_outcome_project(conn, installed_pack_id=self.pack, generation=self.generation)
        self.admitted = True
        ADMITTED.set(1)
        self._tasks = [
            asyncio.create_task(self._lease_loop(), name="legacy-lease"),
            asyncio.create_task(self._claim_loop(), name="legacy-claim"),
            asyncio.create_task(self._reconcile_loop(), name="legacy-reconcile"),
        ]
        self._listener = Listener(
            str(self.pool.conninfo),
            ListenerConfig(channels=(CHANNEL_WORK, CHANNEL_PACKS), name="legacy-listen"),
            on_wake=self._on_notify,
            on_error=lambda exc: log.warning("legacy listener error", extra={"exc_type": type(exc).__name__}),
        )
        await self._listener.start()

    async def stop(self, grace_s: float | None = None) -> None:
        grace = self.cfg.shutdown_grace_s if grace_s is None else grace_s
        self._claiming = False
        self._wake.set()
        running = [h.task for h in self.held.values() if h.task is not None]
        if running:
            with contextlib.suppress(Exception):
                await asyncio.wait(running, timeout=grace)
        for h in list(self.held.values()):
            if h.task is not None and not h.task.done():
                h.task.cancel()
        self._stopping = True
        await cancel_tasks(self._tasks)
        if self._listener is not None:
            await self._listener.stop()
        with contextlib.suppress(Exception):
            async with self.pool.connection() as conn:
                await authority.scheduler_lease_release(
                    conn, {"pack": self.pack, "generation": self.generation, "owner": self.owner}
                )
        await self.registry.close()
        self.threads.shutdown(wait=False, cancel_futures=True)
        ADMITTED.set(0)

    # ------------------------------------------------------------------------------- loops

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"pack": self.pack, "generation": self.generation, "owner": self.owner, **extra}

    async def _lease_loop(self) -> None:
        interval = max(0.05, self.cfg.lease_s / 3.0)
        while not self._stopping:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("legacy lease loop error", extra={"exc_type": type(exc).__name__})
            self._tick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tick.wait(), timeout=interval)

    async def tick(self) -> None:
        """Admission check, scheduler lease, expired-lease reclaim, renewal of held leases."""
        async with self.pool.connection() as conn:
            admitted, why = await self.admission(conn)
            if admitted != self.admitted:
                log.warning(
                    "legacy admission changed", extra={"admitted": admitted, "reason": why or "admitted"}
                )
            self.admitted = admitted
            ADMITTED.set(1 if admitted else 0)
            token: int | None = None
            if admitted and self._claiming:
                token = await authority.scheduler_lease_acquire(conn, self._params(lease_s=self.cfg.lease_s))
            if token != self.lease_token:
                self._wake.set()
            self.lease_token = token
            if token is not None:
                reclaimed = await legacy_store.event_legacy_reclaim_expired(
                    conn, self._params(lease_token=token)
                )
                if reclaimed:
                    self.stats["reclaimed"] += reclaimed
                    self._wake.set()
            live = sorted((h for h in self.held.values() if not h.lost), key=lambda h: h.event_id)
            if live:
                t0 = time.monotonic()
                renewed = await legacy_store.event_legacy_renew_lease_batch(
                    conn, [h.event_id for h in live], [h.token for h in live], lease_s=self.cfg.lease_s
                )
                for h in live:
                    if h.event_id in renewed:
                        h.deadline = t0 + self.cfg.lease_s
                    else:
                        self._lose(h)
        now = time.monotonic()
        for h in list(self.held.values()):
            if not h.lost and h.deadline <= now:
                self._lose(h)
        if not self.admitted and not self.held:
            self.drained.set()

    def _lose(self, h: _Held) -> None:
        h.lost = True
        STALE.labels("renew").inc()
        self.stats["stale"] += 1
        if h.task is not None and not h.task.done():
            h.task.cancel()

    async def _claim_loop(self) -> None:
        conn: Conn | None = None
        backoff = 0.1
        while self._claiming:
            try:
                free = self.cfg.workers - len(self.held)
                if not (self.admitted and self.lease_token is not None and free > 0):
                    await self._wait(self.cfg.poll_interval_s)
                    continue
                if conn is None or conn.closed:
                    conn = await self.pool.getconn()
                rows = await legacy_store.event_legacy_claim_batch(
                    conn,
                    self._params(
                        lease_token=self.lease_token,
                        limit=min(free, self.cfg.claim_batch),
                        lease_s=self.cfg.lease_s,
                    ),
                )
                backoff = 0.1
                if not rows:
                    await self._wait(self.cfg.poll_interval_s)
                    continue
                CLAIMED.inc(len(rows))
                self.stats["claimed"] += len(rows)
                deadline = time.monotonic() + self.cfg.lease_s
                for event_id, token, attempt in rows:
                    h = _Held(event_id, token, attempt, deadline)
                    self.held[h.event_id] = h
                    h.task = asyncio.create_task(self._run_event(h), name=f"legacy-event-{h.event_id}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("legacy claim loop error", extra={"exc_type": type(exc).__name__})
                await evict_if_read_only(conn, exc)  # a read-only server: closed, replaced
                if conn is not None and (conn.closed or conn.broken):
                    with contextlib.suppress(Exception):
                        await self.pool.putconn(conn)
                    conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        if conn is not None:
            with contextlib.suppress(Exception):
                await self.pool.putconn(conn)

    async def _wait(self, limit_s: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=limit_s)

    async def _reconcile_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.cfg.reconcile_interval_s)
            try:
                async with self.pool.connection() as conn:
                    await legacy_outcome_project(
                        conn, installed_pack_id=self.pack, generation=self.generation
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("legacy reconcile error", extra={"exc_type": type(exc).__name__})

    def _on_notify(self, notes: list[Notify]) -> None:
        if any(note.channel == CHANNEL_PACKS for note in notes):
            self._tick.set()  # an authority change: check admission now
        self._wake.set()

    # ----------------------------------------------------------------------------- one event

    async def _run_event(self, h: _Held) -> None:
        try:
            await self._execute_event(h)
        except asyncio.CancelledError:
            if not self._stopping and not h.lost:
                raise
        except Exception as exc:
            # The lease expires and the event is reclaimed (retry) by the scheduler lease holder.
            log.warning(
                "legacy event failed to run", extra={"event_id": h.event_id, "exc_type": type(exc).__name__}
            )
        finally:
            self.held.pop(h.event_id, None)
            self._wake.set()
            if not self.admitted and not self.held:
                self.drained.set()

    async def _plan(self, conn: Conn, event_id: int) -> list[_TypeRun]:
        plan: list[_TypeRun] = []
        for r in await legacy_store.event_legacy_work_plan(conn, [event_id]):
            outcome = r["receipt_outcome"]
            if outcome in ("succeeded", "failed"):
                decision = "done"
            elif outcome == "unknown":
                decision = "quarantined"
            elif r["work_id"] is not None and r["work_state"] != "awaiting_legacy_outcome":
                decision = "work_item"
            elif r["lane_wait"]:
                decision = "lane_wait"
            else:
                decision = "run"
            plan.append(
                _TypeRun(
                    work_type=str(r["work_type"]),
                    work_id=int(r["work_id"]) if r["work_id"] is not None else 0,
                    queue_class=str(r["queue_class"] or "default"),
                    source_lane_key=r["source_lane_key"],
                    target_lane_key=r["target_mutation_lane_key"],
                    decision=decision,
                    prior_outcome=outcome,
                )
            )
        return plan

    async def _execute_event(self, h: _Held) -> None:
        async with self.pool.connection() as conn:
            plan = await self._plan(conn, h.event_id)
            fact: EventFact | None = None
            payload: bytes | None = None
            content_type: str | None = None
            if any(t.decision == "run" for t in plan):
                rows = await work_items.claim.work_item_event_batch(conn, [h.event_id])
                if rows:
                    r = rows[0]
                    fact = EventFact(*r[:EVENT_ROW_BODY])
                    body = r[EVENT_ROW_BODY]
                    payload = bytes(body) if body is not None else None
                    content_type = r[EVENT_ROW_CONTENT_TYPE]
        results: list[_TypeResult] = []
        for t in plan:
            if t.decision != "run":
                continue
            if h.lost:
                return
            results.append(await self._execute_type(h, t, fact, payload, content_type))
        if h.lost:
            return
        state, delay = _event_outcome(plan, results, self.cfg.poll_interval_s)
        finals = [r for r in results if r.outcome != "retry"]
        params = {
            "event_id": h.event_id,
            "token": h.token,
            "state": state,
            "delay_s": delay,
            # Waiting for a lane is not an attempt: give it back when nothing ran.
            "refund": 1 if not results and any(t.decision == "lane_wait" for t in plan) else 0,
            "work_types": [r.work_type for r in finals],
            "outcomes": [r.outcome for r in finals],
            "classes": [r.failure_class for r in finals],
            "summaries": [r.summary for r in finals],
            "digests": [outcome_digest(h.event_id, r.work_type, r.outcome, r.failure_class) for r in finals],
            "actor": self.actor,
        }
        async with self.pool.connection() as conn:
            matched, receipt_ids = await legacy_store.event_legacy_finalize(conn, params)
            if not matched:
                STALE.labels("finalize").inc()
                self.stats["stale"] += 1
                log.warning("legacy finalize fenced off (lease lost)", extra={"event_id": h.event_id})
                return
            self.stats["finalized"] += 1
            self.stats["receipts"] += len(receipt_ids)
            for f in finals:
                OUTCOMES.labels(f.outcome).inc()
                if f.outcome != "succeeded":  # committed: the legacy path's dead letter
                    events("executor").emit(
                        "dead_letter",
                        f.failure_class or f.outcome,
                        "legacy event failed",
                        event_id=h.event_id,
                        work_type=f.work_type,
                        outcome=f.outcome,
                        attempt=h.attempt,
                        receipt_ids=",".join(map(str, receipt_ids[:20])),
                    )
            # The Event and its receipts are committed. The projection is a separate step: a crash
            # here is repaired from the unprojected receipts by the next projection
            # (tests/cutover/test_processes.py crashes here through a tests/executor/controls shim).
            if receipt_ids:
                await legacy_outcome_project(conn, event_ids=[h.event_id])

    async def _execute_type(
        self,
        h: _Held,
        t: _TypeRun,
        fact: EventFact | None,
        payload: bytes | None,
        content_type: str | None,
    ) -> _TypeResult:
        rt: WorkTypeRuntime = self.registry.lookup(self.pack, self.generation, t.work_type)
        max_attempts = rt.retry.max_attempts
        if h.attempt > max_attempts:
            return _TypeResult(
                t.work_type,
                "unknown",
                "lease_lost_final_attempt",
                f"attempt {h.attempt - 1} of {max_attempts} (the last) lost its lease before reporting an"
                " outcome; whether its effect happened is unknown",
            )
        row = (
            t.work_id,
            h.token,
            self.pack,
            self.generation,
            t.queue_class,
            t.work_type,
            h.event_id,
            h.attempt,
            max_attempts,
            t.source_lane_key,
            t.target_lane_key,
            None,
        )
        ctx = HandlerContext(row, h.deadline)
        ctx.event, ctx.payload, ctx.content_type = fact, payload, content_type
        out: Outcome | None
        if rt.handler is None:
            out = (
                Outcome.fail("unknown_work_type", "the pack generation declares no such work type")
                if rt.unknown
                else Outcome.retry(None, "handler_unavailable", rt.unavailable or "handler unavailable")
            )
        else:
            try:
                out = await asyncio.wait_for(rt.handler(ctx), timeout=rt.timeout_s)
            except TimeoutError:
                out = Outcome.retry(None, "timeout", "the handler overran its timeout")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                out = classify(exc, payload)
        if out is None or out.kind == "success":
            return _TypeResult(t.work_type, "succeeded")
        summary = sanitize_summary(out.summary, payload) or None
        if out.kind == "fail":
            kind = "unknown" if out.failure_class in AMBIGUOUS_FAILURE_CLASSES else "failed"
            return _TypeResult(t.work_type, kind, out.failure_class or "permanent", summary)
        if h.attempt >= max_attempts:
            return _TypeResult(
                t.work_type,
                "failed",
                out.failure_class or "retry",
                sanitize_summary(f"gave up after {h.attempt} attempts: {out.summary}", payload)[:512],
            )
        delay = out.delay_s
        if delay is None:
            pol = rt.retry
            delay = backoff_delay(h.attempt, pol.backoff_base_s, pol.backoff_cap_s, pol.jitter)
        return _TypeResult(t.work_type, "retry", out.failure_class, summary, max(0.0, float(delay)))


def _event_outcome(
    plan: list[_TypeRun], results: list[_TypeResult], lane_wait_s: float = 0.5
) -> tuple[str, float]:
    """The Event's legacy state after an attempt, and the retry delay."""
    retries = [r.delay_s for r in results if r.outcome == "retry"]
    retries += [lane_wait_s for t in plan if t.decision == "lane_wait"]
    if retries:
        return "retry", min(retries)
    outcomes = [r.outcome for r in results]
    outcomes += [t.prior_outcome for t in plan if t.decision in ("done", "quarantined") and t.prior_outcome]
    if not plan or all(t.decision == "work_item" for t in plan):
        # Nothing of this event belongs to the legacy path (cannot happen through the gates): say so
        # loudly and fail closed rather than report an execution that did not take place.
        log.error("legacy-owned event has no legacy work types", extra={"n_types": len(plan)})
        return "unknown", 0.0
    if "unknown" in outcomes:
        return "unknown", 0.0
    if "failed" in outcomes:
        return "failed", 0.0
    return "succeeded", 0.0
