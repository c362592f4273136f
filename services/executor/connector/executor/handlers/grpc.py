"""Remote handlers: a ``connector.v1.WorkHandlerService`` reached over gRPC.

The call's deadline is the lease time left (capped by the work type's ``timeout_s``), so a remote
handler never outlives the lease it was called under; it receives the lease token and the
idempotency key and should reject stale tokens at its effect. Status codes that can never succeed
as sent (INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, ALREADY_EXISTS, OUT_OF_RANGE,
UNIMPLEMENTED) are permanent; every other failure (including DEADLINE_EXCEEDED and UNAVAILABLE) is
retried with backoff. The attempt's trace context travels as call metadata (``traceparent``,
docs/tracing.md).
"""

from __future__ import annotations

import grpc

from connector.common.core import tracing
from connector.executor.handlers import HandlerContext, Outcome, sanitize_summary
from connector.v1 import handler_service_pb2, handler_service_pb2_grpc, types_pb2

PERMANENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def work_item_message(ctx: HandlerContext) -> types_pb2.WorkItem:
    return types_pb2.WorkItem(
        work_id=ctx.work_id,
        event_id=ctx.event_id,
        installed_pack_id=ctx.installed_pack_id,
        generation=ctx.generation,
        work_type=ctx.work_type,
        queue_class=ctx.queue_class,
        state=types_pb2.WORK_ITEM_STATE_PROCESSING,
        attempts=ctx.attempt,
        max_attempts=ctx.max_attempts,
        source_lane_key=ctx.source_lane_key or "",
        target_mutation_lane_key=ctx.target_mutation_lane_key or "",
        lease_token=ctx.lease_token,
    )


def event_message(ctx: HandlerContext) -> types_pb2.Event | None:
    e = ctx.event
    if e is None:
        return None
    msg = types_pb2.Event(
        event_id=e.event_id,
        receipt_id=e.receipt_id,
        installed_pack_id=e.installed_pack_id,
        generation=e.generation,
        incarnation=e.incarnation,
        route_id=e.route_id,
        route_version=e.route_version,
        namespace=e.namespace,
        event_kind=e.event_kind or "",
        source_object_kind=e.source_object_kind or "",
        source_object_id=e.source_object_id or "",
        idempotency_key=e.idempotency_key,
        delivery_seq=e.delivery_seq,
        payload_sha256=bytes(e.payload_sha256).hex(),
        parse_outcome=e.parse_outcome,
        correlation_ids={str(k): str(v) for k, v in (e.correlation_ids or {}).items()},
    )
    msg.create_time.FromDatetime(e.created_at)
    return msg


def handle_request(ctx: HandlerContext) -> handler_service_pb2.HandleRequest:
    req = handler_service_pb2.HandleRequest(
        work_item=work_item_message(ctx),
        payload=ctx.payload or b"",
        content_type=ctx.content_type or "",
        lease_token=ctx.lease_token,
        idempotency_key=ctx.idempotency_key,
        attempt=ctx.attempt,
        coalesced_work_ids=ctx.coalesced_work_ids,
        coalesced_event_ids=ctx.coalesced_event_ids,
    )
    ev = event_message(ctx)
    if ev is not None:
        req.event.CopyFrom(ev)
    return req


def outcome_of(resp: handler_service_pb2.HandleResponse, payload: bytes | None) -> Outcome:
    summary = sanitize_summary(resp.failure_summary, payload)
    if resp.outcome == handler_service_pb2.HANDLE_OUTCOME_SUCCESS:
        return Outcome.success()
    if resp.outcome == handler_service_pb2.HANDLE_OUTCOME_RETRY:
        delay = resp.retry_delay.ToTimedelta().total_seconds() if resp.HasField("retry_delay") else None
        return Outcome.retry(delay, resp.failure_class or "remote_retry", summary)
    if resp.outcome == handler_service_pb2.HANDLE_OUTCOME_PERMANENT_FAILURE:
        return Outcome.fail(resp.failure_class or "remote_permanent", summary)
    return Outcome.retry(None, "remote_protocol", "the remote handler answered no outcome")


class GrpcHandler:
    needs_event = True

    def __init__(self, target: str, timeout_s: float) -> None:
        self.target = target.removeprefix("grpc://")
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: handler_service_pb2_grpc.WorkHandlerServiceStub | None = None

    def _get_stub(self) -> handler_service_pb2_grpc.WorkHandlerServiceStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.target)
            self._stub = handler_service_pb2_grpc.WorkHandlerServiceStub(self._channel)
        return self._stub

    async def __call__(self, ctx: HandlerContext) -> Outcome:
        deadline = min(self.timeout_s, ctx.remaining_lease_s())
        if deadline <= 0.05:
            return Outcome.retry(None, "lease_exhausted", "no lease time left to call the remote handler")
        try:
            metadata = (
                tuple(tracing.outgoing(ctx.traceparent).items()) if ctx.traceparent is not None else None
            )
            resp = await self._get_stub().Handle(handle_request(ctx), timeout=deadline, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            summary = f"gRPC {code.name}: {sanitize_summary(exc.details() or '', ctx.payload)}"
            if code in PERMANENT_CODES:
                return Outcome.fail(f"grpc_{code.name.lower()}", summary)
            return Outcome.retry(None, f"grpc_{code.name.lower()}", summary)
        return outcome_of(resp, ctx.payload)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None
