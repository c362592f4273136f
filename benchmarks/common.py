"""Shared helpers of the benchmark suite, and the contract every benchmark module follows.

The suite is run by ``python -m benchmarks.run`` (or ``./dev bench``); see docs/benchmarks.md.

Benchmark module contract
-------------------------
Every benchmark is a module run by the harness as its own process::

    python -m benchmarks.<name>_bench [--quick] --json-out PATH

Stage modules are ``benchmarks.ingress_bench``, ``benchmarks.materializer_bench``,
``benchmarks.executor_bench``, ``benchmarks.e2e_bench`` and ``benchmarks.sql_budget`` (peers and
the PostgreSQL reference follow the same contract: ``benchmarks.peers.graphile_worker_peer``,
``benchmarks.peers.procrastinate_peer``, ``benchmarks.reference``). The module writes to PATH one
JSON object::

    {"rows": [
        {"key": "executor.drain_per_s",      # stable id; the known ones are listed in EXPECTED
         "name": "executor drain, no lanes, 16 workers, 1 process",
         "value": 12345.6,                   # float, or null when unavailable
         "unit": "items/s",                  # a unit ending in "/s" means higher is better
         "target": ">= 12000",               # or null; ">=", ">", "<=", "<" and a number
         "scenario": "drain",                # or null; rows that share a scenario are compared
         "unavailable": "reason",            # only when value is null: why (never a made-up number)
         "extra": {"items": 50000, "workers": 16, ...}}   # anything else worth keeping
    ]}

``make_row`` builds such a row and ``write_json_out`` writes the file; ``stage_argparser`` gives the
two standard options. Rules:

- ``--quick`` must make the module finish in a few seconds (the whole ``--quick`` suite runs in
  under a minute); without it, run the real measurement.
- Use the item count and concurrency of ``drain_items(quick)`` and ``WORKERS`` / ``LANES`` for
  drain benchmarks so that our figures and the peers' are comparable; put them in ``extra``.
- Take the benchmark lock through ``bench_lock()``: under the harness it reuses the lock the
  harness already holds (inherited file descriptor); run alone it takes ``/tmp/connector-bench.lock``
  itself. Opening the lock file anew under the harness would wait for the harness forever; the
  harness notices such a wait and lends the lock, but the module then runs after any other
  waiting benchmark.
- Create scratch databases with ``fresh_database(tag)`` (empty) or
  ``fresh_migrated_database(tag)`` (our schema); both are named ``connector_bench_<tag>_<pid>_…``
  on the test server (``connector.common.core.testdb`` rules) and are dropped afterwards.
- Exit non-zero on failure (the harness reports the reason from the last line of stderr); a
  figure that could not be measured is a row with ``value: null`` and ``unavailable``, never a guess.
- Benchmarks print figures; they assert nothing about speed.

``EXPECTED`` lists the rows the issue asks for; the harness reports each missing one as
"not available" so the table always shows the full list.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / ".bench"
PEERS_DIR = BENCH_DIR / "peers"
LOCK_PATH = "/tmp/connector-bench.lock"
LOCK_FD_ENV = "CONNECTOR_BENCH_LOCK_FD"
LOCK_HELD_ENV = "CONNECTOR_BENCH_LOCK_HELD"
DB_PREFIX = "connector_bench_"

# The shared drain workload: our executor and every peer run the same counts.
WORKERS = 16
LANES = 100
DRAIN_ITEMS_FULL = 50_000
DRAIN_ITEMS_QUICK = 1_000


def drain_items(quick: bool) -> int:
    return DRAIN_ITEMS_QUICK if quick else DRAIN_ITEMS_FULL


# --------------------------------------------------------------------------------------------------
# Rows, targets, comparison
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    key: str
    module: str  # the module expected to report it
    name: str
    unit: str
    target: str | None = None
    scenario: str | None = None


EXPECTED: tuple[Expected, ...] = (
    Expected("ingress.acks_per_s", "ingress", "ingress verified durable acks, concurrency 64", "acks/s",
             ">= 5000", "insert"),
    Expected("ingress.ack_p50_ms", "ingress", "ingress ack latency p50, concurrency 64", "ms"),
    Expected("ingress.ack_p99_ms", "ingress", "ingress ack latency p99, concurrency 64", "ms", "< 50"),
    Expected("materializer.receipts_per_s", "materializer", "materializer, pre-loaded backlog", "receipts/s"),
    Expected("executor.drain_per_s", "executor", "executor no-op drain, no lanes, 16 workers, 1 process",
             "items/s", ">= 12000", "drain"),
    Expected("executor.drain_2proc_per_s", "executor",
             "executor no-op drain, no lanes, 16 workers x 2 processes", "items/s", ">= 20000"),
    Expected("executor.drain_lanes_per_s", "executor", "executor no-op drain, 100 source lanes, 16 workers",
             "items/s", ">= 6000", "drain_lanes"),
    Expected("executor.claim_ratio", "executor", "claim latency p50, 1M vs 10k ready items", "ratio",
             "<= 1.5"),
    Expected("e2e.deliveries_per_s", "e2e", "end to end, HTTP post to handler executed, sustained",
             "deliveries/s", ">= 3000"),
    Expected("e2e.delivery_p50_ms", "e2e", "end to end delivery-to-execution latency p50", "ms"),
    Expected("e2e.delivery_p99_ms", "e2e", "end to end delivery-to-execution latency p99", "ms", "< 1000"),
    Expected("sql.statements_per_delivery", "sql-budget", "SQL statements per delivery (all stages)",
             "stmts/delivery"),
    Expected("sql.row_writes_per_delivery", "sql-budget", "SQL row writes per delivery", "rows/delivery"),
    Expected("sql.wal_bytes_per_delivery", "sql-budget", "WAL bytes per delivery", "B/delivery"),
    # ./dev bench --long only (benchmarks.sustained, issue #29 item 5)
    Expected("sustained.p99_ratio", "sustained",
             "sustained e2e, p99 last windows / first windows (30 min at 70% of the maximum)", "ratio",
             "<= 1.2"),
    Expected("sustained.size_ratio", "sustained",
             "sustained e2e, queue tables + indexes peak, last windows / first steady", "ratio", "<= 1.2"),
)  # fmt: skip

_TARGET = re.compile(r"^\s*(>=|<=|>|<)\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*$")


def parse_target(target: str | None) -> tuple[str, float] | None:
    if not target:
        return None
    m = _TARGET.match(target)
    if not m:
        return None
    return m.group(1), float(m.group(2).replace(",", "").replace("_", ""))


def meets_target(value: float | None, target: str | None) -> bool | None:
    """True/False against a target such as ``">= 5000"``; None when either is missing or unreadable."""
    parsed = parse_target(target)
    if value is None or parsed is None:
        return None
    op, bound = parsed
    return {">=": value >= bound, ">": value > bound, "<=": value <= bound, "<": value < bound}[op]


def higher_is_better(row: dict[str, Any]) -> bool:
    explicit = (row.get("extra") or {}).get("higher_is_better")
    if isinstance(explicit, bool):
        return explicit
    return str(row.get("unit", "")).endswith("/s")


def make_row(
    key: str,
    name: str,
    value: float | None,
    unit: str,
    *,
    target: str | None = None,
    scenario: str | None = None,
    unavailable: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if value is None and not unavailable:
        raise ValueError(f"row {key}: a missing value needs a reason (unavailable=...)")
    if value is not None and not math.isfinite(value):
        raise ValueError(f"row {key}: value {value!r} is not a finite number")
    row: dict[str, Any] = {
        "key": key,
        "name": name,
        "value": None if value is None else float(value),
        "unit": unit,
        "target": target,
        "scenario": scenario,
        "extra": dict(extra or {}),
    }
    if value is None:
        row["unavailable"] = unavailable
    return row


def unavailable_row(key: str, name: str, unit: str, reason: str, **kw: Any) -> dict[str, Any]:
    return make_row(key, name, None, unit, unavailable=reason, **kw)


def validate_rows(doc: Any) -> list[dict[str, Any]]:
    """The rows of a module's --json-out document; raises ValueError when it breaks the contract."""
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError('expected a JSON object {"rows": [...]}')
    rows = []
    for i, raw in enumerate(doc["rows"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or "unit" not in raw:
            raise ValueError(f"row {i}: needs at least name, value and unit")
        value = raw.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"row {i} ({raw['name']}): value must be a number or null")
        key = raw.get("key") or raw["name"]
        if value is None and not raw.get("unavailable"):
            raise ValueError(f"row {i} ({raw['name']}): null value without an 'unavailable' reason")
        rows.append(
            make_row(
                str(key),
                raw["name"],
                None if value is None else float(value),
                str(raw["unit"]),
                target=raw.get("target"),
                scenario=raw.get("scenario"),
                unavailable=raw.get("unavailable"),
                extra=raw.get("extra") if isinstance(raw.get("extra"), dict) else {},
            )
        )
    return rows


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s'\"]+):[^@\s'\"]+@", re.I)


