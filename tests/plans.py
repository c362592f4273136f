"""EXPLAIN helpers shared by the plan tests: a statement written with psycopg's ``%(name)s``
placeholders turned into one with ``$n`` for ``PREPARE``, and the nodes of a JSON plan."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from psycopg import sql

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


def positional(query: str) -> tuple[str, list[str]]:
    """``query`` with ``$1, $2, …`` in place of its named placeholders, and the names in order."""
    order: list[str] = []

    def repl(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    return _PLACEHOLDER.sub(repl, query), order


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a JSON plan (``EXPLAIN (FORMAT JSON)``), the root first, depth first."""
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(plan_nodes(child))
    return out


def subplan(nodes: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The nodes of the subplan ``name`` (e.g. ``CTE claimed``) of a plan's nodes, its root first."""
    for n in nodes:
        if n.get("Subplan Name") == name:
            return plan_nodes(n)
    raise AssertionError(f"no subplan {name!r} in {[n.get('Subplan Name') for n in nodes]}")


def claimed_update(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes of a claim statement's update of the claimed rows, its root first: the plain claim's
    top-level update, or the flow claim's ``CTE claimed``."""
    if nodes[0]["Node Type"] == "ModifyTable":
        return nodes
    return subplan(nodes, "CTE claimed")


def prepared_explain(
    db: Any, name: str, query: str, params: dict[str, Any]
) -> Callable[[], list[dict[str, Any]]]:
    """PREPARE ``query`` as ``name`` on a (sync, autocommit) connection; the returned function runs
    ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE name(params)`` in a rolled-back transaction and
    returns the plan's nodes. Under ``plan_cache_mode = force_generic_plan`` the first call makes the
    plan every later call reuses."""
    body, order = positional(query)
    db.execute(f"PREPARE {name} AS {body}")
    call = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {}({})").format(
        sql.Identifier(name), sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
    )

    def run() -> list[dict[str, Any]]:
        with db.transaction(force_rollback=True):
            row = db.execute(call).fetchone()
        assert row is not None
        return plan_nodes(row[0][0]["Plan"])

    return run


def assert_update_reads_by_key(
    plan: list[dict[str, Any]], *, relation: str, alias: str, index: str, rows: int
) -> None:
    """The plan is an UPDATE of ``rows`` rows whose scans of its target (``relation`` as ``alias``)
    go through ``index`` and read no more than those rows."""
    assert plan[0]["Node Type"] == "ModifyTable" and plan[0]["Actual Rows"] == rows, plan[0]
    target = [
        n
        for n in plan[1:]  # the scans under the update that find the rows to update
        if n.get("Relation Name") == relation and n.get("Alias") == alias and "Index Name" in n
    ]
    assert target, [(n["Node Type"], n.get("Alias"), n.get("Index Name")) for n in plan]
    for n in target:
        assert n["Index Name"] == index, n
        assert n["Actual Rows"] <= rows, n


def explain_in_rollback(
    db: Any, query: str, params: dict[str, Any], mode: str, setup: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The plan nodes of ``query`` PREPAREd and EXECUTEd under ``plan_cache_mode = mode``, after the
    ``setup`` statements, all in one rolled-back transaction (a sync connection)."""
    body, order = positional(query)
    db.execute(f"SET plan_cache_mode = {mode}")
    try:
        with db.transaction(force_rollback=True):
            for statement in setup:
                db.execute(statement)
            db.execute(f"PREPARE q AS {body}")
            args = sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
            call = sql.SQL("EXECUTE q({})").format(args) if order else sql.SQL("EXECUTE q")
            row = db.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(call)).fetchone()
    finally:
        db.execute("DEALLOCATE ALL")
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return plan_nodes(plan[0]["Plan"])


def claim_plans_on_idle_statistics(
    claim: str, *, idle: int = 2_000, backlog: int = 30_000
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The premise of ``test_claim_plan_stays_by_id_when_the_backlog_grows`` (and of
    ``benchmarks.claim_replan``): on a fresh database, statistics taken at an idle moment (``idle``
    items, all finished), the generic plan of ``claim`` made then, then ``backlog`` ready items.
    Returns that kept plan's nodes, and those of the same plan made again afterwards."""
    import psycopg

    from connector.common.core import testdb
    from tests.executor import seed

    with testdb.fresh_database() as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "p", {"w": seed.python_work_type("tests.executor.effects:noop")})
        seed.seed_items(db, pack, idle)
        db.execute("UPDATE connector_work_item SET state = 'succeeded', finished_at = now()")
        db.execute("VACUUM ANALYZE connector_work_item")
        # The premise is statistics from the idle moment: the shared server's autovacuum must not
        # re-analyze the table mid-run (it did once in CI, on a loaded machine).
        db.execute("ALTER TABLE connector_work_item SET (autovacuum_enabled = false)")
        db.execute("SET plan_cache_mode = force_generic_plan")
        params = {
            "packs": [pack],
            "queue_classes": ["default"],
            "limits": [64],
            "owner": "o",
            "lease_s": 30.0,
            "process": None,
        }
        nodes = prepared_explain(db, "claim", claim, params)
        nodes()  # the generic plan is made here, with no ready rows
        seed.seed_items(db, pack, backlog)
        kept = nodes()
        db.execute("DEALLOCATE claim")
        return kept, prepared_explain(db, "claim", claim, params)()
