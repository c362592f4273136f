"""Cutover and rollback RPCs over ``connector.executor.cutover`` and ``connector.executor.legacy``
(the one implementation of the gates; docs/cutover.md).

Mutations carry an AIP-155 ``request_id`` (the transition and the stored answer commit together);
dry runs change nothing and store nothing. Refusals map to canonical codes:

* ``CutoverError`` — NOT_FOUND ``PACK_NOT_FOUND`` / ``GENERATION_NOT_FOUND``, FAILED_PRECONDITION
  ``CUTOVER_WRONG_PHASE``;
* ``CutoverBlocked`` — FAILED_PRECONDITION ``CUTOVER_BLOCKED`` (cutover) or ``ROLLBACK_BLOCKED``
  (rollback, abort of a quiesce); ErrorInfo metadata ``blockers`` holds the blockers as JSON
  (``[{"code", "count", "message"}]``), the message lists them too;
* ``LegacyOutcomeError`` — NOT_FOUND ``EVENT_NOT_FOUND``, FAILED_PRECONDITION
  ``LEGACY_OUTCOME_NOT_UNKNOWN`` / ``LEGACY_OUTCOME_IN_FLIGHT`` / ``LEGACY_NOT_OWNED``,
  INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from connector.common.core.grpc_server import ServiceError
from connector.common.packs.manifest import canonical_json
from connector.common.store import authority, work_items
from connector.common.store.legacy import legacy_outcome_receipt_list_failed
from connector.executor import cutover, legacy
from connector.executor.admin import convert
from connector.executor.admin.errors import Reason, invalid_argument
from connector.executor.admin.session import connection
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

log = logging.getLogger(__name__)

_OUTCOMES = {
    "succeeded": pb.LEGACY_OUTCOME_SUCCEEDED,
    "failed": pb.LEGACY_OUTCOME_FAILED,
    "unknown": pb.LEGACY_OUTCOME_UNKNOWN,
}
_OUTCOME_NAMES = {v: k for k, v in _OUTCOMES.items()}


def _ids(installed_pack_id: int, generation: int) -> None:
    if installed_pack_id <= 0:
        raise invalid_argument("installed_pack_id must be a positive id", field="installed_pack_id")
    if generation < 0:
        raise invalid_argument("generation must not be negative", field="generation")


def _work_item_state(state: str | None) -> int:
    """A WorkItem's state as the proto enum (unspecified: there is no WorkItem)."""
    return convert.work_item_state(state) if state else int(types_pb2.WORK_ITEM_STATE_UNSPECIFIED)


def service_error(exc: Exception) -> ServiceError:
    """Domain refusals of the gates as canonical errors."""
    if isinstance(exc, cutover.CutoverBlocked):
        reason = Reason.CUTOVER_BLOCKED if exc.action == "cutover" else Reason.ROLLBACK_BLOCKED
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            reason,
            str(exc),
            {"blockers": json.dumps([b.as_dict() for b in exc.blockers])},
        )
    if isinstance(exc, cutover.CutoverError):
        if exc.reason == "not_found":
            reason = Reason.PACK_NOT_FOUND if "generation" not in exc.message else Reason.GENERATION_NOT_FOUND
            return ServiceError(grpc.StatusCode.NOT_FOUND, reason, exc.message)
        return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, Reason.CUTOVER_WRONG_PHASE, exc.message)
    if isinstance(exc, legacy.LegacyOutcomeError):
        mapping = {
            "not_found": (grpc.StatusCode.NOT_FOUND, Reason.EVENT_NOT_FOUND),
            "not_legacy_owned": (grpc.StatusCode.FAILED_PRECONDITION, Reason.LEGACY_NOT_OWNED),
            "in_flight": (grpc.StatusCode.FAILED_PRECONDITION, Reason.LEGACY_OUTCOME_IN_FLIGHT),
            "not_unknown": (grpc.StatusCode.FAILED_PRECONDITION, Reason.LEGACY_OUTCOME_NOT_UNKNOWN),
        }
        code, why = mapping.get(exc.reason, (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT))
        return ServiceError(code, why, exc.message)
    raise exc


async def _transition_proto(conn: Any, t: cutover.Transition) -> pb.CutoverTransition:
    out = pb.CutoverTransition(
        installed_pack_id=t.installed_pack_id,
        generation=t.generation,
        claim_path=convert.claim_path(t.claim_path),  # type: ignore[arg-type]
        phase=convert.cutover_phase(t.phase),  # type: ignore[arg-type]
        authority_version=t.version,
        changed=t.changed,
        rollback_fence_id=t.fence_id or 0,
        fenced_work_items=t.fenced_work_items,
        proof_json=canonical_json(t.proof) if t.proof is not None else "",
        blockers=[pb.CutoverBlocker(code=b.code, count=b.count, message=b.message) for b in t.blockers],
        dry_run=t.dry_run,
    )
    if t.receipt_id:
        r = await authority.cutover_receipt_get(conn, t.receipt_id)
        if r is not None:
            out.receipt.CopyFrom(convert.cutover_receipt(r))
    elif t.proof_sha256:
        out.receipt.CopyFrom(pb.CutoverReceipt(kind=t.receipt_kind or "", proof_sha256=t.proof_sha256))
    return out


Step = Callable[[Any, int, int], Awaitable[cutover.Transition]]


