"""The routing loop in-process against a real database: events and WorkItems created exactly once in
one transaction, snapshots, fencing, failures, fall-back on a poison receipt, and immutability."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from connector.materializer import metrics
from connector.materializer.router import Router

from .conftest import apply, body, insert_receipts, manifest, rows, scalar, wait_until, work_type


def _fan_out_3() -> dict[str, Any]:
    doc = manifest(
        work_types={
            "sync": work_type(queue_class="crm", priority=10, retry={"max_attempts": 4}),
            "audit": work_type(priority=-5),
            "notify": work_type(queue_class="bulk"),
        }
    )
    doc["routes"][0]["fan_out"] = [{"work_type": "sync"}, {"work_type": "audit"}, {"work_type": "notify"}]
    doc["routes"][0]["correlation"] = {"req": {"pointer": "/data/req"}}
    return doc


async def test_fan_out_creates_one_event_and_its_work_items(adb, make_router) -> None:
    applied = await apply(adb, _fan_out_3())
    ids = await insert_receipts(adb, [body(i, req=f"r{i}") for i in range(5)])
    router: Router = await make_router()
    result = await router.drain()
    assert (result.claimed, result.materialized, result.work_items) == (5, 5, 15)

    events = await rows(
        adb,
        """SELECT e.receipt_id, e.installed_pack_id, e.generation, e.incarnation, e.route_id, e.route_version,
                  e.event_kind, e.source_object_kind, e.source_object_id, e.idempotency_key, e.delivery_seq,
                  e.payload_sha256 = r.payload_sha256, e.parse_outcome, e.companion, e.correlation_ids,
                  e.execution_owner, r.router_status, r.enqueued_event_ids = ARRAY[e.event_id],
                  r.lease_until IS NULL, r.routed_at IS NOT NULL
           FROM connector_event e JOIN connector_ingress_receipt r USING (receipt_id)
           ORDER BY e.receipt_id""",
    )
    route_id = applied.routes[0].route_id
    key = await scalar(
        adb, "SELECT idempotency_key FROM connector_ingress_receipt WHERE receipt_id = %s", (ids[2],)
    )
    assert events[2] == (
        ids[2], applied.installed_pack_id, 1, 1, route_id, 1, "order.updated", "order", "2",
        f"{key}#0", ids[2], True, "ok", {"source_object_id": "2"}, {"req": "r2"}, "work_item",
        "materialized", True, True, True,
    )  # fmt: skip

    items = await rows(
        adb,
        """SELECT w.work_type, w.queue_class, w.state, w.priority, w.max_attempts, w.delivery_seq,
                  w.source_lane_key, round(extract(epoch FROM w.created_at - w.run_after))::int,
                  w.priority_head_s
           FROM connector_work_item w JOIN connector_event e USING (event_id)
           WHERE e.receipt_id = %s ORDER BY work_id""",
        (ids[0],),
    )
    assert items == [
        # Due at once (run_after = now); priority is the head start in the claim order, 1 s a point
        # by default, counted from the queue class's lowest priority when that is negative (ADR 014).
        ("sync", "crm", "pending", 10, 4, ids[0], None, 0, 10.0),
        ("audit", "default", "pending", -5, 10, ids[0], None, 0, 0.0),
        ("notify", "bulk", "pending", 0, 10, ids[0], None, 0, 0.0),
    ]
    # Running again finds nothing to do and duplicates nothing.
    assert (await router.drain()).claimed == 0
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 15


async def test_event_fact_columns_cannot_be_updated(adb, make_router) -> None:
    await apply(adb, manifest())
    await insert_receipts(adb, [body(1)])
    await (await make_router()).drain()
    with pytest.raises(psycopg.errors.RestrictViolation):
        await adb.execute("UPDATE connector_event SET source_object_id = 'forged'")
    with pytest.raises(psycopg.errors.RestrictViolation):
        await adb.execute("UPDATE connector_event SET generation = generation + 1")
    assert await scalar(adb, "SELECT source_object_id FROM connector_event") == "1"


async def test_permanent_failures_end_failed_with_a_sanitized_reason(adb, make_router) -> None:
    await apply(adb, manifest())
    secret = "PAYLOAD-SECRET-4242"
    good = await insert_receipts(adb, [body(1)])
    no_id = await insert_receipts(adb, [body({"nested": secret})])
    not_json = await insert_receipts(adb, [f"{{{secret}".encode()])
    no_route = await insert_receipts(adb, [body(2)], route_key="removed")
    no_pack = await insert_receipts(adb, [body(3)], namespace="unknown")
    result = await (await make_router()).drain()
    assert (result.materialized, result.failed, result.retried) == (1, 4, 0)
    states = dict(
        (r[0], r[1:])
        for r in await rows(
            adb, "SELECT receipt_id, router_status, error_class, error_summary FROM connector_ingress_receipt"
        )
    )
    assert states[good[0]][:2] == ("materialized", None)
    assert states[no_id[0]][:2] == ("failed", "required_missing")
    assert states[not_json[0]][:2] == ("failed", "parse_error")
    assert states[no_route[0]][:2] == ("failed", "no_route")
    assert states[no_pack[0]][:2] == ("failed", "no_route")
    for _, _, summary in states.values():
        assert summary is None or secret not in summary
    assert await scalar(adb, "SELECT count(*) FROM connector_event") == 1


async def test_a_routing_failure_writes_one_info_line_with_receipt_route_and_reason(
    adb, make_router, caplog: pytest.LogCaptureFixture
) -> None:
    """#24: a delivery whose routing failed (``required_missing``) wrote no line at INFO. Now one
    INFO line per failed receipt: its id, namespace, route, reason and the sanitized summary (field
    names, never a payload value)."""
    caplog.set_level("INFO", logger="connector.materializer.events")
    await apply(adb, manifest())
    secret = "PAYLOAD-SECRET-4343"
    (no_id,) = await insert_receipts(adb, [body({"nested": secret})])
    (fine,) = await insert_receipts(adb, [body(7)])
    result = await (await make_router()).drain()
    assert (result.materialized, result.failed) == (1, 1)
    lines = [r for r in caplog.records if getattr(r, "event", None) == "routing_failed"]
    assert len(lines) == 1 and lines[0].levelname == "INFO"
    line = lines[0]
    assert (line.receipt_id, line.reason) == (no_id, "required_missing")
    assert line.route == "orders" and line.namespace and "receipts replay" in line.getMessage()
    assert fine not in [getattr(r, "receipt_id", None) for r in caplog.records]
    assert secret not in caplog.text


async def test_retryable_failure_backs_off_then_fails_after_max_attempts(adb, make_router) -> None:
    await apply(adb, manifest())
    [rid] = await insert_receipts(adb, [None], body_ref="s3://bucket/object")
    router = await make_router(max_attempts=2, backoff_base_s=30)
    assert (await router.run_once()).retried == 1
    status, attempts, error_class, delay = (
        await rows(
            adb,
            """SELECT router_status, attempts, error_class,
                      extract(epoch FROM next_attempt_at - clock_timestamp())
               FROM connector_ingress_receipt WHERE receipt_id = %s""",
            (rid,),
        )
    )[0]
    assert (status, attempts, error_class) == ("retry", 1, "body_unavailable") and 15 < delay <= 37
    assert (await router.run_once()).claimed == 0  # not due yet
    await adb.execute("UPDATE connector_ingress_receipt SET next_attempt_at = now() - interval '1 s'")
    assert (await router.run_once()).failed == 1
    assert await rows(adb, "SELECT router_status, error_class, attempts FROM connector_ingress_receipt") == [
        ("failed", "body_unavailable", 2)
    ]


async def test_a_poison_receipt_does_not_fail_its_batch(adb, make_router) -> None:
    await apply(adb, manifest())
    ids = await insert_receipts(adb, [body(i) for i in range(6)])
    poison = ids[3]
    # A real database error for one row only (as a value the database refuses would raise).
    await adb.execute(
        f"""CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.receipt_id = {poison} THEN RAISE EXCEPTION 'refused' USING ERRCODE = '22023';
            END IF; RETURN NEW; END $$;
            CREATE TRIGGER test_poison BEFORE INSERT ON connector_event
            FOR EACH ROW EXECUTE FUNCTION test_poison();"""
    )
    before = metrics.BATCH_FALLBACKS._value.get()
    result = await (await make_router()).run_once()
    assert (result.materialized, result.retried) == (5, 1)
    assert metrics.BATCH_FALLBACKS._value.get() == before + 1
    assert await rows(
        adb,
        "SELECT router_status, error_class, error_summary FROM connector_ingress_receipt"
        " WHERE receipt_id = %s",
        (poison,),
    ) == [("retry", "db_error", "database refused the write (22023)")]
    assert await scalar(adb, "SELECT count(*) FROM connector_event") == 5


async def test_a_stale_claim_is_fenced_off(adb, make_router) -> None:
    await apply(adb, manifest())
    await insert_receipts(adb, [body(i) for i in range(3)])
    slow: Router = await make_router(lease_s=30)
    fast: Router = await make_router()
    async with slow._pool.connection() as conn:
        from connector.common.store import receipts

        claimed = await receipts.routing.receipt_claim_routable(
            conn, owner="slow", limit=10, lease_s=30, horizon_wait_s=30
        )
    assert len(claimed) == 3
    # The slow holder stalls past its lease; another materializer re-claims and finishes.
    await adb.execute("UPDATE connector_ingress_receipt SET lease_until = clock_timestamp() - interval '1 s'")
    assert (await fast.drain()).materialized == 3
    # The stale holder's write back affects nothing.
    result = await slow.route(claimed)
    assert (result.materialized, result.lost) == (0, 3)
    assert await scalar(adb, "SELECT count(*) FROM connector_event") == 3
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 3
    assert await scalar(adb, "SELECT min(attempts) FROM connector_ingress_receipt") == 2


async def test_commit_horizon_holds_back_receipts_behind_an_uncommitted_earlier_one(
    adb, db_url: str, make_router
) -> None:
    await apply(adb, manifest())
    router = await make_router(horizon_wait_s=60)
    async with await psycopg.AsyncConnection.connect(db_url) as early:  # not autocommit
        [first] = await insert_receipts(early, [body("a")])  # id taken, not committed
        [second] = await insert_receipts(adb, [body("b")])  # later id, committed first
        assert first < second
        assert (await router.run_once()).claimed == 0  # second waits: an earlier id may still commit
        await early.commit()
    result = await router.drain()
    assert result.materialized == 2
    assert await scalar(adb, "SELECT count(*) FROM connector_event") == 2


async def test_legacy_owned_generation_materializes_events_without_work_items(adb, make_router) -> None:
    applied = await apply(adb, manifest())
    await adb.execute(
        "UPDATE connector_claim_authority SET claim_path = 'legacy_event', phase = 'legacy_active',"
        " cutover_receipt_id = NULL WHERE installed_pack_id = %s",
        (applied.installed_pack_id,),
    )
    await insert_receipts(adb, [body(1)])
    assert (await (await make_router()).drain()).materialized == 1
    assert await rows(adb, "SELECT execution_owner, legacy_state FROM connector_event") == [
        ("legacy_event", "pending")
    ]
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 0


async def test_generation_without_claim_authority_waits(adb, make_router) -> None:
    applied = await apply(adb, manifest())
    await adb.execute(
        "DELETE FROM connector_claim_authority WHERE installed_pack_id = %s", (applied.installed_pack_id,)
    )
    await insert_receipts(adb, [body(1)])
    result = await (await make_router()).drain()
    assert (result.retried, result.materialized) == (1, 0)
    assert await scalar(adb, "SELECT error_class FROM connector_ingress_receipt") == "no_claim_authority"


async def test_activation_between_plan_and_write_is_never_half_seen(adb, make_router) -> None:
    applied = await apply(adb, manifest())
    router = await make_router()
    # A new generation (fan-out to two work types) is activated after the router loaded its cache.
    doc = manifest(work_types={"sync": work_type(), "audit": work_type()})
    doc["routes"][0]["fan_out"] = [{"work_type": "sync"}, {"work_type": "audit"}]
    await apply(adb, doc)
    await insert_receipts(adb, [body(1), body(2)])
    before = metrics.SNAPSHOT_CHANGES._value.get()
    assert (await router.drain()).materialized == 2
    assert metrics.SNAPSHOT_CHANGES._value.get() == before + 1  # stale cache detected under lock
    assert await rows(adb, "SELECT DISTINCT generation FROM connector_event") == [(2,)]
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 4
    assert applied.generation == 1


async def test_work_notification_once_per_committed_batch(adb, db_url: str, make_router) -> None:
    await apply(adb, manifest())
    await insert_receipts(adb, [body(i) for i in range(20)])
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN connector_work")
        await (await make_router(batch_size=8)).drain()
        got = [n.channel async for n in listener.notifies(timeout=0.5)]
    assert got == ["connector_work"] * 3  # batches of 8 + 8 + 4


async def test_started_workers_drain_the_backlog_and_stop(adb, make_router) -> None:
    await apply(adb, manifest())
    await insert_receipts(adb, [body(i) for i in range(30)])
    router = await make_router(batch_size=10, concurrency=2, poll_interval_s=0.05)
    router.start()

    async def all_materialized() -> bool:
        left = "SELECT count(*) FROM connector_ingress_receipt WHERE router_status <> 'materialized'"
        return await scalar(adb, left) == 0

    await wait_until(all_materialized, what="all receipts materialized")
    await router.stop()
    assert await scalar(adb, "SELECT count(*) FROM connector_event") == 30


async def test_routing_lag_counts_due_and_stuck_receipts(adb) -> None:
    from connector.common.store import receipts

    assert await receipts.routing.receipt_routing_lag(adb) == 0.0
    [due, stuck] = await insert_receipts(adb, [body(1), body(2)])
    await adb.execute(
        "UPDATE connector_ingress_receipt SET next_attempt_at = now() - interval '20 s'"
        " WHERE receipt_id = %s",
        (due,),
    )
    assert 19 < await receipts.routing.receipt_routing_lag(adb) < 40
    # A receipt claimed by a process that died keeps counting from its acceptance.
    await adb.execute(
        """UPDATE connector_ingress_receipt SET router_status = 'routing', lease_until = now(),
             accepted_at = now() - interval '90 s' WHERE receipt_id = %s""",
        (stuck,),
    )
    assert 89 < await receipts.routing.receipt_routing_lag(adb) < 120
