"""The actors' doors: what each actor of the WorkItem path may read and what it may change of the
state the engine shares (docs/executor.md#actors-and-their-doors).

The engine owns the state and passes itself to every actor; an actor is typed with its door only, so
it cannot reach (mypy) what its door does not name, and no actor module imports the engine
(tests/test_import_contract.py: no cycle in ``work/``, not even a type-only one). A test may hand an
actor any object that fits its door. In a door, a property is something the actor reads; an
attribute is something it sets; a container typed ``Mapping`` is only read, one typed ``dict``,
``deque`` or ``set`` has its contents changed by the actor.

====================  =========================================  =================================
door                  reads                                      changes
====================  =========================================  =================================
``ClaimerDoor``       ``cfg`` (claim settings), ``capacity``,    ``held``, ``held_by_pack``,
                      ``min_claim``, ``owner``, ``claiming``,    ``ready``, ``idle`` (wakes
                      ``registry``, ``scheduler``                runners), ``wake``, ``rediscover``,
                                                                 ``known_packs``, ``stats``;
                                                                 ``finalizer.release``
``RunnerDoor``        ``draining``                               ``ready``, ``idle``, ``running``,
                                                                 ``idle_runners``, ``abandon``;
                                                                 ``finalizer.finish``,
                                                                 ``lease_watch.expire``
``FinalizerDoor``     ``capacity``, ``claiming``, ``rnd``,       ``held``, ``held_by_pack``,
                      ``owner``, ``claim_process``,              ``wake``, ``stats``, ``figures``,
                      ``cfg.lease_s``                            ``abandon``, ``space``; scheduler
                                                                 hints; ``claimer.hold`` (lane
                                                                 members handed off to it)
``LeaseKeeperDoor``   ``cfg.lease_s``, ``held``, ``pool``        ``ready``, ``stats``, ``abandon``
``LeaseWatchDoor``    ``cfg.lease_s``, ``held``                  ``lease_keeper.lose``
``ReclaimerDoor``     ``cfg`` (reclaim settings), ``rnd``,       ``wake``, ``stats``, ``figures``;
                      ``pool``                                   scheduler hints
``ListenerDoor``      ``pool``                                   ``rediscover``, ``wake``;
                                                                 scheduler hints
====================  =========================================  =================================

Every door but the runner's also has ``error`` (count and log a loop's error); the claimer's and
the finalizer's take a pool connection for their loop (``dedicated``, ``give_back``). The scheduler
and the stats sampler have no door: the scheduler is built from its settings and only answers the
claimer (``allocate``, ``record``) and takes hints (``Hints``); the sampler reads the database on
its own connection.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from connector.common.core.figures import Recorder
from connector.executor.handlers import Outcome
from connector.executor.handlers.registry import HandlerRegistry
from connector.executor.work.inflight import InFlight
from connector.executor.work.scheduler import Scheduler

# -------------------------------------------------------------------------------- what doors share


class Hints(Protocol):
    """The scheduler as the actors other than the claimer see it: they only tell it that groups may
    have due rows again (``Scheduler.mark_ready``, ``Scheduler.note_due``)."""

    def mark_ready(self, packs: Iterable[int] | None = None) -> None: ...

    def note_due(self, pack: int, queue_class: str, at: float) -> None: ...


class Finishes(Protocol):
    """The finalizer as the runners see it."""

    def finish(self, f: InFlight, out: Outcome | None) -> None: ...


class Expires(Protocol):
    """The lease watch as the runners see it: an item past its deadline is not started."""

    def expire(self, f: InFlight) -> None: ...


class Loses(Protocol):
    """The lease keeper as the lease watch sees it: stop using an item whose lease is gone."""

    def lose(self, f: InFlight) -> None: ...


class Holds(Protocol):
    """The claimer as the finalizer sees it: lane members a finalize handed off to this process."""

    async def hold(
        self, conn: AsyncConnection[Any], rows: list[tuple[Any, ...]], deadline: float
    ) -> None: ...


class Releases(Protocol):
    """The finalizer as the claimer sees it (claimed items it could not make runnable)."""

    def release(self, f: InFlight, *, unstarted: bool) -> None: ...


class Loop(Protocol):
    """What every actor's loop has: one way to report an error (metric, log line, test hook)."""

    def error(self, loop: str, exc: BaseException) -> None: ...


class Connections(Protocol):
    """A pool connection kept for an actor's loop (the claimer's, each finalizer flusher's)."""

    async def dedicated(self) -> AsyncConnection[Any]: ...

    def outdated(self, conn: AsyncConnection[Any] | None) -> bool: ...

    async def give_back(self, conn: AsyncConnection[Any] | None) -> None: ...


