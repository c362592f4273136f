"""The benchmark suite: every stage, end to end, the peers and PostgreSQL's own limit, in one run.

    .venv/bin/python -m benchmarks.run [--quick] [--long] [--only NAME,...] [--json PATH] [--repeat R]
    ./dev bench [same options]
    ./dev bench --long        # the suite plus the long runs (``benchmarks.sustained``: 30 minutes)

Holds ``/tmp/connector-bench.lock`` for the whole run (two benchmarks never share this 2-core
machine), runs each benchmark module as its own process with ``--json-out`` (contract:
``benchmarks.common``), then prints one table (our figures, target, pass/miss, ratio to the best
peer figure of the same scenario) and writes it with the run's metadata as JSON (default
``.bench/results.json``). A module that does not exist, crashes, times out or does not write its
JSON is reported as "not available: <reason>"; nothing is filled in. Child output goes to
``.bench/logs/<name>.log``. Benchmarks measure; they never fail a build on time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks import common


@dataclass(frozen=True)
class Bench:
    name: str
    module: str
    group: str  # stage | peer | reference
    timeout_s: float = 1800.0
    quick_timeout_s: float = 60.0
    takes_repeat: bool = False
    #: Runs only with ``--long`` (or by name with ``--only``): never in a default run, never in CI.
    long: bool = False


BENCHES: tuple[Bench, ...] = (
    Bench("ingress", "benchmarks.ingress_bench", "stage"),
    Bench("materializer", "benchmarks.materializer_bench", "stage"),
    Bench("executor", "benchmarks.executor_bench", "stage"),
    Bench("e2e", "benchmarks.e2e_bench", "stage"),
    Bench("attack", "benchmarks.attack_bench", "stage", quick_timeout_s=180.0),
    Bench("sql-budget", "benchmarks.sql_budget", "stage", quick_timeout_s=120.0),
    Bench("console", "benchmarks.console_bench", "stage", quick_timeout_s=120.0),
    Bench("graphile-worker", "benchmarks.peers.graphile_worker_peer", "peer", 3600.0, takes_repeat=True),
    Bench("procrastinate", "benchmarks.peers.procrastinate_peer", "peer", 3600.0, takes_repeat=True),
    Bench("pgbench", "benchmarks.reference", "reference", takes_repeat=True),
    Bench("sustained", "benchmarks.sustained", "stage", 3000.0, quick_timeout_s=300.0, long=True),
)
BY_NAME = {b.name: b for b in BENCHES}


@dataclass
class Outcome:
    bench: Bench
    status: str  # ok | missing | failed | timeout | no-json
    reason: str | None
    seconds: float
    rows: list[dict[str, Any]]
    log: str | None = None


def module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the child and its process group (it runs in a session of its own)."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _failure_reason(log_text: str, returncode: int) -> str:
    if "unrecognized arguments" in log_text and "--json-out" in log_text:
        return "does not support --json-out yet (benchmark contract: docs/benchmarks.md)"
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    return common.redact(f"exited with code {returncode}: {lines[-1][:300] if lines else 'no output'}")


def _pump(pipe: IO[bytes], log: IO[bytes], echo_as: str | None) -> None:
    """Copy the child's output to its log file (and, with echo, to our stdout, line by line)."""
    for line in iter(pipe.readline, b""):
        log.write(line)
        log.flush()
        if echo_as is not None:
            text = line.decode(errors="replace").rstrip()
            print(f"  {echo_as} | {text}", flush=True)
    pipe.close()


