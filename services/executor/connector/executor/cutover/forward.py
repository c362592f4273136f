"""Forward transitions: gate 1 (``legacy_quiesce``) and gates 2, 3 and 5 (``cutover_complete``: drain
proof, materialization, Event ownership switch, the ``cutover`` receipt admitting WorkItem claims).
See docs/cutover.md and docs/adr/007-cutover.md.
"""

from __future__ import annotations

import logging
from typing import Any

from connector.common.store import authority as store
from connector.common.store import legacy as legacy_store
from connector.common.store import work_items
from connector.executor.cutover import proofs
from connector.executor.cutover.authority import (
    Blocker,
    Conn,
    CutoverBlocked,
    Transition,
    db_now,
    lock,
    schema_proof,
    set_authority,
    unchanged,
    write_receipt,
    wrong_phase,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Gate 1: quiesce the legacy Event path
# --------------------------------------------------------------------------------------------------


async def legacy_quiesce(conn: Conn, installed_pack_id: int, generation: int, *, actor: str) -> Transition:
    """Stop legacy Event claim admission for the generation and revoke its scheduler lease."""
    async with conn.transaction():
        locked = await lock(conn, installed_pack_id, generation)
        a = locked.authority
        if a["phase"] == "quiescing":
            return unchanged(installed_pack_id, generation, "quiesce", a)
        if a["phase"] != "legacy_active":
            raise wrong_phase(locked, generation, "quiesce", "legacy_event/legacy_active")
        lease = await store.scheduler_lease_revoke(conn, locked.params)
        row = await set_authority(
            conn,
            locked,
            claim_path="none",
            phase="quiescing",
            receipt_id=a["cutover_receipt_id"],
            fence_id=a["rollback_fence_id"],
        )
    log.warning(
        "legacy Event claim admission stopped (quiescing)",
        extra={
            "installed_pack_id": installed_pack_id,
            "generation": generation,
            "actor": actor,
            "scheduler_lease_revoked": bool(lease and lease[1]),
            "lock_wait_ms": locked.lock_wait_ms,
        },
    )
    return Transition(
        installed_pack_id, generation, "quiesce", row["claim_path"], row["phase"], row["version"], True,
        receipt_id=a["cutover_receipt_id"], receipt_kind=a["receipt_kind"], fence_id=a["rollback_fence_id"],
    )  # fmt: skip


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
        locked = await lock(conn, installed_pack_id, generation, long=True)
        a = locked.authority
        if a["phase"] == "work_item_active" and not dry_run:
            return unchanged(installed_pack_id, generation, "cutover", a)
        if a["phase"] != "quiescing":
            raise wrong_phase(locked, generation, "cutover", "none/quiescing (run quiesce first)")
        p = locked.params
        blockers: list[Blocker] = []
        drained = await proofs.legacy_drain_proof(conn, locked, process_stale_s, blockers)
        schema = await schema_proof(conn, blockers)
        reconciled_proof = await proofs.reconciliation_proof(conn, locked, blockers)
        fill, cov = await proofs.materialization_proof(conn, locked, blockers)
        if blockers:
            if dry_run:
                return Transition(
                    installed_pack_id, generation, "cutover", str(a["claim_path"]), str(a["phase"]),
                    int(a["version"]), False, blockers=blockers, dry_run=True,
                )  # fmt: skip
            raise CutoverBlocked("cutover", blockers)

        switched = await legacy_store.event_owner_switch_to_work_item(conn, p)
        reconciled = await work_items.work_item_reconciled_count(conn, p)
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
            "previous": {
                "claim_path": a["claim_path"],
                "phase": a["phase"],
                "authority_version": a["version"],
                "admitting_receipt_id": a["cutover_receipt_id"],
            },
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
        receipt_id, digest = await write_receipt(
            conn, locked, kind="cutover", claim_path="work_item", proof=proof, actor=actor
        )
        row = await set_authority(
            conn,
            locked,
            claim_path="work_item",
            phase="work_item_active",
            receipt_id=receipt_id,
            fence_id=None,
        )
    if not dry_run:
        log.warning(
            "cutover receipt written: WorkItem claims admitted",
            extra={
                "installed_pack_id": installed_pack_id,
                "generation": generation,
                "receipt_id": receipt_id,
                "actor": actor,
            },
        )
    return Transition(
        installed_pack_id, generation, "cutover",
        row["claim_path"], row["phase"], row["version"],  # a dry run: where it would be (rolled back)
        not dry_run,
        receipt_id=None if dry_run else receipt_id, receipt_kind="cutover", proof=proof,
        proof_sha256=digest, dry_run=dry_run,
    )  # fmt: skip
