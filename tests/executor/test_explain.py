"""EXPLAIN of every hot-path statement with a 100k-item backlog (STYLE.md: a test asserts the plan).

Each statement is PREPAREd exactly as the executor sends it and EXPLAIN ANALYZEd (inside a rolled
back transaction) under both plan-cache modes: the custom plan of the first executions and the
generic plan a prepared statement switches to later (DESIGN §8 trap 5). Expected: index scans of
the WorkItem indexes and primary-key CAS; never a sequential scan of ``connector_work_item``, and
the claim path never reads ``connector_event`` at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from connector.common.core import testdb
from connector.common.store import work_items
from connector.common.store.lanes import LANE_LOCK_BATCH, LANE_SETTLE_BATCH
from connector.common.store.work_items.finalize import LANE_HANDOFF_BATCH
from tests.executor import seed
from tests.plans import (
    assert_update_reads_by_key,
    claim_plans_on_idle_statistics,
    claimed_update,
    positional,
)

pytestmark = pytest.mark.slow

BACKLOG = 100_000
BY_ID = "pk_connector_work_item|ix_connector_work_item_processing"
CHURN = 20_000


def _prepare(db: psycopg.Connection, name: str, query: str) -> list[str]:
    body, order = positional(query)
    db.execute(f"PREPARE {name} AS {body}")
    return order


def _explain(db: psycopg.Connection, name: str, query: str, params: dict[str, Any], mode: str) -> str:
    db.execute(f"SET plan_cache_mode = {mode}")
    with db.transaction(force_rollback=True):
        order = _prepare(db, name, query)
        args = sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
        call = sql.SQL("{}({})").format(sql.Identifier(name), args) if order else sql.Identifier(name)
        rows = db.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE {}").format(call)).fetchall()
    db.execute(f"DEALLOCATE {name}")
    return "\n".join(r[0] for r in rows)


@pytest.fixture(scope="module")
def explain_db() -> Iterator[tuple[psycopg.Connection, dict[str, Any]]]:
    """One 100k-backlog database for the module: every EXPLAIN ANALYZE runs in a rolled-back
    transaction, so the tests cannot change it for each other."""
    with testdb.fresh_database() as url, psycopg.connect(url, autocommit=True) as conn:
        yield conn, _seed_backlog(conn)


@pytest.fixture
def db(explain_db: tuple[psycopg.Connection, dict[str, Any]]) -> psycopg.Connection:
    return explain_db[0]


@pytest.fixture
def backlog(explain_db: tuple[psycopg.Connection, dict[str, Any]]) -> dict[str, Any]:
    return explain_db[1]


def _seed_backlog(db: psycopg.Connection) -> dict[str, Any]:
    pack = seed.seed_pack(db, "p", {"w": seed.python_work_type("tests.executor.effects:noop")})
    seed.seed_items(db, pack, BACKLOG)
    lane_ids = seed.seed_items(
        db,
        pack,
        2000,
        source_lanes=[f"s{i % 100}" for i in range(2000)],
        target_lanes=[f"t{i % 50}" for i in range(2000)],
    )
    claimed = db.execute(
        "UPDATE connector_work_item SET state = 'processing', lease_owner = 'x', lease_token = 1, "
        "lease_until = now() - interval '1 s' WHERE work_id IN "
        "(SELECT work_id FROM connector_work_item WHERE state = 'pending' ORDER BY work_id LIMIT 64) "
        "RETURNING work_id, lease_token"
    ).fetchall()
    db.execute("VACUUM ANALYZE connector_work_item")
    db.execute("VACUUM ANALYZE connector_event")
    db.execute("VACUUM ANALYZE connector_ingress_receipt")
    return {
        "pack": pack,
        "ids": sorted(r[0] for r in claimed),
        "tokens": [1] * len(claimed),
        "event_ids": [r[0] for r in db.execute("SELECT event_id FROM connector_work_item LIMIT 64")],
        "lane_ids": lane_ids,
    }


def _scans(plan: str) -> list[str]:
    return re.findall(
        r"((?:Index Only Scan|Index Scan|Seq Scan|Bitmap Heap Scan|Bitmap Index Scan)[^\n(]*)", plan
    )


def _check(plan: str, must_use: set[str], *, event_ok: bool = False) -> None:
    scans = _scans(plan)
    assert not [s for s in scans if s.startswith("Seq Scan on connector_work_item")], plan
    assert not [s for s in scans if "Seq Scan on connector_event" in s], plan
    if not event_ok:
        assert "connector_event" not in plan, plan
    used = {m for s in scans for m in re.findall(r"using (\w+)", s)}
    # "a|b": either index serves (the planner may prefer the small partial processing index to the
    # primary key for a by-id update of processing rows; both lead with work_id, so both are exact
    # lookups of the given ids: test_by_id_statements_ignore_dead_processing_entries).
    for need in must_use:
        assert used & set(need.split("|")), f"expected {need}, plan used {used}:\n{plan}"


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_hot_path_plans(db, backlog, mode) -> None:
    b = backlog
    n = len(b["ids"])
    cases: list[tuple[str, str, dict[str, Any], set[str], bool]] = [
        (
            "claim",
            work_items.claim.WORK_ITEM_CLAIM_BATCH,
            {
                "packs": [b["pack"]],
                "queue_classes": ["default"],
                "limits": [64],
                "owner": "o",
                "lease_s": 30.0,
                "process": None,
            },
            {"ix_connector_work_item_ready", "pk_connector_work_item"},
            False,
        ),
        (
            "claim_plain",
            work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH,
            {
                "packs": [b["pack"]],
                "queue_classes": ["default"],
                "limits": [64],
                "owner": "o",
                "lease_s": 30.0,
                "process": None,
            },
            {"ix_connector_work_item_ready", "pk_connector_work_item"},
            False,
        ),
        (
            "claim_circuit",
            work_items.claim.WORK_ITEM_CLAIM_CIRCUIT_BATCH,
            {
                "packs": [b["pack"]],
                "queue_classes": ["default"],
                "limits": [64],
                "owner": "o",
                "lease_s": 30.0,
                "process": None,
            },
            {"ix_connector_work_item_ready", "pk_connector_work_item"},
            False,
        ),
        (
            "renew",
            work_items.finalize.WORK_ITEM_RENEW_LEASE_BATCH,
            {"ids": b["ids"], "tokens": b["tokens"], "lease_s": 30.0},
            {BY_ID},
            False,
        ),
        (
            "complete",
            work_items.finalize.WORK_ITEM_COMPLETE_BATCH,
            {"ids": b["ids"], "tokens": b["tokens"]},
            {BY_ID},
            False,
        ),
        (
            "fail",
            work_items.finalize.WORK_ITEM_FAIL_BATCH,
            {
                "ids": b["ids"],
                "tokens": b["tokens"],
                "ops": ["r"] * n,
                "delays": [1.0] * n,
                "unstarted": [0] * n,
                "classes": ["c"] * n,
                "summaries": ["s"] * n,
            },
            {BY_ID},
            False,
        ),
        (
            "reclaim_candidates",
            work_items.finalize.WORK_ITEM_RECLAIM_CANDIDATES,
            {"limit": 500},
            {"ix_connector_work_item_processing"},
            False,
        ),
        (
            "reclaim",
            work_items.finalize.WORK_ITEM_RECLAIM_EXPIRED,
            {"ids": b["ids"], "tokens": b["tokens"], "packs": [b["pack"]]},
            {BY_ID},
            False,
        ),
        (
            "ready_groups",
            work_items.claim.WORK_ITEM_READY_GROUPS,
            {},
            {"ix_connector_work_item_ready"},
            False,
        ),
        (
            "events",
            work_items.claim.WORK_ITEM_EVENT_BATCH,
            {"ids": b["event_ids"]},
            {"pk_connector_event", "pk_connector_ingress_receipt"},
            True,
        ),
    ]
    for name, query, params, must_use, event_ok in cases:
        plan = _explain(db, name, query, params, mode)
        _check(plan, must_use, event_ok=event_ok)
        if name in ("claim", "claim_plain"):
            hits = sum(int(x) for x in re.findall(r"shared hit=(\d+)", plan.splitlines()[1]))
            assert "rows=64" in plan.splitlines()[0] and hits < 3000, plan


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_lane_statements_use_lane_indexes(db, backlog, mode) -> None:
    lanes = sorted(
        {(backlog["pack"], "s", f"s{i}") for i in range(100)}
        | {(backlog["pack"], "t", f"t{i}") for i in range(50)}
    )
    params = {"packs": [x[0] for x in lanes], "kinds": [x[1] for x in lanes], "keys": [x[2] for x in lanes]}
    plan = _explain(db, "lane_lock", LANE_LOCK_BATCH, params, mode)
    _check(plan, {"ix_connector_work_item_source_lane", "ix_connector_work_item_target_lane"})
    plan = _explain(
        db, "lane_settle", LANE_SETTLE_BATCH, {**params, "idle": [False] * len(lanes), "demote": False}, mode
    )
    _check(plan, {"ix_connector_work_item_source_lane", "ix_connector_work_item_target_lane"})
    # The finalize's handoff (ADR 022): the same heads read; no seq scan of the work items.
    handoff = {
        **params,
        "idle": [True] * len(lanes),
        "handoff": 64,
        "owner": "o",
        "lease_s": 30.0,
        "process": None,
    }
    plan = _explain(db, "lane_handoff", LANE_HANDOFF_BATCH, handoff, mode)
    _check(plan, {"ix_connector_work_item_source_lane", "ix_connector_work_item_target_lane"})


def _scan_buffers(plan: str) -> list[tuple[str, int]]:
    """(scan line, shared buffers of that node) for every scan node of ``connector_work_item``."""
    lines = plan.splitlines()
    out = []
    for i, line in enumerate(lines):
        if re.search(
            r"(Index Scan|Index Only Scan|Bitmap Index Scan) using \w+ on connector_work_item", line
        ) or ("Bitmap Index Scan on" in line):
            hits = 0
            for nxt in lines[i + 1 : i + 4]:
                m = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", nxt)
                if m:
                    hits = int(m.group(1)) + int(m.group(2) or 0)
                    break
            out.append((line.strip(), hits))
    return out


def test_by_id_statements_ignore_dead_processing_entries() -> None:
    """Between two vacuums every finished item leaves a dead entry in the partial processing index
    (and in every index on state). A fenced by-id statement must look its ids up (cost per id), not
    walk an index (cost per item finished since the last vacuum). In end-to-end runs without vacuum
    the complete statement's generic plan, built by the executor while the table was nearly empty
    and kept for the life of its connection, walked the processing index (then led by
    installed_pack_id) and went from 3.5 to 10 ms as the index filled.

    Each statement is first executed on a nearly empty, never analyzed table, as the executor sends
    it: prepared (``BY_ID_PREPARE``) under plan_cache_mode ``force_generic_plan`` so that the plan
    made there is the one kept, or unprepared (a custom plan per execution). Then 20k items are
    churned through processing to succeeded without vacuum and the statement is executed again."""
    with testdb.fresh_database() as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "p", {"w": seed.python_work_type("tests.executor.effects:noop")})
        seed.seed_items(db, pack, 64)
        ids = sorted(
            r[0]
            for r in db.execute(
                "UPDATE connector_work_item SET state = 'processing', lease_owner = 'x', lease_token = 1, "
                "lease_until = now() - interval '1 s' RETURNING work_id"
            )
        )
        n = len(ids)
        assert n == 64
        params = {"ids": ids, "tokens": [1] * n, "lease_s": 30.0, "packs": [pack], "limit": 500}
        fail = {
            "ids": ids,
            "tokens": [1] * n,
            "ops": ["r"] * n,
            "delays": [1.0] * n,
            "unstarted": [0] * n,
            "classes": ["c"] * n,
            "summaries": ["s"] * n,
        }
        cases = [
            ("renew", work_items.finalize.WORK_ITEM_RENEW_LEASE_BATCH, params),
            ("complete", work_items.finalize.WORK_ITEM_COMPLETE_BATCH, params),
            ("fail", work_items.finalize.WORK_ITEM_FAIL_BATCH, fail),
            ("reclaim", work_items.finalize.WORK_ITEM_RECLAIM_EXPIRED, params),
        ]
        db.execute("SET plan_cache_mode = force_generic_plan")
        calls = {}
        for name, query, p in cases:
            if work_items.finalize.BY_ID_PREPARE:
                order = _prepare(db, name, query)
                args = sql.SQL(", ").join(sql.Literal(p[k]) for k in order)
                call = sql.SQL("EXECUTE {}({})").format(sql.Identifier(name), args)
            else:
                call = sql.SQL(re.sub(r"%\((\w+)\)s", lambda m: "{" + m.group(1) + "}", query)).format(
                    **{k: sql.Literal(v) for k, v in p.items()}
                )
            calls[name] = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {}").format(call)
            with db.transaction(force_rollback=True):
                db.execute(calls[name])  # planned now, on the small table (a generic plan is kept)
        seed.seed_items(db, pack, CHURN)
        db.execute(
            "UPDATE connector_work_item SET state = 'processing', lease_owner = 'y', lease_token = 1,"
            " lease_until = now() + interval '1 min' WHERE state = 'pending'"
        )
        db.execute(
            "UPDATE connector_work_item SET state = 'succeeded', lease_owner = NULL, lease_until = NULL,"
            " finished_at = now() WHERE state = 'processing' AND lease_owner = 'y'"
        )
        # The churn is there, unvacuumed: one processing index entry per churned item (>= 8 B each).
        size = db.execute("SELECT pg_relation_size('ix_connector_work_item_processing')").fetchone()
        assert size is not None and size[0] >= CHURN * 8, size
        for name, _query, _p in cases:
            with db.transaction(force_rollback=True):
                plan = "\n".join(r[0] for r in db.execute(calls[name]).fetchall())
            assert "rows=64" in plan.splitlines()[0], plan
            scans = _scan_buffers(plan)
            assert scans, plan
            # An exact lookup costs a few pages per id; walking 20k dead entries costs thousands.
            for line, hits in scans:
                assert hits <= 8 * n, f"{name}: {line} read {hits} buffers for {n} ids:\n{plan}"


@pytest.mark.parametrize(
    "claim",
    [
        work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH,
        work_items.claim.WORK_ITEM_CLAIM_CIRCUIT_BATCH,
        work_items.claim.WORK_ITEM_CLAIM_RATE_BATCH,
        work_items.claim.WORK_ITEM_CLAIM_BATCH,
    ],
    ids=["plain", "circuit", "rate", "flow"],
)
def test_claim_plan_stays_by_id_when_the_backlog_grows(claim: str) -> None:
    """The claim's generic plan is made with statistics taken at an idle moment (no ready rows:
    everything finished), then a backlog of 30,000 ready items builds up. The update must still find
    its rows by primary key; with a state re-check in it, the planner drove it from the ready index
    instead, whose estimate said "almost empty": a walk of the whole backlog per claim."""
    plan, _remade = claim_plans_on_idle_statistics(claim)
    # The claimer sends the plain and rate statements under this mode (``CLAIM_PLANS``): the
    # candidate read keeps to the ready index too, and nothing scans the table.
    scans = [n for n in plan if n.get("Relation Name") == "connector_work_item" and "Index Name" in n]
    assert any(n["Index Name"] == "ix_connector_work_item_ready" for n in scans), [
        (n["Node Type"], n["Index Name"], n.get("Index Cond"), n.get("Plan Rows")) for n in scans
    ]
    assert not [
        n for n in plan if n["Node Type"] == "Seq Scan" and n["Relation Name"] == "connector_work_item"
    ]
    claimed = claimed_update(plan)
    assert_update_reads_by_key(
        claimed,
        relation="connector_work_item",
        alias=claimed[0]["Alias"],
        index="pk_connector_work_item",
        rows=64,
    )
