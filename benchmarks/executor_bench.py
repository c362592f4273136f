"""Executor benchmark: no-op drain throughput and claim latency against backlog depth.

    .venv/bin/python -m benchmarks.executor_bench                    # the suite's workload (50k items)
    .venv/bin/python -m benchmarks.executor_bench --items 100000 --vacuum-standin --profile
    .venv/bin/python -m benchmarks.executor_bench --quick --json-out out.json   # harness contract

Follows the suite contract (docs/benchmarks.md, ``benchmarks.common``): ``--quick``/``--json-out``,
``bench_lock()``, scratch databases from ``fresh_migrated_database``, the shared drain workload
(``drain_items``, 16 workers, 100 lanes).

Each drain gets a fresh database, seeds N WorkItems of one pack *without* claim authority, starts
real ``connector executor`` processes (16 workers each, a no-op async python handler that needs no
event/payload), waits until they are registered, then grants the claim authority (+ NOTIFY): claims
fail closed until that instant, so it is the start gun. Throughput = N / (last ``finished_at`` -
grant time), both read from the database clock. CPU per item: the executor processes' own CPU time
(/proc/PID/stat) and the rest of the machine's busy time (PostgreSQL, mostly) over the drain.

Scenarios: no lanes / 100 random source lanes / 100 random target lanes, with one and two executor
processes; a handler that takes the event + payload; then the claim statement's latency (batch 64)
with 10k vs 1M ready rows, the claims alternating between the two databases.
"""

from __future__ import annotations

import asyncio
import contextlib
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
WORKERS_PER_PROCESS = 16
# Items a process holds ahead of its workers (CONNECTOR_EXECUTOR_PREFETCH): the same local window as
# graphile-worker's batched configuration (localQueue size 500, graphile_worker_peer.LOCAL_QUEUE_SIZE),
# so both hold 516 jobs at most. The service's default is one claim batch.
PREFETCH = 500


async def noop(ctx: Any) -> None:
    """The benchmark handler: does nothing, reads nothing."""
    return None


noop.connector_needs_event = False  # type: ignore[attr-defined]


async def noop_with_event(ctx: Any) -> None:
    """Like ``noop`` but the executor reads the event fact and payload for it (one batched query)."""
    return None


HANDLER_WITH_EVENT = "benchmarks.executor_bench:noop_with_event"


