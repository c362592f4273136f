"""TraceDelivery over a real admin gRPC server and a seeded database: the receipt's verification and
routing, events, WorkItems with their lanes and the reason each is not running (one per
``WaitReason``), payload roles, batching, and input errors.

Controls: each wait case is asserted against a seeded state that produces a different reason
(a blocked member behind a dead head vs. the head itself; a due item with and without a claimant;
retry with run_after in the future vs. past), so a ``why_not_running`` that answered one fixed
reason fails most of them; the batching test compares one WorkItem against three.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
import pytest

from connector.common.core.grpc_server import error_info
from connector.executor.admin import trace
from connector.executor.admin.auth import Principal, Role
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

from .conftest import OPERATOR, VIEW, VIEW_REPLAY, Admin, Seed, expect_error
from .recording import OnePool, Recording
from .test_find import _as_ingress_keys


async def _trace(admin: Admin, token: str = VIEW, **kw: Any) -> pb.TraceDeliveryResponse:
    return await admin.stub.TraceDelivery(pb.TraceDeliveryRequest(**kw), metadata=Admin.md(token))


async def _item_trace(admin: Admin, work_id: int) -> pb.WorkItemTrace:
    response = await _trace(admin, work_id=work_id)
    found = [w for e in response.events for w in e.work_items if w.work_item.work_id == work_id]
    assert len(found) == 1, response
    return found[0]


async def test_the_reason_of_every_wait(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack("shop")
    legacy = await seed.pack("old", claim_path="legacy_event")
    claimant = await seed.process("work_item")
    dead = await seed.item(pack, state="dead")
    succeeded = await seed.item(pack, state="succeeded")
    fenced = await seed.item(pack, state="awaiting_legacy_outcome")
    running = await seed.item(pack, state="processing")
    expired = await seed.item(pack, state="processing")
    await seed.conn.execute(
        "UPDATE connector_work_item SET lease_until = now() - interval '5 seconds' WHERE work_id = %s",
        (expired,),
    )
    backoff = await seed.item(pack, state="retry")
    await seed.conn.execute(
        "UPDATE connector_work_item SET run_after = now() + interval '10 minutes' WHERE work_id = %s",
        (backoff,),
    )
    due = await seed.item(pack, state="retry")  # run_after a second ago
    # A delayed item (pending, run_after ahead) and a lane member behind a delayed head.
    scheduled = await seed.item(pack, state="pending")
    delayed_head = await seed.item(pack, state="pending", source_lane="order:3")
    behind_delayed = await seed.item(pack, state="blocked", source_lane="order:3")
    await seed.conn.execute(
        "UPDATE connector_work_item SET run_after = now() + interval '10 minutes' WHERE work_id = ANY(%s)",
        ([scheduled, delayed_head],),
    )
    closed = await seed.item(legacy, state="pending")
    # A source lane held by a dead head; a target lane with a member in flight.
    dead_head = await seed.item(pack, state="dead", source_lane="order:1")
    behind_dead = await seed.item(pack, state="blocked", source_lane="order:1")
    behind_dead_2 = await seed.item(pack, state="blocked", source_lane="order:1")
    in_flight = await seed.item(pack, state="processing", target_lane="acct:9")
    behind_flight = await seed.item(pack, state="blocked", target_lane="acct:9")
    lost_promotion = await seed.item(pack, state="blocked", source_lane="order:2")

    W = types_pb2
    got = {w: await _item_trace(admin, w) for w in (
        dead, succeeded, fenced, running, expired, backoff, due, closed, dead_head, behind_dead,
        behind_dead_2, in_flight, behind_flight, lost_promotion, scheduled, delayed_head, behind_delayed,
    )}  # fmt: skip
    reasons = {w: t.wait.reason for w, t in got.items()}
    assert reasons == {
        dead: pb.WAIT_REASON_DEAD,
        succeeded: pb.WAIT_REASON_SUCCEEDED,
        fenced: pb.WAIT_REASON_AWAITING_LEGACY_OUTCOME,
        running: pb.WAIT_REASON_RUNNING,
        expired: pb.WAIT_REASON_LEASE_EXPIRED,
        backoff: pb.WAIT_REASON_BACKOFF,
        due: pb.WAIT_REASON_DUE,
        closed: pb.WAIT_REASON_CLAIM_PATH_CLOSED,
        dead_head: pb.WAIT_REASON_DEAD,
        behind_dead: pb.WAIT_REASON_LANE_BLOCKED,
        behind_dead_2: pb.WAIT_REASON_LANE_BLOCKED,
        in_flight: pb.WAIT_REASON_RUNNING,
        behind_flight: pb.WAIT_REASON_LANE_BLOCKED,
        lost_promotion: pb.WAIT_REASON_LANE_BLOCKED,
        scheduled: pb.WAIT_REASON_SCHEDULED,
        delayed_head: pb.WAIT_REASON_SCHEDULED,
        behind_delayed: pb.WAIT_REASON_LANE_BLOCKED,
    }
    # A delay reads as a delay (not a backoff), with its instant; the lane member names the wait.
    assert got[scheduled].wait.until == got[scheduled].work_item.run_after
    assert (
        got[scheduled].wait.detail.startswith("waiting until ")
        and "(delay of work type" in got[scheduled].wait.detail
    )
    assert "backoff" not in got[scheduled].wait.detail and got[backoff].wait.detail.startswith(
        "retry backoff"
    )
    assert got[behind_delayed].wait.blocking_work_id == delayed_head
    assert (
        "(pending: waiting until " in got[behind_delayed].wait.detail
        and "(delay)" in got[behind_delayed].wait.detail
    )
    assert "handler_error" in got[dead].wait.detail and f"dlq replay {dead}" in got[dead].wait.detail
    # A due item says how its priority ranks it (docs/adr/014-priorities.md); without a head, nothing.
    assert "ranked as if due" not in got[due].wait.detail and "in claim order" in got[due].wait.detail
    await seed.conn.execute(
        "UPDATE connector_work_item SET priority = 50, priority_head_s = 50 WHERE work_id = %s", (due,)
    )
    ranked = (await _item_trace(admin, due)).wait
    assert (
        ranked.reason == pb.WAIT_REASON_DUE and "(priority 50: ranked as if due 50 s earlier" in ranked.detail
    )
    assert got[running].wait.lease_owner == "executor-1" and got[running].wait.HasField("until")
    assert got[expired].wait.lease_owner == "executor-1"
    # Backoff: until is the item's run_after.
    assert got[backoff].wait.until == got[backoff].work_item.run_after
    assert got[backoff].wait.until.ToDatetime() > got[due].work_item.run_after.ToDatetime() + timedelta(
        minutes=9
    )
    assert "phase legacy_active" in got[closed].wait.detail
    # The lane head's work id, its state and the queue ahead.
    for member, ahead in ((behind_dead, 1), (behind_dead_2, 2)):
        t = got[member]
        assert t.wait.blocking_work_id == dead_head, t
        assert f"behind work item {dead_head} (dead" in t.wait.detail
        (lane,) = t.lanes
        assert (lane.kind, lane.lane_key, lane.head_work_id, lane.head_state, lane.ahead) == (
            pb.LANE_KIND_SOURCE, "order:1", dead_head, W.WORK_ITEM_STATE_DEAD, ahead,
        )  # fmt: skip
    t = got[behind_flight]
    assert t.wait.blocking_work_id == in_flight and t.wait.lease_owner == "executor-1"
    assert t.lanes[0].kind == pb.LANE_KIND_TARGET_MUTATION and t.lanes[0].processing_work_id == in_flight
    assert got[lost_promotion].wait.blocking_work_id == 0 and "promotion" in got[lost_promotion].wait.detail

    # Without a fresh claimant, the due item says so.
    await seed.conn.execute("DELETE FROM connector_process WHERE process_id = %s", (claimant,))
    assert (await _item_trace(admin, due)).wait.reason == pb.WAIT_REASON_NO_CLAIMANT
    # Control: the same item once its run_after is past the backoff one is not BACKOFF any more.
    await seed.conn.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (backoff,))
    assert (await _item_trace(admin, backoff)).wait.reason == pb.WAIT_REASON_NO_CLAIMANT
    # Control: once its time has come, the delayed item is due, and its lane member waits on "due next".
    await seed.conn.execute(
        "UPDATE connector_work_item SET run_after = now() WHERE work_id = ANY(%s)",
        ([scheduled, delayed_head],),
    )
    assert (await _item_trace(admin, scheduled)).wait.reason == pb.WAIT_REASON_NO_CLAIMANT
    assert "due next" in (await _item_trace(admin, behind_delayed)).wait.detail


async def test_the_receipt_its_verification_and_routing(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack("shop")
    work_id = await seed.item(pack, state="pending")
    failed = await seed.receipt(
        "shop", "orders", status="failed", error_class="parse", error_summary="bad json"
    )
    response = await _trace(admin, work_id=work_id)
    assert response.routing.verification_scheme == "hmac-sha256"
    assert response.routing.verification_key_ref == "env:SHOP_SECRET"
    assert response.receipt.HasField("received_time") and response.receipt.HasField("accept_time")
    assert response.receipt.body == b""  # no payload unless asked for
    assert response.HasField("observe_time")
    (event,) = response.events
    assert event.execution_owner == "work_item"
    assert [w.work_item.work_id for w in event.work_items] == [work_id]
    # A receipt whose routing failed: no events, the routing error and what to do.
    failed_trace = await _trace(admin, receipt_id=failed)
    assert list(failed_trace.events) == []
    assert failed_trace.receipt.status == types_pb2.RECEIPT_STATUS_FAILED
    assert "parse: bad json" in failed_trace.routing.detail
    assert f"receipts replay {failed}" in failed_trace.routing.detail
    # Never a signature or secret in the answer (the seeded body holds a marker; only a reference).
    assert b"do-not-leak" not in response.SerializeToString()
    # The delivery's OpenTelemetry trace (docs/tracing.md): none while tracing was off, else the
    # traceparent the ingress stored and its trace id.
    assert (response.traceparent, response.trace_id) == ("", "")
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await seed.conn.execute(
        "UPDATE connector_ingress_receipt SET traceparent = %s WHERE receipt_id = %s",
        (tp, response.receipt.receipt_id),
    )
    traced = await _trace(admin, work_id=work_id)
    assert (traced.traceparent, traced.trace_id) == (tp, "4bf92f3577b34da6a3ce929d0e0e4736")


async def test_the_payload_needs_a_replay_role(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack("shop")
    work_id = await seed.item(pack, state="dead")
    await expect_error(
        _trace(admin, VIEW, work_id=work_id, include_payload=True),
        grpc.StatusCode.PERMISSION_DENIED,
        "PAYLOAD_NOT_ALLOWED",
    )
    allowed = await _trace(admin, VIEW_REPLAY, work_id=work_id, include_payload=True)
    assert allowed.receipt.body == b'{"id": 1, "secret_field": "do-not-leak"}'


async def test_trace_by_provider_delivery_id_and_ambiguity(admin: Admin, seed: Seed) -> None:
    shop = await seed.pack("shop")
    crm = await seed.pack("crm", routes={"orders": ["sync"]})
    a = await seed.item(shop, state="pending")
    b = await seed.item(crm, state="dead")
    await seed.conn.execute("UPDATE connector_ingress_receipt SET provider_delivery_id = 'evt_123'")
    await _as_ingress_keys(seed)
    exc = await expect_error(
        _trace(admin, provider_delivery_id="evt_123"), grpc.StatusCode.INVALID_ARGUMENT, "AMBIGUOUS_DELIVERY"
    )
    info = error_info(exc)
    assert info is not None and len(info.metadata["receipt_ids"].split(",")) == 2
    one = await _trace(admin, provider_delivery_id="evt_123", namespace="crm")
    assert [w.work_item.work_id for e in one.events for w in e.work_items] == [b]
    other = await _trace(admin, provider_delivery_id="evt_123", namespace="shop")
    assert [w.work_item.work_id for e in other.events for w in e.work_items] == [a]


@pytest.mark.parametrize(
    ("kw", "code", "reason"),
    [
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "FILTER_REQUIRED"),
        ({"receipt_id": 1, "work_id": 1}, grpc.StatusCode.INVALID_ARGUMENT, "FILTER_REQUIRED"),
        ({"namespace": "shop"}, grpc.StatusCode.INVALID_ARGUMENT, "FILTER_REQUIRED"),
        ({"receipt_id": 1, "namespace": "shop"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        ({"receipt_id": -1}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        ({"work_id": -7}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        ({"receipt_id": 10**12}, grpc.StatusCode.NOT_FOUND, "RECEIPT_NOT_FOUND"),
        ({"work_id": 10**12}, grpc.StatusCode.NOT_FOUND, "WORK_ITEM_NOT_FOUND"),
        ({"provider_delivery_id": "nope"}, grpc.StatusCode.NOT_FOUND, "DELIVERY_NOT_FOUND"),
        (
            {"provider_delivery_id": "d-1", "namespace": "nope"},
            grpc.StatusCode.NOT_FOUND,
            "DELIVERY_NOT_FOUND",
        ),
    ],
)
async def test_input_errors(
    admin: Admin, seed: Seed, kw: dict[str, Any], code: grpc.StatusCode, reason: str
) -> None:
    await seed.pack("shop")
    await expect_error(_trace(admin, **kw), code, reason)


async def test_the_trace_is_batched_whatever_the_number_of_work_items(admin: Admin, seed: Seed) -> None:
    """A delivery fanned out to three WorkItems (two in lanes) costs the same statements as one with
    a single lane member. Control: the count grows if a statement ran per WorkItem."""
    pack = await seed.pack("shop", routes={"orders": ["a", "b", "c"]})
    single_receipt = await seed.receipt("shop", "orders")
    await seed.item(pack, work_type="a", state="blocked", source_lane="s:1", receipt_id=single_receipt)
    fan_receipt = await seed.receipt("shop", "orders")
    for wt, lane in (("a", "s:2"), ("b", "s:3"), ("c", None)):
        await seed.item(pack, work_type=wt, state="pending", source_lane=lane, receipt_id=fan_receipt)
    await seed.process("work_item")
    operator = Principal("test", frozenset({Role.OPERATOR}))

    async def count(receipt_id: int) -> tuple[int, int]:
        async with admin.pool.connection() as raw:
            rec = Recording(raw)
            response = await trace.trace_delivery(
                OnePool(rec), pb.TraceDeliveryRequest(receipt_id=receipt_id), operator, stale_s=30.0
            )
        return len(rec.statements), sum(len(e.work_items) for e in response.events)

    single, fan = await count(single_receipt), await count(fan_receipt)
    assert single[1] == 1 and fan[1] == 3
    assert single[0] == fan[0] == 8, (single, fan)  # snapshot + 7 reads (the attempts one)


async def test_paused_and_cancelled_items_say_so(admin: Admin, seed: Seed) -> None:
    """Through the real PausePack / ResumePack / CancelWorkItem RPCs. Control: the same due item is
    DUE before the pause and after the resume, and a queue-class pause leaves other classes DUE."""
    pack = await seed.pack("shop", routes={"orders": ["sync"]})
    await seed.generation(pack, 2, activate=False, queue_class="bulk")  # declares queue class bulk
    await seed.process("work_item")
    due = await seed.item(pack, state="pending")
    bulk = await seed.item(pack, state="pending", queue_class="bulk")
    to_cancel = await seed.item(pack, state="dead")
    operator = Admin.md(OPERATOR)
    assert (await _item_trace(admin, due)).wait.reason == pb.WAIT_REASON_DUE

    await admin.stub.PausePack(
        pb.PausePackRequest(installed_pack_id=pack, reason="provider outage INC-42", request_id="p1"),
        metadata=operator,
    )
    wait = (await _item_trace(admin, due)).wait
    assert wait.reason == pb.WAIT_REASON_PAUSED, wait
    assert f"pack {pack} is paused by key:" in wait.detail and "provider outage INC-42" in wait.detail
    await admin.stub.ResumePack(
        pb.ResumePackRequest(installed_pack_id=pack, request_id="r1"), metadata=operator
    )
    assert (await _item_trace(admin, due)).wait.reason == pb.WAIT_REASON_DUE

    await admin.stub.PausePack(
        pb.PausePackRequest(
            installed_pack_id=pack, queue_class="bulk", reason="slow target", request_id="p2"
        ),
        metadata=operator,
    )
    wait = (await _item_trace(admin, bulk)).wait
    assert wait.reason == pb.WAIT_REASON_PAUSED and "queue class 'bulk' is paused" in wait.detail
    assert (await _item_trace(admin, due)).wait.reason == pb.WAIT_REASON_DUE

    await admin.stub.CancelWorkItem(
        pb.CancelWorkItemRequest(work_id=to_cancel, reason="duplicate order", request_id="c1"),
        metadata=operator,
    )
    t = await _item_trace(admin, to_cancel)
    assert t.work_item.state == types_pb2.WORK_ITEM_STATE_CANCELLED
    assert t.wait.reason == pb.WAIT_REASON_CANCELLED and "duplicate order" in t.wait.detail
    found = await admin.stub.FindDeliveries(
        pb.FindDeliveriesRequest(work_item_state="cancelled"), metadata=Admin.md(VIEW)
    )
    assert [w.work_id for d in found.deliveries for w in d.work_items] == [to_cancel]


async def test_rate_and_concurrency_limited_items_say_so(admin: Admin, seed: Seed) -> None:
    """A pending item deferred for its rate-limit budget, and one parked for a concurrency slot,
    each name their key. Controls: the same items without their keys read as scheduled (a delay), so
    neither reason is answered from ``run_after`` alone."""
    pack = await seed.pack("shop", routes={"orders": ["sync"]})
    await seed.process("work_item")
    deferred = await seed.item(pack, state="pending")
    parked = await seed.item(pack, state="pending")
    await seed.conn.execute(
        "UPDATE connector_work_item SET rate_key = 'crm:A1', run_after = now() + interval '30 s',"
        " updated_at = clock_timestamp() WHERE work_id = %s",  # as the claim's deferral writes it
        (deferred,),
    )
    await seed.conn.execute(
        "UPDATE connector_work_item SET concurrency_key = 'crm:B2', run_after = '9999-01-01 00:00:00+00'"
        " WHERE work_id = %s",
        (parked,),
    )
    wait = (await _item_trace(admin, deferred)).wait
    assert wait.reason == pb.WAIT_REASON_RATE_LIMITED and "'crm:A1'" in wait.detail, wait
    assert wait.HasField("until")
    wait = (await _item_trace(admin, parked)).wait
    assert wait.reason == pb.WAIT_REASON_CONCURRENCY_LIMITED and "'crm:B2'" in wait.detail, wait
    await seed.conn.execute(
        "UPDATE connector_work_item SET rate_key = NULL, concurrency_key = NULL WHERE work_id = ANY(%s)",
        ([deferred, parked],),
    )
    assert (await _item_trace(admin, deferred)).wait.reason == pb.WAIT_REASON_SCHEDULED
    assert (await _item_trace(admin, parked)).wait.reason == pb.WAIT_REASON_SCHEDULED


async def test_debounced_items_say_so(admin: Admin, seed: Seed) -> None:
    """The live newest item of a debounce key waits for its window, a parked one behind it says it
    will be covered, a coalesced one names the item that covered it; GetQueueStats lists the key.
    Control: without the key, the same rows read as scheduled."""
    pack = await seed.pack("shop", routes={"orders": ["sync"]})
    await seed.process("work_item")
    parked = await seed.item(pack, state="pending")
    live = await seed.item(pack, state="pending")
    covered = await seed.item(pack, state="pending")
    await seed.conn.execute(
        "INSERT INTO connector_debounce (installed_pack_id, work_type, debounce_key, window_s, max_wait_s)"
        " VALUES (%s, 'sync', 'acct:7', 2, 20)",
        (pack,),
    )
    await seed.conn.execute(
        "UPDATE connector_work_item SET debounce_key = 'acct:7', work_type = 'sync',"
        " run_after = CASE WHEN work_id = %s THEN now() + interval '2 s' ELSE '9999-01-01 00:00:00+00' END"
        " WHERE work_id = ANY(%s)",
        (live, [parked, live]),
    )
    await seed.conn.execute(
        "UPDATE connector_work_item SET debounce_key = 'acct:7', state = 'coalesced', outcome = 'coalesced',"
        " covered_by = %s, finished_at = now() WHERE work_id = %s",
        (live, covered),
    )
    wait = (await _item_trace(admin, live)).wait
    assert wait.reason == pb.WAIT_REASON_DEBOUNCED and "newest item" in wait.detail and wait.HasField("until")
    wait = (await _item_trace(admin, parked)).wait
    assert wait.reason == pb.WAIT_REASON_DEBOUNCED and "parked" in wait.detail, wait
    t = await _item_trace(admin, covered)
    assert t.work_item.state == types_pb2.WORK_ITEM_STATE_COALESCED and t.work_item.covered_by == live
    assert t.wait.reason == pb.WAIT_REASON_COALESCED and t.wait.blocking_work_id == live
    stats = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    (d,) = stats.debounce
    assert (d.key, d.work_type, d.waiting, d.parked) == ("acct:7", "sync", 2, 1)
    assert (
        d.window.ToTimedelta().total_seconds() == 2 and 0 < d.next_due_in.ToTimedelta().total_seconds() <= 2
    )
    await seed.conn.execute(
        "UPDATE connector_work_item SET debounce_key = NULL WHERE work_id = ANY(%s)", ([parked, live],)
    )
    assert (await _item_trace(admin, live)).wait.reason == pb.WAIT_REASON_SCHEDULED


async def test_a_delayed_item_with_a_rate_key_waits_on_its_delay(admin: Admin, seed: Seed) -> None:
    """An item inserted with a delay and a rate key, never deferred (the row was not rewritten since
    its insert): it waits on the delay, not on the budget. Control: the same row as a deferral
    rewrites it reads as rate limited."""
    pack = await seed.pack("shop", routes={"orders": ["sync"]})
    await seed.process("work_item")
    delayed = await seed.item(pack, state="pending")
    await seed.conn.execute(
        "UPDATE connector_work_item SET rate_key = 'crm:A1', run_after = now() + interval '30 s',"
        " updated_at = created_at WHERE work_id = %s",
        (delayed,),
    )
    wait = (await _item_trace(admin, delayed)).wait
    assert wait.reason == pb.WAIT_REASON_SCHEDULED, wait
    assert "then rate-limit key 'crm:A1' applies" in wait.detail, wait
    await seed.conn.execute(
        "UPDATE connector_work_item SET updated_at = clock_timestamp() WHERE work_id = %s", (delayed,)
    )
    assert (await _item_trace(admin, delayed)).wait.reason == pb.WAIT_REASON_RATE_LIMITED


async def test_attempts_in_claim_order_with_the_success_from_the_work_item(admin: Admin, seed: Seed) -> None:
    """Two failed claims then a success: three attempts, tokens increasing, the first two as the
    fail statement kept them (outcome, class, sanitized error, owner), the third read from the
    WorkItem row (no attempt row for it). Control: a running claim shows as ``running`` with its
    owner, and an item never claimed has none."""
    from connector.common.store.work_items import claim, finalize

    pack = await seed.pack("shop")
    item = await seed.item(pack, state="pending", failure_class=None, finished_ago_s=None)
    never = await seed.item(pack, state="pending", failure_class=None, finished_ago_s=None)
    await seed.conn.execute("UPDATE connector_work_item SET attempts = 0, lease_token = 0")
    await seed.conn.execute(
        "UPDATE connector_work_item SET run_after = now() + interval '1 hour' WHERE work_id = %s", (never,)
    )

    async def take(owner: str) -> int:
        rows = await claim.work_item_claim_batch(seed.conn, [pack], ["default"], [1], owner=owner, lease_s=30)
        assert [r[0] for r in rows] == [item]
        return int(rows[0][1])

    for n, owner in enumerate(("exec-a", "exec-b")):
        batch = finalize.FailBatch()
        batch.add(
            item, await take(owner), finalize.FailOp.RETRY, failure_class="http_503", summary=f"503 #{n}"
        )
        assert await finalize.work_item_fail_batch(seed.conn, batch) == [(item, "retry")]
        await seed.conn.execute(
            "UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (item,)
        )
    token = await take("exec-c")
    running = await _item_trace(admin, item)
    assert [(a.outcome, a.lease_owner, a.lease_token) for a in running.attempts] == [
        ("retry", "exec-a", 1),
        ("retry", "exec-b", 2),
        ("running", "exec-c", 3),
    ]
    assert not running.attempts[2].HasField("end_time")
    assert await finalize.work_item_complete_batch(seed.conn, [item], [token]) == [item]
    got = await _item_trace(admin, item)
    assert [
        (a.attempt, a.outcome, a.lease_token, a.failure_class, a.failure_summary) for a in got.attempts
    ] == [
        (1, "retry", 1, "http_503", "503 #0"),
        (2, "retry", 2, "http_503", "503 #1"),
        (3, "succeeded", 3, "", ""),
    ]
    for a in got.attempts:
        assert a.end_time.ToDatetime() >= a.start_time.ToDatetime()
        assert a.duration.ToTimedelta() == a.end_time.ToDatetime() - a.start_time.ToDatetime()
    assert got.claims_not_kept == 0
    assert (await _item_trace(admin, never)).attempts == []


async def test_attempts_of_old_claims_are_said_not_kept(admin: Admin, seed: Seed) -> None:
    """25 failed claims, then a success: the attempts of the last 20 claims are shown (tokens 7-26),
    claims 1-6 are counted as not kept. Control: the success (claim 26) overwrote no slot, so claim
    6's row is still in the table (20 rows): the trace leaves it out."""
    from connector.common.store.work_items import claim, finalize

    pack = await seed.pack("shop")
    item = await seed.item(pack, state="pending", failure_class=None, finished_ago_s=None)
    await seed.conn.execute(
        "UPDATE connector_work_item SET max_attempts = 100, attempts = 0, lease_token = 0 WHERE work_id = %s",
        (item,),
    )
    token = 0
    for n in range(26):
        ((_, token, *_),) = await claim.work_item_claim_batch(
            seed.conn, [pack], ["default"], [1], owner=f"o{n}", lease_s=30
        )
        if n == 25:
            assert await finalize.work_item_complete_batch(seed.conn, [item], [token]) == [item]
            break
        batch = finalize.FailBatch()
        batch.add(item, token, finalize.FailOp.RETRY, failure_class="c", summary="s")
        await finalize.work_item_fail_batch(seed.conn, batch)
        await seed.conn.execute(
            "UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (item,)
        )
    got = await _item_trace(admin, item)
    assert got.claims_not_kept == 6
    assert [a.lease_token for a in got.attempts] == list(range(7, 27))
    assert got.attempts[-1].outcome == "succeeded"
    assert await seed.one("SELECT count(*) FROM connector_work_attempt WHERE work_id = %s", (item,)) == 20