def redact(text: str) -> str:
    """Reasons end up in the table and the JSON: never with a password from a connection URL."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


def stage_argparser(description: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smoke-sized run (seconds)")
    parser.add_argument("--json-out", type=Path, help='write {"rows": [...]} here (benchmark contract)')
    return parser


def write_json_out(path: Path | None, rows: Sequence[dict[str, Any]]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"rows": list(rows)}, indent=2) + "\n")
    tmp.replace(path)


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def compare_with_peers(rows: list[dict[str, Any]]) -> None:
    """Fill ``result`` (pass/miss against target) and ``vs_peer`` (ratio to the best peer figure of
    the same scenario) on our rows, in place. Peer and reference rows are those whose ``group`` is
    ``peer`` or ``reference``."""
    for row in rows:
        ok = meets_target(row.get("value"), row.get("target"))
        row["result"] = None if ok is None else ("pass" if ok else "miss")
        row["vs_peer"] = None
        if row.get("group") != "stage" or row.get("value") is None or not row.get("scenario"):
            continue
        candidates = [
            r
            for r in rows
            if r.get("group") in ("peer", "reference")
            and r.get("scenario") == row["scenario"]
            and r.get("value") is not None
        ]
        if not candidates:
            continue
        hib = higher_is_better(row)
        best = max(candidates, key=lambda r: r["value"]) if hib else min(candidates, key=lambda r: r["value"])
        if best["value"] == 0:
            continue
        row["vs_peer"] = {
            "ratio": row["value"] / best["value"],
            "peer_key": best["key"],
            "peer_name": best["name"],
            "peer_value": best["value"],
            "peer_unit": best["unit"],
        }


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------

GROUP_TITLES = {
    "stage": "Our services",
    "peer": "Peers (same machine, same run, same item count and concurrency)",
    "reference": "PostgreSQL's own reference",
}


def fmt_value(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def render_table(rows: Sequence[dict[str, Any]], name_width: int = 60) -> str:
    """The human table: one section per group; unavailable rows say why. Names longer than
    ``name_width`` get a line of their own."""
    name_w = min(max([len(r["name"]) for r in rows] + [20]), name_width)
    lines: list[str] = []
    header = (
        f"{'benchmark':<{name_w}}  {'value':>12}  {'unit':<12}  {'target':<9}  {'result':<6}  vs best peer"
    )
    for group in ("stage", "peer", "reference"):
        section = [r for r in rows if r.get("group") == group]
        if not section:
            continue
        lines += ["", GROUP_TITLES[group], header, "-" * len(header)]
        for r in section:
            name = r["name"]
            if len(name) > name_w:
                lines.append(name)
                name = ""
            if r.get("value") is None:
                lines.append(f"{name:<{name_w}}  not available: {r.get('unavailable')}")
                continue
            vs = r.get("vs_peer")
            vs_text = (
                f"{vs['ratio']:.2f}x {vs['peer_name']} ({fmt_value(vs['peer_value'])} {vs['peer_unit']})"
                if vs
                else ""
            )
            lines.append(
                f"{name:<{name_w}}  {fmt_value(r['value']):>12}  {r['unit']:<12}  "
                f"{r.get('target') or '-':<9}  {r.get('result') or '-':<6}  {vs_text}".rstrip()
            )
    return "\n".join(lines).lstrip("\n")


# --------------------------------------------------------------------------------------------------
# The benchmark lock
# --------------------------------------------------------------------------------------------------


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _inherited_lock_fds(path: str) -> list[int]:
    fds: list[int] = []
    env_fd = os.environ.get(LOCK_FD_ENV)
    if env_fd and env_fd.isdigit():
        fds.append(int(env_fd))
    with contextlib.suppress(OSError):
        fds += sorted(int(n) for n in os.listdir("/proc/self/fd") if n.isdigit())
    return [fd for fd in dict.fromkeys(fds) if _same_file(fd, path)]


def lock_holders(path: str = LOCK_PATH) -> tuple[list[int], list[int]]:
    """(pids holding, pids waiting for) the flock on ``path``, read from /proc/locks (Linux)."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return [], []
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holding: list[int] = []
    waiting: list[int] = []
    for line in text.splitlines():
        parts = line.split()
        if dev not in parts or "FLOCK" not in parts:
            continue
        blocked = "->" in parts
        idx = parts.index("FLOCK")
        with contextlib.suppress(IndexError, ValueError):
            (waiting if blocked else holding).append(int(parts[idx + 3]))
    return holding, waiting