def _spawn(url: str, env_extra: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": url,
        "CONNECTOR_EXECUTOR_WORKERS": str(WORKERS_PER_PROCESS),
        "CONNECTOR_EXECUTOR_GRPC_PORT": "0",
        "CONNECTOR_EXECUTOR_METRICS_PORT": "0",
        "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "0",
        "CONNECTOR_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
        **env_extra,
    }
    return subprocess.Popen(
        # The running interpreter's environment, wherever it is (not a .venv beside the checkout).
        [sys.executable, "-m", "connector.cli.main", "executor", "--no-admin"],
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


def _db_stats(db: Any) -> dict[str, float]:
    row = db.execute(
        """SELECT xact_commit, xact_rollback, blks_hit + blks_read, tup_updated, tup_fetched
           FROM pg_stat_database WHERE datname = current_database()"""
    ).fetchone()
    keys = ("commits", "rollbacks", "blocks", "rows_updated", "rows_fetched")
    return {k: float(v) for k, v in zip(keys, row, strict=True)}


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
    rate: tuple[int, float, int] | None = None,
    debounce_keys: int = 0,
    breaker: bool = False,
) -> dict[str, Any]:
    """``rate``: every item gets one of 100 random rate-limit keys, each key (limit, period_s,
    burst) (docs/adr/011-rate-limits.md). ``debounce_keys``: the work type is debounced and every
    item gets one of that many random keys, created through the materializer's insert in batches of
    1,000 (docs/packs.md#debounce); the drain ends when every item is ``succeeded`` or
    ``coalesced`` (rate = items, i.e. events, per second; ``executions`` says how many ran).
    ``breaker``: the work type declares a circuit breaker (docs/adr/013-circuit-breakers.md) that
    stays closed (the handler never fails): every item carries the handler target's circuit."""
    import psycopg

    from benchmarks.common import LANES, fresh_migrated_database
    from tests.executor import seed

    rnd = random.Random(42)
    keys = [f"k{rnd.randrange(LANES)}" for _ in range(n)] if lanes or rate else None
    with fresh_migrated_database("executor") as url, psycopg.connect(url, autocommit=True) as db:
        wt = seed.python_work_type(handler)
        if debounce_keys:
            wt["debounce"] = {"window_s": DEBOUNCE_WINDOW_S, "key": "{/k}"}
        circuit: str | None = None
        if breaker:
            from connector.common.packs.manifest import HandlerSpec, circuit_target

            wt["circuit_breaker"] = BREAKER
            circuit = circuit_target(HandlerSpec(kind="python", target=handler))
        pack = seed.seed_pack(db, "bench", {"w": wt}, authority=False)
        if debounce_keys:
            dkeys = [f"d{rnd.randrange(debounce_keys)}" for _ in range(n)]

            async def _seed() -> None:
                adb = await psycopg.AsyncConnection.connect(url, autocommit=True)
                try:
                    await seed.seed_debounced(adb, pack, dkeys, window_s=DEBOUNCE_WINDOW_S, chunk=1000)
                finally:
                    await adb.close()

            asyncio.run(_seed())
        for start in range(0, n if not debounce_keys else 0, 50_000):
            m = min(50_000, n - start)
            part = keys[start : start + m] if keys else None
            seed.seed_items(
                db,
                pack,
                m,
                source_lanes=part if lanes == "source" else None,
                target_lanes=part if lanes == "target" else None,
                rate_keys=part if rate else None,
                rate_limit=rate or (1, 1.0, 1),
                circuit_keys=[circuit] * m if circuit else None,
                circuit=BREAKER if circuit else None,
            )
        db.execute("VACUUM ANALYZE connector_work_item")
        db.execute("CHECKPOINT")
        env = {
            "CONNECTOR_EXECUTOR_CLAIM_BATCH": str(claim_batch),
            "CONNECTOR_EXECUTOR_PREFETCH": str(PREFETCH),
        }
        children = [_spawn(url, env) for _ in range(procs)]
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
                lambda: (
                    db.execute(  # type: ignore[index]
                        "SELECT count(*) FROM connector_process WHERE service = 'executor'"
                    ).fetchone()[0]
                    == procs
                ),
                30,
            )
            db_stats0 = _db_stats(db)
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
                        str(Path(sys.executable).with_name("py-spy")),
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
                        "WHERE installed_pack_id = %s AND state IN ('succeeded', 'coalesced')",
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
            executions = db.execute(  # type: ignore[index]
                "SELECT count(*) FROM connector_work_item WHERE state = 'succeeded'"
            ).fetchone()[0]
            rate_view = _rate_view(db, granted) if rate else {}
            stop_vacuum.set()
            for c in children:
                c.terminate()
            for c in children:
                c.wait(20)
            time.sleep(1.0)  # backends report their statistics at exit / within a second
            db_stats1 = _db_stats(db)
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
    per_item = {k: round((db_stats1[k] - db_stats0[k]) / n, 2) for k in db_stats0}
    other_cpu = (busy1 - busy0) - executor_cpu  # PostgreSQL, mostly (plus this poller and the OS)
    return {
        "items": n,
        "seconds": round(elapsed, 3),
        "executor_cpu_us_per_item": round(executor_cpu / n * 1e6, 1),
        "postgres_and_other_cpu_us_per_item": round(other_cpu / n * 1e6, 1),
        # Load-independent: what the database did per item (pg_stat_database of the scratch DB,
        # including the poller's count(*) every 0.5 s and the vacuum stand-in when on).
        "db_per_item": per_item,
        "items_per_s": round(n / elapsed),
        **rate_view,
        "reclaimed_or_retried": stale,
        "vacuums": vacuums,
        "executions": executions,
    }