def run_bench(
    bench: Bench,
    *,
    quick: bool,
    repeat: int | None,
    lock: common.BenchLock | None,
    out_dir: Path,
    echo: bool = False,
) -> Outcome:
    started = time.monotonic()
    if not module_exists(bench.module):
        return Outcome(bench, "missing", f"{bench.module} does not exist yet", 0.0, [])
    json_out = out_dir / f"{bench.name}.json"
    log_path = out_dir / f"{bench.name}.log"
    json_out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", bench.module, "--json-out", str(json_out)]
    if quick:
        cmd.append("--quick")
    if repeat and bench.takes_repeat:
        cmd += ["--repeat", str(repeat)]
    env = dict(os.environ)
    pass_fds: tuple[int, ...] = ()
    if lock is not None and lock.fd is not None:
        env.update(lock.child_env())
        pass_fds = (lock.fd,)
    timeout = bench.quick_timeout_s if quick else bench.timeout_s
    print(f"bench: {bench.name}: {' '.join(cmd[1:])}", flush=True)
    lent = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=common.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=pass_fds, start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        pump = threading.Thread(
            target=_pump, args=(proc.stdout, log, bench.name if echo else None), daemon=True
        )
        pump.start()
        timed_out = False
        try:
            while proc.poll() is None:
                if time.monotonic() - started > timeout:
                    timed_out = True
                    _stop(proc)
                    break
                if lock is not None and not lent:
                    _, waiting = common.lock_holders(lock.path)
                    if waiting and set(waiting) & _descendants(proc.pid):
                        # The child opened the lock file itself instead of using bench_lock():
                        # let it have the lock, take it back when it ends.
                        print(f"bench: {bench.name} takes the lock itself; lending it", flush=True)
                        lock.lend()
                        lent = True
                time.sleep(0.2)
        except BaseException:
            _stop(proc)
            raise
        finally:
            pump.join(timeout=10)
            if lent and lock is not None:
                lock.take_back()
    seconds = time.monotonic() - started
    log_text = log_path.read_text(errors="replace")
    rel_log = (
        str(log_path.relative_to(common.ROOT)) if log_path.is_relative_to(common.ROOT) else str(log_path)
    )
    if timed_out:
        return Outcome(
            bench, "timeout", f"timed out after {timeout:.0f} s (log: {rel_log})", seconds, [], rel_log
        )
    if proc.returncode != 0:
        reason = _failure_reason(log_text, proc.returncode)
        return Outcome(bench, "failed", f"{reason} (log: {rel_log})", seconds, [], rel_log)
    if not json_out.exists():
        reason = f"exited 0 without writing --json-out (does it support the contract yet?) (log: {rel_log})"
        return Outcome(bench, "no-json", reason, seconds, [], rel_log)
    try:
        rows = common.validate_rows(json.loads(json_out.read_text()))
    except ValueError as exc:
        return Outcome(bench, "failed", f"--json-out breaks the contract: {exc}", seconds, [], rel_log)
    return Outcome(bench, "ok", None, seconds, rows, rel_log)


