"""Deliveries (FindDeliveries: every filter, the API's keyset pages) and one delivery
(TraceDelivery as a timeline, why-not-running, lanes; replay and cancel in place)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from connector.console import web as edge
from connector.console.params import BadInput, Params
from connector.console.ui import NONE, OPTIONS_KEY, call, dur, render, ts
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

RECEIPT_STATUSES = ("pending", "routing", "retry", "materialized", "failed")
WORK_STATES = (
    "pending",
    "blocked",
    "processing",
    "retry",
    "succeeded",
    "dead",
    "cancelled",
    "awaiting_legacy_outcome",
    "reconciled_legacy_terminal",
)
FILTERS = (
    "receipt_id",
    "work_id",
    "delivery_id",
    "idempotency_key",
    "correlation",
    "namespace",
    "route",
    "kind",
    "routing",
    "state",
    "since",
    "until",
)
PAGE_SIZES = ("25", "50", "100")


def _stamp(moment: Any) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(moment)
    return out


def find_request(params: Params) -> tuple[pb.FindDeliveriesRequest, dict[str, str]]:
    """The FindDeliveries request of the page's query (and the filters to show back in the form).
    Without any filter the page shows the last hour (the API needs at least one)."""
    shown = {name: params.text(name) for name in FILTERS}
    if not any(shown.values()):
        shown["since"] = "1h"
    req = pb.FindDeliveriesRequest(page_size=int(params.choice("size", PAGE_SIZES) or 50))
    req.page_token = params.text("page", max_len=8192)
    for key in ("receipt_id", "work_id"):
        number = params.integer(key, minimum=1)
        if number:
            setattr(req, key, number)
    req.provider_delivery_id = shown["delivery_id"]
    req.idempotency_key = shown["idempotency_key"]
    if shown["correlation"]:
        name, sep, value = shown["correlation"].partition("=")
        if not sep or not name.strip() or not value.strip():
            raise BadInput("correlation", "name=value")
        req.correlation_name, req.correlation_value = name.strip(), value.strip()
    req.namespace = shown["namespace"]
    req.route_key = shown["route"]
    req.event_kind = shown["kind"]
    req.receipt_status = params.choice("routing", RECEIPT_STATUSES)
    req.work_item_state = params.choice("state", WORK_STATES)
    since = Params({"since": shown["since"]}).since("since")
    until = params.since("until")
    if since is not None:
        req.accept_time_after.CopyFrom(_stamp(since))
    if until is not None:
        req.accept_time_before.CopyFrom(_stamp(until))
    if since is not None and until is not None and since >= until:
        raise BadInput("until", "must be after since")
    return req, shown


async def deliveries(request: web.Request) -> web.Response:
    params = Params(request.query)
    req, shown = find_request(params)
    response = await call(request, "FindDeliveries", req)
    keep = {k: v for k, v in shown.items() if v}
    return render(
        request,
        "deliveries.html",
        found=response,
        filters=shown,
        keep=keep,
        page_token=req.page_token,
        receipt_statuses=RECEIPT_STATUSES,
        work_states=WORK_STATES,
    )


@dataclass(slots=True)
class Step:
    time: Any
    label: str
    detail: str = ""
    kind: str = ""


#: Attempt outcomes that are the WorkItem's finish (its "finished" step would repeat them).
ATTEMPT_FINAL = ("dead", "succeeded")
_ATTEMPT_KIND = {"succeeded": "ok", "running": "wait", "released": "wait"}


def attempt_steps(work_id: int, attempts: Any) -> list[Step]:
    """Each attempt of a WorkItem (``WorkItemTrace.attempts``): its claim, and its end unless running."""
    out: list[Step] = []
    for a in attempts:
        owner = a.lease_owner or NONE
        out.append(
            Step(
                a.start_time,
                f"work item {work_id} attempt {a.attempt}",
                f"by {owner}, lease token {a.lease_token}",
            )
        )
        if a.HasField("end_time"):
            detail = f"after {dur(a.duration)}"
            if a.failure_class:
                detail += f" — {a.failure_class}: {a.failure_summary}"
            out.append(
                Step(
                    a.end_time,
                    f"work item {work_id} attempt {a.attempt} {a.outcome.replace('_', ' ')}",
                    detail,
                    _ATTEMPT_KIND.get(a.outcome, "bad"),
                )
            )
    return out


def timeline(trace: Any) -> list[Step]:
    r, rt = trace.receipt, trace.routing
    steps = [
        Step(r.received_time, "received", f"{r.method} {r.namespace}/{r.route_key}"),
        Step(
            r.received_time,
            "verified",
            f"{rt.verification_scheme or NONE} with key {rt.verification_key_ref or NONE}",
        ),
        Step(r.accept_time, "committed", f"receipt {r.receipt_id}, payload sha256 {r.payload_sha256[:16]}…"),
    ]
    status, routed = r.status, (rt.route_time if rt.route_time.seconds else None)
    if status == types_pb2.RECEIPT_STATUS_MATERIALIZED:
        steps.append(Step(routed, "routed", rt.detail, "ok"))
    elif status == types_pb2.RECEIPT_STATUS_FAILED:
        steps.append(Step(routed, "routing failed", rt.detail, "bad"))
    else:
        steps.append(Step(None, "routing", rt.detail, "wait"))
    for ev in trace.events:
        steps.append(
            Step(
                ev.event.create_time,
                f"event {ev.event.event_id}",
                f"{ev.event.event_kind} ({ev.execution_owner})",
            )
        )
        for wt in ev.work_items:
            w = wt.work_item
            steps.append(
                Step(w.create_time, f"work item {w.work_id} created", f"{w.work_type} in {w.queue_class}")
            )
            if wt.attempts:
                steps.extend(attempt_steps(w.work_id, wt.attempts))
                if wt.attempts[-1].outcome in ATTEMPT_FINAL:
                    continue
            elif w.lease_owner:
                steps.append(
                    Step(
                        w.update_time,
                        f"work item {w.work_id} claimed",
                        f"by {w.lease_owner}, lease token {w.lease_token}, until {ts(w.lease_until)}",
                    )
                )
            if w.finish_time.seconds:
                detail = w.outcome or ""
                if w.failure_class:
                    detail += f" — {w.failure_class}: {w.failure_summary}"
                steps.append(
                    Step(
                        w.finish_time,
                        f"work item {w.work_id} finished",
                        detail,
                        "bad" if w.failure_class else "ok",
                    )
                )
    # in time order; the "now" steps (still waiting) last; equal times keep the chain's order
    return sorted(steps, key=lambda s: (s.time is None, (s.time.seconds, s.time.nanos) if s.time else (0, 0)))


REPLAYABLE = (types_pb2.WORK_ITEM_STATE_DEAD, types_pb2.WORK_ITEM_STATE_CANCELLED)
CANCELLABLE = (
    types_pb2.WORK_ITEM_STATE_PENDING,
    types_pb2.WORK_ITEM_STATE_BLOCKED,
    types_pb2.WORK_ITEM_STATE_RETRY,
    types_pb2.WORK_ITEM_STATE_DEAD,
)


async def delivery(request: web.Request) -> web.Response:
    params = Params(request.match_info)
    receipt_id = params.integer("receipt_id", minimum=1)
    session = edge.session_of(request)
    assert session is not None
    want_payload = Params(request.query).choice("payload", ("1",)) == "1"
    if want_payload and not session.caller.may_see_payload:
        edge.audit_refusal(request, "role", rpc="TraceDelivery(include_payload)")
        raise web.HTTPForbidden(text="your token may not read payloads")
    trace = await call(
        request, "TraceDelivery", pb.TraceDeliveryRequest(receipt_id=receipt_id, include_payload=want_payload)
    )
    template = request.app[OPTIONS_KEY].get("trace_url_template", "")
    trace_url = template.replace("{trace_id}", trace.trace_id) if template and trace.trace_id else ""
    return render(
        request,
        "delivery.html",
        trace=trace,
        steps=timeline(trace),
        trace_url=trace_url,
        payload=trace.receipt.body.decode("utf-8", "replace") if want_payload else None,
        replayable=REPLAYABLE,
        cancellable=CANCELLABLE,
        wait_name=lambda v: pb.WaitReason.Name(v).removeprefix("WAIT_REASON_").lower(),
        lane_kind=lambda v: pb.LaneKind.Name(v).removeprefix("LANE_KIND_").lower().replace("_", " "),
        nonce=uuid.uuid4().hex,
    )
