"""CancelWorkItem: a pending, blocked, retrying or dead item becomes ``cancelled`` (terminal), its lanes
move on, the call is audited (actor, reason, request id) and fenced against a concurrent claim; every
other state is refused with a reason; dry runs and AIP-155 request ids as for replay."""

from __future__ import annotations

import asyncio
import logging

import grpc
import psycopg
import pytest

from connector.common.store import work_items
from connector.common.store.vocabulary import LANE_HOLDING_PREDICATE
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

from .conftest import REPLAY, VIEW, Admin, Seed, expect_error


async def _cancel(
    admin: Admin,
    work_id: int,
    *,
    reason: str = "duplicate order",
    request_id: str = "",
    dry_run: bool = False,
) -> pb.CancelWorkItemResponse:
    return await admin.stub.CancelWorkItem(
        pb.CancelWorkItemRequest(work_id=work_id, reason=reason, request_id=request_id, dry_run=dry_run),
        metadata=Admin.md(REPLAY),
    )


@pytest.mark.parametrize("state", ["pending", "retry", "blocked", "dead"])
async def test_cancel_discards_an_unclaimed_item(
    admin: Admin, seed: Seed, state: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pack = await seed.pack()
    work_id = await seed.item(pack, state=state)
    before = await seed.row(work_id)
    response = await _cancel(admin, work_id, request_id="req-1")
    item = response.work_item
    assert item.state == types_pb2.WORK_ITEM_STATE_CANCELLED and not response.dry_run
    assert item.outcome == "cancelled" and item.failure_class == "cancelled"
    assert item.failure_summary.startswith("cancelled by key:") and "duplicate order" in item.failure_summary
    if state in ("dead", "retry"):  # the last failure stays readable
        assert "last failure: handler_error: handler raised ValueError" in item.failure_summary
    row = await seed.row(work_id)
    assert row["state"] == "cancelled" and row["finished_at"] is not None
    assert row["attempts"] == before["attempts"] and row["lease_token"] == before["lease_token"]
    [line] = [r for r in caplog.records if r.getMessage() == "work item cancelled"]
    assert line.levelno == logging.INFO
    assert line.work_id == work_id and line.actor.startswith("key:")  # type: ignore[attr-defined]
    assert line.request_id == "req-1" and line.note == "duplicate order"  # type: ignore[attr-defined]
    assert line.event == "work_item_cancelled"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("processing", "WORK_ITEM_IN_FLIGHT"),
        ("succeeded", "ALREADY_FINAL"),
        ("awaiting_legacy_outcome", "LEGACY_OUTCOME_PENDING"),
        ("reconciled_legacy_terminal", "LEGACY_RECONCILED"),
    ],
)
async def test_cancel_refuses_claimed_final_and_legacy_items(
    admin: Admin, seed: Seed, state: str, reason: str
) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, state=state)
    before = await seed.row(work_id)
    exc = await expect_error(_cancel(admin, work_id), grpc.StatusCode.FAILED_PRECONDITION, reason)
    assert str(work_id) in (exc.details() or "")
    assert await seed.row(work_id) == before


