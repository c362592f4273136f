"""EXPLAIN of the legacy Event path's claim (the rollback bridge): its update must find the claimed
events by primary key however large the legacy backlog grows after its plan was made."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql

from connector.common import testdb
from connector.executor import legacy
from tests.executor import seed

PACK_EVENTS = """
WITH r AS (
  INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method, received_at,
    payload_sha256, body, verification, router_status)
  SELECT 'p', 'r', %(tag)s || i, 'POST', now(), '\\x00', '\\x7b7d', 'none', 'materialized'
  FROM generate_series(1, %(n)s) i
  RETURNING receipt_id, idempotency_key
)
INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id, route_version,
  namespace, idempotency_key, delivery_seq, payload_sha256, parse_outcome, execution_owner, legacy_state,
  source_object_id)
SELECT r.receipt_id, %(pack)s, 1, 1, %(route)s, 1, 'p', r.idempotency_key, r.receipt_id, '\\x00', 'ok',
       'legacy_event', %(state)s, 'o' || r.receipt_id
FROM r
"""


def test_legacy_claim_plan_stays_by_id_when_the_backlog_grows() -> None:
    """Plan made with idle-time statistics (every legacy event finished), then 30,000 events become
    due. With a state re-check in the update, the planner drove it from the partial legacy source
    index instead of the primary key (a walk of the backlog per claim)."""
    with testdb.fresh_database() as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(
            db, "p", {"w": seed.python_work_type("tests.executor.effects:noop")}, authority=False
        )
        db.execute(
            "INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase)"
            " VALUES (%s, 1, 'legacy_event', 'legacy_active')",
            (pack,),
        )
        db.execute(
            "INSERT INTO connector_scheduler_lease (installed_pack_id, generation, holder, token,"
            " lease_until) VALUES (%s, 1, 'o', 1, now() + interval '1 hour')",
            (pack,),
        )
        route = db.execute(
            "SELECT route_id FROM connector_route WHERE installed_pack_id = %s LIMIT 1", (pack,)
        ).fetchone()
        route_id = route[0] if route else 1
        # Statistics at an idle moment: every legacy event finished.
        db.execute(
            PACK_EVENTS, {"tag": "done-", "n": 2_000, "pack": pack, "route": route_id, "state": "succeeded"}
        )
        db.execute("VACUUM ANALYZE connector_event")
        db.execute("SET plan_cache_mode = force_generic_plan")
        order: list[str] = []

        def placeholder(m: re.Match[str]) -> str:
            if m.group(1) not in order:
                order.append(m.group(1))
            return f"${order.index(m.group(1)) + 1}"

        db.execute("PREPARE claim AS " + re.sub(r"%\((\w+)\)s", placeholder, legacy.EVENT_LEGACY_CLAIM_BATCH))
        params = {"pack": pack, "generation": 1, "owner": "o", "lease_token": 1, "limit": 64, "lease_s": 30.0}
        call = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim({})").format(
            sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
        )

        def nodes() -> list[dict[str, Any]]:
            with db.transaction(force_rollback=True):
                row = db.execute(call).fetchone()
            assert row is not None
            out, todo = [], [row[0][0]["Plan"]]
            while todo:
                n = todo.pop()
                out.append(n)
                todo.extend(n.get("Plans", []))
            return out

        assert nodes()[0]["Actual Rows"] == 0  # nothing pending: the generic plan is made here
        db.execute(
            PACK_EVENTS, {"tag": "due-", "n": 30_000, "pack": pack, "route": route_id, "state": "pending"}
        )
        plan = nodes()
        assert plan[0]["Node Type"] == "ModifyTable" and plan[0]["Actual Rows"] == 64, plan[0]
        target = [
            n
            for n in plan[1:]
            if n.get("Relation Name") == "connector_event" and n.get("Alias") == "e" and "Index Name" in n
        ]
        assert target, [(n["Node Type"], n.get("Alias"), n.get("Index Name")) for n in plan]
        for n in target:  # read by key, the batch only
            assert n["Index Name"] == "pk_connector_event", n
            assert n["Actual Rows"] <= 64, n
