"""Per-attempt history (``connector_work_attempt``, issue #25): the statements that end a claim
without success write one row each; the complete statement writes none.

Real executors (in-process, and a ``connector executor`` child killed with SIGKILL for the expired
lease). Controls: a first-time success leaves no row (the success path writes nothing); a release of
an unstarted item (its attempt given back) leaves none; the ring keeps ``ATTEMPTS_KEPT`` rows however
many claims failed; retention deletes a retired item's attempts and keeps a dead letter's.
"""

from __future__ import annotations

import psycopg

from connector.common.store import deliveries, work_items
from connector.common.store.work_items.finalize import ATTEMPTS_KEPT, FailBatch, FailOp
from tests.executor import effects, seed
from tests.executor.helpers import await_for, kill_9, states, wait_for


def _wt(handler: str, **kw) -> dict:
    return seed.python_work_type(f"tests.executor.effects:{handler}", **kw)


def _attempts(db: psycopg.Connection, work_id: int) -> list[tuple]:
    return db.execute(
        "SELECT attempt, lease_token, outcome, failure_class, failure_summary, lease_owner,"
        " started_at <= ended_at FROM connector_work_attempt WHERE work_id = %s ORDER BY lease_token",
        (work_id,),
    ).fetchall()


async def test_two_failures_then_a_success_keep_two_attempts_in_order(db, executor_factory) -> None:
    effects.SEEN.clear()
    pack = seed.seed_pack(db, "p", {"ok": _wt("retry_then_succeed"), "first": _wt("noop")})
    (a,) = seed.seed_items(db, pack, 1, work_type="ok", max_attempts=5)
    first = seed.seed_items(db, pack, 20, work_type="first")
    svc = await executor_factory()
    await await_for(lambda: states(db) == {"succeeded": 21}, 20, "all succeeded")
    got = _attempts(db, a)
    owner = svc.process_id
    assert [(r[0], r[1], r[2], r[3], r[5], r[6]) for r in got] == [
        (1, 1, "retry", "retry_requested", owner, True),
        (2, 2, "retry", "retry_requested", owner, True),
    ], got
    # The third (successful) attempt is the WorkItem row itself: token 3, nothing written for it.
    assert db.execute(
        "SELECT attempts, lease_token, state FROM connector_work_item WHERE work_id = %s", (a,)
    ).fetchone() == (3, 3, "succeeded")
    # Control: first-time successes write no attempt row.
    assert db.execute(
        "SELECT count(*) FROM connector_work_attempt WHERE work_id = ANY(%s)", (first,)
    ).fetchone() == (0,)


async def test_exhausted_retries_end_with_a_dead_attempt(db, executor_factory) -> None:
    pack = seed.seed_pack(db, "p", {"bad": _wt("always_retry", max_attempts=3)})
    (b,) = seed.seed_items(db, pack, 1, work_type="bad", max_attempts=3)
    await executor_factory()
    await await_for(lambda: states(db) == {"dead": 1}, 20, "dead")
    got = _attempts(db, b)
    assert [(r[0], r[2], r[3]) for r in got] == [
        (1, "retry", "always"),
        (2, "retry", "always"),
        (3, "dead", "always"),
    ]
    assert got[-1][4].startswith("gave up after 3 attempts")


async def test_a_sanitized_error_is_what_the_attempt_keeps(db, executor_factory) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt("raises", backoff_base_s=100, backoff_cap_s=100)})
    (i,) = seed.seed_items(db, pack, 1, body=b'{"card": "4242424242424242", "name": "Mallory"}')
    await executor_factory()
    await await_for(lambda: states(db) == {"retry": 1}, 10, "retry")
    ((_n, _t, outcome, cls, summary, _o, _ok),) = _attempts(db, i)
    assert (outcome, cls) == ("retry", "exception") and summary.startswith("ValueError: cannot handle")
    for leaked in ("4242424242424242", "Mallory", "hunter2", "abc.def.ghi"):
        assert leaked not in summary
    assert summary == db.execute("SELECT failure_summary FROM connector_work_item").fetchone()[0]


