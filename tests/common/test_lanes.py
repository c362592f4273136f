"""Lane membership rules in the database: one runnable member per lane, promotion, dead heads,
late (out-of-order) members, two-lane items, and the repair check."""

from __future__ import annotations

import psycopg

from connector.common.store.lanes import (
    lane_lock_batch,
    lane_repair,
    lane_settle_batch,
    lanes_change,
    lanes_of,
)

PACK = 1


async def _event(conn: psycopg.AsyncConnection, seq: int) -> int:
    cur = await conn.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
             received_at, payload_sha256, body, verification)
           VALUES ('ns', 'r', %s, 'POST', now(), '\\x00', '\\x7b7d', 'none') RETURNING receipt_id""",
        (f"k{seq}-{id(conn)}",),
    )
    receipt_id = (await cur.fetchone())[0]
    cur = await conn.execute(
        """INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id,
             route_version, namespace, idempotency_key, delivery_seq, payload_sha256, parse_outcome)
           VALUES (%s, 1, 1, 1, 1, 1, 'ns', %s, %s, '\\x00', 'ok') RETURNING event_id""",
        (receipt_id, f"k{seq}", seq),
    )
    return (await cur.fetchone())[0]


async def _member(
    conn: psycopg.AsyncConnection,
    seq: int,
    source: str | None = None,
    target: str | None = None,
    *,
    dead_blocks: bool = True,
    demote: bool = False,
) -> int:
    """Materialize one member the way the materializer does: lock, insert blocked, settle."""
    event_id = await _event(conn, seq)
    async with conn.transaction():
        locked = await lane_lock_batch(conn, lanes_of(PACK, source, target))
        cur = await conn.execute(
            """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, state,
                 delivery_seq, source_lane_key, target_mutation_lane_key, dead_blocks_lane)
               VALUES (%s, %s, 1, 'w', 'blocked', %s, %s, %s, %s) RETURNING work_id""",
            (event_id, PACK, seq, source, target, dead_blocks),
        )
        work_id = (await cur.fetchone())[0]
        await lane_settle_batch(conn, locked, demote=demote)
    return work_id


async def _states(conn: psycopg.AsyncConnection, *ids: int) -> list[str]:
    cur = await conn.execute(
        "SELECT state FROM connector_work_item WHERE work_id = ANY(%s) ORDER BY array_position(%s, work_id)",
        (list(ids), list(ids)),
    )
    return [r[0] for r in await cur.fetchall()]


async def _finish(conn: psycopg.AsyncConnection, work_id: int, state: str = "succeeded") -> None:
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT installed_pack_id, source_lane_key, target_mutation_lane_key FROM connector_work_item"
            " WHERE work_id = %s",
            (work_id,),
        )
        pack, s, t = await cur.fetchone()
        locked = await lane_lock_batch(conn, lanes_of(pack, s, t))
        await conn.execute("UPDATE connector_work_item SET state = %s WHERE work_id = %s", (state, work_id))
        await lane_settle_batch(conn, locked)


async def test_source_lane_has_one_runnable_member_in_delivery_order(adb) -> None:
    a = await _member(adb, 1, "L")
    b = await _member(adb, 2, "L")
    c = await _member(adb, 3, "L")
    other = await _member(adb, 4, "M")
    assert await _states(adb, a, b, c, other) == ["pending", "blocked", "blocked", "pending"]
    await _finish(adb, a)
    assert await _states(adb, b, c) == ["pending", "blocked"]
    await _finish(adb, b)
    assert await _states(adb, c) == ["pending"]


async def test_processing_member_keeps_lane_busy(adb) -> None:
    a = await _member(adb, 1, None, "T")
    await adb.execute(
        "UPDATE connector_work_item SET state='processing', lease_owner='x', lease_until=now()"
        " WHERE work_id=%s",
        (a,),
    )
    b = await _member(adb, 2, None, "T")
    assert await _states(adb, a, b) == ["processing", "blocked"]


async def test_two_lane_item_waits_for_both_lanes(adb) -> None:
    a = await _member(adb, 1, "S1", "T")
    b = await _member(adb, 2, "S2", "T")  # first in S2 but second in T
    c = await _member(adb, 3, "S2", None)  # behind b in S2
    assert await _states(adb, a, b, c) == ["pending", "blocked", "blocked"]
    await _finish(adb, a)
    assert await _states(adb, b, c) == ["pending", "blocked"]
    await _finish(adb, b)
    assert await _states(adb, c) == ["pending"]


async def test_dead_head_blocks_or_continues_by_policy(adb) -> None:
    a = await _member(adb, 1, "B", dead_blocks=True)
    b = await _member(adb, 2, "B")
    await _finish(adb, a, "dead")
    assert await _states(adb, b) == ["blocked"]

    c = await _member(adb, 3, "C", dead_blocks=False)
    d = await _member(adb, 4, "C")
    await _finish(adb, c, "dead")
    assert await _states(adb, d) == ["pending"]


async def test_late_earlier_delivery_takes_the_lane_back(adb) -> None:
    later = await _member(adb, 10, "L")
    assert await _states(adb, later) == ["pending"]
    earlier = await _member(adb, 5, "L", demote=True)
    assert await _states(adb, earlier, later) == ["pending", "blocked"]
    await _finish(adb, earlier)
    assert await _states(adb, later) == ["pending"]


async def test_repair_finds_nothing_when_healthy_and_fixes_a_lost_promotion(adb) -> None:
    a = await _member(adb, 1, "L")
    b = await _member(adb, 2, "L")
    assert (await lane_repair(adb)).promoted == 0
    # Simulate a lost wake-up: the head finished without settling its lane.
    await adb.execute("UPDATE connector_work_item SET state='succeeded' WHERE work_id=%s", (a,))
    assert await _states(adb, b) == ["blocked"]
    assert (await lane_repair(adb)).promoted == 1
    assert await _states(adb, b) == ["pending"]


async def test_lock_set_includes_neighbour_lanes(adb) -> None:
    await _member(adb, 1, "S1", "T")
    async with adb.transaction():
        locked, _ = await lanes_change(adb, [(PACK, "s", "S1")])
    assert (PACK, "t", "T") in locked and (PACK, "s", "S1") in locked


async def _inverted(
    conn: psycopg.AsyncConnection, lane: str, token: int = 7, base: int = 0
) -> tuple[int, int]:
    """A lane whose processing member is not its head: a later member started (lease ``token``),
    then an earlier delivery materialized late (blocked, first holding member). (later, earlier)."""
    later = await _member(conn, base + 10, lane)
    await conn.execute(
        "UPDATE connector_work_item SET state='processing', lease_owner='x', lease_token=%s,"
        " lease_until=now() + interval '1 hour' WHERE work_id=%s",
        (token, later),
    )
    earlier = await _member(conn, base + 5, lane)
    assert await _states(conn, later, earlier) == ["processing", "blocked"]
    return later, earlier


async def test_idle_lanes_skip_the_busy_probe_and_only_they(adb) -> None:
    # The probe is what keeps an inverted lane's head blocked; ``idle`` (a lane whose processing
    # member the transaction itself moved out) skips it for the lanes named and no other.
    _, e_l = await _inverted(adb, "L")
    _, e_m = await _inverted(adb, "M", base=100)
    lanes = [(PACK, "s", "L"), (PACK, "s", "M")]
    async with adb.transaction():
        locked = await lane_lock_batch(adb, lanes)
        assert (await lane_settle_batch(adb, locked)).promoted == 0
    assert await _states(adb, e_l, e_m) == ["blocked", "blocked"]
    async with adb.transaction():  # control: the flag is what skips the probe (a lie promotes)
        locked = await lane_lock_batch(adb, lanes)
        assert (await lane_settle_batch(adb, locked, idle={(PACK, "s", "L")})).promoted == 1
    assert await _states(adb, e_l, e_m) == ["pending", "blocked"]


async def test_finalize_marks_idle_only_the_lanes_a_member_really_left(adb) -> None:
    # A stale completion (another lease token) left nothing: its lane keeps the probe and the late
    # earlier member stays blocked; the holder's own completion frees the lane.
    from connector.common.store.work_items.finalize import FailBatch, work_item_finalize

    later, earlier = await _inverted(adb, "L", token=7)
    lane = (PACK, "s", "L")
    res = await work_item_finalize(adb, [later], [6], FailBatch(), [lane], member_lanes={later: [lane]})
    assert res.complete_stale == 1 and res.promoted == 0
    assert await _states(adb, later, earlier) == ["processing", "blocked"]
    res = await work_item_finalize(adb, [later], [7], FailBatch(), [lane], member_lanes={later: [lane]})
    assert res.completed == [later] and res.promoted == 1
    assert await _states(adb, later, earlier) == ["succeeded", "pending"]
