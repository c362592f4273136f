"""ListReceiptFailures and ReplayReceipt: receipts whose routing failed, handed back to the
materializer against the active generation."""

from __future__ import annotations

import grpc
import psycopg

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

from .conftest import REPLAY, VIEW, Admin, Seed, expect_error


async def _failed(seed: Seed, namespace: str = "shop", route_key: str = "orders") -> int:
    return await seed.receipt(
        namespace, route_key, status="failed", error_class="no_route", error_summary="no route 'orders'"
    )


async def test_lists_failed_receipts_newest_first_with_pagination(admin: Admin, seed: Seed) -> None:
    await seed.pack("shop")
    await seed.pack("crm")
    shop = [await _failed(seed, "shop") for _ in range(3)]
    crm = await _failed(seed, "crm")
    await seed.receipt("shop", status="materialized")
    await seed.receipt("shop", status="retry")

    everything = await admin.stub.ListReceiptFailures(
        pb.ListReceiptFailuresRequest(), metadata=Admin.md(VIEW)
    )
    assert [r.receipt_id for r in everything.receipts] == [crm, *shop[::-1]]
    first = everything.receipts[0]
    assert first.status == types_pb2.RECEIPT_STATUS_FAILED
    assert first.error_class == "no_route" and first.error_summary == "no route 'orders'"
    assert first.body == b"" and b"do-not-leak" not in everything.SerializeToString()

    seen: list[int] = []
    token = ""
    while True:
        page = await admin.stub.ListReceiptFailures(
            pb.ListReceiptFailuresRequest(namespace="shop", page_size=2, page_token=token),
            metadata=Admin.md(VIEW),
        )
        seen.extend(r.receipt_id for r in page.receipts)
        token = page.next_page_token
        if not token:
            break
    assert seen == shop[::-1]

    page = await admin.stub.ListReceiptFailures(
        pb.ListReceiptFailuresRequest(namespace="shop", page_size=1), metadata=Admin.md(VIEW)
    )
    await expect_error(
        admin.stub.ListReceiptFailures(
            pb.ListReceiptFailuresRequest(namespace="crm", page_token=page.next_page_token),
            metadata=Admin.md(VIEW),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PAGE_TOKEN_FILTER_MISMATCH",
    )


async def test_replay_receipt_hands_it_back_to_the_materializer(
    admin: Admin, seed: Seed, db_url: str
) -> None:
    await seed.pack()
    receipt_id = await _failed(seed)
    await seed.conn.execute(
        "UPDATE connector_ingress_receipt SET attempts = 10, claim_token = 4 WHERE receipt_id = %s",
        (receipt_id,),
    )
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN connector_receipts")
        response = await admin.stub.ReplayReceipt(
            pb.ReplayReceiptRequest(receipt_id=receipt_id, request_id="rr-1"), metadata=Admin.md(REPLAY)
        )
        notes = [n async for n in listener.notifies(timeout=5.0, stop_after=1)]
    assert [n.channel for n in notes] == ["connector_receipts"]
    assert response.receipt.status == types_pb2.RECEIPT_STATUS_PENDING
    assert response.receipt.attempts == 0
    row = await seed.one(
        "SELECT router_status, attempts, claim_token, claim_owner, next_attempt_at <= now()"
        " FROM connector_ingress_receipt WHERE receipt_id = %s",
        (receipt_id,),
    )
    assert row == ("pending", 0, 5, None, True)
    again = await admin.stub.ReplayReceipt(
        pb.ReplayReceiptRequest(receipt_id=receipt_id, request_id="rr-1"), metadata=Admin.md(REPLAY)
    )
    assert again == response


async def test_replay_receipt_refusals(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()

    async def refused(receipt_id: int, code: grpc.StatusCode, reason: str) -> None:
        await expect_error(
            admin.stub.ReplayReceipt(
                pb.ReplayReceiptRequest(receipt_id=receipt_id), metadata=Admin.md(REPLAY)
            ),
            code,
            reason,
        )

    await refused(999999, grpc.StatusCode.NOT_FOUND, "RECEIPT_NOT_FOUND")
    await expect_error(
        admin.stub.ReplayReceipt(pb.ReplayReceiptRequest(receipt_id=0), metadata=Admin.md(REPLAY)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    materialized = await seed.receipt(status="materialized")
    await refused(materialized, grpc.StatusCode.FAILED_PRECONDITION, "NOT_FAILED")

    gone = await _failed(seed, route_key="refunds")
    await refused(gone, grpc.StatusCode.FAILED_PRECONDITION, "ROUTE_GONE")

    orphan = await _failed(seed, namespace="nobody")
    await refused(orphan, grpc.StatusCode.FAILED_PRECONDITION, "NO_ACTIVE_GENERATION")

    with_events = await _failed(seed)
    await seed.item(pack, receipt_id=with_events)
    await refused(with_events, grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_MATERIALIZED")

    await seed.conn.execute(
        "ALTER TABLE connector_ingress_receipt DROP CONSTRAINT ck_connector_ingress_receipt_body_present"
    )
    bodiless = await seed.receipt(status="failed", body=None)
    await refused(bodiless, grpc.StatusCode.FAILED_PRECONDITION, "PAYLOAD_MISSING")

    states = await seed.one(
        "SELECT array_agg(DISTINCT router_status) FROM connector_ingress_receipt WHERE receipt_id <> %s",
        (materialized,),
    )
    assert states == ["failed"]  # nothing was reset by a refused call
