"""Infrastructure errors as canonical codes: a saturated admin pool, a statement timeout, and list
arguments of the pack listing."""

from __future__ import annotations

import grpc
import psycopg

from connector.common.core.settings import DatabaseSettings, PoolSettings
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc

from .conftest import REPLAY, VIEW, Admin, Seed, expect_error, start_admin


async def test_saturated_pool_is_resource_exhausted(db_url: str) -> None:
    running = await start_admin(
        db_url, pool_settings=PoolSettings(pool_min_size=1, pool_max_size=1, pool_timeout_s=0.3)
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}") as channel:
            stub = admin_service_pb2_grpc.AdminServiceStub(channel)
            async with running.pool.connection():  # the only connection is taken
                await expect_error(
                    stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW)),
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "DATABASE_BUSY",
                )
            assert await stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW)) is not None
    finally:
        await running.stop()


async def test_statement_timeout_is_deadline_exceeded(db_url: str, seed: Seed) -> None:
    await seed.pack()
    receipt_id = await seed.receipt(status="failed")
    running = await start_admin(db_url, db_settings=DatabaseSettings(statement_timeout_ms=300))
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}") as channel,
            await psycopg.AsyncConnection.connect(db_url) as other,
        ):
            stub = admin_service_pb2_grpc.AdminServiceStub(channel)
            await other.execute(
                "SELECT 1 FROM connector_ingress_receipt WHERE receipt_id = %s FOR UPDATE", (receipt_id,)
            )
            await expect_error(
                stub.ReplayReceipt(pb.ReplayReceiptRequest(receipt_id=receipt_id), metadata=Admin.md(REPLAY)),
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "STATEMENT_TIMEOUT",
            )
            await other.rollback()
            # Nothing half-done: the receipt is still failed and the next call works.
            response = await stub.ReplayReceipt(
                pb.ReplayReceiptRequest(receipt_id=receipt_id), metadata=Admin.md(REPLAY)
            )
            assert response.receipt.receipt_id == receipt_id
    finally:
        await running.stop()


async def test_list_packs_arguments(admin: Admin, seed: Seed) -> None:
    await expect_error(
        admin.stub.ListPacks(pb.ListPacksRequest(page_token="garbage"), metadata=Admin.md(VIEW)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    await expect_error(
        admin.stub.ListPacks(pb.ListPacksRequest(page_size=-5), metadata=Admin.md(VIEW)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