def _rate_view(db: Any, granted: Any) -> dict[str, float]:
    """What a rate-limited drain did with its budgets: the claim rate while every key still had
    items (up to the moment the first key claimed its last one: the random key spread leaves the
    last keys' tails alone at the end), and how late the deferred items were claimed after their
    due time (``started_at - run_after``; ``run_after`` is the time their budget was expected)."""
    row = db.execute(
        """WITH ends AS (SELECT rate_key, max(started_at) AS last FROM connector_work_item
                         WHERE rate_key IS NOT NULL GROUP BY 1),
                cut AS (SELECT min(last) AS t FROM ends)
           SELECT (SELECT count(*) FROM connector_work_item w, cut
                   WHERE w.rate_key IS NOT NULL AND w.started_at <= cut.t),
                  extract(epoch FROM (SELECT t FROM cut) - %s)::float8,
                  (SELECT percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (
                          ORDER BY extract(epoch FROM started_at - run_after) * 1000)
                   FROM connector_work_item WHERE rate_key IS NOT NULL AND run_after > %s)""",
        (granted, granted),
    ).fetchone()
    n, span, late = row
    out: dict[str, float] = {}
    if span and span > 0:
        out["while_every_key_has_items_per_s"] = round(n / span)
    if late:
        out["deferred_lateness_p50_ms"] = round(late[0], 1)
        out["deferred_lateness_p90_ms"] = round(late[1], 1)
    return out


async def _claim_latency(urls: list[str], packs: list[int], claims_n: int) -> list[dict[str, float]]:
    """Claims of 64 alternating between the databases, so that whatever else runs on the machine
    weighs on both sides of the ratio alike."""
    import psycopg

    from connector.common.store import work_items

    conns = [await psycopg.AsyncConnection.connect(u, autocommit=True) for u in urls]
    samples: list[list[float]] = [[] for _ in urls]
    try:
        for _ in range(claims_n):
            for i, conn in enumerate(conns):
                t0 = time.perf_counter()
                rows = await work_items.claim.work_item_claim_plain_batch(
                    conn, [packs[i]], ["default"], [64], owner="bench", lease_s=60, keyed={}
                )
                samples[i].append(time.perf_counter() - t0)
                assert len(rows) == 64
        buffers = []
        for i, conn in enumerate(conns):
            # Buffers one claim touches (EXPLAIN ANALYZE inside a rolled-back transaction): the
            # load-independent form of "claim cost does not grow with backlog depth".
            async with conn.transaction(force_rollback=True):
                cur = await conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH,
                    {
                        "packs": [packs[i]],
                        "queue_classes": ["default"],
                        "limits": [64],
                        "owner": "bench",
                        "lease_s": 60.0,
                        "process": None,
                    },
                )
                plan = (await cur.fetchone())[0][0]["Plan"]  # type: ignore[index]
                buffers.append(int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)))
    finally:
        for conn in conns:
            await conn.close()
    out = []
    for i, xs in enumerate(samples):
        xs.sort()
        out.append(
            {
                "p50_ms": round(statistics.median(xs) * 1000, 3),
                "p90_ms": round(xs[int(len(xs) * 0.9)] * 1000, 3),
                "buffers_per_claim": buffers[i],
            }
        )
    return out


