"""The plain claim statement (``WORK_ITEM_CLAIM_PLAIN_BATCH``): what a batch without flow keys sends,
so that a pack declaring no rate limit or concurrency pays nothing for them. It must never claim a
keyed candidate (that would bypass the limit): it leaves them untouched and reports them, and the
claimer then sends that group through the rate statement (``WORK_ITEM_CLAIM_RATE_BATCH``, rate-limit
keys only) or the flow statement (``WORK_ITEM_CLAIM_BATCH``). The rate statement in turn leaves any
other flow key to the flow statement.

Controls: with the keyed predicate removed from the plain statement (what a plain claim that forgot
the limits would do) the in-process executor claims a 1-per-period key many times in one period;
without the discovery flag a pack of keyed items only is never claimed; with the rate statement's
other-keys check removed it takes both items of a 1-slot concurrency key."""

from __future__ import annotations

import time

import psycopg
import pytest

from connector.common.store import work_items
from connector.executor.work import claimer as claimer_mod
from tests.executor import seed
from tests.executor.helpers import await_for, states

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}


#: The executor's three claim functions, by the statement each sends.
_CLAIMS = {
    "flow": "work_item_claim_batch",
    "rate": "work_item_claim_rate_batch",
    "plain": "work_item_claim_plain_batch",
    "circuit": "work_item_claim_circuit_batch",
}


def _wrap_claims(monkeypatch, wrap) -> None:  # type: ignore[no-untyped-def]
    """Replace each claim function by ``wrap(name, function)`` for the test."""
    for name, attr in _CLAIMS.items():
        monkeypatch.setattr(work_items.claim, attr, wrap(name, getattr(work_items.claim, attr)))


def _untouched(db: psycopg.Connection, ids: list[int]) -> list[tuple[str, int, int]]:
    return db.execute(
        "SELECT state, attempts, lease_token FROM connector_work_item WHERE work_id = ANY(%s)"
        " ORDER BY work_id",
        (ids,),
    ).fetchall()


async def _plain(adb, pack: int, n: int, keyed: dict) -> list[tuple]:
    return await work_items.claim.work_item_claim_plain_batch(
        adb, [pack], ["default"], [n], owner="me", lease_s=30.0, keyed=keyed
    )


