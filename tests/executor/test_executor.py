"""The executor in-process: outcomes end to end, retries and the DLQ, handler context, timeouts,
drain on stop, process registration, lanes and fairness with a control."""

from __future__ import annotations

import time

import psycopg
import pytest

from connector.executor.handlers import delivery_key
from tests.executor import effects, seed
from tests.executor.helpers import await_for, states


def _wt(handler: str, **kw) -> dict:
    return seed.python_work_type(f"tests.executor.effects:{handler}", **kw)


async def test_success_drains_the_queue(db, executor_factory) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt("noop")})
    seed.seed_items(db, pack, 500)
    svc = await executor_factory(workers=8, claim_batch=32)
    await await_for(lambda: states(db) == {"succeeded": 500}, 20, "all succeeded")
    assert svc.engine.stats["stale"] == 0
    row = db.execute(
        "SELECT count(*) FILTER (WHERE lease_owner IS NULL AND finished_at IS NOT NULL AND lease_token = 1 "
        "AND attempts = 1) FROM connector_work_item"
    ).fetchone()
    assert row[0] == 500


async def test_handler_gets_event_payload_token_and_idempotency_key(db, executor_factory) -> None:
    effects.SEEN.clear()
    pack = seed.seed_pack(db, "p", {"w": _wt("capture")})
    (i,) = seed.seed_items(db, pack, 1, labels=["obj-1"], body=b'{"hello": "world"}')
    event_key = db.execute(
        "SELECT e.idempotency_key FROM connector_work_item w JOIN connector_event e USING (event_id)"
        " WHERE w.work_id = %s",
        (i,),
    ).fetchone()[0]
    await executor_factory()
    await await_for(lambda: effects.SEEN, 10, "handler call")
    key = delivery_key("seed", event_key, "w")
    assert effects.SEEN[0] == (i, 1, 1, key, "obj-1", b'{"hello": "world"}', "application/json")


async def test_retry_then_success_and_exhausted_retries_dead(db, executor_factory) -> None:
    effects.SEEN.clear()
    pack = seed.seed_pack(
        db, "p", {"ok": _wt("retry_then_succeed"), "bad": _wt("always_retry", max_attempts=3)}
    )
    (a,) = seed.seed_items(db, pack, 1, work_type="ok", max_attempts=5)
    (b,) = seed.seed_items(db, pack, 1, work_type="bad", max_attempts=3)
    await executor_factory()
    await await_for(lambda: states(db) == {"succeeded": 1, "dead": 1}, 20, "terminal")
    assert sorted(x for x in effects.SEEN if x[0] == a) == [(a, 1), (a, 2), (a, 3)]
    assert sorted(x for x in effects.SEEN if x[0] == b) == [(b, 1), (b, 2), (b, 3)]
    st, cls, summary, attempts = db.execute(
        "SELECT state, failure_class, failure_summary, attempts FROM connector_work_item WHERE work_id = %s",
        (b,),
    ).fetchone()
    assert (st, cls, attempts) == ("dead", "always", 3) and summary.startswith("gave up after 3 attempts")


async def test_exception_backoff_uses_route_policy_and_database_time(db, executor_factory) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt("raises", backoff_base_s=100, backoff_cap_s=100)})
    (_i,) = seed.seed_items(db, pack, 1, body=b'{"card": "4242424242424242", "name": "Mallory"}')
    await executor_factory()
    await await_for(lambda: states(db) == {"retry": 1}, 10, "retry")
    cls, summary, due_in = db.execute(
        "SELECT failure_class, failure_summary, extract(epoch FROM run_after - now()) "
        "FROM connector_work_item"
    ).fetchone()
    assert cls == "exception" and summary.startswith("ValueError: cannot handle")
    for leaked in ("4242424242424242", "Mallory", "hunter2", "abc.def.ghi"):
        assert leaked not in summary
    assert 95 < float(due_in) <= 100  # base 100 s, jitter 0


@pytest.mark.parametrize(
    ("handler", "cls"),
    [("permanent", "validation"), ("raises_permanent", "refused")],
)
async def test_permanent_failure_is_dead_at_once(db, executor_factory, handler, cls) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt(handler)})
    seed.seed_items(db, pack, 2)
    await executor_factory()
    await await_for(lambda: states(db) == {"dead": 2}, 10, "dead")
    assert db.execute(
        "SELECT DISTINCT failure_class, attempts, outcome FROM connector_work_item"
    ).fetchall() == [(cls, 1, "failed")]


