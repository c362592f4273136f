"""``connector admin …`` against a real admin server: tables, --json, errors with reasons, exit codes."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
import yaml

from connector.cli import main as cli_main
from connector.cli.admin.output import Progress

from .conftest import OPERATOR, VIEW, VIEW_REPLAY, Admin, Seed, manifest


@pytest.fixture
def cli(admin: Admin, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("CONNECTOR_ADMIN_ADDRESS", f"127.0.0.1:{admin.port}")
    monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", OPERATOR)

    async def run(*argv: str, token: str | None = None) -> tuple[int, str, str]:
        if token is not None:
            monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", token)
        capsys.readouterr()
        code = await asyncio.to_thread(cli_main.main, ["admin", *argv])
        out, err = capsys.readouterr()
        monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", OPERATOR)
        return code, out, err

    return run


async def test_dlq_list_show_replay(cli, seed: Seed) -> None:
    pack = await seed.pack()
    a = await seed.item(pack, failure_class="timeout")
    b = await seed.item(pack, finished_ago_s=1)

    code, out, _ = await cli("dlq", "list", "--pack", "shop")
    assert code == 0
    lines = out.splitlines()
    out_pack_cells = lambda rows: {r[r.index("shop") : r.index(")") + 1] for r in rows[1:]}  # noqa: E731
    assert lines[0].split()[:3] == ["WORK_ID", "PACK", "GEN"]
    assert [int(line.split()[0]) for line in lines[1:]] == [b, a]

    code, out, _ = await cli("dlq", "list", "--json", "--failure-class", "timeout")
    assert code == 0
    data = json.loads(out)
    assert [int(d["work_item"]["work_id"]) for d in data["dead_letters"]] == [a]

    code, out, _ = await cli("dlq", "list", "--limit", "1")
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = await cli("dlq", "list", "--limit", "1", "--all", "--json")
    assert len(json.loads(out)["dead_letters"]) == 2

    code, out, _ = await cli("dlq", "show", str(a))
    assert code == 0 and "failure" in out and "timeout" in out and "do-not-leak" not in out

    code, _, err = await cli("dlq", "show", str(a), "--payload", token=VIEW)
    assert code == 1
    assert err.startswith("error: PERMISSION_DENIED PAYLOAD_NOT_ALLOWED: ")
    code, out, _ = await cli("dlq", "show", str(a), "--payload", token=VIEW_REPLAY)
    assert code == 0 and "do-not-leak" in out

    # #24: one PACK format everywhere (name (id)); a dry run of a replay by id (it was refused).
    assert out_pack_cells(lines) == {f"shop ({pack})"}
    code, out, err = await cli("dlq", "replay", str(a), "--dry-run", token=VIEW_REPLAY)
    assert (code, err) == (0, "") and out.splitlines()[0].startswith("dry run: these would be replayed")
    assert out.splitlines()[2].split()[:2] == [str(a), "dead"] and await seed.state(a) == "dead"
    code, out, _ = await cli("dlq", "replay", str(a), token=VIEW_REPLAY)
    assert code == 0
    assert out.splitlines()[1].split()[:3] == [str(a), "pending", "1"]
    code, _, err = await cli("dlq", "replay", str(a), "--dry-run")  # not dead any more: the same refusal
    assert (
        code == 1 and err.startswith("error: FAILED_PRECONDITION NOT_DEAD: ") and len(err.splitlines()) == 1
    )

    code, _, err = await cli("dlq", "replay", str(a))
    assert code == 1
    assert err.startswith(
        "error: FAILED_PRECONDITION NOT_DEAD: only dead or cancelled work items can be replayed"
    )
    assert f"(work item {a})" in err


async def test_replay_refused_for_a_changed_identity_in_one_line(cli, seed: Seed) -> None:
    """Issue #28 item 5: the CLI's refusal is one line naming the reason and what to look at."""
    await _replay_refused_in_one_line(cli, seed)


