"""The figures job of an ingress or executor process (docs/metrics.md "Figures without Prometheus"):
every ``flush_s`` seconds, on wall-clock multiples of it, it takes what the process's ``Recorder``
(``connector.common.core.figures``) recorded and adds it to the cluster's rows in one statement
(``store.figures.figures_flush``): on its own autocommit connection in an executor (which may lead,
below), through the service's pool in the ingress. A process that saw nothing writes nothing.

What one interval recorded is attributed to the minute (and five minutes) holding the interval's
middle, on the database clock (each flush measures its offset to this process's monotonic clock;
with a ``flush_s`` dividing 60, an interval never straddles a minute). A flush that fails keeps its rows
and adds them to the next one (merged by period and pack); rows older than ``PENDING_KEEP_S`` are
dropped and counted. A commit whose outcome is unknown (the connection lost in the commit) may add
one interval twice: the figures are diagnostics, never an input of the runtime.

Leader (the executor's job, ``lead=True``): the job that holds the session advisory lock
``(FIGURES_LOCK_CLASS, 0)`` on its connection — tried each round until held, held while the
connection lives, so another executor takes over within a round of the holder's exit — seals the
closed periods (their quantiles, ``store.figures.figures_seal``) and deletes rows past the
retention; its process's stats sampler writes the gauges (``leader`` says whether it may).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from prometheus_client import Counter, Gauge
from psycopg_pool import AsyncConnectionPool

from connector.common.core.background import BackgroundJob, session_lock_try
from connector.common.core.figures import CLUSTER, Recorder, sealed, with_cluster
from connector.common.core.metrics import SHARED
from connector.common.store import figures as store
from connector.common.store.figures import FIVE_MINUTES, MINUTE, STEPS, FlushRow

log = logging.getLogger("connector.figures")

FIGURES_LOCK_CLASS = 7234106
FIGURES_LOCK_OBJECT = 0
#: Rows a failed flush keeps for the next ones at most this long (then dropped, counted).
PENDING_KEEP_S = 600.0
#: Minute rows are kept this long (the hour view reads one hour; five-minute rows: the retention).
MINUTE_KEEP_S = 6 * 3600.0
#: Closed periods are sealed when younger than this (older late flushes stay unsealed: their reads
#: merge histograms instead, correct and a little dearer).
SEAL_HORIZON_S = 3600.0
SEAL_LIMIT = 2000
#: Leader rounds between two retention passes.
RETIRE_EVERY = 30
#: Longest a pool-flushing job waits for a connection (the round is retried with the next flush).
POOL_TIMEOUT_S = 5.0

FLUSHES = Counter(
    "connector_figures_flushes_total",
    "Figures flushes of this process by result: ok (rows added), error (kept for the next flush)",
    ["service", "result"],
    registry=SHARED,
)
DROPPED = Counter(
    "connector_figures_dropped_rows_total",
    "Figures rows of failed flushes dropped after PENDING_KEEP_S (600 s): those figures are missing",
    ["service"],
    registry=SHARED,
)
LEADER = Gauge(
    "connector_figures_leader",
    "1 while this process leads the figures (gauge samples, sealing, retention): one executor",
    ["service"],
    registry=SHARED,
)
SEALED = Counter(
    "connector_figures_sealed_total", "Closed figures periods sealed (quantiles stored)", ["service"],
    registry=SHARED,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class FiguresConfig:
    flush_s: float = 10.0
    #: Whether this process may lead (executors).
    lead: bool = False
    retention_s: float = 604_800.0

    @property
    def enabled(self) -> bool:
        return self.flush_s > 0

    @property
    def grace_s(self) -> float:
        """How long after a period's end it is sealed: every process flushed it by then."""
        return 2 * self.flush_s + 5.0


_Key = tuple[int, int, float]  # (step, pack, period start)