async def test_unknown_work_type_dead_and_missing_handler_retried(db, executor_factory) -> None:
    pack = seed.seed_pack(db, "p", {"w": _wt("noop"), "gone": seed.python_work_type("tests.nowhere:fn")})
    seed.seed_items(db, pack, 1, work_type="not_in_manifest")
    seed.seed_items(db, pack, 1, work_type="gone")
    await executor_factory()
    await await_for(lambda: states(db) == {"dead": 1, "retry": 1}, 10, "outcomes")
    got = dict(db.execute("SELECT work_type, failure_class FROM connector_work_item").fetchall())
    assert got == {"not_in_manifest": "unknown_work_type", "gone": "handler_unavailable"}


async def test_handler_timeout_is_a_retry(db, executor_factory) -> None:
    effects.SEEN.clear()
    pack = seed.seed_pack(db, "p", {"w": _wt("sleeps_forever", timeout_s=0.3, backoff_base_s=60)})
    seed.seed_items(db, pack, 1)
    await executor_factory(lease_s=0.6)  # the keeper checks timeouts every lease/3
    await await_for(lambda: states(db) == {"retry": 1}, 10, "timeout")
    assert db.execute("SELECT failure_class FROM connector_work_item").fetchone()[0] == "timeout"


async def test_stop_releases_in_flight_and_prefetched_items_and_deregisters(db, executor_factory) -> None:
    effects.SEEN.clear()
    pack = seed.seed_pack(db, "p", {"w": _wt("sleeps_forever")})
    seed.seed_items(db, pack, 10)
    svc = await executor_factory(workers=2, claim_batch=8, shutdown_grace_s=0.2)
    pid = svc.process_id
    assert db.execute(
        "SELECT claim_capability FROM connector_process WHERE process_id = %s", (pid,)
    ).fetchone() == ("work_item",)
    await await_for(lambda: len(effects.SEEN) == 2, 10, "two running")
    await await_for(lambda: states(db) == {"processing": 10}, 10, "2 running + 8 prefetched")
    t0 = time.monotonic()
    await svc.stop()
    assert time.monotonic() - t0 < 3
    rows = db.execute(
        "SELECT state, attempts, lease_owner FROM connector_work_item ORDER BY work_id"
    ).fetchall()
    assert (
        sorted(r[0] for r in rows) == ["pending"] * 8 + ["retry"] * 2
    )  # unstarted ones give the attempt back
    assert all(r[2] is None for r in rows)
    assert (
        db.execute("SELECT count(*) FROM connector_process WHERE process_id = %s", (pid,)).fetchone()[0] == 0
    )
    # Released items are claimable at once by another executor (no lease to wait for).
    effects.SEEN.clear()
    await executor_factory(workers=10, shutdown_grace_s=0.1)
    await await_for(lambda: len(effects.SEEN) == 10, 5, "re-claimed at once")


async def test_dead_lane_head_blocks_or_releases_its_lane(db, executor_factory) -> None:
    pack = seed.seed_pack(db, "p", {"bad": _wt("permanent"), "ok": _wt("noop")})
    blocked = seed.seed_items(db, pack, 1, work_type="bad", source_lanes=["B"], dead_blocks_lane=True)
    blocked += seed.seed_items(db, pack, 3, work_type="ok", source_lanes=["B"] * 3)
    flows = seed.seed_items(db, pack, 1, work_type="bad", source_lanes=["C"], dead_blocks_lane=False)
    flows += seed.seed_items(db, pack, 3, work_type="ok", source_lanes=["C"] * 3)
    other = seed.seed_items(db, pack, 5, work_type="ok", target_lanes=["T"] * 5)
    await executor_factory()

    def lane_states(ids):
        return [
            db.execute("SELECT state FROM connector_work_item WHERE work_id = %s", (i,)).fetchone()[0]
            for i in ids
        ]

    await await_for(lambda: lane_states(flows) == ["dead"] + ["succeeded"] * 3, 10, "continue lane")
    await await_for(lambda: lane_states(other) == ["succeeded"] * 5, 10, "other lane")
    assert lane_states(blocked) == ["dead", "blocked", "blocked", "blocked"]


