"""An actor needs its door only (``work/doors.py``), not the engine: the lease keeper, the lease
watch and the finalizer run here against small stand-ins that hold exactly their door's members (no
engine, no database). A stand-in lacks everything else, so an actor that reached past its door would
fail here with an ``AttributeError`` (mypy says the same of the shipped code:
tests/test_import_contract.py checks that no actor module imports the engine)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

from connector.common.core.figures import Recorder
from connector.common.store.work_items.claim import CLAIM_COLUMNS
from connector.common.store.work_items.finalize import FinalizeResult
from connector.executor.work.finalizer import Finalizer
from connector.executor.work.inflight import InFlight
from connector.executor.work.lease_keeper import LeaseKeeper
from connector.executor.work.lease_watch import LeaseWatch


def _item(work_id: int, deadline: float, pack: int = 7) -> InFlight:
    row: dict[str, Any] = dict.fromkeys(CLAIM_COLUMNS)
    row.update(
        work_id=work_id,
        lease_token=1,
        installed_pack_id=pack,
        generation=1,
        queue_class="default",
        work_type="w",
        event_id=work_id,
        attempts=1,
        max_attempts=3,
    )
    return InFlight(tuple(row[c] for c in CLAIM_COLUMNS), deadline)


class LeaseKeeperStandIn:
    """Exactly ``LeaseKeeperDoor``."""

    def __init__(self) -> None:
        self.cfg = SimpleNamespace(lease_s=30.0)
        self.pool = None
        self.held: dict[int, InFlight] = {}
        self.ready: deque[InFlight] = deque()
        self.stats = {"stale": 0}
        self.abandoned: list[InFlight] = []

    def error(self, loop: str, exc: BaseException) -> None:
        raise exc

    def abandon(self, f: InFlight) -> None:
        self.abandoned.append(f)


def test_the_lease_keeper_needs_its_door_only() -> None:
    door = LeaseKeeperStandIn()
    lost, live = _item(1, deadline=0.0), _item(2, deadline=time.monotonic() + 100)
    door.held = {1: lost, 2: live}
    door.ready.extend([lost, live])
    LeaseKeeper(door).lose(lost)  # type: ignore[arg-type]  # tests are not type-checked anyway
    assert lost.lease_lost and door.abandoned == [lost]
    assert list(door.ready) == [live] and not live.lease_lost


class LeaseWatchStandIn:
    """Exactly ``LeaseWatchDoor`` (the lease keeper as its ``lose`` only)."""

    def __init__(self) -> None:
        self.cfg = SimpleNamespace(lease_s=30.0, lease_usable_s=20.0)
        self.held: dict[int, InFlight] = {}
        self.lost: list[InFlight] = []
        self.lease_keeper = SimpleNamespace(lose=self.lost.append)


def test_the_lease_watch_needs_its_door_only() -> None:
    door = LeaseWatchStandIn()
    now = time.monotonic()
    expired, live = _item(1, deadline=now - 1), _item(2, deadline=now + 100)
    door.held = {1: expired, 2: live}
    earliest = LeaseWatch(door).sweep(now)  # type: ignore[arg-type]
    assert door.lost == [expired] and earliest == live.deadline


class FinalizerStandIn:
    """Exactly ``FinalizerDoor`` (the scheduler as its hints only)."""

    def __init__(self) -> None:
        self.capacity = 10
        self.claiming = True
        self.rnd = random.Random(1)
        self.hints: list[Any] = []
        self.scheduler = SimpleNamespace(
            mark_ready=lambda packs=None: self.hints.append(("ready", packs)),
            note_due=lambda pack, qc, at: self.hints.append(("due", pack, qc)),
        )
        self.held: dict[int, InFlight] = {}
        self.held_by_pack: dict[int, int] = {}
        self.wake = asyncio.Event()
        self.stats = {"stale": 0, "completed": 0, "deadlocks": 0, "abandoned": 0}
        self.figures = Recorder()
        self.spaced = 0
        self.owner = "owner-1"
        self.claim_process: str | None = None
        self.cfg = SimpleNamespace(lease_s=30.0, lease_usable_s=20.0)
        self.handed: list[Any] = []

        async def hold(conn: Any, rows: list[Any], deadline: float) -> None:
            self.handed.extend(rows)

        self.claimer = SimpleNamespace(hold=hold)

    def error(self, loop: str, exc: BaseException) -> None:
        raise exc

    async def dedicated(self) -> Any:
        raise AssertionError("not used here")

    async def give_back(self, conn: Any) -> None:
        raise AssertionError("not used here")

    def abandon(self, f: InFlight) -> None:
        raise AssertionError("nothing is abandoned here")

    def space(self) -> None:
        self.spaced += 1


async def test_the_finalizer_flush_needs_its_door_only(monkeypatch) -> None:
    """One flush: the write (stubbed store call) and its follow-ups, all through the door: the
    promoted lane's pack is marked ready and the claimer woken, the items leave the window."""
    from connector.common.store import work_items

    door = FinalizerStandIn()
    a, b = _item(1, 0.0), _item(2, 0.0)
    a.source_lane_key = "lane-1"  # a lane member: the flush is a lane flush
    for f in (a, b):
        door.held[f.work_id] = f
    door.held_by_pack[7] = 2
    calls: list[dict[str, Any]] = []

    async def finalize(conn, ids, tokens, fail, lanes=(), **kw):  # type: ignore[no-untyped-def]
        calls.append(
            {
                "ids": list(ids),
                "lanes": set(lanes),
                "notify_above": kw.get("notify_above"),
                "handoff": kw.get("handoff"),
            }
        )
        handed = [("row-of", 3)] if kw.get("handoff") else []
        return FinalizeResult(completed=list(ids), promoted=1 if lanes else 0, handed=handed)

    monkeypatch.setattr(work_items.finalize, "work_item_finalize", finalize)
    fin = Finalizer(door)  # type: ignore[arg-type]
    fin.finish(a, None)
    fin.finish(b, None)
    plain = fin._take()
    assert plain is not None and not plain.lanes and [f.work_id for f in plain.items] == [2]
    await fin._flush_batch(object(), plain)  # type: ignore[arg-type]
    assert calls[-1]["ids"] == [2] and not door.hints and not door.wake.is_set()
    assert set(door.held) == {1} and door.held_by_pack == {7: 1}
    lane = fin._take()
    assert lane is not None and lane.lanes
    await fin._flush_batch(object(), lane)  # type: ignore[arg-type]
    # The window had 1 held of 10 when the lane flush started: up to 10 promotions are its own.
    assert calls[-1]["ids"] == [1] and calls[-1]["notify_above"] == door.capacity - 1 + 1
    # The handoff replaces what the flush lets go (one member), leased to this process; what the
    # write handed off is held like claimed rows.
    handoff = calls[-1]["handoff"]
    assert (handoff.n, handoff.owner, handoff.lease_s) == (1, "owner-1", 30.0)
    assert door.handed == [("row-of", 3)]
    assert door.hints == [("ready", {7})] and door.wake.is_set()
    assert not door.held and door.held_by_pack == {7: 0}
    assert door.stats["completed"] == 2 and door.spaced == 2 and door.stats["handed_off"] == 1
