"""Executor benchmark: no-op drain throughput and claim latency against backlog depth.

    .venv/bin/python -m benchmarks.executor_bench            # full (100k items per drain, 1M backlog)
    .venv/bin/python -m benchmarks.executor_bench --quick    # smaller, for a smoke run
    .venv/bin/python -m benchmarks.executor_bench --profile  # + py-spy of the 1-process drain

Each drain scenario gets a fresh database (``connector.common.testdb.fresh_database``), seeds N
WorkItems of one pack *without* claim authority, starts real ``connector executor`` processes
(16 workers each, no-op async python handler that needs no event/payload), waits until they are
registered, then grants the claim authority (+ NOTIFY): the claims fail closed until that instant,
so it is the start gun. Throughput = N / (last ``finished_at`` - grant time), both database clock.

Scenarios: no lanes / 100 random source lanes / 100 random target lanes, with one and two executor
processes; then the claim statement's latency (batch 64) with 10k vs 1M ready rows.

The run holds ``flock /tmp/connector-bench.lock`` (set CONNECTOR_BENCH_LOCK_HELD=1 when a parent
already holds it). Results also go to ``.bench/executor.json`` (not committed; the figures and
their reading are in docs/executor.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HANDLER = "benchmarks.executor_bench:noop"


async def noop(ctx: Any) -> None:
    """The benchmark handler: does nothing, reads nothing."""
    return None


noop.connector_needs_event = False  # type: ignore[attr-defined]


async def noop_with_event(ctx: Any) -> None:
    """Like ``noop`` but the executor reads the event fact and payload for it (one batched query)."""
    return None


def _lock() -> Any:
    if os.environ.get("CONNECTOR_BENCH_LOCK_HELD") == "1":
        return None
    f = open("/tmp/connector-bench.lock", "w")  # held for the whole run
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("waiting for /tmp/connector-bench.lock (another benchmark is running)", flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _spawn(url: str, env_extra: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": url,
        "CONNECTOR_EXECUTOR_WORKERS": "16",
        "CONNECTOR_EXECUTOR_GRPC_PORT": "0",
        "CONNECTOR_EXECUTOR_METRICS_PORT": "0",
        "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "0",
        "CONNECTOR_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
        **env_extra,
    }
    return subprocess.Popen(
        [str(ROOT / ".venv/bin/connector"), "executor", "--no-admin"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _machine_busy_s() -> float:
    """CPU seconds spent busy by the whole machine (all cores) since boot."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _wait(pred: Any, timeout: float, interval: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("benchmark step timed out")
        time.sleep(interval)


