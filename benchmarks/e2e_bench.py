"""End-to-end benchmark: deliveries/s from HTTP POST to handler executed, and delivery latency.

    .venv/bin/python -m benchmarks.e2e_bench [--quick] [--json-out PATH] [--duration S]
                                             [--concurrency 64] [--rate R]
    .venv/bin/python -m benchmarks.run --only e2e          # through the suite harness

What one run does (under the benchmark lock, ``benchmarks.common.bench_lock``):

1. a fresh migrated scratch database (``connector.common.core.testdb.fresh_database`` through
   ``benchmarks.common.fresh_migrated_database``); one pack installed and activated through the
   pack store: route ``bench/events`` verified by the Standard Webhooks preset (HMAC-SHA256, secret
   from an environment variable, made fresh per run), ``webhook-id`` as the idempotency header, fan
   out to one work type whose handler is the async no-op ``benchmarks.e2e_bench:noop``
   (``connector_needs_event = False``: the executor reads no event/payload for it);
2. ``connector ingress``, ``connector materializer`` and ``connector executor --no-admin`` started as
   three separate processes with ``CONNECTOR_DATABASE_URL`` = that database, free ports and the
   services' default settings (nothing tuned here);
3. one signed delivery primes the pipeline (the run starts only after it was executed);
4. the load generator runs in its own process: ``--concurrency`` (64) keep-alive connections
   sending signed Standard Webhooks deliveries (unique ids, ~``--body-bytes`` JSON bodies carrying
   the send time). **Closed loop** by default: each connection sends its next delivery when the
   previous one was answered, for ``--warmup`` + ``--duration`` seconds (full: 3 + 30 s, quick:
   1 + 8 s). With ``--rate R`` it is **open loop** instead: deliveries are due at a fixed rate R,
   sent by whichever connection is free, and the send time in the body is the *due* time (so a
   late send counts against latency: no coordinated omission);
5. after the load stops the services keep running until everything accepted was executed (or the
   drain limit passes), then everything is computed from the database:

   - window = [load start + warm-up, load end] (wall clock of this host: the load generator's
     ``time.time()``, the ingress' ``received_at`` and PostgreSQL's ``clock_timestamp()`` read the
     same kernel clock);
   - ``e2e.deliveries_per_s`` = WorkItems whose ``finished_at`` lies in the window / window length;
   - ``e2e.delivery_p50_ms`` / ``_p99_ms`` = ``finished_at - received_at`` of every delivery received
     in the window (one WorkItem per delivery); deliveries not executed by the drain limit count as
     infinitely late (a p99 that lands on one is reported as unavailable, never guessed);
   - backlog at the end of the window = deliveries received by then and not yet executed, split into
     not yet materialized (materializer queue) and materialized but not executed (executor queue);
   - per stage: acks/s, receipts materialized/s and items executed/s within the window, queue depths
     per second, and CPU (cores busy, and µs per executed delivery) per process (ingress,
     materializer, executor, load generator, PostgreSQL's backends of this database — also split by
     the service each backend served, ``postgres: ingress`` / ``materializer`` / ``executor``, from
     its ``application_name`` — PostgreSQL's shared processes, everything else on the machine) from
     ``/proc``.

The shared server runs with ``autovacuum`` off, so the services' own upkeep (ADR 008,
``connector.common.maintenance.upkeep``, mode ``auto``) vacuums and analyzes the queue tables during
the run, as it does in any deployment where autovacuum does not cover them: the default run measures
the system as it ships (rows ``e2e.*``), and the report counts the upkeep's VACUUM / ANALYZE runs and their
mean duration. ``--vacuum-every S`` adds an external ``VACUUM`` of the receipt and WorkItem tables
every S s (rows ``e2e.vacuum<S>s.*``; the stand-in used before the upkeep existed) and
``--upkeep off`` turns the services' upkeep off (rows ``e2e.upkeep-off.*``), to measure the server
as configured with nothing vacuuming. Each run also records the services' own histograms (group
commit, materializer batches, claim/finalize statements), dead row versions at the end of the load,
and server-wide WAL counters.

Exactly-once is checked after the drain: one receipt, one event, one WorkItem per 200 answer. Nothing
here asserts anything about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hmac
import json
import math
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file, or the loadgen child
    sys.path.insert(0, str(ROOT))

from benchmarks.webhook_load import read_status, signed_request  # noqa: E402

NAMESPACE = "bench"
ROUTE_KEY = "events"
WORK_TYPE = "noop"
HANDLER = "benchmarks.e2e_bench:noop"
SECRET_ENV = "CONNECTOR_BENCH_WEBHOOK_SECRET"
TARGET_RATE = ">= 3000"
TARGET_P99 = "< 1000"
SERVICES = ("ingress", "materializer", "executor", "postgres", "postgres shared", "load_generator")
#: ``postgres`` split by the service whose connection it served (``CpuSampler`` with a url).
BACKENDS = (
    "postgres: ingress",
    "postgres: materializer",
    "postgres: executor",
    "postgres: bench",
    "postgres: ?",
)
#: Print order of the CPU figures: each process, PostgreSQL's backends (their sum, then per service).
CPU_ORDER = (
    "ingress",
    "materializer",
    "executor",
    "postgres",
    *BACKENDS,
    "postgres shared",
    "load_generator",
)


async def noop(ctx: Any) -> None:
    """The benchmark handler: does nothing and reads nothing."""
    return None


noop.connector_needs_event = False  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------
# Load generator (its own process: ``python -m benchmarks.e2e_bench --loadgen '<json>'``; the webhook
# secret comes through the environment, never the command line)
# --------------------------------------------------------------------------------------------------


async def _loadgen(cfg: dict[str, Any], secret: str) -> dict[str, Any]:
    host, port = cfg["host"], cfg["port"]
    key = base64.b64decode(secret.removeprefix("whsec_"))
    path = f"/v1/webhooks/{NAMESPACE}/{ROUTE_KEY}".encode()
    pad = b"x" * max(0, cfg["body_bytes"] - 140)
    rate = float(cfg.get("rate") or 0.0)
    # Open loop in bursts: deliveries due ``burst`` at a time, every ``burst / rate`` s (same rate).
    burst = max(1, int(cfg.get("burst") or 1))
    run_tag = os.urandom(4).hex()
    started = time.time()
    warmup_until = started + cfg["warmup"]
    stop_at = warmup_until + cfg["duration"]
    statuses: dict[int, int] = {}
    ack_latencies: list[float] = []
    late: list[float] = []  # open loop: how late sends left after their due time
    seq = 0
    ok_total = 0

    async def client(n: int) -> None:
        nonlocal seq, ok_total
        reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            seq += 1
            i = seq
            if rate:
                due = started + ((i - 1) // burst * burst + 1) / rate
                if due >= stop_at:
                    break
                wait = due - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    late.append(-wait)
                sent = due
            else:
                sent = time.time()
                if sent >= stop_at:
                    break
            msg_id = b"msg_%s_%d" % (run_tag.encode(), i)
            ts = b"%d" % int(time.time())
            body = b'{"type":"bench.event","id":"%s","sent":%.6f,"data":{"seq":%d,"pad":"%s"}}' % (
                msg_id, sent, i, pad,
            )  # fmt: skip
            request = signed_request(path, host, port, key, msg_id, ts, body)
            t0 = time.perf_counter()
            writer.write(request)
            status = await read_status(reader)
            elapsed = time.perf_counter() - t0
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                ok_total += 1
                if sent >= warmup_until:
                    ack_latencies.append(elapsed)
        writer.close()

    await asyncio.gather(*(client(i) for i in range(cfg["concurrency"])))
    ended = time.time()
    ack_latencies.sort()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "started": started,
        "window_start": warmup_until,
        "window_end": min(stop_at, ended),
        "ended": ended,
        "accepted_total": ok_total,
        "accepted_in_window": len(ack_latencies),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "ack_p50_ms": _pct(ack_latencies, 0.50) * 1000,
        "ack_p99_ms": _pct(ack_latencies, 0.99) * 1000,
        "late_sends": len(late),
        "late_p99_ms": _pct(sorted(late), 0.99) * 1000,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def _pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def loadgen_main(raw: str) -> int:
    import uvloop

    secret = os.environ.pop(SECRET_ENV)
    print(json.dumps(uvloop.run(_loadgen(json.loads(raw), secret))), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------
# Processes, CPU accounting
# --------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process in seconds (Linux ``/proc``); 0 when it is gone."""
    return _cpu_counters(pid)[0]


