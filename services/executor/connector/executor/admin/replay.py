"""Replay: an explicit new attempt of a dead WorkItem against the pack's *current* active generation.

Checked before anything changes (fail closed; each refusal has a reason, see ``errors.Reason``):

* idempotency — the item is ``dead`` or ``cancelled`` (a cancel is undone by a replay; not
  succeeded, pending, processing, ...), never
  ``reconciled_legacy_terminal`` (immutable, executed under legacy ownership) nor
  ``awaiting_legacy_outcome`` (rollback-fenced); its event is owned by the WorkItem path;
* generation — the pack has an active generation, of the same incarnation as the event, whose claim
  authority is WorkItem-owned (claim path ``work_item``, phase ``work_item_active``, cutover receipt
  bound);
* route — the receipt's route key exists in the active generation and the work type is still in
  that route's fan-out;
* required data — the receipt body is still there (``body`` or ``body_ref``);
* companion snapshot — every field the *current* route requires is in the event's companion
  snapshot (``COMPANION_INCOMPLETE``: the event was materialized under a weaker contract; the handler
  would get a companion without it);
* idempotency contract — the current route's identity template applied to the event's stored facts
  yields the event's replay identity (``IDENTITY_CHANGED``): a route that names a provider delivery
  id (``idempotency_header`` or ``extract.delivery_id``) gives ``<route>:id:<delivery id>``, where a
  body-pointer ``delivery_id`` (no header) is re-derived from the stored body and must equal the
  receipt's; a route without one gives ``<route>:sha256:<payload digest>``; the event's key is that
  plus ``#<index>``. A replay under another identity would carry an idempotency key the handler's
  target has never seen for this delivery (duplicate effects) or one of another delivery.

Refusal details name fields and routes, never values (delivery ids, keys, payload).

The transition (``store.work_items.admin.work_item_replay_batch``), in one transaction, lane locks first
(ADR 003): ``lane_lock_batch`` → fenced
``UPDATE`` (``state = 'dead' AND replay_count = <seen>``: a concurrent replay or transition makes it
match zero rows, answered ABORTED) → ``lane_settle_batch`` → ``pg_notify('connector_work')``. The
item moves to the active generation with ``attempts = 0``, ``run_after = now()``,
``replay_count + 1``; queue class, priority, max attempts and dead-head policy come from the active
route's work type. Lane members go ``blocked`` and the settle promotes them when they are runnable
(their lane keys are event facts and are kept). ``outcome``, ``finished_at`` and the lease fields are
cleared; ``failure_class`` / ``failure_summary`` are kept as the *last failure* until the next
outcome overwrites them (docs/admin.md). The event and receipt are never touched.

The pack row is read ``FOR SHARE`` (``store.packs.pack_active_get_for_share``) so an activation
cannot commit between the checks and the update.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError

from connector.common.packs.extraction import Context, compile_value
from connector.common.packs.manifest import Manifest, RouteSpec, canonical_json
from connector.common.store import packs, receipts, work_items
from connector.common.store.lanes import Lane, lanes_of
from connector.common.store.work_items.admin import DeadLetterFilter, Replayable
from connector.executor.admin.errors import (
    REFUSAL_MESSAGES,
    Reason,
    aborted,
    failed_precondition,
    not_found,
)
from connector.executor.admin.session import connection

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------
# Planning (checks) and the transition
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: Reason
    detail: str

    def message(self) -> str:
        base = REFUSAL_MESSAGES.get(self.reason, self.reason.value)
        return f"{base}: {self.detail}" if self.detail else base


@dataclass(slots=True)
class ReplayPlan:
    eligible: list[Replayable] = field(default_factory=list)
    refused: dict[int, Refusal] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)


@lru_cache(maxsize=64)
def _manifest(sha: str, text: str) -> Manifest | None:
    try:
        return Manifest.model_validate_json(text)
    except ValidationError:
        return None


def _manifest_of(row: dict[str, Any]) -> Manifest | None:
    raw = row.get("manifest")
    if raw is None:
        return None
    text = raw if isinstance(raw, str) else canonical_json(raw)
    return _manifest(str(row.get("manifest_sha256") or ""), text)


def _body_delivery_id(route: RouteSpec) -> Any:
    """The route's ``extract.delivery_id`` when replay can re-derive it from the stored receipt (a
    body pointer or a constant, and no ``idempotency_header`` that would have won at ingress)."""
    spec = route.extract.get("delivery_id")
    if route.idempotency_header is None and spec is not None and (spec.pointer or spec.const) is not None:
        return spec
    return None


def _companion_refusal(item: dict[str, Any], route: RouteSpec) -> Refusal | None:
    companion = item.get("companion") or {}
    if isinstance(companion, str):
        companion = json.loads(companion)
    missing = [f for f in route.required if companion.get(f) is None]
    if missing:
        return Refusal(
            Reason.COMPANION_INCOMPLETE,
            f"route {route.key!r} now requires {missing}, absent from event snapshot of work item"
            f" {item['work_id']}",
        )
    return None


def _identity_refusal(item: dict[str, Any], route: RouteSpec, body: bytes | None) -> Refusal | None:
    key = str(item.get("idempotency_key") or "")
    base, sep, index = key.rpartition("#")
    delivery_id = item.get("provider_delivery_id")
    where = f"route {route.key!r}, work item {item['work_id']}"
    if route.idempotency_header is not None or "delivery_id" in route.extract:
        spec = _body_delivery_id(route)
        if spec is not None:
            try:
                doc = json.loads(body) if body is not None else None
            except (ValueError, UnicodeDecodeError):
                doc = None
            derived = compile_value(spec)(Context(doc))
            if derived != delivery_id:
                got = "no delivery id" if derived is None else "another delivery id"
                return Refusal(
                    Reason.IDENTITY_CHANGED,
                    f"{where}: extract.delivery_id yields {got} for the stored receipt",
                )
        if delivery_id is None:
            return Refusal(
                Reason.IDENTITY_CHANGED,
                f"{where}: the route identifies deliveries by a provider delivery id; the receipt has"
                " none (it was identified by its body digest)",
            )
        expected = f"{route.key}:id:{delivery_id}"
    else:
        digest = item.get("payload_sha256")
        expected = f"{route.key}:sha256:{bytes(digest).hex()}" if digest is not None else ""
    if not sep or not index.isdigit() or base != expected:
        return Refusal(Reason.IDENTITY_CHANGED, f"{where}: the event's key is not the template's")
    return None


def _check(
    item: dict[str, Any], pack: dict[str, Any] | None, bodies: dict[int, bytes | None] | None = None
) -> Refusal | Replayable:
    state = item["state"]
    if state == "reconciled_legacy_terminal":
        return Refusal(Reason.LEGACY_RECONCILED, "")
    if state == "awaiting_legacy_outcome":
        return Refusal(Reason.LEGACY_OUTCOME_PENDING, "")
    if state not in ("dead", "cancelled"):
        return Refusal(Reason.NOT_DEAD, f"state is {state}")
    if item["execution_owner"] != "work_item":
        return Refusal(Reason.LEGACY_OWNED, "")
    pack_id = item["installed_pack_id"]
    if pack is None or pack["active_generation"] is None or pack["manifest"] is None:
        return Refusal(Reason.NO_ACTIVE_GENERATION, f"pack {pack_id}")
    generation = int(pack["active_generation"])
    if pack["incarnation"] != item["incarnation"]:
        return Refusal(
            Reason.INCARNATION_CHANGED,
            f"event incarnation {item['incarnation']}, pack incarnation {pack['incarnation']}",
        )
    if not (
        pack["claim_path"] == "work_item"
        and pack["phase"] == "work_item_active"
        and pack["cutover_receipt_id"] is not None
    ):
        return Refusal(
            Reason.GENERATION_NOT_WORK_ITEM_OWNED,
            f"pack {pack_id} generation {generation}: claim path {pack['claim_path'] or 'unset'}, "
            f"phase {pack['phase'] or 'unset'}",
        )
    route_key = item["route_key"]
    manifest = _manifest_of(pack)
    route = manifest.route(route_key) if manifest is not None else None
    if route_key not in (pack["route_keys"] or ()) or route is None:
        return Refusal(Reason.ROUTE_GONE, f"route {route_key!r} in pack {pack_id} generation {generation}")
    assert manifest is not None
    work_type = item["work_type"]
    fan = next((f for f in route.fan_out if f.work_type == work_type), None)
    spec = manifest.work_types.get(work_type)
    if fan is None or spec is None:
        return Refusal(
            Reason.WORK_TYPE_GONE, f"work type {work_type!r} of route {route_key!r}, generation {generation}"
        )
    if not item["has_body"]:
        return Refusal(Reason.PAYLOAD_MISSING, f"receipt of work item {item['work_id']}")
    refusal = _companion_refusal(item, route) or _identity_refusal(
        item, route, (bodies or {}).get(int(item["work_id"]))
    )
    if refusal is not None:
        return refusal
    lanes = fan.lanes or spec.lanes
    return Replayable(
        work_id=int(item["work_id"]),
        seen_replay_count=int(item["replay_count"]),
        installed_pack_id=int(pack_id),
        generation=generation,
        queue_class=spec.queue_class,
        priority=spec.priority,
        priority_head_s=manifest.priority_heads().get(work_type, 0.0),
        max_attempts=spec.retry.max_attempts,
        dead_blocks_lane=lanes.dead_head == "block",
        lanes=tuple(lanes_of(int(pack_id), item["source_lane_key"], item["target_mutation_lane_key"])),
        seen_state=state,
    )


def _needing_body(items: dict[int, dict[str, Any]], pack_rows: dict[int, dict[str, Any]]) -> list[int]:
    """The candidates whose current route re-derives the delivery id from the body."""
    out = []
    for work_id, item in items.items():
        pack = pack_rows.get(int(item["installed_pack_id"]))
        manifest = _manifest_of(pack) if pack is not None else None
        route = manifest.route(item["route_key"]) if manifest is not None else None
        if route is not None and _body_delivery_id(route) is not None:
            out.append(work_id)
    return sorted(out)


async def work_item_replay_plan(
    conn: AsyncConnection[Any], ids: Sequence[int], *, for_update: bool
) -> ReplayPlan:
    """Check every item; with ``for_update`` (inside the mutation's transaction) the packs involved
    are share-locked so their active generation cannot change before commit."""
    plan = ReplayPlan()
    if not ids:
        return plan
    items = await work_items.admin.work_item_replay_candidates(conn, ids)
    packs_needed = sorted({int(r["installed_pack_id"]) for r in items.values()})
    active = packs.pack_active_get_for_share if for_update else packs.pack_active_get
    pack_rows = await active(conn, packs_needed)
    bodies = await work_items.admin.work_item_replay_bodies(conn, _needing_body(items, pack_rows))
    for work_id in ids:
        item = items.get(work_id)
        if item is None:
            plan.missing.append(work_id)
            continue
        result = _check(item, pack_rows.get(int(item["installed_pack_id"])), bodies)
        if isinstance(result, Refusal):
            plan.refused[work_id] = result
        else:
            plan.eligible.append(result)
    return plan


async def work_item_replay(
    conn: AsyncConnection[Any], work_id: int, *, actor: str, dry_run: bool = False
) -> dict[str, Any]:
    """Replay one item inside the caller's transaction; raises NOT_FOUND / FAILED_PRECONDITION /
    ABORTED. Returns the item's row after the transition (``dry_run``: the same checks and
    refusals, nothing changed, the row as it is)."""
    plan = await work_item_replay_plan(conn, [work_id], for_update=not dry_run)
    if plan.missing:
        raise not_found(Reason.WORK_ITEM_NOT_FOUND, f"work item {work_id} not found")
    refusal = plan.refused.get(work_id)
    if refusal is not None:
        raise failed_precondition(refusal.reason, refusal.message(), work_id=str(work_id))
    if dry_run:
        return (await work_items.admin.work_item_get_many(conn, [work_id]))[work_id]
    replayed = await work_items.admin.work_item_replay_batch(conn, plan.eligible)
    if work_id not in replayed:
        raise aborted(f"work item {work_id} changed concurrently; read it again", work_id=str(work_id))
    log.info(
        "work item replayed",
        extra={"work_id": work_id, "generation": plan.eligible[0].generation, "actor": actor},
    )
    return (await work_items.admin.work_item_get_many(conn, [work_id]))[work_id]


# ------------------------------------------------------------------------------------------------
# Bulk replay by filter
# ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class BulkProgress:
    total: int
    replayed: int = 0
    #: Bulk cancel (``bulk_cancel``): items cancelled.
    cancelled: int = 0
    eligible: int = 0
    refused_by_reason: Counter[str] = field(default_factory=Counter)
    done: bool = False
    #: Dry run: the lanes of the eligible items (pack, kind, key).
    lanes: set[Lane] = field(default_factory=set)

    @property
    def refused(self) -> int:
        return sum(self.refused_by_reason.values())


async def bulk_replay(
    pool: AsyncConnectionPool,
    flt: DeadLetterFilter,
    *,
    dry_run: bool,
    rate_per_s: float,
    batch_size: int,
    actor: str,
) -> AsyncIterator[BulkProgress]:
    """Replay the dead letters matching ``flt`` when the call started, in batches of their own
    transactions, at most ``rate_per_s`` items per second; yields progress after every batch.
    Cancelling the consumer stops between (or rolls back the current) batch: committed batches stay
    replayed, the rest stay dead. A dry run checks every item and changes nothing."""
    async with connection(pool) as conn:
        ids = await work_items.admin.work_item_list_dead_ids(conn, flt)
    progress = BulkProgress(total=len(ids))
    started = time.monotonic()
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        async with connection(pool) as conn:
            if dry_run:
                plan = await work_item_replay_plan(conn, chunk, for_update=False)
                progress.eligible += len(plan.eligible)
                for item in plan.eligible:
                    progress.lanes.update(item.lanes)
            else:
                async with conn.transaction():
                    plan = await work_item_replay_plan(conn, chunk, for_update=True)
                    replayed = await work_items.admin.work_item_replay_batch(conn, plan.eligible)
                progress.replayed += len(replayed)
                lost = len(plan.eligible) - len(replayed)
                if lost:
                    progress.refused_by_reason[Reason.CONCURRENT_CHANGE.value] += lost
        for refusal in plan.refused.values():
            progress.refused_by_reason[refusal.reason.value] += 1
        if plan.missing:  # deleted since the listing (retention): nothing to replay
            progress.refused_by_reason[Reason.WORK_ITEM_NOT_FOUND.value] += len(plan.missing)
        if start + batch_size < len(ids):
            yield progress
            if not dry_run:
                # Pace: the next batch may start once the items so far fit the rate.
                ahead = (start + len(chunk)) / rate_per_s - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    progress.done = True
    if not dry_run:
        log.info(
            "bulk replay finished",
            extra={
                "installed_pack_id": flt.installed_pack_id,
                "total": progress.total,
                "replayed": progress.replayed,
                "refused": progress.refused,
                "actor": actor,
            },
        )
    yield progress


async def bulk_cancel(
    pool: AsyncConnectionPool,
    flt: DeadLetterFilter,
    *,
    reason: str,
    dry_run: bool,
    rate_per_s: float,
    batch_size: int,
    actor: str,
    request_id: str,
) -> AsyncIterator[BulkProgress]:
    """Cancel the dead letters matching ``flt`` when the call started, in lane order, as
    ``actions.work_item_cancel`` cancels one (fenced, each item in its own transaction, one audit
    line after its commit), at most ``rate_per_s`` items per second; yields progress after every batch
    of ``batch_size``. An item that changed meanwhile (replayed, claimed, deleted) is refused and
    counted by reason. Cancelling the consumer stops between items: what was cancelled stays
    cancelled, the rest stays dead. A dry run checks every item and changes nothing."""
    from connector.common.core.grpc_server import ServiceError
    from connector.executor.admin import actions

    async with connection(pool) as conn:
        ids = await work_items.admin.work_item_list_dead_ids(conn, flt)
    progress = BulkProgress(total=len(ids))
    started = time.monotonic()
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        done: list[actions.Cancelled] = []
        async with connection(pool) as conn:
            for work_id in chunk:
                try:
                    async with conn.transaction():
                        c = await actions.work_item_cancel(
                            conn, work_id, actor=actor, reason=reason, dry_run=dry_run
                        )
                except ServiceError as exc:
                    progress.refused_by_reason[str(exc.reason)] += 1
                    continue
                if dry_run:
                    progress.eligible += 1
                    row = c.row
                    progress.lanes.update(
                        lanes_of(
                            int(row["w_installed_pack_id"]),
                            row["w_source_lane_key"],
                            row["w_target_mutation_lane_key"],
                        )
                    )
                else:
                    progress.cancelled += 1
                    done.append(c)
        for c in done:  # committed: one audit line each, as CancelWorkItem writes
            actions.log_cancelled(c, actor=actor, reason=reason, request_id=request_id)
        if start + batch_size < len(ids):
            yield progress
            if not dry_run:
                ahead = (start + len(chunk)) / rate_per_s - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    progress.done = True
    if not dry_run:
        log.info(
            "bulk cancel finished",
            extra={
                "installed_pack_id": flt.installed_pack_id,
                "total": progress.total,
                "cancelled": progress.cancelled,
                "refused": progress.refused,
                "actor": actor,
            },
        )
    yield progress


# ------------------------------------------------------------------------------------------------
# Receipts
# ------------------------------------------------------------------------------------------------


async def receipt_replay(conn: AsyncConnection[Any], receipt_id: int, *, actor: str) -> dict[str, Any]:
    """Hand a failed receipt back to the materializer (caller's transaction). The materializer
    routes it again against the active generation; checks here fail closed first."""
    row = await receipts.admin.receipt_replay_check(conn, receipt_id)
    if row is None:
        raise not_found(Reason.RECEIPT_NOT_FOUND, f"receipt {receipt_id} not found")
    md = {"receipt_id": str(receipt_id)}
    if row["router_status"] != "failed":
        status = row["router_status"]
        raise failed_precondition(
            Reason.NOT_FAILED, f"only failed receipts can be replayed (status {status})", **md
        )
    if row["has_events"]:
        raise failed_precondition(
            Reason.ALREADY_MATERIALIZED, "the receipt already materialized events", **md
        )
    if row["installed_pack_id"] is None or row["active_generation"] is None:
        namespace = row["namespace"]
        raise failed_precondition(
            Reason.NO_ACTIVE_GENERATION, f"no active pack generation for namespace {namespace!r}", **md
        )
    if not row["route_exists"]:
        raise failed_precondition(
            Reason.ROUTE_GONE,
            f"route {row['route_key']!r} is not in the active generation {row['active_generation']} "
            f"of namespace {row['namespace']!r}",
            **md,
        )
    if not row["has_body"]:
        raise failed_precondition(Reason.PAYLOAD_MISSING, "the receipt body is gone", **md)
    updated = await receipts.admin.receipt_replay(conn, receipt_id)
    if updated is None:  # pragma: no cover - the row is locked FOR UPDATE above
        raise aborted(f"receipt {receipt_id} changed concurrently")
    await receipts.admin.receipt_notify(conn)
    log.info("receipt replayed", extra={"receipt_id": receipt_id, "actor": actor})
    return updated
