"""The benchmark harness's own logic (no timing assertions: benchmarks never gate on speed).

Covers target parsing, the row contract, the comparison with peers, the table, how missing,
crashing, contract-breaking and lock-taking benchmark modules are reported, the reentrant lock,
and the "peer absent -> reported, not faked" paths.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common, reference, run  # noqa: E402
from benchmarks.peers import graphile_worker_peer, procrastinate_peer  # noqa: E402

# ------------------------------------------------------------------------------------------------
# targets, rows, comparison, table
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "target", "expected"),
    [
        (5000.0, ">= 5000", True),
        (4999.9, ">= 5000", False),
        (49.0, "< 50", True),
        (50.0, "< 50", False),
        (1.5, "<= 1.5", True),
        (1.51, "<= 1.5", False),
        (12_001.0, "> 12,000", True),
        (None, ">= 1", None),
        (3.0, None, None),
        (3.0, "about 3", None),
    ],
)
def test_meets_target(value: float | None, target: str | None, expected: bool | None) -> None:
    assert common.meets_target(value, target) is expected


def test_validate_rows_accepts_the_contract_and_rejects_made_up_gaps() -> None:
    rows = common.validate_rows(
        {
            "rows": [
                {"key": "executor.drain_per_s", "name": "drain", "value": 12, "unit": "items/s"},
                {"name": "no key", "value": None, "unit": "ms", "unavailable": "not built yet"},
            ]
        }
    )
    assert rows[0]["value"] == 12.0 and rows[0]["key"] == "executor.drain_per_s"
    assert rows[1]["key"] == "no key" and rows[1]["unavailable"] == "not built yet"
    with pytest.raises(ValueError, match="without an 'unavailable' reason"):
        common.validate_rows({"rows": [{"name": "x", "value": None, "unit": "ms"}]})
    with pytest.raises(ValueError, match="not a finite number"):
        common.validate_rows({"rows": [{"name": "x", "value": float("nan"), "unit": "ms"}]})
    with pytest.raises(ValueError, match="number or null"):
        common.validate_rows({"rows": [{"name": "x", "value": "fast", "unit": "ms"}]})
    with pytest.raises(ValueError, match="JSON object"):
        common.validate_rows([1, 2])


def _tag(row: dict, group: str) -> dict:
    row["group"] = group
    return row


def test_compare_with_peers_uses_best_peer_of_the_same_scenario() -> None:
    rows = [
        _tag(
            common.make_row("ours", "ours", 9000.0, "items/s", target=">= 12000", scenario="drain"), "stage"
        ),
        _tag(common.make_row("lat", "latency", 40.0, "ms", target="< 50", scenario="lat"), "stage"),
        _tag(common.make_row("alone", "alone", 1.0, "items/s", scenario="nobody"), "stage"),
        _tag(common.make_row("p1", "peer one", 3000.0, "jobs/s", scenario="drain"), "peer"),
        _tag(common.make_row("p2", "peer two", 18000.0, "jobs/s", scenario="drain"), "peer"),
        _tag(common.unavailable_row("p3", "peer three", "jobs/s", "npm missing", scenario="drain"), "peer"),
        _tag(common.make_row("l1", "peer latency", 20.0, "ms", scenario="lat"), "peer"),
        _tag(common.make_row("l2", "peer latency 2", 80.0, "ms", scenario="lat"), "peer"),
    ]
    common.compare_with_peers(rows)
    ours, lat, alone = rows[0], rows[1], rows[2]
    assert ours["result"] == "miss"
    assert ours["vs_peer"]["peer_key"] == "p2"
    assert ours["vs_peer"]["ratio"] == pytest.approx(0.5)
    assert lat["result"] == "pass"
    assert lat["vs_peer"]["peer_key"] == "l1"  # lower is better for ms
    assert lat["vs_peer"]["ratio"] == pytest.approx(2.0)
    assert alone["vs_peer"] is None and alone["result"] is None
    assert rows[3]["vs_peer"] is None  # peers are not compared with each other


def test_render_table_shows_figures_ratios_and_reasons() -> None:
    rows = [
        _tag(
            common.make_row("ours", "executor drain", 9000.0, "items/s", target=">= 12000", scenario="d"),
            "stage",
        ),
        _tag(
            common.unavailable_row(
                "e2e", "end to end", "deliveries/s", "benchmarks.e2e_bench does not exist yet"
            ),
            "stage",
        ),
        _tag(common.make_row("p", "graphile-worker batched", 18000.0, "jobs/s", scenario="d"), "peer"),
        _tag(
            common.unavailable_row("q", "procrastinate", "jobs/s", "pip install failed: no network"), "peer"
        ),
        _tag(common.make_row("r", "pgbench", 14242.7, "tx/s", scenario="insert"), "reference"),
    ]
    common.compare_with_peers(rows)
    text = common.render_table(rows)
    assert "Our services" in text and "Peers" in text and "PostgreSQL's own reference" in text
    line = next(line for line in text.splitlines() if line.startswith("executor drain"))
    assert "9,000" in line and ">= 12000" in line and "miss" in line
    assert "0.50x graphile-worker batched (18,000 jobs/s)" in line
    assert "end to end" in text and "not available: benchmarks.e2e_bench does not exist yet" in text
    assert "not available: pip install failed: no network" in text
    assert "14,243" in text
    long_name = "x" * 80
    wide = [_tag(common.make_row("w", long_name, 5.0, "ms"), "stage")]
    common.compare_with_peers(wide)
    wrapped = common.render_table(wide, name_width=40).splitlines()
    assert long_name in wrapped and any(line.strip().startswith("5.00  ms") for line in wrapped)


def test_json_out_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "rows.json"
    rows = [common.make_row("k", "n", 1.5, "ms", target="< 2", extra={"items": 3})]
    common.write_json_out(out, rows)
    assert common.validate_rows(json.loads(out.read_text())) == rows


def test_stale_database_names_only_of_dead_processes() -> None:
    dead = _dead_pid()
    names = [
        f"connector_bench_gw_{dead}_0123abcd",
        f"connector_bench_{dead}_89abcdef",
        f"connector_bench_gw_{os.getpid()}_0123abcd",
        f"connector_t_{dead}_0123abcd",
        "connector_bench_notapid",
    ]
    assert common.stale_database_names(names) == names[:2]


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


# ------------------------------------------------------------------------------------------------
# the lock
# ------------------------------------------------------------------------------------------------

_CHILD_LOCK = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from benchmarks import common
    lock = common.BenchLock({path!r}).acquire(announce=False)
    print("inherited" if lock.inherited else "own")
    """
)