def _cpu_counters(pid: int) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) of a process in seconds: its own CPU and that of its
    children that exited and were waited for; (0, 0) when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        tck = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / tck, (int(fields[13]) + int(fields[14])) / tck
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def _machine_counters() -> tuple[float, float, float]:
    """(busy, irq + softirq) CPU seconds of the whole machine (all cores) since boot, and the
    number of processes created since boot."""
    lines = Path("/proc/stat").read_text().splitlines()
    vals = [int(v) for v in lines[0].split()[1:]]
    tck = os.sysconf("SC_CLK_TCK")
    forks = next((float(line.split()[1]) for line in lines if line.startswith("processes ")), 0.0)
    return (sum(vals[:8]) - vals[3] - vals[4]) / tck, (vals[5] + vals[6]) / tck, forks


class CpuSampler:
    """Samples the CPU counters of every process on the machine (``/proc``) every ``interval`` and
    labels them: our services by pid, PostgreSQL (backends of the benchmark database plus the
    server's shared background processes), backends of other databases, and everything else by
    command name, so that "other" load on a shared machine is visible rather than guessed.

    With ``url``, each backend of the benchmark database is labelled by the service that opened it
    (``postgres: ingress`` / ``materializer`` / ``executor``, from its ``application_name``
    ``connector-<service>[-<job>]``; ``postgres: bench`` for the harness's own connections), and
    ``cores_between`` adds their sum as ``postgres``."""

    def __init__(
        self, pids: dict[str, int], dbname: str, interval: float = 0.5, url: str | None = None
    ) -> None:
        self.names = {pid: name for name, pid in pids.items()}
        self.dbname = dbname
        self.interval = interval
        self.url = url
        self._conn: Any = None
        self._apps: dict[int, str] = {}
        self.samples: list[tuple[float, dict[int, tuple[float, float]], tuple[float, float, float]]] = []
        self._labels: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def name(self, name: str, pid: int) -> None:
        self.names[pid] = name
        self._labels.pop(pid, None)

    def _label(self, pid: int) -> str:
        label = self._labels.get(pid)
        if label is not None:
            return label
        if pid in self.names:
            label = self.names[pid]
        elif pid == os.getpid():
            label = "bench orchestrator"
        else:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                title = (
                    Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                comm, title = "?", ""
            if comm == "postgres":
                if "127.0.0.1(" in title or "[local]" in title:
                    label = "postgres" if f" {self.dbname} " in title else "postgres, other databases"
                    if label == "postgres" and self.url is not None:
                        label = f"postgres: {self._backend_service(pid)}"
                else:  # the postmaster and the server's shared processes (WAL writer, checkpointer, ...)
                    role = title.rsplit(":", 1)[-1].strip() if ":" in title else "postmaster"
                    label = f"postgres shared: {role or 'postmaster'}"
            else:
                label = f"other: {comm}"
        self._labels[pid] = label
        return label

    def _backend_service(self, pid: int) -> str:
        """The service that opened backend ``pid`` (its ``application_name``; ``bench`` for the
        harness's connections, ``?`` when it is gone or cannot be read)."""
        if pid not in self._apps:
            with contextlib.suppress(Exception):
                import psycopg

                if self._conn is None and self.url is not None:
                    self._conn = psycopg.connect(
                        self.url, autocommit=True, application_name="connector-bench-sampler"
                    )
                rows = self._conn.execute(
                    "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
                ).fetchall()
                self._apps.update({int(r[0]): str(r[1] or "") for r in rows})
        app = self._apps.get(pid)
        if app is None:
            return "?"
        for service in ("ingress", "materializer", "executor"):
            if app == f"connector-{service}" or app.startswith(f"connector-{service}-"):
                return service
        return "bench"

    def sample(self) -> None:
        counters: dict[int, tuple[float, float]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                pid = int(entry)
                cpu = _cpu_counters(pid)
                if cpu[0] or cpu[1]:
                    counters[pid] = cpu
                    self._label(pid)  # while the process exists (backends come and go)
        self.samples.append((time.time(), counters, _machine_counters()))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def cores_between(self, t0: float, t1: float) -> dict[str, float]:
        """Cores busy per label between the samples nearest ``t0`` and ``t1``, plus ``machine`` (all
        busy time) and ``kernel irq/softirq`` (busy time no process is charged with)."""
        if len(self.samples) < 2:
            return {}
        ta, a, (busy_a, irq_a, forks_a) = min(self.samples, key=lambda s: abs(s[0] - t0))
        tb, b, (busy_b, irq_b, forks_b) = min(self.samples, key=lambda s: abs(s[0] - t1))
        span = tb - ta
        if span <= 0:
            return {}
        out: dict[str, float] = {}
        for pid, (own, children) in b.items():
            label = self._label(pid)
            before = a.get(pid)
            out[label] = out.get(label, 0.0) + (own - (before[0] if before else 0.0)) / span
            if before is not None and children > before[1]:
                # Short-lived processes (test runs, connections) that started and ended between the
                # two samples show up only here: in their parent's count of waited-for children.
                key = f"exited children of {label}"
                out[key] = out.get(key, 0.0) + (children - before[1]) / span
        backends = [v for k, v in out.items() if k.startswith("postgres: ")]
        out = {k: v for k, v in out.items() if v >= 0.005}
        if backends:  # their sum, small ones included
            out["postgres"] = out.get("postgres", 0.0) + sum(backends)
        out["kernel irq/softirq"] = (irq_b - irq_a) / span
        out["machine"] = (busy_b - busy_a) / span
        out["processes created per s"] = (forks_b - forks_a) / span
        return out


def _spawn(name: str, args: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    log = (logs / f"e2e-{name}.log").open("wb")
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("connector")), *args],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


SCRAPED = (
    "connector_ingress_group_commit_batch_size",
    "connector_ingress_receipt_commit_seconds",
    "connector_materializer_batch_size",
    "connector_materializer_batch_seconds",
    "connector_materializer_claim_seconds",
    "connector_executor_claim_seconds",
    "connector_executor_claim_batch_size",
    "connector_executor_finalize_seconds",
    "connector_executor_finalize_batch_size",
    "connector_upkeep_seconds",
)


def _scrape(ports: dict[str, int]) -> dict[str, float]:
    """``_sum`` and ``_count`` of the services' histograms in SCRAPED (summed over labels)."""
    out: dict[str, float] = {}
    for port in ports.values():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, rest = line.partition(" ")
            base = name.split("{", 1)[0]
            if base.startswith("connector_upkeep_seconds_"):
                op = re.search(r'op="(\w+)"', name)
                table = re.search(r'table="connector_(\w+)"', name)
                if op is not None and table is not None:  # per operation and table
                    base = base.replace("upkeep_seconds", f"upkeep_{op.group(1)}.{table.group(1)}_seconds")
                    with contextlib.suppress(ValueError):
                        out[base] = out.get(base, 0.0) + float(rest.split()[0])
                continue
            for metric in SCRAPED:
                if base in (f"{metric}_sum", f"{metric}_count"):
                    with contextlib.suppress(ValueError):
                        out[base] = out.get(base, 0.0) + float(rest.split()[0])
    return out


def _histogram_means(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per histogram, between two scrapes: how many observations and their mean (ms for seconds)."""
    out: dict[str, dict[str, float]] = {}
    upkeep = sorted(
        {
            k.removesuffix("_count")
            for k in after
            if k.startswith("connector_upkeep_") and k.endswith("_count")
        }
    )
    for metric in (*(m for m in SCRAPED if m != "connector_upkeep_seconds"), *upkeep):
        n = after.get(f"{metric}_count", 0.0) - before.get(f"{metric}_count", 0.0)
        total = after.get(f"{metric}_sum", 0.0) - before.get(f"{metric}_sum", 0.0)
        if n > 0:
            short = metric.removeprefix("connector_")
            if metric.endswith("_seconds"):
                out[short.removesuffix("_seconds") + "_ms"] = {"n": n, "mean": round(total / n * 1000, 2)}
            else:
                out[short] = {"n": n, "mean": round(total / n, 1)}
    return out


def _dead_tuples(conn: Any) -> dict[str, dict[str, int]]:
    """Per queue table: dead row versions left (autovacuum is off on the shared server), rows
    inserted, updated, and updated in place (HOT: no new index entries)."""
    rows = conn.execute(
        "SELECT relname, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE relname = ANY(%s)",
        (["connector_ingress_receipt", "connector_event", "connector_work_item"],),
    ).fetchall()
    return {
        r[0].removeprefix("connector_"): {"dead": int(r[1]), "inserted": int(r[2]), "updated": int(r[3]),
                                          "hot_updated": int(r[4])}
        for r in rows
    }  # fmt: skip


def _wait_ready(port: int, procs: dict[str, subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_alive(procs)
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        time.sleep(0.1)
    raise RuntimeError("ingress did not become ready")


def _check_alive(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for name, p in procs.items():
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited with code {p.returncode} (log: .bench/logs/e2e-{name}.log)")


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------


def _manifest() -> dict[str, Any]:
    return {
        "name": "bench-e2e",
        "namespace": NAMESPACE,
        "work_types": {WORK_TYPE: {"handler": {"kind": "python", "target": HANDLER}}},
        "routes": [
            {
                "key": ROUTE_KEY,
                "verification": {"preset": "standard-webhooks", "secrets": [{"env": SECRET_ENV}]},
                "idempotency_header": "webhook-id",
                "extract": {"event_kind": {"pointer": "/type"}},
                "fan_out": [{"work_type": WORK_TYPE}],
            }
        ],
    }


async def _install(url: str) -> None:
    import psycopg

    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await install.pack_apply(conn, parse_manifest(_manifest()), activate=True, actor="e2e-bench")


def _post_one(port: int, secret: str, msg_id: str) -> int:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    ts = int(time.time())
    body = json.dumps({"type": "bench.prime", "id": msg_id, "sent": time.time()}).encode()
    sig = base64.b64encode(hmac.digest(key, f"{msg_id}.{ts}.".encode() + body, "sha256")).decode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/webhooks/{NAMESPACE}/{ROUTE_KEY}",
        data=body,
        method="POST",
        headers={
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": f"v1,{sig}",
        },
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(r.status)


def _prime(conn: Any, port: int, secret: str, procs: dict[str, subprocess.Popen[bytes]]) -> float:
    """One delivery through the whole pipeline; returns its end-to-end seconds."""
    msg_id = f"prime_{os.urandom(4).hex()}"
    t0 = time.monotonic()
    status = _post_one(port, secret, msg_id)
    if status != 200:
        raise RuntimeError(f"priming delivery answered HTTP {status}")
    deadline = t0 + 60
    while True:
        row = conn.execute(
            "SELECT w.state FROM connector_ingress_receipt r JOIN connector_event e USING (receipt_id)"
            " JOIN connector_work_item w ON w.event_id = e.event_id WHERE r.provider_delivery_id = %s",
            (msg_id,),
        ).fetchone()
        if row and row[0] == "succeeded":
            return time.monotonic() - t0
        if row and row[0] == "dead":
            raise RuntimeError("priming delivery's WorkItem is dead (handler not importable?)")
        _check_alive(procs)
        if time.monotonic() > deadline:
            raise RuntimeError(f"priming delivery not executed within 60 s (state {row[0] if row else None})")
        time.sleep(0.05)


def _drain(conn: Any, accepted: int, procs: dict[str, subprocess.Popen[bytes]], limit_s: float) -> bool:
    """Wait until every accepted delivery's WorkItem is terminal (or the limit passes)."""
    deadline = time.monotonic() + limit_s
    while True:
        (done,) = conn.execute(
            "SELECT count(*) FROM connector_work_item WHERE state IN ('succeeded', 'dead')"
        ).fetchone()
        (failed,) = conn.execute(
            "SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'failed'"
        ).fetchone()
        if done + failed >= accepted:
            return True
        _check_alive(procs)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)


def _measure(conn: Any, w0: float, w1: float, started: float) -> dict[str, Any]:
    """All figures from the database, after the drain."""
    span = w1 - w0
    params = {"w0": w0, "w1": w1}
    (executed,) = conn.execute(
        "SELECT count(*) FROM connector_work_item"
        " WHERE finished_at >= to_timestamp(%(w0)s) AND finished_at < to_timestamp(%(w1)s)",
        params,
    ).fetchone()
    (materialized,) = conn.execute(
        "SELECT count(*) FROM connector_ingress_receipt"
        " WHERE routed_at >= to_timestamp(%(w0)s) AND routed_at < to_timestamp(%(w1)s)",
        params,
    ).fetchone()
    (received,) = conn.execute(
        "SELECT count(*) FROM connector_ingress_receipt"
        " WHERE received_at >= to_timestamp(%(w0)s) AND received_at < to_timestamp(%(w1)s)",
        params,
    ).fetchone()
    rows = conn.execute(
        """
        SELECT extract(epoch FROM w.finished_at - r.received_at)::float8,
               extract(epoch FROM w.finished_at)::float8
                 - (convert_from(r.body, 'UTF8')::jsonb ->> 'sent')::float8,
               extract(epoch FROM r.routed_at - r.received_at)::float8,
               extract(epoch FROM w.finished_at - r.routed_at)::float8
        FROM connector_ingress_receipt r
        LEFT JOIN connector_event e ON e.receipt_id = r.receipt_id
        LEFT JOIN connector_work_item w ON w.event_id = e.event_id
        WHERE r.received_at >= to_timestamp(%(w0)s) AND r.received_at < to_timestamp(%(w1)s)
        """,
        params,
    ).fetchall()

    def dist(i: int) -> dict[str, float | None]:
        vals = sorted(math.inf if r[i] is None else r[i] for r in rows)
        out: dict[str, float | None] = {}
        for name, p in (("p50_ms", 0.50), ("p90_ms", 0.90), ("p99_ms", 0.99), ("max_ms", 1.0)):
            v = _pct(vals, p) if vals else None
            out[name] = None if v is None or math.isinf(v) else round(v * 1000, 2)
        return out

    unexecuted = sum(1 for r in rows if r[0] is None)
    accepted_by_end, unrouted_at_end = conn.execute(
        "SELECT count(*) FILTER (WHERE received_at < to_timestamp(%(w1)s)),"
        "       count(*) FILTER (WHERE received_at < to_timestamp(%(w1)s)"
        "                        AND (routed_at IS NULL OR routed_at >= to_timestamp(%(w1)s)))"
        " FROM connector_ingress_receipt",
        params,
    ).fetchone()
    (executed_by_end,) = conn.execute(
        "SELECT count(*) FROM connector_work_item WHERE finished_at < to_timestamp(%(w1)s)", params
    ).fetchone()
    (last_finished,) = conn.execute(
        "SELECT extract(epoch FROM max(finished_at))::float8 FROM connector_work_item"
    ).fetchone()
    # Per-second flow through each stage, relative to the load start (for the queue-depth timeline).
    flow = conn.execute(
        """
        SELECT s, sum(a)::int, sum(m)::int, sum(x)::int FROM (
          SELECT floor(extract(epoch FROM received_at) - %(t)s)::int AS s, 1 AS a, 0 AS m, 0 AS x
            FROM connector_ingress_receipt
          UNION ALL SELECT floor(extract(epoch FROM routed_at) - %(t)s)::int, 0, 1, 0
            FROM connector_ingress_receipt WHERE routed_at IS NOT NULL
          UNION ALL SELECT floor(extract(epoch FROM finished_at) - %(t)s)::int, 0, 0, 1
            FROM connector_work_item WHERE finished_at IS NOT NULL
        ) q WHERE s >= 0 GROUP BY s ORDER BY s
        """,
        {"t": started},
    ).fetchall()
    timeline = []
    acc = mat = exe = 0
    for s, a, m, x in flow:
        acc, mat, exe = acc + a, mat + m, exe + x
        timeline.append(
            {"s": s, "received": a, "materialized": m, "executed": x,
             "materializer_queue": acc - mat, "executor_queue": mat - exe}
        )  # fmt: skip
    return {
        "window_s": span,
        "executed_per_s": executed / span,
        "materialized_per_s": materialized / span,
        "received_per_s": received / span,
        "deliveries_in_window": len(rows),
        "unexecuted_after_drain": unexecuted,
        "latency_received": dist(0),
        "latency_sent": dist(1),
        "stage_received_to_routed": dist(2),
        "stage_routed_to_finished": dist(3),
        "backlog_at_end": accepted_by_end - executed_by_end,
        "backlog_materializer_at_end": unrouted_at_end,
        "backlog_executor_at_end": (accepted_by_end - unrouted_at_end) - executed_by_end,
        "drained_s_after_end": None if last_finished is None else max(0.0, last_finished - w1),
        "timeline": timeline,
    }


def _server_stats(conn: Any) -> dict[str, float]:
    """Server-wide counters (every database on the server, not only ours: other people's
    ``CREATE DATABASE`` copies of the migrated template are WAL-logged too): WAL written, full-page
    images, WAL syncs, checkpoints; and the commits of the benchmark database."""
    out: dict[str, float] = {}
    with contextlib.suppress(Exception):
        row = conn.execute("SELECT wal_records, wal_fpi, wal_bytes, wal_sync FROM pg_stat_wal").fetchone()
        out.update(wal_records=float(row[0]), wal_fpi=float(row[1]), wal_bytes=float(row[2]),
                   wal_syncs=float(row[3]))  # fmt: skip
    with contextlib.suppress(Exception):
        row = conn.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").fetchone()
        out["checkpoints"] = float(row[0])
    with contextlib.suppress(Exception):
        # Ours only; the statistics reach this view with up to a second's delay.
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        out["commits_bench_database"] = float(row[0])
    return out


def _figures_stats(conn: Any) -> dict[str, float]:
    """Row writes to the figures rollups (``connector_figures``; none on a tree without them):
    inserted, updated (of which in place, HOT), and both together (``written``)."""
    with contextlib.suppress(Exception):
        row = conn.execute(
            "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
            " WHERE relname = 'connector_figures'"
        ).fetchone()
        if row is not None:
            return {"inserted": float(row[0]), "updated": float(row[1]), "hot_updated": float(row[2]),
                    "deleted": float(row[3]), "written": float(row[0]) + float(row[1])}  # fmt: skip
    return {}


def _vacuum_loop(url: str, every_s: float, stop: threading.Event) -> None:
    """``--vacuum-every``: a stand-in for autovacuum (off on the shared server) during the load."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.wait(every_s):
            conn.execute("VACUUM connector_work_item")
            conn.execute("VACUUM connector_ingress_receipt")


def _exactly_once(conn: Any) -> dict[str, int]:
    out = {}
    for name, q in (
        ("receipts", "SELECT count(*) FROM connector_ingress_receipt"),
        ("receipts_failed", "SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'failed'"),
        ("events", "SELECT count(*) FROM connector_event"),
        ("work_items", "SELECT count(*) FROM connector_work_item"),
        ("succeeded", "SELECT count(*) FROM connector_work_item WHERE state = 'succeeded'"),
        ("dead", "SELECT count(*) FROM connector_work_item WHERE state = 'dead'"),
        ("retried", "SELECT count(*) FROM connector_work_item WHERE attempts > 1"),
    ):
        (out[name],) = conn.execute(q).fetchone()
    return out


@dataclass
class Services:
    """The three service processes of one run, started by ``start_services`` (also used by
    ``benchmarks.sustained``): their pids by name, the ingress HTTP port, the metrics ports, the
    webhook secret of the pack and the benchmark database's name."""

    procs: dict[str, subprocess.Popen[bytes]]
    http_port: int
    metrics: dict[str, int]
    secret: str
    dbname: str


def start_services(
    url: str, *, upkeep: str = "auto", figures: str = "on", extra_env: dict[str, str] | None = None
) -> Services:
    """Install the bench pack into ``url`` and start ``connector ingress``, ``materializer`` and
    ``executor --no-admin`` as processes with the services' default settings (plus ``extra_env``);
    stop them with ``_stop(list(services.procs.values()))``."""
    import psycopg

    dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    os.environ[SECRET_ENV] = secret  # the pack apply checks the reference resolves
    asyncio.run(_install(url))
    logs = ROOT / ".bench" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    http_port = _free_port()
    metrics = {"ingress": _free_port(), "materializer": _free_port(), "executor": _free_port()}
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": url,
        "CONNECTOR_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        SECRET_ENV: secret,
        "CONNECTOR_MATERIALIZER_GRPC_PORT": str(_free_port()),
        "CONNECTOR_MATERIALIZER_METRICS_PORT": str(metrics["materializer"]),
        "CONNECTOR_EXECUTOR_GRPC_PORT": str(_free_port()),
        "CONNECTOR_EXECUTOR_METRICS_PORT": str(metrics["executor"]),
        "CONNECTOR_EXECUTOR_UPKEEP_MODE": upkeep,
        "CONNECTOR_MATERIALIZER_UPKEEP_MODE": upkeep,
        **(extra_env or {}),
    }
    if figures == "off":
        env["CONNECTOR_INGRESS_FIGURES_FLUSH_S"] = env["CONNECTOR_EXECUTOR_FIGURES_FLUSH_S"] = "0"
    ingress_args = ["ingress", "--http-port", str(http_port), "--grpc-port", str(_free_port()),
                    "--metrics-port", str(metrics["ingress"])]  # fmt: skip
    procs = {
        "ingress": _spawn("ingress", ingress_args, env, logs),
        "materializer": _spawn("materializer", ["materializer"], env, logs),
        "executor": _spawn("executor", ["executor", "--no-admin"], env, logs),
    }
    return Services(procs, http_port, metrics, secret, dbname)


