"""The operator surface: ``connector admin cutover …`` over the real AdminService — what each gate
prints, blockers with nothing changed, roles, abort, reconcile, resolve refusals, and the state
``cutover status`` shows."""

from __future__ import annotations

import asyncio
import json

import pytest

from connector.cli import main as cli_main

from .conftest import OPERATOR_TOKEN, VIEW_TOKEN, Rig, wait_until


@pytest.fixture
def cli(admin_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("CONNECTOR_ADMIN_ADDRESS", f"127.0.0.1:{admin_port}")

    async def run(*argv: str, token: str = OPERATOR_TOKEN, group: str = "cutover") -> tuple[int, str, str]:
        monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", token)
        capsys.readouterr()
        code = await asyncio.to_thread(cli_main.main, ["admin", *group.split(), *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def test_operator_runs_rollback_and_recutover_from_the_cli(rig: Rig, cli) -> None:
    await rig.install()
    pending = await rig.deliver("ok", "ok")

    code, out, _ = await cli("rollback", "--pack", "shop", "--dry-run")
    assert code == 0, out
    assert "would become legacy_event/legacy_active" in out
    assert await rig.authority() == ("work_item", "work_item_active"), "a dry run changes nothing"

    code, out, err = await cli("quiesce", "--pack", "shop", token=VIEW_TOKEN)
    assert code == 1 and "PERMISSION_DENIED ROLE_REQUIRED" in err

    code, out, _ = await cli("rollback", "--pack", "shop")
    assert code == 0, out
    assert "WorkItem claim admission disabled" in out
    assert "is now legacy_event/legacy_active" in out
    assert "2 work items awaiting_legacy_outcome" in out
    assert "receipt rollback#" in out

    code, out, _ = await cli("status", "--pack", "shop", "--json")
    (g,) = json.loads(out)["generations"]
    assert (g["claim_path"], g["phase"], g["awaiting_legacy_outcome"], g["legacy_pending"]) == (
        "CLAIM_PATH_LEGACY_EVENT", "CUTOVER_PHASE_LEGACY_ACTIVE", "2", "2",
    )  # fmt: skip
    assert int(g["rollback_fence_id"]) > 0 and int(g["admitting_receipt_id"]) > 0

    # Quiesced before the legacy path ran anything: the cutover is blocked, nothing changes.
    code, out, _ = await cli("quiesce", "--pack", "shop")
    assert code == 0 and "is now none/quiescing" in out
    code, out, _ = await cli("cutover", "--pack", "shop")
    assert code == 1
    assert "cutover blocked (nothing changed):" in out
    assert "awaiting_legacy_outcome (2):" in out
    assert await rig.authority() == ("none", "quiescing")
    code, out, _ = await cli("cutover", "--pack", "shop", "--dry-run")
    assert code == 1 and "cutover: would be blocked:" in out

    # Abort the quiesce, let the legacy path finish, reconcile, re-cutover.
    code, out, _ = await cli("abort", "--pack", "shop")
    assert code == 0 and "is now legacy_event/legacy_active" in out
    lx = await rig.legacy_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 2 FROM connector_work_item WHERE event_id = ANY(%s)"
            " AND state = 'reconciled_legacy_terminal'",
            (pending,),
        ),
        what="legacy path reconciles both",
    )
    await rig.stop(lx)
    code, out, _ = await cli("reconcile", "--pack", "shop")
    assert code == 0 and "0 conflicts" in out

    code, out, err = await cli("resolve", str(pending[0]), "sync", "failed", "--reason", "checked")
    assert code == 1 and "FAILED_PRECONDITION LEGACY_OUTCOME_NOT_UNKNOWN" in err, (out, err)

    code, out, _ = await cli("quiesce", "--pack", "shop")
    assert code == 0
    code, out, _ = await cli("cutover", "--pack", "shop", "--wait", "10")
    assert code == 0, out
    assert "is now work_item/work_item_active" in out
    assert "receipt cutover#" in out
    assert "historical mirror: 2 reconciled_legacy_terminal work items" in out

    code, out, _ = await cli("cutover", "--pack", "shop")
    assert code == 0 and "already is work_item/work_item_active" in out, "a repeat is idempotent"
    code, out, err = await cli("quiesce", "--pack", "shop")
    assert code == 1 and "FAILED_PRECONDITION CUTOVER_WRONG_PHASE" in err


async def test_legacy_dead_letters_and_operator_resolution(rig: Rig, cli) -> None:
    from connector.executor import cutover

    await rig.install()
    failing, unsure, fine = await rig.deliver("fail", "unknown", "ok")
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")
    lx = await rig.legacy_executor()
    await wait_until(
        lambda: rig.scalar(
            "SELECT count(*) = 3 FROM connector_event WHERE event_id = ANY(%s)"
            " AND legacy_state IN ('failed', 'unknown', 'succeeded')",
            ([failing, unsure, fine],),
        ),
        what="legacy outcomes",
    )
    await rig.stop(lx)

    code, out, _ = await cli("--pack", "shop", group="dlq legacy")
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()[1:]]
    assert sorted((int(r[0]), r[2], r[4]) for r in rows) == sorted(
        [(unsure, "unknown", "outcome_unknown"), (failing, "failed", "permanent_test")]
    )

    code, out, _ = await cli(
        "resolve", str(unsure), "sync", "failed", "--reason", "no order in the target (ops)"
    )
    assert code == 0, out
    assert "confirmed failed (receipt version 2)" in out and "work item reconciled_legacy_terminal" in out
    code, out, _ = await cli("--pack", "shop", "--json", group="dlq legacy")
    latest = {int(f["event"]["event_id"]): f for f in json.loads(out)["failures"]}
    assert latest[unsure]["version"] == 2 and latest[unsure]["failure_class"] == "operator_confirmed_failed"
    assert latest[unsure]["actor"].startswith("key:")
    assert fine not in latest
