"""EXPLAIN ANALYZE of the rate-limit statements (docs/adr/011-rate-limits.md) at 1M ready rows.

Half the ready rows carry one of 20,000 rate-limit keys, a quarter one of 20,000 concurrency keys (a
key row each; some of their members parked or processing). The claim statement must
read the ready index for its window, find the window's key rows by primary key (one probe per
distinct key, never the key table), update the deferred candidates and the key rows by key, and
stay within a bounded number of buffers, with keys that bind (candidates deferred) and keys that
do not. The materializer's key declaration and the per-key stats read are index probes too. Both
plan-cache modes (DESIGN §8 trap 5). Control: the stats read without the per-key index scans the
table (so the scan check can fail).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from connector.common.core import testdb
from connector.common.store import circuits, flow, work_items
from tests.executor import seed
from tests.plans import explain_in_rollback, positional, subplan

pytestmark = pytest.mark.slow

READY = 1_000_000
KEYS = 20_000
CIRCUITS = 20_000  # as many as keys: the plans must probe by key at any table size
# Key rows: the 20,000 the ready rows use and as many again more idle ones (keys seen earlier). On a key
# table of a few hundred pages a seq scan is what the planner rightly picks for 100 keys, and
# whether it did depended on earlier tests' rolled-back updates having grown the table.
KEY_ROWS = 200_000
CLAIM = {"queue_classes": ["default"], "limits": [64], "owner": "o", "lease_s": 30.0, "process": None}


@pytest.fixture(scope="module")
def big() -> Iterator[tuple[psycopg.Connection, int]]:
    with seed.detached_queue() as (db, pack):
        db.execute(
            """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type,
                 queue_class, state, delivery_seq, run_after, rate_key, concurrency_key, circuit_key)
               SELECT i, %s, 1, 'w', 'default', 'pending', i, now() - make_interval(secs => 60),
                 CASE WHEN i %% 2 = 0 THEN 'k' || (i %% %s) END,
                 CASE WHEN i %% 4 = 1 THEN 'c' || (i %% %s) END,
                 CASE WHEN i %% 8 = 3 THEN 'https://t' || (i %% %s) || ':443' END
               FROM generate_series(1, %s) i""",
            (pack, KEYS, KEYS, CIRCUITS, READY),
        )
        # Circuit breakers (docs/adr/013-circuit-breakers.md) on an eighth of the rows, closed.
        db.execute(
            """INSERT INTO connector_circuit (installed_pack_id, circuit_key, work_type,
                 consecutive_failures, window_s, min_outcomes, open_s, half_open_probes)
               SELECT %s, 'https://t' || i || ':443', 'w', 5, 60, 20, 30, 1
               FROM generate_series(0, %s - 1) i""",
            (pack, CIRCUITS),
        )
        db.execute(
            """INSERT INTO connector_rate_limit
                 (installed_pack_id, rate_key, work_type, limit_n, period_s, burst)
               SELECT %s, 'k' || i, 'w', 1000, 1, 1000 FROM generate_series(0, %s - 1) i""",
            (pack, KEY_ROWS),
        )
        db.execute(
            """INSERT INTO connector_concurrency_limit
                 (installed_pack_id, concurrency_key, work_type, max_in_flight)
               SELECT %s, 'c' || i, 'w', 1000 FROM generate_series(0, %s - 1) i""",
            (pack, KEY_ROWS),
        )
        # Parked and processing members of the concurrency keys (what release, wake and the check
        # read), at the end of the id range (outside the claim's window).
        db.execute(
            """UPDATE connector_work_item SET run_after = '9999-01-01 00:00:00+00'
               WHERE concurrency_key IS NOT NULL AND work_id > %s - 40000""",
            (READY,),
        )
        db.execute(
            """UPDATE connector_work_item SET state = 'processing', lease_owner = 'x', lease_token = 1,
                 lease_until = now() + interval '1 h'
               WHERE concurrency_key IS NOT NULL AND work_id BETWEEN %s - 80000 AND %s - 40001""",
            (READY, READY),
        )
        db.execute("VACUUM ANALYZE connector_work_item")
        db.execute("VACUUM ANALYZE connector_rate_limit")
        db.execute("VACUUM ANALYZE connector_concurrency_limit")
        db.execute("VACUUM ANALYZE connector_circuit")
        yield db, pack


def _seq_scans(nodes: list[dict[str, Any]]) -> list[str]:
    return [n.get("Relation Name", "?") for n in nodes if n["Node Type"] == "Seq Scan"]


def _buffers(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"] + node.get("Shared Read Blocks", 0))


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("binding", [False, True])
def test_claim_with_rate_limited_candidates(big, mode, binding) -> None:
    db, pack = big
    # Binding: every key's budget is spent for the next hour (its candidates are deferred) and every
    # concurrency key is full (its candidates are parked).
    setup = (
        (
            "UPDATE connector_rate_limit SET tat = now() + interval '1 hour'",
            "UPDATE connector_concurrency_limit SET in_flight = max_in_flight",
        )
        if binding
        else ()
    )
    nodes = explain_in_rollback(
        db, work_items.claim.WORK_ITEM_CLAIM_BATCH, {**CLAIM, "packs": [pack]}, mode, setup
    )
    assert not _seq_scans(nodes), _seq_scans(nodes)
    ready = [n for n in nodes if n.get("Index Name") == "ix_connector_work_item_ready"]
    assert len(ready) == 1 and ready[0]["Actual Rows"] == 64
    for pk in ("pk_connector_rate_limit", "pk_connector_concurrency_limit"):
        keys = [n for n in nodes if n.get("Index Name") == pk]
        assert keys and all(n["Actual Rows"] <= 64 for n in keys), pk
    claimed = subplan(nodes, "CTE claimed")
    deferred = subplan(nodes, "CTE deferred")
    parked = subplan(nodes, "CTE parked")
    if binding:
        # The window: 32 rate-limited (deferred), 16 concurrency-limited (parked), 16 unlimited (8
        # of them behind a closed circuit breaker).
        assert claimed[0]["Actual Rows"] == 16
        assert any(
            n.get("Index Name") == "pk_connector_work_item" and n["Actual Rows"] == 32 for n in deferred
        )
        assert any(n.get("Index Name") == "pk_connector_work_item" and n["Actual Rows"] == 16 for n in parked)
    else:
        assert claimed[0]["Actual Rows"] == 64
    assert _buffers(nodes[0]) < 6000  # the window's rows and their index entries, not the table


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("binding", [False, True])
def test_rate_claim_with_rate_limited_candidates(big, mode, binding) -> None:
    """The rate statement (``WORK_ITEM_CLAIM_RATE_BATCH``) on the same window of 64: it judges the 32
    rate-limited candidates by their key rows (primary-key probes), claims the 8 unlimited ones and
    leaves the 24 with concurrency or circuit keys untouched, counted for the flow statement."""
    db, pack = big
    setup = ("UPDATE connector_rate_limit SET tat = now() + interval '1 hour'",) if binding else ()
    query = work_items.claim.WORK_ITEM_CLAIM_RATE_BATCH
    nodes = explain_in_rollback(db, query, {**CLAIM, "packs": [pack]}, mode, setup)
    assert not _seq_scans(nodes), _seq_scans(nodes)
    ready = [n for n in nodes if n.get("Index Name") == "ix_connector_work_item_ready"]
    assert len(ready) == 1 and ready[0]["Actual Rows"] == 64
    keys = [n for n in nodes if n.get("Index Name") == "pk_connector_rate_limit"]
    assert keys and all(n["Actual Rows"] <= 64 for n in keys)
    assert not any(
        n.get("Relation Name") in ("connector_concurrency_limit", "connector_circuit") for n in nodes
    )
    claimed = subplan(nodes, "CTE claimed")
    assert claimed[0]["Actual Rows"] == (8 if binding else 40)
    if binding:
        deferred = subplan(nodes, "CTE deferred")
        assert any(
            n.get("Index Name") == "pk_connector_work_item" and n["Actual Rows"] == 32 for n in deferred
        )
    with db.transaction(force_rollback=True):
        for stmt in setup:
            db.execute(stmt)
        rows = db.execute(query, {**CLAIM, "packs": [pack]}).fetchall()
    counts = {r[5]: r[1] for r in rows if r[0] is None}
    assert counts == ({"keyed": 24, "limit": 32} if binding else {"keyed": 24})
    assert _buffers(nodes[0]) < 6000


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("state", ["open", "half_open"])
def test_claim_with_circuits_open_or_probing(big, mode, state) -> None:
    """Every circuit open (its 8 candidates of the window deferred by primary key) or half-open (one
    probe each admitted and recorded on its circuit row by primary key): the circuit rows are
    probed by primary key, never scanned."""
    db, pack = big
    setup = (
        "UPDATE connector_circuit SET state = 'open', open_until = now() + interval '1 hour'"
        if state == "open"
        else "UPDATE connector_circuit SET state = 'half_open', open_until = now()",
    )
    nodes = explain_in_rollback(
        db, work_items.claim.WORK_ITEM_CLAIM_BATCH, {**CLAIM, "packs": [pack]}, mode, setup
    )
    assert not _seq_scans(nodes), _seq_scans(nodes)
    keys = [n for n in nodes if n.get("Index Name") == "pk_connector_circuit"]
    assert keys and all(n["Actual Rows"] <= 64 for n in keys)
    claimed = subplan(nodes, "CTE claimed")
    if state == "open":
        assert claimed[0]["Actual Rows"] == 56
        deferred = subplan(nodes, "CTE circ_deferred")
        assert any(
            n.get("Index Name") == "pk_connector_work_item" and n["Actual Rows"] == 8 for n in deferred
        )
    else:
        assert claimed[0]["Actual Rows"] == 64  # 8 distinct circuits in the window: one probe each
        probe = subplan(nodes, "CTE circ_probe")
        assert probe[0]["Actual Rows"] == 0 and any(
            n.get("Index Name") == "pk_connector_circuit" for n in probe
        )
    assert _buffers(nodes[0]) < 6000


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("state", ["closed", "open"])
def test_circuit_claim_probes_circuits_by_key(big, mode, state) -> None:
    """The circuit statement (closed circuits on the plain path, ``WORK_ITEM_CLAIM_CIRCUIT_BATCH``) on
    the window of 64: one read of the ready index; the 8 distinct circuits of the window's 8
    circuit-only candidates probed (and locked ``KEY SHARE``) by primary key; claimed: the 8 unkeyed
    candidates and, while the circuits are closed, those 8. The 48 others (rate or concurrency keys)
    are left untouched. Open circuits: no probe returns a row, only the unkeyed 8 are claimed."""
    db, pack = big
    setup = (
        ("UPDATE connector_circuit SET state = 'open', open_until = now() + interval '1 hour'",)
        if state == "open"
        else ()
    )
    query = work_items.claim.WORK_ITEM_CLAIM_CIRCUIT_BATCH
    nodes = explain_in_rollback(db, query, {**CLAIM, "packs": [pack]}, mode, setup)
    assert not _seq_scans(nodes), _seq_scans(nodes)
    ready = [n for n in nodes if n.get("Index Name") == "ix_connector_work_item_ready"]
    assert len(ready) == 1 and ready[0]["Actual Rows"] == 64
    keys = [n for n in nodes if n.get("Index Name") == "pk_connector_circuit"]
    assert len(keys) == 1 and keys[0]["Actual Loops"] == 8
    assert keys[0]["Actual Rows"] == (1 if state == "closed" else 0)  # per loop
    assert not any(
        n.get("Relation Name") in ("connector_rate_limit", "connector_concurrency_limit") for n in nodes
    )
    assert nodes[0]["Node Type"] == "ModifyTable" and nodes[0]["Actual Rows"] == (
        16 if state == "closed" else 8
    )
    assert _buffers(nodes[0]) < 6000


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_key_declaration_and_stats_probe_by_key(big, mode) -> None:
    db, pack = big
    keys = [f"k{i}" for i in range(0, 200, 2)] + ["new1", "new2"]
    params = {
        "packs": [pack] * len(keys),
        "keys": sorted(keys),
        "work_types": ["w"] * len(keys),
        "limits": [1000] * len(keys),
        "periods": [1.0] * len(keys),
        "bursts": [1000] * len(keys),
    }
    nodes = explain_in_rollback(db, flow.RATE_LIMIT_DECLARE, params, mode)
    assert not _seq_scans(nodes), _seq_scans(nodes)
    assert _buffers(nodes[0]) < 2000
    nodes = explain_in_rollback(db, flow.RATE_LIMIT_STATS, {"pack": pack, "limit": 50}, mode)
    assert not _seq_scans(nodes), _seq_scans(nodes)
    assert any(n.get("Index Name") == "ix_connector_work_item_rate_key" for n in nodes)
    assert _buffers(nodes[0]) < 5000


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_slot_release_wake_check_and_stats_probe_by_key(big, mode) -> None:
    db, pack = big
    keys = sorted(f"c{i}" for i in range(1, 400, 4))
    arrays = {"packs": [pack] * len(keys), "keys": keys}
    for query, params, bound in (
        (flow.SLOTS_RELEASE, {**arrays, "ns": [1] * len(keys)}, 3000),
        (flow.SLOTS_WAKE, {**arrays, "ns": [1] * len(keys)}, 6000),
        (flow.CONCURRENCY_CHECK_LOCK, {"after_pack": -1, "after_key": "", "limit": 100}, 2000),
        (flow.CONCURRENCY_CHECK_FIX, arrays, 30_000),
        (flow.CONCURRENCY_STATS, {"pack": pack, "limit": 50}, 10_000),
        (work_items.finalize.WORK_ITEM_RECLAIM_CANDIDATES, {"limit": 500}, 3000),
        (work_items.claim.WORK_ITEM_READY_GROUPS, {}, 200),
    ):
        nodes = explain_in_rollback(db, query, params, mode)
        assert not _seq_scans(nodes), (query[:60], _seq_scans(nodes))
        assert _buffers(nodes[0]) < bound, (query[:60], _buffers(nodes[0]))
    nodes = explain_in_rollback(db, flow.SLOTS_WAKE, {**arrays, "ns": [1] * len(keys)}, mode)
    [probe] = [n for n in nodes if n.get("Index Name") == "ix_connector_work_item_concurrency_parked"]
    assert probe["Actual Loops"] == len(keys) and probe["Actual Rows"] == 1  # one parked item per key


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_idle_key_retirement_probes_by_key(big, mode) -> None:
    """A page of 500 keys of each table, each checked by one probe of its per-key index (every key
    here still has ready items: nothing is deleted); never the WorkItem table."""
    db, _pack = big
    params = {"after_pack": -1, "after_key": "", "limit": 500, "idle_s": 0.0}
    for query, index in (
        (flow.RATE_LIMIT_RETIRE, "ix_connector_work_item_rate_key"),
        (flow.CONCURRENCY_RETIRE, "ix_connector_work_item_concurrency_key"),
    ):
        nodes = explain_in_rollback(db, query, params, mode)
        assert not _seq_scans(nodes), (query[:60], _seq_scans(nodes))
        [probe] = [n for n in nodes if n.get("Index Name") == index]
        assert probe["Actual Loops"] <= 500 and probe["Actual Rows"] <= 500, probe
        assert _buffers(nodes[0]) < 10_000, (query[:60], _buffers(nodes[0]))  # ~10 per key of the page


def test_control_stats_without_the_key_index_scan_the_table(big) -> None:
    db, pack = big
    setup = ("DROP INDEX ix_connector_work_item_rate_key",)
    nodes = explain_in_rollback(
        db, flow.RATE_LIMIT_STATS, {"pack": pack, "limit": 50}, "force_custom_plan", setup
    )
    assert _buffers(nodes[0]) > 20_000 or _seq_scans(nodes)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_circuit_feed_open_and_stats_probe_by_key(big, mode) -> None:
    """The finalize feed, the trip and the declaration of 100 circuits, and the per-circuit stats:
    primary-key probes of the circuit rows and index reads of the circuit's WorkItems."""
    db, pack = big
    keys = sorted(f"https://t{i}:443" for i in range(0, 100))
    n = len(keys)
    feed = {
        "packs": [pack] * n,
        "keys": keys,
        "lead": [1] * n,
        "inner": [0] * n,
        "trail": [0] * n,
        "succ": [0] * n,
        "fail": [1] * n,
        "done": list(range(1, n + 1)),
        "succeeded": [],
        "failed": list(range(1, n + 1)),
    }
    declare = {
        "packs": [pack] * n,
        "keys": keys,
        "work_types": ["w"] * n,
        "cons": [5] * n,
        "ratios": [None] * n,
        "windows": [60.0] * n,
        "mins": [20] * n,
        "opens": [30.0] * n,
        "probes": [1] * n,
    }
    db.execute("VACUUM connector_circuit")  # the claim plans' rolled-back updates of every circuit
    for query, params, bound in (
        (circuits.CIRCUIT_RECORD, feed, 3000),
        (circuits.CIRCUIT_OPEN, {"packs": [pack] * n, "keys": keys}, 3000),
        (circuits.CIRCUIT_DECLARE, declare, 3000),
        (
            circuits.CIRCUIT_STATS.format(where="k.installed_pack_id = %(pack)s"),
            {"pack": pack, "limit": 50},
            10_000,
        ),
    ):
        nodes = explain_in_rollback(db, query, params, mode)
        # The pack names (one row per installed pack) may be hashed whole; nothing else is scanned.
        scans = [r for r in _seq_scans(nodes) if r != "connector_installed_pack"]
        assert not scans, (query[:60], scans)
        assert _buffers(nodes[0]) < bound, (query[:60], _buffers(nodes[0]))


