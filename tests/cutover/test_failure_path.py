"""One failure read path per generation (issue #28 item 4; seed: "Failure, DLQ, And Replay Read
Path"): ``dlq list`` (ListDeadLetters) reads the failures of the claim path that owns the generation
— dead WorkItems while the WorkItem path owns it, the latest failed / unknown legacy outcomes once a
rollback receipt admits the legacy path (legacy_active, and quiescing on its way back), dead WorkItems
again after the re-cutover — never both; the operator surface keeps its command, RPC and roles
(``ViewConnectorEvents``). ``trace`` names the path that owns each WorkItem.

The real materializer, WorkItem executor, legacy executor, AdminService and CLI. Control (kept, in
the test): the rollback's first listing is the one the old read model got wrong (it kept showing the
WorkItem period's dead item beside ListLegacyFailures); the same listing check runs first against the
WorkItem read without its ownership clause (``WORK_ITEM_FAILURE_OWNED``) and must fail there.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from connector.cli import main as cli_main
from connector.common.store import work_items
from connector.executor import cutover
from connector.executor.legacy import legacy_outcome_resolve

from .conftest import VIEW_TOKEN, Rig, wait_until


@pytest.fixture
def cli(admin_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("CONNECTOR_ADMIN_ADDRESS", f"127.0.0.1:{admin_port}")
    monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", VIEW_TOKEN)  # the viewer's role, as before

    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(cli_main.main, ["admin", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def _dlq(cli: Any) -> list[tuple[str, int, str, str]]:
    """(path, event id, work type, failure class) of every dead letter, in the listing's order."""
    code, out, err = await cli("dlq", "list", "--all", "--json")
    assert code == 0, err
    out_rows = []
    for d in json.loads(out).get("dead_letters", []):
        path = d.get("claim_path", "")
        detail = d["legacy_failure"] if path == "legacy_event" else d["work_item"]
        out_rows.append((path, int(d["event"]["event_id"]), detail["work_type"], detail["failure_class"]))
    return out_rows


async def _trace_paths(cli: Any, event_ids: list[int], rig: Rig) -> dict[int, str]:
    """event id → the path ``trace`` names for its WorkItem."""
    out_paths: dict[int, str] = {}
    for event_id in event_ids:
        work_id = await rig.scalar("SELECT work_id FROM connector_work_item WHERE event_id = %s", (event_id,))
        code, out, err = await cli("trace", "--work-id", str(work_id), "--json")
        assert code == 0, err
        (event,) = json.loads(out)["events"]
        (item,) = event["work_items"]
        out_paths[event_id] = item.get("claim_path", "")
        code, out, err = await cli("trace", "--work-id", str(work_id))
        assert f"path {out_paths[event_id]}" in out
    return out_paths


async def test_the_dlq_follows_the_generations_claim_path(rig: Rig, cli: Any) -> None:
    await rig.install(max_attempts=1)
    (dead_wi,) = await rig.deliver("fail")
    wi = await rig.work_item_executor()
    await wait_until(
        lambda: rig.scalar("SELECT state = 'dead' FROM connector_work_item WHERE event_id = %s", (dead_wi,)),
        what="a dead WorkItem",
    )
    await rig.stop(wi)
    failing, unsure, fine = await rig.deliver("fail", "unknown", "ok")
    assert await _dlq(cli) == [("work_item", dead_wi, "sync", "permanent_test")]

    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    assert await _dlq(cli) == [("work_item", dead_wi, "sync", "permanent_test")], (
        "rollback_fenced: the WorkItem receipt still admits the generation"
    )
    await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")

    async def rollback_listing() -> None:  # the WorkItem period's dead item is no longer listed
        assert await _dlq(cli) == [], "legacy-owned: no legacy failure yet, and no WorkItem DLQ beside it"

    # Control: the same listing from a build whose WorkItem read lacks the ownership clause (the old
    # read model) shows the WorkItem period's dead item beside the legacy path's failures.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(work_items.admin, "WORK_ITEM_FAILURE_OWNED", "TRUE")
        with pytest.raises(AssertionError, match="no WorkItem DLQ beside it"):
            await rollback_listing()
    await rollback_listing()
    paths = await _trace_paths(cli, [dead_wi, failing], rig)
    assert paths == {dead_wi: "legacy_event", failing: "legacy_event"}

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
    listed = await _dlq(cli)
    assert sorted(listed) == [
        ("legacy_event", failing, "sync", "permanent_test"),
        ("legacy_event", unsure, "sync", "outcome_unknown"),
    ]
    code, out, _ = await cli("dlq", "legacy", "--pack", "shop", "--json")
    legacy = {int(f["event"]["event_id"]) for f in json.loads(out)["failures"]}
    assert legacy == {failing, unsure}, "the same set as ListLegacyFailures"
    code, out, _ = await cli("dlq", "list")
    assert code == 0 and out.splitlines()[0].split()[-1] == "PATH"
    assert all(line.split()[-1] == "legacy_event" for line in out.splitlines()[1:] if line.strip())

    await legacy_outcome_resolve(
        rig.conn, event_id=unsure, work_type="sync", outcome="failed", reason="checked", actor="key:op"
    )
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    quiescing = await _dlq(cli)
    assert {(p, e) for p, e, *_ in quiescing} == {("legacy_event", failing), ("legacy_event", unsure)}, (
        "quiescing: still the legacy path's failures (the resolution is the latest outcome)"
    )

    await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert await _dlq(cli) == [("work_item", dead_wi, "sync", "permanent_test")], (
        "re-cutover: the WorkItem path's failures again; legacy failures are reconciled, never dead letters"
    )
    paths = await _trace_paths(cli, [dead_wi, failing], rig)
    assert paths == {dead_wi: "work_item", failing: "legacy_event"}
