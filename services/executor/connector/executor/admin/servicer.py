"""The AdminService servicer: requests to domain calls and rows to protos; no SQL here.

Authentication and roles are checked before a handler runs (``auth.TokenAuthenticator`` as the
server's auth hook); handlers read the caller with ``current_principal()`` for finer checks
(payload access) and for the audit ``actor`` (a key id, never the token).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message
from psycopg_pool import AsyncConnectionPool

from connector.common.core.grpc_input import InputRules
from connector.common.core.grpc_server import current_principal
from connector.common.store import legacy as legacy_store
from connector.common.store import processes, receipts, work_items
from connector.common.store.packs import pack_names
from connector.executor import cutover
from connector.executor.admin import (
    actions,
    convert,
    figures,
    find,
    packs,
    pagination,
    reconcile,
    replay,
    requests,
    stats,
    trace,
    transitions,
)
from connector.executor.admin.auth import Principal
from connector.executor.admin.errors import (
    Reason,
    invalid_argument,
    not_found,
    permission_denied,
    resource_exhausted,
)
from connector.executor.admin.session import connection
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


def _principal() -> Principal | None:
    p = current_principal()
    return p if isinstance(p, Principal) else None


def _actor() -> str:
    p = _principal()
    return f"key:{p.key_id}" if p is not None else "anonymous"


def _dt(msg: Any, name: str) -> datetime | None:
    if not msg.HasField(name):
        return None
    value: timestamp_pb2.Timestamp = getattr(msg, name)
    return value.ToDatetime(tzinfo=UTC)


def _positive_id(value: int, name: str) -> int:
    if value <= 0:
        raise invalid_argument(f"{name} must be a positive id", field=name)
    return value


def _optional_id(value: int, name: str) -> int | None:
    if value < 0:
        raise invalid_argument(f"{name} must not be negative", field=name)
    return value or None


#: A bulk replay's explicit selection (ReplayDeadLettersRequest.work_ids) at most.
MAX_SELECTED_WORK_IDS = 1000
#: ListFailureGroups: rows grouped per pack / namespace, and groups per answer.
FAILURE_SCAN_DEFAULT, FAILURE_SCAN_MAX = 10_000, 100_000
FAILURE_GROUPS_DEFAULT, FAILURE_GROUPS_MAX = 100, 500


def dead_letter_filter(
    req: pb.ListDeadLettersRequest | pb.ReplayDeadLettersRequest | pb.CancelDeadLettersRequest,
) -> work_items.admin.DeadLetterFilter:
    if req.generation < 0:
        raise invalid_argument("generation must not be negative", field="generation")
    work_ids: tuple[int, ...] | None = None
    if isinstance(req, pb.ReplayDeadLettersRequest | pb.CancelDeadLettersRequest) and req.work_ids:
        if len(req.work_ids) > MAX_SELECTED_WORK_IDS:
            raise invalid_argument(f"at most {MAX_SELECTED_WORK_IDS} work_ids", field="work_ids")
        if any(i <= 0 for i in req.work_ids):
            raise invalid_argument("work_ids must be positive ids", field="work_ids")
        work_ids = tuple(sorted(set(req.work_ids)))
    flt = work_items.admin.DeadLetterFilter(
        installed_pack_id=_optional_id(req.installed_pack_id, "installed_pack_id"),
        generation=req.generation or None,
        work_type=req.work_type or None,
        failure_class=req.failure_class or None,
        finished_after=_dt(req, "finish_time_after"),
        finished_before=_dt(req, "finish_time_before"),
        failure_summary=req.failure_summary or None,
        work_ids=work_ids,
    )
    if flt.finished_after and flt.finished_before and flt.finished_after >= flt.finished_before:
        raise invalid_argument(
            "finish_time_after must be earlier than finish_time_before", field="finish_time_after"
        )
    return flt


#: Limits of the server's input stage for admin requests (connector.common.core.grpc_input): every
#: string field of every RPC, in characters. Names, namespaces, work types, failure classes and
#: service names are far shorter; a manifest is bounded by bytes in ``packs`` too.
INPUT_RULES = InputRules(
    max_length=1024,
    field_max_length={
        "manifest": packs.MAX_MANIFEST_BYTES,
        "page_token": pagination.MAX_TOKEN_LENGTH,
        "request_id": requests.MAX_REQUEST_ID_LENGTH,
    },
)


class AdminServicer(pb_grpc.AdminServiceServicer):
    """connector.v1.AdminService over one database pool."""

    #: Read by ``GrpcServer.add``: checked for every request before its handler runs.
    input_rules = INPUT_RULES

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        page_tokens: pagination.PageTokens | None = None,
        replay_rate_default: float = 100.0,
        replay_rate_max: float = 5000.0,
        replay_batch_size: int = 100,
        bulk_replay_concurrency: int = 2,
        process_stale_s: float = 30.0,
        process_heartbeat_s: float = 5.0,
    ) -> None:
        self._pool = pool
        #: Page tokens are authenticated with this key (pagination.PageTokens).
        self.pages = page_tokens or pagination.PageTokens()
        self._rate_default = replay_rate_default
        self._rate_max = replay_rate_max
        self._batch = replay_batch_size
        self._bulk_slots = asyncio.Semaphore(bulk_replay_concurrency)
        self._stale_s = process_stale_s
        # ListProcesses flags a process stale after 3 missed heartbeats (ProcessRegistration beats
        # every 5 s by default); the gates keep counting a claimer until process_stale_s.
        self._process_stale_after_s = 3 * process_heartbeat_s

    # -- request ids ----------------------------------------------------------------------------

    async def _mutate(
        self,
        method: str,
        request_id: str,
        response_type: type[M],
        body: Callable[[Any], Awaitable[M]],
    ) -> M:
        """Run ``body(conn)`` in a transaction with AIP-155 request id de-duplication."""
        requests.check(request_id)
        async with connection(self._pool) as conn, conn.transaction():
            stored = await requests.admin_request_get(conn, request_id, method, response_type)
            if stored is not None:
                return stored
            response = await body(conn)
            await requests.admin_request_put(conn, request_id, method, response)
            return response

    # -- dead letters ---------------------------------------------------------------------------

    async def ListDeadLetters(
        self, request: pb.ListDeadLettersRequest, context: Any
    ) -> pb.ListDeadLettersResponse:
        """One failure read path per generation (docs/cutover.md): dead WorkItems of generations the
        WorkItem path owns, beside the latest failed / unknown legacy outcomes of generations the
        legacy path owns, merged newest first. Order: (finish time DESC, WorkItem before legacy at the
        same instant, id DESC); the page token carries (finish time, id, path)."""
        flt = dead_letter_filter(request)
        size = pagination.page_size(request.page_size)
        key = self.pages.decode("ListDeadLetters", request.page_token, flt.as_dict(), arity=3)
        after_wi: tuple[datetime | None, int] | None = None
        after_legacy: tuple[datetime, int] | None = None
        if key is not None:
            try:
                finished = datetime.fromisoformat(key[0]) if key[0] is not None else None
                last_id, path = int(key[1]), str(key[2])
            except (TypeError, ValueError):
                raise pagination.bad_page_token() from None
            if path == "work_item":
                after_wi = (finished, last_id)
                # Legacy rows sort after WorkItem rows of the same instant; none has a NULL time.
                after_legacy = (finished, 2**62) if finished is not None else None
            elif path == "legacy_event" and finished is not None:
                after_wi, after_legacy = (finished, 0), (finished, last_id)
            else:
                raise pagination.bad_page_token()
        async with connection(self._pool) as conn:
            rows = await work_items.admin.work_item_list_dead(conn, flt, after=after_wi, limit=size + 1)
            clauses, params = flt.legacy_where()
            legacy = await legacy_store.legacy_failure_dead_letters(
                conn, clauses, params, after=after_legacy, limit=size + 1
            )
        merged = [("work_item", r["w_finished_at"], int(r["w_work_id"]), r) for r in rows]
        merged += [("legacy_event", r["created_at"], int(r["legacy_outcome_receipt_id"]), r) for r in legacy]
        merged.sort(
            key=lambda m: (m[1] is None, m[1] or datetime.min.replace(tzinfo=UTC), m[0] == "work_item", m[2]),
            reverse=True,
        )
        response = pb.ListDeadLettersResponse()
        for path, _, _, row in merged[:size]:
            if path == "work_item":
                response.dead_letters.append(
                    pb.DeadLetter(
                        work_item=convert.work_item(row),
                        event=convert.event(row),
                        receipt=convert.receipt(row),
                        claim_path=path,
                    )
                )
            else:
                response.dead_letters.append(
                    pb.DeadLetter(
                        event=convert.event(row),
                        receipt=convert.receipt(row),
                        claim_path=path,
                        legacy_failure=transitions.legacy_failure(row),
                    )
                )
        if len(merged) > size:
            path, finished, last_id, _ = merged[size - 1]
            response.next_page_token = self.pages.encode(
                "ListDeadLetters",
                [finished.isoformat() if finished else None, last_id, path],
                flt.as_dict(),
            )
        return response

    async def GetWorkItem(self, request: pb.GetWorkItemRequest, context: Any) -> pb.GetWorkItemResponse:
        work_id = _positive_id(request.work_id, "work_id")
        if request.include_payload:
            principal = _principal()
            if principal is None or not principal.may_see_payload:
                raise permission_denied(
                    Reason.PAYLOAD_NOT_ALLOWED,
                    "include_payload needs role ReplayConnectorEvents or ConnectorOperator",
                    role="ReplayConnectorEvents",
                )
        async with connection(self._pool) as conn:
            row = await work_items.admin.work_item_get(conn, work_id, with_body=request.include_payload)
        if row is None:
            raise not_found(Reason.WORK_ITEM_NOT_FOUND, f"work item {work_id} not found")
        body = bytes(row["r_body"]) if request.include_payload and row.get("r_body") is not None else None
        if request.include_payload:
            log.info("work item payload read", extra={"work_id": work_id, "actor": _actor()})
        return pb.GetWorkItemResponse(
            work_item=convert.work_item(row), event=convert.event(row), receipt=convert.receipt(row, body)
        )

    async def ReplayWorkItem(
        self, request: pb.ReplayWorkItemRequest, context: Any
    ) -> pb.ReplayWorkItemResponse:
        work_id = _positive_id(request.work_id, "work_id")
        actor, dry = _actor(), request.dry_run

        async def body(conn: Any) -> pb.ReplayWorkItemResponse:
            row = await replay.work_item_replay(conn, work_id, actor=actor, dry_run=dry)
            return pb.ReplayWorkItemResponse(work_item=convert.work_item(row), dry_run=dry)

        request_id = "" if dry else request.request_id
        return await self._mutate("ReplayWorkItem", request_id, pb.ReplayWorkItemResponse, body)

    async def ReplayDeadLetters(
        self, request: pb.ReplayDeadLettersRequest, context: Any
    ) -> AsyncIterator[pb.ReplayDeadLettersResponse]:
        flt = dead_letter_filter(request)
        if flt.installed_pack_id is None:
            raise invalid_argument("bulk replay needs installed_pack_id", field="installed_pack_id")
        if request.rate_limit < 0:
            raise invalid_argument("rate_limit must not be negative", field="rate_limit")
        rate = min(float(request.rate_limit or self._rate_default), self._rate_max)
        batch = max(1, min(self._batch, int(rate)))
        request_id = request.request_id if not request.dry_run else ""
        requests.check(request_id)
        if request_id:
            async with connection(self._pool) as conn, conn.transaction():
                stored = await requests.admin_request_get(
                    conn, request_id, "ReplayDeadLetters", pb.ReplayDeadLettersResponse
                )
            if stored is not None:
                yield stored
                return
        if self._bulk_slots.locked():
            raise resource_exhausted(Reason.BULK_REPLAY_LIMIT, "too many bulk replays running; retry later")
        async with self._bulk_slots:
            final: pb.ReplayDeadLettersResponse | None = None
            async for progress in replay.bulk_replay(
                self._pool, flt, dry_run=request.dry_run, rate_per_s=rate, batch_size=batch, actor=_actor()
            ):
                final = pb.ReplayDeadLettersResponse(
                    total=progress.total,
                    replayed=progress.replayed,
                    refused=progress.refused,
                    refused_by_reason=dict(progress.refused_by_reason),
                    done=progress.done,
                    eligible=progress.eligible,
                    lanes=len(progress.lanes),
                    lane_keys=sorted(key for _, _, key in progress.lanes)[:10],
                )
                yield final
            if request_id and final is not None:
                async with connection(self._pool) as conn, conn.transaction():
                    if (
                        await requests.admin_request_get(
                            conn, request_id, "ReplayDeadLetters", pb.ReplayDeadLettersResponse
                        )
                        is None
                    ):
                        await requests.admin_request_put(conn, request_id, "ReplayDeadLetters", final)

    async def CancelDeadLetters(
        self, request: pb.CancelDeadLettersRequest, context: Any
    ) -> AsyncIterator[pb.CancelDeadLettersResponse]:
        flt = dead_letter_filter(request)
        if flt.installed_pack_id is None:
            raise invalid_argument("bulk cancel needs installed_pack_id", field="installed_pack_id")
        if request.rate_limit < 0:
            raise invalid_argument("rate_limit must not be negative", field="rate_limit")
        # the estimate (a dry run) may come before the reason is known
        reason = (
            "" if request.dry_run and not request.reason.strip() else actions.check_reason(request.reason)
        )
        rate = min(float(request.rate_limit or self._rate_default), self._rate_max)
        batch = max(1, min(self._batch, int(rate)))
        request_id = request.request_id if not request.dry_run else ""
        requests.check(request_id)
        method, answer = "CancelDeadLetters", pb.CancelDeadLettersResponse
        if request_id:
            async with connection(self._pool) as conn, conn.transaction():
                stored = await requests.admin_request_get(conn, request_id, method, answer)
            if stored is not None:
                yield stored
                return
        if self._bulk_slots.locked():
            raise resource_exhausted(Reason.BULK_REPLAY_LIMIT, "too many bulk jobs running; retry later")
        async with self._bulk_slots:
            final: pb.CancelDeadLettersResponse | None = None
            async for progress in replay.bulk_cancel(
                self._pool, flt, reason=reason, dry_run=request.dry_run, rate_per_s=rate, batch_size=batch,
                actor=_actor(), request_id=request_id,
            ):  # fmt: skip
                final = pb.CancelDeadLettersResponse(
                    total=progress.total,
                    cancelled=progress.cancelled,
                    refused=progress.refused,
                    refused_by_reason=dict(progress.refused_by_reason),
                    done=progress.done,
                    eligible=progress.eligible,
                    lanes=len(progress.lanes),
                    lane_keys=sorted(key for _, _, key in progress.lanes)[:10],
                )
                yield final
            if request_id and final is not None:
                async with connection(self._pool) as conn, conn.transaction():
                    if await requests.admin_request_get(conn, request_id, method, answer) is None:
                        await requests.admin_request_put(conn, request_id, method, final)

    # -- operator actions: cancel, pause, resume (admin/actions.py) --------------------------------

    async def CancelWorkItem(
        self, request: pb.CancelWorkItemRequest, context: Any
    ) -> pb.CancelWorkItemResponse:
        work_id = _positive_id(request.work_id, "work_id")
        reason = actions.check_reason(request.reason)
        actor, dry = _actor(), request.dry_run
        request_id = "" if dry else request.request_id
        done: list[actions.Cancelled] = []

        async def body(conn: Any) -> pb.CancelWorkItemResponse:
            c = await actions.work_item_cancel(conn, work_id, actor=actor, reason=reason, dry_run=dry)
            done.append(c)
            return pb.CancelWorkItemResponse(
                work_item=convert.work_item(c.row), dry_run=dry, lane_members_promoted=c.promoted
            )

        response = await self._mutate("CancelWorkItem", request_id, pb.CancelWorkItemResponse, body)
        if done and not dry:  # committed now (a stored answer of a retried request logs nothing)
            actions.log_cancelled(done[0], actor=actor, reason=reason, request_id=request_id)
        return response

    async def PausePack(self, request: pb.PausePackRequest, context: Any) -> pb.PausePackResponse:
        pack = _positive_id(request.installed_pack_id, "installed_pack_id")
        reason = actions.check_reason(request.reason)
        actor, dry = _actor(), request.dry_run
        request_id = "" if dry else request.request_id
        done: list[actions.PauseResult] = []

        async def body(conn: Any) -> pb.PausePackResponse:
            r = await actions.pack_pause(
                conn,
                pack,
                request.queue_class,
                actor=actor,
                reason=reason,
                request_id=request_id,
                dry_run=dry,
            )
            done.append(r)
            return pb.PausePackResponse(
                pause=convert.pause(r.pause, r.pack_name), changed=r.changed, dry_run=dry
            )

        response = await self._mutate("PausePack", request_id, pb.PausePackResponse, body)
        if done and done[0].changed and not dry:
            actions.log_pause("pack_paused", done[0], actor=actor, request_id=request_id, reason=reason)
        return response

    async def ResumePack(self, request: pb.ResumePackRequest, context: Any) -> pb.ResumePackResponse:
        pack = _positive_id(request.installed_pack_id, "installed_pack_id")
        actor, dry = _actor(), request.dry_run
        request_id = "" if dry else request.request_id
        done: list[actions.PauseResult] = []

        async def body(conn: Any) -> pb.ResumePackResponse:
            r = await actions.pack_resume(conn, pack, request.queue_class, dry_run=dry)
            done.append(r)
            response = pb.ResumePackResponse(changed=r.changed, dry_run=dry)
            if r.pause is not None:
                response.pause.CopyFrom(convert.pause(r.pause, r.pack_name))
            return response

        response = await self._mutate("ResumePack", request_id, pb.ResumePackResponse, body)
        if done and done[0].changed and not dry:
            actions.log_pause("pack_resumed", done[0], actor=actor, request_id=request_id, reason=None)
        return response

    async def OpenCircuit(self, request: pb.OpenCircuitRequest, context: Any) -> pb.OpenCircuitResponse:
        return await self._circuit("OpenCircuit", request, pb.OpenCircuitResponse, open_=True)

    async def CloseCircuit(self, request: pb.CloseCircuitRequest, context: Any) -> pb.CloseCircuitResponse:
        return await self._circuit("CloseCircuit", request, pb.CloseCircuitResponse, open_=False)

    async def RunReconcile(self, request: pb.RunReconcileRequest, context: Any) -> pb.RunReconcileResponse:
        seconds = reconcile.wait_s(request)
        since, actor = _dt(request, "since"), _actor()

        async def body(conn: Any) -> pb.RunReconcileResponse:
            return await reconcile.insert(conn, request, since=since, actor=actor)

        asked = await self._mutate("RunReconcile", request.request_id, pb.RunReconcileResponse, body)
        log.info(
            "reconcile run requested",
            extra={"run_id": asked.run.run_id, "namespace": request.namespace, "route": request.route_key,
                   "dry_run": request.dry_run, "actor": actor},
        )  # fmt: skip
        return await reconcile.wait(self._pool, asked.run.run_id, seconds)

    async def ListReconcileStates(
        self, request: pb.ListReconcileStatesRequest, context: Any
    ) -> pb.ListReconcileStatesResponse:
        return await reconcile.list_states(
            self._pool, self.pages, request, pagination.page_size(request.page_size)
        )

    async def _circuit(self, method: str, request: Any, response_type: Any, *, open_: bool) -> Any:
        pack = _positive_id(request.installed_pack_id, "installed_pack_id")
        if not request.target:
            raise invalid_argument("target is required (as GetQueueStats lists it)", field="target")
        reason = actions.check_reason(request.reason)
        actor, dry = _actor(), request.dry_run
        request_id = "" if dry else request.request_id
        done: list[actions.CircuitResult] = []

        async def body(conn: Any) -> Any:
            r = await actions.circuit_set(
                conn, pack, request.target, open_=open_, actor=actor, reason=reason, dry_run=dry
            )
            done.append(r)
            return response_type(circuit=convert.circuit(r.row, r.pack_name), changed=r.changed, dry_run=dry)

        response = await self._mutate(method, request_id, response_type, body)
        if done and done[0].changed and not dry:
            actions.log_circuit(done[0], actor=actor, reason=reason, request_id=request_id)
        return response

    # -- receipts -------------------------------------------------------------------------------

    async def ListReceiptFailures(
        self, request: pb.ListReceiptFailuresRequest, context: Any
    ) -> pb.ListReceiptFailuresResponse:
        size = pagination.page_size(request.page_size)
        filters = {"namespace": request.namespace or None}
        key = self.pages.decode("ListReceiptFailures", request.page_token, filters, arity=1)
        after: int | None = None
        if key is not None:
            try:
                after = int(key[0])
            except (TypeError, ValueError):
                raise pagination.bad_page_token() from None
        async with connection(self._pool) as conn:
            rows = await receipts.admin.receipt_list_failed(
                conn, request.namespace or None, after=after, limit=size + 1
            )
        response = pb.ListReceiptFailuresResponse()
        for row in rows[:size]:
            r = convert.receipt(row)
            assert r is not None
            response.receipts.append(r)
        if len(rows) > size:
            response.next_page_token = self.pages.encode(
                "ListReceiptFailures", [int(rows[size - 1]["r_receipt_id"])], filters
            )
        return response

    async def ReplayReceipt(self, request: pb.ReplayReceiptRequest, context: Any) -> pb.ReplayReceiptResponse:
        receipt_id = _positive_id(request.receipt_id, "receipt_id")
        actor = _actor()

        async def body(conn: Any) -> pb.ReplayReceiptResponse:
            row = await replay.receipt_replay(conn, receipt_id, actor=actor)
            return pb.ReplayReceiptResponse(receipt=convert.receipt(row))

        return await self._mutate("ReplayReceipt", request.request_id, pb.ReplayReceiptResponse, body)

    # -- stats ----------------------------------------------------------------------------------

    async def GetQueueStats(self, request: pb.GetQueueStatsRequest, context: Any) -> pb.GetQueueStatsResponse:
        pack = _optional_id(request.installed_pack_id, "installed_pack_id")
        if request.view not in pb.QueueStatsView.values():
            raise invalid_argument(
                f"view must be QUEUE_STATS_VIEW_FULL or QUEUE_STATS_VIEW_KEYS, not {request.view}",
                field="view",
            )
        async with connection(self._pool) as conn:
            if pack is not None and not await stats.pack_exists(conn, pack):
                raise not_found(Reason.PACK_NOT_FOUND, f"pack {pack} not found")
            result = await stats.queue_stats(
                conn, pack, stale_s=self._stale_s, counts=request.view != pb.QUEUE_STATS_VIEW_KEYS
            )
        response = pb.GetQueueStatsResponse(
            receipts_unrouted=result.receipts_unrouted,
            oldest_unrouted_age=convert.duration(result.oldest_unrouted_age),
            active_claimants=result.active_claimants,
            receipts_routing=result.receipts_routing,
            receipts_failed=result.receipts_failed,
        )
        for q in result.queues:
            response.queues.append(
                pb.QueueStats(
                    installed_pack_id=q.installed_pack_id,
                    pack_name=q.pack_name,
                    queue_class=q.queue_class,
                    depth_by_state=q.depth_by_state,
                    oldest_ready_age=convert.duration(q.oldest_ready_age),
                    in_flight=q.in_flight,
                    retry_rate=q.retry_rate,
                    dead_rate=q.dead_rate,
                    due=q.due,
                    paused=q.paused,
                )
            )
        response.pauses.extend(convert.pause(p, p["pack_name"]) for p in result.pauses)
        response.rate_limits.extend(convert.rate_limit(r) for r in result.rate_limits)
        response.rate_limits_truncated = result.rate_limits_truncated
        response.concurrency.extend(convert.concurrency(r) for r in result.concurrency)
        response.concurrency_truncated = result.concurrency_truncated
        response.debounce.extend(convert.debounce(r) for r in result.debounce)
        response.debounce_truncated = result.debounce_truncated
        response.circuits.extend(convert.circuit(r) for r in result.circuits)
        response.circuits_truncated = result.circuits_truncated
        return response

    async def GetFigures(self, request: pb.GetFiguresRequest, context: Any) -> pb.GetFiguresResponse:
        if request.window not in (pb.FIGURES_WINDOW_UNSPECIFIED, *figures.WINDOWS):
            raise invalid_argument(
                f"window must be FIGURES_WINDOW_HOUR or FIGURES_WINDOW_DAY, not {request.window}",
                field="window",
            )
        packs = list(dict.fromkeys(request.installed_pack_ids))
        if len(packs) > figures.MAX_PACKS:
            raise invalid_argument(
                f"at most {figures.MAX_PACKS} installed_pack_ids per call", field="installed_pack_ids"
            )
        if any(p < 0 for p in packs):
            raise invalid_argument("installed_pack_ids must not be negative", field="installed_pack_ids")
        async with connection(self._pool) as conn:  # one statement: the read names the packs it found
            response = await figures.figures_get(
                conn, request.window, packs, current_only=request.current_only, packs_only=request.packs_only
            )
        missing = set(packs) - {0} - {s.installed_pack_id for s in response.series}
        if missing:
            raise not_found(Reason.PACK_NOT_FOUND, f"pack {min(missing)} not found")
        return response

    async def ListBlockedLanes(
        self, request: pb.ListBlockedLanesRequest, context: Any
    ) -> pb.ListBlockedLanesResponse:
        pack = _optional_id(request.installed_pack_id, "installed_pack_id")
        size = pagination.page_size(request.page_size)
        filters = {"pack": pack}
        key = self.pages.decode("ListBlockedLanes", request.page_token, filters, arity=3)
        after: tuple[int, str, str] | None = None
        if key is not None:
            try:
                after = (int(key[0]), str(key[1]), str(key[2]))
            except (TypeError, ValueError):
                raise pagination.bad_page_token() from None
        async with connection(self._pool) as conn:
            packs = sorted(await pack_names(conn))
            heads, resume = await _blocked_heads(conn, packs if pack is None else [pack], after, size)
        response = pb.ListBlockedLanesResponse()
        for pack_id, kind, row in heads:
            response.lanes.append(
                pb.BlockedLane(
                    installed_pack_id=pack_id,
                    kind=pb.LANE_KIND_SOURCE if kind == "s" else pb.LANE_KIND_TARGET_MUTATION,
                    lane_key=row["lane_key"],
                    head=convert.work_item(row),
                    waiting=int(row["waiting"]),
                )
            )
        if resume is not None:
            response.next_page_token = self.pages.encode("ListBlockedLanes", list(resume), filters)
        return response

    # -- cutover --------------------------------------------------------------------------------

    async def GetCutoverState(
        self, request: pb.GetCutoverStateRequest, context: Any
    ) -> pb.GetCutoverStateResponse:
        pack = _optional_id(request.installed_pack_id, "installed_pack_id")
        async with connection(self._pool) as conn:
            if pack is not None and not await stats.pack_exists(conn, pack):
                raise not_found(Reason.PACK_NOT_FOUND, f"pack {pack} not found")
            state = await stats.cutover_state_get(conn, pack, stale_s=self._stale_s)
        response = pb.GetCutoverStateResponse()
        for g in state.generations:
            key = (int(g["installed_pack_id"]), int(g["generation"]))
            work_item_procs = int(g["work_item_claim_processes"])
            legacy_procs = int(g["legacy_event_claim_processes"])
            response.generations.append(
                pb.GenerationCutoverState(
                    installed_pack_id=key[0],
                    generation=key[1],
                    claim_path=convert.claim_path(g["claim_path"]),  # type: ignore[arg-type]
                    phase=convert.cutover_phase(g["phase"]),  # type: ignore[arg-type]
                    receipts=[convert.cutover_receipt(r) for r in state.receipts.get(key, [])],
                    open_rollback_fences=int(g["open_fences"]),
                    awaiting_legacy_outcome=int(g["awaiting_legacy_outcome"]),
                    processing=int(g["processing"]),
                    claim_capable_processes=work_item_procs + legacy_procs,
                    work_item_claim_processes=work_item_procs,
                    legacy_event_claim_processes=legacy_procs,
                    generation_status=g["status"],
                    active=bool(g["active"]),
                    legacy_pending=int(g["legacy_pending"]),
                    legacy_in_flight=int(g["legacy_in_flight"]),
                    awaiting_legacy_unknown=int(g["awaiting_legacy_unknown"]),
                    unprojected_legacy_receipts=int(g["unprojected_legacy_receipts"]),
                    authority_version=int(g["authority_version"] or 0),
                    rollback_fence_id=int(g["rollback_fence_id"] or 0),
                    admitting_receipt_id=int(g["cutover_receipt_id"] or 0),
                )
            )
        return response

    async def QuiesceLegacy(self, request: pb.QuiesceLegacyRequest, context: Any) -> pb.QuiesceLegacyResponse:
        actor = _actor()
        return await transitions.transition(
            self,
            "QuiesceLegacy",
            request,
            pb.QuiesceLegacyResponse,
            lambda conn, pack, gen: cutover.legacy_quiesce(conn, pack, gen, actor=actor),
        )

    async def CompleteCutover(
        self, request: pb.CompleteCutoverRequest, context: Any
    ) -> pb.CompleteCutoverResponse:
        actor, stale, dry = _actor(), self._stale_s, request.dry_run
        return await transitions.transition(
            self,
            "CompleteCutover",
            request,
            pb.CompleteCutoverResponse,
            lambda conn, pack, gen: cutover.cutover_complete(
                conn, pack, gen, actor=actor, process_stale_s=stale, dry_run=dry
            ),
            dry_run=dry,
        )

    async def BeginRollback(self, request: pb.BeginRollbackRequest, context: Any) -> pb.BeginRollbackResponse:
        actor = _actor()
        return await transitions.transition(
            self,
            "BeginRollback",
            request,
            pb.BeginRollbackResponse,
            lambda conn, pack, gen: cutover.rollback_begin(conn, pack, gen, actor=actor),
        )

    async def CompleteRollback(
        self, request: pb.CompleteRollbackRequest, context: Any
    ) -> pb.CompleteRollbackResponse:
        actor, stale, dry = _actor(), self._stale_s, request.dry_run
        return await transitions.transition(
            self,
            "CompleteRollback",
            request,
            pb.CompleteRollbackResponse,
            lambda conn, pack, gen: cutover.rollback_complete(
                conn, pack, gen, actor=actor, process_stale_s=stale, dry_run=dry
            ),
            dry_run=dry,
        )

    async def AbortTransition(
        self, request: pb.AbortTransitionRequest, context: Any
    ) -> pb.AbortTransitionResponse:
        actor, stale = _actor(), self._stale_s
        return await transitions.transition(
            self,
            "AbortTransition",
            request,
            pb.AbortTransitionResponse,
            lambda conn, pack, gen: cutover.transition_abort(
                conn, pack, gen, actor=actor, process_stale_s=stale
            ),
        )

    async def ReconcileLegacyOutcomes(
        self, request: pb.ReconcileLegacyOutcomesRequest, context: Any
    ) -> pb.ReconcileLegacyOutcomesResponse:
        return await transitions.reconcile(self, request)

    async def ResolveLegacyOutcome(
        self, request: pb.ResolveLegacyOutcomeRequest, context: Any
    ) -> pb.ResolveLegacyOutcomeResponse:
        return await transitions.resolve(self, request)

    async def ListLegacyFailures(
        self, request: pb.ListLegacyFailuresRequest, context: Any
    ) -> pb.ListLegacyFailuresResponse:
        return await transitions.legacy_failures(self, request)

    # -- processes ------------------------------------------------------------------------------

    async def ListProcesses(self, request: pb.ListProcessesRequest, context: Any) -> pb.ListProcessesResponse:
        size = pagination.page_size(request.page_size)
        filters = {"service": request.service or None}
        key = self.pages.decode("ListProcesses", request.page_token, filters, arity=1)
        after: str | None = None
        if key is not None:
            if not isinstance(key[0], str):
                raise pagination.bad_page_token()
            after = key[0]
        async with connection(self._pool) as conn:
            rows = await processes.process_list_page(
                conn,
                request.service or None,
                stale_after_s=self._process_stale_after_s,
                after=after,
                limit=size + 1,
            )
        response = pb.ListProcessesResponse(
            stale_after=convert.duration(timedelta(seconds=self._process_stale_after_s))
        )
        for row in rows[:size]:
            response.processes.append(
                pb.Process(
                    process_id=row["process_id"],
                    service=row["service"],
                    hostname=row["hostname"],
                    pid=row["pid"],
                    version=row["version"],
                    revision=row["revision"],
                    claim_capability=row["claim_capability"],
                    start_time=convert.ts(row["started_at"]),
                    heartbeat_time=convert.ts(row["heartbeat_at"]),
                    heartbeat_age=convert.duration(row["heartbeat_age"]),
                    stale=bool(row["stale"]),
                )
            )
        if len(rows) > size:
            response.next_page_token = self.pages.encode(
                "ListProcesses", [rows[size - 1]["process_id"]], filters
            )
        return response

    # -- the caller and failure groups (the operator console) ---------------------------------

    async def GetCaller(self, request: pb.GetCallerRequest, context: Any) -> pb.GetCallerResponse:
        principal = _principal()
        if principal is None:  # pragma: no cover - the auth hook runs first
            raise permission_denied(Reason.ROLE_REQUIRED, "no caller", role="none")
        return pb.GetCallerResponse(
            key_id=principal.key_id,
            roles=sorted(r.value for r in principal.roles),
            allowed_methods=principal.allowed_methods(),
            may_see_payload=principal.may_see_payload,
        )

    async def ListFailureGroups(
        self, request: pb.ListFailureGroupsRequest, context: Any
    ) -> pb.ListFailureGroupsResponse:
        pack = _optional_id(request.installed_pack_id, "installed_pack_id")
        if request.scan_limit < 0 or request.page_size < 0:
            field = "scan_limit" if request.scan_limit < 0 else "page_size"
            raise invalid_argument(f"{field} must not be negative", field=field)
        scan = min(request.scan_limit or FAILURE_SCAN_DEFAULT, FAILURE_SCAN_MAX)
        limit = min(request.page_size or FAILURE_GROUPS_DEFAULT, FAILURE_GROUPS_MAX)
        # Pages of groups by position in the answer's order (most frequent first): the groups are
        # computed afresh from the newest rows per call, so a page token carries the offset.
        filters = {"pack": pack, "scan": scan}
        key = self.pages.decode("ListFailureGroups", request.page_token, filters, arity=1)
        try:
            offset = int(key[0]) if key is not None else 0
        except (TypeError, ValueError):
            raise pagination.bad_page_token() from None
        if offset < 0 or offset > FAILURE_SCAN_MAX:
            raise pagination.bad_page_token()
        async with connection(self._pool) as conn:
            dead = await work_items.admin.work_item_dead_group(
                conn, pack, scan=scan, limit=offset + limit + 1
            )
            failed = await receipts.admin.receipt_failed_group(
                conn, pack, scan=scan, limit=offset + limit + 1
            )
        response = pb.ListFailureGroupsResponse(
            truncated=any(r["pack_truncated"] for r in dead) or any(r["namespace_truncated"] for r in failed)
        )
        if len(dead) > offset + limit or len(failed) > offset + limit:
            response.next_page_token = self.pages.encode("ListFailureGroups", [offset + limit], filters)
        dead, failed = dead[offset : offset + limit], failed[offset : offset + limit]
        for r in dead:
            response.dead_letters.append(
                pb.DeadLetterGroup(
                    installed_pack_id=r["installed_pack_id"],
                    pack_name=r["pack_name"],
                    work_type=r["work_type"],
                    failure_class=r["failure_class"] or "",
                    failure_summary=r["failure_summary"] or "",
                    count=r["n"],
                    first_time=convert.ts(r["first_at"]),
                    last_time=convert.ts(r["last_at"]),
                    sample_work_id=r["sample_work_id"],
                )
            )
        for r in failed:
            response.receipt_failures.append(
                pb.ReceiptFailureGroup(
                    namespace=r["namespace"],
                    route_key=r["route_key"],
                    error_class=r["error_class"] or "",
                    error_summary=r["error_summary"] or "",
                    count=r["n"],
                    first_time=convert.ts(r["first_at"]),
                    last_time=convert.ts(r["last_at"]),
                    sample_receipt_id=r["sample_receipt_id"],
                )
            )
        return response

    # -- find and trace (admin/find.py, admin/trace.py) -----------------------------------------

    async def FindDeliveries(
        self, request: pb.FindDeliveriesRequest, context: Any
    ) -> pb.FindDeliveriesResponse:
        return await find.find_deliveries(self._pool, self.pages, request)

    async def TraceDelivery(self, request: pb.TraceDeliveryRequest, context: Any) -> pb.TraceDeliveryResponse:
        response = await trace.trace_delivery(self._pool, request, _principal(), stale_s=self._stale_s)
        if request.include_payload:
            log.info(
                "delivery payload read",
                extra={"receipt_id": response.receipt.receipt_id, "actor": _actor()},
            )
        return response

    # -- packs (connector.common.packs.install) ------------------------------------------------------

    async def ApplyPack(self, request: pb.ApplyPackRequest, context: Any) -> pb.ApplyPackResponse:
        return await packs.apply_pack(self, request)

    async def ListPacks(self, request: pb.ListPacksRequest, context: Any) -> pb.ListPacksResponse:
        async with connection(self._pool) as conn:
            return await packs.list_packs(conn, request, self.pages)

    async def ActivateGeneration(
        self, request: pb.ActivateGenerationRequest, context: Any
    ) -> pb.ActivateGenerationResponse:
        return await packs.activate_generation(self, request)

    # Used by the packs module.
    @property
    def pool(self) -> AsyncConnectionPool:
        return self._pool

    @property
    def actor(self) -> str:
        return _actor()

    async def mutate(
        self, method: str, request_id: str, response_type: type[M], body: Callable[[Any], Awaitable[M]]
    ) -> M:
        return await self._mutate(method, request_id, response_type, body)


#: ListBlockedLanes: lanes read per page at most (one index descent each); a page that reaches it
#: before it is full ends early, with a token that resumes after the last lane read.
LANES_SCAN = 1000


async def _blocked_heads(
    conn: Any, packs: list[int], after: tuple[int, str, str] | None, size: int
) -> tuple[list[tuple[int, str, dict[str, Any]]], tuple[int, str, str] | None]:
    """Up to ``size`` blocked lane heads in (pack, kind, key) order after ``after``, walking each
    pack's lanes of each kind (``work_item_lanes_walk``) within ``LANES_SCAN`` lanes read; and where
    the next page starts (None: no more lanes)."""
    heads: list[tuple[int, str, dict[str, Any]]] = []
    budget = LANES_SCAN
    for pack_id in packs:
        for kind, _ in work_items.stats.LANE_COLUMNS:
            if after is not None and (pack_id, kind) < after[:2]:
                continue
            start = after[2] if after is not None and (pack_id, kind) == after[:2] else None
            rows, last, read, exhausted = await work_items.stats.work_item_lanes_walk(
                conn, pack_id, kind, after=start, scan=budget, limit=size - len(heads) + 1
            )
            budget -= read
            heads += [(pack_id, kind, r) for r in rows]
            if len(heads) > size:  # one more than the page: the page ends at its last head
                end_pack, end_kind, end = heads[size - 1]
                return heads[:size], (end_pack, end_kind, end["lane_key"])
            if last is not None and (not exhausted or budget <= 0):  # the scan budget ran out
                return heads, (pack_id, kind, last)
    return heads, None
