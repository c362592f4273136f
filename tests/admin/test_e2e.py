"""End to end: dead → replayed → executed, through the real executor service with the admin API it
mounts itself (the same wiring as `connector executor`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from pydantic import SecretStr

from connector.common.core.settings import AdminSettings, DatabaseSettings, ExecutorSettings
from connector.executor.service import ExecutorService
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc, types_pb2

from . import handlers
from .conftest import REPLAY, TOKENS, VIEW, Admin, Seed


async def _until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_dead_item_is_replayed_and_executed(seed: Seed, db_url: str) -> None:
    handlers.FAIL["on"] = True
    handlers.CALLS.clear()
    pack = await seed.pack(routes={"orders": ["sync"]})
    target = f"{handlers.__name__}:flaky"  # the name this test process imported it under
    await seed.conn.execute(
        "UPDATE connector_pack_generation SET manifest ="
        " jsonb_set(manifest, '{work_types,sync,handler,target}',"
        " to_jsonb(%s::text)) WHERE installed_pack_id = %s",
        (target, pack),
    )
    work_id = await seed.item(pack, state="pending", failure_class=None)

    service = ExecutorService(
        DatabaseSettings(),
        ExecutorSettings(
            workers=2, claim_batch=8, lease_s=5.0, poll_interval_s=0.1, grpc_port=0, metrics_port=0,
            stats_interval_s=0, shutdown_grace_s=1.0,
        ),
        url=db_url,
        admin_settings=AdminSettings(tokens=SecretStr(TOKENS)),
        serve_metrics=False,
        heartbeat_s=0.5,
    )  # fmt: skip
    await service.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)
    try:
        # 1. The first execution fails permanently: a dead letter.
        await _until(lambda: _state_is(seed, work_id, "dead"), "the item to die")
        listed = await stub.ListDeadLetters(
            pb.ListDeadLettersRequest(installed_pack_id=pack), metadata=Admin.md(VIEW)
        )
        assert [d.work_item.work_id for d in listed.dead_letters] == [work_id]
        assert listed.dead_letters[0].work_item.failure_class == "downstream_rejected"

        # 2. The cause is fixed; the operator replays through the executor's own admin API.
        handlers.FAIL["on"] = False
        replayed = await stub.ReplayWorkItem(
            pb.ReplayWorkItemRequest(work_id=work_id, request_id="e2e-1"), metadata=Admin.md(REPLAY)
        )
        assert replayed.work_item.replay_count == 1
        assert replayed.work_item.state in (
            types_pb2.WORK_ITEM_STATE_PENDING,
            types_pb2.WORK_ITEM_STATE_PROCESSING,
        )

        # 3. The executor claims it again (woken by NOTIFY) and the handler succeeds.
        await _until(lambda: _state_is(seed, work_id, "succeeded"), "the replayed item to succeed")
        row = await seed.row(work_id)
        assert row["replay_count"] == 1 and row["outcome"] == "succeeded" and row["attempts"] == 1
        assert row["failure_class"] is None  # cleared by the successful outcome
        # Seeded with 3 earlier attempts; the replay starts the count again from zero.
        assert [(c[0], c[2]) for c in handlers.CALLS] == [(work_id, 4), (work_id, 1)]
        assert handlers.CALLS[0][3] == handlers.CALLS[1][3]  # same idempotency key across the replay
        assert handlers.CALLS[1][4] == b'{"id": 1, "secret_field": "do-not-leak"}'

        stats = await stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
        assert stats.active_claimants == 1  # the executor's own process row
        empty = await stub.ListDeadLetters(pb.ListDeadLettersRequest(), metadata=Admin.md(VIEW))
        assert list(empty.dead_letters) == []
    finally:
        await channel.close()
        await service.stop()
        handlers.FAIL["on"] = True


async def _state_is(seed: Seed, work_id: int, state: str) -> bool:
    return await seed.state(work_id) == state
