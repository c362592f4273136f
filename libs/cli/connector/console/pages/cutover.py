"""Cutover: every pack generation's claim path, phase, receipts and the proofs of its next gate
(GetCutoverState; the gate's dry run for a caller who may run it), and the gate actions for the
ConnectorOperator role, each confirmed (docs/cutover.md)."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from connector.console import web as edge
from connector.console.client import ApiError
from connector.console.params import Params
from connector.console.ui import act, call, render
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

#: phase -> the gates an operator may run next: (action, RPC, label, has a dry run)
NEXT = {
    types_pb2.CUTOVER_PHASE_LEGACY_ACTIVE: [
        ("quiesce", "QuiesceLegacy", "Quiesce the legacy path (gate 1)", False)
    ],
    types_pb2.CUTOVER_PHASE_QUIESCING: [
        ("cutover", "CompleteCutover", "Complete the cutover (gates 2, 3, 5)", True),
        ("abort", "AbortTransition", "Abort: back to the legacy path", False),
    ],
    types_pb2.CUTOVER_PHASE_WORK_ITEM_ACTIVE: [
        ("rollback-begin", "BeginRollback", "Begin a rollback (gate 4)", False)
    ],
    types_pb2.CUTOVER_PHASE_ROLLBACK_FENCED: [
        ("rollback", "CompleteRollback", "Complete the rollback (gate 4)", True),
        ("abort", "AbortTransition", "Abort: back to WorkItem claims", False),
    ],
}
GATES = {action: rpc for gates in NEXT.values() for action, rpc, _, _ in gates}
REQUESTS: dict[str, Any] = {
    "QuiesceLegacy": pb.QuiesceLegacyRequest,
    "CompleteCutover": pb.CompleteCutoverRequest,
    "AbortTransition": pb.AbortTransitionRequest,
    "BeginRollback": pb.BeginRollbackRequest,
    "CompleteRollback": pb.CompleteRollbackRequest,
}


def _name(value: int, enum: Any, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


async def cutover(request: web.Request) -> web.Response:
    session = edge.session_of(request)
    assert session is not None
    state = await call(request, "GetCutoverState", pb.GetCutoverStateRequest())
    packs = await call(request, "ListPacks", pb.ListPacksRequest(page_size=500))
    names = {p.installed_pack_id: p.name for p in packs.packs}
    rows = []
    for g in state.generations:
        gates = []
        for action, rpc, label, has_dry_run in NEXT.get(g.phase, []):
            proof = None
            if has_dry_run and session.caller.may(rpc):
                try:
                    proof = await call(
                        request,
                        rpc,
                        REQUESTS[rpc](
                            installed_pack_id=g.installed_pack_id, generation=g.generation, dry_run=True
                        ),
                    )
                except ApiError as exc:
                    if exc.code in ("UNAVAILABLE",):
                        raise
                    proof = exc
            gates.append({"action": action, "rpc": rpc, "label": label, "proof": proof})
        rows.append(
            {"g": g, "name": names.get(g.installed_pack_id, str(g.installed_pack_id)), "gates": gates}
        )
    return render(
        request,
        "cutover.html",
        rows=rows,
        path_name=lambda v: _name(v, types_pb2.ClaimPath, "CLAIM_PATH_"),
        phase_name=lambda v: _name(v, types_pb2.CutoverPhase, "CUTOVER_PHASE_"),
        nonce=uuid.uuid4().hex,
    )


async def gate(request: web.Request) -> web.Response:
    params = Params(request.match_info)
    action = params.choice("action", tuple(GATES))
    rpc = GATES.get(action, "")
    if not rpc:
        raise web.HTTPNotFound(text="no such gate")
    edge.require(request, rpc)
    pack = params.integer("pack", minimum=1)
    generation = params.integer("generation", minimum=1, maximum=2**31 - 1)
    form = Params(await request.post())
    message = REQUESTS[rpc](
        installed_pack_id=pack, generation=generation, request_id=form.text("request_id", max_len=200)
    )
    what = f"{rpc} of pack {pack} generation {generation}"
    await act(request, rpc, message, f"{what}: done", f"{what} refused", timeout_s=60.0)
    raise web.HTTPSeeOther("/cutover")
