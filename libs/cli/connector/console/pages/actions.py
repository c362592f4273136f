"""Single-item actions in place (Delivery page): replay, cancel. Each is a POST that passed the edge
(session, CSRF, origin), then the role gate for its RPC; the API answers, the outcome is flashed and
the browser is sent back to the delivery (Post/Redirect/Get)."""

from __future__ import annotations

from aiohttp import web

from connector.console import web as edge
from connector.console.client import ApiError
from connector.console.params import Params
from connector.console.ui import act, call
from connector.v1 import admin_service_pb2 as pb


async def work_item(request: web.Request) -> web.Response:
    """/work/{id}: the delivery page of a work item."""
    work_id = Params(request.match_info).integer("work_id", minimum=1)
    trace = await call(request, "TraceDelivery", pb.TraceDeliveryRequest(work_id=work_id))
    raise web.HTTPSeeOther(f"/deliveries/{trace.receipt.receipt_id}#work-{work_id}")


async def _back(request: web.Request, work_id: int) -> web.Response:
    try:
        trace = await call(request, "TraceDelivery", pb.TraceDeliveryRequest(work_id=work_id))
        raise web.HTTPSeeOther(f"/deliveries/{trace.receipt.receipt_id}#work-{work_id}")
    except ApiError:
        raise web.HTTPSeeOther("/failures") from None


async def replay(request: web.Request) -> web.Response:
    edge.require(request, "ReplayWorkItem")
    work_id = Params(request.match_info).integer("work_id", minimum=1) or 0
    form = Params(await request.post())
    message = pb.ReplayWorkItemRequest(work_id=work_id, request_id=form.text("request_id", max_len=200))
    what = f"work item {work_id}"
    await act(request, "ReplayWorkItem", message, f"{what} replayed", f"{what} not replayed")
    return await _back(request, work_id)


async def cancel(request: web.Request) -> web.Response:
    edge.require(request, "CancelWorkItem")
    work_id = Params(request.match_info).integer("work_id", minimum=1) or 0
    form = Params(await request.post())
    message = pb.CancelWorkItemRequest(
        work_id=work_id, reason=form.reason(), request_id=form.text("request_id", max_len=200)
    )
    what = f"work item {work_id}"
    await act(request, "CancelWorkItem", message, f"{what} cancelled", f"{what} not cancelled")
    return await _back(request, work_id)