async def test_retrying_head_blocks_only_its_own_lane(db, executor_factory) -> None:
    pack = seed.seed_pack(db, "p", {"slow": _wt("raises", backoff_base_s=60), "ok": _wt("noop")})
    head = seed.seed_items(db, pack, 1, work_type="slow", source_lanes=["A"])
    behind = seed.seed_items(db, pack, 2, work_type="ok", source_lanes=["A", "A"])
    free = seed.seed_items(db, pack, 20, work_type="ok", source_lanes=[f"L{i % 4}" for i in range(20)])
    await executor_factory()
    await await_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%s) AND state = 'succeeded'",
                (free,),
            ).fetchone()[0]
            == 20
        ),
        10,
        "other lanes flow",
    )
    got = db.execute(
        "SELECT state FROM connector_work_item WHERE work_id = ANY(%s) ORDER BY work_id", (head + behind,)
    ).fetchall()
    assert [r[0] for r in got] == ["retry", "blocked", "blocked"]


async def _fairness_run(db: psycopg.Connection, executor_factory, fair: bool) -> float:
    """A big pack with a deep backlog, then a small pack's items arrive; returns the small pack's
    worst wait (claim time minus insert time, database clock)."""
    big = seed.seed_pack(db, "big", {"w": _wt("record")})
    small = seed.seed_pack(db, "small", {"w": _wt("record")})
    seed.seed_items(db, big, 6000)
    svc = await executor_factory(fair=fair, workers=8, claim_batch=8, poll_interval_s=0.1)
    await await_for(lambda: svc.engine.stats["claimed"] > 200, 10, "big pack running")
    small_ids = seed.seed_items(db, small, 20)
    db.execute("NOTIFY connector_work")

    def small_started() -> bool:
        n = db.execute(
            "SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%s) AND started_at IS NOT NULL",
            (small_ids,),
        ).fetchone()[0]
        return n == 20

    try:
        await await_for(small_started, 4.0, "small pack served")
    except AssertionError:
        return float("inf")
    finally:
        await svc.stop()
    return float(
        db.execute(
            "SELECT extract(epoch FROM max(started_at - created_at)) FROM connector_work_item "
            "WHERE work_id = ANY(%s)",
            (small_ids,),
        ).fetchone()[0]
    )


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "greedy-control"])
async def test_small_pack_is_not_starved_by_a_huge_backlog(db, executor_factory, effect_table, fair) -> None:
    """Bound (docs/executor.md): discovery latency + one claim round + the small pack's share of the
    slot rate. With 8 workers and ~1 ms handlers the 20 items must all start within 1 s; the greedy
    control (no fairness) leaves them behind the 6,000-item backlog."""
    db.execute("SET statement_timeout = '10s'")
    os_env = __import__("os").environ
    os_env["EXECUTOR_TEST_SLEEP_S"] = "0.003"
    try:
        worst = await _fairness_run(db, executor_factory, fair)
    finally:
        os_env.pop("EXECUTOR_TEST_SLEEP_S", None)
    print(f"small pack worst wait ({'fair' if fair else 'greedy'}): {worst:.3f}s")
    if fair:
        assert worst < 1.0, worst
    else:
        assert worst > 3.0, worst


async def test_metrics_count_outcomes(db, executor_factory) -> None:
    from connector.executor.metrics import REGISTRY

    def sample(name: str, **labels) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    pack = seed.seed_pack(db, "p", {"ok": _wt("noop"), "bad": _wt("permanent")})
    ok = {"pack": "p", "work_type": "ok"}  # the pack label is the name, never the id
    bad = {"pack": "p", "work_type": "bad"}
    before_ok = sample("connector_executor_outcomes_total", **ok, state="succeeded")
    before_dead = sample("connector_executor_outcomes_total", **bad, state="dead")
    before_runs = sample("connector_executor_handler_seconds_count", **ok)
    before_failed = sample("connector_executor_failures_total", **bad, failure_class="validation")
    seed.seed_items(db, pack, 30, work_type="ok")
    seed.seed_items(db, pack, 3, work_type="bad")
    await executor_factory()
    await await_for(lambda: states(db) == {"succeeded": 30, "dead": 3}, 10, "done")
    await await_for(
        lambda: sample("connector_executor_outcomes_total", **bad, state="dead") - before_dead >= 3,
        10,
        "outcomes counted",
    )
    assert sample("connector_executor_outcomes_total", **ok, state="succeeded") - before_ok == 30
    assert sample("connector_executor_outcomes_total", **bad, state="dead") - before_dead == 3
    assert sample("connector_executor_handler_seconds_count", **ok) - before_runs == 30
    assert sample("connector_executor_failures_total", **bad, failure_class="validation") - before_failed == 3
    assert sample("connector_executor_outcomes_total", pack=str(pack), work_type="ok", state="succeeded") == 0
    assert sample("connector_executor_claim_statements_total", result="rows") > 0


