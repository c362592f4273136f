"""Sustained end-to-end run: cost must not grow with the work (issue #29 item 5).

    .venv/bin/python -m benchmarks.sustained [--duration 1800] [--fraction 0.7] [--max-rate R]
                                             [--window 60] [--verdict-windows 5] [--json-out PATH]
    ./dev bench --long                      # the suite plus this run (not in CI)
    ./dev bench --only sustained

The pipeline of ``benchmarks.e2e_bench`` (its pack, its three service processes, its load
generator process and its CPU sampler; ``e2e_bench.start_services``) on a fresh migrated database,
with the services' **upkeep on** (mode ``auto``, as shipped) and **retention on**: deliveries retired
more than ``--retention-s`` ago (default 2 windows + 30 s) are deleted by the executor's sweep every
``min(60, window)`` s, so the queue tables can reach a steady state within the run.

1. **The maximum**: unless ``--max-rate`` is given, a closed-loop probe (``--concurrency`` 64
   connections, ``--probe`` s after a 2 s warm-up) measures executed deliveries/s on this machine now;
   the backlog it leaves is drained before the run;
2. **The run**: an open loop at ``--fraction`` (70 %) of that maximum for ``--duration`` s (send times
   are due times: no coordinated omission). Every ``--window`` s (60; the "minute") the harness reads:

   - latency received -> executed (``finished_at - received_at``) p50 / p99 of every delivery
     *received* in the window, read ``lag`` s (a quarter window, <= 15 s) after the window ends, before
     retention can delete them: the window's receipts are a ``receipt_id`` range (identity order
     is arrival order), read by primary key; a delivery not executed by then counts with its age
     at the read (a lower bound; the count is printed as ``late``);
   - the sizes of the queue tables and their indexes (``pg_table_size`` / ``pg_indexes_size`` of the
     receipt, event and WorkItem tables; every other ``connector_*`` table summed as ``other``),
     live and dead rows;
   - CPU per delivery of the window (ingress, materializer, executor, PostgreSQL backends of the
     database, PostgreSQL's shared processes; ``/proc``), the figure that does not swing with load;

3. **The verdict** (printed as one line, and rows ``sustained.*``):

   - *p99 flat*: the p99 of all deliveries of the last ``--verdict-windows`` (5) windows <= 1.2x the
     p99 of the first 5;
   - *sizes bounded*: the peak total size (three tables + indexes) of the last 5 windows <= 1.2x the
     peak of the first 5 windows that start after retention's horizon (``retention_s`` + one sweep
     interval after the load began: before it nothing is deleted, so growth there is expected).

   A run too short for two disjoint groups of 5 windows says so instead of a verdict.

``--quick`` is a smoke run (90 s, 10 s windows, a 10 s probe, verdict over 3 windows): it exercises
the tooling, it judges nothing. A 30-minute run needs a quiet machine (the p99 of a loaded 2-core
machine swings with the neighbours, not with the tables); the CPU-per-delivery and size series do
not swing with load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import e2e_bench  # noqa: E402

QUEUE_TABLES = ("connector_ingress_receipt", "connector_event", "connector_work_item")
SHORT = {
    "connector_ingress_receipt": "receipt",
    "connector_event": "event",
    "connector_work_item": "work_item",
}
#: CPU labels of ``e2e_bench.CpuSampler`` summed per delivery, in print order.
CPU_LABELS = ("ingress", "materializer", "executor", "postgres", "postgres shared")
RATIO_LIMIT = 1.2

_SIZES = """
SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid), coalesce(s.n_live_tup, 0),
       coalesce(s.n_dead_tup, 0)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND c.relname LIKE 'connector\\_%%'
"""

_WINDOW_LATENCY = """
SELECT extract(epoch FROM coalesce(w.finished_at, clock_timestamp()) - r.received_at)::float8,
       w.finished_at IS NULL
