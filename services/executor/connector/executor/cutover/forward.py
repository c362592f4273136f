"""Forward transitions: gate 1 (``legacy_quiesce``) and gates 2, 3 and 5 (``cutover_complete``: drain
proof, materialization, Event ownership switch, the ``cutover`` receipt admitting WorkItem claims).
See docs/cutover.md and docs/adr/007-cutover.md.
"""

from __future__ import annotations

from typing import Any

from connector.common.store import authority as store
from connector.common.store import legacy as legacy_store
from connector.common.store import work_items
from connector.executor.cutover import proofs
from connector.executor.cutover.authority import (
    Blocker,
    Conn,
    Transition,
    announce,
    blocked,
    db_now,
    lock_from,
    move,
    previous,
    schema_proof,
)

# --------------------------------------------------------------------------------------------------
# Gate 1: quiesce the legacy Event path
# --------------------------------------------------------------------------------------------------


async def legacy_quiesce(conn: Conn, installed_pack_id: int, generation: int, *, actor: str) -> Transition:
    """Stop legacy Event claim admission for the generation and revoke its scheduler lease."""
    async with conn.transaction():
        locked = await lock_from(
            conn, installed_pack_id, generation, "quiesce",
            start=("legacy_active",), expected="legacy_event/legacy_active", done="quiescing",
        )  # fmt: skip
        if isinstance(locked, Transition):
            return locked
        lease = await store.scheduler_lease_revoke(conn, locked.params)
        t = await move(conn, locked, "quiesce", claim_path="none", phase="quiescing", actor=actor)
    return announce(
        t,
        "legacy Event claim admission stopped (quiescing)",
        actor,
        scheduler_lease_revoked=bool(lease and lease[1]),
        lock_wait_ms=locked.lock_wait_ms,
    )


# --------------------------------------------------------------------------------------------------
# Gates 2, 3 and 5: drain proof, materialization, ownership switch, cutover receipt
# --------------------------------------------------------------------------------------------------


async def cutover_complete(
    conn: Conn,
    installed_pack_id: int,
    generation: int,
    *,
    actor: str,
    process_stale_s: float = 30.0,
    dry_run: bool = False,
) -> Transition:
    """Prove the drain and the re-cutover conditions, complete the materialization, switch Event
    ownership and write the ``cutover`` receipt admitting WorkItem claims — or, when anything is
    missing, change nothing and raise ``CutoverBlocked`` (with ``dry_run``: return the blockers)."""
    async with conn.transaction(force_rollback=dry_run):
        locked = await lock_from(
            conn, installed_pack_id, generation, "cutover", start=("quiescing",),
            expected="none/quiescing (run quiesce first)", done=None if dry_run else "work_item_active",
            long=True,
        )  # fmt: skip
        if isinstance(locked, Transition):
            return locked
        a = locked.authority
        p = locked.params
        blockers: list[Blocker] = []
        drained = await proofs.legacy_drain_proof(conn, locked, process_stale_s, blockers)
        schema = await schema_proof(conn, blockers)
        reconciled_proof = await proofs.reconciliation_proof(conn, locked, blockers)
        fill, cov = await proofs.materialization_proof(conn, locked, blockers)
        if blockers:
            return blocked(locked, "cutover", blockers, dry_run)

        switched = await legacy_store.event_owner_switch_to_work_item(conn, p)
        reconciled = await work_items.legacy.work_item_reconciled_count(conn, p)
        fences_resolved = await store.rollback_fence_resolved_ids(conn, installed_pack_id, generation)
        drain, lease = drained.drain, drained.lease
        before, projection = reconciled_proof.coverage_before, reconciled_proof.projection
        proof: dict[str, Any] = {
            "kind": "cutover",
            "pack": locked.pack_name,
            "installed_pack_id": installed_pack_id,
            "generation": generation,
            "claim_path": "work_item",
            "checked_at": await db_now(conn),
            "previous": previous(a),
            "zero_old_claimers": {
                "claim_transactions": "authority row locked FOR UPDATE after every legacy claim/lease/"
                "reclaim transaction (each holds it FOR SHARE) released it; legacy admission requires"
                " phase legacy_active, stopped since the quiesce",
                "authority_lock_wait_ms": locked.lock_wait_ms,
                "legacy_processing_events": int(drain["processing"]),
                "legacy_leases_active": int(drain["leases_active"]),
                "scheduler_lease": {
                    "holder": lease["holder"] if lease else None,
                    "token": lease["token"] if lease else None,
                    "active": bool(lease and lease["active"]),
                },
                "legacy_processes_fresh": len(drained.legacy_processes),
                "process_stale_s": process_stale_s,
                "work_items_processing": int(drained.open_counts["processing"]["n"]),
            },
            "claim_schema": schema,
            "materialization": {
                "events": int(cov["events"]),
                "backfilled_events": fill.events,
                "backfilled_work_items": fill.work_items,
                "missing_work_items": 0,
                "ineligible_by_reason": fill.ineligible,
            },
            "event_ownership": {
                "switched_to_work_item": switched,
                "legacy_owned_before": int(before["legacy_owned"]),
                "legacy_open_transferred": int(before["legacy_open"]),
            },
            "historical_mirror": {
                "legacy_terminal_events": int(cov["legacy_terminal"]),
                "reconciled_legacy_terminal_work_items": reconciled,
                "receipts_projected_now": projection.projected,
                "receipts_duplicate": projection.duplicates,
                "unprojected_receipts": 0,
            },
            "rollback_fences": {"resolved": fences_resolved, "open": 0, "awaiting_legacy_outcome": 0},
        }
        t = await move(
            conn, locked, "cutover", claim_path="work_item", phase="work_item_active", actor=actor,
            receipt=("cutover", proof), fence_id=None, dry_run=dry_run,
        )  # fmt: skip
    return announce(t, "cutover receipt written: WorkItem claims admitted", actor)
