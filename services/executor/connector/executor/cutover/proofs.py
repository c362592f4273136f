"""The gates' proofs, each read inside the transition's locked transaction: what it found (recorded
in the receipt) and, appended to ``blockers``, every gap that refuses the transition (fail closed).

* gate 2 — ``legacy_drain_proof``: zero legacy Event leases (active, expired with a live holder, or
  orphaned), a free scheduler lease, zero fresh legacy-capable processes, zero WorkItems in flight;
* gate 5 — ``reconciliation_proof``: every legacy outcome receipt projected without conflict, zero
  ``awaiting_legacy_outcome`` rows and ``unknown`` outcomes, every rollback fence resolved;
* gate 3 — ``materialization_proof``: the backfill (in this transaction) left no (event, work type)
  pair of the generation without its WorkItem row;
* gate 4 — ``work_item_idle_proof``: zero WorkItems processing, zero unfinished ones with a started
  attempt or an Event of another generation, zero live WorkItem executors whose claim admission names
  a receipt of the generation (``work_item_claimers``, from the process registry); the fence plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connector.common.delivery.backfill import BackfillReport, backfill
from connector.common.store import authority as store
from connector.common.store import legacy as legacy_store
from connector.common.store import processes, work_items
from connector.executor.cutover.authority import SAMPLE, Blocker, Conn, Locked
from connector.executor.legacy.outcomes import ProjectionReport, legacy_outcome_project
from connector.executor.legacy.service import service_scope


@dataclass(slots=True)
class LegacyDrainProof:
    drain: dict[str, Any]
    lease: dict[str, Any] | None
    legacy_processes: list[dict[str, Any]]
    open_counts: dict[str, dict[str, Any]]


async def legacy_drain_proof(
    conn: Conn, locked: Locked, process_stale_s: float, blockers: list[Blocker]
) -> LegacyDrainProof:
    """Gate 2: zero Event claim tokens/leases, processing rows, old claimers, transactions."""
    p = locked.params
    drain = await legacy_store.event_legacy_drain(conn, {**p, "stale_s": process_stale_s})
    if drain["leases_active"] or drain["expired_holder_alive"]:
        blockers.append(
            Blocker(
                "legacy_lease_active",
                int(drain["leases_active"]) + int(drain["expired_holder_alive"]),
                "Events are still processing under a legacy lease (events "
                f"{list(drain['event_ids'])[:SAMPLE]}): wait for the legacy executor to finish them"
                " (it exits by itself when drained)",
            )
        )
    if drain["orphaned"]:
        blockers.append(
            Blocker(
                "legacy_lease_orphaned",
                int(drain["orphaned"]),
                "Events hold an expired legacy lease whose holder is gone (outcome unknown to the"
                " runtime): abort (`connector admin cutover abort`) so a legacy executor reclaims and"
                " finishes them, then quiesce again",
            )
        )
    lease = await store.scheduler_lease_get(conn, p)
    if lease is not None and lease["active"]:
        blockers.append(
            Blocker(
                "scheduler_lease_active",
                1,
                "the legacy scheduler lease is held (a legacy executor still claims): stop it",
            )
        )
    legacy_procs = await processes.process_list_legacy_fresh(
        conn, stale_s=process_stale_s, scope=service_scope(locked.pack, locked.generation)
    )
    if legacy_procs:
        who = ", ".join(f"{r['hostname']}:{r['pid']} ({r['service']})" for r in legacy_procs[:SAMPLE])
        blockers.append(
            Blocker(
                "legacy_process_running",
                len(legacy_procs),
                f"legacy-capable processes are alive for this generation: {who}; stop them (a"
                f" killed process stops counting {process_stale_s:g}s after its last heartbeat)",
            )
        )
    open_counts = await work_items.legacy.work_item_open_counts(conn, p)
    if open_counts["processing"]["n"]:
        blockers.append(
            Blocker(
                "work_item_processing",
                int(open_counts["processing"]["n"]),
                "WorkItems of the generation are processing although WorkItem claims are not admitted",
            )
        )
    return LegacyDrainProof(drain, lease, legacy_procs, open_counts)


@dataclass(slots=True)
class ReconciliationProof:
    projection: ProjectionReport
    #: the generation's events before the backfill (ownership, legacy states)
    coverage_before: dict[str, Any]


async def reconciliation_proof(conn: Conn, locked: Locked, blockers: list[Blocker]) -> ReconciliationProof:
    """Gate 5: every legacy outcome projected, nothing awaiting or unknown, fences resolved."""
    p = locked.params
    projection = await legacy_outcome_project(
        conn, installed_pack_id=locked.pack, generation=locked.generation
    )
    await store.rollback_fence_resolve(conn, locked.pack, locked.generation)
    unprojected = await legacy_store.legacy_outcome_receipt_unprojected_count(conn, p)
    # A conflict is a receipt this projection read and found contradicting its WorkItem row. Other
    # unprojected receipts were committed after it read them: a legacy executor still finishing an
    # event (finalizes are not gated by the phase) — a wait, not an ambiguity (issue #28: the live
    # test saw them reported as conflicts while legacy leases were active).
    conflicts = sorted(set(projection.conflict_receipt_ids))
    if conflicts:
        blockers.append(
            Blocker(
                "legacy_receipt_conflict",
                len(conflicts),
                f"legacy outcome receipts {conflicts[:SAMPLE]} contradict their WorkItem rows"
                " (ambiguous ownership): investigate; they are never overwritten",
            )
        )
    written_since = int(unprojected["n"]) - len(conflicts)
    if written_since > 0:
        blockers.append(
            Blocker(
                "legacy_receipt_unprojected",
                written_since,
                "legacy outcome receipts were written while the cutover ran (a legacy executor is still"
                " finishing events): wait (`--wait`) and retry; they are projected by their executor or"
                " the next attempt",
            )
        )
    awaiting = await work_items.legacy.work_item_awaiting_split(conn, p)
    if awaiting["awaiting"]:
        blockers.append(
            Blocker(
                "awaiting_legacy_outcome",
                int(awaiting["awaiting"]),
                f"rollback-fenced WorkItems (e.g. {list(awaiting['sample'])}) have no legacy outcome"
                " receipt yet: abort (`cutover abort`) and let the legacy executor finish them",
            )
        )
    before = await legacy_store.event_generation_coverage(conn, p)
    if awaiting["unknown"] or before["legacy_unknown"]:
        blockers.append(
            Blocker(
                "legacy_outcome_unknown",
                max(int(awaiting["unknown"]), int(before["legacy_unknown"])),
                "legacy outcomes are unknown (quarantined): check the external effect and confirm each"
                " with `connector admin cutover resolve`",
            )
        )
    fences_open = await store.rollback_fence_open(conn, locked.pack, locked.generation)
    if fences_open:
        blockers.append(
            Blocker(
                "rollback_fence_unresolved",
                len(fences_open),
                f"rollback fences {fences_open} are not resolved (a fenced row lacks a confirmed"
                " terminal receipt)",
            )
        )
    return ReconciliationProof(projection, before)


async def materialization_proof(
    conn: Conn, locked: Locked, blockers: list[Blocker]
) -> tuple[BackfillReport, dict[str, Any]]:
    """Gate 3: complete WorkItem materialization (backfill in this transaction), then verify."""
    fill = await backfill(conn, installed_pack_id=locked.pack, generation=locked.generation)
    cov = await legacy_store.event_generation_coverage(conn, locked.params)
    if cov["missing_work_items"]:
        failed = ", ".join(f"{k}: {v}" for k, v in sorted(fill.failed.items())) or "none"
        blockers.append(
            Blocker(
                "materialization_incomplete",
                int(cov["missing_work_items"]),
                f"(event, work type) pairs without a WorkItem row after backfill (events"
                f" {list(cov['missing_sample'])}; backfill failures: {failed})",
            )
        )
    return fill, cov


@dataclass(slots=True)
class WorkItemIdleProof:
    counts: dict[str, dict[str, Any]]
    started: int
    fenceable: int
    held_by_dead_head: int
    work_item_processes: int
    #: WorkItem executors whose admission names a receipt of the generation (live or not)
    claimers: list[dict[str, Any]]

    @property
    def processing(self) -> dict[str, Any]:
        return self.counts["processing"]


async def work_item_idle_proof(
    conn: Conn, locked: Locked, process_stale_s: float, blockers: list[Blocker]
) -> WorkItemIdleProof:
    """Gate 4: zero WorkItem claimers' work in flight and nothing the legacy path cannot run."""
    p = locked.params
    counts = await work_items.legacy.work_item_open_counts(conn, p)
    processing = counts["processing"]
    if processing["n"]:
        blockers.append(
            Blocker(
                "work_item_processing",
                int(processing["n"]),
                f"WorkItems are processing ({int(processing['expired'])} with an expired lease): wait for"
                " their executors to finish them; an expired lease is reclaimed only while WorkItem claims"
                " are admitted, so for those abort (`cutover abort`), let them finish, and roll back again",
            )
        )
    started = sum(int(counts[s]["started"]) for s in ("pending", "blocked", "retry"))
    if started:
        sample = await work_items.legacy.work_item_started_sample(conn, p)
        blockers.append(
            Blocker(
                "prior_dispatch",
                started,
                f"unfinished WorkItems already had a started attempt (e.g. {sample}); the legacy path"
                " cannot know their external outcome: abort (`cutover abort`), let the WorkItem path"
                " finish them (succeeded or dead), then roll back again",
            )
        )
    cross = sum(int(counts[s]["cross_generation"]) for s in ("pending", "blocked", "retry"))
    if cross:
        blockers.append(
            Blocker(
                "cross_generation_item",
                cross,
                "unfinished WorkItems of this generation belong to Events of another generation (replays);"
                " the legacy path of this generation cannot run them: let them finish first",
            )
        )
    claimers = await work_item_claimers(conn, locked.pack, locked.generation, process_stale_s)
    live = [r for r in claimers if r["live"] and not r["undeclared"]]
    older = [r for r in claimers if r["live"] and r["undeclared"]]
    if live:
        blockers.append(
            Blocker(
                "work_item_claimer_running",
                len(live),
                f"live WorkItem executors can still claim this generation (their claim admission names"
                f" its receipt): {describe(live)}; each drops it within a second of the rollback's"
                " start unless it is not connected to the database: stop it (a killed process stops"
                f" counting {process_stale_s:g}s after its last heartbeat) and roll back again",
            )
        )
    if older:
        blockers.append(
            Blocker(
                "work_item_claimer_running",
                len(older),
                f"live WorkItem executors declare no claim admission (an older build, version"
                f" {', '.join(sorted({str(r['version']) for r in older}))}, claims every admitted"
                f" generation; or one still starting): {describe(older)}; stop them (older binaries must"
                " exit) and roll back again",
            )
        )
    return WorkItemIdleProof(counts, started, 0, 0, 0, claimers)


def describe(rows: list[dict[str, Any]]) -> str:
    """``host:pid (service, process id)`` of the first few processes."""
    return ", ".join(f"{r['hostname']}:{r['pid']} ({r['service']}, {r['process_id']})" for r in rows[:SAMPLE])


async def work_item_claimers(
    conn: Conn, pack: int, generation: int, process_stale_s: float
) -> list[dict[str, Any]]:
    """Gate 4's measure: WorkItem executors whose claim admission names a receipt of the generation
    (``live`` when their heartbeat is fresher than ``process_stale_s``)."""
    return await processes.process_list_admitting(
        conn, installed_pack_id=pack, generation=generation, stale_s=process_stale_s
    )


async def fence_plan(conn: Conn, locked: Locked, proof: WorkItemIdleProof, process_stale_s: float) -> None:
    """Gate 4's fence plan and the WorkItem executors seen (recorded for audit), into ``proof``."""
    proof.fenceable, proof.held_by_dead_head = await work_items.legacy.work_item_fence_plan(
        conn, locked.params
    )
    proof.work_item_processes = await processes.process_count_work_item_fresh(conn, stale_s=process_stale_s)
