"""The materializer's hot statements use their partial indexes (EXPLAIN), so their cost does not grow
with the backlog or with the number of routed receipts kept for audit."""

from __future__ import annotations

import json
from typing import Any

from psycopg import sql

from connector.common.store import lanes, receipts
from tests.plans import assert_update_reads_by_key, plan_nodes, positional

from .conftest import apply, bulk_receipts, manifest, work_type


async def _explain(conn, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cur = await conn.execute("EXPLAIN (FORMAT JSON) " + sql, params)
    row = await cur.fetchone()
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return plan_nodes(doc[0]["Plan"])


def _scans(nodes: list[dict[str, Any]], relation: str) -> list[tuple[str, str | None]]:
    """(scan kind, index) per scan of ``relation``; index-only scans count as index scans."""
    return [
        (n["Node Type"].replace("Index Only Scan", "Index Scan"), n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == relation
    ]


async def test_claim_and_gate_statements_use_their_partial_indexes(adb) -> None:
    doc = manifest(work_types={"sync": work_type(lanes={"source_fifo": True})})
    await apply(adb, doc)
    await bulk_receipts(adb, 20_000)
    # Most receipts are routed already (kept for audit); a few are due; some are in flight.
    await adb.execute(
        "UPDATE connector_ingress_receipt SET router_status = 'materialized' WHERE receipt_id <= 19000"
    )
    await adb.execute(
        "UPDATE connector_ingress_receipt SET router_status = 'routing', lease_until = now() + interval '1 m'"
        " WHERE receipt_id > 19900"
    )
    await adb.execute("ANALYZE connector_ingress_receipt")

    claim = await _explain(
        adb,
        receipts.routing.RECEIPT_CLAIM_ROUTABLE,
        {"owner": "x", "limit": 256, "lease_s": 30.0, "horizon_wait_s": 5.0},
    )
    scans = _scans(claim, "connector_ingress_receipt")
    assert ("Index Scan", "ix_connector_ingress_receipt_routable") in scans, scans
    assert ("Index Scan", "ix_connector_ingress_receipt_routing") in scans, scans
    assert not any(kind == "Seq Scan" for kind, _ in scans), scans

    floor = await _explain(
        adb, receipts.routing.RECEIPT_INFLIGHT_FLOOR, {"namespaces": ["shop"], "mine": [1, 2]}
    )
    kinds = _scans(floor, "connector_ingress_receipt")
    assert kinds and all(index == "ix_connector_ingress_receipt_routing" for _, index in kinds), kinds

    lag = await _explain(adb, receipts.routing.RECEIPT_ROUTING_LAG, {})
    assert sorted(_scans(lag, "connector_ingress_receipt")) == [
        ("Index Scan", "ix_connector_ingress_receipt_routable"),
        ("Index Scan", "ix_connector_ingress_receipt_routing"),
    ]


async def test_lane_overtaken_check_probes_the_lane_index(adb) -> None:
    await adb.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method, received_at,
             payload_sha256, body, verification)
           SELECT 'shop', 'orders', 'k' || i, 'POST', now(), '\\x00', '\\x7b7d', 'none'
           FROM generate_series(1, 5000) i"""
    )
    await adb.execute(
        """INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id,
             route_version, namespace, idempotency_key, delivery_seq, payload_sha256, parse_outcome)
           SELECT receipt_id, 1, 1, 1, 1, 1, 'shop', idempotency_key, receipt_id, '\\x00', 'ok'
           FROM connector_ingress_receipt"""
    )
    await adb.execute(
        """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, state,
             delivery_seq, source_lane_key, target_mutation_lane_key)
           SELECT event_id, 1, 1, 'w', CASE WHEN event_id % 3 = 0 THEN 'succeeded' ELSE 'blocked' END,
                  delivery_seq, 'lane-' || (event_id % 50), 'target-' || (event_id % 20)
           FROM connector_event"""
    )
    await adb.execute("ANALYZE connector_work_item")
    nodes = await _explain(
        adb,
        lanes.LANE_OVERTAKEN,
        {"packs": [1, 1], "kinds": ["s", "t"], "keys": ["lane-7", "target-3"], "seqs": [10, 10]},
    )
    scans = _scans(nodes, "connector_work_item")
    assert ("Index Scan", "ix_connector_work_item_source_lane") in scans, scans
    assert ("Index Scan", "ix_connector_work_item_target_lane") in scans, scans
    assert not any(kind == "Seq Scan" for kind, _ in scans), scans


async def test_claim_plan_stays_by_id_when_the_backlog_grows(adb) -> None:
    """The claim's plan is made (and, prepared, kept) with statistics taken at an idle moment, when
    every receipt was routed (in a healthy system due receipts are always rare); then a backlog of
    30,000 builds up. The update
    must still find its rows by primary key: driven from the partial indexes instead, it joined the
    whole backlog with the batch (1.6-2.8 s per claim at 30k due) and the materializer never caught
    up again."""
    await apply(adb, manifest(work_types={"sync": work_type()}))
    await bulk_receipts(adb, 2_000)
    await adb.execute("UPDATE connector_ingress_receipt SET router_status = 'materialized'")
    await adb.execute("ANALYZE connector_ingress_receipt")
    await adb.execute("SET plan_cache_mode = force_generic_plan")
    body, order = positional(receipts.routing.RECEIPT_CLAIM_ROUTABLE)
    await adb.execute("PREPARE claim AS " + body)
    params = {"owner": "x", "limit": 256, "lease_s": 30.0, "horizon_wait_s": 0.0}
    call = "EXECUTE claim(" + ", ".join(sql.Literal(params[k]).as_string(adb) for k in order) + ")"

    async def explain() -> list[dict[str, Any]]:
        async with adb.transaction(force_rollback=True):
            cur = await adb.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + call)
            row = await cur.fetchone()
        doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        return plan_nodes(doc[0]["Plan"])

    await explain()  # the generic plan is made here, on the small backlog
    await adb.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
             received_at, payload_sha256, body, verification)
           SELECT 'shop', 'orders', 'backlog-' || i, 'POST', now(), '\\x00', '\\x7b7d', 'none'
           FROM generate_series(1, 30000) i"""
    )
    nodes = await explain()
    assert_update_reads_by_key(
        nodes, relation="connector_ingress_receipt", alias="r", index="pk_connector_ingress_receipt", rows=256
    )
    index_scans = [n for n in nodes if n.get("Index Name") == "pk_connector_ingress_receipt"]
    assert index_scans, [n["Node Type"] for n in nodes]
