"""Durable receipts with group commit (the statements: ``connector.common.store.receipts``).

Verified deliveries are queued as ``PendingReceipt``; writer tasks (at most one per pooled
connection) take everything waiting — up to ``max_batch`` — and write it with one statement,
``receipt_insert_batch``: a multi-row ``INSERT … ON CONFLICT (namespace, idempotency_key) DO
NOTHING RETURNING`` that also reads the receipt ids of earlier duplicates and calls
``pg_notify('connector_receipts', '')`` once when it inserted anything. The connection is in
autocommit, so that single statement is its own transaction: when it returns, the batch is
committed (and flushed: ``synchronous_commit`` applies), and only then is each waiting request
resolved. With ``synchronous_commit`` set (``CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT``) the statement
sets it for its own transaction (``set_config(…, true)``, i.e. ``SET LOCAL``): still one round trip.
A delivery never gets a success answer for a row that is not committed.

Failure semantics: when the pool cannot give a connection in time, the database is unreachable or
the statement fails, every delivery of the batch is resolved *unavailable* (the route's failure
status, 503 + Retry-After by default). An unknown commit outcome (connection lost while committing)
is also answered unavailable: the provider retries and the retry is answered as a duplicate, which
is the at-least-once contract. A delivery that waited in the queue longer than ``queue_timeout_s``
is answered unavailable without being written, and a full queue refuses new deliveries at once:
load shedding, not unbounded latency.

The commit deadline (``commit_deadline_s``, ``CONNECTOR_INGRESS_COMMIT_DEADLINE_S``, ADR 020): a
delivery not committed this long after it joined the queue is answered unavailable (503 +
Retry-After, gRPC UNAVAILABLE) *while it waits* — still queued, or in a batch whose statement hangs
on a silent server. One watchdog task checks the queue's head and the batches being written a few
times per deadline; nothing is added per delivery. An expired delivery's batch may still commit
later: the provider's retry is then answered as a duplicate (the at-least-once contract).

Duplicates inside one batch insert once (the first in arrival order wins, later ones answer as
duplicates of it). Rows are inserted in arrival order, so ``receipt_id`` is the delivery sequence.
Two concurrent batches that carry the same two keys in opposite orders can deadlock; the loser is
retried once (counted) — it takes the same delivery arriving twice at once, twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from connector.common.store import receipts
from connector.ingress import metrics

log = logging.getLogger(__name__)

# Reasons a delivery could not be made durable (HTTP: the route's failure status).
POOL_TIMEOUT: Final = "pool_timeout"
DB_UNAVAILABLE: Final = "db_unavailable"
DB_TIMEOUT: Final = "db_timeout"
DB_ERROR: Final = "db_error"
OVERLOADED: Final = "overloaded"
SHUTTING_DOWN: Final = "shutting_down"
COMMIT_DEADLINE: Final = "commit_deadline"
INTERNAL: Final = "internal"


class PendingReceipt:
    """One verified delivery waiting for its group commit."""

    __slots__ = (
        "body",
        "content_type",
        "correlation_ids",
        "enqueued",
        "event_kind",
        "future",
        "idempotency_key",
        "method",
        "namespace",
        "origin",
        "payload_sha256",
        "provider_delivery_id",
        "received_at",
        "route_id",
        "route_key",
        "route_version",
        "traceparent",
        "verification",
    )

    def __init__(
        self,
        *,
        namespace: str,
        route_key: str,
        route_id: int,
        route_version: int,
        provider_delivery_id: str | None,
        idempotency_key: str,
        method: str,
        content_type: str | None,
        event_kind: str | None,
        received_at: float,
        correlation_ids: str,
        payload_sha256: bytes,
        body: bytes,
        verification: str,
        traceparent: str | None = None,
        origin: str | None = None,
    ) -> None:
        self.namespace = namespace
        self.route_key = route_key
        self.route_id = route_id
        self.route_version = route_version
        self.provider_delivery_id = provider_delivery_id
        self.idempotency_key = idempotency_key
        self.method = method
        self.content_type = content_type
        self.event_kind = event_kind
        self.received_at = received_at
        self.correlation_ids = correlation_ids
        self.payload_sha256 = payload_sha256
        self.body = body
        self.verification = verification
        self.traceparent = traceparent
        #: ``None``: a webhook; ``"reconciled"``: admitted by the reconciler (docs/reconcile.md).
        self.origin = origin
        self.enqueued = 0.0
        self.future: asyncio.Future[CommitResult] | None = None


class CommitResult:
    """The answer to one delivery: committed (``receipt_id``, ``duplicate``) or ``failure``.
    ``body_differs``: a duplicate whose body is not the one the key was first accepted with."""

    __slots__ = ("body_differs", "duplicate", "failure", "receipt_id")

    def __init__(
        self, receipt_id: int | None, duplicate: bool, failure: str | None, body_differs: bool = False
    ) -> None:
        self.receipt_id = receipt_id
        self.duplicate = duplicate
        self.failure = failure
        self.body_differs = body_differs


class Unavailable(Exception):
    """The delivery was not queued (full queue, shutting down); ``reason`` is a metric label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def receipt_commit_batch(
    conn: psycopg.AsyncConnection[Any], batch: Sequence[PendingReceipt], synchronous_commit: str | None = None
) -> list[CommitResult]:
    """Insert a batch in one statement (one transaction, autocommit; committed at
    ``synchronous_commit`` when given); results in batch order."""
    inserted, existing = await receipts.insert.receipt_insert_batch(conn, batch, synchronous_commit)
    missing = [
        item
        for item in batch
        if (item.namespace, item.idempotency_key) not in inserted
        and (item.namespace, item.idempotency_key) not in existing
    ]
    if missing:
        existing.update(await receipts.insert.receipt_get_by_keys(conn, missing))
    results: list[CommitResult] = []
    answered: set[tuple[str, str]] = set()
    first_sha: dict[tuple[str, str], bytes] = {}
    for item in batch:
        key = (item.namespace, item.idempotency_key)
        receipt_id = inserted.get(key)
        if receipt_id is not None and key not in answered:
            answered.add(key)
            first_sha[key] = item.payload_sha256
            results.append(CommitResult(receipt_id, False, None))
            continue
        if receipt_id is not None:  # a second delivery of a key this batch inserted
            results.append(CommitResult(receipt_id, True, None, first_sha[key] != item.payload_sha256))
            continue
        earlier = existing.get(key)
        if earlier is None:  # conflicting row vanished (deleted by retention): not durable here
            results.append(CommitResult(None, False, DB_ERROR))
        else:
            results.append(CommitResult(earlier[0], True, None, earlier[1] != item.payload_sha256))
    return results


