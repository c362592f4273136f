"""The engine: the state the executor's actors share, and their start and stop (docs/executor.md).

Data flow of one item (no per-item round trip anywhere)::

  claimer      ──(claim statement: a batch for several groups)──▶ held + ready deque
                  (which statement: claim_levels; how many per group: scheduler.allocate)
  runner       ──(handler)──▶ outcome appended to the finalizer's pending batch
  finalizer    ──(one fenced UPDATE per batch; lane items: lock → update → settle)──▶ rows final
                  then its follow-ups: circuits, slots, lane promotions (scheduler hints, wake),
                  held released, outcome metrics
  lease keeper ──(one fenced renew per interval for every held item)──▶ leases extended / lost
  lease watch  ──(the monotonic clock: lease as last confirmed, less a margin)──▶ expired ones lost
  reclaimer    ──(expired leases of any process, re-checked in the statement)──▶ retry / dead
  listener     ──(NOTIFY connector_work)──▶ scheduler hints, claimer woken

Doors (``doors.py``): the engine passes itself to every actor, which is typed with its door only —
what it may read and what it may change of the shared state::

  claimer      reads cfg, capacity, registry, scheduler  changes held, held_by_pack, ready, idle,
                                                          wake, rediscover, known_packs, stats
  runner       reads draining                            changes ready, idle, running, idle_runners
  finalizer    reads capacity, claiming                  changes held, held_by_pack, wake, stats;
                                                          scheduler hints
  lease keeper reads held                                changes ready (lost items), stats
  reclaimer    reads cfg                                 changes wake, stats; scheduler hints
  listener     —                                         changes rediscover, wake; scheduler hints

No actor module imports this one (tests/test_import_contract.py). Admission: ``held`` (claimed and
not yet finalized) never exceeds ``capacity = workers + prefetch``; the scheduler (``scheduler.py``)
splits the free part of that window between (pack, queue class) groups. Every time decision against
the database uses the database clock; this process only measures local intervals with
``time.monotonic()``.
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

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from connector.common.core.figures import Recorder
from connector.common.core.listener import Listener
from connector.common.core.runtime import cancel_tasks
from connector.executor import metrics as m
from connector.executor.handlers.registry import HandlerRegistry
from connector.executor.work.claimer import Claimer
from connector.executor.work.finalizer import Finalizer
from connector.executor.work.inflight import InFlight
from connector.executor.work.lease_keeper import LeaseKeeper
from connector.executor.work.lease_watch import LeaseWatch
from connector.executor.work.listener import work_listener
from connector.executor.work.reclaimer import Reclaimer
from connector.executor.work.runner import Runner
from connector.executor.work.scheduler import Scheduler, parse_budgets, parse_weights

log = logging.getLogger(__name__)

monotonic = time.monotonic  # the only clock the engine reads (local intervals, never compared to the DB)


@dataclass
class EngineConfig:
    workers: int = 16
    claim_batch: int = 64
    prefetch: int = -1  # -1: claim_batch
    lease_s: float = 30.0
    lease_margin_s: float = -1.0  # -1: one renewal interval (lease_s / 3); see lease_watch.py
    poll_interval_s: float = 0.5
    reclaim_interval_s: float = 5.0
    shutdown_grace_s: float = 10.0
    queue_class_weights: dict[str, float] = field(default_factory=dict)
    pack_weights: dict[str, float] = field(default_factory=dict)
    pack_max_inflight: int = 0
    pack_budgets: dict[str, int] = field(default_factory=dict)
    fair: bool = True
    handler_threads: int = 0  # 0: workers
    flow_key_idle_s: float = 3_600.0  # idle flow key rows older than this are deleted (0: never)

    @property
    def lease_usable_s(self) -> float:
        """The part of a lease this process uses: ``lease_s`` less the margin (``lease_watch.py``)."""
        margin = self.lease_s / 3.0 if self.lease_margin_s < 0 else self.lease_margin_s
        return max(0.0, self.lease_s - margin)

    @property
    def capacity(self) -> int:
        return self.workers + (self.claim_batch if self.prefetch < 0 else self.prefetch)


class Engine:
    """Shared state (what is held, what is ready, the wake-up events) and the actors' lifecycle."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        cfg: EngineConfig,
        *,
        owner: str,
        on_error: Callable[[str, BaseException], None] | None = None,
        claim_process: str | None = None,
    ) -> None:
        self.pool = pool
        self.cfg = cfg
        self.owner = owner
        #: The registered process whose admitted receipts gate this engine's claims (the executor
        #: service passes its process id; None: claims are gated by the authority rows alone).
        self.claim_process = claim_process
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
        self.held: dict[int, InFlight] = {}
        self.held_by_pack: dict[int, int] = {}
        #: The pool's drain count when each kept connection was taken (``dedicated``, ``outdated``).
        self._taken_at_drain: dict[int, int] = {}
        self.ready: deque[InFlight] = deque()
        self.running = 0
        self.idle: deque[asyncio.Future[None]] = deque()  # runners waiting for a ready item
        self.wake = asyncio.Event()  # the claimer: look again (space, a hint, a due retry)
        self.claiming = True
        self.stopping = False
        self.draining = False
        self.rediscover = False  # a NOTIFY arrived: look for new groups at the next iteration
        self.idle_runners = asyncio.Event()
        self.rnd = random.Random()
        self.min_claim = max(1, min(cfg.claim_batch, self.capacity) // 4)
        self.known_packs: set[int] = set()
        #: Executions and their latencies for the cluster's figures (``connector.executor.figures``;
        #: in memory, flushed by the service's figures job).
        self.figures = Recorder()
        self._on_error = on_error
        # Test signals (instead of sleeps): counts that tests may wait on.
        self.stats = {
            "claims": 0,
            "claimed": 0,
            "completed": 0,
            "stale": 0,
            "reclaimed": 0,
            "abandoned": 0,
            "deadlocks": 0,
            "rate_limited": 0,
            "flow_switches": 0,
            "due_probes": 0,
        }
        self.claimer = Claimer(self)
        self.runner = Runner(self)
        self.finalizer = Finalizer(self)
        self.lease_keeper = LeaseKeeper(self)
        self.lease_watch = LeaseWatch(self)
        self.reclaimer = Reclaimer(self)
        self._listener: Listener | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._runners: list[asyncio.Task[Any]] = []
        self._claim_task: asyncio.Task[Any] | None = None

    # ---------------------------------------------------------------------------------------------
    # lifecycle
    # ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        m.SLOTS.set(self.cfg.workers)
        m.SLOTS_IN_USE.set_function(lambda: self.running)
        self.finalizer.start()
        self._tasks.append(asyncio.create_task(self.lease_keeper.run(), name="executor-lease-keeper"))
        self._tasks.append(asyncio.create_task(self.lease_watch.run(), name="executor-lease-watch"))
        self._tasks.append(asyncio.create_task(self.reclaimer.run(), name="executor-reclaimer"))
        self._listener = work_listener(self)
        await self._listener.start()
        self._runners = [
            asyncio.create_task(self.runner.run(), name=f"executor-worker-{i}")
            for i in range(self.cfg.workers)
        ]
        self._claim_task = asyncio.create_task(self.claimer.run(), name="executor-claim-loop")

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; give running handlers ``grace_s`` to finish; release everything else
        (immediately claimable elsewhere); flush; stop the loops."""
        grace = self.cfg.shutdown_grace_s if grace_s is None else grace_s
        release = self.finalizer.release
        self.claiming = False
        self.wake.set()
        if self._claim_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._claim_task
        # Prefetched items never started: give them back at once.
        while self.ready:
            release(self.ready.popleft(), unstarted=True)
        if self.running:
            self.idle_runners.clear()
            self.draining = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle_runners.wait(), timeout=grace)
        self.stopping = True
        for f in list(self.held.values()):
            if f.started and not f.done:
                f.cancel = "shutdown"
                if f.task is not None:
                    f.task.cancel()
        for fut in self.idle:
            if not fut.done():
                fut.set_result(None)
        await cancel_tasks(self._runners)
        # Whatever is still held and not finalized (cancelled handlers, sync handlers still in a
        # thread) is released.
        for f in list(self.held.values()):
            if not f.done:
                release(f, unstarted=not f.started)
        await self.finalizer.drain(max(2.0, grace))
        await self.finalizer.stop()
        await cancel_tasks(self._tasks)
        if self._listener is not None:
            await self._listener.stop()
        await self.registry.close()
        self.threads.shutdown(wait=False, cancel_futures=True)

    async def reclaim_once(self) -> Any:
        return await self.reclaimer.reclaim_once()

    # ---------------------------------------------------------------------------------------------
    # shared by the actors
    # ---------------------------------------------------------------------------------------------

    def error(self, loop: str, exc: BaseException) -> None:
        m.ERRORS.labels(loop).inc()
        log.warning("executor loop error", extra={"loop": loop, "exc_type": type(exc).__name__})
        if self._on_error is not None:
            self._on_error(loop, exc)

    async def dedicated(self) -> AsyncConnection[Any]:
        """A pool connection an actor keeps for its loop."""
        conn = await self.pool.getconn()
        self._taken_at_drain[id(conn)] = getattr(self.pool, "drains", 0)
        return conn

    def outdated(self, conn: AsyncConnection[Any] | None) -> bool:
        """True when the pool was drained since the actor took ``conn`` (the server changed, or
        another connection met a read-only one: ADR 020). A kept connection is not in the pool, so
        the drain cannot replace it: the actor gives it back and takes a new one. Without this the
        claimer stayed on a fenced old primary, where its discovery (a read) found nothing due and
        never met the error that evicts (tests/failover, the demoted primary)."""
        return conn is not None and self._taken_at_drain.get(id(conn), 0) != getattr(self.pool, "drains", 0)

    async def give_back(self, conn: AsyncConnection[Any] | None) -> None:
        if conn is not None:
            self._taken_at_drain.pop(id(conn), None)
            with contextlib.suppress(Exception):
                await self.pool.putconn(conn)

    def abandon(self, f: InFlight) -> None:
        """Forget an item without writing anything (its lease was lost or its write failed)."""
        f.done = True
        if self.held.pop(f.work_id, None) is not None:
            self.held_by_pack[f.installed_pack_id] -= 1
            m.ABANDONED.inc()
            self.stats["abandoned"] += 1
            self.space()

    def space(self) -> None:
        """Wake the claimer when a claim's worth of the window is free (or nothing is ready)."""
        if not self.wake.is_set() and (self.capacity - len(self.held) >= self.min_claim or not self.ready):
            self.wake.set()


def engine_config_from_settings(cfg: Any, **overrides: Any) -> EngineConfig:
    ec = EngineConfig(
        workers=cfg.workers,
        claim_batch=cfg.claim_batch,
        prefetch=getattr(cfg, "prefetch", -1),
        lease_s=cfg.lease_s,
        lease_margin_s=getattr(cfg, "lease_margin_s", -1.0),
        poll_interval_s=cfg.poll_interval_s,
        reclaim_interval_s=getattr(cfg, "reclaim_interval_s", 5.0),
        shutdown_grace_s=cfg.shutdown_grace_s,
        queue_class_weights=parse_weights(getattr(cfg, "queue_class_weights", "")),
        pack_weights=parse_weights(getattr(cfg, "pack_weights", "")),
        pack_max_inflight=getattr(cfg, "pack_max_inflight", 0),
        pack_budgets=parse_budgets(getattr(cfg, "pack_budgets", "")),
        handler_threads=getattr(cfg, "handler_threads", 0),
        flow_key_idle_s=getattr(cfg, "flow_key_idle_s", 3_600.0),
    )
    for k, v in overrides.items():
        setattr(ec, k, v)
    return ec
