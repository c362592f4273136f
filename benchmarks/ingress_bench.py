"""Ingress benchmark: verified, durable acks/s over HTTP versus PostgreSQL's single-insert reference.

    .venv/bin/python -m benchmarks.ingress_bench [--quick] [--json-out PATH] [--concurrency 64]
    .venv/bin/python benchmarks/ingress_bench.py --quick

What it does (under the benchmark lock, ``benchmarks.common.bench_lock``: two benchmarks never
share this machine; run alone it takes ``/tmp/connector-bench.lock`` itself):

1. creates a scratch database (migrated) and installs one route verified by the Standard Webhooks
   preset (HMAC-SHA256 over ``{id}.{timestamp}.{body}``, ``webhook-id`` as the delivery id, event
   kind from the body);
2. starts ``connector ingress`` as its own process (uvloop, its own pool, default settings);
3. runs the load generator in a *separate process*: ``--concurrency`` keep-alive connections, each
   sending one signed delivery at a time (unique id, fresh timestamp, ~``--body-bytes`` JSON body)
   and waiting for the answer; it reports accepted deliveries/s and p50/p99/max ack latency over the
   measured window (after ``--warmup``);
4. checks durability: rows in ``connector_ingress_receipt`` equal the 200 answers (warm-up included);
5. runs ``pgbench -c <concurrency> -j 2 -M prepared`` with one-row INSERT transactions on the same
   server: (a) the same receipt row into ``connector_ingress_receipt`` of another migrated scratch
   database — the physical reference for this exact write — and (b, not in ``--quick``) the suite's
   ``benchmarks.reference`` table (bigint identity, int, 100-byte text);
6. prints the figures, the CPU each party used, the ratio ingress ÷ pgbench, one JSON line, and with
   ``--json-out`` the rows of the benchmark contract (docs/benchmarks.md).

Nothing here is a test: it asserts nothing about speed; it measures and reports.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file, or the loadgen child
    sys.path.insert(0, str(ROOT))

from benchmarks.webhook_load import read_status, signed_request  # noqa: E402

NAMESPACE = "bench"
ROUTE_KEY = "events"
SECRET_ENV = "CONNECTOR_BENCH_WEBHOOK_SECRET"
# A Standard Webhooks key: whsec_ + base64 of 24 random bytes, made fresh per run.
SECRET_BYTES = os.urandom(24)
SECRET_VALUE = "whsec_" + base64.b64encode(SECRET_BYTES).decode()


# --------------------------------------------------------------------------------------------------
# Load generator (runs in its own process: ``ingress_bench.py --loadgen '<json>'``)
# --------------------------------------------------------------------------------------------------


async def _loadgen(cfg: dict[str, Any]) -> dict[str, Any]:
    host, port = cfg["host"], cfg["port"]
    key = base64.b64decode(cfg["secret"].removeprefix("whsec_"))
    path = f"/v1/webhooks/{NAMESPACE}/{ROUTE_KEY}".encode()
    pad = b"x" * max(0, cfg["body_bytes"] - 120)
    warmup_until = time.monotonic() + cfg["warmup"]
    stop_at = warmup_until + cfg["duration"]
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counter = 0
    ok_total = 0
    run_tag = os.urandom(4).hex()

    async def client(n: int) -> None:
        nonlocal counter, ok_total
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            now = time.monotonic()
            if now >= stop_at:
                break
            counter += 1
            msg_id = f"msg_{run_tag}_{n}_{counter}".encode()
            ts = str(int(time.time())).encode()
            body = b'{"type":"bench.event","id":"%s","data":{"seq":%d,"pad":"%s"}}' % (msg_id, counter, pad)
            request = signed_request(path, host, port, key, msg_id, ts, body)
            started = time.perf_counter()
            writer.write(request)
            status = await read_status(reader)
            elapsed = time.perf_counter() - started
            ok_total += status == 200
            if now >= warmup_until:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    latencies.append(elapsed)
        writer.close()

    await asyncio.gather(*(client(i) for i in range(cfg["concurrency"])))
    latencies.sort()
    usage = resource.getrusage(resource.RUSAGE_SELF)

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    return {
        "accepted": len(latencies),
        "accepted_total": ok_total,
        "statuses": statuses,
        "accepted_per_s": len(latencies) / cfg["duration"],
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": latencies[-1] * 1000 if latencies else 0.0,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else 0.0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def loadgen_main(raw: str) -> None:
    import uvloop

    result = uvloop.run(_loadgen(json.loads(raw)))
    print(json.dumps(result))


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------


def _free_ports(n: int) -> int:
    """A port p with p .. p + n - 1 all free (the workers' metrics ports)."""
    for _ in range(200):
        base = _free_port()
        try:
            for i in range(1, n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} adjacent free ports")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _install_route(url: str) -> None:
    import psycopg
    from psycopg.types.json import Jsonb

    from connector.common.packs.document import parse_manifest
    from connector.common.packs.manifest import sha256_hex
    from connector.common.store import vocabulary

    manifest = parse_manifest(
        {
            "name": "bench",
            "namespace": NAMESPACE,
            "work_types": {"noop": {"handler": {"kind": "python", "target": "bench:noop"}}},
            "routes": [
                {
                    "key": ROUTE_KEY,
                    "verification": {"preset": "standard-webhooks", "secrets": [{"env": SECRET_ENV}]},
                    "idempotency_header": "webhook-id",
                    "extract": {"event_kind": {"pointer": "/type"}},
                    "fan_out": [{"work_type": "noop"}],
                }
            ],
        }
    )
    route = manifest.routes[0].model_dump(mode="json")
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        pack_id = conn.execute(
            "INSERT INTO connector_installed_pack (name, namespace, active_generation) VALUES (%s, %s, 1)"
            " RETURNING installed_pack_id",
            (manifest.name, manifest.namespace),
        ).fetchone()[0]  # type: ignore[index]
        doc = manifest.model_dump(mode="json")
        conn.execute(
            "INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,"
            " manifest_sha256, activated_at) VALUES (%s, 1, 'active', %s, %s, now())",
            (pack_id, Jsonb(doc), sha256_hex(doc)),
        )
        conn.execute(
            "INSERT INTO connector_route (installed_pack_id, generation, namespace, route_key, route_version,"
            " config, config_sha256) VALUES (%s, 1, %s, %s, 1, %s, %s)",
            (pack_id, NAMESPACE, ROUTE_KEY, Jsonb(route), sha256_hex(route)),
        )
        conn.execute("SELECT pg_notify(%s, '')", (vocabulary.CHANNEL_PACKS,))


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ingress exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("ingress did not become ready")


def _cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process."""
    return sum(_cpu_split(pid))


def _tree_cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process and its live children (``--processes``: the
    supervisor's workers)."""
    user, system = _cpu_split(pid)
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                u, s = _cpu_split(int(child))
                user, system = user + u, system + s
    return user, system


def _tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and its live children."""
    return sum(_tree_cpu_split(pid))


def _postmaster_pid(url: str) -> int:
    """The PID of the server ``url`` reaches: the parent of one of its backends (the benchmark runs
    on the server's machine)."""
    import psycopg

    with psycopg.connect(url) as conn:
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        return int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _postgres_cpu_seconds(postmaster: int, dbname: str) -> float:
    """CPU of one server's processes that work for ``dbname``: its backends and autovacuum workers on
    ``dbname`` plus its shared background processes (WAL writer, checkpointer, …). Other databases'
    backends and autovacuum workers, and every other server's processes (a private cluster beside
    the shared one), are left out; the shared background processes still do other databases' work
    when the server is shared, so run on a quiet server for a clean figure."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) != postmaster:
                    continue
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                per_database = "127.0.0.1(" in title or "[local]" in title or "autovacuum worker" in title
                if not per_database or f" {dbname} " in f"{title} ":
                    total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _scrape(port: int, processes: int = 1) -> dict[str, float]:
    """The group-commit histograms, summed over the workers (metrics port + worker index)."""
    text = ""
    for i in range(processes):
        with urllib.request.urlopen(f"http://127.0.0.1:{port + i}/metrics", timeout=5) as r:
            text += r.read().decode() + "\n"
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in (
            "connector_ingress_group_commit_batch_size_sum",
            "connector_ingress_group_commit_batch_size_count",
            "connector_ingress_receipt_commit_seconds_sum",
            "connector_ingress_receipt_commit_seconds_count",
        ):
            if line.startswith(name + " "):
                out[name] = out.get(name, 0.0) + float(line.split()[1])
    return out


def _pgbench(url: str, table: str, args: argparse.Namespace) -> dict[str, float]:
    """pgbench, one row per transaction: the receipt row itself, or benchmarks.reference's table."""
    pgbench = shutil.which("pgbench") or "/usr/bin/pgbench"
    if table == "receipt":
        script = (
            "INSERT INTO connector_ingress_receipt (namespace, route_key, provider_delivery_id,"
            " idempotency_key, method, content_type, event_kind, received_at, payload_sha256, body,"
            " verification) VALUES ('bench', 'events', md5(random()::text), "
            "'events/id/' || md5(random()::text || clock_timestamp()::text), 'POST', 'application/json',"
            " 'bench.event', now(), sha256(convert_to(random()::text, 'UTF8')),"
            f" convert_to(repeat('x', {args.body_bytes}), 'UTF8'), 'hmac-sha256/env/X');\n"
        )
    else:
        import psycopg

        from benchmarks import reference

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS bench_ref (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " v bigint NOT NULL, note text NOT NULL)"
            )
        script = reference.SCRIPT
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    clients = str(args.concurrency)
    try:
        out = subprocess.run(
            [pgbench, "-n", "-M", "prepared", "-f", path, "-c", clients, "-j", "2",
             "-T", str(int(args.duration)), url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
    finally:
        os.unlink(path)
    tps = latency = 0.0
    for line in out.splitlines():
        if line.startswith("tps ="):
            tps = float(line.split()[2])
        if line.startswith("latency average ="):
            latency = float(line.split()[3])
    return {"tps": tps, "latency_avg_ms": latency}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 s load, 2 s pgbench, receipt row only"
    )
    parser.add_argument("--json-out", type=Path, help='write {"rows": [...]} (docs/benchmarks.md contract)')
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds (after warm-up)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--writers", type=int, default=None, help="CONNECTOR_INGRESS_GROUP_COMMIT_WRITERS")
    parser.add_argument("--max-wait-ms", type=float, default=None, help="group commit max wait")
    parser.add_argument("--skip-pgbench", action="store_true")
    parser.add_argument(
        "--processes", type=int, default=1, help="ingress worker processes (connector ingress --processes)"
    )
    parser.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen:
        loadgen_main(args.loadgen)
        return 0
    if args.quick:
        args.duration, args.warmup = 2.0, 0.5

    if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import common

    with (
        common.bench_lock(),
        common.fresh_migrated_database("ingress") as url,
        common.fresh_migrated_database("ingress_pgbench") as receipt_ref_url,
        common.fresh_database("ingress_pgbench_ref") as simple_ref_url,
    ):
        summary = _run(args, url, receipt_ref_url, simple_ref_url)
    common.write_json_out(args.json_out, _rows(args, summary, common))
    return 0


def _rows(args: argparse.Namespace, summary: dict[str, Any], common: Any) -> list[dict[str, Any]]:
    load, ref = summary["ingress"], summary["pgbench"]
    extra = {
        "concurrency": args.concurrency,
        "processes": args.processes,
        "duration_s": args.duration,
        "body_bytes": args.body_bytes,
        "verification": "standard-webhooks (HMAC-SHA256)",
        "statuses": load["statuses"],
        "durable_rows_match": summary["rows"] == load["accepted_total"],
        "avg_batch": round(summary["avg_batch"], 1),
        "avg_commit_ms": round(summary["avg_commit_ms"], 2),
        "cpu_cores": {k: round(v, 2) for k, v in summary["cpu"].items()},
        "cpu_us_per_ack": {k: round(v, 1) for k, v in summary["cpu_us_per_ack"].items()},
    }
    if ref:
        extra["pgbench_c64_tps"] = {k: round(v["tps"]) for k, v in ref.items()}
    rows = [
        common.make_row(
            "ingress.acks_per_s", "ingress verified durable acks, concurrency 64", load["accepted_per_s"],
            "acks/s", target=">= 5000", scenario="insert", extra=extra,
        ),
        common.make_row("ingress.ack_p50_ms", "ingress ack latency p50, concurrency 64", load["p50_ms"],
                        "ms"),
        common.make_row(
            "ingress.ack_p99_ms", "ingress ack latency p99, concurrency 64", load["p99_ms"], "ms",
            target="< 50",
        ),
    ]  # fmt: skip
    for table, figure in (ref or {}).items():
        rows.append(
            common.make_row(
                f"ingress.pgbench_{table}_insert_c{args.concurrency}",
                f"pgbench single-row INSERT ({PGBENCH_TABLES[table]}), {args.concurrency} clients, same run",
                figure["tps"],
                "tx/s",
                extra={
                    "latency_avg_ms": figure["latency_avg_ms"],
                    "ratio_ingress_to_pgbench": load["accepted_per_s"] / figure["tps"]
                    if figure["tps"]
                    else None,
                },
            )
        )
    return rows


PGBENCH_TABLES = {
    "receipt": "the same receipt row into connector_ingress_receipt",
    "simple": "bench_ref: bigint identity + int + 100-byte text, as benchmarks.reference",
}


def _run(args: argparse.Namespace, url: str, receipt_ref_url: str, simple_ref_url: str) -> dict[str, Any]:
    import psycopg

    dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    postmaster = _postmaster_pid(url)
    _install_route(url)
    http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_ports(args.processes)
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": url,
        SECRET_ENV: SECRET_VALUE,
        "CONNECTOR_LOG_LEVEL": "WARNING",
    }
    if args.writers is not None:
        env["CONNECTOR_INGRESS_GROUP_COMMIT_WRITERS"] = str(args.writers)
    if args.max_wait_ms is not None:
        env["CONNECTOR_INGRESS_GROUP_COMMIT_MAX_WAIT_MS"] = str(args.max_wait_ms)
    ingress = subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(http_port),
         "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
         "--processes", str(args.processes)],
        env=env,
    )  # fmt: skip
    try:
        _wait_ready(http_port, ingress)
        cfg = {
            "host": "127.0.0.1",
            "port": http_port,
            "secret": SECRET_VALUE,
            "concurrency": args.concurrency,
            "processes": args.processes,
            "duration": args.duration,
            "warmup": args.warmup,
            "body_bytes": args.body_bytes,
        }
        split_before, pg_before, wall_before = (
            _tree_cpu_split(ingress.pid),
            _postgres_cpu_seconds(postmaster, dbname),
            time.monotonic(),
        )
        gen = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--loadgen", json.dumps(cfg)],
            capture_output=True,
            text=True,
            check=True,
        )
        load = json.loads(gen.stdout.strip().splitlines()[-1])
        wall = time.monotonic() - wall_before
        split_after = _tree_cpu_split(ingress.pid)
        pg_used = _postgres_cpu_seconds(postmaster, dbname) - pg_before
        user_s, system_s = split_after[0] - split_before[0], split_after[1] - split_before[1]
        # Per ack over the whole load window (warm-up included on both sides): the figure that does
        # not swing with the machine's load, unlike acks/s.
        acks = max(1, load["accepted_total"])
        per_ack_us = {
            "ingress": (user_s + system_s) * 1e6 / acks,
            "ingress_user": user_s * 1e6 / acks,
            "ingress_system": system_s * 1e6 / acks,
            "postgres": pg_used * 1e6 / acks,
        }
        cpu = {
            "ingress": (user_s + system_s) / wall,
            "postgres": pg_used / wall,
            "load_generator": load.pop("cpu_s") / wall,
        }
        scraped = _scrape(metrics_port, args.processes)
    finally:
        ingress.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            ingress.wait(timeout=15)
        if ingress.poll() is None:
            ingress.kill()
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT count(*) FROM connector_ingress_receipt").fetchone()[0]  # type: ignore[index]
    ref: dict[str, dict[str, float]] | None = None
    if not args.skip_pgbench:
        ref = {"receipt": _pgbench(receipt_ref_url, "receipt", args)}
        if not args.quick:
            ref["simple"] = _pgbench(simple_ref_url, "simple", args)
    batches = scraped.get("connector_ingress_group_commit_batch_size_count", 0.0)
    avg_batch = (
        scraped.get("connector_ingress_group_commit_batch_size_sum", 0.0) / batches if batches else 0.0
    )
    commit_ms = (
        scraped.get("connector_ingress_receipt_commit_seconds_sum", 0.0) * 1000 / batches if batches else 0.0
    )
    print()
    print(f"ingress, concurrency {args.concurrency}, {args.duration:.0f} s, ~{args.body_bytes} B bodies, "
          "Standard Webhooks HMAC-SHA256 verified, fsync on")  # fmt: skip
    print(f"  accepted deliveries/s   {load['accepted_per_s']:>10.0f}")
    p50, p99, worst = load["p50_ms"], load["p99_ms"], load["max_ms"]
    print(f"  ack latency p50 / p99   {p50:>7.2f} ms / {p99:.2f} ms (max {worst:.1f})")
    print(f"  answers by status       {load['statuses']}")
    busy = ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
    print(f"  CPU (cores busy)        {busy}")
    print(
        f"  CPU per ack             ingress {per_ack_us['ingress']:.1f} µs"
        f" (user {per_ack_us['ingress_user']:.1f}, system {per_ack_us['ingress_system']:.1f}),"
        f" postgres {per_ack_us['postgres']:.1f} µs"
    )
    print(f"  group commit            avg batch {avg_batch:.1f}, avg commit {commit_ms:.2f} ms")
    durable = "ok" if rows == load["accepted_total"] else "MISMATCH"
    print(f"  rows in receipt table   {rows} = 200 answers incl. warm-up {load['accepted_total']}: {durable}")
    for table, figure in (ref or {}).items():
        print(f"pgbench single-row INSERT, {PGBENCH_TABLES[table]} (-c {args.concurrency} -j 2 -M prepared)")
        print(
            f"  transactions/s          {figure['tps']:>10.0f}"
            f" (latency avg {figure['latency_avg_ms']:.2f} ms)"
        )
        print(f"  ratio ingress / pgbench {load['accepted_per_s'] / figure['tps']:>10.2f}")
    summary = {
        "ingress": load,
        "cpu": cpu,
        "cpu_us_per_ack": per_ack_us,
        "rows": rows,
        "avg_batch": avg_batch,
        "avg_commit_ms": commit_ms,
        "pgbench": ref,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(summary))
    non_ok = {k: v for k, v in load["statuses"].items() if int(k) != 200}
    if non_ok:
        print(f"WARNING: non-200 answers: {non_ok}", file=sys.stderr)
    if rows != load["accepted_total"]:
        raise SystemExit("durability check failed: rows differ from 200 answers")
    return summary


if __name__ == "__main__":
    sys.exit(main())