FROM connector_ingress_receipt r
LEFT JOIN connector_event e ON e.receipt_id = r.receipt_id
LEFT JOIN connector_work_item w ON w.event_id = e.event_id
WHERE r.receipt_id > %(lo)s AND r.receipt_id <= %(hi)s
"""


def sizes(conn: Any) -> dict[str, dict[str, int]]:
    """Per queue table (short name) and ``other`` (every other connector_* table summed): bytes of
    the table (with TOAST), of its indexes, live and dead rows."""
    out: dict[str, dict[str, int]] = {}
    for name, table, index, live, dead in conn.execute(_SIZES).fetchall():
        key = SHORT.get(name, "other")
        acc = out.setdefault(key, {"table": 0, "index": 0, "live": 0, "dead": 0})
        for k, v in (("table", table), ("index", index), ("live", live), ("dead", dead)):
            acc[k] += int(v)
    return out


def queue_bytes(size: dict[str, dict[str, int]]) -> int:
    """Tables + indexes of the three queue tables (pg_total_relation_size summed)."""
    return sum(v["table"] + v["index"] for k, v in size.items() if k != "other")


def retention_deleted(port: int) -> float | None:
    """Receipts the executor's retention sweep deleted so far (``connector_retention_deleted_total``
    of the receipt table on its metrics port); None when the endpoint does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith('connector_retention_deleted_total{table="connector_ingress_receipt"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0  # no sweep deleted anything yet


def _max_receipt_id(conn: Any) -> int:
    (v,) = conn.execute("SELECT coalesce(max(receipt_id), 0) FROM connector_ingress_receipt").fetchone()
    return int(v)


def _pct(values: list[float], p: float) -> float | None:
    return e2e_bench._pct(values, p) if values else None


def verdict(
    windows: list[dict[str, Any]],
    latencies: dict[int, list[float]],
    *,
    n: int,
    steady_from: float,
    limit: float = RATIO_LIMIT,
) -> dict[str, Any]:
    """The verdict over the window series. ``latencies`` holds the sorted latencies (s) of at least
    the first ``n`` and the last ``n`` windows, by window index; ``steady_from`` is the load-relative
    second from which retention deletes (sizes are judged only on windows starting then or later).
    Returns the two ratios (None when the run is too short to judge) and ``ok``."""
    out: dict[str, Any] = {"n": n, "limit": limit}
    idx = [w["i"] for w in windows]
    if len(idx) >= 2 * n:
        first = sorted(x for i in idx[:n] for x in latencies.get(i, []))
        last = sorted(x for i in idx[-n:] for x in latencies.get(i, []))
        p_first, p_last = _pct(first, 0.99), _pct(last, 0.99)
        out["p99_first_ms"] = None if p_first is None else round(p_first * 1000, 2)
        out["p99_last_ms"] = None if p_last is None else round(p_last * 1000, 2)
        out["p99_ratio"] = round(p_last / p_first, 3) if p_first and p_last is not None else None
    else:
        out["p99_ratio"] = None
        out["p99_why"] = f"{len(idx)} windows: needs {2 * n} for two disjoint groups of {n}"
    steady = [w for w in windows if w["t0"] >= steady_from]
    if len(steady) >= 2 * n:
        peak_first = max(w["queue_bytes"] for w in steady[:n])
        peak_last = max(w["queue_bytes"] for w in steady[-n:])
        out["size_first_bytes"], out["size_last_bytes"] = peak_first, peak_last
        out["size_ratio"] = round(peak_last / peak_first, 3) if peak_first else None
        out["size_windows"] = (steady[0]["i"], steady[n - 1]["i"])
    else:
        out["size_ratio"] = None
        out["size_why"] = (
            f"{len(steady)} windows after retention's horizon ({steady_from:.0f} s): needs {2 * n}"
        )
    ratios = (out["p99_ratio"], out["size_ratio"])
    out["ok"] = None if None in ratios else all(r is not None and r <= limit for r in ratios)
    return out


def verdict_line(v: dict[str, Any]) -> str:
    n, limit = v["n"], v["limit"]
    if v["p99_ratio"] is None:
        lat = f"p99 not judged ({v.get('p99_why', 'no deliveries')})"
    else:
        lat = (
            f"p99 last {n} windows {v['p99_last_ms']:,.1f} ms vs first {n} {v['p99_first_ms']:,.1f} ms "
            f"= {v['p99_ratio']:.2f}x (<= {limit:g}x: {'yes' if v['p99_ratio'] <= limit else 'NO'})"
        )
    if v["size_ratio"] is None:
        size = f"sizes not judged ({v['size_why']})"
    else:
        a, b = v["size_windows"]
        size = (
            f"queue tables + indexes peak last {n} windows {v['size_last_bytes'] / 2**20:,.1f} MiB vs "
            f"windows {a}-{b} {v['size_first_bytes'] / 2**20:,.1f} MiB = {v['size_ratio']:.2f}x "
            f"(<= {limit:g}x: {'yes' if v['size_ratio'] <= limit else 'NO'})"
        )
    word = {True: "PASS", False: "FAIL", None: "NOT JUDGED"}[v["ok"]]
    return f"sustained: verdict {word}: {lat}; {size}"


def _wait_idle(conn: Any, procs: dict[str, subprocess.Popen[bytes]], limit_s: float) -> float:
    """Wait until nothing is left to route or execute; returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        (left,) = conn.execute(
            "SELECT (SELECT count(*) FROM connector_work_item WHERE state NOT IN"
            "        ('succeeded', 'dead', 'cancelled', 'coalesced'))"
            "     + (SELECT count(*) FROM connector_ingress_receipt WHERE router_status IN"
            "        ('pending', 'routing', 'retry'))"
        ).fetchone()
        if left == 0:
            return time.monotonic() - t0
        e2e_bench._check_alive(procs)
        if time.monotonic() - t0 > limit_s:
            raise RuntimeError(f"{left} deliveries still unfinished {limit_s:g} s after the probe")
        time.sleep(0.25)


def _probe(conn: Any, services: e2e_bench.Services, args: argparse.Namespace) -> dict[str, Any]:
    """Closed loop for ``args.probe`` s: executed deliveries/s (WorkItems finished in the window)."""
    cfg = {
        "host": "127.0.0.1",
        "port": services.http_port,
        "concurrency": args.concurrency,
        "duration": args.probe,
        "warmup": 2.0,
        "body_bytes": args.body_bytes,
        "rate": 0.0,
    }
    gen = e2e_bench.spawn_loadgen(cfg, services.secret)
    out, _ = gen.communicate(timeout=args.probe + 120)
    if gen.returncode != 0:
        raise RuntimeError(f"load generator (probe) exited with code {gen.returncode}")
    load = json.loads(out.strip().splitlines()[-1])
    w0, w1 = load["window_start"], load["window_end"]
    time.sleep(1.0)  # the window's last executions commit
    (executed,) = conn.execute(
        "SELECT count(*) FROM connector_work_item"
        " WHERE finished_at >= to_timestamp(%s) AND finished_at < to_timestamp(%s)",
        (w0, w1),
    ).fetchone()
    waited = _wait_idle(conn, services.procs, 300.0)
    return {
        "executed_per_s": executed / max(1e-9, w1 - w0),
        "window_s": w1 - w0,
        "accepted_per_s": load["accepted_in_window"] / max(1e-9, w1 - w0),
        "drained_s": waited,
    }


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import psycopg

    retention_interval = min(60.0, args.window)
    lag = min(15.0, args.window / 4)
    if args.retention_s <= args.window + lag + 5:
        raise SystemExit(
            f"sustained: --retention-s {args.retention_s:g} must exceed the window + its read lag + 5 s "
            f"({args.window + lag + 5:g}): a window's deliveries must outlive their read"
        )
    extra_env = {
        "CONNECTOR_EXECUTOR_RETENTION_DELIVERED_S": f"{args.retention_s:g}",
        "CONNECTOR_EXECUTOR_RETENTION_INTERVAL_S": f"{retention_interval:g}",
    }
    t_setup = time.monotonic()
    services = e2e_bench.start_services(url, upkeep="auto", extra_env=extra_env)
    procs = services.procs
    sampler = e2e_bench.CpuSampler(
        {k: p.pid for k, p in procs.items()}, services.dbname, interval=1.0, url=url
    )
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            e2e_bench._wait_ready(services.http_port, procs)
            e2e_bench._prime(conn, services.http_port, services.secret, procs)
            print(f"sustained: services up and primed in {time.monotonic() - t_setup:.1f} s", flush=True)
            if args.max_rate:
                probe: dict[str, Any] = {"executed_per_s": args.max_rate, "given": True}
            else:
                probe = _probe(conn, services, args)
                print(
                    f"sustained: maximum (closed loop, c={args.concurrency}, {probe['window_s']:.0f} s) "
                    f"{probe['executed_per_s']:,.0f} executed/s; backlog drained in "
                    f"{probe['drained_s']:.1f} s",
                    flush=True,
                )
            rate = round(args.fraction * probe["executed_per_s"], 1)
            print(
                f"sustained: open loop at {rate:,.0f}/s ({args.fraction:.0%}) for {args.duration:g} s, "
                f"windows of {args.window:g} s (read {lag:g} s after each), retention {args.retention_s:g} s "
                f"every {retention_interval:g} s, upkeep auto",
                flush=True,
            )
            res = _sustain(conn, services, sampler, args, rate, lag, retention_interval)
            res["probe"] = probe
            res["rate"] = rate
            e2e_bench._check_alive(procs)
    finally:
        sampler.stop()
        e2e_bench._stop(list(procs.values()))
    return res


def _sustain(
    conn: Any,
    services: e2e_bench.Services,
    sampler: e2e_bench.CpuSampler,
    args: argparse.Namespace,
    rate: float,
    lag: float,
    retention_interval: float,
) -> dict[str, Any]:
    cfg = {
        "host": "127.0.0.1",
        "port": services.http_port,
        "concurrency": args.concurrency,
        "duration": args.duration,
        "warmup": 0.0,
        "body_bytes": args.body_bytes,
        "rate": rate,
    }
    sampler.start()
    time.sleep(0.2)
    start = time.time()
    gen = e2e_bench.spawn_loadgen(cfg, services.secret)
    sampler.name("load_generator", gen.pid)
    n_windows = max(1, int(args.duration // args.window))
    bounds: list[tuple[float, int]] = [(start, _max_receipt_id(conn))]  # (time, max receipt id)
    port = services.metrics["executor"]
    deleted: list[float | None] = [retention_deleted(port)]  # at each bound
    windows: list[dict[str, Any]] = []
    keep_first: dict[int, list[float]] = {}
    keep_last: deque[tuple[int, list[float]]] = deque(maxlen=args.verdict_windows)
    pending: list[int] = []  # windows whose bounds are known, latency not read yet
    print(
        "  window   t s   recv/s  lat p50 / p99 ms  late | receipt  event  work_item  (tables+indexes MiB)"
        " | dead rows  del/s | CPU us/delivery: ingress mat exec pg pg-shared = total",
        flush=True,
    )

    def read_window(i: int) -> None:
        (t0, lo), (t1, hi) = bounds[i], bounds[i + 1]
        rows = conn.execute(_WINDOW_LATENCY, {"lo": lo, "hi": hi}).fetchall()
        lat = sorted(float(r[0]) for r in rows)
        late = sum(1 for r in rows if r[1])
        size = windows[i]["sizes"]
        cores = sampler.cores_between(t0, t1)
        cores["postgres shared"] = sum(v for k, v in cores.items() if k.startswith("postgres shared: "))
        per_s = len(rows) / max(1e-9, t1 - t0)
        cpu = {k: round(cores.get(k, 0.0) / per_s * 1e6, 1) if per_s else None for k in CPU_LABELS}
        cpu_total = round(sum(v for v in cpu.values() if v is not None), 1)
        for k in e2e_bench.BACKENDS:  # the postgres figure split by the service it served
            if k in cores and per_s:
                cpu[k] = round(cores[k] / per_s * 1e6, 1)
        w = windows[i]
        d0, d1 = deleted[i], deleted[i + 1]
        del_s = None if d0 is None or d1 is None else round((d1 - d0) / max(1e-9, t1 - t0), 1)
        w.update(
            retention_deleted_per_s=del_s,
            received=len(rows),
            received_per_s=round(per_s, 1),
            late=late,
            p50_ms=round(e2e_bench._pct(lat, 0.5) * 1000, 2) if lat else None,
            p99_ms=round(e2e_bench._pct(lat, 0.99) * 1000, 2) if lat else None,
            cpu_us_per_delivery=cpu,
            cpu_us_total=cpu_total,
            machine_busy_cores=round(cores.get("machine", 0.0), 2),
        )
        if i < args.verdict_windows:
            keep_first[i] = lat
        keep_last.append((i, lat))

        def mib(k: str) -> str:
            v = size.get(k, {"table": 0, "index": 0})
            return f"{(v['table'] + v['index']) / 2**20:7.1f}"

        dead = sum(v["dead"] for k, v in size.items() if k != "other")
        print(
            f"  {i:>5} {w['t0']:>5.0f} {per_s:>8,.0f}  {w['p50_ms'] or 0:>7.1f} / {w['p99_ms'] or 0:>7.1f} "
            f"{late:>5} | {mib('receipt')} {mib('event')} {mib('work_item')} | {dead:>9,} "
            f"{'n/a' if del_s is None else f'{del_s:,.0f}':>6} | "
            + " ".join(f"{cpu[k] or 0:.0f}" for k in CPU_LABELS)
            + f" = {cpu_total:.0f}",
            flush=True,
        )

    try:
        for i in range(n_windows):
            boundary = start + (i + 1) * args.window
            while True:  # read due windows while waiting for the boundary
                now = time.time()
                if now >= boundary:
                    break
                if pending and now >= bounds[pending[0] + 1][0] + lag:
                    read_window(pending.pop(0))
                    continue
                wake = boundary if not pending else min(boundary, bounds[pending[0] + 1][0] + lag)
                time.sleep(max(0.0, min(1.0, wake - now)))
                if gen.poll() is not None and gen.returncode != 0:
                    raise RuntimeError(f"load generator exited with code {gen.returncode}")
                e2e_bench._check_alive(services.procs)
            bounds.append((time.time(), _max_receipt_id(conn)))
            deleted.append(retention_deleted(port))
            size = sizes(conn)
            windows.append(
                {
                    "i": i,
                    "t0": round(bounds[i][0] - start, 1),
                    "t1": round(bounds[i + 1][0] - start, 1),
                    "sizes": size,
                    "queue_bytes": queue_bytes(size),
                }
            )
            pending.append(i)
        out, _ = gen.communicate(timeout=args.window + 120)
        if gen.returncode != 0:
            raise RuntimeError(f"load generator exited with code {gen.returncode}")
        load = json.loads(out.strip().splitlines()[-1])
        while pending:
            due = bounds[pending[0] + 1][0] + lag
            time.sleep(max(0.0, due - time.time()))
            read_window(pending.pop(0))
    finally:
        if gen.poll() is None:
            gen.kill()
    latencies = {**keep_first, **dict(keep_last)}
    steady_from = args.retention_s + retention_interval
    v = verdict(windows, latencies, n=args.verdict_windows, steady_from=steady_from)
    (dead_items,) = conn.execute("SELECT count(*) FROM connector_work_item WHERE state = 'dead'").fetchone()
    (failed,) = conn.execute(
        "SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'failed'"
    ).fetchone()
    return {
        "windows": windows,
        "verdict": v,
        "load": {
            k: load[k]
            for k in ("accepted_total", "statuses", "ack_p50_ms", "ack_p99_ms", "late_sends", "late_p99_ms")
        },
        "dead_work_items": int(dead_items),
        "failed_receipts": int(failed),
        "steady_from_s": steady_from,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def _rows(args: argparse.Namespace, res: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks import common

    v = res["verdict"]
    series = [
        {
            k: w.get(k)
            for k in (
                "i",
                "t0",
                "received_per_s",
                "p50_ms",
                "p99_ms",
                "late",
                "queue_bytes",
                "retention_deleted_per_s",
                "cpu_us_total",
                "cpu_us_per_delivery",
                "machine_busy_cores",
            )
        }
        for w in res["windows"]
    ]
    extra = {
        "duration_s": args.duration,
        "window_s": args.window,
        "fraction": args.fraction,
        "rate": res["rate"],
        "probe": res["probe"],
        "retention_s": args.retention_s,
        "verdict": v,
        "series": series,
        "load": res["load"],
        "loadavg_end": res["loadavg_end"],
    }
    name = f"{args.duration:g} s at {args.fraction:.0%} of the maximum, upkeep and retention on"
    rows = []
    for key, label, value, why in (
        ("p99_ratio", "p99 last windows / first windows", v["p99_ratio"], v.get("p99_why")),
        (
            "size_ratio",
            "queue tables + indexes peak, last windows / first steady",
            v["size_ratio"],
            v.get("size_why"),
        ),
    ):
        row_key, row_name = f"sustained.{key}", f"sustained e2e, {label} ({name})"
        if value is None:
            rows.append(
                common.unavailable_row(row_key, row_name, "ratio", str(why), target=f"<= {RATIO_LIMIT:g}")
            )
        else:
            rows.append(
                common.make_row(
                    row_key,
                    row_name,
                    value,
                    "ratio",
                    target=f"<= {RATIO_LIMIT:g}",
                    extra={**extra, "higher_is_better": False},
                )
            )
    rows.append(
        common.make_row(
            "sustained.deliveries_per_s",
            f"sustained e2e, offered open-loop rate ({name})",
            res["rate"],
            "deliveries/s",
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 90 s, 10 s windows, 10 s probe")
    parser.add_argument("--json-out", type=Path, help='write {"rows": [...]} (docs/benchmarks.md contract)')
    parser.add_argument("--duration", type=float, default=None, help="load seconds (1800; quick 90)")
    parser.add_argument("--window", type=float, default=None, help="series window, s (60; quick 10)")
    parser.add_argument("--fraction", type=float, default=0.7, help="of the measured maximum (0.7)")
    parser.add_argument("--max-rate", type=float, default=0.0, help="skip the probe: this is the maximum")
    parser.add_argument("--probe", type=float, default=None, help="closed-loop probe, s (30; quick 10)")
    parser.add_argument("--verdict-windows", type=int, default=None, help="windows per group (5; quick 3)")
    parser.add_argument("--retention-s", type=float, default=None, help="retention (2 windows + 30 s)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--body-bytes", type=int, default=512)
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 90.0 if args.quick else 1800.0
    if args.window is None:
        args.window = 10.0 if args.quick else 60.0
    if args.probe is None:
        args.probe = 10.0 if args.quick else 30.0
    if args.verdict_windows is None:
        args.verdict_windows = 3 if args.quick else 5
    if args.retention_s is None:
        args.retention_s = 2 * args.window + 30.0
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")

    from benchmarks import common

    with common.bench_lock():
        load_start = [round(x, 2) for x in os.getloadavg()]
        t0 = time.monotonic()
        with common.fresh_migrated_database("sustained") as url:
            res = run(args, url)
    print(
        f"sustained: run took {time.monotonic() - t0:.1f} s under the lock; load average at start "
        f"{load_start[0]}, at end {res['loadavg_end'][0]}"
    )
    ld = res["load"]
    print(
        f"sustained: accepted {ld['accepted_total']:,} ({ld['statuses']}), ack p50/p99 "
        f"{ld['ack_p50_ms']:.1f}/{ld['ack_p99_ms']:.1f} ms, late sends {ld['late_sends']:,}; "
        f"dead WorkItems {res['dead_work_items']}, failed receipts {res['failed_receipts']}"
    )
    print(verdict_line(res["verdict"]))
    common.write_json_out(args.json_out, _rows(args, res))
    with contextlib.suppress(OSError):
        (ROOT / ".bench").mkdir(exist_ok=True)
        (ROOT / ".bench" / "sustained.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    return 0 if res["dead_work_items"] == 0 and res["failed_receipts"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
