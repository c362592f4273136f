"""Backfill: WorkItems for eligible non-terminal events that have none (``connector materializer
backfill``, and the cutover inside its transaction).

The live routing loop creates an event and its WorkItems in one transaction, so an event without a
WorkItem row exists only when it was materialized for the legacy Event claim path (or predates the
WorkItem path). Before such a generation can become WorkItem-claimable its backlog must be
materialized (seed: "Migration"); this command does that, idempotently:

* **eligible** = no WorkItem row for the event other than reconciled legacy mirrors (work types the
  legacy path already finished keep their ``reconciled_legacy_terminal`` row; the insert conflicts on
  it and creates only the missing work types), the event is not terminal and not in flight on
  the legacy path (``legacy_state`` is null, ``pending`` or ``retry``), and its generation's claim
  authority no longer lets the legacy path start claims (phase ``quiescing`` or ``work_item_active``).
  A generation still ``legacy_active`` or ``rollback_fenced`` is left alone: WorkItems there could
  execute work the legacy path also executes. Ineligible events are counted by reason.
* WorkItems follow the event's own route snapshot (``route_id``: its config and the work types of its
  generation), with the event's generation and delivery sequence; lane keys are re-extracted from the
  receipt body. Inserts conflict-ignore on ``(event_id, work_type)`` and lane members are settled
  under their lane locks, exactly like the routing loop. A second run creates nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

from connector.common.delivery.materialization import (
    EventDraft,
    Failure,
    RouteCompiler,
    materialize,
    plan_receipt,
    work_row,
)
from connector.common.packs.manifest import Manifest, RouteSpec
from connector.common.packs.routes import ActivePack, ActiveRoute
from connector.common.store import events, packs
from connector.common.store.receipts.routing import ReceiptRow
from connector.common.store.work_items.insert import WorkRow

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BackfillReport:
    events: int = 0
    work_items: int = 0
    #: Eligible events for which no WorkItem could be built, by failure class.
    failed: Counter[str] = field(default_factory=Counter)
    #: Events without WorkItems that are not eligible, by reason.
    ineligible: dict[str, int] = field(default_factory=dict)


async def backfill(
    conn: psycopg.AsyncConnection[Any],
    *,
    installed_pack_id: int | None = None,
    generation: int | None = None,
    batch: int = 500,
    dry_run: bool = False,
) -> BackfillReport:
    """Create the missing WorkItems (one transaction per batch of events). Idempotent."""
    report = BackfillReport()
    routes: dict[int, tuple[ActiveRoute, str] | None] = {}
    compiler = RouteCompiler()
    scope = {"pack": installed_pack_id, "generation": generation}
    after = 0
    while True:
        candidates = await events.event_list_backfill_candidates(conn, scope, after=after, limit=batch)
        if not candidates:
            break
        after = int(candidates[-1]["event_id"])
        await _load_routes(conn, {int(e["route_id"]) for e in candidates} - routes.keys(), routes)
        rows: list[WorkRow] = []
        for e in candidates:
            loaded = routes.get(int(e["route_id"]))
            if loaded is None:
                report.failed["route_unavailable"] += 1
                continue
            route, pack_name = loaded
            plan = _plan(e, route, pack_name, compiler)
            if isinstance(plan, Failure):
                report.failed[plan.error_class] += 1
                continue
            report.events += 1
            ids = (
                int(e["event_id"]),
                int(e["installed_pack_id"]),
                int(e["generation"]),
                int(e["delivery_seq"]),
            )
            # The receipt's trace context: the backfilled attempts join the delivery's trace.
            rows.extend(work_row(*ids, w, e["traceparent"], e["accepted_at"]) for w in plan.work)
        if dry_run:
            report.work_items += len(rows)
            continue
        if not rows:
            continue
        rows.sort(key=lambda w: (w.delivery_seq, w.event_id))
        async with conn.transaction():
            report.work_items += (await materialize(conn, (), {}, rows)).work_items
    report.ineligible = await events.event_count_backfill_ineligible(conn, scope)
    return report


async def _load_routes(
    conn: psycopg.AsyncConnection[Any], ids: set[int], out: dict[int, tuple[ActiveRoute, str] | None]
) -> None:
    if not ids:
        return
    for row in await packs.route_get_with_manifest(conn, ids):
        try:
            manifest = Manifest.model_validate(row["manifest"])
            spec = RouteSpec.model_validate(row["config"])
            work_types = {f.work_type: manifest.work_types[f.work_type] for f in spec.fan_out}
        except Exception as exc:
            log.warning(
                "route snapshot unreadable",
                extra={"route_id": row["route_id"], "error_class": type(exc).__name__},
            )
            out[int(row["route_id"])] = None
            continue
        route = ActiveRoute(
            int(row["route_id"]),
            int(row["route_version"]),
            spec.key,
            spec,
            work_types,
            manifest.priority_heads(),
        )
        out[int(row["route_id"])] = (route, str(row["name"]))
    for missing in ids - out.keys():
        out[missing] = None


def _plan(
    e: dict[str, Any], route: ActiveRoute, pack_name: str, compiler: RouteCompiler
) -> EventDraft | Failure:
    receipt = ReceiptRow(
        receipt_id=int(e["receipt_id"]),
        claim_token=0,
        attempts=1,
        namespace=str(e["namespace"]),
        route_key=str(e["route_key"]),
        idempotency_key=str(e["idempotency_key"]),
        event_kind=e["event_kind"],
        provider_delivery_id=e["provider_delivery_id"],
        correlation_ids=e["correlation_ids"] if isinstance(e["correlation_ids"], dict) else {},
        payload_sha256=bytes(e["payload_sha256"]),
        body=bytes(e["body"]) if e["body"] is not None else None,
        has_body_ref=bool(e["has_body_ref"]),
        accepted_at=e["accepted_at"],
    )
    # The event's own snapshot, WorkItem-owned: the WorkItems it would have had.
    pack = ActivePack(
        installed_pack_id=int(e["installed_pack_id"]),
        name=pack_name,
        namespace=str(e["namespace"]),
        incarnation=int(e["incarnation"]),
        generation=int(e["generation"]),
        claim_path="work_item",
        phase="work_item_active",
        routes={route.route_key: route},
    )
    return plan_receipt(receipt, pack, route, compiler.get(route))