async def test_the_plain_claim_takes_unkeyed_items_and_counts_the_keyed_ones(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    free = seed.seed_items(db, pack, 3)
    rated = seed.seed_items(db, pack, 2, rate_keys=["a", "b"], rate_limit=(1, 60.0, 1))
    slotted = seed.seed_items(db, pack, 2, concurrency_keys=["c", "c"], concurrency=1)
    more = seed.seed_items(db, pack, 2)
    keyed: dict = {}
    rows = await _plain(adb, pack, 20, keyed)
    assert sorted(r[0] for r in rows) == sorted(free + more)
    assert keyed == {(pack, "default"): 4}
    # Left exactly as they were: no attempt, no lease, no run_after change (not deferred, not parked).
    assert _untouched(db, rated + slotted) == [("pending", 0, 0)] * 4
    assert db.execute("SELECT count(*) FROM connector_work_item WHERE run_after > now()").fetchone()[0] == 0
    # No key row was spent or taken.
    assert db.execute("SELECT count(*) FROM connector_rate_limit WHERE tat > now()").fetchone()[0] == 0
    assert db.execute("SELECT sum(in_flight) FROM connector_concurrency_limit").fetchone()[0] == 0
    # The flow statement then claims them under their limits: one per rate key, one slot of "c".
    rest = await work_items.claim.work_item_claim_batch(
        adb, [pack], ["default"], [20], owner="me", lease_s=30.0
    )
    assert sorted(r[0] for r in rest) == sorted([*rated, slotted[0]])


async def test_without_keyed_candidates_the_plain_claim_returns_only_claims(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    ids = seed.seed_items(db, pack, 5)
    keyed: dict = {}
    rows = await _plain(adb, pack, 3, keyed)
    assert [r[0] for r in rows] == ids[:3] and keyed == {}
    assert all(r[0] is not None for r in rows)


async def test_a_plain_claim_of_keyed_candidates_only_takes_nothing(db, adb) -> None:
    """It reports what it left through its claimed rows, so with nothing claimed it reports nothing;
    the ready-groups read says the group's first ready row is keyed instead (the claimer's cue)."""
    pack = seed.seed_pack(db, "p", WT)
    rated = seed.seed_items(db, pack, 3, rate_keys=["a", "b", "c"], rate_limit=(1, 60.0, 1))
    keyed: dict = {}
    assert await _plain(adb, pack, 20, keyed) == [] and keyed == {}
    assert _untouched(db, rated) == [("pending", 0, 0)] * 3
    [group] = await work_items.claim.work_item_ready_groups(adb)
    assert (group.pack, group.queue_class, group.keyed) == (pack, "default", True)
    free = seed.seed_items(db, pack, 2, run_after_s=-60.0)  # due before the keyed ones: first ranked
    [group] = await work_items.claim.work_item_ready_groups(adb)
    assert group.keyed is False
    rows = await _plain(adb, pack, 20, keyed)
    assert sorted(r[0] for r in rows) == free and keyed == {(pack, "default"): 3}
    assert len(rows[0]) == len(work_items.claim.CLAIM_COLUMNS) + 3


@pytest.mark.parametrize("control", [False, True], ids=["discovery-flag", "control-no-flag"])
async def test_a_pack_of_keyed_items_only_is_claimed_through_the_flow_statement(
    db, executor_factory, monkeypatch, control
) -> None:
    """Every ready item keyed: a plain claim takes nothing and cannot say why. Discovery's flag (the
    group's first ready row is keyed) sends the group through the flow statement. Control: with the
    flag always false, the executor's plain claims keep coming back empty and the items wait."""
    empty = {"plain": 0}
    plain = work_items.claim.work_item_claim_plain_batch

    async def counting(*a, **kw):  # type: ignore[no-untyped-def]
        rows = await plain(*a, **kw)
        empty["plain"] += not rows
        return rows

    monkeypatch.setattr(work_items.claim, "work_item_claim_plain_batch", counting)
    if control:
        flag = work_items.claim.FLOW_KEYED + " AS keyed"
        assert flag in work_items.claim.WORK_ITEM_READY_GROUPS
        monkeypatch.setattr(
            work_items.claim,
            "WORK_ITEM_READY_GROUPS",
            work_items.claim.WORK_ITEM_READY_GROUPS.replace(flag, "false AS keyed"),
        )
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 20, rate_keys=[f"k{i % 4}" for i in range(20)], rate_limit=(1000, 1.0, 1000))
    svc = await executor_factory(workers=8, claim_batch=16)
    if control:
        await await_for(lambda: empty["plain"] >= 5, 30, "five empty plain claims")
        assert states(db) == {"pending": 20}
        return
    await await_for(lambda: states(db) == {"succeeded": 20}, 30, "the keyed items ran")
    assert (pack, "default") in svc.engine.claimer._flow


@pytest.mark.parametrize("control", [False, True], ids=["plain", "control-keys-ignored"])
async def test_an_executor_keeps_a_rate_limit_through_the_statement_switch(
    db, executor_factory, monkeypatch, control
) -> None:
    """An unlimited work type and a rate-limited one (1 per 60 s, burst 1, 3 keys) in one pack: the
    executor's first batches go through the plain statement, meet the keyed items, and switch the
    group to the flow statement. Exactly one item per key runs in the period; all unlimited ones run.
    The control (the plain statement ignoring keys) runs every keyed item at once; its discovery
    ignores them too, so that the group never switches (a discovery between the free items' claims
    had switched it first under load, and the control waited in vain)."""
    if control:
        keys_ignored = work_items.claim.FLOW_KEYED + " AS keyed", "false AS keyed"
        plain = work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH.replace(*keys_ignored)
        assert plain != work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH
        monkeypatch.setattr(work_items.claim, "WORK_ITEM_CLAIM_PLAIN_BATCH", plain)
        groups = work_items.claim.WORK_ITEM_READY_GROUPS.replace(*keys_ignored)
        assert groups != work_items.claim.WORK_ITEM_READY_GROUPS
        monkeypatch.setattr(work_items.claim, "WORK_ITEM_READY_GROUPS", groups)
    pack = seed.seed_pack(db, "p", WT)
    free = seed.seed_items(db, pack, 40)
    keys = [f"k{i % 3}" for i in range(30)]
    seed.seed_items(db, pack, 30, rate_keys=keys, rate_limit=(1, 60.0, 1))
    svc = await executor_factory(workers=8, claim_batch=16)

    def keyed_done() -> int:
        q = "SELECT count(*) FROM connector_work_item WHERE state = 'succeeded' AND rate_key IS NOT NULL"
        return db.execute(q).fetchone()[0]

    if control:
        await await_for(lambda: keyed_done() > 3, 30, "keyed items beyond the limit ran")
        return
    # Every keyed item beyond the first of its key was seen by the flow statement: deferred to its
    # key's budget (a minute away), no attempt.
    await await_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM connector_work_item WHERE rate_key IS NOT NULL AND state = 'pending'"
                " AND attempts = 0 AND run_after > now() + interval '30 seconds'"
            ).fetchone()[0]
            == 27
        ),
        30,
        "27 keyed items deferred",
    )
    await await_for(lambda: states(db).get("succeeded", 0) == len(free) + 3, 30, "the free items and 3 keyed")
    done = db.execute(
        "SELECT rate_key, count(*) FROM connector_work_item"
        " WHERE state = 'succeeded' AND rate_key IS NOT NULL GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert done == [("k0", 1), ("k1", 1), ("k2", 1)]
    assert svc.engine.stats["flow_switches"] >= 1
    assert (pack, "default") in svc.engine.claimer._flow


async def test_an_unlimited_pack_never_sends_the_flow_statement(db, executor_factory, monkeypatch) -> None:
    sent = {"flow": 0, "plain": 0}
    flow, plain = work_items.claim.work_item_claim_batch, work_items.claim.work_item_claim_plain_batch

    async def count_flow(*a, **kw):  # type: ignore[no-untyped-def]
        sent["flow"] += 1
        return await flow(*a, **kw)

    async def count_plain(*a, **kw):  # type: ignore[no-untyped-def]
        sent["plain"] += 1
        return await plain(*a, **kw)

    monkeypatch.setattr(work_items.claim, "work_item_claim_batch", count_flow)
    monkeypatch.setattr(work_items.claim, "work_item_claim_plain_batch", count_plain)
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 300)
    await executor_factory(workers=8, claim_batch=16)
    await await_for(lambda: states(db) == {"succeeded": 300}, 30, "all succeeded")
    assert sent["plain"] >= 300 // 16 and sent["flow"] == 0, sent


