"""PostgreSQL's own reference: ``pgbench`` single-row INSERT transactions/s on the test server.

    .venv/bin/python -m benchmarks.reference [--quick] [--json-out PATH] [--duration S]
        [--clients 64,16] [--repeat R]

On a fresh, empty database of the same server it creates ``bench_ref`` (a bigint identity primary
key, an int and a text of about 100 bytes) and runs a custom pgbench script, one row per
transaction (autocommit, fsync as configured on the server)::

    \\set r random(1, 1000000000)
    INSERT INTO bench_ref(v, note) VALUES (:r, repeat('x', 100));

with ``-n -M prepared -j 2 -c <clients> -T <duration>``: 64 clients (the ingress concurrency) and 16
(the executor's worker count); quick: 64 clients for 5 s; full: 15 s each. The figure is pgbench's
``tps`` without initial connection time: the ceiling of one-commit-per-row writes on this machine,
which batching (group commit, multi-row insert) is there to beat.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common

SCRIPT = "\\set r random(1, 1000000000)\nINSERT INTO bench_ref(v, note) VALUES (:r, repeat('x', 100));\n"
UNIT = "tx/s"
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.M)
_LAT = re.compile(r"^latency average = ([0-9.]+) ms", re.M)


def find_pgbench() -> str | None:
    found = shutil.which("pgbench")
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def row_key(clients: int) -> str:
    return f"reference.pgbench_insert_c{clients}"


def row_name(clients: int) -> str:
    return f"pgbench single-row INSERT, {clients} clients"


def scenario(clients: int) -> str:
    # Ingress is measured at concurrency 64: its comparable reference is the 64-client figure.
    return "insert" if clients == 64 else f"insert_c{clients}"


def parse_pgbench(output: str) -> dict[str, float | None]:
    tps = _TPS.search(output)
    if tps is None:
        raise ValueError("no 'tps = ... (without initial connection time)' line in pgbench output")
    lat = _LAT.search(output)
    return {"tps": float(tps.group(1)), "latency_avg_ms": float(lat.group(1)) if lat else None}


def run_pgbench(pgbench: str, url: str, *, clients: int, duration: int) -> dict[str, float | None]:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(SCRIPT)
        script = f.name
    try:
        proc = subprocess.run(
            [
                pgbench,
                "-n",
                "-M",
                "prepared",
                "-j",
                "2",
                "-c",
                str(clients),
                "-T",
                str(duration),
                "-f",
                script,
            ],
            env={**os.environ, **common.pg_env(url)},
            capture_output=True,
            text=True,
            timeout=duration + 120,
            check=False,
        )
    finally:
        os.unlink(script)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"pgbench exited {proc.returncode}: {tail[-1] if tail else ''}")
    return parse_pgbench(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = common.stage_argparser(__doc__)
    parser.add_argument("--duration", type=int, default=None, help="seconds per run (quick 5, full 15)")
    parser.add_argument(
        "--clients", default=None, help="comma-separated client counts (quick 64, full 64,16)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per client count; the median is reported")
    args = parser.parse_args(argv)
    duration = args.duration or (5 if args.quick else 15)
    clients = [int(c) for c in (args.clients or ("64" if args.quick else "64,16")).split(",")]
    pgbench = find_pgbench()
    rows: list[dict[str, Any]] = []
    if pgbench is None:
        rows = [
            common.unavailable_row(row_key(c), row_name(c), UNIT, "pgbench not found", scenario=scenario(c))
            for c in clients
        ]
        common.write_json_out(args.json_out, rows)
        return 0
    version = subprocess.run(
        [pgbench, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with common.bench_lock(), common.fresh_database("pgbench") as url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE bench_ref (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " v bigint NOT NULL, note text NOT NULL)"
            )
        for c in clients:
            samples: list[dict[str, Any]] = []
            try:
                for i in range(args.repeat):
                    print(f"reference: pgbench -c {c} -T {duration} (run {i + 1}/{args.repeat})", flush=True)
                    samples.append(run_pgbench(pgbench, url, clients=c, duration=duration))
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                rows.append(
                    common.unavailable_row(row_key(c), row_name(c), UNIT, str(exc), scenario=scenario(c))
                )
                continue
            value = common.median(s["tps"] for s in samples)
            print(f"reference: pgbench -c {c}: {value:,.0f} tx/s", flush=True)
            rows.append(
                common.make_row(
                    row_key(c),
                    row_name(c),
                    value,
                    UNIT,
                    scenario=scenario(c),
                    extra={
                        "pgbench": version,
                        "clients": c,
                        "threads": 2,
                        "duration_s": duration,
                        "repeat": len(samples),
                        "samples_tps": [round(s["tps"], 1) for s in samples],
                        "latency_avg_ms": [s["latency_avg_ms"] for s in samples],
                        "script": SCRIPT,
                    },
                )
            )
    common.write_json_out(args.json_out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