def _plan_cost(db, query: str, params: dict[str, Any]) -> float:
    body, order = positional(query)
    db.execute("SET plan_cache_mode = force_generic_plan")
    try:
        db.execute(f"PREPARE cost_q AS {body}")
        args = sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
        row = db.execute(sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE cost_q({})").format(args)).fetchone()
    finally:
        db.execute("DEALLOCATE ALL")
    assert row is not None
    return float(row[0][0]["Plan"]["Total Cost"])


def test_the_circuit_gate_keeps_the_flow_statement_plan_cost() -> None:
    """The gate must not inflate the planner's row estimates: a first version joined the candidates
    with their verdicts, estimated ~1M rows for a window of 256 and raised the generic plan's cost
    from 41k to 2M — over jit_above_cost, so every flow claim paid ~2.5 s of JIT compilation
    (docs/benchmarks.md, "Circuit breakers"). On a 20k backlog the statement with the gate costs at
    most 2.5x the one without it (1.7x before session 7 made the rest of the statement cheaper to
    estimate: the gate's own share was ~10k in both), and stays well below ``jit_above_cost``;
    control: the join version is far above both."""
    stmt = work_items.claim.WORK_ITEM_CLAIM_BATCH
    without = (
        stmt.replace(work_items.claim.CIRCUIT_GATE, "\n), cand AS (SELECT * FROM cand_all")
        .replace(work_items.claim.CIRCUIT_PROBES + "\n)", "")
        .replace(
            "\n      UNION ALL SELECT v.pack, v.qc, v.due, 'limit' FROM circ_verdict v WHERE NOT v.ok", ""
        )
    )
    filt = (
        "  WHERE c.circuit_key IS NULL"
        " OR c.work_id = ANY (ARRAY(SELECT v.work_id FROM circ_verdict v WHERE v.ok))"
    )
    assert without != stmt and filt in stmt
    joined = stmt.replace(
        filt,
        "  WHERE c.circuit_key IS NULL\n  UNION ALL\n  SELECT c.work_id, c.pack, c.qc, "
        + work_items.claim._FLOW_OUT
        + "\n  FROM cand_all c JOIN circ_verdict v ON v.work_id = c.work_id WHERE v.ok",
    )
    with testdb.fresh_database() as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "p", {"w": seed.python_work_type("tests.executor.effects:noop")})
        seed.seed_items(db, pack, 20_000)
        db.execute("VACUUM ANALYZE connector_work_item")
        params = {**CLAIM, "packs": [pack]}
        base, gated, control = (_plan_cost(db, q, params) for q in (without, stmt, joined))
        jit_above = float(db.execute("SHOW jit_above_cost").fetchone()[0])
    assert gated <= 2.5 * base and gated < jit_above / 2, (gated, base, jit_above)
    assert control > 10 * base and control > jit_above, (control, base, jit_above)  # the check can fail
