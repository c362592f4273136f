"""Lanes and keys: blocked lanes with their head and why (ListBlockedLanes: reads lane heads only);
rate-limit, concurrency and debounce keys, circuit breakers and pauses (GetQueueStats' keys view,
which counts nothing; the pack names from ListPacks); open / close a circuit and pause /
resume a pack or queue class, each with a reason (PausePack, ResumePack, OpenCircuit, CloseCircuit)."""

from __future__ import annotations

import uuid

from aiohttp import web

from connector.console import web as edge
from connector.console.params import BadInput, Params
from connector.console.ui import act, call, render
from connector.v1 import admin_service_pb2 as pb


async def lanes(request: web.Request) -> web.Response:
    params = Params(request.query)
    pack = params.integer("pack", minimum=0) or 0
    blocked = await call(
        request,
        "ListBlockedLanes",
        pb.ListBlockedLanesRequest(
            installed_pack_id=pack, page_size=100, page_token=params.text("page", max_len=8192)
        ),
    )
    # The keys view: pauses, keys and circuits, nothing counted (the queue's depth is the overview's,
    # from the sampled figures).
    stats = await call(
        request,
        "GetQueueStats",
        pb.GetQueueStatsRequest(installed_pack_id=pack, view=pb.QUEUE_STATS_VIEW_KEYS),
    )
    listed = await call(request, "ListPacks", pb.ListPacksRequest(page_size=500))
    names = [(p.installed_pack_id, p.name) for p in listed.packs]
    return render(
        request,
        "lanes.html",
        blocked=blocked,
        stats=stats,
        pack=pack,
        packs=names,
        pack_names=dict(names),
        lane_kind=lambda v: pb.LaneKind.Name(v).removeprefix("LANE_KIND_").lower().replace("_", " "),
        circuit_state=lambda v: pb.CircuitState.Name(v).removeprefix("CIRCUIT_STATE_").lower(),
        nonce=uuid.uuid4().hex,
    )


def _pack_class(form: Params) -> tuple[int, str, str]:
    """The pack and queue class of a pause or resume, and how to name them."""
    pack = form.integer("pack", minimum=1)
    if pack is None:
        raise BadInput("pack", "choose a pack")
    queue_class = form.text("queue_class", max_len=200)
    queue_class = "" if queue_class == "*" else queue_class
    return pack, queue_class, (f"queue class {queue_class} of pack {pack}" if queue_class else f"pack {pack}")


async def pause(request: web.Request) -> web.Response:
    edge.require(request, "PausePack")
    form = Params(await request.post())
    pack, queue_class, what = _pack_class(form)
    message = pb.PausePackRequest(
        installed_pack_id=pack, queue_class=queue_class, reason=form.reason(),
        request_id=form.text("request_id", max_len=200),
    )  # fmt: skip
    await act(request, "PausePack", message, f"{what} paused", f"{what} not paused")
    raise web.HTTPSeeOther("/lanes")


async def resume(request: web.Request) -> web.Response:
    edge.require(request, "ResumePack")
    form = Params(await request.post())
    pack, queue_class, what = _pack_class(form)
    message = pb.ResumePackRequest(
        installed_pack_id=pack, queue_class=queue_class, request_id=form.text("request_id", max_len=200)
    )
    await act(request, "ResumePack", message, f"{what} resumed", f"{what} not resumed")
    raise web.HTTPSeeOther("/lanes")


async def circuit(request: web.Request) -> web.Response:
    change = request.match_info.get("change", "")
    if change not in ("open", "close"):
        raise web.HTTPNotFound(text="no such action")
    method = "OpenCircuit" if change == "open" else "CloseCircuit"
    edge.require(request, method)
    form = Params(await request.post())
    pack = form.integer("pack", minimum=1)
    target = form.text("target", max_len=1024)
    if pack is None or not target:
        raise BadInput("target", "a pack and a circuit target")
    kind = pb.OpenCircuitRequest if change == "open" else pb.CloseCircuitRequest
    message = kind(
        installed_pack_id=pack,
        target=target,
        reason=form.reason(),
        request_id=form.text("request_id", max_len=200),
    )
    what = f"circuit {target} of pack {pack}"
    await act(request, method, message, f"{what}: {change}d", f"{what} not {change}d")
    raise web.HTTPSeeOther("/lanes")