async def transition(
    servicer: Any,
    method: str,
    request: Any,
    response_type: type[Any],
    step: Step,
    *,
    dry_run: bool = False,
) -> Any:
    """Resolve the generation, run ``step(conn, pack, generation)``, answer ``response_type``."""
    _ids(request.installed_pack_id, request.generation)

    async def body(conn: Any) -> Any:
        try:
            generation = await cutover.generation_resolve(conn, request.installed_pack_id, request.generation)
            t = await step(conn, request.installed_pack_id, generation)
        except (cutover.CutoverError, cutover.CutoverBlocked) as exc:
            raise service_error(exc) from None
        if not dry_run:
            log.info(
                "cutover transition",
                extra={
                    "event": "cutover_transition",
                    "method": method,
                    "installed_pack_id": t.installed_pack_id,
                    "generation": t.generation,
                    "action": t.action,
                    "phase": t.phase,
                    "claim_path": t.claim_path,
                    "changed": t.changed,
                    "version": t.version,
                    "receipt_id": t.receipt_id,
                    "fence_id": t.fence_id,
                    "fenced_work_items": t.fenced_work_items,
                    "actor": servicer.actor,
                },
            )
        return response_type(transition=await _transition_proto(conn, t))

    if dry_run:
        async with connection(servicer.pool) as conn:
            return await body(conn)
    return await servicer.mutate(method, request.request_id, response_type, body)


async def reconcile(
    servicer: Any, request: pb.ReconcileLegacyOutcomesRequest
) -> pb.ReconcileLegacyOutcomesResponse:
    if request.installed_pack_id < 0 or request.generation < 0:
        raise invalid_argument("installed_pack_id and generation must not be negative")
    if request.generation and not request.installed_pack_id:
        raise invalid_argument("generation needs installed_pack_id", field="generation")

    async def body(conn: Any) -> pb.ReconcileLegacyOutcomesResponse:
        report = await cutover.legacy_reconcile(
            conn, request.installed_pack_id or None, request.generation or None
        )
        return pb.ReconcileLegacyOutcomesResponse(
            projected=report.projected,
            duplicates=report.duplicates,
            conflicts=report.conflicts,
            conflict_receipt_ids=report.conflict_receipt_ids,
            resolved_fence_ids=report.fences_resolved,
        )

    return await servicer.mutate(
        "ReconcileLegacyOutcomes", request.request_id, pb.ReconcileLegacyOutcomesResponse, body
    )


async def resolve(servicer: Any, request: pb.ResolveLegacyOutcomeRequest) -> pb.ResolveLegacyOutcomeResponse:
    if request.event_id <= 0:
        raise invalid_argument("event_id must be a positive id", field="event_id")
    if not request.work_type:
        raise invalid_argument("work_type is required", field="work_type")
    outcome = _OUTCOME_NAMES.get(request.outcome)
    if outcome not in ("succeeded", "failed"):
        raise invalid_argument("outcome must be SUCCEEDED or FAILED", field="outcome")
    actor = servicer.actor

    async def body(conn: Any) -> pb.ResolveLegacyOutcomeResponse:
        try:
            done = await legacy.legacy_outcome_resolve(
                conn,
                event_id=request.event_id,
                work_type=request.work_type,
                outcome=str(outcome),
                reason=request.reason,
                actor=actor,
            )
        except legacy.LegacyOutcomeError as exc:
            raise service_error(exc) from None
        work_state = await work_items.admin.work_item_state_by_event(
            conn, request.event_id, request.work_type
        )
        return pb.ResolveLegacyOutcomeResponse(
            event_id=done.event_id,
            work_type=done.work_type,
            version=done.version,
            outcome=_OUTCOMES[done.outcome],
            digest=done.digest,
            event_legacy_state=done.event_legacy_state,
            work_item_state=_work_item_state(work_state),  # type: ignore[arg-type]
        )

    return await servicer.mutate(
        "ResolveLegacyOutcome", request.request_id, pb.ResolveLegacyOutcomeResponse, body
    )


def legacy_failure(row: dict[str, Any]) -> pb.LegacyFailure:
    """A legacy outcome receipt row (``LEGACY_OUTCOME_RECEIPT_LIST_FAILED`` /
    ``LEGACY_FAILURE_DEAD_LETTERS``) as the API's LegacyFailure."""
    return pb.LegacyFailure(
        event=convert.event(row),
        receipt=convert.receipt(row),
        work_type=row["work_type"],
        outcome=_OUTCOMES[str(row["outcome"])],
        version=int(row["version"]),
        failure_class=row["failure_class"] or "",
        failure_summary=row["failure_summary"] or "",
        actor=row["actor"],
        create_time=convert.ts(row["created_at"]),
        event_legacy_state=row["legacy_state"] or "",
        work_id=int(row["work_id"] or 0),
        work_item_state=_work_item_state(row["work_state"]),  # type: ignore[arg-type]
    )


async def legacy_failures(
    servicer: Any, request: pb.ListLegacyFailuresRequest
) -> pb.ListLegacyFailuresResponse:
    from connector.executor.admin import pagination

    _ids(request.installed_pack_id, request.generation)
    size = pagination.page_size(request.page_size)
    async with connection(servicer.pool) as conn:
        try:
            generation = await cutover.generation_resolve(conn, request.installed_pack_id, request.generation)
        except cutover.CutoverError as exc:
            raise service_error(exc) from None
        filters = {"pack": request.installed_pack_id, "generation": generation}
        key = servicer.pages.decode("ListLegacyFailures", request.page_token, filters, arity=1)
        try:
            after = int(key[0]) if key is not None else 2**62
        except (TypeError, ValueError):
            raise pagination.bad_page_token() from None
        rows = await legacy_outcome_receipt_list_failed(
            conn, request.installed_pack_id, generation, after=after, limit=size + 1
        )
    response = pb.ListLegacyFailuresResponse()
    for row in rows[:size]:
        response.failures.append(legacy_failure(row))
    if len(rows) > size:
        response.next_page_token = servicer.pages.encode(
            "ListLegacyFailures", [int(rows[size - 1]["legacy_outcome_receipt_id"])], filters
        )
    return response
