"""Circuit breakers in the claim statement and the finalize / reclaim feed
(docs/adr/013-circuit-breakers.md), against a real database: a closed circuit admits everything; N
failures in a row (or a failure ratio) open it, under ``FOR UPDATE`` after the claims in flight;
an open circuit's items are deferred without an attempt; after ``open_s`` at most
``half_open_probes`` probes run at once across concurrent claimers; a probe's success closes it,
its failure re-opens it, a reclaimed or released probe gives its slot back; manual open / close.

The real-process proof (two executors x 16 workers against a failing HTTP target, with a control
without the breaker) is ``tests/executor/test_circuit_processes.py``."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from connector.common.store import circuits, work_items
from connector.common.store.circuits import FAILURE, NEUTRAL, SUCCESS, outcome_runs
from connector.common.store.work_items.finalize import FailBatch, FailOp
from connector.executor.handlers import Outcome
from connector.executor.work.finalizer import circuit_outcome
from tests.executor import seed

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}
KEY = "https://crm.internal:443"


async def _claim(adb, pack: int, n: int = 50, held: dict | None = None, owner: str = "me"):
    return await work_items.claim.work_item_claim_batch(
        adb, [pack], ["default"], [n], owner=owner, lease_s=30.0, held_back=held
    )


async def _claim_circuit(adb, pack: int, n: int = 50, needs: dict | None = None, owner: str = "me"):
    """The circuit statement (closed circuits on the plain path); the levels it left in ``needs``."""
    return await work_items.claim.work_item_claim_circuit_batch(
        adb, [pack], ["default"], [n], owner=owner, lease_s=30.0, keyed={}, needs=needs
    )


def _circuit(db: psycopg.Connection, pack: int, key: str = KEY) -> dict:
    row = db.execute(
        """SELECT state, forced, consecutive, cardinality(probe_ids), reason, opened_count,
                  extract(epoch FROM open_until - now())::float8, window_outcomes, window_failures
           FROM connector_circuit WHERE installed_pack_id = %s AND circuit_key = %s""",
        (pack, key),
    ).fetchone()
    assert row is not None
    names = ("state", "forced", "consecutive", "probes", "reason", "opened", "open_for", "wo", "wf")
    return dict(zip(names, row, strict=True))


async def _finish(adb, rows, codes: list[str]) -> work_items.finalize.FinalizeResult:
    """Finalize claimed ``rows`` with outcome codes (s: complete, f: retry, n: release), feeding
    their circuit like the finalizer does."""
    ids, tokens, fail = [], [], FailBatch()
    feed: dict[int, tuple[int, str, str]] = {}
    for r, code in zip(rows, codes, strict=True):
        if code == SUCCESS:
            ids.append(r[0])
            tokens.append(r[1])
        elif code == FAILURE:
            fail.add(r[0], r[1], FailOp.RETRY, delay=0.0, failure_class="http_503", summary="HTTP 503")
        else:
            fail.add(r[0], r[1], FailOp.RELEASE, unstarted=True)
        feed[r[0]] = (r[2], KEY, code)
    return await work_items.finalize.work_item_finalize(adb, ids, tokens, fail, circuits=feed)


def _open_now(db: psycopg.Connection, pack: int) -> None:
    """Let ``open_s`` pass at once (the clock is the database's; tests do not sleep for it)."""
    db.execute(
        "UPDATE connector_circuit SET open_until = now() - interval '1 ms' WHERE installed_pack_id = %s",
        (pack,),
    )
    db.execute(
        "UPDATE connector_work_item SET run_after = now() WHERE installed_pack_id = %s"
        " AND state IN ('pending', 'retry')",
        (pack,),
    )


def test_outcome_runs_and_classification() -> None:
    assert outcome_runs([FAILURE, FAILURE, SUCCESS, FAILURE, FAILURE, FAILURE, SUCCESS, FAILURE]) == (
        2,
        3,
        1,
        2,
        6,
    )
    assert outcome_runs([FAILURE, NEUTRAL, FAILURE]) == (2, 0, 0, 0, 2)
    assert outcome_runs([SUCCESS, SUCCESS]) == (0, 0, 0, 2, 0)
    assert circuit_outcome(None) == SUCCESS
    assert circuit_outcome(Outcome.retry(None, "http_503", "x")) == FAILURE
    assert circuit_outcome(Outcome.retry(None, "timeout", "x")) == FAILURE
    assert circuit_outcome(Outcome.fail("http_422", "x")) == SUCCESS  # the target answered
    assert circuit_outcome(Outcome.retry(None, "lease_exhausted", "x")) == NEUTRAL


async def test_consecutive_failures_open_it_and_open_items_wait_without_an_attempt(db, adb) -> None:
    """3 failures in a row open the circuit (a success between resets the count); its items are
    then deferred to ``open_until`` with ``attempts`` unchanged, while items without a breaker and
    the other target's items are claimed."""
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 3, "open_s": 60}
    first = seed.seed_items(db, pack, 3, circuit_keys=[KEY] * 3, circuit=pol)
    rows = await _claim(adb, pack)
    assert sorted(r[0] for r in rows) == first
    res = await _finish(adb, sorted(rows), [FAILURE, FAILURE, SUCCESS])  # runs: 2 then reset
    assert res.circuits == [] and _circuit(db, pack)["consecutive"] == 0
    rows = await _claim(adb, pack)  # the two retried ones (due now) and the succeeded one is done
    assert len(rows) == 2
    await _finish(adb, sorted(rows), [FAILURE, FAILURE])
    assert _circuit(db, pack)["state"] == "closed" and _circuit(db, pack)["consecutive"] == 2
    rows = await _claim(adb, pack)
    res = await _finish(adb, sorted(rows)[:1], [FAILURE])
    assert [(t.state, t.reason) for t in res.circuits] == [("open", "consecutive_failures")]
    c = _circuit(db, pack)
    assert c["state"] == "open" and c["opened"] == 1 and 55 < c["open_for"] <= 60
    # The one still held finishes after the open: its outcome changes nothing.
    await _finish(adb, sorted(rows)[1:], [SUCCESS])
    assert _circuit(db, pack)["state"] == "open"
    waiting = seed.seed_items(db, pack, 4, circuit_keys=[KEY] * 4, circuit=pol)
    other = seed.seed_items(db, pack, 2, circuit_keys=["http://other:80"] * 2, circuit=pol)
    plain = seed.seed_items(db, pack, 2)
    held: dict = {}
    rows = await _claim(adb, pack, held=held)
    assert sorted(r[0] for r in rows) == sorted(other + plain)
    assert held[(pack, "default")] >= 4
    st = db.execute(
        """SELECT state, attempts, extract(epoch FROM run_after - now())::float8 FROM connector_work_item
           WHERE work_id = ANY(%s)""",
        (waiting,),
    ).fetchall()
    assert all(s == "pending" and a == 0 and 55 < d <= 60 for s, a, d in st), st


