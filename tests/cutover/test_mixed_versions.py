"""Mixed versions for real (issue #28 item 7): the previous release (``releases.toml``: its commit,
since tags do not travel with every clone) built from git into the test's temp dir with its own
virtual environment, run beside this build in the drain/cutover scenario.

The old tree comes from ``git archive <commit>``; its venv (``venv --without-pip``) puts the old
source roots first and borrows this environment's third-party packages (the same constraints) but
not this build's code (the editable install's hook is not loaded). Proved:

* an older WorkItem executor (no claim admission: its process row declares none) is counted as
  claim-capable for every generation: the rollback refuses with ``work_item_claimer_running`` naming
  it as an older build and changes nothing, while this build's executor beside it does not block;
  once the older binary exited (SIGTERM, deregistered) the rollback passes. Control: the same
  measure without the undeclared rule (the registry query monkeypatched) lets the rollback through
  with the older binary running;
* the older release's legacy executor (``--claim-path event``) runs the fenced work (each once, on
  the legacy path only), exits by itself after the quiesce, and the cutover's proof shows zero
  old claimers; this build's executor then claims under the new receipt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest

from connector.common.store import processes
from connector.executor import cutover
from tests.executor.helpers import ExecutorProcess

from .conftest import ROOT, Rig, wait_until

pytestmark = pytest.mark.slow

STALE_S = 12.0


def _previous_release() -> tuple[str, str]:
    doc = tomllib.loads((ROOT / "releases.toml").read_text())
    (rel,) = [r for r in doc["release"] if r["tag"] == doc["previous"]]
    return str(rel["tag"]), str(rel["commit"])


def build_release(commit: str, into: Path) -> Path:
    """The release's source tree and venv under ``into``; its python."""
    src = into / "src"
    src.mkdir(parents=True)
    have = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if have.returncode != 0:
        pytest.fail(
            f"the previous release's commit {commit} (releases.toml) is not in this clone (a shallow"
            " clone?): clone with history (`git fetch --unshallow`) to run the mixed-version proof"
        )
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    roots = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    venv = into / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    # Old code first; this environment's packages for the third-party dependencies. A plain path line
    # does not run that directory's .pth files, so this build's editable hook stays out.
    lines = [str(src / r) for r in roots["where"]] + [sysconfig.get_paths()["purelib"]]
    (site / "connector_release.pth").write_text("\n".join(lines) + "\n")
    return venv / "bin" / "python"


