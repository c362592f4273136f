"""The seed's rollback matrix, end to end on one generation with the real materializer, the real
WorkItem executor and the real legacy Event executor:

pending WorkItems → rollback fence → legacy success and terminal failure → reconciliation receipts →
re-cutover; a new eligible Event without a WorkItem row gets one at re-cutover; reconciled rows are
never reopened (the WorkItem path, replay and direct writes all leave them alone); and across the
whole run every logical work item executed on exactly one claim path."""

from __future__ import annotations

import hashlib

import psycopg
import pytest

from connector.common.core.grpc_server import ServiceError
from connector.common.store import work_items
from connector.executor import cutover
from connector.executor.admin import replay
from connector.executor.legacy import LegacyNotAdmitted, outcome_digest

from .conftest import Rig, wait_until


async def _claim_rows(rig: Rig) -> int:
    """Run the real WorkItem claim statement for the pack (a claim that must come back empty)."""
    rows = await work_items.claim.work_item_claim_batch(
        rig.conn, [rig.pack], ["default"], [100], owner="probe", lease_s=30
    )
    return len(rows)


async def test_rollback_legacy_outcomes_reconcile_then_recutover(rig: Rig) -> None:
    await rig.install()
    assert await rig.authority() == ("work_item", "work_item_active")

    # WorkItem path: two deliveries executed and finished.
    done = await rig.deliver("ok", "ok")
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar("SELECT count(*) = 2 FROM connector_work_item WHERE state = 'succeeded'"),
        what="WorkItem path finishes the first deliveries",
    )
    await rig.stop(wi)

    # Pending WorkItems (never dispatched): the rollback fence takes them.
    pending = await rig.deliver("ok", "ok", "fail", "ok")
    begun = await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    assert (begun.claim_path, begun.phase, begun.changed) == ("none", "rollback_fenced", True)
    assert await _claim_rows(rig) == 0, "WorkItem claims fail closed once rollback began"
    # A delivery while fenced gets a WorkItem that is not executable; the fence takes it too.
    during = await rig.deliver("ok")
    assert (await rig.work_items(during))[during[0]][0] == "pending"
    assert await _claim_rows(rig) == 0

    rolled = await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert (rolled.claim_path, rolled.phase, rolled.receipt_kind) == (
        "legacy_event",
        "legacy_active",
        "rollback",
    )
    fenced_events = pending + during
    fenced_ids = sorted(
        int(r[0])
        for r in await rig.rows(
            "SELECT work_id FROM connector_work_item WHERE rollback_execution_fence_id = %s",
            (rolled.fence_id,),
        )
    )
    assert rolled.fenced_work_items == len(fenced_ids) == 5
    assert rolled.proof is not None
    fence_proof = rolled.proof["fence"]
    assert (
        fence_proof["fenced_set_sha256"]
        == hashlib.sha256(",".join(map(str, fenced_ids)).encode()).hexdigest()
    )
    assert rolled.proof["zero_work_item_claimers"]["processing"] == 0
    assert rolled.proof["zero_work_item_claimers"]["started_attempts_unfinished"] == 0
    stored = await rig.scalar(
        "SELECT proof_sha256 FROM connector_cutover_receipt WHERE cutover_receipt_id = %s",
        (rolled.receipt_id,),
    )
    assert stored == rolled.proof_sha256
    assert {s for s, _, _ in (await rig.work_items(fenced_events)).values()} == {"awaiting_legacy_outcome"}
    assert set((await rig.events(fenced_events)).values()) == {("legacy_event", "pending")}
    assert set((await rig.events(done)).values()) == {("work_item", None)}, (
        "finished work stays WorkItem-owned"
    )

    # Legacy phase: new deliveries are legacy-owned Events without WorkItems.
    legacy_new = await rig.deliver("ok", "retry_once")
    assert await rig.work_items(legacy_new) == {}
    assert set((await rig.events(legacy_new)).values()) == {("legacy_event", "pending")}

    # The legacy Event path executes them: success and terminal failure, receipts, projection.
    lx = await rig.legacy_executor()
    everything = fenced_events + legacy_new
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = %s FROM connector_event WHERE event_id = ANY(%s)"
            " AND legacy_state IN ('succeeded', 'failed')",
            (len(everything), everything),
        ),
        what="legacy path finishes every legacy-owned event",
    )
    await wait_until(
        lambda: rig.scalar("SELECT count(*) = 0 FROM connector_legacy_outcome_receipt WHERE NOT projected"),
        what="every receipt projected",
    )
    await rig.stop(lx)
    states = await rig.events(everything)
    assert states[pending[2]] == ("legacy_event", "failed")
    assert sum(1 for s in states.values() if s == ("legacy_event", "succeeded")) == len(everything) - 1
    receipts = await rig.rows(
        "SELECT event_id, version, outcome, digest, failure_class FROM connector_legacy_outcome_receipt"
        " ORDER BY event_id"
    )
    assert [(r[0], r[1]) for r in receipts] == [(e, 1) for e in sorted(everything)], "one v1 receipt each"
    for event_id, _, outcome, digest, failure_class in receipts:
        assert digest == outcome_digest(event_id, "sync", outcome, failure_class)
    items = await rig.work_items(everything)
    assert {s for s, _, _ in items.values()} == {"reconciled_legacy_terminal"}
    by_event = {r[0]: r for r in receipts}
    for event_id, (_, version, digest) in items.items():
        assert (version, digest) == (1, by_event[event_id][3])
    assert (
        await rig.scalar(
            "SELECT status FROM connector_rollback_fence WHERE fence_id = %s", (rolled.fence_id,)
        )
        == "resolved"
    )
    failed_row = await rig.rows(
        "SELECT outcome, failure_class FROM connector_work_item WHERE event_id = %s", (pending[2],)
    )
    assert failed_row == [("failed", "permanent_test")]

    # A legacy-owned Event still pending at quiesce time: it has no WorkItem row yet.
    late = await rig.deliver("ok")
    assert await rig.work_items(late) == {}

    # Gate 1: quiesce. Legacy claims stop; a legacy executor refuses to start.
    q = await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    assert (q.claim_path, q.phase) == ("none", "quiescing")
    with pytest.raises(LegacyNotAdmitted):
        await rig.legacy_executor()
    during_quiesce = await rig.deliver("ok")  # materialized with a (not yet executable) WorkItem
    assert (await rig.work_items(during_quiesce))[during_quiesce[0]][0] == "pending"
    assert await _claim_rows(rig) == 0

    # Gates 2, 3, 5: the cutover receipt. The late Event gets its WorkItem in the same transaction.
    reconciled_before = await rig.rows(
        "SELECT work_id, state, outcome, legacy_outcome_receipt_version, legacy_outcome_digest, updated_at"
        " FROM connector_work_item WHERE state = 'reconciled_legacy_terminal' ORDER BY work_id"
    )
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=5)
    assert (cut.claim_path, cut.phase, cut.receipt_kind) == ("work_item", "work_item_active", "cutover")
    assert cut.proof is not None
    assert cut.proof["materialization"]["backfilled_events"] == 1
    assert cut.proof["materialization"]["missing_work_items"] == 0
    assert cut.proof["zero_old_claimers"]["legacy_processing_events"] == 0
    assert cut.proof["zero_old_claimers"]["legacy_processes_fresh"] == 0
    assert cut.proof["claim_schema"]["alembic_revision"] == cutover.expected_schema_revision()
    assert cut.proof["historical_mirror"]["reconciled_legacy_terminal_work_items"] == len(everything)
    assert cut.proof["event_ownership"]["switched_to_work_item"] == len(everything) + 1
    assert (
        await rig.scalar(
            "SELECT count(*) FROM connector_event"
            " WHERE installed_pack_id = %s AND execution_owner <> 'work_item'",
            (rig.pack,),
        )
        == 0
    )
    assert (await rig.work_items(late))[late[0]][0] == "pending"

    # The WorkItem path runs the new work and never touches the reconciled rows.
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 2 FROM connector_work_item WHERE event_id = ANY(%s) AND state = 'succeeded'",
            (late + during_quiesce,),
        ),
        what="WorkItem path executes the work materialized at and after re-cutover",
    )
    await rig.stop(wi)
    reconciled_after = await rig.rows(
        "SELECT work_id, state, outcome, legacy_outcome_receipt_version, legacy_outcome_digest, updated_at"
        " FROM connector_work_item WHERE state = 'reconciled_legacy_terminal' ORDER BY work_id"
    )
    assert reconciled_after == reconciled_before

    # Never reopened: replay refuses, the database refuses updates and deletes.
    victim = int(reconciled_before[0][0])
    with pytest.raises(ServiceError) as refused:
        await replay.work_item_replay(rig.conn, victim, actor="test")
    assert refused.value.reason == "LEGACY_RECONCILED"
    with pytest.raises(psycopg.errors.RestrictViolation):
        await rig.conn.execute(
            "UPDATE connector_work_item SET state = 'pending' WHERE work_id = %s", (victim,)
        )
    with pytest.raises(psycopg.errors.RestrictViolation):
        await rig.conn.execute("DELETE FROM connector_work_item WHERE work_id = %s", (victim,))
    with pytest.raises(psycopg.errors.RestrictViolation):
        await rig.conn.execute("UPDATE connector_legacy_outcome_receipt SET outcome = 'failed'")

    # One claim path per logical work item, across the whole run.
    effects = await rig.effects()
    all_events = done + everything + late + during_quiesce
    assert sorted(e for e, _ in effects) == sorted(all_events)
    for event_id in done + late + during_quiesce:
        assert effects[(event_id, "sync")] == [(True, False)], f"event {event_id}: WorkItem path only, once"
    for event_id in everything:
        runs = effects[(event_id, "sync")]
        assert all(r == (False, True) for r in runs), f"event {event_id}: legacy path only"
        assert len(runs) == (2 if event_id == legacy_new[1] else 1)