def _try_lock(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def test_bench_lock_is_reentrant_for_children_and_can_be_lent(tmp_path: Path) -> None:
    path = tmp_path / "bench.lock"
    lock = common.BenchLock(str(path)).acquire()
    try:
        assert not lock.inherited
        assert not _try_lock(path)  # a stranger cannot take it
        holders, waiting = common.lock_holders(str(path))
        assert os.getpid() in holders and not waiting
        assert lock.child_env() == {"CONNECTOR_BENCH_LOCK_FD": str(lock.fd), "CONNECTOR_BENCH_LOCK_HELD": "1"}
        child = subprocess.run(
            [sys.executable, "-c", _CHILD_LOCK.format(root=str(ROOT), path=str(path))],
            env={**os.environ, **lock.child_env()},
            pass_fds=(lock.fd,),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "inherited"
        assert not _try_lock(path)  # the child left the parent's lock alone
        lock.lend()
        assert _try_lock(path)
        lock.take_back()
        assert not _try_lock(path)
    finally:
        lock.release()
    assert _try_lock(path)


# ------------------------------------------------------------------------------------------------
# running modules: missing, crashing, not on the contract, lock-taking, fine
# ------------------------------------------------------------------------------------------------

FAKE_MODULES = {
    "fakebench_ok": """
        import argparse, json
        p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true")
        p.add_argument("--json-out")
        a = p.parse_args()
        json.dump({"rows": [{"key": "executor.drain_per_s", "name": "drain", "value": 7.0,
                             "unit": "items/s", "extra": {"quick": a.quick}}]}, open(a.json_out, "w"))
    """,
    "fakebench_old": """
        import argparse
        p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true")
        p.parse_args()
        print('{"some": "summary"}')
    """,
    "fakebench_crash": """
        import sys
        print("warming up")
        sys.exit("could not start the ingress service")
    """,
    "fakebench_leaky": """
        import sys
        sys.exit("could not connect to postgresql://bench:s3cret@127.0.0.1:5432/x")
    """,
    "fakebench_silent": """
        print("done, but where is the JSON?")
    """,
    "fakebench_bad": """
        import argparse, json
        p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true")
        p.add_argument("--json-out")
        a = p.parse_args()
        json.dump({"rows": [{"name": "drain", "value": None, "unit": "items/s"}]}, open(a.json_out, "w"))
    """,
    "fakebench_locker": """
        import argparse, fcntl, json, os
        p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true")
        p.add_argument("--json-out")
        a = p.parse_args()
        with open(os.environ["FAKE_LOCK_PATH"], "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)   # opens the lock file itself: must be lent the lock
            json.dump({"rows": [{"name": "locked", "value": 1, "unit": "x/s"}]}, open(a.json_out, "w"))
    """,
}


@pytest.fixture
def fake_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    mods = tmp_path / "mods"
    mods.mkdir()
    for name, body in FAKE_MODULES.items():
        (mods / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(mods), str(ROOT)]))
    return tmp_path