class BenchLock:
    """``flock`` on /tmp/connector-bench.lock, reentrant across processes of one run.

    An inherited descriptor of the lock file (from ``flock(1)`` in ``./dev bench`` or from the
    harness, which also names it in ``CONNECTOR_BENCH_LOCK_FD``) shares the holder's lock, so
    ``flock`` on it succeeds at once and releasing it is left to the holder."""

    def __init__(self, path: str = LOCK_PATH) -> None:
        self.path = path
        self.fd: int | None = None
        self.inherited = False

    def acquire(self, *, announce: bool = True) -> BenchLock:
        for fd in _inherited_lock_fds(self.path):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue
            self.fd, self.inherited = fd, True
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if announce:
                holders, _ = lock_holders(self.path)
                print(
                    f"bench: waiting for {self.path} (held by pid {', '.join(map(str, holders)) or '?'})",
                    file=sys.stderr,
                    flush=True,
                )
            fcntl.flock(fd, fcntl.LOCK_EX)
        self.fd, self.inherited = fd, False
        return self

    def lend(self) -> None:
        """Let another process take the lock (a child that opens the lock file itself)."""
        assert self.fd is not None
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def take_back(self) -> None:
        assert self.fd is not None
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        if self.fd is not None and not self.inherited:
            os.close(self.fd)  # closing the only descriptor releases the lock
        self.fd = None

    def child_env(self) -> dict[str, str]:
        """For children run while we hold the lock: the inherited descriptor, and the plain flag
        ``CONNECTOR_BENCH_LOCK_HELD=1`` for modules that check only that."""
        assert self.fd is not None
        return {LOCK_FD_ENV: str(self.fd), LOCK_HELD_ENV: "1"}


