"""FindDeliveries over a real admin gRPC server and a seeded database: every key and filter, in every
state (not only dead), keyset pages with the HMAC page tokens, the bounded scan without a key, and
the input errors (INVALID_ARGUMENT with a reason, never INTERNAL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from connector.common.store import receipts
from connector.v1 import admin_service_pb2 as pb

from .conftest import VIEW, Admin, Seed, expect_error

STATES = ("pending", "blocked", "processing", "retry", "succeeded", "dead", "awaiting_legacy_outcome")


async def _find(admin: Admin, token: str = VIEW, **kw: Any) -> pb.FindDeliveriesResponse:
    return await admin.stub.FindDeliveries(pb.FindDeliveriesRequest(**kw), metadata=Admin.md(token))


def _ids(response: pb.FindDeliveriesResponse) -> list[int]:
    return [d.receipt.receipt_id for d in response.deliveries]


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(value)
    return out


async def _as_ingress_keys(seed: Seed) -> None:
    """Give the seeded receipts the keys the ingress writes: ``<route>:id:<delivery id>``."""
    await seed.conn.execute(
        "UPDATE connector_ingress_receipt SET idempotency_key = route_key || ':id:' || provider_delivery_id"
    )
    # Seeding only: event facts are immutable (a trigger) once written.
    await seed.conn.execute("ALTER TABLE connector_event DISABLE TRIGGER connector_event_facts_immutable")
    await seed.conn.execute(
        "UPDATE connector_event e SET idempotency_key = r.idempotency_key || '#0'"
        " FROM connector_ingress_receipt r WHERE r.receipt_id = e.receipt_id"
    )
    await seed.conn.execute("ALTER TABLE connector_event ENABLE TRIGGER connector_event_facts_immutable")


async def _world(seed: Seed) -> dict[str, Any]:
    """One pack; one delivery per WorkItem state; a failed and a pending receipt; a second pack."""
    pack = await seed.pack("shop", routes={"orders": ["sync"], "refunds": ["sync"]})
    other = await seed.pack("crm", routes={"contacts": ["sync"]})
    by_state: dict[str, int] = {}
    receipt_of: dict[str, int] = {}
    for state in STATES:
        work_id = await seed.item(pack, state=state)
        by_state[state] = work_id
        receipt_of[state] = int(
            await seed.one(
                "SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
                " WHERE w.work_id = %s",
                (work_id,),
            )
        )
    refund = await seed.item(pack, route_key="refunds", state="succeeded")
    crm = await seed.item(other, route_key="contacts", state="dead")
    failed = await seed.receipt("shop", "orders", status="failed", error_class="parse", error_summary="bad")
    pending = await seed.receipt("shop", "orders", status="pending")
    await _as_ingress_keys(seed)
    # Correlation ids on one event, an event kind of its own on another.
    await seed.conn.execute("ALTER TABLE connector_event DISABLE TRIGGER connector_event_facts_immutable")
    await seed.conn.execute(
        "UPDATE connector_event SET correlation_ids = %s WHERE event_id = (SELECT event_id FROM"
        " connector_work_item WHERE work_id = %s)",
        (json.dumps({"order": "o-77", "tenant": "acme"}), by_state["retry"]),
    )
    await seed.conn.execute(
        "UPDATE connector_event SET event_kind = 'order.cancelled' WHERE event_id = (SELECT event_id"
        " FROM connector_work_item WHERE work_id = %s)",
        (by_state["dead"],),
    )
    await seed.conn.execute("ALTER TABLE connector_event ENABLE TRIGGER connector_event_facts_immutable")

    async def receipt_of_work(work_id: int) -> int:
        return int(
            await seed.one(
                "SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
                " WHERE w.work_id = %s",
                (work_id,),
            )
        )

    return {
        "pack": pack,
        "work": by_state,
        "receipt": receipt_of,
        "refund": await receipt_of_work(refund),
        "crm": await receipt_of_work(crm),
        "failed": failed,
        "pending": pending,
    }


async def test_find_by_each_key_in_every_state(admin: Admin, seed: Seed) -> None:
    w = await _world(seed)
    for state in STATES:
        rid, work_id = w["receipt"][state], w["work"][state]
        delivery_id, key = await seed.one(
            "SELECT provider_delivery_id, idempotency_key FROM connector_ingress_receipt"
            " WHERE receipt_id = %s",
            (rid,),
        )
        for kw in (
            {"receipt_id": rid},
            {"work_id": work_id},
            {"provider_delivery_id": delivery_id},
            {"provider_delivery_id": delivery_id, "namespace": "shop"},
            {"idempotency_key": key},
            {"idempotency_key": key + "#0"},  # the event's key
            {"work_item_state": state},
        ):
            found = await _find(admin, **kw)
            assert rid in _ids(found), (state, kw)
            if "work_item_state" not in kw:
                assert _ids(found) == [rid], (state, kw)
            (delivery,) = [d for d in found.deliveries if d.receipt.receipt_id == rid]
            assert [x.work_id for x in delivery.work_items] == [work_id]
            assert len(delivery.events) == 1 and delivery.events[0].receipt_id == rid
            assert delivery.receipt.body == b""  # never a payload
    # A provider id under another namespace, a key that does not exist: nothing (not an error).
    assert _ids(await _find(admin, provider_delivery_id="d-1", namespace="crm")) == []
    assert _ids(await _find(admin, idempotency_key="orders:id:nope")) == []
    assert _ids(await _find(admin, work_id=10**12)) == []


async def test_find_by_filters(admin: Admin, seed: Seed) -> None:
    w = await _world(seed)
    shop_all = sorted([*w["receipt"].values(), w["refund"], w["failed"], w["pending"]], reverse=True)
    assert _ids(await _find(admin, namespace="shop")) == shop_all
    assert _ids(await _find(admin, namespace="shop", route_key="refunds")) == [w["refund"]]
    assert _ids(await _find(admin, route_key="contacts")) == [w["crm"]]
    assert _ids(await _find(admin, receipt_status="failed")) == [w["failed"]]
    assert _ids(await _find(admin, receipt_status="pending")) == [w["pending"]]
    assert _ids(await _find(admin, receipt_status="pending", namespace="crm")) == []
    # The receipt's kind (every seeded receipt: order.updated) or one of its events' kinds.
    assert _ids(await _find(admin, event_kind="order.cancelled")) == [w["receipt"]["dead"]]
    assert len(_ids(await _find(admin, event_kind="order.updated"))) == len(shop_all) + 1
    # Correlation ids: name and value.
    assert _ids(await _find(admin, correlation_name="order", correlation_value="o-77")) == [
        w["receipt"]["retry"]
    ]
    assert _ids(await _find(admin, correlation_name="order", correlation_value="o-78")) == []
    # A state with a namespace; dead across packs.
    assert _ids(await _find(admin, work_item_state="dead")) == sorted(
        [w["receipt"]["dead"], w["crm"]], reverse=True
    )
    assert _ids(await _find(admin, work_item_state="dead", namespace="crm")) == [w["crm"]]
    # Time range: everything was accepted just now.
    now = datetime.now(UTC)
    recent = await _find(admin, accept_time_after=_ts(now - timedelta(hours=1)))
    assert len(_ids(recent)) == len(shop_all) + 1
    assert _ids(await _find(admin, accept_time_before=_ts(now - timedelta(hours=1)))) == []
    assert _ids(await _find(admin, namespace="shop", accept_time_after=_ts(now + timedelta(hours=1)))) == []
    # A key and a filter together: the filter narrows.
    assert _ids(await _find(admin, receipt_id=w["crm"], namespace="shop")) == []


async def test_time_range_reads_only_its_receipt_id_range(admin: Admin, seed: Seed) -> None:
    """Old receipts (accepted two days ago) are outside an 'after one hour ago' search; the id bounds
    come from the bisection, so the scan does not examine them. Control: without the bounds
    (``receipt_id_at`` answering None) the same search examines every receipt."""
    pack = await seed.pack("shop")
    old = [await seed.receipt("shop", "orders") for _ in range(30)]
    await seed.conn.execute(
        "UPDATE connector_ingress_receipt SET accepted_at = now() - interval '2 days'"
        " WHERE receipt_id = ANY(%s)",
        (old,),
    )
    new = [await seed.item(pack, state="pending") for _ in range(3)]
    assert new
    after = _ts(datetime.now(UTC) - timedelta(hours=1))
    found = await _find(admin, namespace="shop", accept_time_after=after)
    assert len(found.deliveries) == 3 and all(d.receipt.receipt_id > max(old) for d in found.deliveries)
    assert found.scanned_receipts == 3, found.scanned_receipts
    first_new = min(d.receipt.receipt_id for d in found.deliveries)
    async with admin.pool.connection() as conn:
        assert await receipts.find.receipt_id_at(conn, datetime.now(UTC) - timedelta(hours=1)) == first_new
        assert await receipts.find.receipt_id_at(conn, datetime.now(UTC) - timedelta(days=3)) == min(old)
        assert await receipts.find.receipt_id_at(conn, datetime.now(UTC) + timedelta(days=1)) == first_new + 3
        page = await receipts.find.receipt_find_scan(
            conn, receipts.find.DeliveryFilter(namespace="shop"), after=None, id_range=(None, None), limit=10
        )
    assert page.scanned == 33  # control: unbounded, the old receipts are examined too


async def test_pages_follow_the_keyset_and_are_bound_to_the_filter(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack("shop")
    items = [await seed.item(pack, state=s) for s in ("dead", "retry", "pending") * 4]
    assert len(items) == 12
    seen: list[int] = []
    token = ""
    for _ in range(10):
        page = await _find(admin, namespace="shop", page_size=5, page_token=token)
        seen += _ids(page)
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == 12 and seen == sorted(seen, reverse=True) and len(set(seen)) == 12
    keyed: list[int] = []
    token = ""
    while True:
        page = await _find(
            admin, work_item_state="dead", receipt_status="materialized", page_size=2, page_token=token
        )
        keyed += _ids(page)
        token = page.next_page_token
        if not token:
            break
    assert len(keyed) == 4 and keyed == sorted(keyed, reverse=True)
    first = await _find(admin, namespace="shop", page_size=5)
    await expect_error(
        _find(admin, namespace="crm", page_size=5, page_token=first.next_page_token),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PAGE_TOKEN_FILTER_MISMATCH",
    )
    await expect_error(
        _find(admin, namespace="shop", page_token=first.next_page_token[:-2] + "xx"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    forged = admin.servicer.pages.encode("FindDeliveries", ["1; DROP"], {"x": 1})
    await expect_error(
        _find(admin, namespace="shop", page_token=forged), grpc.StatusCode.INVALID_ARGUMENT, None
    )


async def test_a_scan_without_a_key_is_bounded_per_call(
    admin: Admin, seed: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the oldest of 25 deliveries matches; with 10 receipts examined per call the first two
    pages are empty but carry a token, the third finds it. Control: the scan count is what bounds
    the call (``scanned_receipts``)."""
    monkeypatch.setattr(receipts.find, "FIND_SCAN_LIMIT_JOINED", 10)  # a WorkItem-state filter's bound
    monkeypatch.setattr(receipts.find, "FIND_SCAN_LIMIT", 20)
    pack = await seed.pack("shop")
    target = await seed.item(pack, state="dead")
    for _ in range(24):
        await seed.item(pack, state="succeeded")
    pages: list[pb.FindDeliveriesResponse] = []
    token = ""
    while True:
        page = await _find(admin, work_item_state="dead", page_token=token)
        pages.append(page)
        token = page.next_page_token
        if not token:
            break
    assert [len(p.deliveries) for p in pages] == [0, 0, 1]
    assert [p.scanned_receipts for p in pages] == [10, 10, 5]
    # without a joined filter the wider bound applies: 20, then the last 5
    plain = await _find(admin, namespace="shop")
    assert plain.scanned_receipts == 20 and plain.next_page_token
    assert [x.work_id for x in pages[-1].deliveries[0].work_items] == [target]


