"""Gate 4 measured from the process registry (issue #28 item 2, docs/cutover.md "Rolling back").

A WorkItem executor's ``connector_process`` row names the admitting receipts it claims under
(``admitted_receipt_ids``); the claim statements admit a generation for it only while its row names
that exact receipt. Rollback counts the live executors naming a receipt of the generation as its
claim-capable processes, waits for them to drop it, and refuses with ``work_item_claimer_running``.

* statement level: a registered process whose row does not name the receipt claims nothing of the
  generation (control: the same statement without a process claims it); an admission round names it
  and the claim takes the item; a round during ``rollback_fenced`` drops it;
* real processes: ``connector executor`` A runs through a rollback (it drops the generation within
  the rollback's wait), B is started mid-rollback and never names it (it holds off), C is the same
  process with a broken admission round (``CONNECTOR_TEST_ADMISSION_IGNORES_PHASE``, the control): the
  rollback refuses naming C and changes nothing; C killed (-9), the rollback passes once C's heartbeat
  is stale and records it; the legacy path runs what was fenced (no WorkItem effect on it); after
  re-cutover A and B name the new receipt (gate 3) and run new work.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from connector.common.store import processes, work_items
from connector.executor import cutover
from tests.executor.helpers import ExecutorProcess

from .conftest import ROOT, Rig, wait_until

CONTROLS = ROOT / "tests" / "executor" / "controls"
STALE_S = 12.0  # > the CLI executor's 5 s heartbeat, with room for a late beat on a loaded machine


async def _receipt(rig: Rig) -> int:
    return int(
        await rig.scalar(
            "SELECT cutover_receipt_id FROM connector_claim_authority WHERE installed_pack_id = %s"
            " AND generation = %s",
            (rig.pack, rig.generation),
        )
    )


async def _admitted(rig: Rig, pid: int) -> list[int] | None:
    row = await rig.rows("SELECT admitted_receipt_ids FROM connector_process WHERE pid = %s", (pid,))
    return None if not row else [int(x) for x in row[0][0]]


async def test_claim_admission_gates_the_claim_statement(rig: Rig) -> None:
    await rig.install()
    (event,) = await rig.deliver("ok")
    receipt = await _receipt(rig)
    pid = "gate4-process"
    await processes.process_register(
        rig.conn,
        {"process_id": pid, "service": "executor", "hostname": "h", "pid": 1, "version": "t", "revision": "",
         "capability": "work_item"},
    )  # fmt: skip

    async def claim(process: str | None) -> list[Any]:
        return await work_items.claim.work_item_claim_plain_batch(
            rig.conn, [rig.pack], ["default"], [8], owner=pid, lease_s=30, keyed={}, process=process
        )

    assert await claim(pid) == [], "a process whose row does not name the receipt claims nothing"
    async with rig.conn.transaction(force_rollback=True):  # control: the ungated statement claims it
        assert [r[6] for r in await claim(None)] == [event]
    assert await processes.process_admit(rig.conn, pid) == [receipt]
    assert await processes.process_admit(rig.conn, pid) is None, "unchanged: the row is not written"
    async with rig.conn.transaction(force_rollback=True):
        assert [r[6] for r in await claim(pid)] == [event]

    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    assert await processes.process_admit(rig.conn, pid) == []
    assert await claim(pid) == []
    listed = await processes.process_list_admitting(
        rig.conn, installed_pack_id=rig.pack, generation=rig.generation, stale_s=30
    )
    assert listed == []


def _spawn(rig: Rig, procs: list[ExecutorProcess], *, broken: bool = False) -> ExecutorProcess:
    env = {"CONNECTOR_EXECUTOR_WORKERS": "4", "CONNECTOR_LOG_LEVEL": "INFO"}
    if broken:
        env["CONNECTOR_TEST_ADMISSION_IGNORES_PHASE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(CONTROLS), str(ROOT)])
    p = ExecutorProcess(rig.url, extra_env=env)
    procs.append(p)
    return p


async def _started(p: ExecutorProcess) -> None:
    async def check() -> bool:
        if p.proc.poll() is not None:
            raise AssertionError(f"executor exited ({p.proc.returncode}): {p.log_tail()}")
        return "executor started" in Path(p.stderr_path).read_text()

    await wait_until(check, timeout=60, what="the executor started (admission round done, engine claiming)")


@pytest.mark.slow
async def test_rollback_counts_live_claim_capable_processes_and_a_process_started_mid_rollback_holds_off(
    rig: Rig,
) -> None:
    await rig.install()
    procs: list[ExecutorProcess] = []
    try:
        await _body(rig, procs)
    finally:
        for p in procs:
            p.stop()


async def _body(rig: Rig, procs: list[ExecutorProcess]) -> None:
    install_receipt = await _receipt(rig)
    a = _spawn(rig, procs)
    await _started(a)
    assert await _admitted(rig, a.pid) == [install_receipt]
    before = await rig.deliver("ok", "ok")
    await wait_until(lambda: rig.scalar("SELECT count(*) = 2 FROM cutover_test_effect WHERE wi_held"))

    # Rollback starts: A drops the generation on the notification.
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    await wait_until(
        lambda: rig.scalar(
            "SELECT admitted_receipt_ids = '{}' FROM connector_process WHERE pid = %s", (a.pid,)
        ),
        what="A dropped the generation from its claim admission",
    )
    # B (a good build) and C (the control: its admission ignores the phase) start mid-rollback.
    b, c = _spawn(rig, procs), _spawn(rig, procs, broken=True)
    await _started(b)
    await _started(c)
    assert await _admitted(rig, b.pid) == [], "B, started during the rollback, holds off the generation"
    assert await _admitted(rig, c.pid) == [install_receipt], "the control names it"
    during = await rig.deliver("ok", "ok")  # WorkItems not executable until fenced or admitted

    with pytest.raises(cutover.CutoverBlocked) as refused:
        await cutover.rollback_complete(
            rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=STALE_S, claimers_wait_s=1.0
        )
    (blocker,) = refused.value.blockers
    assert (blocker.code, blocker.count) == ("work_item_claimer_running", 1)
    assert f":{c.pid} " in blocker.message and f":{b.pid} " not in blocker.message
    assert f":{a.pid} " not in blocker.message
    # Nothing changed.
    assert await rig.authority() == ("none", "rollback_fenced")
    assert await rig.scalar("SELECT count(*) FROM connector_cutover_receipt WHERE kind = 'rollback'") == 0
    assert await rig.scalar("SELECT count(*) FROM connector_rollback_fence") == 0
    assert (
        await rig.scalar(
            "SELECT count(*) FROM connector_work_item WHERE event_id = ANY(%s) AND state = 'pending'",
            (during,),
        )
        == 2
    )

    # C killed: it stops counting once its heartbeat is stale; the rollback (retried) then passes.
    c_id = str(await rig.scalar("SELECT process_id FROM connector_process WHERE pid = %s", (c.pid,)))
    os.kill(c.pid, signal.SIGKILL)
    c.proc.wait(10)

    async def complete() -> cutover.Transition | None:
        try:
            return await cutover.rollback_complete(
                rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=STALE_S, claimers_wait_s=0
            )
        except cutover.CutoverBlocked as exc:
            assert {x.code for x in exc.blockers} == {"work_item_claimer_running"}, exc.blockers
            await asyncio.sleep(0.5)
            return None

    done = await wait_until(complete, timeout=STALE_S + 30, what="the rollback once C is stale")
    zero = done.proof["zero_work_item_claimers"]
    assert zero["claim_capable_processes_for_generation"] == 0
    assert [s["process_id"] for s in zero["stale_processes_naming_the_generation"]] == [c_id]
    assert zero["work_item_processes_fresh_any_pack"] >= 2  # A and B were live and counted out
    assert done.fenced_work_items == 2
    assert await _admitted(rig, b.pid) == [] and await _admitted(rig, a.pid) == []

    # The legacy path runs what was fenced; no WorkItem executor touched it.
    legacy = rig.legacy_process()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 2 FROM connector_work_item WHERE event_id = ANY(%s)"
            " AND state = 'reconciled_legacy_terminal'",
            (during,),
        ),
        timeout=60,
        what="the fenced WorkItems reconciled from legacy outcomes",
    )
    effects = await rig.effects()
    assert [effects[(e, "sync")] for e in during] == [[(False, True)], [(False, True)]]
    assert [effects[(e, "sync")] for e in before] == [[(True, False)], [(True, False)]]

    # Re-cutover: every live executor names the new receipt (gate 3) and runs new work.
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    assert await legacy.wait_exit() == 0, legacy.log()
    cut = await cutover.cutover_complete(
        rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=STALE_S
    )
    assert cut.receipt_id is not None and cut.receipt_id != install_receipt
    for p in (a, b):
        await wait_until(
            lambda p=p: rig.scalar(
                "SELECT admitted_receipt_ids = ARRAY[%s]::bigint[] FROM connector_process WHERE pid = %s",
                (cut.receipt_id, p.pid),
            ),
            what="the executor names the cutover receipt",
        )
    after = await rig.deliver("ok", "ok", "ok", "ok")
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 4 FROM cutover_test_effect WHERE event_id = ANY(%s) AND wi_held", (after,)
        ),
        timeout=60,
        what="new work run on the WorkItem path",
    )