def _sample(name: str, **labels: str) -> float:
    from connector.executor.metrics import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def _claims() -> float:
    return sum(_sample("connector_executor_claim_statements_total", result=r) for r in ("rows", "empty"))


async def proof_metrics_run(db, executor_factory) -> dict[str, float]:
    """The workload of the proof-metrics test and its readings: two items that always ask for a retry
    (3 attempts each), then six that hold their slot until released (four run at once)."""
    effects.SEEN.clear()
    release = effects.held_reset()
    pack = seed.seed_pack(db, "p", {"hold": _wt("held"), "bad": _wt("always_retry", max_attempts=3)})
    bad = {"pack": "p", "work_type": "bad"}
    before = {
        "claims": _claims(),
        "count": _sample("connector_executor_claim_seconds_count"),
        "sum": _sample("connector_executor_claim_seconds_sum"),
        "inf": _sample("connector_executor_claim_seconds_bucket", le="+Inf"),
        "retry": _sample("connector_executor_outcomes_total", **bad, state="retry"),
        "dead": _sample("connector_executor_outcomes_total", **bad, state="dead"),
    }
    r: dict[str, float] = {}
    try:
        seed.seed_items(db, pack, 2, work_type="bad", max_attempts=3)
        svc = await executor_factory(workers=4)
        await await_for(lambda: states(db) == {"dead": 2}, 20, "both retrying items dead")
        await await_for(
            lambda: _sample("connector_executor_outcomes_total", **bad, state="dead") - before["dead"] >= 2,
            10,
            "outcomes counted",
        )
        r["attempts"] = db.execute("SELECT sum(attempts) FROM connector_work_item").fetchone()[0]
        r["retries"] = _sample("connector_executor_outcomes_total", **bad, state="retry") - before["retry"]
        r["slots"] = _sample("connector_executor_slots")
        seed.seed_items(db, pack, 6, work_type="hold")
        await await_for(lambda: len(effects.SEEN) - 6 == 4, 20, "four held handlers running")
        assert svc.engine.running == 4, "the workload: four handlers held"
        r["in_use_held"] = _sample("connector_executor_slots_in_use")
    finally:
        release.set()
    await await_for(lambda: states(db) == {"dead": 2, "succeeded": 6}, 20, "held items finished")
    await await_for(lambda: svc.engine.running == 0, 10, "handlers returned")
    r["in_use_after"] = _sample("connector_executor_slots_in_use")
    r["claims"] = _claims() - before["claims"]
    r["observed"] = _sample("connector_executor_claim_seconds_count") - before["count"]
    r["inf"] = _sample("connector_executor_claim_seconds_bucket", le="+Inf") - before["inf"]
    r["sum"] = _sample("connector_executor_claim_seconds_sum") - before["sum"]
    return r


def check_retry_rate(r: dict[str, float]) -> None:
    assert (r["attempts"], r["retries"]) == (6, 4), "each attempt but the last asked for a retry: 4 of 6"


def check_slots_in_use(r: dict[str, float]) -> None:
    assert r["slots"] == 4
    assert r["in_use_held"] == 4, "every slot in use, as the handlers say"
    assert r["in_use_after"] == 0, "slots free again"


def check_claim_latency(r: dict[str, float]) -> None:
    assert r["claims"] >= 3 and r["observed"] == r["claims"], "one latency observation per claim statement"
    assert r["inf"] == r["observed"]
    assert r["sum"] > 0


PROOF_CHECKS = (check_retry_rate, check_slots_in_use, check_claim_latency)