async def test_a_flow_group_is_looked_at_again_by_the_plain_statement(
    db, executor_factory, monkeypatch
) -> None:
    """The flow set is forgotten after ``FLOW_RECHECK_S``: once a group's keyed items are gone (its
    limits removed), its batches return to the plain statement."""
    monkeypatch.setattr(claimer_mod, "FLOW_RECHECK_S", 0.5)
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 2, rate_keys=["a", "b"], rate_limit=(100, 1.0, 100))
    svc = await executor_factory(workers=4, claim_batch=16)
    await await_for(lambda: states(db) == {"succeeded": 2}, 30, "the keyed items ran")
    assert svc.engine.stats["flow_switches"] >= 1 and svc.engine.claimer._flow
    until = svc.engine.claimer._flow_until
    await await_for(lambda: time.monotonic() > until, 10, "the recheck interval passed")
    seed.seed_items(db, pack, 50)
    await await_for(lambda: states(db) == {"succeeded": 52}, 30, "the unkeyed ones ran")
    assert not svc.engine.claimer._flow  # their claims went through the plain statement again


@pytest.mark.parametrize("control", [False, True], ids=["rate", "control-other-keys-ignored"])
async def test_the_rate_claim_judges_rate_keys_and_leaves_other_keys(db, adb, monkeypatch, control) -> None:
    """The rate statement (``WORK_ITEM_CLAIM_RATE_BATCH``: rate-limit keys only) claims the unlimited
    candidates and the rate-limited ones their budget admits, defers the others, and leaves a
    candidate with another flow key (here a concurrency key) untouched and counted for the flow
    statement. Control: with that check removed, both items of a 1-slot key are claimed."""
    if control:
        ignored = work_items.claim.WORK_ITEM_CLAIM_RATE_BATCH.replace(
            work_items.claim.FLOW_OTHER + " AS other", "false AS other"
        )
        assert ignored != work_items.claim.WORK_ITEM_CLAIM_RATE_BATCH
        monkeypatch.setattr(work_items.claim, "WORK_ITEM_CLAIM_RATE_BATCH", ignored)
    pack = seed.seed_pack(db, "p", WT)
    free = seed.seed_items(db, pack, 2)
    a1, a2, b = seed.seed_items(db, pack, 3, rate_keys=["a", "a", "b"], rate_limit=(1, 60.0, 1))
    slotted = seed.seed_items(db, pack, 2, concurrency_keys=["c", "c"], concurrency=1)
    held: dict = {}
    due: dict = {}
    keyed: dict = {}
    rows = await work_items.claim.work_item_claim_rate_batch(
        adb, [pack], ["default"], [20], owner="me", lease_s=30.0, held_back=held, due_in=due, keyed=keyed
    )
    got = sorted(r[0] for r in rows)
    if control:
        assert set(slotted) <= set(got)  # the concurrency limit of 1 is bypassed
        return
    assert got == sorted([*free, a1, b])
    assert held == {(pack, "default"): 1} and 55 < due[pack, "default"] <= 60
    assert keyed == {(pack, "default"): 2}
    assert _untouched(db, slotted) == [("pending", 0, 0)] * 2
    assert db.execute("SELECT sum(in_flight) FROM connector_concurrency_limit").fetchone()[0] == 0
    (a2_due,) = db.execute(
        "SELECT extract(epoch FROM run_after - now()) FROM connector_work_item WHERE work_id = %s", (a2,)
    ).fetchone()
    assert 55 < float(a2_due) <= 60  # deferred to its key's budget, no attempt
    # The flow statement then takes one slot of "c".
    rest = await work_items.claim.work_item_claim_batch(
        adb, [pack], ["default"], [20], owner="me", lease_s=30.0
    )
    assert [r[0] for r in rest] == slotted[:1]