async def test_half_open_admits_the_probes_only_and_a_probe_success_closes_it(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 2, "open_s": 30, "half_open_probes": 2}
    ids = seed.seed_items(db, pack, 2, circuit_keys=[KEY] * 2, circuit=pol)
    await _finish(adb, sorted(await _claim(adb, pack)), [FAILURE, FAILURE])
    assert _circuit(db, pack)["state"] == "open"
    more = seed.seed_items(db, pack, 6, circuit_keys=[KEY] * 6, circuit=pol)
    _open_now(db, pack)
    probes = await _claim(adb, pack)
    assert len(probes) == 2  # half_open_probes
    c = _circuit(db, pack)
    assert (c["state"], c["probes"], c["reason"]) == ("half_open", 2, "open_s_elapsed")
    db.execute(
        "UPDATE connector_work_item SET run_after = now() WHERE work_id = ANY(%s) AND state = 'pending'",
        (more + ids,),
    )
    assert await _claim(adb, pack) == []  # both probes in flight: nothing else
    res = await _finish(adb, probes[:1], [SUCCESS])
    assert [(t.state, t.reason) for t in res.circuits] == [("closed", "probe_succeeded")]
    db.execute(
        "UPDATE connector_work_item SET run_after = now() WHERE work_id = ANY(%s) AND state = 'pending'",
        (more + ids,),
    )
    rest = await _claim(adb, pack)
    assert len(rest) == 6  # closed: the remaining ones all go (the other probe still runs)
    # The other probe's late failure is an ordinary outcome of a closed circuit now: one in a row.
    await _finish(adb, probes[1:], [FAILURE])
    assert (_circuit(db, pack)["state"], _circuit(db, pack)["consecutive"]) == ("closed", 1)


