"""FindDeliveries: deliveries (a receipt with its events and WorkItems, in every state) by key or
filter, newest receipt first, keyset-paginated (docs/admin.md, "Find").

The request becomes a ``store.receipts.find.DeliveryFilter``. A key (receipt id, work id, provider
delivery id, idempotency key, correlation id, a receipt status other than ``materialized``) makes
the search an index lookup; without one the receipts are scanned newest first, at most
``store.receipts.find.FIND_SCAN_LIMIT`` per call, so a call costs the same whatever the table size: its
page may hold fewer matches than asked for, even none, with a page token to resume below the last
receipt it examined. A time range bounds the scan by receipt id (``receipt_id_at``). Each page is completed by
three batched statements (receipts, their events, their WorkItems), never one per row.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from connector.common.store import events, receipts, vocabulary, work_items
from connector.common.store.receipts.find import FIND_TIME_MARGIN_S, RECEIPT_ORIGINS, DeliveryFilter
from connector.executor.admin import convert, pagination
from connector.executor.admin.errors import Reason, invalid_argument
from connector.executor.admin.session import connection
from connector.v1 import admin_service_pb2 as pb

METHOD = "FindDeliveries"


def _dt(msg: Any, name: str) -> datetime | None:
    if not msg.HasField(name):
        return None
    return getattr(msg, name).ToDatetime(tzinfo=UTC)


def _id(value: int, name: str) -> int | None:
    if value < 0:
        raise invalid_argument(f"{name} must be a positive id", field=name)
    return value or None


def _state(value: str, name: str, allowed: tuple[str, ...]) -> str | None:
    if not value:
        return None
    if value not in allowed:
        raise invalid_argument(
            f"{name} {value!r} is not one of: {', '.join(allowed)}", Reason.UNKNOWN_STATE, field=name
        )
    return value


def _shift(at: datetime, sign: int) -> datetime | None:
    """``at`` widened by the id/time margin (``None``: beyond the calendar, i.e. unbounded)."""
    try:
        return at + sign * timedelta(seconds=FIND_TIME_MARGIN_S)
    except OverflowError:
        return None


def delivery_filter(req: pb.FindDeliveriesRequest) -> DeliveryFilter:
    """The request's filter, checked: INVALID_ARGUMENT with a reason for anything unusable."""
    if bool(req.correlation_name) != bool(req.correlation_value):
        raise invalid_argument("correlation_name and correlation_value go together", field="correlation_name")
    flt = DeliveryFilter(
        receipt_id=_id(req.receipt_id, "receipt_id"),
        work_id=_id(req.work_id, "work_id"),
        provider_delivery_id=req.provider_delivery_id or None,
        idempotency_key=req.idempotency_key or None,
        correlation=(req.correlation_name, req.correlation_value) if req.correlation_name else None,
        namespace=req.namespace or None,
        route_key=req.route_key or None,
        event_kind=req.event_kind or None,
        origin=_state(req.origin, "origin", RECEIPT_ORIGINS),
        receipt_status=_state(req.receipt_status, "receipt_status", vocabulary.RECEIPT_STATES),
        work_item_state=_state(req.work_item_state, "work_item_state", vocabulary.WORK_STATES),
        accepted_after=_dt(req, "accept_time_after"),
        accepted_before=_dt(req, "accept_time_before"),
    )
    if flt.accepted_after and flt.accepted_before and flt.accepted_after >= flt.accepted_before:
        raise invalid_argument(
            "accept_time_after must be earlier than accept_time_before",
            Reason.INVALID_TIME_RANGE,
            field="accept_time_after",
        )
    if flt.empty:
        raise invalid_argument(
            "give at least one filter: a key (receipt_id, work_id, provider_delivery_id,"
            " idempotency_key, correlation_name/value) or namespace, route_key, event_kind, origin,"
            " receipt_status, work_item_state, accept_time_after/before",
            Reason.FILTER_REQUIRED,
        )
    return flt


async def find_deliveries(
    pool: Any, pages: pagination.PageTokens, request: pb.FindDeliveriesRequest
) -> pb.FindDeliveriesResponse:
    flt = delivery_filter(request)
    size = pagination.page_size(request.page_size)
    key = pages.decode(METHOD, request.page_token, flt.as_dict(), arity=1)
    after: int | None = None
    if key is not None:
        if not isinstance(key[0], int) or isinstance(key[0], bool) or key[0] <= 0:
            raise pagination.bad_page_token()
        after = key[0]
    response = pb.FindDeliveriesResponse()
    resume: int | None = None
    async with connection(pool) as conn:
        if flt.keyed:
            ids = await receipts.find.receipt_find(conn, flt, after=after, limit=size + 1)
            if len(ids) > size:
                ids = ids[:size]
                resume = ids[-1]
        else:
            low = high = None
            if flt.accepted_after is not None and (at := _shift(flt.accepted_after, -1)) is not None:
                low = await receipts.find.receipt_id_at(conn, at)
            if flt.accepted_before is not None and (at := _shift(flt.accepted_before, 1)) is not None:
                high = await receipts.find.receipt_id_at(conn, at)
            scan_limit = receipts.find.find_scan_limit(flt)
            page = await receipts.find.receipt_find_scan(
                conn, flt, after=after, id_range=(low, high), limit=size + 1, scan_limit=scan_limit
            )
            response.scanned_receipts = page.scanned
            ids = page.ids
            if len(ids) > size:
                ids = ids[:size]
                resume = ids[-1]
            elif page.scanned >= scan_limit and page.scanned_min is not None:
                resume = page.scanned_min  # more receipts below: the next call scans on
        if ids:
            rows = await receipts.find.receipt_get_many(conn, ids)
            event_rows = await events.event_list_by_receipts(conn, ids)
            item_rows = await work_items.admin.work_item_list_by_events(
                conn, [int(e["e_event_id"]) for e in event_rows]
            )
    if ids:
        by_receipt: dict[int, pb.Delivery] = {}
        event_receipt: dict[int, int] = {}
        for rid in ids:
            row = rows.get(rid)
            if row is None:  # deleted (retention) between the search and the read
                continue
            by_receipt[rid] = pb.Delivery(receipt=convert.receipt(row))
        for e in event_rows:
            event_receipt[int(e["e_event_id"])] = int(e["e_receipt_id"])
            if (d := by_receipt.get(int(e["e_receipt_id"]))) is not None:
                d.events.append(convert.event(e))
        for w in item_rows:
            if (d := by_receipt.get(event_receipt.get(int(w["w_event_id"]), 0))) is not None:
                d.work_items.append(convert.work_item(w))
        response.deliveries.extend(by_receipt.values())
    if resume is not None:
        response.next_page_token = pages.encode(METHOD, [resume], flt.as_dict())
    return response
