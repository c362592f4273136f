"""Debounce (docs/packs.md#debounce, docs/executor.md#debounce) against a real database, through the
materializer's own insert (``materialization.materialize``) and the real claim statement: a burst
becomes one execution of its newest item and the older ones end ``coalesced`` into it; items that
arrive while an execution runs form the next one; a retry of an overtaken execution is coalesced
into the newer one instead of running again; ``max_wait_s`` bounds a continuous stream; a key row
held by another transaction leaves its candidates alone; and an undebounced pack is untouched.

The real-process proof is ``tests/executor/test_debounce_processes.py``."""

from __future__ import annotations

import asyncio
import time

import psycopg

from connector.common.store import debounce, work_items
from connector.common.store.work_items.finalize import FailBatch, FailOp
from tests.executor import seed

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}
PARKED = "9999-01-01 00:00:00+00"


async def _claim(adb, pack: int, n: int = 50, held: dict | None = None, debounced: dict | None = None):
    return await work_items.claim.work_item_claim_batch(
        adb, [pack], ["default"], [n], owner="me", lease_s=30, held_back=held, debounced=debounced
    )


def _states(db: psycopg.Connection) -> dict[int, tuple[str, int | None]]:
    rows = db.execute(
        "SELECT work_id, state, covered_by FROM connector_work_item ORDER BY work_id"
    ).fetchall()
    return {int(r[0]): (str(r[1]), r[2]) for r in rows}


def _live(db: psycopg.Connection) -> list[int]:
    """Waiting debounced items that are not parked."""
    return [
        int(r[0])
        for r in db.execute(
            "SELECT work_id FROM connector_work_item WHERE state IN ('pending', 'retry')"
            f" AND run_after <> '{PARKED}' ORDER BY work_id"
        ).fetchall()
    ]


