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

Controls, kept and run with every refusal (``fails_on_broken_builds``): the same refusal check runs
first against two broken builds, in a transaction rolled back after it — the proof that raises the
blocker renames it (``renamed``), or never raises it (``removed``: the gate then passes, or refuses for
other reasons only) — and must fail there; the cause removed, the gate must pass (a blocker that fired
for another reason would keep refusing). The quiesce test's control
(``test_control_a_legacy_claim_without_for_share_is_not_waited_for``) runs its body against a legacy
claim statement whose authority read lacks ``FOR SHARE``: the quiesce then takes the authority row at
once and waits on the scheduler lease instead, which the test reports.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from connector.common.store import authority
from connector.common.store import legacy as legacy_store
from connector.executor import cutover
from connector.executor.admin.replay import work_item_replay
from connector.executor.cutover import forward, proofs, rollback
from connector.executor.cutover.authority import Blocker

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


# Every proof that appends blockers, where the transitions look it up (module, attribute).
PROOFS = (
    (proofs, "legacy_drain_proof"),
    (proofs, "reconciliation_proof"),
    (proofs, "materialization_proof"),
    (proofs, "work_item_idle_proof"),
    (forward, "schema_proof"),
    (rollback, "schema_proof"),
)
MUTATIONS = ("renamed", "removed")


@contextmanager
def broken_build(code: str, mutation: str) -> Iterator[list[str]]:
    """A build whose proof renames blocker ``code`` (``renamed``) or never raises it (``removed``):
    each proof's blockers are rewritten as they leave it, as if its ``Blocker(code, ...)`` line had been
    edited. Yields the list of proofs the mutation hit (a control that hit nothing proves nothing)."""
    hit: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        for module, name in PROOFS:
            real = getattr(module, name)

            async def mutated(*args: Any, _real: Any = real, _name: str = name) -> Any:
                result = await _real(*args)
                blockers: list[Blocker] = args[-1]
                if any(b.code == code for b in blockers):
                    hit.append(_name)
                if mutation == "renamed":
                    blockers[:] = [Blocker(f"{code}_renamed", b.count, b.message) if b.code == code else b
                                   for b in blockers]  # fmt: skip
                else:
                    blockers[:] = [b for b in blockers if b.code != code]
                return result

            mp.setattr(module, name, mutated)
        yield hit


async def fails_on_broken_builds(rig: Rig, code: str, check: Callable[[], Awaitable[Any]]) -> None:
    """The control of a refusal ``check``: against each broken build (``broken_build``) it must fail,
    the build's effects rolled back with the transaction it runs in (nothing kept)."""
    before = await snapshot(rig)
    for mutation in MUTATIONS:
        with broken_build(code, mutation) as hit:
            with pytest.raises((AssertionError, pytest.fail.Exception)):
                async with rig.conn.transaction(force_rollback=True):
                    await check()
        assert hit, f"the {mutation} build never met {code}: the control proves nothing"
    assert await snapshot(rig) == before, "the controls ran in a rolled-back transaction"


async def _rollback(rig: Rig) -> cutover.Transition:
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    return await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")


async def _refused(rig: Rig, code: str, gate: Callable[[], Awaitable[Any]]) -> cutover.CutoverBlocked:
    """The real ``gate`` refuses naming ``code`` and changes nothing — after the same check failed on
    the broken builds (its control)."""

    async def check() -> cutover.CutoverBlocked:
        before = await snapshot(rig)
        with pytest.raises(cutover.CutoverBlocked) as blocked:
            await gate()
        assert code in {b.code for b in blocked.value.blockers}, blocked.value
        assert code in str(blocked.value), "the refusal's one line names the blocker"
        assert await snapshot(rig) == before, "a refused transition changes nothing"
        return blocked.value

    await fails_on_broken_builds(rig, code, check)
    return await check()


async def _cutover_refused(rig: Rig, code: str, **kw: Any) -> cutover.CutoverBlocked:
    return await _refused(
        rig, code, lambda: cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test", **kw)
    )


async def _rollback_refused(rig: Rig, code: str) -> cutover.CutoverBlocked:
    return await _refused(
        rig, code, lambda: cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    )


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