def _bench(name: str, module: str, group: str = "stage") -> run.Bench:
    return run.Bench(name, module, group, timeout_s=60, quick_timeout_s=60)


def test_run_bench_reports_each_kind_of_absence(fake_modules: Path) -> None:
    out = fake_modules / "out"
    out.mkdir()

    def go(module: str) -> run.Outcome:
        return run.run_bench(_bench("x" + module, module), quick=True, repeat=None, lock=None, out_dir=out)

    ok = go("fakebench_ok")
    assert ok.status == "ok" and ok.rows[0]["value"] == 7.0 and ok.rows[0]["extra"] == {"quick": True}
    missing = go("fakebench_absent")
    assert missing.status == "missing" and "does not exist yet" in (missing.reason or "")
    old = go("fakebench_old")
    assert old.status == "failed" and "does not support --json-out yet" in (old.reason or "")
    crash = go("fakebench_crash")
    assert crash.status == "failed" and "could not start the ingress service" in (crash.reason or "")
    leaky = go("fakebench_leaky")
    assert leaky.status == "failed" and "s3cret" not in (leaky.reason or "")
    assert "postgresql://bench:***@127.0.0.1:5432/x" in (leaky.reason or "")
    silent = go("fakebench_silent")
    assert silent.status == "no-json" and "without writing --json-out" in (silent.reason or "")
    bad = go("fakebench_bad")
    assert bad.status == "failed" and "breaks the contract" in (bad.reason or "")


