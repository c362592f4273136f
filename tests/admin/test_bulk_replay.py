"""ReplayDeadLetters: bulk replay by filter — dry run, progress, refusals by reason, rate limit,
cancellation, request ids and the concurrency limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest_asyncio

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc

from .conftest import REPLAY, Admin, Running, Seed, expect_error, start_admin


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


async def _dead(seed: Seed, pack: int, n: int, **kw) -> list[int]:
    return [await seed.item(pack, **kw) for _ in range(n)]


async def _count(seed: Seed, state: str) -> int:
    return int(await seed.one("SELECT count(*) FROM connector_work_item WHERE state = %s", (state,)))


async def test_dry_run_counts_and_changes_nothing(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack(routes={"orders": ["sync", "audit"]})
    other = await seed.pack("crm")
    await _dead(seed, pack, 5)
    await _dead(seed, pack, 2, execution_owner="legacy_event")
    await _dead(seed, other, 3)
    await seed.item(pack, state="pending")
    messages = [
        m
        async for m in admin.stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack, dry_run=True), metadata=Admin.md(REPLAY)
        )
    ]
    final = messages[-1]
    assert final.done and final.total == 7 and final.eligible == 5 and final.replayed == 0
    assert final.refused == 2 and dict(final.refused_by_reason) == {"LEGACY_OWNED": 2}
    assert await _count(seed, "dead") == 10


async def test_bulk_replay_streams_progress_and_counts_refusals(small_batches, seed: Seed) -> None:
    _, stub = small_batches
    pack = await seed.pack(routes={"orders": ["sync", "audit"]})
    await _dead(seed, pack, 24, work_type="sync")
    await _dead(seed, pack, 2, work_type="sync", execution_owner="legacy_event")
    await _dead(seed, pack, 3, work_type="audit", failure_class="timeout")
    messages = [
        m
        async for m in stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack, work_type="sync", rate_limit=5000),
            metadata=Admin.md(REPLAY),
        )
    ]
    assert len(messages) == 3  # batches of 10 over 26 items: two progress messages and the final one
    assert [m.done for m in messages] == [False, False, True]
    assert all(m.total == 26 for m in messages)
    replayed = [m.replayed for m in messages]
    assert replayed == sorted(replayed) and replayed[-1] == 24
    assert messages[-1].refused_by_reason == {"LEGACY_OWNED": 2}
    assert await _count(seed, "pending") == 24
    assert await _count(seed, "dead") == 5  # 2 refused + 3 of another work type


async def test_bulk_replay_filters_by_failure_class_and_generation(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    timeouts = await _dead(seed, pack, 2, failure_class="timeout")
    await _dead(seed, pack, 2, failure_class="handler_error")
    messages = [
        m
        async for m in admin.stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack, failure_class="timeout", generation=1),
            metadata=Admin.md(REPLAY),
        )
    ]
    assert messages[-1].replayed == 2
    assert [await seed.state(w) for w in timeouts] == ["pending", "pending"]


async def test_rate_limit_paces_batches(small_batches, seed: Seed) -> None:
    _, stub = small_batches
    pack = await seed.pack()
    await _dead(seed, pack, 30)
    started = time.monotonic()
    messages = [
        m
        async for m in stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack, rate_limit=20), metadata=Admin.md(REPLAY)
        )
    ]
    elapsed = time.monotonic() - started
    assert messages[-1].replayed == 30
    # 30 items at 20/s in batches of 10: the third batch may not start before 20/20 = 1 s.
    assert elapsed >= 0.95, elapsed


async def test_cancelling_the_call_stops_the_replay(small_batches, seed: Seed) -> None:
    running, stub = small_batches
    pack = await seed.pack()
    await _dead(seed, pack, 60)
    call = stub.ReplayDeadLetters(
        pb.ReplayDeadLettersRequest(installed_pack_id=pack, rate_limit=10), metadata=Admin.md(REPLAY)
    )
    first = await call.read()
    assert first.replayed == 10 and not first.done
    call.cancel()
    slots = running.api.servicer._bulk_slots
    for _ in range(500):  # the server-side handler ends and frees its slot
        if not slots.locked():
            break
        await asyncio.sleep(0.01)
    assert not slots.locked()
    replayed = await _count(seed, "pending")
    assert replayed < 60
    await asyncio.sleep(1.2)  # longer than one paced batch: nothing else happens
    assert await _count(seed, "pending") == replayed
    assert await _count(seed, "dead") == 60 - replayed


async def test_one_bulk_replay_at_a_time(small_batches, seed: Seed) -> None:
    _, stub = small_batches
    pack = await seed.pack()
    await _dead(seed, pack, 40)
    slow = stub.ReplayDeadLetters(
        pb.ReplayDeadLettersRequest(installed_pack_id=pack, rate_limit=10), metadata=Admin.md(REPLAY)
    )
    await slow.read()
    await expect_error(
        stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack), metadata=Admin.md(REPLAY)
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "BULK_REPLAY_LIMIT",
    )
    slow.cancel()


async def test_request_id_returns_the_final_answer(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    await _dead(seed, pack, 4)
    request = pb.ReplayDeadLettersRequest(installed_pack_id=pack, request_id="bulk-1")
    first = [m async for m in admin.stub.ReplayDeadLetters(request, metadata=Admin.md(REPLAY))]
    await _dead(seed, pack, 3)  # new dead letters: the retry must not touch them
    again = [m async for m in admin.stub.ReplayDeadLetters(request, metadata=Admin.md(REPLAY))]
    assert again == [first[-1]] and first[-1].replayed == 4
    assert await _count(seed, "dead") == 3


async def test_invalid_bulk_requests(admin: Admin, seed: Seed) -> None:
    await expect_error(
        admin.stub.ReplayDeadLetters(pb.ReplayDeadLettersRequest(), metadata=Admin.md(REPLAY)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    await expect_error(
        admin.stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=1, rate_limit=-1), metadata=Admin.md(REPLAY)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )


async def test_nothing_to_replay(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    messages = [
        m
        async for m in admin.stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack), metadata=Admin.md(REPLAY)
        )
    ]
    assert len(messages) == 1 and messages[0].done and messages[0].total == 0
