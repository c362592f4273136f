"""Serve a python handler as a remote ``connector.v1.WorkHandlerService`` (for ``kind: grpc``).

The remote side receives the same ``HandlerContext`` shape a local python handler gets (without the
executor's lease bookkeeping) and answers an ``Outcome``; exceptions are classified the same way.
``ctx.traceparent`` is the attempt's trace context from the call metadata (docs/tracing.md).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import duration_pb2

from connector.common.core import tracing
from connector.executor.handlers import EventFact, HandlerContext, Outcome, classify
from connector.v1 import handler_service_pb2, handler_service_pb2_grpc

_OUTCOME = {
    "success": handler_service_pb2.HANDLE_OUTCOME_SUCCESS,
    "retry": handler_service_pb2.HANDLE_OUTCOME_RETRY,
    "fail": handler_service_pb2.HANDLE_OUTCOME_PERMANENT_FAILURE,
}


def context_of(
    request: handler_service_pb2.HandleRequest, remaining_s: float, traceparent: str | None = None
) -> HandlerContext:
    wi = request.work_item
    row = (
        wi.work_id,
        request.lease_token,
        wi.installed_pack_id,
        wi.generation,
        wi.queue_class,
        wi.work_type,
        wi.event_id,
        request.attempt,
        wi.max_attempts,
        wi.source_lane_key or None,
        wi.target_mutation_lane_key or None,
        traceparent,
    )
    ctx = HandlerContext(row, time.monotonic() + remaining_s, request.idempotency_key or None)
    if request.HasField("event"):
        e = request.event
        ctx.event = EventFact(
            e.event_id,
            e.receipt_id,
            0,
            e.installed_pack_id,
            e.generation,
            e.incarnation,
            e.route_id,
            e.route_version,
            e.namespace,
            e.event_kind or None,
            e.source_object_kind or None,
            e.source_object_id or None,
            e.idempotency_key,
            e.delivery_seq,
            bytes.fromhex(e.payload_sha256) if e.payload_sha256 else b"",
            e.parse_outcome,
            {},
            dict(e.correlation_ids),
            e.create_time.ToDatetime(),
        )
    ctx.payload = request.payload
    ctx.content_type = request.content_type or None
    ctx.coalesced_work_ids = tuple(request.coalesced_work_ids)
    ctx.coalesced_event_ids = tuple(request.coalesced_event_ids)
    return ctx


def response_of(out: Outcome | None) -> handler_service_pb2.HandleResponse:
    if out is None:
        return handler_service_pb2.HandleResponse(outcome=handler_service_pb2.HANDLE_OUTCOME_SUCCESS)
    resp = handler_service_pb2.HandleResponse(
        outcome=_OUTCOME[out.kind], failure_class=out.failure_class, failure_summary=out.summary
    )
    if out.kind == "retry" and out.delay_s is not None:
        resp.retry_delay.CopyFrom(
            duration_pb2.Duration(seconds=int(out.delay_s), nanos=int(out.delay_s % 1 * 1e9))
        )
    return resp


class WorkHandlerServicer(handler_service_pb2_grpc.WorkHandlerServiceServicer):
    def __init__(self, fn: Callable[[HandlerContext], Any]) -> None:
        self.fn = fn

    async def Handle(
        self, request: handler_service_pb2.HandleRequest, context: grpc.aio.ServicerContext
    ) -> handler_service_pb2.HandleResponse:
        remaining = context.time_remaining()
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        ctx = context_of(request, remaining if remaining is not None else 30.0, tracing.incoming(metadata))
        try:
            out = self.fn(ctx)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:
            out = classify(exc, ctx.payload)
        return response_of(out)


def register(server: Any, fn: Callable[[HandlerContext], Any]) -> WorkHandlerServicer:
    """Mount ``fn`` on a ``GrpcServer`` (``connector.common.core.grpc_server``)."""
    servicer = WorkHandlerServicer(fn)
    server.add(
        handler_service_pb2_grpc.add_WorkHandlerServiceServicer_to_server,
        servicer,
        handler_service_pb2.DESCRIPTOR.services_by_name["WorkHandlerService"].full_name,
    )
    return servicer