def test_run_bench_lends_the_lock_to_a_module_that_takes_it_itself(
    fake_modules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fake_modules / "bench.lock"
    monkeypatch.setenv("FAKE_LOCK_PATH", str(path))
    out = fake_modules / "out"
    out.mkdir()
    lock = common.BenchLock(str(path)).acquire()
    try:
        outcome = run.run_bench(
            _bench("locker", "fakebench_locker"), quick=True, repeat=None, lock=lock, out_dir=out
        )
        assert outcome.status == "ok", outcome.reason
        assert not _try_lock(path)  # taken back after the child ended
    finally:
        lock.release()


def test_assemble_lists_every_expected_row_and_never_fills_gaps() -> None:
    stage_ok = run.Outcome(
        run.BY_NAME["executor"],
        "ok",
        None,
        1.0,
        [common.make_row("executor.drain_per_s", "drain", 9000.0, "items/s")],
    )
    e2e = run.Outcome(run.BY_NAME["e2e"], "missing", "benchmarks.e2e_bench does not exist yet", 0.0, [])
    peer = run.Outcome(
        run.BY_NAME["graphile-worker"],
        "ok",
        None,
        1.0,
        [common.make_row("peer.gw.batched", "gw batched", 18000.0, "jobs/s", scenario="drain")],
    )
    broken = run.Outcome(run.BY_NAME["procrastinate"], "failed", "exited with code 1: boom", 1.0, [])
    rows = run.assemble([stage_ok, e2e, peer, broken])
    by_key = {r["key"]: r for r in rows}
    drain = by_key["executor.drain_per_s"]
    assert drain["target"] == ">= 12000" and drain["scenario"] == "drain"  # filled from EXPECTED
    assert drain["result"] == "miss" and drain["vs_peer"]["ratio"] == pytest.approx(0.5)
    lanes = by_key["executor.drain_lanes_per_s"]
    assert lanes["value"] is None and lanes["unavailable"] == "not reported by benchmarks.executor_bench"
    for key in ("e2e.deliveries_per_s", "e2e.delivery_p50_ms", "e2e.delivery_p99_ms"):
        assert by_key[key]["value"] is None
        assert by_key[key]["unavailable"] == "benchmarks.e2e_bench does not exist yet"
    assert by_key["procrastinate"]["value"] is None and "boom" in by_key["procrastinate"]["unavailable"]
    assert not any(r["bench"] == "ingress" for r in rows)  # not selected: not listed
    assert all(r["value"] is not None or r["unavailable"] for r in rows)


# ------------------------------------------------------------------------------------------------
# peers and reference absent: reported, not faked
# ------------------------------------------------------------------------------------------------


def test_graphile_worker_without_node_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphile_worker_peer.shutil, "which", lambda name: None)
    out = tmp_path / "gw.json"
    assert graphile_worker_peer.main(["--quick", "--json-out", str(out)]) == 0
    rows = common.validate_rows(json.loads(out.read_text()))
    assert len(rows) == 4
    assert {r["scenario"] for r in rows} == {"drain", "drain_lanes"}
    for r in rows:
        assert r["value"] is None and r["unavailable"] == "node not found on PATH"


def test_graphile_worker_failed_npm_install_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_npm = tmp_path / "npm"
    fake_npm.write_text("#!/bin/sh\necho 'npm ERR! network unreachable' >&2\nexit 1\n")
    fake_npm.chmod(0o755)
    monkeypatch.setattr(graphile_worker_peer, "INSTALL_DIR", tmp_path / "gw")
    monkeypatch.setattr(
        graphile_worker_peer.shutil,
        "which",
        lambda name: {"node": "/bin/true", "npm": str(fake_npm)}.get(name),
    )
    out = tmp_path / "gw.json"
    assert graphile_worker_peer.main(["--quick", "--json-out", str(out)]) == 0
    rows = common.validate_rows(json.loads(out.read_text()))
    assert all(r["value"] is None for r in rows)
    assert rows[0]["unavailable"] == "npm install graphile-worker@0.17.3 failed: npm ERR! network unreachable"


def test_procrastinate_failed_install_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_venv(*args: object, **kwargs: object) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(procrastinate_peer, "VENV_DIR", tmp_path / "venv")
    monkeypatch.setattr(procrastinate_peer.venv.EnvBuilder, "create", no_venv)
    out = tmp_path / "p.json"
    assert procrastinate_peer.main(["--quick", "--json-out", str(out)]) == 0
    rows = common.validate_rows(json.loads(out.read_text()))
    assert [r["key"] for r in rows] == ["peer.procrastinate", "peer.procrastinate.locks"]
    assert all(r["value"] is None and "read-only file system" in r["unavailable"] for r in rows)


def test_pgbench_absent_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "find_pgbench", lambda: None)
    out = tmp_path / "ref.json"
    assert reference.main(["--json-out", str(out)]) == 0
    rows = common.validate_rows(json.loads(out.read_text()))
    assert [r["key"] for r in rows] == ["reference.pgbench_insert_c64", "reference.pgbench_insert_c16"]
    assert all(r["value"] is None and r["unavailable"] == "pgbench not found" for r in rows)


def test_parse_pgbench_output() -> None:
    sample = textwrap.dedent(
        """
        number of transactions actually processed: 71213
        latency average = 4.494 ms
        initial connection time = 12.114 ms
        tps = 14242.728394 (without initial connection time)
        """
    )
    assert reference.parse_pgbench(sample) == {"tps": 14242.728394, "latency_avg_ms": 4.494}
    with pytest.raises(ValueError):
        reference.parse_pgbench("pgbench: error: connection refused")
