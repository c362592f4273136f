"""Every gate blocker fires for real (issue #28 item 3).

Each test provokes one blocker with real database state, real transactions or a real process (where
the blocker is about one), asserts that the refusal names it, that *nothing changed* (authority row,
receipts, fences, WorkItems, Event ownership and the scheduler lease are byte-for-byte as before —
``snapshot``), then removes the cause and asserts that the same gate passes:

* ``materialization_incomplete`` — a legacy-owned Event whose receipt body was offloaded (no inline
  body): the cutover's backfill cannot build its WorkItems; restoring the body lets the cutover pass;
* ``claim_schema_mismatch`` — the database's Alembic revision is not the code's head (a database of
  another release): rollback and cutover both refuse; back at the head both pass;
* ``scheduler_lease_active`` — a custom/pinned caller (the contract's retained compatibility surface)
  took the scheduler lease without the authority guard after the quiesce revoked it; released, the
  cutover passes;
* ``legacy_lease_orphaned`` — a real ``connector executor --claim-path event`` process killed with
  SIGKILL while its handler runs: its Event stays ``processing`` under an expired lease whose holder is
  gone; abort, a legacy executor reclaims and finishes it, quiesce, the cutover passes;
* ``cross_generation_item`` — a dead WorkItem of generation 1 replayed into generation 2 (the real
  replay) and not yet run: rollback of generation 2 refuses; abort, the WorkItem path runs it, the
  rollback passes;
* quiesce waits for a legacy claim transaction in flight — a real claim transaction (scheduler lease
  and ``EVENT_LEGACY_CLAIM_BATCH``) open on its own connection: the quiesce's backend waits on the
  authority row lock (``pg_stat_activity``), the authority is unchanged until the claim commits, and
  the claim it waited for then blocks the cutover as ``legacy_lease_active``.

Controls: every test first asserts the refusal (a build where the blocker did not fire fails there),
and then that the gate passes once the cause is gone (a blocker that fired for another reason would
keep refusing).
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import psycopg
import pytest

from connector.common.store import authority
from connector.common.store import legacy as legacy_store
from connector.executor import cutover
from connector.executor.admin.replay import work_item_replay

from .conftest import Rig, wait_until

# The scheduler lease as a custom/pinned NewWorker caller takes it: the same upsert as
# ``authority.SCHEDULER_LEASE_ACQUIRE`` without the ``legacy_active`` authority guard (the contract's
# retained compatibility surface, which this runtime's own statements never are).
UNGUARDED_LEASE_ACQUIRE = """
INSERT INTO connector_scheduler_lease AS s (installed_pack_id, generation, holder, token, lease_until)
VALUES (%(pack)s, %(generation)s, %(owner)s, 1, clock_timestamp() + interval '10 minutes')
ON CONFLICT (installed_pack_id, generation) DO UPDATE
SET holder = EXCLUDED.holder, token = s.token + 1, lease_until = EXCLUDED.lease_until
"""


async def snapshot(rig: Rig) -> dict[str, Any]:
    """Everything a gate may change, for "nothing changed" comparisons."""

    async def table(sql: str) -> list[tuple[Any, ...]]:
        return await rig.rows(sql, {"pack": rig.pack})

    return {
        "authority": await table(
            "SELECT generation, claim_path, phase, version, cutover_receipt_id, rollback_fence_id"
            " FROM connector_claim_authority WHERE installed_pack_id = %(pack)s ORDER BY generation"
        ),
        "receipts": await table(
            "SELECT cutover_receipt_id, kind FROM connector_cutover_receipt"
            " WHERE installed_pack_id = %(pack)s ORDER BY 1"
        ),
        "fences": await table(
            "SELECT fence_id, status, fenced_work_items FROM connector_rollback_fence"
            " WHERE installed_pack_id = %(pack)s ORDER BY 1"
        ),
        "work_items": await table(
            "SELECT work_id, event_id, work_type, generation, state, attempts, rollback_execution_fence_id"
            " FROM connector_work_item WHERE installed_pack_id = %(pack)s ORDER BY work_id"
        ),
        "events": await table(
            "SELECT event_id, execution_owner, legacy_state, legacy_lease_token"
            " FROM connector_event WHERE installed_pack_id = %(pack)s ORDER BY event_id"
        ),
        "scheduler_lease": await table(
            "SELECT generation, holder, token FROM connector_scheduler_lease"
            " WHERE installed_pack_id = %(pack)s ORDER BY generation"
        ),
    }


async def _rollback(rig: Rig) -> cutover.Transition:
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    return await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")


async def _cutover_refused(rig: Rig, code: str, **kw: Any) -> cutover.CutoverBlocked:
    """The real cutover refuses naming ``code``; nothing changed."""
    before = await snapshot(rig)
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test", **kw)
    assert code in {b.code for b in blocked.value.blockers}, blocked.value
    assert code in str(blocked.value), "the refusal's one line names the blocker"
    assert await snapshot(rig) == before, "a refused cutover changes nothing"
    return blocked.value


async def _rollback_refused(rig: Rig, code: str) -> cutover.CutoverBlocked:
    before = await snapshot(rig)
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert code in {b.code for b in blocked.value.blockers}, blocked.value
    assert code in str(blocked.value)
    assert await snapshot(rig) == before, "a refused rollback changes nothing"
    return blocked.value


# --------------------------------------------------------------------------------------------------


async def test_materialization_incomplete_until_the_body_is_back(rig: Rig) -> None:
    await rig.install()
    await _rollback(rig)
    # A delivery while the legacy path owns the generation: a legacy-owned Event, no WorkItem row.
    (event_id,) = await rig.deliver("ok")
    assert (await rig.events([event_id]))[event_id] == ("legacy_event", "pending")
    assert await rig.work_items([event_id]) == {}
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    # Its body is offloaded (no inline copy): the backfill cannot re-extract its WorkItems.
    receipt_id = await rig.scalar("SELECT receipt_id FROM connector_event WHERE event_id = %s", (event_id,))
    body = await rig.scalar("SELECT body FROM connector_ingress_receipt WHERE receipt_id = %s", (receipt_id,))
    await rig.conn.execute(
        "UPDATE connector_ingress_receipt SET body = NULL, body_ref = 'offload://gone' WHERE receipt_id = %s",
        (receipt_id,),
    )

    refused = await _cutover_refused(rig, "materialization_incomplete")
    (b,) = [b for b in refused.blockers if b.code == "materialization_incomplete"]
    assert b.count == 1
    assert str(event_id) in b.message and "body_unavailable" in b.message, b.message
    assert await rig.authority() == ("none", "quiescing")

    await rig.conn.execute(
        "UPDATE connector_ingress_receipt SET body = %s, body_ref = NULL WHERE receipt_id = %s",
        (body, receipt_id),
    )
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert (cut.phase, cut.receipt_kind) == ("work_item_active", "cutover")
    assert cut.proof is not None and cut.proof["materialization"]["backfilled_work_items"] == 1
    assert (await rig.work_items([event_id]))[event_id][0] == "pending"


async def test_claim_schema_mismatch_refuses_rollback_and_cutover(rig: Rig) -> None:
    await rig.install()
    events = await rig.deliver("ok", "ok")
    head = cutover.expected_schema_revision()

    async def set_revision(rev: str) -> None:
        await rig.conn.execute("UPDATE alembic_version SET version_num = %s", (rev,))

    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    await set_revision("0000_another_release")
    refused = await _rollback_refused(rig, "claim_schema_mismatch")
    assert "0000_another_release" in str(refused) and head in str(refused)
    assert {s for s, _, _ in (await rig.work_items(events)).values()} == {"pending"}
    await set_revision(head)
    rolled = await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert (rolled.phase, rolled.fenced_work_items) == ("legacy_active", 2)
    assert rolled.proof is not None and rolled.proof["claim_schema"]["alembic_revision"] == head

    lx = await rig.legacy_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 2 FROM connector_work_item WHERE event_id = ANY(%s)"
            " AND state = 'reconciled_legacy_terminal'",
            (events,),
        ),
        what="the legacy path finishes the fenced work",
    )
    await rig.stop(lx)
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    await set_revision("0000_another_release")
    await _cutover_refused(rig, "claim_schema_mismatch")
    await set_revision(head)
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert cut.phase == "work_item_active"


async def test_scheduler_lease_active_until_the_custom_caller_releases_it(rig: Rig) -> None:
    await rig.install()
    await rig.deliver("ok")
    await _rollback(rig)
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    params = {"pack": rig.pack, "generation": rig.generation, "owner": "custom-newworker"}
    async with await psycopg.AsyncConnection.connect(rig.url, autocommit=True) as custom:
        assert await authority.scheduler_lease_acquire(custom, {**params, "lease_s": 60}) is None, (
            "this runtime's own acquisition is refused outside legacy_active"
        )
        await custom.execute(UNGUARDED_LEASE_ACQUIRE, params)
        refused = await _cutover_refused(rig, "scheduler_lease_active")
        assert "scheduler lease" in refused.blockers[[b.code for b in refused.blockers].index(
            "scheduler_lease_active")].message  # fmt: skip
        await authority.scheduler_lease_release(custom, params)
    # The fenced item still awaits its legacy outcome: let the legacy path run it, then cut over.
    await cutover.transition_abort(rig.conn, rig.pack, rig.generation, actor="test")
    lx = await rig.legacy_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 0 FROM connector_work_item WHERE state = 'awaiting_legacy_outcome'"
        ),
        what="legacy path finishes the fence",
    )
    await rig.stop(lx)
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    params["owner"] = "custom-newworker-2"
    async with await psycopg.AsyncConnection.connect(rig.url, autocommit=True) as custom:
        await custom.execute(UNGUARDED_LEASE_ACQUIRE, params)
        await _cutover_refused(rig, "scheduler_lease_active")
        await authority.scheduler_lease_release(custom, params)
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert cut.proof is not None
    assert cut.proof["zero_old_claimers"]["scheduler_lease"]["active"] is False


async def test_legacy_lease_orphaned_by_a_killed_process(rig: Rig) -> None:
    await rig.install()
    (slow,) = await rig.deliver("slow")
    await _rollback(rig)
    proc = rig.legacy_process(CUTOVER_TEST_SLOW_S="600", CONNECTOR_EXECUTOR_WORKERS="1")
    await wait_until(
        lambda: rig.scalar(
            "SELECT legacy_state = 'processing' FROM connector_event WHERE event_id = %s", (slow,)
        ),
        what="the legacy process holds the event",
    )
    proc.proc.send_signal(signal.SIGKILL)
    assert await proc.wait_exit() == -signal.SIGKILL
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")

    # The lease expires (2 s) and the holder's heartbeat goes stale (1.5 s here): orphaned.
    async def orphaned() -> bool:
        dry = await cutover.cutover_complete(
            rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=1.5, dry_run=True
        )
        codes = {b.code for b in dry.blockers}
        return "legacy_lease_orphaned" in codes and not codes & {
            "legacy_lease_active",
            "legacy_process_running",
        }

    await wait_until(orphaned, timeout=30, what="the dead holder's lease expires")
    refused = await _cutover_refused(rig, "legacy_lease_orphaned", process_stale_s=1.5)
    (b,) = [b for b in refused.blockers if b.code == "legacy_lease_orphaned"]
    assert b.count == 1 and "abort" in b.message
    assert (await rig.events([slow]))[slow] == ("legacy_event", "processing")

    # The resolution the message names: abort, a legacy executor reclaims and finishes, quiesce.
    await cutover.transition_abort(rig.conn, rig.pack, rig.generation, actor="test")
    lx = await rig.legacy_executor(lease_s=2.0, reclaim_interval_s=0.3)
    await wait_until(
        lambda: rig.scalar(
            "SELECT legacy_state = 'succeeded' FROM connector_event WHERE event_id = %s", (slow,)
        ),
        timeout=30,
        what="the orphaned event reclaimed and finished",
    )
    await rig.stop(lx)
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    cut = await cutover.cutover_complete(
        rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=1.5
    )
    assert cut.phase == "work_item_active"
    # The killed attempt died in its handler before its effect; the reclaimed one ran it, on the
    # legacy path under its own lease.
    assert (await rig.effects())[(slow, "sync")] == [(False, True)]


async def test_cross_generation_item_blocks_rollback_until_it_ran(rig: Rig) -> None:
    await rig.install(max_attempts=1)
    (event_id,) = await rig.deliver("fail_once")
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar("SELECT state = 'dead' FROM connector_work_item WHERE event_id = %s", (event_id,)),
        what="the first attempt dies",
    )
    await rig.stop(wi)
    await rig.install(max_attempts=2)  # generation 2, active, WorkItem-owned (install receipt)
    assert rig.generation == 2
    async with rig.conn.transaction():
        work_id = await rig.scalar("SELECT work_id FROM connector_work_item WHERE event_id = %s", (event_id,))
        await work_item_replay(rig.conn, int(work_id), actor="test")
    assert await rig.rows(
        "SELECT generation, state, attempts FROM connector_work_item WHERE work_id = %s", (work_id,)
    ) == [(2, "pending", 0)], "replayed into generation 2, unstarted (no prior dispatch)"
    assert await rig.scalar("SELECT generation FROM connector_event WHERE event_id = %s", (event_id,)) == 1

    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    refused = await _rollback_refused(rig, "cross_generation_item")
    assert [b.code for b in refused.blockers] == ["cross_generation_item"]
    assert refused.blockers[0].count == 1

    await cutover.transition_abort(rig.conn, rig.pack, rig.generation, actor="test")
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT state = 'succeeded' FROM connector_work_item WHERE event_id = %s", (event_id,)
        ),
        what="the replay runs on generation 2",
    )
    await rig.stop(wi)
    rolled = await _rollback(rig)
    assert (rolled.phase, rolled.receipt_kind) == ("legacy_active", "rollback")


async def test_quiesce_waits_for_a_legacy_claim_transaction_in_flight(rig: Rig) -> None:
    await rig.install()
    (event_id,) = await rig.deliver("ok")
    await _rollback(rig)
    assert rig.conn.info.backend_pid
    async with (
        await psycopg.AsyncConnection.connect(rig.url) as claimer,  # not autocommit: one transaction
        await psycopg.AsyncConnection.connect(rig.url, autocommit=True) as observer,
    ):
        lease = {"pack": rig.pack, "generation": rig.generation, "owner": "claimer", "lease_s": 30.0}
        token = await authority.scheduler_lease_acquire(claimer, lease)
        assert token is not None
        claim = {**lease, "lease_token": token, "limit": 10}
        rows = await (await claimer.execute(legacy_store.EVENT_LEGACY_CLAIM_BATCH, claim)).fetchall()
        assert len(rows) == 1  # the claim transaction is open, holding the authority row FOR SHARE

        quiesce = asyncio.create_task(
            cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
        )

        async def quiesce_waits_on_the_lock() -> bool:
            cur = await observer.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (rig.conn.info.backend_pid,)
            )
            row = await cur.fetchone()
            return row is not None and row[0] == "Lock"

        await wait_until(quiesce_waits_on_the_lock, what="the quiesce waits for the claim transaction")
        assert not quiesce.done()
        cur = await observer.execute(
            "SELECT claim_path, phase FROM connector_claim_authority WHERE installed_pack_id = %s"
            " AND generation = %s",
            (rig.pack, rig.generation),
        )
        assert await cur.fetchone() == ("legacy_event", "legacy_active"), "nothing changed while it waits"
        await claimer.commit()
        quiesced = await asyncio.wait_for(quiesce, 15)
    assert (quiesced.phase, quiesced.changed) == ("quiescing", True)
    # The claim it waited for committed before the phase change: it counts against the cutover.
    assert (await rig.events([event_id]))[event_id] == ("legacy_event", "processing")
    refused = await _cutover_refused(rig, "legacy_lease_active")
    assert str(event_id) in json.dumps([b.message for b in refused.blockers])
    # The claimer's lease is gone with the quiesce (revoked) and a new claim is refused.
    rows = await (await rig.conn.execute(legacy_store.EVENT_LEGACY_CLAIM_BATCH, claim)).fetchall()
    assert rows == []
