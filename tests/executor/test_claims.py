"""The claim-path statements against a real database: CAS claim, claim authority (fail closed),
fencing of every transition, reclaim re-checks, lanes, and concurrent claimers/reclaimers."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from connector.common.store import work_items
from tests.executor import seed

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}


def _row(db: psycopg.Connection, work_id: int) -> dict:
    cur = db.execute(
        """SELECT state, lease_token, lease_owner, attempts, failure_class, failure_summary, outcome,
                  extract(epoch FROM lease_until - clock_timestamp()) AS lease_left,
                  extract(epoch FROM run_after - clock_timestamp()) AS due_in
           FROM connector_work_item WHERE work_id = %s""",
        (work_id,),
    )
    names = [d.name for d in cur.description]
    return dict(zip(names, cur.fetchone(), strict=True))


async def _claim(adb, pack: int, n: int = 10, owner: str = "me", lease_s: float = 30.0, qc: str = "default"):
    return await work_items.claim.work_item_claim_batch(adb, [pack], [qc], [n], owner=owner, lease_s=lease_s)


async def test_claim_sets_lease_from_database_clock_and_bumps_token(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    ids = seed.seed_items(db, pack, 3)
    rows = await _claim(adb, pack, 2, lease_s=30)
    assert [r[0] for r in rows] == ids[:2]  # due order
    for r in rows:
        assert r[1] == 1 and r[7] == 1  # token 0 -> 1, attempts 0 -> 1
        got = _row(db, r[0])
        assert got["state"] == "processing" and got["lease_owner"] == "me"
        assert 29 < float(got["lease_left"]) <= 30
    assert _row(db, ids[2])["state"] == "pending"


async def test_claim_fails_closed_without_work_item_authority(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT, authority=False)
    seed.seed_items(db, pack, 3)
    assert await _claim(adb, pack) == []  # no authority row at all
    db.execute(
        """INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase)
           VALUES (%s, 1, 'legacy_event', 'legacy_active')""",
        (pack,),
    )
    assert await _claim(adb, pack) == []  # the legacy Event path owns it
    seed.grant_authority(db, pack)
    assert len(await _claim(adb, pack)) == 3
    other = seed.seed_pack(db, "q", WT)
    seed.seed_items(db, other, 2)
    seed.revoke_authority(db, other)  # quiescing: nobody may start claims
    assert await _claim(adb, other) == []


async def test_authority_is_per_generation_and_unclaimable_rows_do_not_fill_the_window(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT, generation=1, authority=False)  # gen 1: not WorkItem-owned
    db.execute(
        """INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,
             manifest_sha256) SELECT installed_pack_id, 2, 'active', manifest, manifest_sha256
           FROM connector_pack_generation WHERE installed_pack_id = %s AND generation = 1""",
        (pack,),
    )
    seed.grant_authority(db, pack, 2)
    old = seed.seed_items(db, pack, 50, generation=1)  # ahead in due order
    new = seed.seed_items(db, pack, 5, generation=2)
    rows = await _claim(adb, pack, 5)
    assert sorted(r[0] for r in rows) == new
    assert all(_row(db, i)["state"] == "pending" for i in old[:3])


async def test_authority_change_waits_for_claims_in_flight(db, db_url) -> None:
    """The claim statement locks its authority rows FOR SHARE: an authority transition waits for
    the claiming transaction, and every claim after the transition fails closed."""
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 4)
    claimer = await psycopg.AsyncConnection.connect(db_url)  # not autocommit: hold the transaction
    admin = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    try:
        rows = await work_items.claim.work_item_claim_batch(
            claimer, [pack], ["default"], [2], owner="a", lease_s=30
        )
        assert len(rows) == 2
        revoke = asyncio.create_task(
            admin.execute(
                "UPDATE connector_claim_authority SET claim_path = 'none', phase = 'quiescing' "
                "WHERE installed_pack_id = %s",
                (pack,),
            )
        )
        await asyncio.sleep(0.3)
        assert not revoke.done()  # blocked behind the claim transaction
        await claimer.commit()
        await asyncio.wait_for(revoke, 5)
        assert (
            await work_items.claim.work_item_claim_batch(
                claimer, [pack], ["default"], [2], owner="a", lease_s=30
            )
            == []
        )
        await claimer.commit()
    finally:
        await claimer.close()
        await admin.close()


async def test_every_transition_is_fenced_by_the_token(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    a, b, c, d = seed.seed_items(db, pack, 4)
    rows = await _claim(adb, pack, 4)
    tok = {r[0]: r[1] for r in rows}
    stale = {k: v - 1 for k, v in tok.items()}
    # Wrong tokens: nothing moves.
    assert await work_items.finalize.work_item_renew_lease_batch(adb, [a], [stale[a]], lease_s=60) == set()
    assert await work_items.finalize.work_item_complete_batch(adb, [a], [stale[a]]) == []
    assert await work_items.finalize.work_item_retry_batch(adb, [b], [stale[b]], [0.0], ["x"], ["y"]) == []
    assert await work_items.finalize.work_item_dead_batch(adb, [c], [stale[c]], ["x"], ["y"]) == []
    assert await work_items.finalize.work_item_release_batch(adb, [d], [stale[d]], [True]) == []
    assert {_row(db, i)["state"] for i in (a, b, c, d)} == {"processing"}
    # Right tokens.
    assert await work_items.finalize.work_item_renew_lease_batch(adb, [a], [tok[a]], lease_s=60) == {a}
    assert float(_row(db, a)["lease_left"]) > 59
    assert await work_items.finalize.work_item_complete_batch(adb, [a], [tok[a]]) == [a]
    assert await work_items.finalize.work_item_retry_batch(
        adb, [b], [tok[b]], [120.0], ["upstream"], ["boom"]
    ) == [(b, "retry")]
    assert await work_items.finalize.work_item_dead_batch(adb, [c], [tok[c]], ["validation"], ["bad"]) == [
        (c, "dead")
    ]
    assert await work_items.finalize.work_item_release_batch(adb, [d], [tok[d]], [True]) == [(d, "pending")]
    ra, rb, rc, rd = (_row(db, i) for i in (a, b, c, d))
    assert ra["state"] == "succeeded" and ra["lease_owner"] is None and ra["outcome"] == "succeeded"
    assert rb["state"] == "retry" and 119 < float(rb["due_in"]) <= 120 and rb["failure_class"] == "upstream"
    assert rc["state"] == "dead" and rc["outcome"] == "failed" and rc["failure_summary"] == "bad"
    assert rd["state"] == "pending" and rd["attempts"] == 0  # an unstarted release gives the attempt back
    # A finished row is never touched again by its old holder.
    assert await work_items.finalize.work_item_complete_batch(adb, [a, c], [tok[a], tok[c]]) == []


async def test_batched_fencing_matches_each_row_to_its_own_token(db, adb) -> None:
    """Renew and complete look each row's token up by its position in the (sorted) id array: in a
    batch of 40 whose tokens all differ, passed in shuffled order with every other token stale, exactly
    the rows with their current token move. (Passed unsorted to the statement, the binary search
    would match rows to other rows' tokens: this test fails then.)"""
    import random

    pack = seed.seed_pack(db, "p", WT)
    ids = seed.seed_items(db, pack, 40)
    # Distinct tokens: item i has been claimed (i % 7) + 1 times.
    db.execute(
        "UPDATE connector_work_item SET lease_token = (work_id - %s) %% 7 WHERE work_id = ANY(%s)",
        (ids[0], ids),
    )
    tok = {r[0]: r[1] for r in await _claim(adb, pack, 40)}
    assert len(set(tok.values())) == 7
    rnd = random.Random(7)
    order = ids[:]
    rnd.shuffle(order)
    fresh = set(order[::2])
    given = [tok[i] if i in fresh else tok[i] + 1 for i in order]
    assert await work_items.finalize.work_item_renew_lease_batch(adb, order, given, lease_s=60) == fresh
    done = await work_items.finalize.work_item_complete_batch(adb, order, given)
    assert sorted(done) == sorted(fresh)
    states = dict(
        db.execute("SELECT work_id, state FROM connector_work_item WHERE work_id = ANY(%s)", (ids,))
    )
    assert {i for i, st in states.items() if st == "succeeded"} == fresh
    assert {i for i, st in states.items() if st == "processing"} == set(ids) - fresh


async def test_retry_with_exhausted_attempts_is_dead(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    (i,) = seed.seed_items(db, pack, 1, max_attempts=2)
    for attempt in (1, 2):
        (row,) = await _claim(adb, pack)
        assert row[7] == attempt
        states = await work_items.finalize.work_item_retry_batch(
            adb, [i], [row[1]], [0.0], ["flaky"], ["try again"]
        )
    assert states == [(i, "dead")]
    got = _row(db, i)
    assert got["failure_class"] == "flaky" and got["failure_summary"].startswith("gave up after 2 attempts")


async def test_token_strictly_increases_across_claims_and_reclaims(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    (i,) = seed.seed_items(db, pack, 1)
    seen = []
    for _ in range(4):
        (row,) = await _claim(adb, pack, lease_s=0.05)
        seen.append(row[1])
        await asyncio.sleep(0.06)
        assert [r.work_id for r in await work_items.finalize.work_item_reclaim_expired(adb)] == [i]
    assert seen == sorted(set(seen)) and len(seen) == 4


async def test_reclaim_rechecks_state_and_expiry(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    fresh, expired, done = seed.seed_items(db, pack, 3, max_attempts=1)
    rows = {r[0]: r for r in await _claim(adb, pack, 3, lease_s=30)}
    db.execute(
        "UPDATE connector_work_item SET lease_until = clock_timestamp() - interval '1 s' "
        "WHERE work_id = ANY(%s)",
        ([expired, done],),
    )
    assert await work_items.finalize.work_item_complete_batch(adb, [done], [rows[done][1]]) == [done]
    got = await work_items.finalize.work_item_reclaim_expired(adb)
    assert [(r.work_id, r.state) for r in got] == [(expired, "dead")]  # attempts exhausted (1 of 1)
    assert _row(db, fresh)["state"] == "processing"
    assert _row(db, expired)["failure_class"] == "lease_expired"
    # The old holder of the reclaimed item is fenced.
    assert await work_items.finalize.work_item_complete_batch(adb, [expired], [rows[expired][1]]) == []


async def test_reclaim_update_rechecks_expiry_and_token_itself(db, adb) -> None:
    """The candidate read and the update are separate: a lease renewed (or an item finished and
    re-claimed) after the read must not be reclaimed by the update."""
    pack = seed.seed_pack(db, "p", WT)
    (i,) = seed.seed_items(db, pack, 1)
    (row,) = await _claim(adb, pack, lease_s=30)  # a live lease, as if renewed after the read
    params = {"ids": [i], "tokens": [row[1]], "packs": [pack]}
    assert await (await adb.execute(work_items.finalize.WORK_ITEM_RECLAIM_EXPIRED, params)).fetchall() == []
    db.execute("UPDATE connector_work_item SET lease_until = clock_timestamp() - interval '1 s'")
    stale = {**params, "tokens": [row[1] - 1]}  # the read saw an older lease of this row
    assert await (await adb.execute(work_items.finalize.WORK_ITEM_RECLAIM_EXPIRED, stale)).fetchall() == []
    assert (
        len(await (await adb.execute(work_items.finalize.WORK_ITEM_RECLAIM_EXPIRED, params)).fetchall()) == 1
    )


async def test_reclaim_race_has_exactly_one_winner(db, db_url) -> None:
    pack = seed.seed_pack(db, "p", WT)
    conns = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(12)]
    try:
        for _round in range(10):
            (i,) = seed.seed_items(db, pack, 1)
            (row,) = await work_items.claim.work_item_claim_batch(
                conns[0], [pack], ["default"], [1], owner="dead", lease_s=30
            )
            db.execute(
                "UPDATE connector_work_item SET lease_until = clock_timestamp() - interval '1 s' "
                "WHERE work_id = %s",
                (i,),
            )
            results = await asyncio.gather(*(work_items.finalize.work_item_reclaim_expired(c) for c in conns))
            winners = [r for rs in results for r in rs if r.work_id == i]
            assert len(winners) == 1, winners
            assert _row(db, i)["state"] == "retry"
            # Clean up so the next round's item is the only expired one.
            (again,) = await work_items.claim.work_item_claim_batch(
                conns[0], [pack], ["default"], [1], owner="x", lease_s=30
            )
            assert again[1] == row[1] + 1
            await work_items.finalize.work_item_complete_batch(conns[0], [i], [again[1]])
    finally:
        for c in conns:
            await c.close()


async def test_concurrent_claimers_never_share_a_row(db, db_url) -> None:
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 2000)
    conns = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(8)]
    claimed: list[int] = []

    async def claimer(conn) -> None:
        while True:
            rows = await work_items.claim.work_item_claim_batch(
                conn, [pack], ["default"], [37], owner="c", lease_s=30
            )
            if not rows:
                return
            claimed.extend(r[0] for r in rows)
            await work_items.finalize.work_item_complete_batch(
                conn, sorted(r[0] for r in rows), [r[1] for r in sorted(rows)]
            )

    try:
        await asyncio.gather(*(claimer(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert len(claimed) == 2000 and len(set(claimed)) == 2000
    assert (
        db.execute("SELECT count(*) FROM connector_work_item WHERE state = 'succeeded'").fetchone()[0] == 2000
    )


async def test_groups_get_their_own_limits(db, adb) -> None:
    a = seed.seed_pack(db, "a", WT)
    b = seed.seed_pack(db, "b", {"w": seed.python_work_type("x:y", queue_class="bulk")})
    seed.seed_items(db, a, 10)
    seed.seed_items(db, b, 10, queue_class="bulk")
    rows = await work_items.claim.work_item_claim_batch(
        adb, [a, b], ["default", "bulk"], [3, 5], owner="o", lease_s=30
    )
    by = {}
    for r in rows:
        by[(r[2], r[4])] = by.get((r[2], r[4]), 0) + 1
    assert by == {(a, "default"): 3, (b, "bulk"): 5}
    groups = await work_items.claim.work_item_ready_groups(adb)
    assert {(g[0], g[1]) for g in groups} == {(a, "default"), (b, "bulk")}
    assert all(g[2] <= 0 for g in groups)


@pytest.mark.parametrize("dead_blocks", [True, False])
async def test_lane_members_finalize_under_lane_locks_and_settle(db, adb, dead_blocks) -> None:
    pack = seed.seed_pack(db, "p", WT)
    a, b, c = seed.seed_items(db, pack, 3, source_lanes=["L", "L", "L"], dead_blocks_lane=dead_blocks)
    assert [_row(db, i)["state"] for i in (a, b, c)] == ["pending", "blocked", "blocked"]
    (row,) = await _claim(adb, pack, 5)
    assert row[0] == a and row[9] == "L"
    fail = work_items.finalize.FailBatch()
    fail.add(a, row[1], "r", delay=0.0, failure_class="x", summary="y")
    res = await work_items.finalize.work_item_finalize(adb, [], [], fail, [(pack, "s", "L")])
    assert res.transitions == [(a, "retry")] and res.promoted == 0  # a retrying head keeps its lane
    assert [_row(db, i)["state"] for i in (a, b)] == ["retry", "blocked"]
    (row,) = await _claim(adb, pack, 5)
    fail = work_items.finalize.FailBatch()
    fail.add(a, row[1], "d", failure_class="x", summary="y")
    res = await work_items.finalize.work_item_finalize(adb, [], [], fail, [(pack, "s", "L")])
    assert _row(db, b)["state"] == ("blocked" if dead_blocks else "pending")
    assert res.promoted == (0 if dead_blocks else 1)


async def test_reclaimed_lane_head_keeps_its_lane(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    a, b = seed.seed_items(db, pack, 2, target_lanes=["T", "T"])
    (row,) = await _claim(adb, pack, 5, lease_s=0.05)
    await asyncio.sleep(0.06)
    (r,) = await work_items.finalize.work_item_reclaim_expired(adb)
    assert (r.work_id, r.state) == (a, "retry")
    assert [_row(db, i)["state"] for i in (a, b)] == ["retry", "blocked"]
    (row,) = await _claim(adb, pack, 5)
    res = await work_items.finalize.work_item_finalize(
        adb, [a], [row[1]], work_items.finalize.FailBatch(), [(pack, "t", "T")]
    )
    assert res.completed == [a] and res.promoted == 1
    assert _row(db, b)["state"] == "pending"
