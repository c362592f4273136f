"""Lanes at materialization: members inserted blocked and settled, a late earlier delivery takes its
lane back (or is counted as an inversion when the later member already started), and delivery order
holds end to end with two materializers racing over one backlog (DESIGN §8 traps 4 and 7)."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import psycopg

from connector.common.store import receipts
from connector.common.store.lanes import lane_lock_batch, lane_settle_batch, lanes_of
from connector.materializer import metrics
from connector.materializer.router import Router

from .conftest import apply, body, insert_receipts, manifest, rows, scalar, wait_until, work_type


def _lanes_manifest(*, target: bool = False) -> dict[str, Any]:
    lanes = {"source_fifo": True, "target_serialization": target}
    doc = manifest(work_types={"sync": work_type(lanes=lanes)})
    doc["routes"][0]["extract"]["target_lane_key"] = {"template": "acct:{/data/acct}"}
    return doc


async def _due_in(conn: psycopg.AsyncConnection, receipt_id: int, interval: str) -> None:
    await conn.execute(
        "UPDATE connector_ingress_receipt SET next_attempt_at = now() + %s::interval WHERE receipt_id = %s",
        (interval, receipt_id),
    )


async def _states(conn: psycopg.AsyncConnection, receipt_ids: list[int]) -> list[str]:
    result = await rows(
        conn,
        """SELECT w.state FROM connector_work_item w JOIN connector_event e USING (event_id)
           WHERE e.receipt_id = ANY(%s) ORDER BY e.receipt_id""",
        (receipt_ids,),
    )
    return [r[0] for r in result]


async def test_lane_members_are_blocked_behind_the_first(adb, make_router) -> None:
    await apply(adb, _lanes_manifest(target=True))
    ids = await insert_receipts(
        adb, [body("o1", acct="A"), body("o1", acct="A"), body("o2", acct="A"), body("o3", acct="B")]
    )
    await (await make_router()).drain()
    # o1 and o2 share target lane acct:A: one runnable member; o3 is alone in both its lanes.
    assert await _states(adb, ids) == ["pending", "blocked", "blocked", "pending"]
    lanes = await rows(
        adb, "SELECT source_lane_key, target_mutation_lane_key FROM connector_work_item ORDER BY work_id"
    )
    assert lanes[0] == ("sync:order:o1", "acct:A")


async def test_a_late_earlier_delivery_takes_its_lane_back(adb, make_router) -> None:
    await apply(adb, _lanes_manifest())
    early, late = await insert_receipts(adb, [body("o1"), body("o1")])
    await _due_in(adb, early, "1 hour")
    router: Router = await make_router()
    await router.drain()
    assert await _states(adb, [late]) == ["pending"]
    await _due_in(adb, early, "0")
    result = await router.drain()
    assert (result.demoted, result.inverted) == (1, 0)
    assert await _states(adb, [early, late]) == ["pending", "blocked"]


async def test_an_inversion_that_already_started_is_counted(adb, make_router) -> None:
    await apply(adb, _lanes_manifest())
    early, late = await insert_receipts(adb, [body("o1"), body("o1")])
    await _due_in(adb, early, "1 hour")
    router: Router = await make_router()
    await router.drain()
    await adb.execute(
        "UPDATE connector_work_item SET state = 'processing', lease_owner = 'x',"
        " lease_until = now() + interval '1 m'"
    )
    await _due_in(adb, early, "0")
    before = metrics.LANE_INVERSIONS._value.get()
    result = await router.drain()
    assert result.inverted == 1 and metrics.LANE_INVERSIONS._value.get() == before + 1
    assert await _states(adb, [early, late]) == ["blocked", "processing"]


async def _execute_step(conn: psycopg.AsyncConnection, started: dict[str, list[int]]) -> int:
    """One executor step: claim ready items, record the order each lane's members started in, finish
    them (lane lock + settle, as the executor does). Returns how many ran."""
    cur = await conn.execute(
        """UPDATE connector_work_item SET state = 'processing', lease_owner = 'fake',
             lease_until = clock_timestamp() + interval '1 minute'
           WHERE work_id IN (SELECT work_id FROM connector_work_item WHERE state = 'pending'
                             ORDER BY work_id LIMIT 16 FOR UPDATE SKIP LOCKED)
           RETURNING work_id, installed_pack_id, source_lane_key, delivery_seq"""
    )
    claimed = sorted(await cur.fetchall(), key=lambda r: r[3])
    for _, _, lane, seq in claimed:
        started.setdefault(lane, []).append(seq)
    if claimed:
        async with conn.transaction():
            lanes = [lane for r in claimed for lane in lanes_of(r[1], r[2], None)]
            locked = await lane_lock_batch(conn, lanes)
            await conn.execute(
                "UPDATE connector_work_item SET state = 'succeeded', lease_owner = NULL"
                " WHERE work_id = ANY(%s)",
                ([r[0] for r in claimed],),
            )
            await lane_settle_batch(conn, locked)
    return len(claimed)


async def _execute_ready(conn: psycopg.AsyncConnection, started: dict[str, list[int]]) -> None:
    while await _execute_step(conn, started):
        pass


async def _fake_executor(url: str, done: asyncio.Event, started: dict[str, list[int]]) -> None:
    """Runs ready items as fast as it can until ``done`` and nothing is left."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            if not await _execute_step(conn, started):
                if done.is_set():
                    return
                await asyncio.sleep(0.002)