# ---------------------------------------------------------------------------------------- settings


class ClaimSettings(Protocol):
    @property
    def claim_batch(self) -> int: ...
    @property
    def lease_s(self) -> float: ...
    @property
    def lease_usable_s(self) -> float: ...
    @property
    def poll_interval_s(self) -> float: ...
    @property
    def pack_weights(self) -> Mapping[str, float]: ...
    @property
    def pack_budgets(self) -> Mapping[str, int]: ...


class LeaseSettings(Protocol):
    @property
    def lease_s(self) -> float: ...
    @property
    def lease_usable_s(self) -> float: ...


class ReclaimSettings(Protocol):
    @property
    def reclaim_interval_s(self) -> float: ...
    @property
    def flow_key_idle_s(self) -> float: ...


# ------------------------------------------------------------------------------------------- doors


class ClaimerDoor(Loop, Connections, Protocol):
    @property
    def cfg(self) -> ClaimSettings: ...
    @property
    def capacity(self) -> int: ...
    @property
    def min_claim(self) -> int: ...
    @property
    def owner(self) -> str: ...
    @property
    def claim_process(self) -> str | None: ...
    @property
    def claiming(self) -> bool: ...
    @property
    def registry(self) -> HandlerRegistry: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def finalizer(self) -> Releases: ...
    @property
    def held(self) -> dict[int, InFlight]: ...
    @property
    def held_by_pack(self) -> dict[int, int]: ...
    @property
    def ready(self) -> deque[InFlight]: ...
    @property
    def idle(self) -> deque[asyncio.Future[None]]: ...
    @property
    def wake(self) -> asyncio.Event: ...
    @property
    def stats(self) -> dict[str, int]: ...

    rediscover: bool
    known_packs: set[int]


class RunnerDoor(Protocol):
    @property
    def draining(self) -> bool: ...
    @property
    def finalizer(self) -> Finishes: ...
    @property
    def lease_watch(self) -> Expires: ...
    @property
    def ready(self) -> deque[InFlight]: ...
    @property
    def idle(self) -> deque[asyncio.Future[None]]: ...
    @property
    def idle_runners(self) -> asyncio.Event: ...

    running: int

    def abandon(self, f: InFlight) -> None: ...


class FinalizerDoor(Loop, Connections, Protocol):
    @property
    def cfg(self) -> LeaseSettings: ...
    @property
    def capacity(self) -> int: ...
    @property
    def claiming(self) -> bool: ...
    @property
    def owner(self) -> str: ...
    @property
    def claim_process(self) -> str | None: ...
    @property
    def claimer(self) -> Holds: ...
    @property
    def rnd(self) -> random.Random: ...
    @property
    def scheduler(self) -> Hints: ...
    @property
    def held(self) -> dict[int, InFlight]: ...
    @property
    def held_by_pack(self) -> dict[int, int]: ...
    @property
    def wake(self) -> asyncio.Event: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def figures(self) -> Recorder: ...

    def abandon(self, f: InFlight) -> None: ...

    def space(self) -> None: ...


class LeaseKeeperDoor(Loop, Protocol):
    @property
    def cfg(self) -> LeaseSettings: ...
    @property
    def pool(self) -> AsyncConnectionPool[Any]: ...
    @property
    def held(self) -> Mapping[int, InFlight]: ...
    @property
    def ready(self) -> deque[InFlight]: ...
    @property
    def stats(self) -> dict[str, int]: ...

    def abandon(self, f: InFlight) -> None: ...


class LeaseWatchDoor(Protocol):
    @property
    def cfg(self) -> LeaseSettings: ...
    @property
    def held(self) -> Mapping[int, InFlight]: ...
    @property
    def lease_keeper(self) -> Loses: ...


class ReclaimerDoor(Loop, Protocol):
    @property
    def cfg(self) -> ReclaimSettings: ...
    @property
    def pool(self) -> AsyncConnectionPool[Any]: ...
    @property
    def rnd(self) -> random.Random: ...
    @property
    def scheduler(self) -> Hints: ...
    @property
    def wake(self) -> asyncio.Event: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def figures(self) -> Recorder: ...


class ListenerDoor(Loop, Protocol):
    @property
    def pool(self) -> AsyncConnectionPool[Any]: ...
    @property
    def scheduler(self) -> Hints: ...
    @property
    def wake(self) -> asyncio.Event: ...

    rediscover: bool