async def test_a_rate_limited_pack_goes_through_the_rate_statement(db, executor_factory, monkeypatch) -> None:
    """Rate-limit keys only: the claimer sends the group through the rate statement, never the flow
    statement; a concurrency-keyed item arriving in the same group moves it to the flow statement."""
    sent = {"flow": 0, "rate": 0, "plain": 0, "circuit": 0}

    def counting(name, fn):  # type: ignore[no-untyped-def]
        async def call(*a, **kw):  # type: ignore[no-untyped-def]
            sent[name] += 1
            return await fn(*a, **kw)

        return call

    _wrap_claims(monkeypatch, counting)
    pack = seed.seed_pack(db, "p", WT)
    keys = [f"k{i % 10}" for i in range(200)]
    seed.seed_items(db, pack, 200, rate_keys=keys, rate_limit=(10_000, 1.0, 10_000))
    svc = await executor_factory(workers=8, claim_batch=16)
    await await_for(lambda: states(db) == {"succeeded": 200}, 30, "the rate-limited items ran")
    assert sent["rate"] >= 200 // 16 and sent["flow"] == 0, sent
    assert svc.engine.claimer._flow.get((pack, "default")) == claimer_mod.RATE
    seed.seed_items(db, pack, 20, concurrency_keys=["c"] * 20, concurrency=2)
    svc.engine.wake.set()
    await await_for(lambda: states(db) == {"succeeded": 220}, 30, "the concurrency-limited items ran")
    assert sent["flow"] >= 1
    assert svc.engine.claimer._flow.get((pack, "default")) == claimer_mod.FLOW
    assert db.execute("SELECT in_flight FROM connector_concurrency_limit").fetchall() == [(0,)]


