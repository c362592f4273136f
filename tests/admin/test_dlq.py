"""ListDeadLetters and GetWorkItem: terminal WorkItems with their event and receipt, sanitized."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf import timestamp_pb2

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

from .conftest import OPERATOR, VIEW, VIEW_REPLAY, Admin, Seed, expect_error


def _ts(dt: datetime) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(dt)
    return out


async def test_lists_dead_items_newest_first_with_context_and_no_payload(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack(routes={"orders": ["sync", "audit"]})
    old = await seed.item(pack, finished_ago_s=300)
    new = await seed.item(pack, finished_ago_s=5, work_type="audit", failure_class="timeout")
    await seed.item(pack, state="succeeded")
    await seed.item(pack, state="pending")
    await seed.item(pack, state="retry")

    response = await admin.stub.ListDeadLetters(pb.ListDeadLettersRequest(), metadata=Admin.md(VIEW))

    assert [d.work_item.work_id for d in response.dead_letters] == [new, old]
    assert response.next_page_token == ""
    first = response.dead_letters[0]
    assert first.work_item.state == types_pb2.WORK_ITEM_STATE_DEAD
    assert first.work_item.failure_class == "timeout"
    assert first.work_item.failure_summary == "handler raised ValueError"
    assert first.work_item.HasField("finish_time")
    assert first.event.event_id == first.work_item.event_id
    assert first.event.installed_pack_id == pack and first.event.source_object_kind == "order"
    assert first.receipt.receipt_id == first.event.receipt_id
    assert first.receipt.route_key == "orders" and first.receipt.namespace == "shop"
    assert first.receipt.correlation_ids == {"trace": "t-1"}
    assert len(first.receipt.payload_sha256) == 64
    assert first.receipt.body == b""
    wire = response.SerializeToString()
    assert b"do-not-leak" not in wire  # no payload
    assert b"SHOP_SECRET" not in wire and b"hmac-sha256" not in wire  # no verification/secret refs


async def test_filters(admin: Admin, seed: Seed) -> None:
    shop = await seed.pack("shop", routes={"orders": ["sync", "audit"]})
    crm = await seed.pack("crm")
    a = await seed.item(shop, work_type="sync", failure_class="timeout", finished_ago_s=7200)
    b = await seed.item(shop, work_type="audit", failure_class="handler_error", finished_ago_s=60)
    await seed.generation(shop, 2, routes={"orders": ["sync"]})
    c = await seed.item(shop, generation=2, failure_class="timeout", finished_ago_s=30)
    d = await seed.item(crm, finished_ago_s=10)

    async def listed(**kw) -> list[int]:
        response = await admin.stub.ListDeadLetters(pb.ListDeadLettersRequest(**kw), metadata=Admin.md(VIEW))
        return [x.work_item.work_id for x in response.dead_letters]

    assert await listed() == [d, c, b, a]
    assert await listed(installed_pack_id=shop) == [c, b, a]
    assert await listed(installed_pack_id=crm) == [d]
    assert await listed(installed_pack_id=shop, generation=2) == [c]
    assert await listed(work_type="audit") == [b]
    assert await listed(failure_class="timeout") == [c, a]
    now = datetime.now(UTC)
    assert await listed(finish_time_after=_ts(now - timedelta(minutes=5))) == [d, c, b]
    assert await listed(finish_time_before=_ts(now - timedelta(minutes=5))) == [a]
    assert await listed(
        finish_time_after=_ts(now - timedelta(seconds=45)),
        finish_time_before=_ts(now - timedelta(seconds=20)),
    ) == [c]


async def test_pagination_walks_every_item_once(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    expected = [await seed.item(pack, finished_ago_s=100 - i) for i in range(7)][::-1]
    # Two items with the same finish time and one without: keyset ties and NULLs.
    await seed.conn.execute(
        "UPDATE connector_work_item SET finished_at = (SELECT finished_at FROM connector_work_item"
        " WHERE work_id = %s) WHERE work_id = %s",
        (expected[2], expected[3]),
    )
    await seed.conn.execute(
        "UPDATE connector_work_item SET finished_at = NULL WHERE work_id = %s", (expected[5],)
    )
    cur = await seed.conn.execute(
        "SELECT work_id FROM connector_work_item WHERE state = 'dead'"
        " ORDER BY finished_at DESC NULLS FIRST, work_id DESC"
    )
    expected = [r[0] for r in await cur.fetchall()]

    seen: list[int] = []
    token = ""
    pages = 0
    while True:
        response = await admin.stub.ListDeadLetters(
            pb.ListDeadLettersRequest(page_size=3, page_token=token, installed_pack_id=pack),
            metadata=Admin.md(VIEW),
        )
        pages += 1
        assert len(response.dead_letters) <= 3
        seen.extend(d.work_item.work_id for d in response.dead_letters)
        token = response.next_page_token
        if not token:
            break
    assert seen == expected
    assert pages == 3


async def test_page_token_errors(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    for _ in range(3):
        await seed.item(pack)
    first = await admin.stub.ListDeadLetters(
        pb.ListDeadLettersRequest(page_size=1, installed_pack_id=pack), metadata=Admin.md(VIEW)
    )
    assert first.next_page_token
    await expect_error(
        admin.stub.ListDeadLetters(
            pb.ListDeadLettersRequest(page_size=1, page_token=first.next_page_token, work_type="other"),
            metadata=Admin.md(VIEW),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PAGE_TOKEN_FILTER_MISMATCH",
    )
    for garbage in ("%%%", "bm90LWpzb24", "eyJrIjogWzFdLCAiZiI6ICJ4In0"):
        await expect_error(
            admin.stub.ListDeadLetters(
                pb.ListDeadLettersRequest(page_token=garbage), metadata=Admin.md(VIEW)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_TOKEN",
        )
    await expect_error(
        admin.stub.ListDeadLetters(pb.ListDeadLettersRequest(page_size=-1), metadata=Admin.md(VIEW)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    now = datetime.now(UTC)
    await expect_error(
        admin.stub.ListDeadLetters(
            pb.ListDeadLettersRequest(
                finish_time_after=_ts(now), finish_time_before=_ts(now - timedelta(hours=1))
            ),
            metadata=Admin.md(VIEW),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )


def test_page_size_defaults_and_caps() -> None:
    from connector.executor.admin import pagination

    assert pagination.page_size(0) == 50
    assert pagination.page_size(7) == 7
    assert pagination.page_size(100_000) == 500


async def test_get_work_item_with_and_without_payload(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)

    plain = await admin.stub.GetWorkItem(pb.GetWorkItemRequest(work_id=work_id), metadata=Admin.md(VIEW))
    assert plain.work_item.work_id == work_id
    assert plain.event.event_id == plain.work_item.event_id
    assert plain.receipt.receipt_id == plain.event.receipt_id
    assert plain.receipt.body == b""

    await expect_error(
        admin.stub.GetWorkItem(
            pb.GetWorkItemRequest(work_id=work_id, include_payload=True), metadata=Admin.md(VIEW)
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "PAYLOAD_NOT_ALLOWED",
    )
    for token in (VIEW_REPLAY, OPERATOR):
        full = await admin.stub.GetWorkItem(
            pb.GetWorkItemRequest(work_id=work_id, include_payload=True), metadata=Admin.md(token)
        )
        assert full.receipt.body == b'{"id": 1, "secret_field": "do-not-leak"}'


async def test_get_work_item_errors(admin: Admin, seed: Seed) -> None:
    await expect_error(
        admin.stub.GetWorkItem(pb.GetWorkItemRequest(work_id=424242), metadata=Admin.md(VIEW)),
        grpc.StatusCode.NOT_FOUND,
        "WORK_ITEM_NOT_FOUND",
    )
    await expect_error(
        admin.stub.GetWorkItem(pb.GetWorkItemRequest(work_id=0), metadata=Admin.md(VIEW)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )


async def test_get_work_item_of_any_state(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack, state="processing")
    response = await admin.stub.GetWorkItem(pb.GetWorkItemRequest(work_id=work_id), metadata=Admin.md(VIEW))
    assert response.work_item.state == types_pb2.WORK_ITEM_STATE_PROCESSING
    assert response.work_item.lease_owner == "executor-1" and response.work_item.lease_token == 7
