"""Gate refusals and fail-closed claim admission: WorkItem claims and reclaims admit nothing outside
``work_item_active`` (the real statements), legacy claims nothing outside ``legacy_active``; an
authority change waits for claim transactions in flight; rollback refuses prior dispatch and
in-flight WorkItems; an ambiguous legacy outcome blocks re-cutover until an operator resolves it;
aborts return a generation to the path it came from."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from connector.common.store import authority, work_items
from connector.common.store import legacy as legacy_store
from connector.executor import cutover, legacy
from connector.executor.legacy import LegacyOutcomeError, legacy_outcome_resolve

from .conftest import Rig, wait_until


async def _rollback(rig: Rig) -> cutover.Transition:
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    return await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")


async def _work_item_claims(rig: Rig) -> tuple[int, int]:
    """(claimed, reclaimed) by the real WorkItem claim and reclaim statements."""
    rows = await work_items.claim.work_item_claim_batch(
        rig.conn, [rig.pack], ["default"], [100], owner="probe", lease_s=30
    )
    reclaimed = await work_items.finalize.work_item_reclaim_expired(rig.conn)
    return len(rows), len(reclaimed)


async def _legacy_lease(rig: Rig, owner: str = "probe", lease_s: float = 30.0) -> int | None:
    params = {"pack": rig.pack, "generation": rig.generation, "owner": owner, "lease_s": lease_s}
    row = await (await rig.conn.execute(authority.SCHEDULER_LEASE_ACQUIRE, params)).fetchone()
    return None if row is None else int(row[0])


async def test_claims_fail_closed_in_every_phase_but_their_own(rig: Rig) -> None:
    await rig.install()
    await rig.deliver("ok", "ok", "ok")
    # One item in flight with an expired lease, two ready: both statements have something to take.
    (claimed,) = await work_items.claim.work_item_claim_batch(
        rig.conn, [rig.pack], ["default"], [1], owner="x", lease_s=30
    )
    await rig.conn.execute(
        "UPDATE connector_work_item SET lease_until = clock_timestamp() - interval '1 second'"
        " WHERE work_id = %s",
        (claimed[0],),
    )

    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    assert await rig.authority() == ("none", "rollback_fenced")
    assert await _work_item_claims(rig) == (0, 0)
    assert await _legacy_lease(rig) is None, "rollback_fenced admits no legacy claimer either"
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert [b.code for b in blocked.value.blockers] == ["work_item_processing"]
    assert "1 with an expired lease" in blocked.value.blockers[0].message

    # Abort: the WorkItem path is admitted again under its receipt and reclaims the expired lease.
    aborted = await cutover.transition_abort(rig.conn, rig.pack, rig.generation, actor="test")
    assert (aborted.claim_path, aborted.phase, aborted.receipt_kind) == (
        "work_item",
        "work_item_active",
        "install",
    )
    assert await _work_item_claims(rig) == (2, 1)
    await rig.conn.execute(
        "UPDATE connector_work_item SET state = 'succeeded', lease_owner = NULL, lease_until = NULL,"
        " attempts = 1 WHERE installed_pack_id = %s",
        (rig.pack,),
    )
    await rig.deliver("ok")
    await _rollback(rig)
    assert await rig.authority() == ("legacy_event", "legacy_active")
    await rig.conn.execute(
        "UPDATE connector_work_item SET run_after = now() - interval '1 hour' WHERE installed_pack_id = %s",
        (rig.pack,),
    )
    assert await _work_item_claims(rig) == (0, 0), "legacy_active admits no WorkItem claim"
    token = await _legacy_lease(rig)
    assert token is not None, "the legacy path is admitted"

    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    assert await _work_item_claims(rig) == (0, 0)
    assert await _legacy_lease(rig) is None, "quiescing admits no legacy claimer"
    params: dict[str, Any] = {
        "pack": rig.pack, "generation": rig.generation, "owner": "probe", "lease_token": token,
        "limit": 10, "lease_s": 30.0,
    }  # fmt: skip
    assert (await (await rig.conn.execute(legacy_store.EVENT_LEGACY_CLAIM_BATCH, params)).fetchall()) == []


async def test_an_authority_change_waits_for_claim_transactions_in_flight(rig: Rig) -> None:
    await rig.install()
    await rig.deliver("ok")
    async with await psycopg.AsyncConnection.connect(rig.url) as claimer:  # not autocommit
        rows = await work_items.claim.work_item_claim_batch(
            claimer, [rig.pack], ["default"], [10], owner="x", lease_s=30
        )
        assert len(rows) == 1  # the claim transaction is still open, holding the authority FOR SHARE
        begin = asyncio.create_task(cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test"))
        await asyncio.sleep(0.3)
        assert not begin.done(), "rollback admission waits for the claim transaction"
        await claimer.commit()
        began = await asyncio.wait_for(begin, 10)
    assert began.phase == "rollback_fenced"
    assert began.changed
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert [b.code for b in blocked.value.blockers] == ["work_item_processing"], (
        "the claim it waited for counts"
    )


async def test_rollback_refused_while_an_item_had_a_prior_dispatch(rig: Rig) -> None:
    await rig.install(max_attempts=10)
    (retrying,) = await rig.deliver("retry")
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT state = 'retry' AND attempts >= 1 FROM connector_work_item WHERE event_id = %s",
            (retrying,),
        ),
        what="an item dispatched once and waiting to retry",
    )
    await rig.stop(wi)
    await rig.conn.execute("UPDATE connector_work_item SET state = 'retry' WHERE state = 'processing'")
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    dry = await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test", dry_run=True)
    assert [b.code for b in dry.blockers] == ["prior_dispatch"]
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert [b.code for b in blocked.value.blockers] == ["prior_dispatch"]
    assert await rig.authority() == ("none", "rollback_fenced")
    assert await rig.scalar("SELECT count(*) FROM connector_rollback_fence") == 0
    assert await rig.scalar("SELECT count(*) FROM connector_cutover_receipt WHERE kind = 'rollback'") == 0
    assert (
        await rig.scalar("SELECT state FROM connector_work_item WHERE event_id = %s", (retrying,)) == "retry"
    )


async def test_ambiguous_legacy_outcome_blocks_recutover_until_resolved(rig: Rig) -> None:
    await rig.install()
    unsure, fine = await rig.deliver("unknown", "ok")
    await _rollback(rig)
    lx = await rig.legacy_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 2 FROM connector_event WHERE event_id = ANY(%s)"
            " AND legacy_state IN ('unknown', 'succeeded')",
            ([unsure, fine],),
        ),
        what="legacy outcomes written",
    )
    await rig.stop(lx)
    await legacy.legacy_outcome_project(rig.conn)
    state, version, _ = (await rig.work_items([unsure]))[unsure]
    assert (state, version) == ("awaiting_legacy_outcome", 1), "unknown stays non-executable, stamped"
    assert await rig.scalar(
        "SELECT outcome FROM connector_legacy_outcome_receipt WHERE event_id = %s", (unsure,)
    ) == ("unknown")
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert {b.code for b in blocked.value.blockers} == {"legacy_outcome_unknown", "rollback_fence_unresolved"}
    assert await _work_item_claims(rig) == (0, 0)

    with pytest.raises(LegacyOutcomeError) as refused:
        await legacy_outcome_resolve(
            rig.conn, event_id=fine, work_type="sync", outcome="failed", reason="checked", actor="key:op"
        )
    assert refused.value.reason == "not_unknown", "a confirmed outcome is never rewritten"
    resolved = await legacy_outcome_resolve(
        rig.conn,
        event_id=unsure,
        work_type="sync",
        outcome="succeeded",
        reason="order 42 exists in the target system (checked by ops)",
        actor="key:op",
    )
    assert (resolved.version, resolved.event_legacy_state) == (2, "succeeded")
    assert (await rig.work_items([unsure]))[unsure][:2] == ("reconciled_legacy_terminal", 2)
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert cut.phase == "work_item_active"
    assert cut.proof is not None and cut.proof["rollback_fences"]["open"] == 0


async def test_final_attempt_that_lost_its_lease_is_unknown_not_retried(rig: Rig) -> None:
    await rig.install(max_attempts=1)
    (event_id,) = await rig.deliver("ok")
    await _rollback(rig)
    # A holder claims with a short lease and dies: its only allowed attempt has an unknown outcome.
    token = await _legacy_lease(rig, owner="dead-holder", lease_s=0.2)
    params = {
        "pack": rig.pack, "generation": rig.generation, "owner": "dead-holder", "lease_token": token,
        "limit": 10, "lease_s": 0.2,
    }  # fmt: skip
    assert len(await (await rig.conn.execute(legacy_store.EVENT_LEGACY_CLAIM_BATCH, params)).fetchall()) == 1
    lx = await rig.legacy_executor(lease_s=1.0)
    await wait_until(
        lambda: rig.scalar(
            "SELECT legacy_state = 'unknown' FROM connector_event WHERE event_id = %s", (event_id,)
        ),
        what="the reclaimed final attempt is recorded as unknown",
    )
    await rig.stop(lx)
    row = await rig.rows(
        "SELECT outcome, failure_class FROM connector_legacy_outcome_receipt WHERE event_id = %s", (event_id,)
    )
    assert row == [("unknown", "lease_lost_final_attempt")]
    assert await rig.effects() == {}, "the handler never ran a second time"


async def test_abort_of_a_quiesce_fences_work_items_created_meanwhile(rig: Rig) -> None:
    await rig.install()
    await rig.deliver("ok")
    await _rollback(rig)
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    (meanwhile,) = await rig.deliver("ok")
    assert (await rig.work_items([meanwhile]))[meanwhile][0] == "pending"
    back = await cutover.transition_abort(rig.conn, rig.pack, rig.generation, actor="test")
    assert (back.claim_path, back.phase, back.receipt_kind, back.fenced_work_items) == (
        "legacy_event", "legacy_active", "rollback", 1,
    )  # fmt: skip
    assert (await rig.work_items([meanwhile]))[meanwhile][0] == "awaiting_legacy_outcome"
    assert (await rig.events([meanwhile]))[meanwhile] == ("legacy_event", "pending")
    lx = await rig.legacy_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 0 FROM connector_work_item WHERE state = 'awaiting_legacy_outcome'"
        ),
        what="legacy path finishes both fences",
    )
    await rig.stop(lx)
    assert await rig.scalar("SELECT count(*) FROM connector_rollback_fence WHERE status = 'resolved'") == 2
    with pytest.raises(cutover.CutoverError) as wrong:
        await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert wrong.value.reason == "wrong_phase", "cutover starts from quiescing only"