async def test_stop_records_started_releases_only(db, executor_factory) -> None:
    effects.SEEN.clear()
    pack = seed.seed_pack(db, "p", {"w": _wt("sleeps_forever")})
    ids = seed.seed_items(db, pack, 10)
    svc = await executor_factory(workers=2, claim_batch=8, shutdown_grace_s=0.2)
    await await_for(lambda: len(effects.SEEN) == 2, 10, "two running")
    await await_for(lambda: states(db) == {"processing": 10}, 10, "2 running + 8 prefetched")
    owner = svc.process_id
    await svc.stop()
    rows = db.execute(
        "SELECT work_id, outcome, failure_class, lease_owner FROM connector_work_attempt ORDER BY work_id"
    ).fetchall()
    started = sorted(w for w, _ in effects.SEEN)
    assert [r[0] for r in rows] == started and set(ids) >= set(started)
    assert {(r[1], r[2], r[3]) for r in rows} == {("released", None, owner)}


async def test_a_killed_holder_s_attempt_is_lease_expired(db, spawn, executor_factory) -> None:
    """A ``connector executor`` process claims the item and hangs in it; SIGKILL; another executor
    reclaims the expired lease (an attempt row ``lease_expired`` with the dead holder as owner) and
    succeeds on attempt 2 (no row)."""
    db.execute(effects.EFFECT_TABLE)
    pack = seed.seed_pack(db, "p", {"w": _wt("sleeps_first_attempt", max_attempts=5)})
    (i,) = seed.seed_items(db, pack, 1, max_attempts=5)
    a = spawn(extra_env={"CONNECTOR_EXECUTOR_LEASE_S": "1"})
    a_id = a.wait_registered(db)
    wait_for(
        lambda: (
            db.execute(
                "SELECT state, lease_owner FROM connector_work_item WHERE work_id = %s", (i,)
            ).fetchone()
            == ("processing", a_id)
        ),
        20,
        "A holds the item",
    )
    kill_9(db, a)
    await executor_factory(lease_s=1.0)
    await await_for(lambda: states(db) == {"succeeded": 1}, 30, "reclaimed and succeeded")
    got = _attempts(db, i)
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in got] == [(1, 1, "lease_expired", "lease_expired", a_id)]
    assert db.execute(
        "SELECT attempts, lease_token FROM connector_work_item WHERE work_id = %s", (i,)
    ).fetchone() == (2, 2)


async def test_the_ring_keeps_the_last_attempts_only(db, adb) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt("noop")})
    (i,) = seed.seed_items(db, pack, 1, max_attempts=100)
    claims = ATTEMPTS_KEPT + 7
    for n in range(claims):
        ((wid, token, *_),) = await work_items.claim.work_item_claim_batch(
            adb, [pack], ["default"], [1], owner=f"o{n}", lease_s=30
        )
        batch = FailBatch()
        batch.add(wid, token, FailOp.RETRY, failure_class="c", summary=f"s{n}")
        assert await work_items.finalize.work_item_fail_batch(adb, batch) == [(i, "retry")]
        await adb.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (i,))
    got = _attempts(db, i)
    assert len(got) == ATTEMPTS_KEPT
    assert [r[1] for r in got] == list(range(claims - ATTEMPTS_KEPT + 1, claims + 1))
    assert [r[5] for r in got] == [f"o{n}" for n in range(claims - ATTEMPTS_KEPT, claims)]


async def test_a_stale_fail_writes_no_attempt(db, adb) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt("noop")})
    (i,) = seed.seed_items(db, pack, 1)
    ((wid, token, *_),) = await work_items.claim.work_item_claim_batch(
        adb, [pack], ["default"], [1], owner="me", lease_s=30
    )
    batch = FailBatch()
    batch.add(wid, token - 1, FailOp.RETRY, failure_class="c", summary="s")
    assert await work_items.finalize.work_item_fail_batch(adb, batch) == []
    assert _attempts(db, i) == []


async def test_retention_deletes_attempts_with_their_item(db, adb) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt("noop")})
    done, dead = seed.seed_items(db, pack, 2)
    rows = await work_items.claim.work_item_claim_batch(adb, [pack], ["default"], [2], owner="me", lease_s=30)
    tokens = {r[0]: r[1] for r in rows}
    batch = FailBatch()
    batch.add(done, tokens[done], FailOp.RETRY, failure_class="c", summary="s")
    batch.add(dead, tokens[dead], FailOp.DEAD, failure_class="c", summary="s")
    await work_items.finalize.work_item_fail_batch(adb, batch)
    await adb.execute("UPDATE connector_work_item SET state = 'succeeded' WHERE work_id = %s", (done,))
    assert await deliveries.work_item_delete_retired(adb, [done, dead]) == 1  # a dead letter stays
    assert _attempts(db, done) == [] and len(_attempts(db, dead)) == 1