async def test_a_keyed_group_keeps_its_statement_through_the_recheck(
    db, executor_factory, monkeypatch
) -> None:
    """The recheck forgets the flow set before every claim here (``FLOW_RECHECK_S = 0``); the groups
    discovery saw with a keyed first row keep their statement through it, so a pack of keyed items
    only is claimed through the rate statement and never sent a plain claim (which would take
    nothing from it and could not say why)."""
    monkeypatch.setattr(claimer_mod, "FLOW_RECHECK_S", 0.0)
    sent = {"plain": 0}
    plain = work_items.claim.work_item_claim_plain_batch

    async def counting(*a, **kw):  # type: ignore[no-untyped-def]
        sent["plain"] += 1
        return await plain(*a, **kw)

    monkeypatch.setattr(work_items.claim, "work_item_claim_plain_batch", counting)
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 40, rate_keys=[f"k{i % 4}" for i in range(40)], rate_limit=(1000, 1.0, 1000))
    await executor_factory(workers=8, claim_batch=8)
    await await_for(lambda: states(db) == {"succeeded": 40}, 30, "the keyed items ran")
    assert sent["plain"] == 0


@pytest.mark.parametrize("control", [False, True], ids=["generic", "control-server-mode"])
async def test_the_plain_and_rate_claims_run_generic_plans_and_the_flow_claim_custom_ones(
    db, executor_factory, monkeypatch, control
) -> None:
    """The claimer has PostgreSQL plan its plain and rate statements by their generic plan (left
    alone, it custom-plans every execution) and its flow statement as the server is configured
    (``work_items.claim.CLAIM_PLANS``). Each claim the executor sends is wrapped to read, on its own
    connection, the plan mode it ran under and the prepared statement's plan counts. Control: with
    the generic mode replaced by the server's, the plain and rate claims are custom-planned."""
    if control:
        monkeypatch.setitem(work_items.claim.CLAIM_PLANS, True, work_items.claim.CLAIM_PLANS[False])
    seen: dict[str, set[tuple[str, bool]]] = {"plain": set(), "rate": set(), "flow": set(), "circuit": set()}
    marks = {"plain": "NOT c.keyed", "rate": "NOT c.other", "flow": "cranked AS", "circuit": "FROM lft l"}

    def watching(name, fn):  # type: ignore[no-untyped-def]
        async def call(conn, *a, **kw):  # type: ignore[no-untyped-def]
            rows = await fn(conn, *a, **kw)
            mode = (await (await conn.execute("SHOW plan_cache_mode")).fetchone())[0]
            cur = await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                (f"%{marks[name]}%",),
            )
            for generic, custom in await cur.fetchall():
                seen[name].add((mode, generic > 0 and custom == 0))
            return rows

        return call

    _wrap_claims(monkeypatch, watching)
    default = db.execute("SHOW plan_cache_mode").fetchone()[0]
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 64)
    seed.seed_items(
        db, pack, 64, rate_keys=[f"k{i % 8}" for i in range(64)], rate_limit=(10_000, 1.0, 10_000)
    )
    await executor_factory(workers=4, claim_batch=8)
    await await_for(lambda: states(db) == {"succeeded": 128}, 30, "the unkeyed and rate-keyed items ran")
    seed.seed_items(db, pack, 16, concurrency_keys=[f"c{i % 4}" for i in range(16)], concurrency=2)
    await await_for(lambda: states(db) == {"succeeded": 144}, 30, "the concurrency-keyed items ran")
    assert seen["flow"] == {(default, False)}, seen
    if control:
        assert seen["plain"] == {(default, False)} and seen["rate"] == {(default, False)}, seen
        return
    assert seen["plain"] == {("force_generic_plan", True)}, seen
    assert seen["rate"] == {("force_generic_plan", True)}, seen