async def test_a_failed_probe_reopens_it_and_a_released_probe_gives_its_slot_back(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 1, "open_s": 30, "half_open_probes": 1}
    seed.seed_items(db, pack, 5, circuit_keys=[KEY] * 5, circuit=pol)
    await _finish(adb, (await _claim(adb, pack, 1)), [FAILURE])
    _open_now(db, pack)
    probe = await _claim(adb, pack)
    assert len(probe) == 1 and _circuit(db, pack)["probes"] == 1
    await _finish(adb, probe, [NEUTRAL])  # released (shutdown): neutral, the slot comes back
    c = _circuit(db, pack)
    assert (c["state"], c["probes"]) == ("half_open", 0)
    probe = await _claim(adb, pack)
    assert len(probe) == 1
    res = await _finish(adb, probe, [FAILURE])
    assert [(t.state, t.reason) for t in res.circuits] == [("open", "probe_failed")]
    c = _circuit(db, pack)
    assert (c["state"], c["probes"], c["opened"]) == ("open", 0, 2) and 25 < c["open_for"] <= 30


async def test_a_reclaimed_probe_gives_its_slot_back_and_counts_as_neutral(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 1, "open_s": 30, "half_open_probes": 1}
    seed.seed_items(db, pack, 3, circuit_keys=[KEY] * 3, circuit=pol)
    await _finish(adb, (await _claim(adb, pack, 1)), [FAILURE])
    _open_now(db, pack)
    probe = await _claim(adb, pack)
    assert len(probe) == 1
    db.execute(
        "UPDATE connector_work_item SET lease_until = now() - interval '1 s' WHERE work_id = %s",
        (probe[0][0],),
    )
    reclaimed = await work_items.finalize.work_item_reclaim_expired(adb)
    assert [r.work_id for r in reclaimed] == [probe[0][0]]
    c = _circuit(db, pack)
    assert (c["state"], c["probes"]) == ("half_open", 0)
    db.execute(
        "UPDATE connector_work_item SET run_after = now()"
        " WHERE installed_pack_id = %s AND state IN ('pending', 'retry')",
        (pack,),
    )
    assert len(await _claim(adb, pack)) == 1  # the next probe


async def test_concurrent_claimers_never_admit_more_probes_than_declared(db, db_url) -> None:
    """Eight connections claim at once from a half-open circuit with 3 probes: 3 claimed in all."""
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 1, "open_s": 30, "half_open_probes": 3}
    seed.seed_items(db, pack, 200, circuit_keys=[KEY] * 200, circuit=pol)
    db.execute("UPDATE connector_circuit SET state = 'open', open_until = now() - interval '1 ms'")
    conns = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(8)]
    try:
        got: list = []
        for _ in range(5):
            db.execute("UPDATE connector_work_item SET run_after = now() WHERE state = 'pending'")
            results = await asyncio.gather(*(_claim(c, pack, 20, owner=f"c{i}") for i, c in enumerate(conns)))
            got.extend(r for rows in results for r in rows)
        assert len(got) == 3, len(got)
        assert _circuit(db, pack)["probes"] == 3
    finally:
        for c in conns:
            await c.close()


@pytest.mark.parametrize("statement", ["flow", "circuit"])
@pytest.mark.parametrize("control", [False, True], ids=["gate", "control-unlocked-read"])
async def test_an_open_waits_for_the_claims_in_flight_and_later_claims_see_it(
    db, db_url, adb, monkeypatch, control, statement
) -> None:
    """The race the gate closes: a claim holding a closed circuit (its transaction not committed)
    makes the trip wait (``FOR UPDATE`` after ``KEY SHARE``); once it has committed, a claim
    admits nothing of the target. The holder's claim is the flow statement or the circuit
    statement (closed circuits on the plain path), which takes the same lock. Control: a claim that
    reads the circuit without the lock lets the open commit while it still admits items (the test
    sees the open finish at once)."""
    name = "WORK_ITEM_CLAIM_BATCH" if statement == "flow" else "WORK_ITEM_CLAIM_CIRCUIT_BATCH"
    claim = _claim if statement == "flow" else _claim_circuit
    if control:
        stmt = getattr(work_items.claim, name)
        assert "FOR KEY SHARE SKIP LOCKED" in stmt
        monkeypatch.setattr(work_items.claim, name, stmt.replace("FOR KEY SHARE SKIP LOCKED", ""))
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 1, "open_s": 60}
    seed.seed_items(db, pack, 1, circuit_keys=[KEY], circuit=pol)
    victim = await _claim(adb, pack)
    seed.seed_items(db, pack, 10, circuit_keys=[KEY] * 10, circuit=pol)
    holder = await psycopg.AsyncConnection.connect(db_url)
    try:
        held = await claim(holder, pack, 3, owner="holder")  # inside an open transaction
        assert len(held) == 3
        opener = asyncio.create_task(_finish(adb, victim, [FAILURE]))
        await asyncio.sleep(0.5)
        if control:
            assert opener.done()  # committed while the claim that admitted 3 items is in flight
            return
        assert not opener.done()  # waits for the claim in flight
        await holder.commit()
        res = await asyncio.wait_for(opener, 10)
        assert [t.state for t in res.circuits] == ["open"]
        assert await claim(adb, pack) == []
        if statement == "circuit":  # it left the open circuit's items (untouched) to the flow statement
            assert (
                db.execute(
                    "SELECT count(*) FROM connector_work_item WHERE state = 'pending' AND attempts = 0"
                    " AND run_after <= now()"
                ).fetchone()[0]
                == 7
            )
    finally:
        await holder.close()


