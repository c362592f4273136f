"""``connector materializer backfill``: WorkItems for eligible non-terminal events that have none.

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

import argparse
import asyncio
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from connector.common import logs, settings
from connector.common.lanes import lane_lock_batch, lane_settle_batch
from connector.common.pack_store import ActivePack, ActiveRoute
from connector.common.packs import Manifest, RouteSpec
from connector.materializer import routing
from connector.materializer.extract import EventDraft, Failure, ReceiptRow, RouteCompiler, plan_receipt

log = logging.getLogger(__name__)

_ELIGIBLE = """
  a.phase IN ('quiescing', 'work_item_active')
  AND (e.legacy_state IS NULL OR e.legacy_state IN ('pending', 'retry'))
  AND NOT EXISTS (SELECT 1 FROM connector_work_item w
                  WHERE w.event_id = e.event_id AND w.state <> 'reconciled_legacy_terminal')
"""
_SCOPE = """
  (%(pack)s::bigint IS NULL OR e.installed_pack_id = %(pack)s)
  AND (%(generation)s::int IS NULL OR e.generation = %(generation)s)
"""

EVENT_LIST_BACKFILL_CANDIDATES = f"""
SELECT e.event_id, e.receipt_id, e.installed_pack_id, e.generation, e.incarnation, e.route_id,
       e.delivery_seq, e.namespace, r.route_key, r.idempotency_key, r.event_kind, r.provider_delivery_id,
       r.correlation_ids, r.payload_sha256, r.body, r.body_ref IS NOT NULL AS has_body_ref
FROM connector_event e
JOIN connector_claim_authority a ON a.installed_pack_id = e.installed_pack_id AND a.generation = e.generation
JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
WHERE e.event_id > %(after)s AND {_SCOPE} AND {_ELIGIBLE}
ORDER BY e.event_id
LIMIT %(limit)s
"""

# Events without WorkItems that backfill leaves alone, by reason (operator report).
EVENT_COUNT_BACKFILL_INELIGIBLE = f"""
SELECT CASE
         WHEN a.phase IS NULL THEN 'no_claim_authority'
         WHEN a.phase NOT IN ('quiescing', 'work_item_active') THEN 'generation_' || a.phase
         WHEN e.legacy_state = 'processing' THEN 'legacy_in_flight'
         WHEN e.legacy_state = 'unknown' THEN 'legacy_outcome_unknown'
         ELSE 'legacy_terminal'
       END AS reason,
       count(*)
FROM connector_event e
LEFT JOIN connector_claim_authority a
  ON a.installed_pack_id = e.installed_pack_id AND a.generation = e.generation
WHERE {_SCOPE}
  AND NOT EXISTS (SELECT 1 FROM connector_work_item w
                  WHERE w.event_id = e.event_id AND w.state <> 'reconciled_legacy_terminal')
  AND NOT (coalesce(a.phase IN ('quiescing', 'work_item_active'), false)
           AND (e.legacy_state IS NULL OR e.legacy_state IN ('pending', 'retry')))
GROUP BY 1 ORDER BY 1
"""

ROUTE_GET_WITH_MANIFEST = """
SELECT r.route_id, r.route_version, r.route_key, r.config, g.manifest, p.name
FROM connector_route r
JOIN connector_pack_generation g USING (installed_pack_id, generation)
JOIN connector_installed_pack p USING (installed_pack_id)
WHERE r.route_id = ANY(%(ids)s::bigint[])
"""


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
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(EVENT_LIST_BACKFILL_CANDIDATES, {**scope, "after": after, "limit": batch})
        events = await cur.fetchall()
        if not events:
            break
        after = int(events[-1]["event_id"])
        await _load_routes(conn, {int(e["route_id"]) for e in events} - routes.keys(), routes)
        rows: list[routing.WorkRow] = []
        for e in events:
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
            rows.extend(
                routing.WorkRow(
                    event_id=int(e["event_id"]),
                    installed_pack_id=int(e["installed_pack_id"]),
                    generation=int(e["generation"]),
                    work_type=w.work_type,
                    queue_class=w.queue_class,
                    priority=w.priority,
                    max_attempts=w.max_attempts,
                    delivery_seq=int(e["delivery_seq"]),
                    source_lane_key=w.source_lane_key,
                    target_lane_key=w.target_lane_key,
                    dead_blocks_lane=w.dead_blocks_lane,
                )
                for w in plan.work
            )
        if dry_run:
            report.work_items += len(rows)
            continue
        if not rows:
            continue
        rows.sort(key=lambda w: (w.delivery_seq, w.event_id))
        async with conn.transaction():
            lanes = sorted({lane for w in rows for lane in w.lanes})
            locked = await lane_lock_batch(conn, lanes) if lanes else []
            demote, _ = await routing.work_item_lane_overtaken(conn, rows) if lanes else (0, 0)
            report.work_items += await routing.work_item_insert_batch(conn, rows)
            if locked:
                await lane_settle_batch(conn, locked, demote=demote > 0)
            await routing.work_notify(conn)
    cur = await conn.execute(EVENT_COUNT_BACKFILL_INELIGIBLE, scope)
    report.ineligible = {str(reason): int(n) for reason, n in await cur.fetchall()}
    return report


async def _load_routes(
    conn: psycopg.AsyncConnection[Any], ids: set[int], out: dict[int, tuple[ActiveRoute, str] | None]
) -> None:
    if not ids:
        return
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(ROUTE_GET_WITH_MANIFEST, {"ids": sorted(ids)})
    for row in await cur.fetchall():
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
        route = ActiveRoute(int(row["route_id"]), int(row["route_version"]), spec.key, spec, work_types)
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


# -------------------------------------------------------------------------------------------------
# CLI
# -------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pack-id", type=int, default=None, help="only this installed pack id")
    parser.add_argument("--generation", type=int, default=None, help="only this generation")
    parser.add_argument("--batch", type=int, default=500, help="events per transaction (default 500)")
    parser.add_argument("--dry-run", action="store_true", help="count what would be created; create nothing")


def cli(args: argparse.Namespace) -> int:
    logs.setup("materializer")
    db = settings.load(settings.DatabaseSettings)

    async def main() -> BackfillReport:
        async with await psycopg.AsyncConnection.connect(db.url(), autocommit=True) as conn:
            return await backfill(
                conn,
                installed_pack_id=args.pack_id,
                generation=args.generation,
                batch=max(1, args.batch),
                dry_run=args.dry_run,
            )

    try:
        report = asyncio.run(main())
    except psycopg.OperationalError as exc:
        print(f"database unavailable ({type(exc).__name__})", file=sys.stderr)
        return 1
    verb = "would create" if args.dry_run else "created"
    print(f"backfill: {verb} {report.work_items} work items for {report.events} events")
    for cls, n in sorted(report.failed.items()):
        print(f"  not backfilled ({cls}): {n} events")
    for reason, n in report.ineligible.items():
        print(f"  ineligible ({reason}): {n} events without work items")
    return 0 if not report.failed else 3
