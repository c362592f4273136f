"""Concurrency limits per key (docs/adr/011-rate-limits.md), against a real database: at most N of a
key in flight, the others parked without an attempt, a finishing member waking one, a reclaimed
lease giving its slot back exactly once, concurrent claimers and finalizers never above N, the
slot check (recount + wake), and the combination with a rate limit.

The real-process proof is ``tests/executor/test_concurrency_processes.py``."""

from __future__ import annotations

import asyncio
import random
import time

import psycopg
import pytest

from connector.common.store import flow, work_items
from connector.common.store.vocabulary import PARKED
from connector.common.store.work_items.finalize import FailBatch, FailOp
from tests.executor import seed

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}


async def _claim(
    adb, pack: int, n: int = 10, held: dict | None = None, owner: str = "me", lease_s: float = 30
):
    return await work_items.claim.work_item_claim_batch(
        adb, [pack], ["default"], [n], owner=owner, lease_s=lease_s, held_back=held
    )


def _slots(db: psycopg.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT concurrency_key, in_flight FROM connector_concurrency_limit").fetchall())


def _parked(db: psycopg.Connection) -> int:
    return db.execute(
        "SELECT count(*) FROM connector_work_item WHERE run_after = '9999-01-01 00:00:00+00' AND attempts = 0"
    ).fetchone()[0]


def _slot_of(rows) -> dict[int, tuple[int, str]]:
    key = work_items.claim.CLAIM_COLUMNS.index("concurrency_key")
    return {r[0]: (r[2], r[key]) for r in rows if r[key] is not None}


async def _complete(adb, rows) -> work_items.finalize.FinalizeResult:
    ids = sorted(r[0] for r in rows)
    tok = {r[0]: r[1] for r in rows}
    return await work_items.finalize.work_item_finalize(
        adb, ids, [tok[i] for i in ids], FailBatch(), slots=_slot_of(rows)
    )


async def test_at_most_n_per_key_the_rest_parked_without_an_attempt(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    a = seed.seed_items(db, pack, 5, concurrency_keys=["a"] * 5, concurrency=2)
    b = seed.seed_items(db, pack, 1, concurrency_keys=["b"], concurrency=2)
    free = seed.seed_items(db, pack, 2)
    held: dict = {}
    rows = await _claim(adb, pack, 20, held)
    assert sorted(r[0] for r in rows) == sorted(a[:2] + b + free)
    assert held == {(pack, "default"): 3}
    assert _slots(db) == {"a": 2, "b": 1}
    assert _parked(db) == 3  # a's other three: pending, no attempt, out of the ready order
    assert await _claim(adb, pack, 20) == []  # parked items are not due
    # One of a finishes: its slot comes back and one parked member is woken, then claimable.
    first = next(r for r in rows if r[0] == a[0])
    res = await _complete(adb, [first])
    assert res.completed == [a[0]] and res.woken == 1
    assert _slots(db)["a"] == 1 and _parked(db) == 2
    again = await _claim(adb, pack, 20)
    assert [r[0] for r in again] == [a[2]]  # the oldest parked one
    assert _slots(db)["a"] == 2


async def test_retry_dead_and_release_give_the_slot_back(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 6, concurrency_keys=["k"] * 6, concurrency=3)
    rows = await _claim(adb, pack, 10)
    assert len(rows) == 3 and _slots(db) == {"k": 3}
    fail = FailBatch()
    fail.add(rows[0][0], rows[0][1], FailOp.RETRY, delay=60.0, failure_class="x", summary="y")
    fail.add(rows[1][0], rows[1][1], FailOp.DEAD, failure_class="x", summary="y")
    fail.add(rows[2][0], rows[2][1], FailOp.RELEASE, unstarted=True)
    res = await work_items.finalize.work_item_finalize(adb, [], [], fail, slots=_slot_of(rows))
    assert len(res.transitions) == 3 and res.woken == 3
    assert _slots(db) == {"k": 0} and _parked(db) == 0
    # A stale finalize (wrong token) gives nothing back.
    again = await _claim(adb, pack, 10)
    assert len(again) == 3 and _slots(db) == {"k": 3}
    stale = [(r[0], r[1] - 1, *r[2:]) for r in again]
    res = await _complete(adb, stale)
    assert res.completed == [] and _slots(db) == {"k": 3}


async def test_a_reclaimed_lease_gives_its_slot_back_exactly_once(db, db_url, adb) -> None:
    """Expired leases of one key are reclaimed by 6 concurrent reclaimers while the stale holder
    tries to complete: each item leaves processing once, so the key's count drops by exactly the
    number reclaimed, and the holder's late complete matches nothing and gives nothing back."""
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 8, concurrency_keys=["k"] * 8, concurrency=4)
    rows = await _claim(adb, pack, 10, lease_s=0.2)
    assert len(rows) == 4 and _slots(db) == {"k": 4}
    deadline = time.monotonic() + 10
    while db.execute("SELECT count(*) FROM connector_work_item WHERE lease_until < now()").fetchone()[0] < 4:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    conns = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(6)]
    try:
        got = await asyncio.gather(*(work_items.finalize.work_item_reclaim_expired(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    reclaimed = [r for batch in got for r in batch]
    assert sorted(r.work_id for r in reclaimed) == sorted(r[0] for r in rows)  # each once
    assert _slots(db) == {"k": 0}
    assert _parked(db) == 0  # the four parked ones were woken
    res = await _complete(adb, rows)  # the stale holder, late
    assert res.completed == [] and _slots(db) == {"k": 0}
    assert (await flow.concurrency_check(adb)).recounted == 0


# The wake statement as it was before it waited for a held parked row (the control below).
_WAKE_SKIPPING = flow.SLOTS_WAKE.replace("FOR UPDATE) p))", "FOR UPDATE SKIP LOCKED) p))")


@pytest.mark.parametrize("wake", ["waits", "skips (control)"])
async def test_a_parked_item_locked_by_a_stale_claim_is_still_woken(
    db, db_url, adb, monkeypatch, wake
) -> None:
    """The lost wake-up that stranded a parked item (seen as a drain that never finished under load):
    a claim whose snapshot predates a parking still sees the item due, and its candidate read
    (``FOR UPDATE OF w SKIP LOCKED``) locks the item's newest version, finds it no longer due
    (EvalPlanQual) and leaves it out, *but keeps the row lock* until its statement's transaction
    ends. A finalizer that gives the key's slot back in that window used to skip the locked row
    (``SKIP LOCKED``) and wake nobody: the key had a free slot, the item stayed parked. Here the stale
    claim is held open on purpose (an advisory lock taken after its snapshot, before its row locks);
    the wake now waits for it and wakes the item. Control: the skipping wake strands it."""
    if wake != "waits":
        monkeypatch.setattr(flow, "SLOTS_WAKE", _WAKE_SKIPPING)
    pack = seed.seed_pack(db, "p", WT)
    first, parked = seed.seed_items(db, pack, 2, concurrency_keys=["k", "k"], concurrency=1)
    gate = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    stale = await psycopg.AsyncConnection.connect(db_url)  # a transaction, like the claim statement's
    try:
        await gate.execute("SELECT pg_advisory_lock(4242)")
        # The stale candidate read (of the second item only, so that it holds no other row): its
        # snapshot sees the item due; it then waits on the gate before it locks anything.
        read = asyncio.create_task(
            stale.execute(
                "SELECT w.work_id FROM connector_work_item w WHERE w.work_id = %s"
                " AND w.state IN ('pending', 'retry') AND w.run_after <= now()"
                " AND (SELECT pg_advisory_lock(4242)) IS NOT NULL FOR UPDATE OF w SKIP LOCKED",
                (parked,),
            )
        )
        await _until_waiting(db, stale.info.backend_pid, "advisory")
        rows = await _claim(adb, pack, 10)  # a current claim: runs the first, parks the second
        assert [r[0] for r in rows] == [first] and _parked(db) == 1
        await gate.execute("SELECT pg_advisory_unlock(4242)")
        assert await (await read).fetchall() == []  # not due any more: not returned...
        free = db.execute(
            "SELECT work_id FROM connector_work_item WHERE work_id = %s FOR UPDATE SKIP LOCKED", (parked,)
        ).fetchall()
        assert free == []  # ...yet the parked row stays locked by the stale read's transaction
        done = asyncio.create_task(_complete(adb, rows))
        if wake == "waits":
            await _until_waiting(db, adb.info.backend_pid, "transactionid")
            assert not done.done()
            await stale.rollback()
            res = await done
            assert res.woken == 1 and _parked(db) == 0 and _slots(db) == {"k": 0}
        else:
            res = await done
            assert res.woken == 0 and _parked(db) == 1 and _slots(db) == {"k": 0}  # stranded
            await stale.rollback()
    finally:
        await stale.close()
        await gate.close()


async def _until_waiting(db: psycopg.Connection, pid: int, lock_type: str) -> None:
    """Wait until backend ``pid`` waits for a lock of ``lock_type`` (pg_locks), on state, not time."""
    deadline = time.monotonic() + 60
    while not db.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted AND locktype = %s)",
        (pid, lock_type),
    ).fetchone()[0]:
        assert time.monotonic() < deadline, f"backend {pid} never waited for a {lock_type} lock"
        await asyncio.sleep(0.02)


async def test_concurrent_claimers_and_finalizers_never_exceed_n(db, db_url) -> None:
    """Eight connections claim and complete in a loop over 10 random keys with 2 slots each; a
    sampler reads the processing rows per key the whole time. No snapshot ever shows more than 2 of
    a key in flight, the slot counts end at zero with every item done, and the check recounts
    nothing. Control: the same sampling over an unlimited pack with the same keys (as labels) sees
    more than 2 of a key at once."""
    pack = seed.seed_pack(db, "p", WT)
    rnd = random.Random(9)
    keys = [f"k{rnd.randrange(10)}" for _ in range(800)]
    seed.seed_items(db, pack, 800, concurrency_keys=keys, concurrency=2)
    ctl = seed.seed_pack(db, "c", WT)
    seed.seed_items(db, ctl, 800, labels=keys)
    worst = {"limited": 0, "control": 0}
    stop = asyncio.Event()

    async def worker(p: int) -> None:
        c = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
        try:
            while not stop.is_set():
                rows = await _claim(c, p, 8, owner=str(id(c)))
                if rows:
                    await asyncio.sleep(0.005)  # "running"
                    await _complete(c, rows)
                elif p == ctl or not _left(db, pack):
                    return
                else:
                    await asyncio.sleep(0.002)
        finally:
            await c.close()

    async def sampler() -> None:
        s = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
        try:
            while not stop.is_set():
                cur = await s.execute(
                    """SELECT coalesce(max(n) FILTER (WHERE pack = %s), 0),
                              coalesce(max(n) FILTER (WHERE pack = %s), 0)
                       FROM (SELECT w.installed_pack_id AS pack, count(*) AS n FROM connector_work_item w
                             JOIN connector_event e ON e.event_id = w.event_id WHERE w.state = 'processing'
                             GROUP BY 1, coalesce(w.concurrency_key, e.source_object_id)) x""",
                    (pack, ctl),
                )
                lim, con = await cur.fetchone()  # type: ignore[misc]
                worst["limited"] = max(worst["limited"], int(lim))
                worst["control"] = max(worst["control"], int(con))
                await asyncio.sleep(0.003)
        finally:
            await s.close()

    sample = asyncio.create_task(sampler())
    try:
        await asyncio.wait_for(asyncio.gather(*(worker(p) for p in [pack] * 6 + [ctl] * 2)), 120)
    except TimeoutError:
        stop.set()
        raise AssertionError(f"not drained in 120 s; per key: {_key_states(db, pack)}") from None
    stop.set()
    await sample
    assert (
        db.execute("SELECT count(*) FROM connector_work_item WHERE state = 'succeeded'").fetchone()[0] == 1600
    )
    assert worst["limited"] <= 2, worst
    assert worst["control"] > 2, worst  # the sampler sees an unlimited key above 2
    assert set(_slots(db).values()) == {0}
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        assert (await flow.concurrency_check(c)).recounted == 0


def _key_states(db: psycopg.Connection, pack: int) -> list[tuple]:
    """Per concurrency key of ``pack``: (key, in_flight, max, processing, due, parked, succeeded), and
    what every other connection to the database is doing (a failure message that says why)."""
    keys = db.execute(
        f"""SELECT k.concurrency_key, k.in_flight, k.max_in_flight,
                  count(*) FILTER (WHERE w.state = 'processing'),
                  count(*) FILTER (WHERE w.state IN ('pending', 'retry') AND w.run_after <> {PARKED}),
                  count(*) FILTER (WHERE w.state IN ('pending', 'retry') AND w.run_after = {PARKED}),
                  count(*) FILTER (WHERE w.state = 'succeeded')
           FROM connector_concurrency_limit k
           LEFT JOIN connector_work_item w
             ON w.installed_pack_id = k.installed_pack_id AND w.concurrency_key = k.concurrency_key
           WHERE k.installed_pack_id = %s GROUP BY 1, 2, 3 ORDER BY 1""",
        (pack,),
    ).fetchall()
    activity = db.execute(
        """SELECT state, wait_event_type, wait_event, left(query, 60), now() - query_start
           FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"""
    ).fetchall()
    return [*keys, *activity]


def _left(db: psycopg.Connection, pack: int) -> int:
    return db.execute(
        "SELECT count(*) FROM connector_work_item WHERE installed_pack_id = %s AND state <> 'succeeded'",
        (pack,),
    ).fetchone()[0]


async def test_the_check_recounts_a_wrong_count_and_wakes_stranded_parked_items(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 4, concurrency_keys=["k"] * 4, concurrency=1)
    rows = await _claim(adb, pack, 10)
    assert len(rows) == 1 and _parked(db) == 3
    healthy = await flow.concurrency_check(adb)
    assert (healthy.recounted, healthy.woken, healthy.keys) == (0, 0, 1)
    # A lost release (simulated): the count says 0... recounted to the one processing row.
    db.execute("UPDATE connector_concurrency_limit SET in_flight = 0")
    res = await flow.concurrency_check(adb)
    assert (res.recounted, res.woken) == (1, 0) and _slots(db) == {"k": 1}
    # Its holder vanishes without a release (simulated): the check wakes one parked item.
    db.execute("UPDATE connector_work_item SET state = 'succeeded' WHERE state = 'processing'")
    res = await flow.concurrency_check(adb)
    assert (res.recounted, res.woken) == (1, 1) and _slots(db) == {"k": 0} and _parked(db) == 2


async def test_concurrency_and_rate_limit_together(db, adb) -> None:
    """An item with both keys needs a slot and budget; one that gets a slot but no budget is
    deferred and takes no slot."""
    pack = seed.seed_pack(db, "p", WT)
    ids = seed.seed_items(db, pack, 4, concurrency_keys=["c"] * 4, concurrency=3)
    db.execute("UPDATE connector_work_item SET rate_key = 'r' WHERE work_id = ANY(%s)", (ids,))
    db.execute(
        "INSERT INTO connector_rate_limit (installed_pack_id, rate_key, work_type, limit_n, period_s, burst)"
        " VALUES (%s, 'r', 'w', 1, 60, 1)",
        (pack,),
    )
    rows = await _claim(adb, pack, 10)
    assert [r[0] for r in rows] == ids[:1]  # 3 slots, but budget for one
    assert _slots(db) == {"c": 1}
    assert _parked(db) == 1  # the fourth had no slot
    deferred = db.execute(
        "SELECT count(*) FROM connector_work_item WHERE run_after > now() + interval '30 s'"
        " AND run_after <> '9999-01-01 00:00:00+00'"
    ).fetchone()[0]
    assert deferred == 2  # slots but no budget: deferred to their budget's time


async def test_sampler_gauges_per_pack_and_work_type(db, adb) -> None:
    from connector.executor import metrics as m
    from connector.executor.work import stats_sampler

    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 5, concurrency_keys=["a", "a", "a", "b", None], concurrency=1)
    assert len(await _claim(adb, pack, 10)) == 3  # a, b and the unlimited one
    await stats_sampler.sample_once(adb, 1.0)

    def gauge(name: str, state: str) -> float | None:
        return m.REGISTRY.get_sample_value(name, {"pack": "p", "work_type": "w", "state": state})

    assert gauge("connector_executor_concurrency_keys", "all") == 2
    assert gauge("connector_executor_concurrency_keys", "full") == 2
    assert gauge("connector_executor_concurrency_items", "parked") == 2
    assert gauge("connector_executor_concurrency_items", "waiting") == 0
    assert gauge("connector_executor_concurrency_items", "in_flight") == 2