async def test_the_circuit_claim_takes_closed_circuits_and_leaves_the_rest(db, adb) -> None:
    """The circuit statement claims the unkeyed candidates and those of closed circuits; it leaves
    untouched, with the level each needs, those of an open circuit (the flow statement's: it defers
    them or admits probes), those with a rate key (the rate statement's) and those with a rate key
    and a circuit or another flow key (the flow statement's). The ready-groups read says a head whose
    circuit is not closed needs the flow statement (an empty circuit claim cannot say so)."""
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 5, "open_s": 60}
    other = "http://other:80"
    free = seed.seed_items(db, pack, 2)
    closed = seed.seed_items(db, pack, 3, circuit_keys=[KEY] * 3, circuit=pol)
    opened = seed.seed_items(db, pack, 2, circuit_keys=[other] * 2, circuit=pol)
    rated = seed.seed_items(db, pack, 2, rate_keys=["a", "b"], rate_limit=(1, 60.0, 1))
    slotted = seed.seed_items(db, pack, 1, concurrency_keys=["c"], concurrency=1)
    db.execute(
        "UPDATE connector_circuit SET state = 'open', open_until = now() + interval '1 hour'"
        " WHERE circuit_key = %s",
        (other,),
    )
    keyed: dict = {}
    needs: dict = {}
    rows = await work_items.claim.work_item_claim_circuit_batch(
        adb, [pack], ["default"], [50], owner="me", lease_s=30.0, keyed=keyed, needs=needs
    )
    assert sorted(r[0] for r in rows) == sorted(free + closed)
    assert keyed == {(pack, "default"): 5} and needs == {(pack, "default"): work_items.claim.FLOW}
    assert rows[0][-1] is not None and sorted(rows[0][-1]) == [2, 2, 3, 3, 3]  # rate x2, flow x3
    left = db.execute(
        "SELECT state, attempts, run_after <= now() FROM connector_work_item WHERE work_id = ANY(%s)",
        (opened + rated + slotted,),
    ).fetchall()
    assert left == [("pending", 0, True)] * 5  # untouched: not claimed, not deferred
    [group] = await work_items.claim.work_item_ready_groups(adb)
    assert group.keyed and group.need == work_items.claim.FLOW  # the head: the open circuit's item
    db.execute("UPDATE connector_circuit SET state = 'closed', open_until = NULL")
    [group] = await work_items.claim.work_item_ready_groups(adb)
    assert group.keyed and group.need == work_items.claim.CIRCUIT


async def test_an_open_circuit_keeps_the_counts_that_opened_it_until_it_closes(db, adb) -> None:
    """#24: ``circuit list`` read "0 in a row" right after 3 failures in a row had opened it. The
    counts that opened it stay while it is open and half-open (a late outcome of an item claimed
    before the open changes nothing) and start again when a probe closes it."""
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 3, "open_s": 30, "half_open_probes": 1}
    seed.seed_items(db, pack, 5, circuit_keys=[KEY] * 5, circuit=pol)
    rows = sorted(await _claim(adb, pack))
    res = await _finish(adb, rows[:3], [FAILURE, FAILURE, FAILURE])
    assert [(t.state, t.reason) for t in res.circuits] == [("open", "consecutive_failures")]
    c = _circuit(db, pack)
    assert (c["state"], c["consecutive"], c["wo"], c["wf"]) == ("open", 3, 3, 3)
    await _finish(adb, rows[3:4], [FAILURE])  # claimed before the open: its outcome changes nothing
    assert _circuit(db, pack)["consecutive"] == 3
    _open_now(db, pack)
    probe = await _claim(adb, pack)
    assert len(probe) == 1 and _circuit(db, pack)["state"] == "half_open"
    assert _circuit(db, pack)["consecutive"] == 3
    res = await _finish(adb, probe, [SUCCESS])
    assert [(t.state, t.reason) for t in res.circuits] == [("closed", "probe_succeeded")]
    c = _circuit(db, pack)
    assert (c["state"], c["consecutive"], c["wo"], c["wf"]) == ("closed", 0, 0, 0)