@contextlib.contextmanager
def bench_lock(path: str = LOCK_PATH) -> Iterator[BenchLock]:
    lock = BenchLock(path).acquire()
    try:
        yield lock
    finally:
        lock.release()


# --------------------------------------------------------------------------------------------------
# Databases on the test server
# --------------------------------------------------------------------------------------------------


def server_url() -> str:
    from connector.common.core import testdb

    return testdb.server_url()


def _db_name(tag: str) -> str:
    tag = re.sub(r"[^a-z0-9_]", "_", tag.lower())[:24]
    return f"{DB_PREFIX}{tag}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def fresh_database(tag: str) -> Iterator[str]:
    """An empty scratch database on the test server (for peers and pgbench); dropped afterwards."""
    import psycopg
    from psycopg import sql

    from connector.common.core import testdb

    name = _db_name(tag)
    admin = server_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    url = testdb.with_database(admin, name)
    try:
        yield url
    finally:
        drop_database(name)


@contextlib.contextmanager
def fresh_migrated_database(tag: str) -> Iterator[str]:
    """A scratch database with our schema (copy of the migrated template); dropped afterwards."""
    from connector.common.core import testdb

    with testdb.fresh_database(prefix=f"{DB_PREFIX}{re.sub(r'[^a-z0-9_]', '_', tag.lower())[:24]}") as url:
        yield url


def drop_database(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


_BENCH_DB = re.compile(rf"^{DB_PREFIX}(?:[a-z0-9_]*_)?(\d+)_[0-9a-f]{{8}}$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_database_names(names: Iterable[str]) -> list[str]:
    """Scratch benchmark databases whose creating process is gone (left by a killed run)."""
    stale = []
    for name in names:
        m = _BENCH_DB.match(name)
        if m and not _pid_alive(int(m.group(1))):
            stale.append(name)
    return stale


def drop_stale_databases() -> list[str]:
    import psycopg

    with psycopg.connect(server_url(), autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'connector_bench_%'")
        ]
    stale = stale_database_names(names)
    for name in stale:
        drop_database(name)
    return stale


def pg_env(url: str) -> dict[str, str]:
    """libpq environment variables for ``url`` (so no password lands on a command line)."""
    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(url)
    mapping = {
        "host": "PGHOST",
        "hostaddr": "PGHOSTADDR",
        "port": "PGPORT",
        "user": "PGUSER",
        "password": "PGPASSWORD",
        "dbname": "PGDATABASE",
        "sslmode": "PGSSLMODE",
    }
    return {env: str(params[key]) for key, env in mapping.items() if params.get(key) is not None}


# --------------------------------------------------------------------------------------------------
# Run metadata
# --------------------------------------------------------------------------------------------------

SERVER_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "wal_level",
    "shared_buffers",
    "max_connections",
    "autovacuum",
    "max_wal_size",
)


def _cmd_version(cmd: Sequence[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else None


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "node": _cmd_version(["node", "--version"]),
        "pgbench": _cmd_version(["pgbench", "--version"]),
        # Other work on the machine skews figures: keep the load next to them.
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
        info["git_commit"] = head or None
    return info


def server_info() -> dict[str, Any]:
    import psycopg

    with psycopg.connect(server_url(), autocommit=True, connect_timeout=5) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                (list(SERVER_SETTINGS),),
            ).fetchall()
        )
    return {"server_version": version[0] if version else None, "settings": settings}
