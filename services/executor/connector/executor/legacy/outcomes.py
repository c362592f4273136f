"""Legacy outcome receipts: the projection onto WorkItems (the reconciler) and an operator's
resolution of an ``unknown`` outcome (docs/cutover.md).

* **Projection** (``legacy_outcome_project``) runs right after each legacy finalize, periodically,
  from the admin API and inside the cutover transaction: it moves the matching WorkItem from
  ``awaiting_legacy_outcome`` to ``reconciled_legacy_terminal`` with the receipt's version and digest
  (or inserts that row when the Event had no WorkItem for the work type: the historical mirror),
  marks the receipt projected and resolves rollback fences whose every row is reconciled. A crash
  between the finalize commit and the projection leaves an unprojected receipt, which the next
  projection repairs. A receipt that contradicts its WorkItem stays unprojected (a conflict that
  blocks re-cutover); reconciled rows are never touched again (a trigger refuses it).
* **Resolution** (``legacy_outcome_resolve``) writes the next receipt version of a quarantined work
  type after an operator checked the external effect, then projects it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter
from psycopg import AsyncConnection

from connector.common.core.refusal import Refused
from connector.common.packs.manifest import sha256_hex
from connector.common.store import authority, work_items
from connector.common.store import legacy as legacy_store
from connector.common.store.lanes import lane_lock_batch, lane_settle_batch, lanes_of
from connector.executor.handlers import sanitize_summary
from connector.executor.metrics import REGISTRY

log = logging.getLogger(__name__)

Conn = AsyncConnection[Any]

PROJECTED = Counter(
    "connector_legacy_receipts_projected_total",
    "Legacy outcome receipts projected",
    ["result"],
    registry=REGISTRY,
)


def outcome_digest(event_id: int, work_type: str, outcome: str, failure_class: str | None) -> str:
    """Content digest of a legacy outcome (version-independent: a duplicate delivery has the same)."""
    return sha256_hex(
        {"event_id": event_id, "work_type": work_type, "outcome": outcome, "failure_class": failure_class}
    )


# --------------------------------------------------------------------------------------------------
# Receipt projection (the reconciler)
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ProjectionReport:
    #: Receipts whose outcome moved a WorkItem (reconciled, quarantined or mirrored).
    projected: int = 0
    #: Receipts that changed nothing: a duplicate delivery or a superseded version.
    duplicates: int = 0
    #: Receipts left unprojected because they contradict the WorkItem row (fail closed).
    conflicts: int = 0
    conflict_receipt_ids: list[int] = field(default_factory=list)
    #: Rollback fences resolved (every fenced row reconciled with a receipt).
    fences_resolved: list[int] = field(default_factory=list)

    def add(self, other: ProjectionReport) -> None:
        self.projected += other.projected
        self.duplicates += other.duplicates
        self.conflicts += other.conflicts
        self.conflict_receipt_ids.extend(other.conflict_receipt_ids)
        self.fences_resolved.extend(other.fences_resolved)


async def legacy_outcome_project(
    conn: Conn,
    *,
    installed_pack_id: int | None = None,
    generation: int | None = None,
    event_ids: Sequence[int] | None = None,
    batch: int = 200,
) -> ProjectionReport:
    """Project unprojected legacy outcome receipts onto WorkItems (one transaction per batch; nests as
    a savepoint inside a caller's transaction). Idempotent and safe under concurrent projectors."""
    report = ProjectionReport()
    scopes: set[tuple[int, int]] = set()
    if installed_pack_id is not None and generation is not None:
        scopes.add((installed_pack_id, generation))
    after = 0
    while True:
        async with conn.transaction():
            receipts = await legacy_store.legacy_outcome_receipt_unprojected(
                conn,
                {
                    "after": after,
                    "pack": installed_pack_id,
                    "generation": generation,
                    "events": list(event_ids) if event_ids is not None else None,
                    "limit": batch,
                },
            )
            if not receipts:
                break
            after = int(receipts[-1]["legacy_outcome_receipt_id"])
            part = await _project_batch(conn, receipts)
            report.add(part)
            scopes.update((int(r["installed_pack_id"]), int(r["generation"])) for r in receipts)
        if len(receipts) < batch:
            break
    # Fences are resolved after the batches committed: a concurrent projector's rows are then visible
    # to whichever of the two commits last (resolving inside each batch transaction could leave a
    # fence open when two projectors finish its last rows at the same time).
    for pack, gen in sorted(scopes):
        report.fences_resolved.extend(await authority.rollback_fence_resolve(conn, pack, gen))
    return report


async def _project_batch(conn: Conn, receipts: list[dict[str, Any]]) -> ProjectionReport:
    report = ProjectionReport()
    # Lanes of the rows about to change: locked first, settled last (ADR 003).
    lanes: set[tuple[int, str, str]] = set()
    for r in receipts:
        row = await work_items.legacy.work_item_legacy_projection_get(conn, r)
        if row is not None and row["state"] == "awaiting_legacy_outcome":
            lanes.update(
                lanes_of(
                    int(row["installed_pack_id"]), row["source_lane_key"], row["target_mutation_lane_key"]
                )
            )
    locked = await lane_lock_batch(conn, lanes) if lanes else []
    done: list[int] = []
    for r in receipts:
        result = await _project_one(conn, r)
        PROJECTED.labels(result).inc()
        if result == "conflict":
            report.conflicts += 1
            report.conflict_receipt_ids.append(int(r["legacy_outcome_receipt_id"]))
            log.error(
                "legacy outcome receipt contradicts its WorkItem; left unprojected (blocks re-cutover)",
                extra={"receipt_id": r["legacy_outcome_receipt_id"], "event_id": r["event_id"]},
            )
            continue
        done.append(int(r["legacy_outcome_receipt_id"]))
        if result == "duplicate":
            report.duplicates += 1
        else:
            report.projected += 1
    if done:
        await legacy_store.legacy_outcome_receipt_mark_projected(conn, done)
    if locked:
        settled = await lane_settle_batch(conn, locked)
        if settled.promoted:
            await work_items.finalize.work_notify(conn, "legacy")
    return report


async def _project_one(conn: Conn, r: dict[str, Any], *, again: bool = False) -> str:
    """``projected`` | ``duplicate`` | ``conflict`` for one receipt (rows locked by the caller's
    transaction)."""
    w = await work_items.legacy.work_item_legacy_projection_lock(conn, r)
    outcome = str(r["outcome"])
    final = outcome in ("succeeded", "failed")
    values = {
        "event_id": r["event_id"],
        "work_type": r["work_type"],
        "version": r["version"],
        "digest": r["digest"],
        "at": r["created_at"],
        "outcome": outcome if final else None,
        "failure_class": r["failure_class"] if outcome != "succeeded" else None,
        "failure_summary": r["failure_summary"] if outcome != "succeeded" else None,
    }
    if not final:
        values["failure_class"] = r["failure_class"] or "legacy_outcome_unknown"
    if w is None:
        values["state"] = "reconciled_legacy_terminal" if final else "awaiting_legacy_outcome"
        inserted = await work_items.legacy.work_item_legacy_mirror_insert(conn, values)
        if inserted:
            return "projected"
        # Another projector inserted the row meanwhile (the insert waited for its commit): decide
        # against that row, as if it had been there (the same outcome is a duplicate, not a conflict).
        return "conflict" if again else await _project_one(conn, r, again=True)
    seen_version = w["legacy_outcome_receipt_version"]
    if w["state"] == "awaiting_legacy_outcome":
        if seen_version is not None and int(seen_version) >= int(r["version"]):
            return "duplicate"  # an older version projected after a newer one: superseded
        values["work_id"] = w["work_id"]
        if final:
            await work_items.legacy.work_item_legacy_reconcile(conn, values)
        else:
            await work_items.legacy.work_item_legacy_quarantine(conn, values)
        return "projected"
    if w["state"] == "reconciled_legacy_terminal":
        if w["legacy_outcome_digest"] == r["digest"] or (
            seen_version is not None and int(seen_version) > int(r["version"])
        ):
            return "duplicate"  # the same outcome delivered again, or superseded: nothing to change
        return "conflict"
    # The WorkItem path owns this row (pending, processing, succeeded, dead, ...): a legacy outcome for
    # it means ambiguous ownership. Never overwrite; fail closed.
    return "conflict"


# --------------------------------------------------------------------------------------------------
# Operator resolution of an unknown outcome
# --------------------------------------------------------------------------------------------------


class LegacyOutcomeError(Refused):
    """A refused resolution. ``reason``: ``not_found``, ``not_legacy_owned``, ``in_flight``,
    ``not_unknown``, ``invalid``."""


@dataclass(frozen=True, slots=True)
class Resolution:
    event_id: int
    work_type: str
    version: int
    outcome: str
    digest: str
    event_legacy_state: str
    projection: ProjectionReport


async def legacy_outcome_resolve(
    conn: Conn,
    *,
    event_id: int,
    work_type: str,
    outcome: str,
    reason: str,
    actor: str,
) -> Resolution:
    """Confirm the outcome of a quarantined (``unknown``) legacy work type after checking the external
    system: writes the next receipt version (``succeeded`` or ``failed``) and the Event's new state in
    one transaction, then projects it. Refused unless the latest receipt is ``unknown``."""
    if outcome not in ("succeeded", "failed"):
        raise LegacyOutcomeError("invalid", "outcome must be succeeded or failed")
    summary = sanitize_summary(reason) or None
    if summary is None:
        raise LegacyOutcomeError("invalid", "a reason is required (what was checked, by whom)")
    async with conn.transaction():
        ev = await legacy_store.event_legacy_get_for_update(conn, event_id)
        if ev is None:
            raise LegacyOutcomeError("not_found", f"event {event_id} not found")
        if ev["execution_owner"] != "legacy_event":
            raise LegacyOutcomeError("not_legacy_owned", f"event {event_id} is owned by the WorkItem path")
        if ev["legacy_state"] == "processing":
            raise LegacyOutcomeError("in_flight", f"event {event_id} is being executed on the legacy path")
        latest = await legacy_store.legacy_outcome_receipt_latest(conn, event_id, work_type)
        if latest is None or latest["outcome"] != "unknown":
            have = (
                "no receipt"
                if latest is None
                else f"latest receipt v{latest['version']} is {latest['outcome']}"
            )
            raise LegacyOutcomeError(
                "not_unknown",
                f"event {event_id} work type {work_type!r}: {have}; only unknown outcomes resolve",
            )
        failure_class = None if outcome == "succeeded" else "operator_confirmed_failed"
        digest = outcome_digest(event_id, work_type, outcome, failure_class)
        version = int(latest["version"]) + 1
        await legacy_store.legacy_outcome_receipt_insert(
            conn,
            {
                "pack": ev["installed_pack_id"],
                "generation": ev["generation"],
                "event_id": event_id,
                "work_type": work_type,
                "version": version,
                "outcome": outcome,
                "failure_class": failure_class,
                "failure_summary": summary,
                "actor": actor,
                "digest": digest,
            },
        )
        latest_outcomes = await legacy_store.event_legacy_latest_outcomes(conn, event_id)
        new_state = _event_state_from_latest(latest_outcomes, str(ev["legacy_state"]))
        await legacy_store.event_legacy_set_state(conn, event_id, new_state)
        projection = await legacy_outcome_project(conn, event_ids=[event_id])
    log.info(
        "legacy outcome resolved by an operator",
        extra={"event_id": event_id, "work_type": work_type, "outcome": outcome, "actor": actor},
    )
    return Resolution(event_id, work_type, version, outcome, digest, new_state, projection)


def _event_state_from_latest(rows: Sequence[dict[str, Any]], current: str) -> str:
    if current in ("pending", "retry"):
        return current  # still has work to run; the resolved work type is skipped from now on
    legacy = [
        r for r in rows if r["work_state"] in (None, "awaiting_legacy_outcome", "reconciled_legacy_terminal")
    ]
    outcomes = [r["outcome"] for r in legacy]
    if any(o is None for o in outcomes):
        return "retry"
    if "unknown" in outcomes:
        return "unknown"
    if "failed" in outcomes:
        return "failed"
    return "succeeded"