async def test_failure_ratio_opens_it(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 0, "failure_ratio": 0.5, "min_outcomes": 6, "window_s": 60}
    seed.seed_items(db, pack, 8, circuit_keys=[KEY] * 8, circuit=pol)
    rows = sorted(await _claim(adb, pack))
    res = await _finish(adb, rows[:4], [FAILURE, SUCCESS, FAILURE, SUCCESS])
    assert res.circuits == [] and (_circuit(db, pack)["wo"], _circuit(db, pack)["wf"]) == (4, 2)
    res = await _finish(adb, rows[4:5], [SUCCESS])  # 2/5 failures, and 5 < min_outcomes anyway
    assert res.circuits == []
    res = await _finish(adb, rows[5:6], [FAILURE])  # 3/6 >= 0.5
    assert [(t.state, t.reason) for t in res.circuits] == [("open", "failure_ratio")]


async def test_manual_open_holds_until_closed(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 5, "open_s": 10}
    ids = seed.seed_items(db, pack, 3, circuit_keys=[KEY] * 3, circuit=pol)
    async with adb.transaction():
        row = await circuits.circuit_set(adb, pack, KEY, open_=True)
    assert row is not None and row["state"] == "open" and row["forced"]
    assert await circuits.circuit_set(adb, pack, "http://nope:80", open_=True) is None
    assert await _claim(adb, pack) == []
    db.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = ANY(%s)", (ids,))
    assert await _claim(adb, pack) == []  # forced: no probes, whatever the time
    row = await circuits.circuit_set(adb, pack, KEY, open_=False)
    assert row is not None and row["state"] == "closed" and row["reason"] == "manual_close"
    db.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = ANY(%s)", (ids,))
    assert sorted(r[0] for r in await _claim(adb, pack)) == ids


@pytest.mark.parametrize("n", [0])
async def test_a_closed_circuit_with_successes_is_not_written(db, adb, n) -> None:
    """A closed circuit fed only successes (no failures in a row, no ratio window) keeps its row
    version: the feed locks and writes nothing (no contention on a hot target's row)."""
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 5, circuit_keys=[KEY] * 5, circuit={"consecutive_failures": 3})
    (before,) = db.execute("SELECT xmin::text FROM connector_circuit").fetchone()  # type: ignore[misc]
    rows = await _claim(adb, pack)
    await _finish(adb, rows, [SUCCESS] * 5)
    (after,) = db.execute("SELECT xmin::text FROM connector_circuit").fetchone()  # type: ignore[misc]
    assert before == after


async def test_sampler_gauges_per_pack_and_target(db, adb) -> None:
    """The sampler exports every circuit's state as 1 of closed/open/half_open, labelled pack (name)
    and target — the circuit key: scheme and host:port, never a path, query or user info (the
    materializer never puts them in the key; see tests/materializer: the key of a URL with user info
    and a token)."""
    from connector.executor import metrics as m
    from connector.executor.work import stats_sampler

    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 1, circuit_keys=[KEY], circuit={"consecutive_failures": 1, "open_s": 30})
    seed.seed_items(db, pack, 1, circuit_keys=["http://other:80"], circuit={"consecutive_failures": 1})
    rows = await _claim(adb, pack)
    circuit_key = work_items.claim.CLAIM_COLUMNS.index("circuit_key")
    mine = [r for r in rows if r[circuit_key] == KEY]
    await _finish(adb, mine, [FAILURE])  # KEY opens
    await stats_sampler.sample_once(adb, 1.0)

    def gauge(target: str, state: str) -> float | None:
        return m.REGISTRY.get_sample_value(
            "connector_executor_circuit_state", {"pack": "p", "target": target, "state": state}
        )

    assert (gauge(KEY, "open"), gauge(KEY, "closed"), gauge(KEY, "half_open")) == (1, 0, 0)
    assert (gauge("http://other:80", "closed"), gauge("http://other:80", "open")) == (1, 0)
    labels = {
        tuple(sorted(s.labels))
        for metric in m.REGISTRY.collect()
        if metric.name.startswith("connector_executor_circuit_state")
        for s in metric.samples
    }
    assert labels <= {("pack", "state", "target"), ("pack", "target")}
    assert m.circuit_target_label("https://u:p@h/x?token=1") == "other"  # a key of another shape