def drain(
    n: int,
    *,
    procs: int,
    lanes: str | None,
    claim_batch: int,
    handler: str = HANDLER,
    profile_s: float = 0.0,
    vacuum_s: float = 0.0,
) -> dict[str, Any]:
    import psycopg

    from connector.common import testdb
    from tests.executor import seed

    rnd = random.Random(42)
    keys = [f"k{rnd.randrange(100)}" for _ in range(n)] if lanes else None
    with testdb.fresh_database("connector_bench") as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type(handler)}, authority=False)
        for start in range(0, n, 50_000):
            m = min(50_000, n - start)
            part = keys[start : start + m] if keys else None
            seed.seed_items(
                db,
                pack,
                m,
                source_lanes=part if lanes == "source" else None,
                target_lanes=part if lanes == "target" else None,
            )
        db.execute("VACUUM ANALYZE connector_work_item")
        db.execute("CHECKPOINT")
        children = [_spawn(url, {"CONNECTOR_EXECUTOR_CLAIM_BATCH": str(claim_batch)}) for _ in range(procs)]
        spy = None
        stop_vacuum = threading.Event()
        vacuums = 0

        def vacuum_loop() -> None:
            # Stand-in for autovacuum, which this server runs with turned off (the table's own
            # autovacuum settings, DESIGN §8 trap 6, assume it is on).
            nonlocal vacuums
            with psycopg.connect(url, autocommit=True) as vconn:
                while not stop_vacuum.wait(vacuum_s):
                    vconn.execute("VACUUM connector_work_item")
                    vacuums += 1

        vacuumer = threading.Thread(target=vacuum_loop, daemon=True) if vacuum_s > 0 else None
        try:
            _wait(
                lambda: db.execute("SELECT count(*) FROM connector_process").fetchone()[0] == procs,  # type: ignore[index]
                30,
            )
            cpu0 = [_proc_cpu_s(c.pid) for c in children]
            busy0 = _machine_busy_s()
            granted = db.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            seed.grant_authority(db, pack)
            db.execute("NOTIFY connector_work")
            if vacuumer is not None:
                vacuumer.start()
            if profile_s:
                spy = subprocess.Popen(
                    [
                        str(ROOT / ".venv/bin/py-spy"),
                        "record",
                        "--pid",
                        str(children[0].pid),
                        "--duration",
                        str(int(profile_s)),
                        "--format",
                        "raw",
                        "--rate",
                        "250",
                        "--threads",
                        "-o",
                        "/tmp/executor-bench-profile.txt",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            _wait(
                lambda: (
                    db.execute(
                        "SELECT count(*) FROM connector_work_item "
                        "WHERE installed_pack_id = %s AND state = 'succeeded'",
                        (pack,),
                    ).fetchone()[0]  # type: ignore[index]
                    == n
                ),
                600,
                0.5,
            )
            busy1 = _machine_busy_s()
            cpu1 = [_proc_cpu_s(c.pid) for c in children]
            last = db.execute("SELECT max(finished_at) FROM connector_work_item").fetchone()[0]  # type: ignore[index]
            elapsed = (last - granted).total_seconds()
            stale = db.execute("SELECT count(*) FROM connector_work_item WHERE lease_token > 1").fetchone()[0]  # type: ignore[index]
        finally:
            stop_vacuum.set()
            if vacuumer is not None and vacuumer.is_alive():
                vacuumer.join(60)
            if spy is not None:
                spy.wait(60)
            for c in children:
                c.terminate()
            for c in children:
                try:
                    c.wait(20)
                except subprocess.TimeoutExpired:
                    c.kill()
    executor_cpu = sum(cpu1) - sum(cpu0)
    other_cpu = (busy1 - busy0) - executor_cpu  # PostgreSQL, mostly (plus this poller and the OS)
    return {
        "items": n,
        "seconds": round(elapsed, 3),
        "executor_cpu_us_per_item": round(executor_cpu / n * 1e6, 1),
        "postgres_and_other_cpu_us_per_item": round(other_cpu / n * 1e6, 1),
        "items_per_s": round(n / elapsed),
        "reclaimed_or_retried": stale,
        "vacuums": vacuums,
    }


async def _claim_latency(url: str, pack: int, claims_n: int) -> dict[str, float]:
    import psycopg

    from connector.executor import claims

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        samples = []
        for _ in range(claims_n):
            t0 = time.perf_counter()
            rows = await claims.work_item_claim_batch(
                conn, [pack], ["default"], [64], owner="bench", lease_s=60
            )
            samples.append(time.perf_counter() - t0)
            assert len(rows) == 64
    finally:
        await conn.close()
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 3),
        "p90_ms": round(samples[int(len(samples) * 0.9)] * 1000, 3),
    }


def claim_latency(ready: int, claims_n: int = 100) -> dict[str, Any]:
    import psycopg

    from connector.common import testdb
    from tests.executor import seed

    with testdb.fresh_database("connector_bench") as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type(HANDLER)})
        for start in range(0, ready, 100_000):
            seed.seed_items(db, pack, min(100_000, ready - start))
        db.execute("VACUUM ANALYZE connector_work_item")
        db.execute("CHECKPOINT")
        out = asyncio.run(_claim_latency(url, pack, claims_n))
    return {"ready": ready, **out}


