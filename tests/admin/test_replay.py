"""ReplayWorkItem: an explicit new attempt against the current active generation, or a reasoned
refusal (fail closed); fenced against concurrent changes; AIP-155 request ids; lanes settled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import psycopg
import pytest

from connector.executor.admin import replay
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

from .conftest import REPLAY, VIEW_REPLAY, Admin, Seed, expect_error


async def _replay(admin: Admin, work_id: int, request_id: str = "") -> pb.ReplayWorkItemResponse:
    return await admin.stub.ReplayWorkItem(
        pb.ReplayWorkItemRequest(work_id=work_id, request_id=request_id), metadata=Admin.md(REPLAY)
    )


async def _refused(admin: Admin, work_id: int, reason: str) -> None:
    exc = await expect_error(
        _replay(admin, work_id),
        grpc.StatusCode.FAILED_PRECONDITION,
        reason,
    )
    assert exc.details()


async def test_replay_is_a_new_attempt_on_the_active_generation(
    admin: Admin, seed: Seed, db_url: str
) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, generation=1)
    await seed.generation(pack, 2, queue_class="fast", max_attempts=9)
    cur = await seed.conn.execute(
        "SELECT * FROM connector_event e WHERE e.event_id = (SELECT event_id"
        " FROM connector_work_item WHERE work_id = %s)",
        (work_id,),
    )
    event_before = await cur.fetchone()

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN connector_work")
        response = await _replay(admin, work_id)
        notes = [n async for n in listener.notifies(timeout=5.0, stop_after=1)]
    assert [n.channel for n in notes] == ["connector_work"]

    item = response.work_item
    assert item.work_id == work_id
    assert item.state == types_pb2.WORK_ITEM_STATE_PENDING
    assert item.generation == 2
    assert item.attempts == 0 and item.replay_count == 1
    assert item.queue_class == "fast" and item.max_attempts == 9
    assert item.outcome == "" and not item.HasField("finish_time") and item.lease_owner == ""
    # The last failure stays readable until the next outcome overwrites it.
    assert item.failure_class == "handler_error"
    row = await seed.row(work_id)
    assert row["state"] == "pending" and row["generation"] == 2 and row["finished_at"] is None
    due = await seed.one("SELECT run_after <= now() FROM connector_work_item WHERE work_id = %s", (work_id,))
    assert due is True
    cur = await seed.conn.execute("SELECT * FROM connector_event WHERE event_id = %s", (row["event_id"],))
    assert await cur.fetchone() == event_before  # the immutable fact is untouched


async def test_only_dead_items_replay(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    for state in ("succeeded", "pending", "retry", "processing", "blocked"):
        work_id = await seed.item(pack, state=state)
        await _refused(admin, work_id, "NOT_DEAD")
        assert await seed.state(work_id) == state


async def test_dry_run_checks_and_changes_nothing(admin: Admin, seed: Seed) -> None:
    """#24: ``dlq replay ID --dry-run`` was refused. A dry run answers what a replay would (the
    item as it is, or the same refusal) and changes nothing: no new attempt, no request id kept."""
    pack = await seed.pack()
    dead = await seed.item(pack)
    done = await seed.item(pack, state="succeeded")
    request = pb.ReplayWorkItemRequest(work_id=dead, dry_run=True, request_id="dry-1")
    answer = await admin.stub.ReplayWorkItem(request, metadata=Admin.md(REPLAY))
    assert answer.dry_run and answer.work_item.work_id == dead
    assert answer.work_item.state == types_pb2.WORK_ITEM_STATE_DEAD and answer.work_item.replay_count == 0
    assert await seed.state(dead) == "dead"
    await expect_error(
        admin.stub.ReplayWorkItem(
            pb.ReplayWorkItemRequest(work_id=done, dry_run=True), metadata=Admin.md(REPLAY)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_DEAD",
    )
    # The dry run's request id was not kept: a real replay with it replays.
    real = await admin.stub.ReplayWorkItem(
        pb.ReplayWorkItemRequest(work_id=dead, request_id="dry-1"), metadata=Admin.md(REPLAY)
    )
    assert not real.dry_run and real.work_item.replay_count == 1 and await seed.state(dead) == "pending"


async def test_legacy_terminal_and_fenced_items_are_never_reopened(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    reconciled = await seed.item(pack, state="reconciled_legacy_terminal")
    awaiting = await seed.item(pack, state="awaiting_legacy_outcome")
    before = await seed.row(reconciled)
    await _refused(admin, reconciled, "LEGACY_RECONCILED")
    await _refused(admin, awaiting, "LEGACY_OUTCOME_PENDING")
    assert await seed.row(reconciled) == before
    assert await seed.state(awaiting) == "awaiting_legacy_outcome"


async def test_ownership_generation_and_incarnation_refusals(admin: Admin, seed: Seed) -> None:
    shop = await seed.pack("shop")
    legacy = await seed.item(shop, execution_owner="legacy_event")
    await _refused(admin, legacy, "LEGACY_OWNED")

    crm = await seed.pack("crm")
    orphan = await seed.item(crm)
    await seed.conn.execute(
        "UPDATE connector_installed_pack SET active_generation = NULL WHERE installed_pack_id = %s", (crm,)
    )
    await _refused(admin, orphan, "NO_ACTIVE_GENERATION")

    erp = await seed.pack("erp")
    old = await seed.item(erp, incarnation=1)
    await seed.conn.execute(
        "UPDATE connector_installed_pack SET incarnation = 2 WHERE installed_pack_id = %s", (erp,)
    )
    await _refused(admin, old, "INCARNATION_CHANGED")


async def test_active_generation_not_work_item_owned(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)
    for generation, claim_path in ((2, "legacy_event"), (3, "none")):
        await seed.generation(pack, generation, claim_path=claim_path)
        await _refused(admin, work_id, "GENERATION_NOT_WORK_ITEM_OWNED")
        assert await seed.state(work_id) == "dead"


async def test_route_gone_and_work_type_gone(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack(routes={"orders": ["sync", "audit"], "refunds": ["sync"]})
    sync_item = await seed.item(pack, work_type="sync")
    audit_item = await seed.item(pack, work_type="audit")
    refund_item = await seed.item(pack, route_key="refunds")
    await seed.generation(pack, 2, routes={"orders": ["sync"]})
    await _refused(admin, refund_item, "ROUTE_GONE")
    await _refused(admin, audit_item, "WORK_TYPE_GONE")
    assert (await _replay(admin, sync_item)).work_item.generation == 2


async def _unchanged(seed: Seed, work_id: int) -> None:
    row = await seed.row(work_id)
    assert (row["state"], row["generation"], row["replay_count"]) == ("dead", 1, 0), (
        "a refusal changes nothing"
    )


async def companion_snapshot_checked(admin: Admin, seed: Seed) -> None:
    """Issue #28 item 5: an event materialized under a route that required less than the current
    one is refused (COMPANION_INCOMPLETE, the missing field named, never a value); once the current
    route requires only what the snapshot holds, the same item replays."""
    extract = {"source_object_id": {"pointer": "/id"}, "event_kind": {"pointer": "/type"}}
    pack = await seed.pack(route_extra={"extract": extract, "required": ["source_object_id"]})
    work_id = await seed.item(pack, companion={"source_object_id": "1"})
    await seed.generation(
        pack, 2, route_extra={"extract": extract, "required": ["source_object_id", "event_kind"]}
    )
    exc = await expect_error(
        _replay(admin, work_id), grpc.StatusCode.FAILED_PRECONDITION, "COMPANION_INCOMPLETE"
    )
    assert "['event_kind']" in exc.details() and "'1'" not in exc.details()
    assert len(exc.details().splitlines()) == 1
    await _unchanged(seed, work_id)
    await seed.generation(pack, 3, route_extra={"extract": extract, "required": ["source_object_id"]})
    assert (await _replay(admin, work_id)).work_item.generation == 3


async def identity_template_checked(admin: Admin, seed: Seed) -> None:
    """Issue #28 item 5: the current route's identity template, applied to the event's stored facts,
    must give the event's key. The event was keyed ``orders:id:<delivery id>#0`` (idempotency
    header); a route that keys by body digest, or whose ``extract.delivery_id`` pointer yields
    another id from the stored body, is refused (IDENTITY_CHANGED, no id or key in the message);
    back on a template that yields it, the item replays."""
    pack = await seed.pack()
    work_id = await seed.item(pack)  # body {"id": 1, ...}, delivery id d-<n>
    key = await seed.one(
        "SELECT e.idempotency_key FROM connector_event e JOIN connector_work_item w USING (event_id)"
        " WHERE w.work_id = %s",
        (work_id,),
    )
    assert key.startswith("orders:id:d-") and key.endswith("#0")
    delivery_id = key.removeprefix("orders:id:").removesuffix("#0")

    await seed.generation(pack, 2, route_extra={"idempotency_header": None})  # keyed by body digest
    exc = await expect_error(_replay(admin, work_id), grpc.StatusCode.FAILED_PRECONDITION, "IDENTITY_CHANGED")
    assert "the event's key is not the template's" in exc.details()
    assert delivery_id not in exc.details() and len(exc.details().splitlines()) == 1
    await _unchanged(seed, work_id)

    body_id = {"idempotency_header": None, "extract": {"delivery_id": {"pointer": "/id"}}}
    await seed.generation(pack, 3, route_extra=body_id)  # the body's /id is 1, not the delivery id
    exc = await expect_error(_replay(admin, work_id), grpc.StatusCode.FAILED_PRECONDITION, "IDENTITY_CHANGED")
    assert "extract.delivery_id yields another delivery id" in exc.details()
    await _unchanged(seed, work_id)

    await seed.generation(pack, 4)  # the idempotency header again
    assert (await _replay(admin, work_id)).work_item.generation == 4


async def body_pointer_checked(admin: Admin, seed: Seed) -> None:
    """The re-derivation's positive case: a receipt keyed by ``/id`` of its body replays under a
    route whose ``extract.delivery_id`` is that pointer (and not under one pointing elsewhere)."""
    pack = await seed.pack(
        route_extra={"idempotency_header": None, "extract": {"delivery_id": {"pointer": "/id"}}}
    )
    work_id = await seed.item(pack, body=b'{"id": "d-1", "other": "x"}')
    await seed.conn.execute(
        "UPDATE connector_ingress_receipt SET provider_delivery_id = 'd-1' WHERE receipt_id ="
        " (SELECT e.receipt_id FROM connector_event e JOIN connector_work_item w USING (event_id)"
        " WHERE w.work_id = %s)",
        (work_id,),
    )
    moved = {"idempotency_header": None, "extract": {"delivery_id": {"pointer": "/other"}}}
    await seed.generation(pack, 2, route_extra=moved)
    await expect_error(_replay(admin, work_id), grpc.StatusCode.FAILED_PRECONDITION, "IDENTITY_CHANGED")
    await seed.generation(
        pack, 3, route_extra={"idempotency_header": None, "extract": {"delivery_id": {"pointer": "/id"}}}
    )
    assert (await _replay(admin, work_id)).work_item.generation == 3


async def test_companion_snapshot_must_cover_the_current_routes_required_fields(
    admin: Admin, seed: Seed
) -> None:
    await companion_snapshot_checked(admin, seed)


async def test_identity_template_must_yield_the_events_replay_identity(admin: Admin, seed: Seed) -> None:
    await identity_template_checked(admin, seed)


async def test_a_body_pointer_delivery_id_that_yields_the_key_replays(admin: Admin, seed: Seed) -> None:
    await body_pointer_checked(admin, seed)


# The controls: each check above against a build without the replay check it exists for.
WITHOUT_CHECK: list[tuple[str, Callable[[Admin, Seed], Awaitable[None]]]] = [
    ("_companion_refusal", companion_snapshot_checked),
    ("_identity_refusal", identity_template_checked),
    ("_identity_refusal", body_pointer_checked),
]


@pytest.mark.parametrize(("removed", "check"), WITHOUT_CHECK, ids=lambda v: getattr(v, "__name__", v))
async def test_control_replay_without_its_check_fails(
    admin: Admin,
    seed: Seed,
    monkeypatch: pytest.MonkeyPatch,
    removed: str,
    check: Callable[..., Awaitable[None]],
) -> None:
    """Control: ``replay.<removed>`` answering "no refusal" (the check deleted); the item replays
    where the test expects COMPANION_INCOMPLETE / IDENTITY_CHANGED, and the check fails."""
    assert callable(getattr(replay, removed))
    monkeypatch.setattr(replay, removed, lambda *args: None)
    with pytest.raises(AssertionError, match=r"expected StatusCode\.FAILED_PRECONDITION, the call succeeded"):
        await check(admin, seed)


async def test_payload_missing(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)
    # The schema already refuses a receipt without body and body_ref; drop that backstop in this
    # throwaway database to prove the replay check does not rely on it.
    await seed.conn.execute(
        "ALTER TABLE connector_ingress_receipt DROP CONSTRAINT ck_connector_ingress_receipt_body_present"
    )
    await seed.conn.execute(
        "UPDATE connector_ingress_receipt SET body = NULL, body_ref = NULL WHERE receipt_id ="
        " (SELECT e.receipt_id FROM connector_event e JOIN connector_work_item w USING (event_id)"
        " WHERE w.work_id = %s)",
        (work_id,),
    )
    await _refused(admin, work_id, "PAYLOAD_MISSING")


async def test_body_ref_is_enough(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, body=None, body_ref="s3://bucket/receipt-1")
    assert (await _replay(admin, work_id)).work_item.state == types_pb2.WORK_ITEM_STATE_PENDING


async def test_not_found_and_invalid(admin: Admin, seed: Seed) -> None:
    await expect_error(_replay(admin, 987654), grpc.StatusCode.NOT_FOUND, "WORK_ITEM_NOT_FOUND")
    await expect_error(_replay(admin, 0), grpc.StatusCode.INVALID_ARGUMENT)
    await expect_error(_replay(admin, 1, request_id="x" * 201), grpc.StatusCode.INVALID_ARGUMENT)


async def test_second_replay_of_the_same_item_is_refused(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)
    await _replay(admin, work_id)
    await _refused(admin, work_id, "NOT_DEAD")
    assert (await seed.row(work_id))["replay_count"] == 1


async def test_concurrent_change_between_check_and_update_is_aborted(
    admin: Admin, seed: Seed, db_url: str
) -> None:
    """The UPDATE is fenced by state and replay_count: a concurrent transition that commits while
    the replay waits for the row makes it match nothing, answered ABORTED (never a double replay)."""
    pack = await seed.pack()
    work_id = await seed.item(pack)
    async with await psycopg.AsyncConnection.connect(db_url) as other:
        await other.execute("SELECT 1 FROM connector_work_item WHERE work_id = %s FOR UPDATE", (work_id,))
        call = asyncio.ensure_future(_replay(admin, work_id))
        # Signal, not sleep: wait until the replay's UPDATE is blocked on our row lock.
        for _ in range(500):
            blocked = await seed.one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE '%%UPDATE connector_work_item%%'"
            )
            if blocked:
                break
            await asyncio.sleep(0.01)
        assert blocked, "the replay never reached its fenced UPDATE"
        # Another replay won meanwhile (and the item died again): replay_count moved on.
        await other.execute(
            "UPDATE connector_work_item SET replay_count = replay_count + 1 WHERE work_id = %s", (work_id,)
        )
        await other.commit()
    await expect_error(call, grpc.StatusCode.ABORTED, "CONCURRENT_CHANGE")
    row = await seed.row(work_id)
    assert row["state"] == "dead" and row["replay_count"] == 1


async def test_request_id_returns_the_first_answer(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)
    first = await _replay(admin, work_id, request_id="req-1")
    again = await _replay(admin, work_id, request_id="req-1")  # item is pending now; no NOT_DEAD
    assert again == first
    assert (await seed.row(work_id))["replay_count"] == 1
    stored = await seed.one("SELECT method FROM connector_admin_request WHERE request_id = 'req-1'")
    assert stored == "ReplayWorkItem"
    await expect_error(
        admin.stub.ReplayReceipt(
            pb.ReplayReceiptRequest(receipt_id=1, request_id="req-1"), metadata=Admin.md(REPLAY)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "REQUEST_ID_REUSED",
    )


async def test_refused_call_stores_no_answer(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, state="pending")
    await expect_error(_replay(admin, work_id, request_id="req-2"), grpc.StatusCode.FAILED_PRECONDITION)
    assert await seed.one("SELECT count(*) FROM connector_admin_request") == 0


async def test_concurrent_duplicates_with_one_request_id_replay_once(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)
    answers = await asyncio.gather(*(_replay(admin, work_id, request_id="req-3") for _ in range(5)))
    assert all(a == answers[0] for a in answers)
    assert (await seed.row(work_id))["replay_count"] == 1


# --- lanes --------------------------------------------------------------------------------------


async def test_replayed_dead_head_runs_first_and_its_lane_stays_ordered(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    head = await seed.item(pack, source_lane="order:1")
    follower = await seed.item(pack, state="blocked", source_lane="order:1")
    response = await _replay(admin, head)
    assert response.work_item.state == types_pb2.WORK_ITEM_STATE_PENDING
    assert await seed.state(follower) == "blocked"


async def test_replayed_continue_head_takes_its_lane_back(admin: Admin, seed: Seed) -> None:
    """A dead head whose policy let the lane continue is earlier than the members that moved on:
    after replay it runs first and the not-yet-started later member waits again."""
    pack = await seed.pack(dead_head="continue")
    head = await seed.item(pack, target_lane="acct:9", dead_blocks=False)
    later = await seed.item(pack, state="pending", target_lane="acct:9")
    response = await _replay(admin, head)
    assert response.work_item.state == types_pb2.WORK_ITEM_STATE_PENDING
    assert await seed.state(later) == "blocked"
    assert (await seed.row(head))["dead_blocks_lane"] is False  # policy of the active route


async def test_replayed_member_waits_while_its_lane_is_busy(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack(dead_head="continue")
    head = await seed.item(pack, source_lane="order:2", dead_blocks=False)
    running = await seed.item(pack, state="processing", source_lane="order:2")
    response = await _replay(admin, head)
    assert response.work_item.state == types_pb2.WORK_ITEM_STATE_BLOCKED
    assert await seed.state(running) == "processing"


async def test_view_and_replay_token_can_replay(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)
    response = await admin.stub.ReplayWorkItem(
        pb.ReplayWorkItemRequest(work_id=work_id), metadata=Admin.md(VIEW_REPLAY)
    )
    assert response.work_item.replay_count == 1