def claim_latency(small: int, large: int, claims_n: int = 100) -> dict[str, Any]:
    import psycopg

    from benchmarks.common import fresh_migrated_database
    from tests.executor import seed

    with (
        fresh_migrated_database("executor_lat") as url_s,
        fresh_migrated_database("executor_lat") as url_l,
    ):
        packs = []
        for url, ready in ((url_s, small), (url_l, large)):
            with psycopg.connect(url, autocommit=True) as db:
                pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type(HANDLER)})
                for start in range(0, ready, 100_000):
                    seed.seed_items(db, pack, min(100_000, ready - start))
                db.execute("VACUUM ANALYZE connector_work_item")
                db.execute("CHECKPOINT")
                packs.append(pack)
        res_s, res_l = asyncio.run(_claim_latency([url_s, url_l], packs, min(claims_n, small // 64 - 2)))
    return {
        "small": {"ready": small, **res_s},
        "large": {"ready": large, **res_l},
        "ratio_p50": round(res_l["p50_ms"] / res_s["p50_ms"], 3),
    }


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


SCENARIOS = (
    # name, processes, lanes, contract key (docs/benchmarks.md) or an extra row's key
    ("nolanes-1p", 1, None, "executor.drain_per_s"),
    ("nolanes-2p", 2, None, "executor.drain_2proc_per_s"),
    ("source100-1p", 1, "source", "executor.drain_lanes_per_s"),
    ("source100-2p", 2, "source", "executor.drain_lanes_2proc_per_s"),
    ("target100-1p", 1, "target", "executor.drain_target_lanes_per_s"),
    ("target100-2p", 2, "target", "executor.drain_target_lanes_2proc_per_s"),
)
QUICK = ("nolanes-1p", "nolanes-2p", "source100-1p")
# Rate-limited drains (one process, no lanes, 100 random keys): limits far above capacity (the cost of
# the check when it does not bind), and limits that bind (10/s per key, 1,000/s in all).
RATE_LOOSE = (100_000, 1.0, 1_000)
RATE_BINDING = (10, 1.0, 1)
RATE_BINDING_ITEMS = 10_000
# Debounced drain: every item on one of 1,000 random keys, all created before the start gun (so each
# key's items wait together and become one execution of its newest); a window shorter than the
# setup, so every key is due at the start.
DEBOUNCE_KEYS = 1_000
DEBOUNCE_WINDOW_S = 0.01
# A declared circuit breaker that stays closed (docs/adr/013-circuit-breakers.md): the cost of the
# gate (a KEY SHARE lock of the target's circuit row per claim) and of the feed when nothing fails.
BREAKER = {"consecutive_failures": 5, "open_s": 30}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import (
        LANES,
        WORKERS,
        bench_lock,
        drain_items,
        make_row,
        stage_argparser,
        write_json_out,
    )

    ap = stage_argparser(__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, help="items per drain (default: the suite's 50,000; quick 1,000)")
    ap.add_argument("--profile", action="store_true", help="py-spy the 1-process no-lane drain")
    ap.add_argument("--claim-batch", type=int, default=256)
    ap.add_argument(
        "--vacuum-every",
        type=float,
        default=2.0,
        help="period of the autovacuum stand-in for --vacuum-standin runs (seconds)",
    )
    ap.add_argument(
        "--vacuum-standin",
        action="store_true",
        help="also run every drain with a VACUUM of the WorkItem table every --vacuum-every seconds "
        "(this server runs with autovacuum=off; the table's own settings assume it is on)",
    )
    ap.add_argument("--only", help="comma-separated scenario names (and 'with-event-1p', 'latency')")
    args = ap.parse_args(argv)
    n = args.items or drain_items(args.quick)
    small, large = (10_000, 30_000) if args.quick else (10_000, 1_000_000)
    only = set(args.only.split(",")) if args.only else (set(QUICK) | {"latency"} if args.quick else None)
    rows: list[dict[str, Any]] = []
    extra_base = {
        "items": n,
        "workers": WORKERS,
        "lanes": LANES,
        "claim_batch": args.claim_batch,
        "prefetch": PREFETCH,
    }
    with bench_lock():
        batch = args.claim_batch
        print(
            f"executor benchmark: {n} items per drain, {WORKERS} workers per process, claim batch {batch},"
            f" prefetch {PREFETCH}"
        )
        modes = [0.0, args.vacuum_every] if args.vacuum_standin else [0.0]
        for name, procs, lanes, key in SCENARIOS:
            if only and name not in only:
                continue
            for vac in modes:
                res = drain(n, procs=procs, lanes=lanes, claim_batch=args.claim_batch, vacuum_s=vac)
                tag = f"VACUUM every {vac:g}s (autovacuum stand-in)" if vac else "no vacuum"
                lane_text = {None: "no lanes", "source": "100 source lanes", "target": "100 target lanes"}[
                    lanes
                ]
                rows.append(
                    make_row(
                        key + ("_vacuum_standin" if vac else ""),
                        f"executor no-op drain, {lane_text}, 16 workers x {procs} process"
                        + ("es" if procs > 1 else "")
                        + (f", {tag}" if vac else ""),
                        res["items_per_s"],
                        "items/s",
                        extra={**extra_base, "processes": procs, **res},
                    )
                )
                rate = f"{res['items_per_s']:>8,}"
                dbi = res["db_per_item"]
                print(
                    f"  {name:14s} {rate} items/s  ({res['items']} in {res['seconds']}s, {tag}; CPU/item: "
                    f"executor {res['executor_cpu_us_per_item']} us, postgres+other "
                    f"{res['postgres_and_other_cpu_us_per_item']} us; per item in the database: "
                    f"{dbi['blocks']} blocks, {dbi['rows_updated']} row updates, {dbi['commits']} commits)",
                    flush=True,
                )
        unlimited = next((r for r in rows if r["key"] == "executor.drain_per_s"), None)
        if not only or "rate100-loose-1p" in only:
            res = drain(n, procs=1, lanes=None, claim_batch=args.claim_batch, rate=RATE_LOOSE)
            ref = unlimited["value"] if unlimited else None
            ratio = round(res["items_per_s"] / ref, 3) if ref else None
            rows.append(
                make_row(
                    "executor.drain_rate_loose_per_s",
                    "executor no-op drain, 100 rate-limited keys whose limits exceed capacity, 1 process",
                    res["items_per_s"],
                    "items/s",
                    extra={
                        **extra_base,
                        "processes": 1,
                        "rate_limit": RATE_LOOSE,
                        "vs_unlimited": ratio,
                        **res,
                    },
                )
            )
            print(
                f"  {'rate100-loose-1p':14s} {res['items_per_s']:>8,} items/s  (limits not binding; "
                f"vs the unlimited drain of this run: {ratio}; CPU/item: executor "
                f"{res['executor_cpu_us_per_item']} us, postgres+other "
                f"{res['postgres_and_other_cpu_us_per_item']} us)",
                flush=True,
            )
        if not only or "rate100-binding-1p" in only:
            m = min(n, RATE_BINDING_ITEMS)
            res = drain(m, procs=1, lanes=None, claim_batch=args.claim_batch, rate=RATE_BINDING)
            total = 100 * RATE_BINDING[0] / RATE_BINDING[1]
            ratio = round(res["items_per_s"] / total, 3)
            rows.append(
                make_row(
                    "executor.drain_rate_binding_per_s",
                    f"executor no-op drain, 100 keys limited to {RATE_BINDING[0]}/s each "
                    f"({total:,.0f}/s in all), 1 process",
                    res["items_per_s"],
                    "items/s",
                    extra={
                        **extra_base,
                        "items": m,
                        "processes": 1,
                        "rate_limit": RATE_BINDING,
                        "sum_of_limits_per_s": total,
                        "vs_sum_of_limits": ratio,
                        **res,
                    },
                )
            )
            print(
                f"  {'rate100-bind-1p':14s} {res['items_per_s']:>8,} items/s  ({m} items; sum of limits "
                f"{total:,.0f}/s: achieved {ratio} of it; while every key had items "
                f"{res.get('while_every_key_has_items_per_s', 0):,}/s; deferred items claimed "
                f"{res.get('deferred_lateness_p50_ms')} / {res.get('deferred_lateness_p90_ms')} ms "
                "after their due time, p50 / p90)",
                flush=True,
            )
        if not only or "debounce1000-1p" in only:
            res = drain(n, procs=1, lanes=None, claim_batch=args.claim_batch, debounce_keys=DEBOUNCE_KEYS)
            ref = unlimited["value"] if unlimited else None
            ratio = round(res["items_per_s"] / ref, 3) if ref else None
            rows.append(
                make_row(
                    "executor.drain_debounce_per_s",
                    f"executor no-op drain, debounce on {DEBOUNCE_KEYS:,} keys (items/s: executed or "
                    "coalesced), 1 process",
                    res["items_per_s"],
                    "items/s",
                    extra={
                        **extra_base,
                        "processes": 1,
                        "debounce_keys": DEBOUNCE_KEYS,
                        "vs_unlimited": ratio,
                        **res,
                    },
                )
            )
            print(
                f"  {'debounce1000-1p':14s} {res['items_per_s']:>8,} items/s  ({res['executions']} "
                f"executions covering {res['items']} items; vs the unlimited drain of this run: {ratio})",
                flush=True,
            )
        for name, procs, ref_key in (
            ("breaker-closed-1p", 1, "executor.drain_per_s"),
            ("breaker-closed-2p", 2, "executor.drain_2proc_per_s"),
        ):
            if only and name not in only:
                continue
            res = drain(n, procs=procs, lanes=None, claim_batch=args.claim_batch, breaker=True)
            reference = next((r for r in rows if r["key"] == ref_key), None)
            ratio = round(res["items_per_s"] / reference["value"], 3) if reference else None
            rows.append(
                make_row(
                    f"executor.drain_breaker_closed{'_2proc' if procs > 1 else ''}_per_s",
                    f"executor no-op drain, a declared circuit breaker that stays closed, {procs} process"
                    + ("es" if procs > 1 else ""),
                    res["items_per_s"],
                    "items/s",
                    extra={
                        **extra_base,
                        "processes": procs,
                        "circuit_breaker": BREAKER,
                        "vs_unlimited": ratio,
                        **res,
                    },
                )
            )
            print(
                f"  {name:14s} {res['items_per_s']:>8,} items/s  (breaker declared, closed; vs the unlimited "
                f"drain of this run: {ratio})",
                flush=True,
            )
        if not only or "with-event-1p" in only:
            res = drain(n, procs=1, lanes=None, claim_batch=args.claim_batch, handler=HANDLER_WITH_EVENT)
            rows.append(
                make_row(
                    "executor.drain_with_event_per_s",
                    "executor no-op drain, handler takes event fact + payload (one batched read per claim)",
                    res["items_per_s"],
                    "items/s",
                    extra={**extra_base, "processes": 1, **res},
                )
            )
            print(
                f"  {'with-event-1p':14s} {res['items_per_s']:>8,} items/s  (handler reads event + payload)"
            )
        if args.profile:
            res = drain(
                n, procs=1, lanes=None, claim_batch=args.claim_batch, profile_s=4 if args.quick else 6
            )
            summary = _profile_summary("/tmp/executor-bench-profile.txt")
            rate = f"{res['items_per_s']:,}"
            print(f"  profiled drain {rate} items/s; event-loop thread, {summary['samples']} samples")
            print("    inclusive: " + ", ".join(f"{k} {v}%" for k, v in summary["inclusive_pct"].items()))
            for fn, pct in summary["self_pct"]:
                print(f"    {pct:5.1f}%  {fn}")
        if not only or "latency" in only:
            lat = claim_latency(small, large)
            s_, l_ = lat["small"], lat["large"]
            print(
                f"  claim p50 (batch 64, interleaved): {s_['p50_ms']} ms at {small:,} ready, "
                f"{l_['p50_ms']} ms at {large:,} ready; ratio {lat['ratio_p50']}; buffers per claim "
                f"{s_['buffers_per_claim']} vs {l_['buffers_per_claim']}"
            )
            rows.append(
                make_row(
                    "executor.claim_p50_10k_ms",
                    f"claim p50, batch 64, {small:,} ready",
                    s_["p50_ms"],
                    "ms",
                    extra=s_,
                )
            )
            rows.append(
                make_row(
                    "executor.claim_p50_1m_ms",
                    f"claim p50, batch 64, {large:,} ready",
                    l_["p50_ms"],
                    "ms",
                    extra=l_,
                )
            )
            rows.append(
                make_row(
                    "executor.claim_ratio",
                    f"claim latency p50, {large:,} vs {small:,} ready items",
                    lat["ratio_p50"],
                    "ratio",
                    extra={"claims_interleaved": True, **lat},
                )
            )
    write_json_out(args.json_out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
