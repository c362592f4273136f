"""EXPLAIN of the legacy Event path's claim (the rollback bridge): its update must find the claimed
events by primary key however large the legacy backlog grows after its plan was made."""

from __future__ import annotations

import psycopg

from connector.common.core import testdb
from connector.common.store import legacy as legacy_store
from tests.executor import seed
from tests.plans import assert_update_reads_by_key, prepared_explain

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
        params = {"pack": pack, "generation": 1, "owner": "o", "lease_token": 1, "limit": 64, "lease_s": 30.0}
        nodes = prepared_explain(db, "claim", legacy_store.EVENT_LEGACY_CLAIM_BATCH, params)
        assert nodes()[0]["Actual Rows"] == 0  # nothing pending: the generic plan is made here
        db.execute(
            PACK_EVENTS, {"tag": "due-", "n": 30_000, "pack": pack, "route": route_id, "state": "pending"}
        )
        # read by key, the batch only
        assert_update_reads_by_key(
            nodes(), relation="connector_event", alias="e", index="pk_connector_event", rows=64
        )