async def test_control_replay_without_the_identity_check_is_not_refused(
    cli, seed: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the admin server's replay without its identity check (``replay._identity_refusal``
    answering "no refusal"): the CLI replays the item and the check above fails."""
    from connector.executor.admin import replay

    monkeypatch.setattr(replay, "_identity_refusal", lambda *args: None)
    with pytest.raises(AssertionError, match="assert 0 == 1"):
        await _replay_refused_in_one_line(cli, seed)


async def _replay_refused_in_one_line(cli, seed: Seed) -> None:
    pack = await seed.pack()
    work_id = await seed.item(pack)
    await seed.generation(pack, 2, route_extra={"idempotency_header": None})
    code, _, err = await cli("dlq", "replay", str(work_id))
    assert code == 1
    assert err.startswith(
        "error: FAILED_PRECONDITION IDENTITY_CHANGED: the current route's identity template"
    )
    assert len(err.splitlines()) == 1 and f"work item {work_id}" in err
    assert await seed.state(work_id) == "dead"


async def test_bulk_replay_dry_run_and_progress(cli, seed: Seed) -> None:
    pack = await seed.pack()
    for _ in range(3):
        await seed.item(pack)
    await seed.item(pack, execution_owner="legacy_event")

    code, out, _ = await cli("dlq", "replay", "--pack", str(pack), "--dry-run")
    assert code == 0
    assert "dry run: 4 dead letters match, 3 would be replayed, 1 refused" in out
    assert "LEGACY_OWNED: 1" in out

    code, out, err = await cli("dlq", "replay", "--pack", "shop", "--rate", "1000")
    assert code == 0
    assert "replayed 3 of 4, refused 1" in out
    assert "replay: 4/4 processed: 3 replayed, 1 refused" in err  # non-TTY: progress lines

    code, out, _ = await cli("dlq", "replay", "--pack", "shop", "--json")
    assert json.loads(out)["total"] == "1"  # int64 as a JSON string (proto JSON mapping)

    code, _, err = await cli("dlq", "replay")
    assert code == 2 and "needs --pack" in err
    code, _, err = await cli("dlq", "replay", "1", "--pack", "shop")
    assert code == 2


def test_progress_bar_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = Progress(out, width=10)
    bar.update(5, 10, 0)
    bar.update(9, 10, 1, final=True)
    bar.close()
    text = out.getvalue()
    assert text.startswith("\r[#####.....] 5/10 processed")
    assert "\r[##########] 10/10 processed: 9 replayed, 1 refused\n" in text
    assert text.count("\n") == 1


async def test_receipts(cli, seed: Seed) -> None:
    await seed.pack()
    receipt = await seed.receipt(status="failed", error_class="no_route", error_summary="nope")
    code, out, _ = await cli("receipts", "failed", "--namespace", "shop")
    assert code == 0 and out.splitlines()[1].split()[:4] == [str(receipt), "shop", "orders", "d-1"]
    code, out, _ = await cli("receipts", "replay", str(receipt))
    assert code == 0 and f"receipt {receipt} is pending again" in out
    code, _, err = await cli("receipts", "replay", str(receipt))
    assert code == 1 and err.startswith("error: FAILED_PRECONDITION NOT_FAILED: ")


async def test_stats_lanes_cutover(cli, seed: Seed) -> None:
    pack = await seed.pack()
    await seed.item(pack, state="pending")
    head = await seed.item(pack, state="dead", source_lane="o:1")
    await seed.item(pack, state="blocked", source_lane="o:1")

    code, out, _ = await cli("stats")
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["PACK", "PENDING", "BLOCKED"]
    assert "shop (1)" in out and "active claimants: 0" in out
    # Per queue class: ready = due + not_due (a delayed item is ready but not due).
    delayed = await seed.item(pack, state="pending")
    await seed.conn.execute(
        "UPDATE connector_work_item SET run_after = now() + interval '1 hour' WHERE work_id = %s", (delayed,)
    )
    code, out, _ = await cli("stats")
    header = next(line for line in out.splitlines() if line.split()[:2] == ["PACK", "QUEUE_CLASS"])
    row = out.splitlines()[out.splitlines().index(header) + 1].split()
    assert header.split()[2:5] == ["READY", "DUE", "NOT_DUE"] and row[3:6] == ["2", "1", "1"], out
    code, out, _ = await cli("stats", "--json", "--pack", "shop")
    assert json.loads(out)["queues"][0]["depth_by_state"]["dead"] == "1"

    code, out, _ = await cli("lanes", "blocked")
    assert code == 0
    assert out.splitlines()[1].split()[:7] == ["shop", f"({pack})", "source", "o:1", str(head), "dead", "1"]

    code, out, _ = await cli("cutover", "status", "--pack", "shop")
    assert code == 0
    row = out.splitlines()[1].split()
    assert row[:7] == ["shop", f"({pack})", "1", "active", "yes", "work_item", "work_item_active"]


async def test_processes(cli, seed: Seed) -> None:
    await seed.process("none", process_id="m-1", service="materializer", pid=13, age_s=120)
    await seed.process("none", process_id="i-1", service="ingress", pid=12)
    await seed.process("work_item", process_id="x-1", service="executor", pid=11)

    code, out, _ = await cli("processes", token=VIEW)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "SERVICE", "PROCESS_ID", "HOST", "PID", "VERSION", "REVISION", "CAPABILITY", "HEARTBEAT_AGE", "STALE",
    ]  # fmt: skip
    rows = [line.split() for line in lines[1:4]]
    assert [r[:7] for r in rows] == [  # no build revision known: "-"
        ["executor", "x-1", "h", "11", "test", "-", "work_item"],
        ["ingress", "i-1", "h", "12", "test", "-", "none"],
        ["materializer", "m-1", "h", "13", "test", "-", "none"],
    ]
    assert [r[7:] for r in rows] == [["0s"], ["0s"], ["2m", "yes"]]
    assert lines[4] == "3 processes, 1 stale (no heartbeat for 15s)"

    code, out, _ = await cli("processes", "--service", "ingress")
    assert code == 0 and [line.split()[:2] for line in out.splitlines()[1:2]] == [["ingress", "i-1"]]
    assert out.splitlines()[2] == "1 process, 0 stale (no heartbeat for 15s)"

    code, out, _ = await cli("processes", "--json")
    assert code == 0
    data = json.loads(out)
    assert [(p["process_id"], p["service"], p["claim_capability"], p["pid"]) for p in data["processes"]] == [
        ("i-1", "ingress", "none", 12),
        ("m-1", "materializer", "none", 13),
        ("x-1", "executor", "work_item", 11),
    ]
    assert [p.get("stale", False) for p in data["processes"]] == [False, True, False]
    assert data["stale_after"] == "15s" and float(data["processes"][1]["heartbeat_age"].rstrip("s")) >= 120

    code, out, _ = await cli("processes", "--service", "nope")
    assert code == 0 and out.splitlines()[1:] == ["(none)"]


async def test_packs(cli, tmp_path: Path) -> None:
    path = tmp_path / "pack.yaml"
    path.write_text(yaml.safe_dump(manifest("billing", "billing")))
    code, out, _ = await cli("packs", "apply", str(path), "--validate-only")
    assert code == 0 and "manifest is valid" in out
    code, out, _ = await cli("packs", "apply", str(path))
    assert code == 0 and "generation 1 is staged; active generation -" in out
    code, out, _ = await cli("packs", "activate", "billing", "1")
    assert code == 0 and "active generation 1" in out
    code, out, _ = await cli("packs", "list")
    assert code == 0 and out.splitlines()[1].split()[1:] == ["billing", "billing", "1", "1", "1:active"]
    code, _, err = await cli("packs", "apply", str(path), token=VIEW)
    assert code == 1 and err.startswith(
        "error: PERMISSION_DENIED ROLE_REQUIRED: ApplyPack needs role ConnectorOperator"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad!\n")
    code, out, _ = await cli("packs", "apply", str(bad), "--validate-only")
    assert code == 1 and "invalid pack manifest:" in out
    code, _, err = await cli("packs", "apply", str(bad))
    assert code == 1 and err.startswith("error: INVALID_ARGUMENT INVALID_MANIFEST: invalid pack manifest")


async def test_tokens_and_connection_errors(
    cli, seed: Seed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await cli("stats", token="")
    assert code == 1 and err.startswith("error: UNAUTHENTICATED TOKEN_MISSING: ")
    code, _, err = await cli("stats", token="wrong-wrong-wrong-wrong")
    assert code == 1 and err.startswith("error: UNAUTHENTICATED TOKEN_INVALID: ")
    assert "wrong-wrong-wrong-wrong" not in err
    token_file = tmp_path / "token"
    token_file.write_text(VIEW + "\n")
    code, _, _ = await cli("stats", "--token-file", str(token_file), token="")
    assert code == 0
    code, _, err = await cli("stats", "--token-file", str(tmp_path / "missing"))
    assert code == 2 and err.startswith("error: cannot read the token file")
    code, _, err = await cli("stats", "--address", "127.0.0.1:1", "--timeout", "2")
    assert code == 1 and err.startswith("error: UNAVAILABLE")


async def test_usage(cli) -> None:
    code, _, err = await cli()
    assert code == 2 and "usage: connector admin" in err
    code, out, _ = await cli("dlq")
    assert code == 2 and "list" in out and "replay" in out


async def test_cancel_pause_resume_and_stats(cli, seed: Seed) -> None:
    pack = await seed.pack()
    pending = await seed.item(pack, state="pending")
    claimed = await seed.item(pack, state="processing")

    code, out, _ = await cli("cancel", str(pending), "--reason", "dup", "--dry-run")
    assert code == 0 and "dry run" in out and await seed.state(pending) == "pending"
    code, out, err = await cli("cancel", str(pending), str(claimed), "--reason", "dup", token=VIEW_REPLAY)
    assert code == 1  # one of the two refused
    assert out.splitlines()[1].split()[:2] == [str(pending), "cancelled"]
    assert (
        err.startswith("error: FAILED_PRECONDITION WORK_ITEM_IN_FLIGHT: ") and f"(work item {claimed})" in err
    )
    with pytest.raises(SystemExit) as usage:  # argparse: the reason is required
        await cli("cancel", str(pending))
    assert usage.value.code == 2

    code, out, _ = await cli("pause", "shop", "--reason", "outage", "--request-id", "p-1")
    assert (
        code == 0 and out.startswith("paused: shop (") and "resume with: connector admin resume shop" in out
    )
    code, out, _ = await cli("pause", "shop", "--reason", "again")
    assert code == 0 and out.startswith("already paused (unchanged)") and "outage" in out
    code, out, _ = await cli("stats")
    assert code == 0 and "shop (" in out and "PAUSED" in out and "paused: shop (" in out
    code, _, err = await cli("pause", "shop", "--reason", "x", token=VIEW_REPLAY)
    assert code == 1 and err.startswith("error: PERMISSION_DENIED ROLE_REQUIRED")
    code, out, _ = await cli("resume", "shop", "--dry-run")
    assert code == 0 and out.startswith("would resume:")
    code, out, _ = await cli("resume", "shop")
    assert code == 0 and out.startswith("resumed:")
    code, out, _ = await cli("resume", "shop")
    assert code == 0 and out.startswith("not paused")
    code, out, _ = await cli("stats", "--json")
    assert code == 0 and "pauses" not in json.loads(out)


async def test_circuit_list_open_close_and_stats(cli, db) -> None:
    """``connector admin circuit list|open|close`` and the circuits in ``connector admin stats``."""
    from tests.executor import seed as eseed

    target = "https://crm.internal:443"
    pack = eseed.seed_pack(db, "shop", {"w": eseed.python_work_type("tests.executor.effects:noop")})
    eseed.seed_items(db, pack, 2, circuit_keys=[target] * 2, circuit={"consecutive_failures": 5})
    code, out, _ = await cli("circuit", "list")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["PACK", "TARGET", "STATE"]
    assert target in out and "closed" in out
    code, out, _ = await cli("circuit", "open", "shop", target, "--reason", "maintenance", "--dry-run")
    assert code == 0 and out.startswith("would open: shop (")
    code, out, _ = await cli("circuit", "open", "shop", target, "--reason", "maintenance")
    assert code == 0 and out.startswith("opened: shop (") and "open (forced)" in out
    assert f"close with: connector admin circuit close shop {target}" in out
    code, out, _ = await cli("circuit", "open", "shop", target, "--reason", "again")
    assert code == 0 and out.startswith("already open (unchanged)")
    code, out, _ = await cli("stats")
    assert code == 0 and target in out and "open (forced)" in out and "manual_open" in out
    code, _, err = await cli("circuit", "close", "shop", target, "--reason", "x", token=VIEW_REPLAY)
    assert code == 1 and err.startswith("error: PERMISSION_DENIED ROLE_REQUIRED")
    code, _, err = await cli("circuit", "close", "shop", "http://nope:80", "--reason", "x")
    assert code == 1 and "CIRCUIT_NOT_FOUND" in err
    code, out, _ = await cli("circuit", "close", "shop", target, "--reason", "back")
    assert code == 0 and out.startswith("closed: shop (")
    code, out, _ = await cli("circuit", "list", "shop", "--json")
    assert code == 0 and json.loads(out)["state"] == "CIRCUIT_STATE_CLOSED"  # one circuit: one document