async def test_metrics_claim_latency_slots_in_use_and_retry_rate(db, executor_factory) -> None:
    """The seed's proof metrics asserted, not only exported (issue #28 item 6): claim latency (one
    observation per claim statement, its sum positive), executor concurrency (slots in use equal to
    the handlers running, on the handlers' word; back to 0 when they finish) and the retry rate
    (retry outcomes = the attempts that asked for a retry). Controls:
    ``test_control_proof_metrics_on_a_broken_build``."""
    readings = await proof_metrics_run(db, executor_factory)
    for check in PROOF_CHECKS:
        check(readings)


def _slots_gauge_bound_to_0(monkeypatch: pytest.MonkeyPatch) -> None:
    from connector.executor import metrics as m

    bind = m.SLOTS_IN_USE.set_function
    monkeypatch.setattr(m.SLOTS_IN_USE, "set_function", lambda fn: bind(lambda: 0))


def _claimer_not_observing_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    from connector.executor import metrics as m

    monkeypatch.setattr(m.CLAIM_SECONDS, "observe", lambda seconds: None)


@pytest.mark.parametrize(
    ("mutation", "caught_by"),
    [(_slots_gauge_bound_to_0, check_slots_in_use), (_claimer_not_observing_latency, check_claim_latency)],
    ids=["slots_gauge_bound_to_0", "claimer_not_observing_latency"],
)
async def test_control_proof_metrics_on_a_broken_build(
    db, executor_factory, monkeypatch, mutation, caught_by
) -> None:
    """Control: the same run on a build whose slots-in-use gauge is bound to a constant 0, or whose
    claimer does not observe its latency: the check for that metric fails, the others pass (the
    workload itself ran as it should)."""
    mutation(monkeypatch)
    readings = await proof_metrics_run(db, executor_factory)
    for check in PROOF_CHECKS:
        if check is caught_by:
            with pytest.raises(AssertionError):
                check(readings)
        else:
            check(readings)


def test_event_claim_path_without_a_pack_is_refused_clearly(db_url) -> None:
    import os
    import subprocess

    from tests.executor.helpers import CONNECTOR, ROOT

    out = subprocess.run(
        [str(CONNECTOR), "executor", "--claim-path", "event"],
        env={**os.environ, "CONNECTOR_DATABASE_URL": db_url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--claim-path event needs --pack" in out.stderr  # (tests/cutover: the legacy path itself)


async def test_a_finalize_that_keeps_failing_is_abandoned_then_reclaimed(
    db, executor_factory, monkeypatch
) -> None:
    from connector.common.store import work_items

    real = work_items.finalize.work_item_finalize
    calls = 0

    async def broken(*args, **kwargs):
        nonlocal calls
        calls += 1
        raise psycopg.errors.InvalidParameterValue("simulated persistent statement failure")

    monkeypatch.setattr(work_items.finalize, "work_item_finalize", broken)
    pack = seed.seed_pack(db, "p", {"w": _wt("noop")})
    seed.seed_items(db, pack, 5)
    svc = await executor_factory(lease_s=1.0, reclaim_interval_s=0.2)
    await await_for(lambda: svc.engine.stats["abandoned"] >= 5, 10, "batch abandoned")
    assert calls >= 5 and states(db) == {"processing": 5}  # the process is not wedged
    monkeypatch.setattr(work_items.finalize, "work_item_finalize", real)
    await await_for(lambda: states(db) == {"succeeded": 5}, 15, "reclaimed and finished")
    assert svc.engine.stats["reclaimed"] >= 5


async def test_unreadable_manifest_fails_closed_and_retries(db, executor_factory) -> None:
    """A stored manifest this version cannot validate never runs handlers and never dead-letters:
    the items are retried (an operator can fix the pack) and the manifest is read again later."""
    pack = seed.seed_pack(db, "p", {"w": _wt("noop")})
    db.execute(
        "UPDATE connector_pack_generation SET manifest = manifest - 'routes' WHERE installed_pack_id = %s",
        (pack,),
    )
    seed.seed_items(db, pack, 3)
    await executor_factory()
    await await_for(lambda: states(db) == {"retry": 3}, 10, "retried")
    assert db.execute("SELECT DISTINCT failure_class FROM connector_work_item").fetchall() == [
        ("handler_unavailable",)
    ]
