"""CancelDeadLetters: bulk cancel by filter as one streamed call, with ReplayDeadLetters' semantics —
dry run first (counts, changes nothing), progress per batch, refusals by reason, lane order, a
request id answering a retry with the first outcome, one audit line per cancelled item, the role."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc

from .conftest import REPLAY, VIEW, Admin, Running, Seed, expect_error, start_admin


@pytest_asyncio.fixture
async def small_batches(
    db_url: str,
) -> AsyncIterator[tuple[Running, admin_service_pb2_grpc.AdminServiceStub]]:
    running = await start_admin(db_url, replay_batch_size=10, bulk_replay_concurrency=1)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}")
    try:
        yield running, admin_service_pb2_grpc.AdminServiceStub(channel)
    finally:
        await channel.close()
        await running.stop()


async def _count(seed: Seed, state: str) -> int:
    return int(await seed.one("SELECT count(*) FROM connector_work_item WHERE state = %s", (state,)))


async def _drain(stub: admin_service_pb2_grpc.AdminServiceStub, request: pb.CancelDeadLettersRequest,
                 token: str = REPLAY) -> list[pb.CancelDeadLettersResponse]:  # fmt: skip
    return [m async for m in stub.CancelDeadLetters(request, metadata=Admin.md(token))]


async def test_bulk_cancel_estimate_then_one_streamed_call(
    small_batches, seed: Seed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _, stub = small_batches
    pack = await seed.pack(routes={"orders": ["sync", "audit"]})
    lane = [await seed.item(pack, source_lane="o:1") for _ in range(3)]  # a lane: its dead head holds it
    waiting = await seed.item(pack, state="blocked", source_lane="o:1")
    dead = lane + [await seed.item(pack, work_type="sync") for _ in range(20)]
    legacy = [await seed.item(pack, execution_owner="legacy_event") for _ in range(2)]
    other = [await seed.item(pack, work_type="audit", failure_class="timeout") for _ in range(3)]
    flt = {"installed_pack_id": pack, "work_type": "sync", "reason": "INC-9: superseded by a resync"}

    # the estimate: a dry run counts, lists the lanes, changes nothing
    [dry] = [m for m in await _drain(stub, pb.CancelDeadLettersRequest(**flt, dry_run=True)) if m.done]
    assert (dry.total, dry.eligible, dry.cancelled, dry.lanes, list(dry.lane_keys)) == (25, 23, 0, 1, ["o:1"])
    assert dict(dry.refused_by_reason) == {"LEGACY_OWNED": 2}
    assert await _count(seed, "dead") == 28 and await _count(seed, "cancelled") == 0

    # the run: progress per batch of 10, every matching item cancelled in lane order, the rest refused
    messages = await _drain(stub, pb.CancelDeadLettersRequest(**flt, rate_limit=5000, request_id="job-1"))
    assert [m.done for m in messages] == [False, False, True]
    assert [m.cancelled for m in messages] == sorted(m.cancelled for m in messages)
    final = messages[-1]
    assert (final.total, final.cancelled, final.refused) == (25, 23, 2)
    assert dict(final.refused_by_reason) == {"LEGACY_OWNED": 2}
    for w in dead:
        row = await seed.row(w)
        assert row["state"] == "cancelled" and "INC-9: superseded by a resync" in row["failure_summary"]
    assert [(await seed.row(w))["state"] for w in legacy + other] == ["dead"] * 5
    assert (await seed.row(waiting))["state"] == "pending"  # the lane moved on
    lines = [r for r in caplog.records if r.getMessage() == "work item cancelled"]
    # one audit line per cancelled item (the event log's own rate limit may hold back some of a burst)
    logged = [r.work_id for r in lines]  # type: ignore[attr-defined]
    assert len(logged) == len(set(logged)) >= 10 and set(logged) <= set(dead)
    assert {r.request_id for r in lines} == {"job-1"}  # type: ignore[attr-defined]
    in_order = [r.work_id for r in lines if r.work_id in lane]  # type: ignore[attr-defined]
    assert in_order == lane  # lane order

    # a retry with the same request id answers the first outcome and cancels nothing more
    again = await seed.item(pack, work_type="sync")
    [retry] = await _drain(stub, pb.CancelDeadLettersRequest(**flt, rate_limit=5000, request_id="job-1"))
    assert retry == final and (await seed.row(again))["state"] == "dead"


async def test_bulk_cancel_refusals_of_input_and_role(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    dead = await seed.item(pack)
    cases = [
        (pb.CancelDeadLettersRequest(reason="x"), grpc.StatusCode.INVALID_ARGUMENT),  # no pack
        (pb.CancelDeadLettersRequest(installed_pack_id=pack), grpc.StatusCode.INVALID_ARGUMENT),  # no reason
        (pb.CancelDeadLettersRequest(installed_pack_id=pack, reason="x", rate_limit=-1),
         grpc.StatusCode.INVALID_ARGUMENT),
        (pb.CancelDeadLettersRequest(installed_pack_id=pack, reason="x", work_ids=[0]),
         grpc.StatusCode.INVALID_ARGUMENT),
    ]  # fmt: skip
    for request, code in cases:
        await expect_error(admin.stub.CancelDeadLetters(request, metadata=Admin.md(REPLAY)), code)
    await expect_error(
        admin.stub.CancelDeadLetters(
            pb.CancelDeadLettersRequest(installed_pack_id=pack, reason="x"), metadata=Admin.md(VIEW)
        ),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert (await seed.row(dead))["state"] == "dead"  # nothing changed
    # control: the same call with the role cancels it
    final = [
        m
        async for m in admin.stub.CancelDeadLetters(
            pb.CancelDeadLettersRequest(installed_pack_id=pack, reason="x"), metadata=Admin.md(REPLAY)
        )
    ][-1]
    assert final.cancelled == 1 and (await seed.row(dead))["state"] == "cancelled"