async def test_cancel_refusals_of_input_role_and_ownership(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, state="pending")
    legacy = await seed.item(pack, state="pending", execution_owner="legacy_event")
    await expect_error(
        _cancel(admin, work_id, reason="  "), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
    )
    await expect_error(_cancel(admin, 0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    await expect_error(_cancel(admin, 10**12), grpc.StatusCode.NOT_FOUND, "WORK_ITEM_NOT_FOUND")
    await expect_error(_cancel(admin, legacy), grpc.StatusCode.FAILED_PRECONDITION, "LEGACY_OWNED")
    await expect_error(
        admin.stub.CancelWorkItem(
            pb.CancelWorkItemRequest(work_id=work_id, reason="x"), metadata=Admin.md(VIEW)
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "ROLE_REQUIRED",
    )
    assert await seed.state(work_id) == "pending" and await seed.state(legacy) == "pending"


async def test_dry_run_changes_nothing_and_request_ids_answer_the_first_outcome(
    admin: Admin, seed: Seed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pack = await seed.pack()
    work_id = await seed.item(pack, state="retry")
    dry = await _cancel(admin, work_id, dry_run=True, request_id="ignored-for-dry-runs")
    assert dry.dry_run and dry.work_item.state == types_pb2.WORK_ITEM_STATE_RETRY
    assert await seed.state(work_id) == "retry"
    assert await seed.one("SELECT count(*) FROM connector_admin_request") == 0
    first = await _cancel(admin, work_id, request_id="cancel-42")
    again = await _cancel(admin, work_id, request_id="cancel-42")  # the item is cancelled by now
    assert again == first
    await expect_error(_cancel(admin, work_id), grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_FINAL")
    assert len([r for r in caplog.records if r.getMessage() == "work item cancelled"]) == 1


@pytest.mark.parametrize("head_state", ["pending", "dead"])
async def test_cancel_releases_the_lanes_like_any_terminal_state(
    admin: Admin, seed: Seed, db_url: str, head_state: str
) -> None:
    """The next member of the lane becomes claimable (a dead head that blocks its lane included).
    Control: before the cancel the second member is blocked and not claimable."""
    pack = await seed.pack()
    head = await seed.item(pack, state=head_state, source_lane="L", target_lane="T")
    nxt = await seed.item(pack, state="blocked", source_lane="L")
    other = await seed.item(pack, state="blocked", target_lane="T")
    assert await seed.state(nxt) == "blocked"
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN connector_work")
        response = await _cancel(admin, head)
        notes = [n async for n in listener.notifies(timeout=5.0, stop_after=1)]
    assert notes and notes[0].payload == "lanes"
    assert response.lane_members_promoted == 2
    assert await seed.state(nxt) == "pending" and await seed.state(other) == "pending"
    rows = await work_items.claim.work_item_claim_batch(
        seed.conn, [pack], ["default"], [10], owner="o", lease_s=30
    )
    assert sorted(r[0] for r in rows) == sorted([nxt, other])
    # A cancelled member holds nothing (the lane indexes' predicate; a dead head held its lane before).
    held = await seed.one(
        f"SELECT count(*) FROM connector_work_item WHERE work_id = %s AND {LANE_HOLDING_PREDICATE}", (head,)
    )
    assert held == 0


async def test_a_claim_in_flight_wins_and_the_cancel_is_refused(
    admin: Admin, seed: Seed, db_url: str
) -> None:
    """The cancel's fenced update waits for the claim holding the row, re-checks the new row version
    and matches nothing: FAILED_PRECONDITION WORK_ITEM_IN_FLIGHT, the item stays claimed. Control
    (the unfenced statement) in test_a_cancel_without_its_fence_would_overwrite_a_claim."""
    pack = await seed.pack()
    work_id = await seed.item(pack, state="pending")
    async with await psycopg.AsyncConnection.connect(db_url) as claimer:
        rows = await work_items.claim.work_item_claim_batch(
            claimer, [pack], ["default"], [1], owner="x", lease_s=30
        )
        assert [r[0] for r in rows] == [work_id]  # claimed, not committed: the row is locked
        call = asyncio.ensure_future(_cancel(admin, work_id))
        await _wait_lock_waiter(seed)
        await claimer.commit()
        await expect_error(call, grpc.StatusCode.FAILED_PRECONDITION, "WORK_ITEM_IN_FLIGHT")
    row = await seed.row(work_id)
    assert row["state"] == "processing" and row["lease_owner"] == "x"


async def test_a_cancel_in_flight_wins_and_claims_skip_the_row(seed: Seed, db_url: str) -> None:
    """The claim's candidate read skips the row a cancel holds (SKIP LOCKED) and never sees it again:
    the cancel commits, the row is terminal."""
    pack = await seed.pack()
    work_id = await seed.item(pack, state="pending")
    async with await psycopg.AsyncConnection.connect(db_url) as canceller:
        done, _ = await work_items.admin.work_item_cancel(canceller, work_id, 2, [], summary="test")
        assert done
        rows = await work_items.claim.work_item_claim_batch(
            seed.conn, [pack], ["default"], [5], owner="o", lease_s=30
        )
        assert rows == []
        await canceller.commit()
    assert await seed.state(work_id) == "cancelled"
    rows = await work_items.claim.work_item_claim_batch(
        seed.conn, [pack], ["default"], [5], owner="o", lease_s=30
    )
    assert rows == []


async def test_a_cancel_without_its_fence_would_overwrite_a_claim(
    admin: Admin, seed: Seed, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control of the fence: with the token and state conditions removed from the statement, the same
    interleaving cancels a claimed item under its holder (what the fenced statement refuses)."""
    unfenced = (
        work_items.admin.WORK_ITEM_CANCEL.split("WHERE")[0]
        + "WHERE w.work_id = %(id)s\nRETURNING w.work_id\n"
    )
    monkeypatch.setattr(work_items.admin, "WORK_ITEM_CANCEL", unfenced)
    pack = await seed.pack()
    work_id = await seed.item(pack, state="pending")
    async with await psycopg.AsyncConnection.connect(db_url) as claimer:
        await work_items.claim.work_item_claim_batch(claimer, [pack], ["default"], [1], owner="x", lease_s=30)
        call = asyncio.ensure_future(_cancel(admin, work_id))
        await _wait_lock_waiter(seed)
        await claimer.commit()
        await call
    assert await seed.state(work_id) == "cancelled"  # the holder's lease was overwritten


async def test_a_cancelled_item_can_be_replayed_and_bulk_replay_leaves_it(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, state="dead")
    dead = await seed.item(pack, state="dead")
    await _cancel(admin, work_id)
    progress = [
        p
        async for p in admin.stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack, dry_run=True), metadata=Admin.md(REPLAY)
        )
    ]
    assert progress[-1].total == 1 and progress[-1].eligible == 1  # the dead letter only
    replayed = await admin.stub.ReplayWorkItem(
        pb.ReplayWorkItemRequest(work_id=work_id), metadata=Admin.md(REPLAY)
    )
    assert (
        replayed.work_item.state == types_pb2.WORK_ITEM_STATE_PENDING and replayed.work_item.replay_count == 1
    )
    assert await seed.state(dead) == "dead"


async def test_stats_count_no_cancelled_depth(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, state="pending")
    await _cancel(admin, work_id)
    stats = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    [total] = [q for q in stats.queues if not q.queue_class]
    assert sum(total.depth_by_state.values()) == 0 and "cancelled" not in total.depth_by_state


async def _wait_lock_waiter(seed: Seed) -> None:
    """Until some session waits on a row lock (the cancel's update behind the open claim)."""
    for _ in range(500):
        waiting = await seed.one(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the cancel never waited on the claimed row")
