"""Lanes across a rollback: members held by a dead lane head are not fenced (they cannot run on any
path until the head is replayed, a WorkItem-path operation), and the legacy path runs fenced members
in their lane's order (target-lane serialization holds across different source objects)."""

from __future__ import annotations

import pytest

from connector.executor import cutover
from connector.executor.admin import replay

from .conftest import Rig, wait_until


async def test_legacy_path_keeps_target_lane_order_of_fenced_members(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first member is slow: without the lane order the second would finish first (control:
    # disabling the lane wait in legacy.py makes this test fail with [second, first]).
    monkeypatch.setenv("CUTOVER_TEST_SLOW_S", "0.6")
    await rig.install(lanes={"target_serialization": True})
    # Two source objects, one target: only the lane (not the source object) orders them.
    first, second = await rig.deliver("slow", "ok", object_ids=["a", "b"], targets=["T", "T"])
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    rolled = await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert rolled.fenced_work_items == 2
    lx = await rig.legacy_executor(workers=4)
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 2 FROM connector_work_item WHERE event_id = ANY(%s)"
            " AND state = 'reconciled_legacy_terminal'",
            ([first, second],),
        ),
        what="both fenced members reconciled",
    )
    await rig.stop(lx)
    order = [int(r[0]) for r in await rig.rows("SELECT event_id FROM cutover_test_effect ORDER BY seq")]
    assert order == [first, second], "the later lane member ran only after the earlier one finished"
    attempts = dict(
        await rig.rows(
            "SELECT event_id, legacy_attempts FROM connector_event WHERE event_id = ANY(%s)",
            ([first, second],),
        )
    )
    assert attempts == {first: 1, second: 1}, "waiting for the lane is not an attempt"


async def test_members_held_by_a_dead_lane_head_stay_on_the_work_item_path(rig: Rig) -> None:
    await rig.install(lanes={"source_fifo": True, "dead_head": "block"})
    dead, held_a, held_b = await rig.deliver("fail_once", "ok", "ok", object_ids=["x", "x", "x"])
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar("SELECT state = 'dead' FROM connector_work_item WHERE event_id = %s", (dead,)),
        what="the lane head is dead",
    )
    await rig.stop(wi)
    (free,) = await rig.deliver("ok", object_ids=["y"])
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    rolled = await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert rolled.proof is not None
    assert rolled.fenced_work_items == 1
    assert rolled.proof["fence"]["held_by_dead_lane_head_kept_on_work_item_path"] == 2
    items = await rig.work_items([dead, held_a, held_b, free])
    assert [items[e][0] for e in (dead, held_a, held_b, free)] == [
        "dead",
        "blocked",
        "blocked",
        "awaiting_legacy_outcome",
    ]
    owners = await rig.events([held_a, held_b, free])
    assert [owners[e][0] for e in (held_a, held_b, free)] == ["work_item", "work_item", "legacy_event"]

    lx = await rig.legacy_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT state = 'reconciled_legacy_terminal' FROM connector_work_item WHERE event_id = %s",
            (free,),
        ),
        what="the free member runs on the legacy path",
    )
    await rig.stop(lx)
    assert (await rig.work_items([held_a]))[held_a][0] == "blocked", "the dead head still holds its lane"

    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert cut.phase == "work_item_active"
    # Back on the WorkItem path the operator replays the head; the lane drains in order.
    dead_work_id = await rig.scalar("SELECT work_id FROM connector_work_item WHERE event_id = %s", (dead,))
    await replay.work_item_replay(rig.conn, int(dead_work_id), actor="test")
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 2 FROM connector_work_item WHERE event_id = ANY(%s) AND state = 'succeeded'",
            ([held_a, held_b],),
        ),
        what="the held members run after the replayed head",
    )
    await rig.stop(wi)
    effects = await rig.effects()
    assert [len(effects[(e, "sync")]) for e in (held_a, held_b, free)] == [1, 1, 1]
    assert effects[(free, "sync")] == [(False, True)]
