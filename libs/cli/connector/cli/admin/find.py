"""``connector admin find`` and ``connector admin trace``: where is a delivery, and why is it where
it is (docs/admin.md, "Find" and "Trace").

    connector admin find --delivery-id evt_123          every delivery with this provider id
    connector admin find --namespace shop --state dead --since 2h
    connector admin trace 812                            receipt 812's whole chain
    connector admin trace --delivery-id evt_123 [--namespace shop] [--payload]
    connector admin trace --work-id 4711
"""

from __future__ import annotations

import argparse
import base64
from collections.abc import Callable
from typing import Any

from connector.cli.admin.client import (
    Client,
    CliError,
    fetch_pages,
    positive_int,
    print_more_hint,
)
from connector.cli.admin.output import ago, enum_name, table, timestamp, to_json, when, work_item_state
from connector.common.store import vocabulary
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2


def _receipt_status(value: int) -> str:
    return enum_name(types_pb2.ReceiptStatus.Name(value), "RECEIPT_STATUS_")


def _wait_reason(value: int) -> str:
    return enum_name(pb.WaitReason.Name(value), "WAIT_REASON_")


def _correlation(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _work_summary(d: pb.Delivery) -> str:
    return " ".join(f"{w.work_id}:{w.work_type}={work_item_state(w.state)}" for w in d.work_items) or "-"


def find(client: Client, args: argparse.Namespace) -> int:
    request = pb.FindDeliveriesRequest(
        page_size=args.limit,
        page_token=args.page_token or "",
        receipt_id=args.receipt_id or 0,
        work_id=args.work_id or 0,
        provider_delivery_id=args.delivery_id or "",
        idempotency_key=args.idempotency_key or "",
        namespace=args.namespace or "",
        route_key=args.route or "",
        event_kind=args.event_kind or "",
        origin=args.origin or "",
        receipt_status=args.receipt_status or "",
        work_item_state=args.state or "",
    )
    if args.correlation:
        request.correlation_name, request.correlation_value = args.correlation
    if args.since:
        request.accept_time_after.CopyFrom(timestamp(args.since))
    if args.until:
        request.accept_time_before.CopyFrom(timestamp(args.until))
    response = fetch_pages(client, "FindDeliveries", request, "deliveries", args.all)
    if args.json:
        print(to_json(response))
        return 0
    table(
        ["receipt", "accepted", "route", "delivery_id", "kind", "routing", "work items (id:type=state)"],
        [
            (
                d.receipt.receipt_id,
                ago(d.receipt.accept_time, d.receipt.HasField("accept_time")),
                f"{d.receipt.namespace}/{d.receipt.route_key}",
                d.receipt.provider_delivery_id or "-",
                d.receipt.event_kind or (d.events[0].event_kind if d.events else "") or "-",
                _receipt_status(d.receipt.status),
                _work_summary(d),
            )
            for d in response.deliveries
        ],
    )
    if response.scanned_receipts and response.next_page_token and not args.all:
        print(
            f"(searched {response.scanned_receipts} receipts without a key; older ones are next)", flush=True
        )
    print_more_hint(args, response)
    return 0


def _lane(lane: pb.LanePosition) -> str:
    kind = "source" if lane.kind == pb.LANE_KIND_SOURCE else "target"
    head = (
        f"head {lane.head_work_id} ({work_item_state(lane.head_state)})" if lane.head_work_id else "no head"
    )
    flight = f", in flight {lane.processing_work_id}" if lane.processing_work_id else ""
    return f"{kind} {lane.lane_key!r}: {head}{flight}, {lane.ahead} ahead"


def _attempt(a: pb.WorkAttempt) -> str:
    """One attempt of a WorkItem: number, outcome, duration, token, owner, error."""
    took = f"{a.duration.ToTimedelta().total_seconds():.3f}s" if a.HasField("duration") else "-"
    error = f"  {a.failure_class or '-'}: {a.failure_summary or '-'}" if a.failure_class else ""
    return (
        f"attempt {a.attempt:<3} {a.outcome:<13} {took:>9}  token {a.lease_token}"
        f"  owner {a.lease_owner or '-'}  started {when(a.start_time, a.HasField('start_time'))}{error}"
    )


def render_trace(
    response: pb.TraceDeliveryResponse,
    *,
    payload: bool = False,
    out: Any = None,
    packs: dict[int, str] | None = None,
) -> None:
    """The human view of a trace (also used by the docs' example)."""

    def emit(text: str = "") -> None:
        print(text, file=out)

    r, routing = response.receipt, response.routing
    rows: list[tuple[str, str]] = [
        ("delivery", f"receipt {r.receipt_id}  {r.method} /{r.namespace}/{r.route_key}"),
        ("delivery id", r.provider_delivery_id or "- (identity: body hash)"),
        ("event kind", r.event_kind or "-"),
        ("origin", r.origin or "webhook"),
        (
            "verified",
            f"{routing.verification_scheme or '-'}"
            + (f" with key {routing.verification_key_ref}" if routing.verification_key_ref else ""),
        ),
        (
            "received",
            f"{when(r.received_time, r.HasField('received_time'))}"
            f"  accepted {when(r.accept_time, r.HasField('accept_time'))}",
        ),
        ("routing", f"{_receipt_status(r.status)} (attempts {r.attempts}): {routing.detail}"),
        ("correlation", ", ".join(f"{k}={v}" for k, v in sorted(r.correlation_ids.items())) or "-"),
        ("trace id", response.trace_id or "- (tracing was off)"),
        ("payload sha256", r.payload_sha256),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        emit(f"{key.ljust(width)}  {value}")
    if payload:
        try:
            text = r.body.decode()
        except UnicodeDecodeError:
            text = "base64:" + base64.b64encode(r.body).decode()
        emit(f"{'payload'.ljust(width)}  {text if r.body else '(not stored inline)'}")
    if not response.events:
        emit("\n(no events: the receipt has not been routed into any)")
    for et in response.events:
        e = et.event
        emit()
        emit(
            f"event {e.event_id}  pack {_pack(packs, e.installed_pack_id)} gen {e.generation}"
            f"  route {e.route_id}"
            f" v{e.route_version}  kind {e.event_kind or '-'}"
            f"  source {e.source_object_kind or '-'}/{e.source_object_id or '-'}  ({et.execution_owner}"
            + (f", legacy {et.legacy_state}" if et.legacy_state else "")
            + ")"
        )
        emit(f"  idempotency key  {e.idempotency_key}")
        if not et.work_items:
            emit("  (no WorkItems)")
        for wt in et.work_items:
            w = wt.work_item
            emit(
                f"  work {w.work_id}  {w.work_type}  {work_item_state(w.state)}"
                f"  attempt {w.attempts}/{w.max_attempts}  queue {w.queue_class}"
                f"  replays {w.replay_count}  lease {w.lease_owner or '-'}"
                f"  path {wt.claim_path or '-'}"
            )
            if w.failure_class or w.failure_summary:
                emit(f"      last error  {w.failure_class or '-'}: {w.failure_summary or '-'}")
            if wt.claims_not_kept:
                emit(
                    f"      attempts    of claims 1-{wt.claims_not_kept}: not kept"
                    " (those of the last 20 claims are)"
                )
            for a in wt.attempts:
                emit(f"      {_attempt(a)}")
            for lane in wt.lanes:
                emit(f"      lane        {_lane(lane)}")
            emit(f"      why         {_wait_reason(wt.wait.reason)}: {wt.wait.detail}")
    emit()
    emit(
        f"observed {when(response.observe_time, response.HasField('observe_time'))} (database clock);"
        f" {response.active_claimants} active claimant(s)"
    )


def _pack(packs: dict[int, str] | None, pack_id: int) -> str:
    name = (packs or {}).get(int(pack_id))
    return f"{name} ({pack_id})" if name else str(pack_id)


def trace(client: Client, args: argparse.Namespace) -> int:
    given = [x for x in (args.receipt_id, args.work_id, args.delivery_id) if x]
    if len(given) != 1:
        raise CliError("give one of RECEIPT_ID, --work-id or --delivery-id")
    if args.namespace and not args.delivery_id:
        raise CliError("--namespace narrows --delivery-id only")
    response = client.call(
        "TraceDelivery",
        pb.TraceDeliveryRequest(
            receipt_id=args.receipt_id or 0,
            work_id=args.work_id or 0,
            provider_delivery_id=args.delivery_id or "",
            namespace=args.namespace or "",
            include_payload=args.payload,
        ),
    )
    if args.json:
        print(to_json(response))
    else:
        render_trace(response, payload=args.payload, packs=client.pack_names())
    return 0


def add_commands(groups: argparse._SubParsersAction, common: argparse.ArgumentParser,
                 paging: Callable[[argparse.ArgumentParser], None], parse_time: Any) -> None:  # fmt: skip
    p = groups.add_parser(
        "find",
        parents=[common],
        help="find deliveries by id, key or filter, in every state",
        description="Deliveries (receipt, events, WorkItems) newest first. A key (--receipt-id, --work-id,"
        " --delivery-id, --idempotency-key, --correlation) is an index lookup; without one the receipts"
        " are searched newest first, a bounded number per call.",
    )
    p.set_defaults(admin_run=find)
    p.add_argument("--delivery-id", help="the provider's delivery id (e.g. evt_123)")
    p.add_argument("--idempotency-key", help="a receipt's or an event's idempotency key")
    p.add_argument("--receipt-id", type=positive_int, help="the delivery with this receipt id")
    p.add_argument("--work-id", type=positive_int, help="the delivery of this work item")
    p.add_argument("--correlation", type=_correlation, metavar="NAME=VALUE", help="a correlation id")
    p.add_argument("--namespace", help="only deliveries to this namespace")
    p.add_argument("--route", help="route key")
    p.add_argument("--event-kind", help="only deliveries of this event kind (e.g. demo.created)")
    p.add_argument(
        "--origin", choices=("webhook", "reconciled"), help="how the receipt came (docs/reconcile.md)"
    )
    p.add_argument("--state", choices=vocabulary.WORK_STATES, help="a delivery with a WorkItem in this state")
    p.add_argument("--receipt-status", choices=vocabulary.RECEIPT_STATES, help="the receipt's routing state")
    p.add_argument("--since", type=parse_time, help="accepted at or after (ISO 8601 or e.g. 2h)")
    p.add_argument("--until", type=parse_time, help="accepted before (ISO 8601 or e.g. 10m)")
    paging(p)

    p = groups.add_parser(
        "trace",
        parents=[common],
        help="one delivery's chain: receipt, routing, events, WorkItems and why each is not running",
        description="The whole chain of one delivery: receipt (verification, times, routing), events, and"
        " each WorkItem with attempts, last error, lease, lanes and why it is not running now.",
    )
    p.set_defaults(admin_run=trace)
    p.add_argument(
        "receipt_id", nargs="?", type=positive_int, metavar="RECEIPT_ID", help="the delivery's receipt id"
    )
    p.add_argument("--work-id", type=positive_int, help="the delivery of this WorkItem")
    p.add_argument("--delivery-id", help="the delivery with this provider delivery id")
    p.add_argument("--namespace", help="with --delivery-id: when several namespaces have it")
    p.add_argument("--payload", action="store_true", help="include the body (role ReplayConnectorEvents)")
