"""EXPLAIN ANALYZE of every statement FindDeliveries and TraceDelivery send, at 1M receipts, 1M events
and 1M WorkItems: no sequential scan of a big table, and the rows the scans read stay bounded (a
key lookup reads a handful, a scan without a key at most its scan limit).

The statements are not copied here: the RPCs' own code (``admin.find.find_deliveries``,
``admin.trace.trace_delivery``) runs against the big database through a connection that records
every statement with its parameters, and each recorded statement is then EXPLAIN ANALYZEd (in a
rolled-back transaction). Control: ``test_the_plan_check_catches_a_scan`` — a search by provider id
written without the route probe (``provider_delivery_id = x`` alone) is a sequential scan here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from google.protobuf import timestamp_pb2

from connector.common.core import testdb
from connector.executor.admin import find, pagination, trace
from connector.executor.admin.auth import Principal, Role
from connector.v1 import admin_service_pb2 as pb

from .recording import OnePool, Recording

pytestmark = pytest.mark.slow

N = 1_000_000
BIG = ("connector_ingress_receipt", "connector_event", "connector_work_item", "connector_work_attempt")
#: A scan without a key examines at most FIND_SCAN_LIMIT receipts, plus the page's probes.
SCAN_READ_MAX = 40_000
KEY_READ_MAX = 500
#: Unrouted receipts (pending / retry) come from the routable partial index, in due order, sorted by
#: id: the search reads the unrouted backlog (here 0.1% = 1,000 receipts), never the table.
UNROUTED = N // 1000
BACKLOG_READ_MAX = UNROUTED + 100


def _seed(db: psycopg.Connection) -> None:
    db.execute("SET synchronous_commit = off")
    db.execute(
        "ALTER TABLE connector_event DROP CONSTRAINT fk_connector_event_receipt_id_connector_ingress_receipt"
    )
    db.execute(
        "ALTER TABLE connector_work_item DROP CONSTRAINT fk_connector_work_item_event_id_connector_event"
    )
    db.execute(
        "INSERT INTO connector_installed_pack (name, namespace, active_generation)"
        " VALUES ('shop', 'shop', 1), ('crm', 'crm', 1)"
    )
    db.execute(
        "INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,"
        " manifest_sha256) VALUES (1, 1, 'active', '{}', 'x'), (2, 1, 'active', '{}', 'x')"
    )
    db.execute(
        "INSERT INTO connector_route (installed_pack_id, generation, namespace, route_key, route_version,"
        " config, config_sha256) VALUES (1, 1, 'shop', 'orders', 1, '{}', 'x'),"
        " (1, 1, 'shop', 'refunds', 1, '{}', 'x'), (2, 1, 'crm', 'contacts', 1, '{}', 'x')"
    )
    db.execute(
        "INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase)"
        " VALUES (1, 1, 'none', 'rollback_fenced'), (2, 1, 'none', 'rollback_fenced')"
    )
    # Receipts accepted over the last 30 days in id order; 1% failed, 0.1% pending.
    db.execute(
        f"""
        INSERT INTO connector_ingress_receipt (namespace, route_key, provider_delivery_id, idempotency_key,
          method, event_kind, received_at, accepted_at, payload_sha256, body, verification, router_status,
          next_attempt_at)
        SELECT ns, rk, 'd-' || i, rk || ':id:d-' || i, 'POST', 'order.updated',
               ts, ts, '\\x00', '\\x00', 'hmac-sha256:env:S',
               CASE WHEN i % 100 = 0 THEN 'failed' WHEN i % 1000 = 1 THEN 'pending'
                    ELSE 'materialized' END, ts
        FROM (SELECT i, CASE WHEN i % 10 = 0 THEN 'crm' ELSE 'shop' END AS ns,
                     CASE WHEN i % 10 = 0 THEN 'contacts' WHEN i % 7 = 0 THEN 'refunds'
                          ELSE 'orders' END AS rk,
                     now() - interval '30 days' + i * interval '2.592 seconds' AS ts
              FROM generate_series(1, {N}) i) x
        """
    )
    db.execute(
        f"""
        INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id,
          route_version, namespace, event_kind, source_object_id, idempotency_key, delivery_seq,
          payload_sha256, parse_outcome, correlation_ids)
        SELECT i, CASE WHEN i % 10 = 0 THEN 2 ELSE 1 END, 1, 1, 1, 1, 'shop',
               CASE WHEN i % 997 = 0 THEN 'order.cancelled' ELSE 'order.updated' END, 'o' || (i % 5000),
               'k' || i || '#0', i, '\\x00', 'ok',
               CASE WHEN i % 100 = 0 THEN jsonb_build_object('order', 'o-' || i) ELSE '{{}}' END
        FROM generate_series(1, {N}) i
        WHERE i % 100 <> 1
        """
    )
    db.execute(
        """
        INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, state,
          delivery_seq, source_lane_key, lease_owner, lease_until, run_after, finished_at)
        SELECT e.event_id, e.installed_pack_id, 1, 'sync', s, e.delivery_seq,
               CASE WHEN e.event_id % 10 IN (0, 8) THEN 'lane:' || (e.event_id % 500) END,
               CASE WHEN s = 'processing' THEN 'x' END, CASE WHEN s = 'processing' THEN now() END,
               now() - interval '1 minute', CASE WHEN s IN ('dead', 'succeeded') THEN now() END
        FROM (SELECT event_id, installed_pack_id, delivery_seq, CASE
                WHEN event_id % 100 < 85 THEN 'succeeded' WHEN event_id % 100 < 90 THEN 'pending'
                WHEN event_id % 100 < 92 THEN 'retry' WHEN event_id % 100 < 96 THEN 'dead'
                WHEN event_id % 100 < 97 THEN 'processing' ELSE 'blocked' END AS s
              FROM connector_event) e
        """
    )
    # Three ended attempts of every item in retry or dead (60k items, 180k rows).
    db.execute(
        """
        INSERT INTO connector_work_attempt (work_id, slot, lease_token, attempt, lease_owner, started_at,
          ended_at, outcome, failure_class, failure_summary)
        SELECT w.work_id, n, n, n, 'x', now() - interval '1 minute', now(), 'retry', 'c', 's'
        FROM connector_work_item w, generate_series(1, 3) n WHERE w.state IN ('retry', 'dead')
        """
    )
    for table in (*BIG, "connector_route", "connector_claim_authority", "connector_installed_pack"):
        db.execute(f"VACUUM ANALYZE {table}")


@pytest.fixture(scope="module")
def big_db() -> Iterator[str]:
    with testdb.fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _seed(conn)
        yield url


async def record(url: str, calls: list[tuple[str, Any]]) -> list[tuple[str, str, Any]]:
    """Run each (label, request) through the RPC code; every statement it sent, labelled."""
    out: list[tuple[str, str, Any]] = []
    operator = Principal("test", frozenset({Role.OPERATOR}))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as raw:
        for label, request in calls:
            rec = Recording(raw)
            pool = OnePool(rec)
            if isinstance(request, pb.TraceDeliveryRequest):
                await trace.trace_delivery(pool, request, operator, stale_s=30.0)
            else:
                await find.find_deliveries(pool, pagination.PageTokens(b"k" * 32), request)
            out += [(label, q, p) for q, p in rec.statements if not q.startswith("SET TRANSACTION")]
    return out


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def explain(db: psycopg.Connection, query: str, params: Any) -> list[dict[str, Any]]:
    with db.transaction(force_rollback=True):
        (plan,) = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()  # type: ignore[misc]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return list(_nodes(plan[0]["Plan"]))


def big_reads(nodes: list[dict[str, Any]]) -> tuple[list[str], int]:
    """(sequential scans of a big table, rows the big-table scans returned in total)."""
    seq = [
        n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG
    ]
    rows = sum(
        int(n["Actual Rows"]) * int(n.get("Actual Loops", 1))
        for n in nodes
        if n.get("Relation Name") in BIG or n["Node Type"] == "Bitmap Index Scan"
    )
    return seq, rows


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(value)
    return out


def _calls() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    now = datetime.now(UTC)
    keyed = [
        ("receipt", pb.FindDeliveriesRequest(receipt_id=123_457)),
        ("work", pb.FindDeliveriesRequest(work_id=400_000)),
        ("delivery", pb.FindDeliveriesRequest(provider_delivery_id="d-777777")),
        ("delivery-ns", pb.FindDeliveriesRequest(provider_delivery_id="d-777777", namespace="shop")),
        ("delivery-missing", pb.FindDeliveriesRequest(provider_delivery_id="nope")),
        ("idempotency", pb.FindDeliveriesRequest(idempotency_key="orders:id:d-555553")),
        ("idempotency-event", pb.FindDeliveriesRequest(idempotency_key="orders:id:d-555553#0")),
        ("correlation", pb.FindDeliveriesRequest(correlation_name="order", correlation_value="o-500000")),
        ("failed", pb.FindDeliveriesRequest(receipt_status="failed", namespace="shop")),
        ("failed-all", pb.FindDeliveriesRequest(receipt_status="failed")),
        ("pending", pb.FindDeliveriesRequest(receipt_status="pending")),
        ("routing", pb.FindDeliveriesRequest(receipt_status="routing")),
        ("retry", pb.FindDeliveriesRequest(receipt_status="retry")),
        ("delivery+state", pb.FindDeliveriesRequest(provider_delivery_id="d-777777", work_item_state="dead")),
        ("trace-receipt", pb.TraceDeliveryRequest(receipt_id=500_010)),
        ("trace-work", pb.TraceDeliveryRequest(work_id=600_098)),  # blocked, in a lane
        ("trace-dead", pb.TraceDeliveryRequest(work_id=600_093)),  # dead, with attempts
        ("trace-delivery", pb.TraceDeliveryRequest(provider_delivery_id="d-700010", include_payload=True)),
    ]
    scans = [
        ("namespace", pb.FindDeliveriesRequest(namespace="shop")),
        ("route", pb.FindDeliveriesRequest(namespace="shop", route_key="refunds")),
        ("rare-kind", pb.FindDeliveriesRequest(event_kind="order.cancelled")),
        ("state-dead", pb.FindDeliveriesRequest(work_item_state="dead")),
        ("state-rare", pb.FindDeliveriesRequest(work_item_state="awaiting_legacy_outcome")),
        ("materialized", pb.FindDeliveriesRequest(receipt_status="materialized", namespace="crm")),
        (
            "time-window",
            pb.FindDeliveriesRequest(
                namespace="shop",
                accept_time_after=_ts(now - timedelta(days=20)),
                accept_time_before=_ts(now - timedelta(days=19)),
            ),
        ),
        ("time-old", pb.FindDeliveriesRequest(accept_time_before=_ts(now - timedelta(days=29)))),
    ]
    return keyed, scans


async def test_find_and_trace_statements_use_indexes_at_a_million_rows(big_db: str) -> None:
    keyed, scans = _calls()
    recorded_keyed = await record(big_db, keyed)
    recorded_scans = await record(big_db, scans)
    labels = {label for label, _, _ in recorded_keyed + recorded_scans}
    assert labels == {label for label, _ in keyed + scans}  # every call sent statements
    problems: list[str] = []
    with psycopg.connect(big_db, autocommit=True) as db:
        for limit, recorded in ((KEY_READ_MAX, recorded_keyed), (SCAN_READ_MAX, recorded_scans)):
            for label, query, params in recorded:
                seq, rows = big_reads(explain(db, query, params))
                if seq or rows > (BACKLOG_READ_MAX if label in ("pending", "retry") else limit):
                    problems.append(f"{label}: seq={seq} rows={rows} :: {' '.join(query.split())[:160]}")
    assert not problems, "\n".join(problems)
    # The trace sent one statement per part, whatever the number of WorkItems (batched).
    # work id -> receipt, receipt, events, WorkItems, lane positions, claim authorities, attempts,
    # claimants.
    trace_statements = [q for label, q, _ in recorded_keyed if label == "trace-work"]
    assert len(trace_statements) == 8, trace_statements


def test_the_plan_check_catches_a_scan(big_db: str) -> None:
    """Control: the provider-id search without the per-route probe of the unique index is a
    sequential scan of the receipts, and the check above would report it."""
    with psycopg.connect(big_db, autocommit=True) as db:
        nodes = explain(
            db,
            "SELECT r.receipt_id FROM connector_ingress_receipt r WHERE r.provider_delivery_id = %(d)s"
            " ORDER BY r.receipt_id DESC LIMIT 51",
            {"d": "d-777777"},
        )
    seq, rows = big_reads(nodes)
    assert seq == ["connector_ingress_receipt"] or rows > KEY_READ_MAX, (seq, rows)


def test_failure_groups_read_bounded_ranges_at_a_million_rows(big_db: str) -> None:
    """ListFailureGroups (the console's Failures page) at 1M WorkItems (40,000 dead) and 1M receipts
    (10,000 failed): per pack / namespace a backward range of the dead-letter / failed-receipt partial
    index, never a sequential scan, rows read bounded by packs x (scan limit + 1). Control: the same
    grouping without the per-pack range reads every dead letter."""
    from connector.common.store.receipts import admin as receipts_admin
    from connector.common.store.work_items import admin as work_admin

    scan = 2_000
    with psycopg.connect(big_db, autocommit=True) as db:
        for name, query, params in (
            (
                "dead-all",
                work_admin.WORK_ITEM_DEAD_GROUP.format(packs=work_admin.WORK_ITEM_DEAD_GROUP_PACKS_ALL),
                {"scan": scan, "limit": 100, "pack": None},
            ),
            (
                "dead-one",
                work_admin.WORK_ITEM_DEAD_GROUP.format(packs=work_admin.WORK_ITEM_DEAD_GROUP_PACKS_ONE),
                {"scan": scan, "limit": 100, "pack": 1},
            ),
            (
                "failed-all",
                receipts_admin.RECEIPT_FAILED_GROUP.format(
                    packs=receipts_admin.RECEIPT_FAILED_GROUP_PACKS_ALL
                ),
                {"scan": scan, "limit": 100, "pack": None},
            ),
        ):
            seq, rows = big_reads(explain(db, query, params))
            assert not seq and rows <= 2 * (scan + 1) + 10, (name, seq, rows)
        rows_found = db.execute(
            work_admin.WORK_ITEM_DEAD_GROUP.format(packs=work_admin.WORK_ITEM_DEAD_GROUP_PACKS_ALL),
            {"scan": scan, "limit": 100, "pack": None},
        ).fetchall()
        assert sum(r[5] for r in rows_found) == 2 * scan and all(r[9] for r in rows_found)  # truncated
        # control: grouping every dead letter (no per-pack range) reads them all
        seq, rows = big_reads(
            explain(
                db,
                "SELECT work_type, failure_class, failure_summary, count(*) FROM connector_work_item"
                " WHERE state = 'dead' GROUP BY 1, 2, 3",
                {},
            )
        )
        assert seq or rows > 30_000, (seq, rows)