def _failure_reason(exc: BaseException) -> str:
    if isinstance(exc, PoolTimeout):
        return POOL_TIMEOUT
    if isinstance(exc, pg_errors.QueryCanceled):
        return DB_TIMEOUT
    if isinstance(exc, psycopg.OperationalError | OSError):
        return DB_UNAVAILABLE
    if isinstance(exc, psycopg.Error):
        return DB_ERROR
    return INTERNAL


class ReceiptWriter:
    """Queue + writer tasks implementing group commit over the ingress pool."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        writers: int = 2,
        max_batch: int = 256,
        max_wait_s: float = 0.0,
        max_queue: int = 8192,
        queue_timeout_s: float = 2.0,
        pool_timeout_s: float = 2.0,
        commit_deadline_s: float = 0.0,
        synchronous_commit: str | None = None,
    ) -> None:
        self._pool = pool
        self._writers = max(1, writers)
        self._max_batch = max_batch
        self._max_wait = max_wait_s
        self._max_queue = max_queue
        self._queue_timeout = queue_timeout_s
        self._pool_timeout = pool_timeout_s
        self._pending: deque[PendingReceipt] = deque()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        #: 0 = no deadline (a delivery waits for its batch, however long the database takes).
        self._deadline = commit_deadline_s
        #: ``synchronous_commit`` of each batch's transaction (None: the session's, i.e. the server's).
        self._synchronous_commit = synchronous_commit
        #: Batches being written (their items in arrival order), for the deadline watchdog.
        self._writing: list[list[PendingReceipt]] = []
        self._watchdog: asyncio.Task[None] | None = None
        #: Monotonic time of the last committed batch (``/readyz``: are commits progressing?).
        self.last_commit = time.monotonic()

    @property
    def depth(self) -> int:
        return len(self._pending)

    def stalled_s(self) -> float:
        """Seconds without progress while deliveries wait: since the later of the last commit and
        the arrival of the longest-waiting uncommitted delivery (0 when none waits). ``/readyz``
        says not ready when it passes the commit deadline (ADR 020)."""
        oldest: float | None = self._pending[0].enqueued if self._pending else None
        for batch in self._writing:
            if oldest is None or batch[0].enqueued < oldest:
                oldest = batch[0].enqueued
        if oldest is None:
            return 0.0
        return time.monotonic() - max(oldest, self.last_commit)

    def start(self) -> None:
        self._closing = False
        self._tasks = [
            asyncio.create_task(self._run(), name=f"ingress-receipt-writer-{i}") for i in range(self._writers)
        ]
        if self._deadline > 0:
            self._watchdog = asyncio.create_task(self._watch(), name="ingress-commit-deadline")

    async def stop(self) -> None:
        """Commit what is queued, then stop the writers."""
        self._closing = True
        self._wakeup.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        # Anything left (writers crashed): answer it, never leave a request hanging.
        while self._pending:
            _resolve(self._pending.popleft(), CommitResult(None, False, SHUTTING_DOWN))

    def submit(self, item: PendingReceipt) -> asyncio.Future[CommitResult]:
        """Queue a delivery; the future resolves after its batch committed (or failed)."""
        if self._closing:
            raise Unavailable(SHUTTING_DOWN)
        if len(self._pending) >= self._max_queue:
            raise Unavailable(OVERLOADED)
        future: asyncio.Future[CommitResult] = asyncio.get_running_loop().create_future()
        item.future = future
        item.enqueued = time.monotonic()
        self._pending.append(item)
        if not self._wakeup.is_set():
            self._wakeup.set()
        return future

    async def _run(self) -> None:
        pending = self._pending
        while True:
            if not pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._max_wait and len(pending) < self._max_batch and not self._closing:
                await asyncio.sleep(self._max_wait)  # let companions join this commit
                if not pending:
                    continue
            batch = [pending.popleft() for _ in range(min(len(pending), self._max_batch))]
            writing = self._writing
            writing.append(batch)
            try:
                await self._commit(batch)
            except Exception as exc:  # never lose a writer; never leave a request hanging
                log.error("receipt writer failed", extra={"error_class": type(exc).__name__})
                for item in batch:
                    _resolve(item, CommitResult(None, False, INTERNAL))
            finally:
                writing.remove(batch)

    async def _watch(self) -> None:
        """The commit deadline: answer what waited ``commit_deadline_s`` since it joined the queue."""
        deadline = self._deadline
        tick = min(0.1, deadline / 10)
        pending = self._pending
        expired = metrics.COMMIT_DEADLINE_EXCEEDED
        while True:
            await asyncio.sleep(tick)
            limit = time.monotonic() - deadline
            while pending and pending[0].enqueued <= limit:  # the queue is in arrival order
                item = pending.popleft()
                if _resolve(item, CommitResult(None, False, COMMIT_DEADLINE)):
                    expired.inc()
            for batch in self._writing:
                if batch[0].enqueued > limit:
                    continue
                for item in batch:
                    if item.enqueued <= limit and _resolve(item, CommitResult(None, False, COMMIT_DEADLINE)):
                        expired.inc()

    async def _commit(self, batch: list[PendingReceipt]) -> None:
        deadline = time.monotonic() - self._queue_timeout
        live: list[PendingReceipt] = []
        for item in batch:
            if item.enqueued < deadline:
                _resolve(item, CommitResult(None, False, OVERLOADED))
            else:
                live.append(item)
        if not live:
            return
        results = await self._write(live)
        for item, result in zip(live, results, strict=True):
            _resolve(item, result)

    async def _write(self, batch: list[PendingReceipt], *, split: bool = True) -> list[CommitResult]:
        for attempt in (1, 2):
            started = time.perf_counter()
            try:
                async with self._pool.connection(timeout=self._pool_timeout) as conn:
                    results = await receipt_commit_batch(conn, batch, self._synchronous_commit)
            except pg_errors.DeadlockDetected:
                if attempt == 1:
                    metrics.DEADLOCK_RETRIES.inc()
                    continue
                return self._failed(batch, DB_ERROR)
            except (pg_errors.DataError, pg_errors.IntegrityError, UnicodeError) as exc:
                # One delivery must not fail its companions: isolate it by writing one at a time.
                if split and len(batch) > 1:
                    out: list[CommitResult] = []
                    for item in batch:
                        out.extend(await self._write([item], split=False))
                    return out
                log.error("receipt rejected by the database", extra={"error_class": type(exc).__name__})
                return self._failed(batch, DB_ERROR)
            except Exception as exc:
                reason = _failure_reason(exc)
                if reason in (DB_ERROR, INTERNAL):
                    log.error("receipt batch failed", extra={"error_class": type(exc).__name__})
                return self._failed(batch, reason)
            metrics.COMMIT_SECONDS.observe(time.perf_counter() - started)
            metrics.BATCH_SIZE.observe(len(batch))
            self.last_commit = time.monotonic()
            return results
        return self._failed(batch, DB_ERROR)  # pragma: no cover - loop always returns

    @staticmethod
    def _failed(batch: list[PendingReceipt], reason: str) -> list[CommitResult]:
        metrics.BATCH_FAILURES.labels(reason).inc()
        return [CommitResult(None, False, reason) for _ in batch]


def _resolve(item: PendingReceipt, result: CommitResult) -> bool:
    """Answer ``item`` unless it was answered already (True when this call answered it)."""
    future = item.future
    if future is not None and not future.done():
        future.set_result(result)
        return True
    return False
