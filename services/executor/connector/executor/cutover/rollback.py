"""Gate 4, rollback: ``rollback_begin`` (admission off), ``rollback_complete`` (zero proof, fence of
every unstarted WorkItem, the ``rollback`` receipt admitting the legacy Event path), and
``transition_abort`` (back to the path a generation in transition came from). See docs/cutover.md
and docs/adr/007-cutover.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

from connector.common.packs.manifest import sha256_hex
from connector.common.store import authority as store
from connector.common.store import work_items
from connector.executor.cutover import proofs
from connector.executor.cutover.authority import (
    Blocker,
    Conn,
    CutoverBlocked,
    CutoverError,
    Locked,
    Transition,
    announce,
    blocked,
    db_now,
    lock,
    lock_from,
    move,
    previous,
    schema_proof,
    wrong_phase,
)
from connector.executor.legacy.outcomes import ProjectionReport, legacy_outcome_project

# --------------------------------------------------------------------------------------------------
# Gate 4: rollback (admission, then fence + owner receipt)
# --------------------------------------------------------------------------------------------------


async def rollback_begin(conn: Conn, installed_pack_id: int, generation: int, *, actor: str) -> Transition:
    """Disable WorkItem claim and reclaim admission for the generation."""
    async with conn.transaction():
        locked = await lock_from(
            conn, installed_pack_id, generation, "rollback_begin", start=("work_item_active",),
            expected="work_item/work_item_active", done="rollback_fenced", refused_as="rollback",
        )  # fmt: skip
        if isinstance(locked, Transition):
            return locked
        t = await move(
            conn, locked, "rollback_begin", claim_path="none", phase="rollback_fenced", actor=actor
        )
    return announce(t, "WorkItem claim admission disabled (rollback_fenced)", actor)


async def rollback_complete(
    conn: Conn,
    installed_pack_id: int,
    generation: int,
    *,
    actor: str,
    process_stale_s: float = 30.0,
    dry_run: bool = False,
    claimers_wait_s: float = 5.0,
) -> Transition:
    """Prove zero WorkItem claimers and started attempts, fence every remaining unstarted WorkItem
    and write the ``rollback`` receipt admitting the legacy Event path (or raise ``CutoverBlocked``).
    First (without the lock) wait up to ``claimers_wait_s`` for live WorkItem executors to drop the
    generation from their claim admission (they do on the notification of ``rollback_begin``)."""
    if not dry_run and claimers_wait_s > 0:
        await wait_for_claimers(conn, installed_pack_id, generation, process_stale_s, claimers_wait_s)
    async with conn.transaction(force_rollback=dry_run):
        # A dry run may also preview from work_item_active (items in flight then count as blockers;
        # normally they finish once admission is disabled).
        locked = await lock_from(
            conn, installed_pack_id, generation, "rollback",
            start=("rollback_fenced", "work_item_active") if dry_run else ("rollback_fenced",),
            expected="none/rollback_fenced (run rollback begin first)",
            done=None if dry_run else "legacy_active", long=True,
        )  # fmt: skip
        if isinstance(locked, Transition):
            return locked
        return await to_legacy(conn, locked, "rollback", actor, process_stale_s, dry_run)


async def wait_for_claimers(
    conn: Conn, installed_pack_id: int, generation: int, process_stale_s: float, wait_s: float
) -> None:
    """Poll (outside any transaction's lock) until no live WorkItem executor names the generation in
    its claim admission, or ``wait_s`` passed (the locked proof then decides)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        async with conn.transaction():
            rows = await proofs.work_item_claimers(conn, installed_pack_id, generation, process_stale_s)
        if not any(r["live"] for r in rows) or asyncio.get_running_loop().time() >= deadline:
            return
        await asyncio.sleep(0.1)


async def transition_abort(
    conn: Conn,
    installed_pack_id: int,
    generation: int,
    *,
    actor: str,
    process_stale_s: float = 30.0,
) -> Transition:
    """Return a generation in transition to the path it came from (see the module docstring)."""
    async with conn.transaction():
        locked = await lock(conn, installed_pack_id, generation, long=True)
        a = locked.authority
        if a["phase"] == "quiescing":
            return await to_legacy(conn, locked, "abort", actor, process_stale_s, False)
        if a["phase"] == "rollback_fenced":
            if a["cutover_receipt_id"] is None or a["receipt_kind"] not in ("install", "cutover"):
                raise CutoverError(
                    "wrong_phase",
                    "the generation has no cutover receipt to return to; complete the rollback instead",
                )
            t = await move(
                conn, locked, "abort", claim_path="work_item", phase="work_item_active", actor=actor
            )
            return announce(
                t, "rollback aborted: WorkItem claims admitted again under the existing receipt", actor
            )
        raise wrong_phase(locked, generation, "abort", "quiescing or rollback_fenced")


async def to_legacy(
    conn: Conn, locked: Locked, action: str, actor: str, process_stale_s: float, dry_run: bool
) -> Transition:
    """Gate 4 inside the caller's locked transaction: proof, fence, ``rollback`` receipt, authority."""
    a = locked.authority
    p = locked.params
    pack, generation = int(p["pack"]), int(p["generation"])
    blockers: list[Blocker] = []
    idle = await proofs.work_item_idle_proof(conn, locked, process_stale_s, blockers)
    schema = await schema_proof(conn, blockers)
    await proofs.fence_plan(conn, locked, idle, process_stale_s)
    counts, processing, started = idle.counts, idle.processing, idle.started
    fenceable, held_by_dead_head = idle.fenceable, idle.held_by_dead_head
    work_item_procs = idle.work_item_processes
    if blockers:
        return blocked(locked, action, blockers, dry_run, fenced_work_items=fenceable)

    fence_id: int | None = None
    fenced, fenced_events, fenced_sha, first_id, last_id = 0, 0, sha256_hex(""), None, None
    if fenceable:
        fence_id = await store.rollback_fence_insert(conn, pack, generation, fenceable)
        r = await work_items.legacy.work_item_rollback_fence(conn, {**p, "fence_id": fence_id})
        fenced, fenced_events, fenced_sha, first_id, last_id = int(r[0]), int(r[1]), str(r[2]), r[3], r[4]
        if fenced != fenceable:  # cannot happen under the locks; never write a partial proof
            raise CutoverBlocked(
                action, [Blocker("fence_incomplete", fenceable, f"planned {fenceable} rows, fenced {fenced}")]
            )
    proof: dict[str, Any] = {
        "kind": "rollback",
        "pack": locked.pack_name,
        "installed_pack_id": pack,
        "generation": generation,
        "claim_path": "legacy_event",
        "from_phase": a["phase"],
        "checked_at": await db_now(conn),
        "previous": previous(a),
        "zero_work_item_claimers": {
            "claim_transactions": "authority row locked FOR UPDATE after every WorkItem claim/reclaim"
            " transaction (each holds it FOR SHARE) released it; both statements require phase"
            " work_item_active, which ended when WorkItem admission was disabled",
            "authority_lock_wait_ms": locked.lock_wait_ms,
            "processing": int(processing["n"]),
            "expired_leases": int(processing["expired"]),
            "started_attempts_unfinished": started,
            "claim_capable_processes_for_generation": sum(1 for r in idle.claimers if r["live"]),
            "older_builds_without_claim_admission": sum(1 for r in idle.claimers if r["undeclared"]),
            "definition": "live WorkItem executors (process registry, heartbeat fresher than process_stale_s)"
            " whose claim admission names a receipt of this generation; the claim statements admit a"
            " generation for a process only while its row names the authority's receipt, and a process"
            " drops it once the authority leaves work_item_active (or never names it when started later)",
            "stale_processes_naming_the_generation": [
                {"process_id": r["process_id"], "heartbeat_age_s": round(float(r["heartbeat_age_s"]), 3)}
                for r in idle.claimers
                if not r["live"]
            ],
            "work_item_processes_fresh_any_pack": work_item_procs,
            "process_stale_s": process_stale_s,
        },
        "claim_schema": schema,
        "fence": {
            "fence_id": fence_id,
            "fenced_work_items": fenced,
            "fenced_set_sha256": fenced_sha,
            "first_work_id": first_id,
            "last_work_id": last_id,
            "events_to_legacy": fenced_events,
            "previously_awaiting": int(counts["awaiting_legacy_outcome"]["n"]),
            "dead_kept_on_work_item_path": int(counts["dead"]["n"]),
            "held_by_dead_lane_head_kept_on_work_item_path": held_by_dead_head,
        },
    }
    t = await move(
        conn, locked, action, claim_path="legacy_event", phase="legacy_active", actor=actor,
        receipt=("rollback", proof), fence_id=fence_id, fenced_work_items=fenced, dry_run=dry_run,
    )  # fmt: skip
    return announce(
        t,
        "rollback receipt written: legacy Event path admitted",
        actor,
        fence_id=fence_id,
        fenced_work_items=fenced,
    )


async def legacy_reconcile(
    conn: Conn, installed_pack_id: int | None = None, generation: int | None = None
) -> ProjectionReport:
    """Project every unprojected legacy outcome receipt (of one generation, or all) and resolve fences."""
    return await legacy_outcome_project(conn, installed_pack_id=installed_pack_id, generation=generation)