async def quiesce_waits_for_the_claim(rig: Rig) -> None:
    """A legacy claim transaction open on its own connection, as the legacy executor runs it (the
    scheduler lease taken and committed beforehand by its tick): the quiesce waits *on the authority
    row* for it, changes nothing meanwhile, and the claim it waited for blocks the cutover."""
    await rig.install()
    (event_id,) = await rig.deliver("ok")
    await _rollback(rig)
    quiesce_pid = rig.conn.info.backend_pid
    lease = {"pack": rig.pack, "generation": rig.generation, "owner": "claimer", "lease_s": 30.0}
    token = await authority.scheduler_lease_acquire(rig.conn, lease)
    assert token is not None
    claim = {**lease, "lease_token": token, "limit": 10}
    quiesce: asyncio.Task[cutover.Transition] | None = None
    try:
        async with (
            await psycopg.AsyncConnection.connect(rig.url) as claimer,  # not autocommit: one transaction
            await psycopg.AsyncConnection.connect(rig.url, autocommit=True) as observer,
        ):
            rows = await legacy_store.event_legacy_claim_batch(claimer, claim)
            assert len(rows) == 1  # the claim transaction is open, holding the authority row FOR SHARE
            claimer_pid = claimer.info.backend_pid

            quiesce = asyncio.create_task(
                cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
            )

            async def waiting() -> tuple[str, str, list[int]] | None:
                cur = await observer.execute(
                    "SELECT wait_event_type, query, pg_blocking_pids(pid) FROM pg_stat_activity"
                    " WHERE pid = %s",
                    (quiesce_pid,),
                )
                row = await cur.fetchone()
                return row if row is not None and row[0] == "Lock" else None

            wait = await wait_until(waiting, what="the quiesce waits for the claim transaction")
            assert not quiesce.done()
            _, query, blocking = wait
            assert blocking == [claimer_pid], "the claim transaction is what the quiesce waits for"
            assert "FROM connector_claim_authority a" in query and "FOR UPDATE OF a" in query, (
                f"the quiesce waits on the authority row (CLAIM_AUTHORITY_LOCK), not in {query!r}"
            )
            cur = await observer.execute(
                "SELECT claim_path, phase FROM connector_claim_authority WHERE installed_pack_id = %s"
                " AND generation = %s",
                (rig.pack, rig.generation),
            )
            assert await cur.fetchone() == ("legacy_event", "legacy_active"), "nothing changed while it waits"
            await claimer.commit()
            quiesced = await asyncio.wait_for(quiesce, 15)
    finally:
        if quiesce is not None:  # a failed check: the closed claimer lets it finish
            await asyncio.wait_for(asyncio.gather(quiesce, return_exceptions=True), 15)
    assert (quiesced.phase, quiesced.changed) == ("quiescing", True)
    # The claim it waited for committed before the phase change: it counts against the cutover.
    assert (await rig.events([event_id]))[event_id] == ("legacy_event", "processing")
    refused = await _cutover_refused(rig, "legacy_lease_active")
    assert str(event_id) in json.dumps([b.message for b in refused.blockers])
    # The claimer's lease is gone with the quiesce (revoked) and a new claim is refused.
    assert await legacy_store.event_legacy_claim_batch(rig.conn, claim) == []


async def test_quiesce_waits_for_a_legacy_claim_transaction_in_flight(rig: Rig) -> None:
    await quiesce_waits_for_the_claim(rig)


async def test_control_a_legacy_claim_without_for_share_is_not_waited_for(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the legacy claim statement's authority read without ``FOR SHARE``. The quiesce then
    locks the authority row at once (proving nothing about claims in flight) and waits on the
    scheduler lease row instead: the check above reports it."""
    shared = authority.LEGACY_AUTHORITY
    assert "FOR SHARE" in shared and shared in legacy_store.EVENT_LEGACY_CLAIM_BATCH
    monkeypatch.setattr(
        legacy_store,
        "EVENT_LEGACY_CLAIM_BATCH",
        legacy_store.EVENT_LEGACY_CLAIM_BATCH.replace(shared, shared.replace("FOR SHARE", "")),
    )
    with pytest.raises(AssertionError, match="the quiesce waits on the authority row"):
        await quiesce_waits_for_the_claim(rig)