async def _wait_due(db: psycopg.Connection, work_id: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while db.execute(
        "SELECT run_after > now() FROM connector_work_item WHERE work_id = %s", (work_id,)
    ).fetchone()[0]:
        assert time.monotonic() < deadline, f"{work_id} never became due"
        await asyncio.sleep(0.02)


async def _complete(adb, rows) -> None:
    ids = sorted(r[0] for r in rows)
    tok = {r[0]: r[1] for r in rows}
    await work_items.finalize.work_item_finalize(adb, ids, [tok[i] for i in ids], FailBatch())


async def test_a_burst_is_one_execution_of_its_newest_item(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    # Two materializer batches for key a (3 + 2 items), one for b; a plain item beside them.
    a = await seed.seed_debounced(adb, pack, ["a"] * 3, window_s=2.0)
    b = await seed.seed_debounced(adb, pack, ["b"], window_s=2.0)
    a += await seed.seed_debounced(adb, pack, ["a"] * 2, window_s=2.0)
    plain = await seed.seed_debounced(adb, pack, [None], window_s=2.0)
    assert _live(db) == sorted([a[-1], b[0], plain[0]])  # only each key's newest is live
    # Before the window passed only the plain item runs.
    first = await _claim(adb, pack)
    assert [r[0] for r in first] == plain
    await _wait_due(db, a[-1])
    await _wait_due(db, b[0])
    held: dict = {}
    rows = await _claim(adb, pack, held=held)
    assert sorted(r[0] for r in rows) == sorted([a[-1], b[0]])
    assert held == {}  # the older members of a were parked, never candidates
    states = _states(db)
    assert all(states[w] == ("coalesced", a[-1]) for w in a[:-1])
    covered = await debounce.debounce_covered_batch(adb, [a[-1], b[0]])
    assert [w for w, _ in covered[a[-1]]] == a[:-1] and b[0] not in covered
    last = db.execute("SELECT debounce_key, last_claimed_id FROM connector_debounce ORDER BY 1").fetchall()
    assert last == [("a", a[-1]), ("b", b[0])]


async def test_items_arriving_while_it_runs_form_the_next_execution(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    x = await seed.seed_debounced(adb, pack, ["k"], window_s=0.2)
    await _wait_due(db, x[0])
    running = await _claim(adb, pack)
    assert [r[0] for r in running] == x
    later = await seed.seed_debounced(adb, pack, ["k"] * 3, window_s=0.2)
    await _wait_due(db, later[-1])
    nxt = await _claim(adb, pack)
    assert [r[0] for r in nxt] == [later[-1]]
    states = _states(db)
    assert states[x[0]] == ("processing", None)  # not coalesced: its execution had started
    assert all(states[w] == ("coalesced", later[-1]) for w in later[:-1])
    await _complete(adb, running + nxt)
    assert _states(db)[x[0]][0] == "succeeded"


async def test_a_retry_behind_a_newer_item_is_covered_by_it(db, adb) -> None:
    """X runs; N arrives; X fails and is due again before N: X is parked (not run: N is newer),
    and N's claim covers it."""
    pack = seed.seed_pack(db, "p", WT)
    x = await seed.seed_debounced(adb, pack, ["k"], window_s=0.2)
    await _wait_due(db, x[0])
    (xr,) = await _claim(adb, pack)
    n = await seed.seed_debounced(adb, pack, ["k"], window_s=2.5)  # not due by the next claim
    fail = FailBatch()
    fail.add(xr[0], xr[1], FailOp.RETRY, delay=0.0, failure_class="x", summary="y")
    await work_items.finalize.work_item_finalize(adb, [], [], fail)
    held: dict = {}
    debounced: dict = {}
    assert await _claim(adb, pack, held=held, debounced=debounced) == []
    assert held == debounced == {(pack, "default"): 1}
    assert (
        db.execute("SELECT run_after FROM connector_work_item WHERE work_id = %s", (x[0],)).fetchone()[0].year
        == 9999
    )
    await _wait_due(db, n[0])
    rows = await _claim(adb, pack)
    assert [r[0] for r in rows] == n
    assert _states(db)[x[0]] == ("coalesced", n[0])
    outcome = db.execute("SELECT outcome FROM connector_work_item WHERE work_id = %s", (x[0],)).fetchone()[0]
    assert outcome == "coalesced"  # covered at N's claim: N's handler lists it


async def test_a_retry_overtaken_by_a_newer_execution_is_not_run_again(db, adb) -> None:
    """X runs; N arrives and runs too (X still running); X fails: running X again now would apply
    an older event after N's — it is coalesced into N (which started after X was created)."""
    pack = seed.seed_pack(db, "p", WT)
    x = await seed.seed_debounced(adb, pack, ["k"], window_s=0.1)
    await _wait_due(db, x[0])
    (xr,) = await _claim(adb, pack)
    n = await seed.seed_debounced(adb, pack, ["k"], window_s=0.1)
    await _wait_due(db, n[0])
    (nr,) = await _claim(adb, pack)
    assert nr[0] == n[0]
    fail = FailBatch()
    fail.add(xr[0], xr[1], FailOp.RETRY, delay=0.0, failure_class="x", summary="y")
    await work_items.finalize.work_item_finalize(adb, [], [], fail)
    assert await _claim(adb, pack) == []
    assert _states(db)[x[0]] == ("coalesced", n[0])
    outcome = db.execute("SELECT outcome FROM connector_work_item WHERE work_id = %s", (x[0],)).fetchone()[0]
    assert outcome == "overtaken"  # N's handler, already running, was not told
    # N's own retry runs again: it is the newest.
    fail = FailBatch()
    fail.add(nr[0], nr[1], FailOp.RETRY, delay=0.0, failure_class="x", summary="y")
    await work_items.finalize.work_item_finalize(adb, [], [], fail)
    again = await _claim(adb, pack)
    assert [r[0] for r in again] == n


async def test_max_wait_bounds_a_continuous_stream(db, adb) -> None:
    """Items keep arriving faster than the window: each new newest is due at ``least(its creation +
    window_s, the oldest waiting item's creation + max_wait_s)`` (database times; never before its
    own creation), so the stream runs by the bound — and once it ran, the next burst starts its own
    bound. The checks read the database's times, not this test's speed."""
    pack = seed.seed_pack(db, "p", WT)
    ids: list[int] = []
    claimed: list[int] = []
    t0 = time.monotonic()
    while not claimed:
        assert time.monotonic() - t0 < 20, "the stream never executed"
        ids += await seed.seed_debounced(adb, pack, ["k"], window_s=0.5, max_wait_s=1.0)
        due, expected = db.execute(
            """SELECT w.run_after,
                      greatest(w.created_at,
                               least(w.created_at + interval '0.5 s', f.created_at + interval '1 s'))
               FROM connector_work_item w, connector_work_item f
               WHERE w.work_id = %s AND f.work_id = %s""",
            (ids[-1], ids[0]),
        ).fetchone()
        assert due == expected  # (never before its own creation)
        claimed = [r[0] for r in await _claim(adb, pack)]
        await asyncio.sleep(0.05)
    assert claimed[0] in ids[-2:]  # the newest when it came due (one may have arrived since)
    states = _states(db)
    assert all(states[w][0] == "coalesced" for w in ids if w < claimed[0])
    # The next burst: its first item's bound counts from its own creation.
    nxt = await seed.seed_debounced(adb, pack, ["k"], window_s=0.5, max_wait_s=1.0)
    due, created = db.execute(
        "SELECT run_after, created_at FROM connector_work_item WHERE work_id = %s", (nxt[0],)
    ).fetchone()
    assert (due - created).total_seconds() == 0.5


async def test_a_key_row_held_elsewhere_leaves_its_candidates_alone(db, db_url, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    k = await seed.seed_debounced(adb, pack, ["k"] * 2, window_s=0.05)
    other = await seed.seed_debounced(adb, pack, ["o"], window_s=0.05)
    await _wait_due(db, k[-1])
    await _wait_due(db, other[0])
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM connector_debounce WHERE debounce_key = 'k' FOR UPDATE")
        held: dict = {}
        rows = await _claim(adb, pack, held=held)
        assert [r[0] for r in rows] == other  # never waited
        assert held == {(pack, "default"): 1}
        assert _states(db)[k[0]] == ("pending", None)
        holder.rollback()
    rows = await _claim(adb, pack)
    assert [r[0] for r in rows] == [k[-1]]


async def test_undebounced_items_are_untouched(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    ids = await seed.seed_debounced(adb, pack, [None] * 20, window_s=1.0)
    rows = await _claim(adb, pack)
    assert sorted(r[0] for r in rows) == ids
    assert db.execute("SELECT count(*) FROM connector_debounce").fetchone()[0] == 0


async def test_cancelling_the_live_item_makes_the_next_newest_live(db, adb) -> None:
    """An operator cancels a key's live newest item: the parked ones behind it would wait for an
    execution that never comes, so the newest of them becomes live; its execution covers the rest.
    Control: without the debounce argument the parked items stay parked."""
    pack = seed.seed_pack(db, "p", WT)
    ids = await seed.seed_debounced(adb, pack, ["k"] * 3, window_s=0.05)
    token = db.execute(
        "SELECT lease_token FROM connector_work_item WHERE work_id = %s", (ids[-1],)
    ).fetchone()[0]
    async with adb.transaction():
        done, _ = await work_items.admin.work_item_cancel(
            adb, ids[-1], token, [], summary="x", debounce=(pack, "w", "k")
        )
    assert done and _live(db) == [ids[1]]
    await _wait_due(db, ids[1])
    rows = await _claim(adb, pack)
    assert [r[0] for r in rows] == [ids[1]] and _states(db)[ids[0]] == ("coalesced", ids[1])
    # Control.
    more = await seed.seed_debounced(adb, pack, ["j"] * 2, window_s=0.05)
    async with adb.transaction():
        await work_items.admin.work_item_cancel(adb, more[-1], 0, [], summary="x")
    assert more[0] not in _live(db)


async def test_what_a_failed_execution_covered_goes_with_it_into_the_next(db, adb) -> None:
    """X covers a1, a2 and fails; N arrives and covers X: N's execution lists a1, a2 and X (the
    covered read follows ``covered_by`` through items that ran themselves)."""
    pack = seed.seed_pack(db, "p", WT)
    ids = await seed.seed_debounced(adb, pack, ["k"] * 3, window_s=0.05)
    a, x = ids[:2], ids[2]
    await _wait_due(db, x)
    (xr,) = await _claim(adb, pack)
    assert [w for w, _ in (await debounce.debounce_covered_batch(adb, [x]))[x]] == a
    fail = FailBatch()
    fail.add(xr[0], xr[1], FailOp.RETRY, delay=30.0, failure_class="x", summary="y")
    await work_items.finalize.work_item_finalize(adb, [], [], fail)
    n = await seed.seed_debounced(adb, pack, ["k"], window_s=0.05)
    await _wait_due(db, n[0])
    assert [r[0] for r in await _claim(adb, pack)] == n
    covered = await debounce.debounce_covered_batch(adb, n)
    assert [w for w, _ in covered[n[0]]] == [*a, x]


async def test_sampler_gauge_per_pack_and_work_type(db, adb) -> None:
    """Live (a key's newest) and parked items per pack and work type, never by key."""
    from connector.executor import metrics as m
    from connector.executor.work import stats_sampler

    pack = seed.seed_pack(db, "p", WT)
    await seed.seed_debounced(adb, pack, ["a", "a", "a", "b", "b", "c"], window_s=30.0)
    await stats_sampler.sample_once(adb, 1.0)

    def gauge(state: str) -> float | None:
        return m.REGISTRY.get_sample_value(
            "connector_executor_debounce_items", {"pack": "p", "work_type": "w", "state": state}
        )

    assert (gauge("live"), gauge("parked")) == (3, 3)
    labels = {
        tuple(sorted(s.labels))
        for metric in m.REGISTRY.collect()
        if metric.name == "connector_executor_debounce_items"
        for s in metric.samples
    }
    assert labels == {("pack", "state", "work_type")}