@pytest.mark.parametrize(
    ("request_", "reason", "field"),
    [
        (pb.FindDeliveriesRequest(), "FILTER_REQUIRED", None),
        (pb.FindDeliveriesRequest(page_size=5), "FILTER_REQUIRED", None),
        (pb.FindDeliveriesRequest(work_item_state="deadish"), "UNKNOWN_STATE", "work_item_state"),
        (pb.FindDeliveriesRequest(work_item_state="DEAD"), "UNKNOWN_STATE", "work_item_state"),
        (pb.FindDeliveriesRequest(receipt_status="dead"), "UNKNOWN_STATE", "receipt_status"),
        (
            pb.FindDeliveriesRequest(accept_time_after=timestamp_pb2.Timestamp(seconds=200),
                                     accept_time_before=timestamp_pb2.Timestamp(seconds=100)),
            "INVALID_TIME_RANGE", "accept_time_after",
        ),
        (
            pb.FindDeliveriesRequest(accept_time_after=timestamp_pb2.Timestamp(seconds=100),
                                     accept_time_before=timestamp_pb2.Timestamp(seconds=100)),
            "INVALID_TIME_RANGE", "accept_time_after",
        ),
        (pb.FindDeliveriesRequest(receipt_id=-1), "INVALID_ARGUMENT", "receipt_id"),
        (pb.FindDeliveriesRequest(work_id=-5), "INVALID_ARGUMENT", "work_id"),
        (pb.FindDeliveriesRequest(correlation_name="order"), "INVALID_ARGUMENT", "correlation_name"),
        (pb.FindDeliveriesRequest(correlation_value="o-1"), "INVALID_ARGUMENT", "correlation_name"),
        (pb.FindDeliveriesRequest(namespace="shop", page_size=-1), "INVALID_ARGUMENT", "page_size"),
    ],
)  # fmt: skip
async def test_input_errors_are_invalid_argument_with_a_reason(
    admin: Admin, seed: Seed, request_: pb.FindDeliveriesRequest, reason: str, field: str | None
) -> None:
    await seed.pack("shop")
    exc = await expect_error(
        admin.stub.FindDeliveries(request_, metadata=Admin.md(VIEW)), grpc.StatusCode.INVALID_ARGUMENT, reason
    )
    if field is not None:
        from connector.common.core.grpc_server import error_info

        info = error_info(exc)
        assert info is not None and info.metadata.get("field") == field, info


async def test_the_calendar_edges_are_accepted(admin: Admin, seed: Seed) -> None:
    """The widest acceptance range the API takes (year 1 to 9999) is a valid, empty-bounded search."""
    await seed.pack("shop")
    await seed.receipt("shop", "orders")
    found = await _find(
        admin,
        accept_time_after=timestamp_pb2.Timestamp(seconds=-62_135_596_800),
        accept_time_before=timestamp_pb2.Timestamp(seconds=253_402_300_799),
    )
    assert len(found.deliveries) == 1