class FiguresJob(BackgroundJob):
    """Flushes ``recorder`` every ``flush_s``; leads when ``lead`` and the lock is free."""

    kind = "figures"

    def __init__(
        self,
        url: str,
        service: str,
        recorder: Recorder,
        cfg: FiguresConfig,
        pool: AsyncConnectionPool | None = None,
    ) -> None:
        super().__init__(url, service, interval_s=max(cfg.flush_s, 0.01))
        self.recorder = recorder
        self.cfg = cfg
        #: A process that never leads (the ingress) flushes through its service's pool: no
        #: connection of its own (a leader needs one: its lock is a session lock).
        self.pool = pool if not cfg.lead else None
        #: True while this process holds the figures lock.
        self.leader = False
        self._pending: dict[_Key, tuple[list[int], list[list[int]]]] = {}
        self._interval_start = 0.0  # database clock, from the first round (``_sync``)
        self._rounds = 0
        #: Flushes written and rows sealed by this job (tests wait on them).
        self.flushes = 0
        self.sealed = 0

    def start(self) -> None:
        if self.cfg.enabled:
            super().start()
            LEADER.labels(self.service).set(0)

    async def stop(self) -> None:
        """Stop the loop, then flush what was recorded since the last round (best effort)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(), timeout=max(2.0, self.cfg.flush_s))
        await self.close()

    async def close(self) -> None:
        await super().close()  # a session lock ends with its connection
        if self.leader:
            self.leader = False
            LEADER.labels(self.service).set(0)

    def _now(self) -> float:
        """The database clock, by this process's monotonic clock and the measured offset."""
        return time.monotonic() + self.recorder.clock_offset_s

    def _pause(self) -> float:
        """Until the next multiple of ``flush_s`` on the database clock."""
        step = self.cfg.flush_s
        return max(0.01, step - math.fmod(self._now(), step))

    async def _sync(self) -> None:
        """The first round: the offset of the database clock (one ``SELECT``), before anything is
        attributed to a period."""
        if self.pool is not None:
            async with self.pool.connection(timeout=POOL_TIMEOUT_S) as conn:
                before = time.monotonic()
                _, db_clock = await store.figures_flush(conn, [])
        else:
            conn = await self.connection()
            before = time.monotonic()
            _, db_clock = await store.figures_flush(conn, [])
        self.recorder.clock_offset_s = db_clock - (before + time.monotonic()) / 2
        self.recorder.synced = True
        self._interval_start = self._now()

    async def run_once(self) -> None:
        if not self.recorder.synced:
            await self._sync()
        await self.flush()
        if self.cfg.lead:
            self._rounds += 1
            await self.lead()

    # -- flush ---------------------------------------------------------------------------------

    def _collect(self) -> None:
        """Move what the recorder holds into the pending rows of the interval's periods."""
        now = self._now()
        middle = (self._interval_start + now) / 2 if self._interval_start else now
        self._interval_start = now
        taken = self.recorder.take()
        if not taken:
            return
        for pack, f in with_cluster(taken).items():
            counts = f.counts()
            hists = f.histograms()
            for step in STEPS:
                key = (step, pack, math.floor(middle / step) * step)
                had = self._pending.get(key)
                if had is None:
                    self._pending[key] = (list(counts), [list(h) for h in hists])
                    continue
                for i, n in enumerate(counts):
                    had[0][i] += n
                for mine, theirs in zip(had[1], hists, strict=True):
                    if len(theirs) > len(mine):
                        mine.extend([0] * (len(theirs) - len(mine)))
                    for i, n in enumerate(theirs):
                        mine[i] += n

    async def flush(self) -> int:
        """One flush (also called on stop); returns the rows written."""
        if not self.recorder.synced and self.recorder.packs:
            await self._sync()  # before anything is attributed to a period
        self._collect()
        if not self._pending:
            return 0
        rows = [
            FlushRow(step, pack, start, tuple(counts), tuple(hists))
            for (step, pack, start), (counts, hists) in self._pending.items()
        ]
        try:
            if self.pool is not None:
                async with self.pool.connection(timeout=POOL_TIMEOUT_S) as conn:
                    before = time.monotonic()
                    written, db_clock = await store.figures_flush(conn, rows)
            else:
                conn = await self.connection()
                before = time.monotonic()
                written, db_clock = await store.figures_flush(conn, rows)
        except BaseException:
            FLUSHES.labels(self.service, "error").inc()
            self._drop_old()
            raise
        after = time.monotonic()
        self._pending.clear()
        self.recorder.clock_offset_s = db_clock - (before + after) / 2
        self.recorder.synced = True
        self.flushes += 1
        FLUSHES.labels(self.service, "ok").inc()
        return written

    def _drop_old(self) -> None:
        horizon = self._now() - PENDING_KEEP_S
        old = [k for k in self._pending if k[2] < horizon]
        for k in old:
            del self._pending[k]
        if old:
            DROPPED.labels(self.service).inc(len(old))

    # -- leader --------------------------------------------------------------------------------

    async def lead(self) -> None:
        conn = await self.connection()
        if not self.leader:
            self.leader = await session_lock_try(conn, FIGURES_LOCK_CLASS, FIGURES_LOCK_OBJECT)
            if not self.leader:
                return
            LEADER.labels(self.service).set(1)
            log.info("figures: this process leads the gauge samples, sealing and retention")
        await self.seal(conn)
        if self._rounds % RETIRE_EVERY == 1:
            await store.figures_retire(
                conn, {MINUTE: MINUTE_KEEP_S, FIVE_MINUTES: max(self.cfg.retention_s, 86_400.0)}
            )

    async def seal(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """Store the quantiles of the closed periods not sealed yet."""
        rows = await store.figures_unsealed(
            conn, grace_s=self.cfg.grace_s, horizon_s=SEAL_HORIZON_S, limit=SEAL_LIMIT
        )
        if not rows:
            return 0
        n = await store.figures_seal(conn, [(r, sealed(r.histograms)) for r in rows])
        self.sealed += n
        SEALED.labels(self.service).inc(n)
        return n

    def on_failure(self, exc: BaseException) -> None:
        log.warning(
            "figures flush failed; its figures go with the next one",
            extra={"exc_type": type(exc).__name__, "sqlstate": getattr(exc, "sqlstate", None)},
        )


__all__ = ["CLUSTER", "FIGURES_LOCK_CLASS", "FiguresConfig", "FiguresJob"]
