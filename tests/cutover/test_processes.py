"""Real ``connector executor --claim-path event`` processes: a SIGKILL between the Event/receipt commit
and the WorkItem projection is repaired from the receipt; a live legacy process or an active Event
lease blocks the cutover; a quiesced process drains and exits by itself; a process for a generation
that does not admit the legacy path refuses to start (fail closed)."""

from __future__ import annotations

import os
import signal

import pytest

from connector.executor import cutover

from .conftest import ROOT, Rig, wait_until

CONTROLS = ROOT / "tests" / "executor" / "controls"


async def _rollback(rig: Rig) -> cutover.Transition:
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    return await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")


async def test_crash_after_receipt_commit_is_repaired_from_the_receipt(rig: Rig) -> None:
    await rig.install()
    events = await rig.deliver("ok", "ok", "ok")
    await _rollback(rig)

    crashing = rig.legacy_process(  # a build that dies between the finalize and its projection
        CONNECTOR_TEST_LEGACY_CRASH_BEFORE_PROJECTION="1",
        CONNECTOR_EXECUTOR_WORKERS="1",
        PYTHONPATH=os.pathsep.join([str(CONTROLS), str(ROOT)]),
    )
    assert await crashing.wait_exit() == -signal.SIGKILL, crashing.log()

    # Committed together: the Event's terminal state and its receipt. Not done: the projection.
    done = await rig.rows(
        "SELECT event_id FROM connector_event WHERE event_id = ANY(%s) AND legacy_state = 'succeeded'",
        (events,),
    )
    assert len(done) == 1
    crashed = int(done[0][0])
    receipt = await rig.rows(
        "SELECT version, projected, digest FROM connector_legacy_outcome_receipt WHERE event_id = %s",
        (crashed,),
    )
    assert [(v, p) for v, p, _ in receipt] == [(1, False)]
    assert (await rig.work_items([crashed]))[crashed][0] == "awaiting_legacy_outcome"
    assert (
        await rig.scalar(
            "SELECT count(*) FROM connector_process WHERE pid = %s AND claim_capability = 'legacy_event'",
            (crashing.pid,),
        )
        == 1
    ), "a killed process leaves its row; only its heartbeat age tells it is gone"

    # A restarted legacy process repairs the projection first, then runs the rest.
    survivor = rig.legacy_process()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 3 FROM connector_work_item WHERE event_id = ANY(%s)"
            " AND state = 'reconciled_legacy_terminal'",
            (events,),
        ),
        what="every fenced WorkItem reconciled",
    )
    assert (await rig.work_items([crashed]))[crashed] == ("reconciled_legacy_terminal", 1, receipt[0][2])
    assert await rig.scalar("SELECT count(*) FROM connector_legacy_outcome_receipt WHERE NOT projected") == 0
    effects = await rig.effects()
    assert [len(effects[(e, "sync")]) for e in events] == [1, 1, 1], "nothing executed twice"

    # Quiesce: the live legacy process finishes, deregisters and exits by itself.
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    assert await survivor.wait_exit() == 0, survivor.log()
    assert await rig.scalar("SELECT count(*) FROM connector_process WHERE pid = %s", (survivor.pid,)) == 0
    cut = await cutover.cutover_complete(
        rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=1.5
    )
    assert (cut.phase, cut.receipt_kind) == ("work_item_active", "cutover")


async def test_live_legacy_process_and_active_event_lease_block_the_cutover(rig: Rig, tmp_path) -> None:
    await rig.install()
    (slow,) = await rig.deliver("slow")
    await _rollback(rig)
    release = tmp_path / "release"  # the handler holds the event until the blockers are seen
    proc = rig.legacy_process(CUTOVER_TEST_RELEASE_FILE=str(release))
    await wait_until(
        lambda: rig.scalar(
            "SELECT legacy_state = 'processing' FROM connector_event WHERE event_id = %s", (slow,)
        ),
        what="the legacy process holds the event",
    )
    q = await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    assert q.phase == "quiescing"
    assert await rig.scalar(
        "SELECT holder IS NULL FROM connector_scheduler_lease WHERE installed_pack_id = %s", (rig.pack,)
    )

    dry = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test", dry_run=True)
    codes = {b.code for b in dry.blockers}
    assert {"legacy_lease_active", "legacy_process_running", "awaiting_legacy_outcome"} <= codes
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert {b.code for b in blocked.value.blockers} == codes
    assert await rig.authority() == ("none", "quiescing")
    assert await rig.scalar("SELECT count(*) FROM connector_cutover_receipt WHERE kind = 'cutover'") == 0

    # The in-flight event finishes under its lease; then the process drains and exits.
    release.touch()
    assert await proc.wait_exit() == 0, proc.log()
    assert (await rig.events([slow]))[slow] == ("legacy_event", "succeeded")
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=5)
    assert cut.phase == "work_item_active"


async def test_legacy_process_refuses_a_generation_that_does_not_admit_it(rig: Rig) -> None:
    await rig.install()  # WorkItem-owned (install receipt)
    proc = rig.legacy_process()
    assert await proc.wait_exit() == 2
    assert "refusing to start the legacy Event path" in proc.log()
    assert "not legacy_event/legacy_active" in proc.log()
    assert (
        await rig.scalar("SELECT count(*) FROM connector_process WHERE claim_capability = 'legacy_event'")
        == 0
    )