async def _race(
    adb, db_url: str, make_router, *, order_wait_max_s: float
) -> tuple[dict[str, list[int]], int]:
    """Two materializers over one backlog with random lane assignment; the first one is slow to
    commit, so the second one's later batches would commit first without the ordering gate."""
    await apply(adb, _lanes_manifest())
    rng = random.Random(7)
    await insert_receipts(adb, [body(f"o{rng.randrange(12)}") for _ in range(400)])
    slow: Router = await make_router(batch_size=32, order_wait_max_s=order_wait_max_s, poll_interval_s=0.05)
    fast: Router = await make_router(batch_size=32, order_wait_max_s=order_wait_max_s, poll_interval_s=0.05)
    write = slow._write

    async def slow_write(plans: Any, **kw: Any) -> Any:
        await asyncio.sleep(0.08)
        return await write(plans, **kw)

    slow._write = slow_write  # type: ignore[method-assign]
    done = asyncio.Event()
    started: dict[str, list[int]] = {}
    executor = asyncio.create_task(_fake_executor(db_url, done, started))
    slow.start()
    fast.start()
    try:
        await wait_until(
            lambda: _all_done(adb), timeout=40, what="every receipt materialized and every item finished"
        )
    finally:
        done.set()
        await slow.stop()
        await fast.stop()
        await executor
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item WHERE state = 'succeeded'") == 400
    assert slow.totals.materialized > 0 and fast.totals.materialized > 0, "both materializers took part"
    late = sum(r.totals.demoted + r.totals.inverted for r in (slow, fast))
    return started, late


async def _all_done(conn: psycopg.AsyncConnection) -> bool:
    left = await scalar(
        conn,
        """SELECT (SELECT count(*) FROM connector_ingress_receipt WHERE router_status <> 'materialized')
                + (SELECT count(*) FROM connector_work_item WHERE state <> 'succeeded')""",
    )
    return left == 0 and await scalar(conn, "SELECT count(*) FROM connector_work_item") == 400


def _violations(started: dict[str, list[int]]) -> int:
    return sum(1 for seqs in started.values() for a, b in itertools.pairwise(seqs) if b < a)


async def test_two_materializers_keep_delivery_order_per_lane(adb, db_url: str, make_router) -> None:
    deferrals = metrics.ORDER_DEFERRALS._value.get()
    inversions = metrics.LANE_INVERSIONS._value.get()
    started, late = await _race(adb, db_url, make_router, order_wait_max_s=10.0)
    assert _violations(started) == 0, started
    assert late == 0, "no lane member was overtaken by a late earlier delivery"
    assert metrics.LANE_INVERSIONS._value.get() == inversions
    assert metrics.ORDER_DEFERRALS._value.get() > deferrals, "the gate was exercised"


async def _two_batches(adb, make_router, *, order_wait_max_s: float) -> tuple[Router, Router, list[Any]]:
    """Two materializers; the first holds the claim of the earliest 32 receipts, the second is about
    to route the next 32 (random lanes, so many lanes have members in both)."""
    await apply(adb, _lanes_manifest())
    rng = random.Random(11)
    await insert_receipts(adb, [body(f"o{rng.randrange(12)}") for _ in range(64)])
    first: Router = await make_router(batch_size=32, order_wait_max_s=order_wait_max_s)
    second: Router = await make_router(batch_size=32, order_wait_max_s=order_wait_max_s)
    async with first._pool.connection() as conn:
        earlier = await receipts.routing.receipt_claim_routable(
            conn, owner="first", limit=32, lease_s=30, horizon_wait_s=30
        )
    assert len(earlier) == 32
    return first, second, earlier


async def test_control_a_later_batch_committing_first_breaks_lane_order(adb, make_router) -> None:
    """Without the gate the later batch commits first, its lane heads run, and the earlier batch's
    members run after them: the checker used by the race test sees the violations."""
    first, second, earlier = await _two_batches(adb, make_router, order_wait_max_s=0.0)
    started: dict[str, list[int]] = {}
    assert (await second.run_once()).materialized == 32
    await _execute_ready(adb, started)
    assert (await first.route(earlier)).materialized == 32
    await _execute_ready(adb, started)
    assert _violations(started) > 0


async def test_gate_holds_the_later_batch_until_the_earlier_one_commits(adb, make_router) -> None:
    first, second, earlier = await _two_batches(adb, make_router, order_wait_max_s=10.0)
    started: dict[str, list[int]] = {}
    later = asyncio.create_task(second.run_once())
    await asyncio.sleep(0.3)
    await _execute_ready(adb, started)
    assert not later.done(), "the later batch waits for the earlier receipts"
    assert started == {}, "nothing of the later batch became runnable"
    assert (await first.route(earlier)).materialized == 32
    assert (await asyncio.wait_for(later, 10)).materialized == 32
    await _execute_ready(adb, started)
    assert _violations(started) == 0
    assert sum(len(v) for v in started.values()) == 64