def assemble(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """All rows in table order: reported rows (tagged with group and bench, targets filled in from
    EXPECTED where the module gave none), the expected rows nobody reported (with the reason), and
    one row per peer or reference module that failed as a whole; then pass/miss and peer ratios."""
    expected = {e.key: e for e in common.EXPECTED}
    rows: list[dict[str, Any]] = []
    for out in outcomes:
        for row in out.rows:
            row = dict(row)
            row["group"], row["bench"] = out.bench.group, out.bench.name
            exp = expected.get(row["key"])
            if exp is not None:
                row["target"] = row.get("target") or exp.target
                row["scenario"] = row.get("scenario") or exp.scenario
            rows.append(row)
    reported = {r["key"] for r in rows}
    final: list[dict[str, Any]] = []
    for out in outcomes:
        mine = {r["key"]: r for r in rows if r["bench"] == out.bench.name}
        for e in common.EXPECTED:
            if e.module != out.bench.name:
                continue
            if e.key in mine:
                final.append(mine.pop(e.key))
            elif e.key not in reported:
                reason = out.reason or f"not reported by {out.bench.module}"
                row = common.unavailable_row(
                    e.key, e.name, e.unit, reason, target=e.target, scenario=e.scenario
                )
                row["group"], row["bench"] = out.bench.group, out.bench.name
                final.append(row)
        final += list(mine.values())
        if out.status != "ok" and not any(e.module == out.bench.name for e in common.EXPECTED):
            row = common.unavailable_row(out.bench.name, out.bench.name, "-", out.reason or out.status)
            row["group"], row["bench"] = out.bench.group, out.bench.name
            final.append(row)
    # Expected rows of stage modules not selected with --only are left out on purpose.
    common.compare_with_peers(final)
    return final


def describe_environment(meta: dict[str, Any]) -> str:
    m, s = meta.get("machine", {}), meta.get("server", {})
    settings = s.get("settings", {})
    pg = (
        f"PostgreSQL {s.get('server_version')} (fsync {settings.get('fsync')}, synchronous_commit "
        f"{settings.get('synchronous_commit')}, autovacuum {settings.get('autovacuum')}, shared_buffers "
        f"{settings.get('shared_buffers')})"
        if s.get("server_version")
        else f"PostgreSQL: {s.get('error', 'unknown')}"
    )
    load = m.get("loadavg_at_start")
    load_text = f"; load average at start {load[0]}" if load else ""
    return f"{m.get('date_utc')}  {m.get('cpus')} CPUs, {m.get('memory_gib')} GiB; {pg}{load_text}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: small counts, the suite in under a minute"
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help="also the long runs (sustained: 30 minutes at 70%% of the maximum; a quiet machine)",
    )
    parser.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(BY_NAME)}")
    parser.add_argument("--json", type=Path, default=common.BENCH_DIR / "results.json", help="results file")
    parser.add_argument("--repeat", type=int, default=None, help="runs per peer/reference config (median)")
    parser.add_argument(
        "--quiet", action="store_true", help="do not echo benchmark output (it is in the logs)"
    )
    args = parser.parse_args(argv)

    selected = [b for b in BENCHES if args.long or not b.long]
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
        selected = [b for b in BENCHES if b.name in names]

    out_dir = common.BENCH_DIR / "logs"
    out_dir.mkdir(parents=True, exist_ok=True)
    waiting_since = time.monotonic()
    lock = common.BenchLock().acquire()
    started = time.monotonic()
    try:
        meta: dict[str, Any] = {
            "lock_wait_s": round(started - waiting_since, 1),
            "quick": args.quick,
            "only": [b.name for b in selected],
            "repeat": args.repeat or 1,
            "machine": common.machine_info(),
        }
        try:
            meta["server"] = common.server_info()
            stale = common.drop_stale_databases()
            if stale:
                print(f"bench: dropped {len(stale)} scratch database(s) left by killed runs", flush=True)
        except Exception as exc:
            meta["server"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"bench: {describe_environment(meta)}", flush=True)
        outcomes = []
        for bench in selected:
            outcome = run_bench(
                bench, quick=args.quick, repeat=args.repeat, lock=lock, out_dir=out_dir, echo=not args.quiet
            )
            status = outcome.status if outcome.reason is None else f"{outcome.status}: {outcome.reason}"
            print(f"bench: {bench.name}: {status} ({outcome.seconds:.1f} s)", flush=True)
            outcomes.append(outcome)
    finally:
        lock.release()
    rows = assemble(outcomes)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    doc = {
        "meta": meta,
        "benchmarks": [
            {
                "name": o.bench.name,
                "module": o.bench.module,
                "group": o.bench.group,
                "status": o.status,
                "reason": o.reason,
                "seconds": round(o.seconds, 1),
                "log": o.log,
            }
            for o in outcomes
        ],
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print()
    print(f"Benchmarks{' (--quick: smoke figures, not measurements)' if args.quick else ''} — "
          f"{describe_environment(meta)}")  # fmt: skip
    print(common.render_table(rows))
    waited = f", after waiting {meta['lock_wait_s']} s for the lock" if meta["lock_wait_s"] >= 1 else ""
    print(f"\nresults: {args.json} (run took {meta['duration_s']} s{waited})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