def spawn_loadgen(cfg: dict[str, Any], secret: str) -> subprocess.Popen[str]:
    """The load generator process (``_loadgen``); its last stdout line is its JSON summary."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.e2e_bench", "--loadgen", json.dumps(cfg)],
        cwd=ROOT, env={**os.environ, SECRET_ENV: secret}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def run_once(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import psycopg

    t_setup = time.monotonic()
    services = start_services(url, upkeep=args.upkeep, figures=getattr(args, "figures", "on"))
    procs, http_port, metrics, secret = services.procs, services.http_port, services.metrics, services.secret
    dbname = services.dbname
    sampler = CpuSampler({k: p.pid for k, p in procs.items()}, dbname, url=url)
    gen: subprocess.Popen[str] | None = None
    stop_vacuum = threading.Event()
    vacuumer: threading.Thread | None = None
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _wait_ready(http_port, procs)
            prime_s = _prime(conn, http_port, secret, procs)
            print(
                f"e2e: services up and pipeline primed {time.monotonic() - t_setup:.1f} s after the"
                f" database was ready (one delivery end to end in {prime_s * 1000:.0f} ms)",
                flush=True,
            )
            cfg = {
                "host": "127.0.0.1",
                "port": http_port,
                "concurrency": args.concurrency,
                "duration": args.duration,
                "warmup": args.warmup,
                "body_bytes": args.body_bytes,
                "rate": args.rate,
            }
            sampler.start()
            time.sleep(0.1)  # a first sample before the load starts
            server_before = _server_stats(conn)
            figures_before = _figures_stats(conn)
            scraped_before = _scrape(metrics)
            gen = spawn_loadgen(cfg, secret)
            sampler.name("load_generator", gen.pid)
            if args.vacuum_every > 0:
                vacuumer = threading.Thread(target=_vacuum_loop, args=(url, args.vacuum_every, stop_vacuum))
                vacuumer.start()
            out, _ = gen.communicate(timeout=args.warmup + args.duration + 120)
            stop_vacuum.set()
            if gen.returncode != 0:
                raise RuntimeError(f"load generator exited with code {gen.returncode}")
            load = json.loads(out.strip().splitlines()[-1])
            server_after = _server_stats(conn)
            figures_after = _figures_stats(conn)
            scraped_after = _scrape(metrics)
            dead_tuples = _dead_tuples(conn)
            _check_alive(procs)
            drained = _drain(conn, load["accepted_total"] + 1, procs, args.drain_limit)
            sampler.stop()
            figures = _measure(conn, load["window_start"], load["window_end"], load["started"])
            counts = _exactly_once(conn)
    finally:
        stop_vacuum.set()
        if vacuumer is not None:
            vacuumer.join(120)
        sampler.stop()
        if gen is not None and gen.poll() is None:
            gen.kill()
        _stop(list(procs.values()))
    cpu = sampler.cores_between(load["window_start"], load["window_end"])
    # The load generator may exit before the last sample: its own rusage over its run time.
    cpu["load_generator"] = load.pop("cpu_s") / max(1e-9, load["ended"] - load["started"])
    load_s = max(1e-9, load["ended"] - load["started"])
    server = {
        k: round((server_after[k] - server_before[k]) / load_s, 1) for k in server_before if k in server_after
    }
    shared = sum(v for k, v in cpu.items() if k.startswith("postgres shared: "))
    if "machine" in cpu:
        # Busy time no sampled process accounts for: processes that started and ended between two
        # samples (other people's test runs), and counters below the reporting threshold.
        # ("exited children of X" is the whole life of processes reaped in the window, which may have
        # started before it: informative, but not subtracted here.)
        known = sum(
            v
            for k, v in cpu.items()
            if k not in ("machine", "load_generator", "processes created per s")
            and not k.startswith("exited children of ")
            and not (k == "postgres" and any(b in cpu for b in BACKENDS))  # their sum
        )
        cpu["unattributed"] = max(0.0, cpu["machine"] - known - cpu["load_generator"])
    cpu["postgres shared"] = shared
    rate = figures["executed_per_s"]
    per = {k: round(cpu[k] / rate * 1e6, 1) for k in CPU_ORDER if k in cpu and rate > 0}
    rollups = {
        k: round((figures_after[k] - figures_before[k]) / load_s, 2)
        for k in figures_before
        if k in figures_after
    }
    return {
        "stage_internals": _histogram_means(scraped_before, scraped_after),
        "dead_tuples_at_load_end": dead_tuples,
        "server_per_s": server,
        "figures_rows_per_s": rollups,
        "cpu_us_per_delivery": per,
        "vacuum_every_s": args.vacuum_every,
        "upkeep": args.upkeep,
        "mode": f"open loop, {args.rate:g}/s due" if args.rate else "closed loop",
        "load": load,
        "figures": figures,
        "drained": drained,
        "counts": counts,
        "cpu_cores": {k: round(v, 2) for k, v in cpu.items()},
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def _report(args: argparse.Namespace, res: dict[str, Any]) -> None:
    f, load, cpu = res["figures"], res["load"], res["cpu_cores"]
    lr, ls = f["latency_received"], f["latency_sent"]

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:,.1f}"

    print()
    print(
        f"e2e: {res['mode']}, concurrency {args.concurrency}, window {f['window_s']:.1f} s (after "
        f"{args.warmup:g} s warm-up), ~{args.body_bytes} B bodies, Standard Webhooks HMAC-SHA256"
        + (f"; VACUUM every {args.vacuum_every:g} s" if args.vacuum_every else "")
        + (f"; services' upkeep {args.upkeep}" if args.upkeep != "auto" else "")
    )
    print(
        f"  accepted (HTTP 200)/s     {load['accepted_in_window'] / f['window_s']:>9,.0f}   ack p50/p99 "
        f"{load['ack_p50_ms']:.1f}/{load['ack_p99_ms']:.1f} ms; answers {load['statuses']}"
    )
    print(f"  received/s (receipts)     {f['received_per_s']:>9,.0f}")
    print(f"  materialized/s            {f['materialized_per_s']:>9,.0f}")
    print(f"  executed/s                {f['executed_per_s']:>9,.0f}   <- e2e.deliveries_per_s")
    print(f"  latency received->executed p50 {ms(lr['p50_ms'])} ms, p90 {ms(lr['p90_ms'])} ms, "
          f"p99 {ms(lr['p99_ms'])} ms, max {ms(lr['max_ms'])} ms")  # fmt: skip
    print(f"  latency sent->executed     p50 {ms(ls['p50_ms'])} ms, p99 {ms(ls['p99_ms'])} ms")
    sr, sf = f["stage_received_to_routed"], f["stage_routed_to_finished"]
    print(f"  stages p50/p99: received->materialized {ms(sr['p50_ms'])}/{ms(sr['p99_ms'])} ms, "
          f"materialized->executed {ms(sf['p50_ms'])}/{ms(sf['p99_ms'])} ms")  # fmt: skip
    print(f"  backlog at window end     {f['backlog_at_end']:>9,}   (materializer queue "
          f"{f['backlog_materializer_at_end']:,}, executor queue {f['backlog_executor_at_end']:,}); "
          f"drained {ms(f['drained_s_after_end'])} s after the end")  # fmt: skip
    if load["late_sends"]:
        print(f"  late sends (open loop)    {load['late_sends']:,} (p99 {load['late_p99_ms']:.1f} ms late)")
    main = [k for k in CPU_ORDER if k in cpu]
    skip = ("machine", "processes created per s")
    rest = sorted((k for k in cpu if k not in main and k not in skip), key=lambda k: -cpu[k])
    rest = [k for k in rest if cpu[k] >= 0.01]
    print("  CPU in window, cores busy: " + ", ".join(f"{k} {cpu[k]:.2f}" for k in main))
    print("    elsewhere: " + ", ".join(f"{k} {cpu[k]:.2f}" for k in rest[:8]))
    print(
        f"    machine busy {cpu.get('machine', 0):.2f} of {os.cpu_count()} cores; "
        f"{cpu.get('processes created per s', 0):.0f} processes created/s on the machine"
    )
    internals = res["stage_internals"]
    if internals:
        print(
            "  stage internals over the load (mean): "
            + ", ".join(f"{k} {v['mean']:,}" for k, v in internals.items() if not k.startswith("upkeep_"))
        )
    runs = {k: v for k, v in internals.items() if k.startswith("upkeep_")}
    done = [f"{k.removesuffix('_ms')} {v['n']:.0f} runs, mean {v['mean']:,} ms" for k, v in runs.items()]
    none = "none (autovacuum covers the tables, or upkeep off)"
    print("  services' upkeep during the load: " + (", ".join(done) if done else none))
    print(f"  queue tables at load end (rows; dead = row versions left): {res['dead_tuples_at_load_end']}")
    srv = res["server_per_s"]
    if srv:
        print("  server-wide per s of load: " + ", ".join(f"{k} {v:,.1f}" for k, v in srv.items()))
    rollups = res.get("figures_rows_per_s") or {}
    rate = f["executed_per_s"]
    if rollups:
        print(
            "  figures rollups (connector_figures) per s of load: "
            + ", ".join(f"{k} {v:,.2f}" for k, v in rollups.items())
            + f"; per 1,000 deliveries: {1000 * rollups.get('written', 0.0) / max(1e-9, rate):.3f} rows"
        )
    per = res["cpu_us_per_delivery"]
    print("  CPU per executed delivery: " + ", ".join(f"{k} {v:.0f} us" for k, v in per.items()))
    print(f"  exactly once              {res['counts']}; drained: {res['drained']}")
    print("  per second (s: received / materialized / executed | materializer queue, executor queue)")
    for t in f["timeline"]:
        print(f"    {t['s']:>3}: {t['received']:>6} / {t['materialized']:>6} / {t['executed']:>6} | "
              f"{t['materializer_queue']:>7} {t['executor_queue']:>7}")  # fmt: skip


def _scenario_key(args: argparse.Namespace) -> tuple[str, str]:
    """Row key prefix and name suffix: plain ``e2e`` for the closed loop on the server as configured;
    ``e2e.open<R>`` for an open loop, ``.vacuum<S>s`` with the VACUUM stand-in."""
    prefix, parts = "e2e", []
    if args.rate:
        prefix += f".open{args.rate:g}"
        parts.append(f"open loop {args.rate:g}/s")
    if args.vacuum_every:
        prefix += f".vacuum{args.vacuum_every:g}s"
        parts.append(f"VACUUM every {args.vacuum_every:g} s")
    if args.upkeep != "auto":
        prefix += f".upkeep-{args.upkeep}"
        parts.append(f"upkeep {args.upkeep}")
    if getattr(args, "figures", "on") == "off":
        prefix += ".figures-off"
        parts.append("figures flushes off")
    return prefix, (f" ({', '.join(parts)})" if parts else "")


def _rows(args: argparse.Namespace, res: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks import common

    f, load = res["figures"], res["load"]
    lr = f["latency_received"]
    extra: dict[str, Any] = {
        "mode": res["mode"],
        "vacuum_every_s": args.vacuum_every,
        "upkeep": args.upkeep,
        "concurrency": args.concurrency,
        "window_s": round(f["window_s"], 2),
        "warmup_s": args.warmup,
        "body_bytes": args.body_bytes,
        "handler": f"{HANDLER} (async no-op, reads no event)",
        "processes": "ingress, materializer, executor, load generator: one each",
        "accepted_per_s": round(load["accepted_in_window"] / f["window_s"], 1),
        "received_per_s": round(f["received_per_s"], 1),
        "materialized_per_s": round(f["materialized_per_s"], 1),
        "executed_per_s": round(f["executed_per_s"], 1),
        "backlog_at_end": f["backlog_at_end"],
        "backlog_materializer_at_end": f["backlog_materializer_at_end"],
        "backlog_executor_at_end": f["backlog_executor_at_end"],
        "drained_s_after_end": f["drained_s_after_end"],
        "ack_p50_ms": round(load["ack_p50_ms"], 2),
        "ack_p99_ms": round(load["ack_p99_ms"], 2),
        "statuses": load["statuses"],
        "latency_received_ms": lr,
        "latency_sent_ms": f["latency_sent"],
        "stage_received_to_materialized_ms": f["stage_received_to_routed"],
        "stage_materialized_to_executed_ms": f["stage_routed_to_finished"],
        "cpu_cores": res["cpu_cores"],
        "cpu_us_per_delivery": res["cpu_us_per_delivery"],
        "server_per_s": res["server_per_s"],
        "figures_rows_per_s": res.get("figures_rows_per_s", {}),
        "figures_flush": getattr(args, "figures", "on"),
        "stage_internals": res["stage_internals"],
        "dead_tuples_at_load_end": res["dead_tuples_at_load_end"],
        "counts": res["counts"],
        "drained": res["drained"],
        "loadavg_end": res["loadavg_end"],
    }
    prefix, suffix = _scenario_key(args)
    rows = [
        common.make_row(
            f"{prefix}.deliveries_per_s", "end to end, HTTP post to handler executed, sustained" + suffix,
            f["executed_per_s"], "deliveries/s", target=TARGET_RATE, extra=extra,
        )
    ]  # fmt: skip
    for key, p, target in (("p50", "p50_ms", None), ("p99", "p99_ms", TARGET_P99)):
        name = f"end to end delivery-to-execution latency {key}" + suffix
        row_key = f"{prefix}.delivery_{key}_ms"
        value = lr[p]
        if value is None:
            rows.append(common.unavailable_row(
                row_key, name, "ms", f"{f['unexecuted_after_drain']} deliveries of the window not executed "
                f"within the {args.drain_limit:g} s drain limit", target=target))  # fmt: skip
        else:
            rows.append(common.make_row(row_key, name, value, "ms", target=target))
    rows.append(
        common.make_row(
            f"{prefix}.backlog_at_end",
            "end to end backlog at the end of the window (received, not executed)" + suffix,
            float(f["backlog_at_end"]), "deliveries",
            extra={"materializer_queue": f["backlog_materializer_at_end"],
                   "executor_queue": f["backlog_executor_at_end"]},
        )
    )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 s warm-up + 8 s window")
    parser.add_argument("--json-out", type=Path, help='write {"rows": [...]} (docs/benchmarks.md contract)')
    parser.add_argument("--duration", type=float, default=None, help="measured window, s (30; quick 8)")
    parser.add_argument("--warmup", type=float, default=None, help="load before the window, s (3; quick 1)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--rate", type=float, default=0.0, help="open loop at R deliveries/s (0: closed loop)"
    )
    parser.add_argument("--body-bytes", type=int, default=512)
    parser.add_argument(
        "--drain-limit",
        type=float,
        default=None,
        help="s to wait for the backlog after the load (60; quick 15)",
    )
    parser.add_argument(
        "--vacuum-every",
        type=float,
        default=None,
        help="VACUUM the receipt and WorkItem tables every S s during the load, standing in for "
        "autovacuum (off on the shared server; the services' upkeep does it by default); 0 = never "
        "(default)",
    )
    parser.add_argument(
        "--upkeep",
        choices=("auto", "on", "off"),
        default="auto",
        help="the services' own VACUUM/ANALYZE (CONNECTOR_*_UPKEEP_MODE; ADR 008). Default: auto, as shipped",
    )
    parser.add_argument(
        "--figures",
        choices=("on", "off"),
        default="on",
        help="the services' figures flushes (CONNECTOR_*_FIGURES_FLUSH_S; docs/metrics.md). Default: on, as"
        " shipped; off: nothing written to connector_figures (the in-memory recording stays)",
    )
    parser.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen:
        return loadgen_main(args.loadgen)
    if args.duration is None:
        args.duration = 8.0 if args.quick else 30.0
    if args.warmup is None:
        args.warmup = 1.0 if args.quick else 3.0
    if args.drain_limit is None:
        args.drain_limit = 15.0 if args.quick else 60.0

    from benchmarks import common

    vacuums = [args.vacuum_every or 0.0]
    rows: list[dict[str, Any]] = []
    failed = False
    with common.bench_lock():
        for vacuum in vacuums:
            run_args = argparse.Namespace(**{**vars(args), "vacuum_every": vacuum})
            t0 = time.monotonic()
            load_start = [round(x, 2) for x in os.getloadavg()]
            with common.fresh_migrated_database("e2e") as url:
                res = run_once(run_args, url)
            print(f"e2e: run took {time.monotonic() - t0:.1f} s under the lock", flush=True)
            res["loadavg_start"] = load_start
            _report(run_args, res)
            for row in _rows(run_args, res):
                row["extra"].setdefault("loadavg_start", load_start)
                rows.append(row)
            c, accepted = res["counts"], res["load"]["accepted_total"] + 1  # + the priming delivery
            if not (
                c["receipts"] == accepted
                and c["events"] == c["work_items"] == accepted - c["receipts_failed"]
            ):
                print(f"e2e: exactly-once check failed: {c} for {accepted} accepted", file=sys.stderr)
                failed = True
    common.write_json_out(args.json_out, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
