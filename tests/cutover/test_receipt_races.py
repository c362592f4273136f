"""A legacy outcome receipt committed while the cutover transaction runs (a legacy executor still
finishing an event after the quiesce: finalizes are not gated by the phase) is a wait
(``legacy_receipt_unprojected``), not an ambiguity: ``legacy_receipt_conflict`` names only receipts
the cutover's own projection read and found contradicting. Found by tests/cutover/test_live_paths.py
(issue #28 item 1), where the old count reported such receipts as conflicts while legacy leases were
still active; here the finalize is placed right after the cutover's projection on purpose. Control
(kept): ``test_control_the_previous_count_calls_it_a_conflict``."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from connector.executor import cutover
from connector.executor.cutover import proofs
from connector.executor.cutover.authority import Blocker

from .conftest import Rig
from .test_receipts import _claim, _finalize, _rollback


async def test_a_receipt_written_during_the_cutover_is_a_wait_not_a_conflict(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await receipt_written_during_the_cutover(rig, monkeypatch)


async def test_control_the_previous_count_calls_it_a_conflict(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: gate 5 as it was before f7fed7c, counting every unprojected receipt as a conflict
    (``legacy_receipt_conflict`` with their number): the check above fails on it."""
    real = proofs.reconciliation_proof

    async def previous_count(conn: psycopg.AsyncConnection, locked: Any, blockers: list[Blocker]) -> Any:
        proof = await real(conn, locked, blockers)
        codes = ("legacy_receipt_conflict", "legacy_receipt_unprojected")
        unprojected = [b for b in blockers if b.code in codes]
        if unprojected:
            n = sum(b.count for b in unprojected)
            blockers[:] = [b for b in blockers if b.code not in codes]
            blockers.append(Blocker("legacy_receipt_conflict", n, "legacy outcome receipts contradict"))
        return proof

    monkeypatch.setattr(proofs, "reconciliation_proof", previous_count)
    with pytest.raises(AssertionError, match="legacy_receipt_conflict"):
        await receipt_written_during_the_cutover(rig, monkeypatch)


async def receipt_written_during_the_cutover(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    await rig.install()
    (fenced,) = await rig.deliver("ok")
    await _rollback(rig)
    (late,) = await rig.deliver("ok")  # legacy-owned, no WorkItem yet
    claimed = {e: token for e, token, _ in await _claim(rig, "legacy-test", 10)}
    assert set(claimed) == {fenced, late}
    await _finalize(rig, fenced, claimed[fenced])
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")

    real = proofs.legacy_outcome_project

    async def project_then_finish(conn: psycopg.AsyncConnection, **kw: object):  # type: ignore[no-untyped-def]
        report = await real(conn, **kw)  # type: ignore[arg-type]
        # The legacy executor finishes its last event now, on its own connection (committed).
        other = Rig(rig.url, await psycopg.AsyncConnection.connect(rig.url, autocommit=True))
        try:
            await _finalize(other, late, claimed[late])
        finally:
            await other.conn.close()
        return report

    monkeypatch.setattr(proofs, "legacy_outcome_project", project_then_finish)
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    codes = {b.code: b.count for b in blocked.value.blockers}
    # The event was in flight at the drain proof (so not backfilled either); its receipt is no conflict.
    assert codes == {
        "legacy_lease_active": 1,
        "legacy_receipt_unprojected": 1,
        "materialization_incomplete": 1,
    }, blocked.value.blockers
    assert await rig.authority() == ("none", "quiescing")

    monkeypatch.setattr(proofs, "legacy_outcome_project", real)
    cut = await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert cut.phase == "work_item_active"
    states = await rig.work_items([fenced, late])
    assert {e: s[0] for e, s in states.items()} == {
        fenced: "reconciled_legacy_terminal",
        late: "reconciled_legacy_terminal",
    }, "the receipt written during the first attempt was projected, never a conflict"