def _profile_summary(path: str, top: int = 25) -> dict[str, Any]:
    """From py-spy's raw (collapsed) output of the event-loop thread: self time per function and
    inclusive time of the executor's actors."""
    stacks: list[tuple[list[str], int]] = []
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if stack:
                stacks.append((stack.split(";"), int(count)))
    by_thread: dict[str, int] = {}
    for frames, c in stacks:
        if any("Runner.run" in fr for fr in frames):
            by_thread[frames[0]] = by_thread.get(frames[0], 0) + c
    main_thread = max(by_thread, key=lambda k: by_thread[k]) if by_thread else ""
    main = [(frames, c) for frames, c in stacks if frames and frames[0] == main_thread]
    total = sum(c for _, c in main) or 1
    self_time: dict[str, int] = {}
    for frames, c in main:
        self_time[frames[-1]] = self_time.get(frames[-1], 0) + c
    actors = (
        "Engine._claim_loop",
        "Engine._worker",
        "Engine._finalizer",
        "Engine._lease_keeper",
        "Engine._listener",
    )
    inclusive = {
        a: round(100.0 * sum(c for frames, c in main if any(a in fr for fr in frames)) / total, 1)
        for a in actors
    }
    ranked = sorted(self_time.items(), key=lambda kv: -kv[1])[:top]
    return {
        "samples": total,
        "inclusive_pct": inclusive,
        "self_pct": [(name, round(100.0 * c / total, 1)) for name, c in ranked],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.executor_bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="20k items per drain, 10k vs 200k latency")
    ap.add_argument("--profile", action="store_true", help="py-spy the 1-process no-lane drain")
    ap.add_argument("--claim-batch", type=int, default=256)
    ap.add_argument(
        "--vacuum-every",
        type=float,
        default=2.0,
        help="VACUUM the WorkItem table every S seconds during drains, standing in for autovacuum "
        "(this server runs with autovacuum=off); 0 = never",
    )
    ap.add_argument("--both", action="store_true", help="run each drain without and with the vacuum stand-in")
    ap.add_argument("--only", help="comma-separated scenario names")
    args = ap.parse_args(argv)
    lock = _lock()
    n = 20_000 if args.quick else 100_000
    big = 200_000 if args.quick else 1_000_000
    scenarios = [
        ("nolanes-1p", 1, None),
        ("nolanes-2p", 2, None),
        ("source100-1p", 1, "source"),
        ("source100-2p", 2, "source"),
        ("target100-1p", 1, "target"),
        ("target100-2p", 2, "target"),
    ]
    only = set(args.only.split(",")) if args.only else None
    results: dict[str, Any] = {
        "claim_batch": args.claim_batch,
        "workers": 16,
        "vacuum_every_s": args.vacuum_every,
        "drains": {},
    }
    print(f"executor benchmark: {n} items per drain, 16 workers per process, claim batch {args.claim_batch}")
    modes = [0.0, args.vacuum_every] if args.both else [args.vacuum_every]
    for name, procs, lanes in scenarios:
        if only and name not in only:
            continue
        for vac in modes:
            res = drain(n, procs=procs, lanes=lanes, claim_batch=args.claim_batch, vacuum_s=vac)
            key = name if vac else f"{name}-novacuum"
            if not args.both and not vac:
                key = name
            results["drains"][key] = res
            tag = f"vacuum every {vac:g}s" if vac else "no vacuum"
            rate = f"{res['items_per_s']:>8,}"
            print(
                f"  {name:14s} {rate} items/s  ({res['items']} in {res['seconds']}s, {tag}; CPU/item: "
                f"executor {res['executor_cpu_us_per_item']} us, postgres+other "
                f"{res['postgres_and_other_cpu_us_per_item']} us)",
                flush=True,
            )
    if not only or "with-event-1p" in only:
        res = drain(
            n,
            procs=1,
            lanes=None,
            claim_batch=args.claim_batch,
            handler="benchmarks.executor_bench:noop_with_event",
            vacuum_s=args.vacuum_every,
        )
        results["drains"]["with-event-1p"] = res
        print(
            f"  {'with-event-1p':14s} {res['items_per_s']:>8,} items/s  (handler reads event + payload)",
            flush=True,
        )
    if args.profile:
        res = drain(
            n,
            procs=1,
            lanes=None,
            claim_batch=args.claim_batch,
            profile_s=4 if args.quick else 6,
            vacuum_s=args.vacuum_every,
        )
        summary = _profile_summary("/tmp/executor-bench-profile.txt")
        results["profile"] = {"drain": res, **summary}
        rate = f"{res['items_per_s']:,}"
        print(f"  profiled drain {rate} items/s; event-loop thread, {summary['samples']} samples")
        print("    inclusive: " + ", ".join(f"{k} {v}%" for k, v in summary["inclusive_pct"].items()))
        for fn, pct in summary["self_pct"]:
            print(f"    {pct:5.1f}%  {fn}")
    if not only or "latency" in only:
        small = claim_latency(10_000)
        large = claim_latency(big)
        ratio = round(large["p50_ms"] / small["p50_ms"], 2)
        results["claim_latency"] = {"small": small, "large": large, "ratio_p50": ratio}
        print(
            f"  claim p50 (batch 64): {small['p50_ms']} ms at {small['ready']:,} ready, "
            f"{large['p50_ms']} ms at {large['ready']:,} ready; ratio {ratio}"
        )
    out = ROOT / ".bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / ("executor-quick.json" if args.quick else "executor.json")).write_text(
        json.dumps(results, indent=2, default=str)
    )
    if lock is not None:
        lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