@pytest.mark.parametrize("control", [False, True], ids=["circuit", "control-circuit-needs-flow"])
async def test_a_closed_breaker_is_claimed_through_the_circuit_statement(
    db, executor_factory, monkeypatch, control
) -> None:
    """Circuit breakers' keys only (docs/adr/013-circuit-breakers.md, "Closed circuits on the plain
    path"): while the circuit is closed the claimer sends the group through the circuit statement
    (by its generic plan), never the flow statement. Once the circuit is open, the circuit
    statement leaves its items and the flow statement defers them without an attempt. Control:
    with a circuit's candidates reported as needing the flow statement (the level before the
    circuit statement existed), the flow statement claims them."""
    sent = {"flow": 0, "rate": 0, "plain": 0, "circuit": 0}
    modes: set[str] = set()

    def counting(name, fn):  # type: ignore[no-untyped-def]
        async def call(conn, *a, **kw):  # type: ignore[no-untyped-def]
            sent[name] += 1
            rows = await fn(conn, *a, **kw)
            if name == "circuit":
                modes.add((await (await conn.execute("SHOW plan_cache_mode")).fetchone())[0])
            return rows

        return call

    _wrap_claims(monkeypatch, counting)
    if control:
        need = f"THEN {work_items.claim.CIRCUIT} ELSE"
        for name in ("WORK_ITEM_READY_GROUPS", "WORK_ITEM_CLAIM_PLAIN_BATCH"):
            stmt = getattr(work_items.claim, name)
            assert need in stmt
            monkeypatch.setattr(
                work_items.claim, name, stmt.replace(need, f"THEN {work_items.claim.FLOW} ELSE")
            )
    pack = seed.seed_pack(db, "p", WT)
    pol = {"consecutive_failures": 5, "open_s": 60}
    seed.seed_items(db, pack, 200, circuit_keys=["https://t:443"] * 200, circuit=pol)
    svc = await executor_factory(workers=8, claim_batch=16)
    await await_for(lambda: states(db) == {"succeeded": 200}, 30, "the breaker's items ran")
    if control:
        assert sent["flow"] >= 200 // 16 and sent["circuit"] == 0, sent
        return
    assert sent["circuit"] >= 200 // 16 and sent["flow"] == 0, sent
    assert modes == {"force_generic_plan"}
    assert svc.engine.claimer._flow.get((pack, "default")) == claimer_mod.CIRCUIT
    db.execute("UPDATE connector_circuit SET state = 'open', forced = true, reason = 'manual_open'")
    waiting = seed.seed_items(db, pack, 8, circuit_keys=["https://t:443"] * 8, circuit=pol)
    svc.engine.wake.set()
    await await_for(
        lambda: sent["flow"] >= 1, 30, f"the open circuit's items went to the flow statement {sent}"
    )
    await await_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%s) AND state = 'pending'"
                " AND attempts = 0 AND run_after > now() + interval '30 seconds'",
                (waiting,),
            ).fetchone()[0]
            == 8
        ),
        30,
        "8 items deferred without an attempt",
    )
