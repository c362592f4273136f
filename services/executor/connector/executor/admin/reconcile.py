"""``RunReconcile`` (docs/reconcile.md): an operator's reconciliation pass of one route.

The admin API writes no receipt (the ingress is their sole writer): it records the request as a
``connector_reconcile_run`` row; the ingress process that leads the reconciler takes it within its
tick, runs the pass and writes the result on the row, which this module waits for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from google.protobuf import timestamp_pb2
from psycopg_pool import AsyncConnectionPool

from connector.common.packs.reconcile import ReconcileSpec
from connector.common.store import reconcile as store
from connector.common.store.packs import route_list_active
from connector.executor.admin.errors import Reason, failed_precondition, invalid_argument, not_found
from connector.executor.admin.session import connection
from connector.v1 import admin_service_pb2 as pb

DEFAULT_WAIT_S = 60.0
MAX_WAIT_S = 600.0
POLL_S = 0.2

_STATES = {
    "pending": pb.RECONCILE_RUN_STATE_PENDING,
    "running": pb.RECONCILE_RUN_STATE_RUNNING,
    "done": pb.RECONCILE_RUN_STATE_DONE,
    "failed": pb.RECONCILE_RUN_STATE_FAILED,
}


def wait_s(request: pb.RunReconcileRequest) -> float:
    if not request.HasField("wait"):
        return DEFAULT_WAIT_S
    # From the raw fields: any int64 arrives here (a timedelta of it would overflow).
    seconds = request.wait.seconds + request.wait.nanos / 1e9
    if not 0 <= seconds <= MAX_WAIT_S:
        raise invalid_argument(f"wait must be between 0 and {MAX_WAIT_S:g} seconds", field="wait")
    return seconds


async def check_route(conn: Any, namespace: str, route_key: str) -> None:
    """The route is active and declares a usable ``reconcile`` (else NOT_FOUND / FAILED_PRECONDITION)."""
    if not namespace or not route_key:
        raise invalid_argument("namespace and route_key are required", field="route_key")
    for row in await route_list_active(conn):
        if row["namespace"] == namespace and row["route_key"] == route_key:
            config = row["config"] if isinstance(row["config"], Mapping) else {}
            if config.get("reconcile") is None:
                raise failed_precondition(
                    Reason.NOT_RECONCILED,
                    f"route {namespace}/{route_key} declares no reconcile (docs/reconcile.md)",
                )
            ReconcileSpec.model_validate(config["reconcile"])
            return
    raise not_found(
        Reason.ROUTE_NOT_FOUND, f"no active route {namespace}/{route_key}: see connector admin packs list"
    )


async def insert(
    conn: Any, request: pb.RunReconcileRequest, *, since: datetime | None, actor: str
) -> pb.RunReconcileResponse:
    await check_route(conn, request.namespace, request.route_key)
    run_id = await store.reconcile_run_insert(
        conn,
        request.namespace,
        request.route_key,
        since=since.timestamp() if since is not None else None,
        dry_run=request.dry_run,
        actor=actor,
    )
    run = await store.reconcile_run_get(conn, run_id)
    assert run is not None
    return pb.RunReconcileResponse(run=to_proto(run))


async def wait(pool: AsyncConnectionPool, run_id: int, seconds: float) -> pb.RunReconcileResponse:
    """The run once it finished, or as it stands after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        async with connection(pool) as conn:
            row = await store.reconcile_run_get(conn, run_id)
        assert row is not None
        if row["state"] in ("done", "failed") or time.monotonic() >= deadline:
            return pb.RunReconcileResponse(run=to_proto(row))
        await asyncio.sleep(POLL_S)


async def list_states(
    pool: AsyncConnectionPool, pages: Any, request: pb.ListReconcileStatesRequest, size: int
) -> pb.ListReconcileStatesResponse:
    filters = {"namespace": request.namespace or None}
    key = pages.decode("ListReconcileStates", request.page_token, filters, arity=2)
    after = (str(key[0]), str(key[1])) if key is not None else None
    async with connection(pool) as conn:
        rows = await store.reconcile_state_list_page(
            conn, request.namespace or None, after=after, limit=size + 1
        )
    response = pb.ListReconcileStatesResponse()
    for row in rows[:size]:
        state = pb.ReconcileState(
            namespace=row["namespace"],
            route_key=row["route_key"],
            last_error_class=row["last_error_class"] or "",
            last_error=row["last_error"] or "",
            last_listed=int(row["last_listed"] or 0),
            last_missing=int(row["last_missing"] or 0),
            last_admitted=int(row["last_admitted"] or 0),
        )
        for field, column in (
            ("watermark", "watermark"),
            ("last_pass_time", "last_pass_at"),
            ("last_clean_pass_time", "last_clean_pass_at"),
            ("pass_until", "pass_until"),
            ("create_time", "created_at"),
        ):
            if row[column] is not None:
                getattr(state, field).FromDatetime(row[column])
        response.states.append(state)
    if len(rows) > size:
        last = rows[size - 1]
        response.next_page_token = pages.encode(
            "ListReconcileStates", [last["namespace"], last["route_key"]], filters
        )
    return response


def _ts(seconds: float | None) -> timestamp_pb2.Timestamp | None:
    if seconds is None or seconds <= 0:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(datetime.fromtimestamp(seconds, UTC))
    return ts


def to_proto(row: Mapping[str, Any]) -> pb.ReconcileRun:
    result: Mapping[str, Any] = row.get("result") or {}
    return pb.ReconcileRun(
        run_id=int(row["run_id"]),
        namespace=row["namespace"],
        route_key=row["route_key"],
        state=_STATES.get(row["state"], pb.RECONCILE_RUN_STATE_UNSPECIFIED),
        dry_run=bool(row["dry_run"]),
        mode=str(result.get("mode") or ""),
        since=_ts(result.get("since") if result else row.get("since")),
        until=_ts(result.get("until")),
        listed=int(result.get("listed") or 0),
        missing=int(result.get("missing") or 0),
        admitted=int(result.get("admitted") or 0),
        redelivered=int(result.get("redelivered") or 0),
        pages=int(result.get("pages") or 0),
        error_class=str(result.get("error_class") or ""),
        error=str(result.get("error") or ""),
        missing_delivery_ids=[str(i) for i in result.get("missing_ids") or ()],
        actor=str(row.get("actor") or ""),
    )