class Release:
    """A ``connector`` command of the built release as a child process."""

    def __init__(self, python: Path, url: str, args: list[str], env: dict[str, str], log: Path) -> None:
        full = {
            **os.environ,
            "CONNECTOR_DATABASE_URL": url,
            "CONNECTOR_EXECUTOR_WORKERS": "4",
            "CONNECTOR_EXECUTOR_LEASE_S": "3",
            "CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.2",
            "CONNECTOR_EXECUTOR_RECLAIM_INTERVAL_S": "1",
            "CONNECTOR_EXECUTOR_SHUTDOWN_GRACE_S": "2",
            "CONNECTOR_EXECUTOR_GRPC_PORT": "0",
            "CONNECTOR_EXECUTOR_METRICS_PORT": "0",
            "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "0",
            "CONNECTOR_LOG_LEVEL": "WARNING",
            # The test handler (tests.cutover.handlers) is the harness's sink, not release code.
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.log_path = log
        self._log = log.open("wb")
        code = "import sys; from connector.cli.main import main; sys.exit(main())"
        self.proc = subprocess.Popen(
            [str(python), "-c", code, *args], env=full, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-3000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return int(self.proc.returncode)


async def test_previous_release_beside_this_build_through_rollback_and_cutover(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, commit = _previous_release()
    python = build_release(commit, tmp_path / tag)
    await rig.install()
    receipt = int(
        await rig.scalar(
            "SELECT cutover_receipt_id FROM connector_claim_authority WHERE installed_pack_id = %s",
            (rig.pack,),
        )
    )
    started: list[Release | ExecutorProcess] = []
    try:
        old = Release(python, rig.url, ["executor", "--no-admin"], {"CUTOVER_TEST_PATH": "work_item"},
                      tmp_path / "old-executor.log")  # fmt: skip
        started.append(old)
        new = ExecutorProcess(
            rig.url, extra_env={"CUTOVER_TEST_PATH": "work_item", "CONNECTOR_EXECUTOR_WORKERS": "4"}
        )
        started.append(new)
        await wait_until(
            lambda: rig.scalar(
                "SELECT count(*) = 2 FROM connector_process WHERE claim_capability = 'work_item'"
                " AND pid = ANY(%s)",
                ([old.pid, new.pid],),
            ),
            timeout=90,
            what="both executors registered",
        )
        rows = dict(
            await rig.rows(
                "SELECT pid, admitted_receipt_ids FROM connector_process WHERE pid = ANY(%s)",
                ([old.pid, new.pid],),
            )
        )
        assert rows[old.pid] is None, "the older build declares no claim admission"

        async def both_ran() -> bool:
            await rig.deliver("ok", "ok", "ok", "ok")
            pids = {
                p for (p,) in await rig.rows("SELECT DISTINCT pid FROM cutover_test_effect WHERE wi_held")
            }
            return {old.pid, new.pid} <= pids

        await wait_until(both_ran, timeout=90, what="the older and this build's executor both ran work")
        await wait_until(
            lambda: rig.scalar(
                "SELECT admitted_receipt_ids = ARRAY[%s]::bigint[] FROM connector_process WHERE pid = %s",
                (receipt, new.pid),
            ),
            what="this build names the install receipt",
        )

        await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
        pending = await rig.deliver("ok", "ok")  # not executable until fenced

        # Control: without the undeclared rule the registry query counts the older binary out.
        loose = processes.PROCESS_LIST_ADMITTING.replace("p.admitted_receipt_ids IS NULL OR ", "")
        assert loose != processes.PROCESS_LIST_ADMITTING
        monkeypatch.setattr(processes, "PROCESS_LIST_ADMITTING", loose)
        dry = await cutover.rollback_complete(
            rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=STALE_S, dry_run=True
        )
        assert [b.code for b in dry.blockers if b.code == "work_item_claimer_running"] == []
        monkeypatch.undo()

        with pytest.raises(cutover.CutoverBlocked) as refused:
            await cutover.rollback_complete(
                rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=STALE_S, claimers_wait_s=1.0
            )
        (blocker,) = refused.value.blockers
        assert blocker.code == "work_item_claimer_running" and blocker.count == 1
        assert "declare no claim admission" in blocker.message and f":{old.pid} " in blocker.message
        assert f":{new.pid} " not in blocker.message
        assert await rig.authority() == ("none", "rollback_fenced")
        assert await rig.scalar("SELECT count(*) FROM connector_rollback_fence") == 0

        # The older binary exits (drain: SIGTERM, it deregisters); then the rollback passes.
        assert old.stop() == 0, old.log()
        done = await cutover.rollback_complete(
            rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=STALE_S
        )
        zero = done.proof["zero_work_item_claimers"]
        assert zero["claim_capable_processes_for_generation"] == 0
        assert zero["older_builds_without_claim_admission"] == 0
        assert done.fenced_work_items == 2

        # The previous release's legacy executor runs the fenced work, then drains and exits.
        legacy = Release(python, rig.url, ["executor", "--claim-path", "event", "--pack", "shop"],
                         {"CUTOVER_TEST_PATH": "legacy"}, tmp_path / "old-legacy.log")  # fmt: skip
        started.append(legacy)
        await wait_until(
            lambda: rig.scalar(
                "SELECT count(*) = 2 FROM connector_work_item WHERE event_id = ANY(%s)"
                " AND state = 'reconciled_legacy_terminal'",
                (pending,),
            ),
            timeout=90,
            what="the older legacy executor's outcomes reconciled",
        )
        ran = await rig.rows(
            "SELECT event_id, path, pid, legacy_held FROM cutover_test_effect WHERE event_id = ANY(%s)"
            " ORDER BY event_id",
            (pending,),
        )
        assert [(p, pid, h) for _, p, pid, h in ran] == [("legacy", legacy.pid, True)] * 2, ran
        await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
        deadline = time.monotonic() + 60
        while legacy.proc.poll() is None:
            assert time.monotonic() < deadline, legacy.log()
            await wait_until(lambda: rig.scalar("SELECT true"), what="tick")
        assert legacy.proc.returncode == 0, legacy.log()
        cut = await cutover.cutover_complete(
            rig.conn, rig.pack, rig.generation, actor="test", process_stale_s=STALE_S
        )
        z = cut.proof["zero_old_claimers"]
        assert (z["legacy_processes_fresh"], z["legacy_processing_events"]) == (0, 0)
        after = await rig.deliver("ok", "ok")
        await wait_until(
            lambda: rig.scalar(
                "SELECT count(*) = 2 FROM cutover_test_effect"
                " WHERE event_id = ANY(%s) AND pid = %s AND wi_held",
                (after, new.pid),
            ),
            timeout=60,
            what="this build runs new work under the cutover receipt",
        )
    finally:
        for p in started:
            p.stop()
