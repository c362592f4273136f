"""The SQL budget of a delivery: ``pg_stat_statements`` digests of normal operation, per named statement.

    .venv/bin/python -m benchmarks.sql_budget [--quick] [--rate R] [--duration S] [--burst B]
                                              [--lanes] [--json-out PATH] [--report-out PATH]
    ./dev bench --only sql-budget                    # through the suite harness (rows sql.*)

What one run does (docs/benchmarks.md, "SQL budget"):

1. a **private PostgreSQL cluster** (``benchmarks.pgcluster.PrivateCluster``: ``initdb`` of the
   machine's PostgreSQL 15 binaries into a temporary folder, a free port) with
   ``shared_preload_libraries = pg_stat_statements``, ``pg_stat_statements.track = all``,
   ``track_utility = on``, ``track_io_timing = on``, ``autovacuum = off`` (as on the shared server,
   so the services' own upkeep vacuums the queue tables) and ``fsync = off`` (no count depends on it;
   the disk is shared). The shared server on 5432 is never touched;
2. one **role per stage**: ingress, materializer and executor connect as ``connector_ingress``,
   ``connector_materializer`` and ``connector_executor``, the pack install as ``connector_admin``,
   the harness's own reads as ``sqlbudget_harness`` (left out of every figure).
   ``pg_stat_statements`` keys its counters by role, so the *process* that sent a statement is
   exact, whatever its text;
3. the pack of ``benchmarks.e2e_bench`` (Standard Webhooks, fan out to the async no-op handler;
   ``--lanes`` adds a second work type in a FIFO source lane per delivery), the three services as
   real processes (``connector ingress|materializer|executor``), and the **background work of
   normal operation** with intervals short enough to run several times in the window: upkeep every
   2 s with thresholds low enough that VACUUM/ANALYZE run (``UPKEEP_VACUUM_DEAD_ROWS`` 2000,
   ``UPKEEP_ANALYZE_ROWS`` 2000), retention every 2 s deleting deliveries retired more than 3 s ago,
   stats sampling every 2 s, reclaim every 2 s, route refresh every 2 s (ingress and materializer),
   process heartbeats every 5 s (the default);
4. one priming delivery, then the run waits until retention deleted it, resets
   ``pg_stat_statements`` and ``pg_stat_wal``, and sends a signed load at a fixed rate (open loop,
   ``--burst`` deliveries due together every ``burst / rate`` s, so batches have more than one
   member and a per-item statement stands out from a per-batch one); after the load it waits
   until every delivery was executed **and deleted by retention**: every delivery's whole life
   (accepted, materialized, executed, deleted) lies inside the counters;
5. every digest is mapped to the **named constant** that sent it (``catalog()``: each upper-case
   SQL string constant of the ``connector`` packages, normalized the way ``pg_stat_statements``
   normalizes: parameters and literals become ``?``, comments and case go; a ``{...}`` slot of a
   statement template matches anything), classified as hot loop or background (``BACKGROUND``),
   and divided by the number of deliveries.

Headline figures (rows ``sql.*``): statements per delivery, row writes per delivery (rows of
INSERT/UPDATE/DELETE statements), WAL bytes per delivery (``pg_stat_wal``: the private cluster
writes WAL for this run only). ``--report-out`` (default ``.bench/sql-budget.json``) holds the whole
report. ``tests/test_sql_budget.py`` runs a short load and holds each stage to a written budget.
Nothing here asserts anything about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import e2e_bench  # noqa: E402
from benchmarks.pgcluster import PrivateCluster  # noqa: E402

DBNAME = "connector"
HARNESS_ROLE = "sqlbudget_harness"
#: Process (stage) -> its database role. pg_stat_statements keys its counters by role.
ROLES = {
    "ingress": "connector_ingress",
    "materializer": "connector_materializer",
    "executor": "connector_executor",
    "admin": "connector_admin",
}
STAGE_OF_ROLE = {v: k for k, v in ROLES.items()}
STAGES = ("ingress", "materializer", "executor", "admin", "background", "database")
#: Statements PostgreSQL runs itself inside a statement of ours (pg_stat_statements.track = all,
#: ``toplevel`` false): the foreign-key triggers' row checks, run as the table owner.
DATABASE_ROLE = "postgres"

CLUSTER_SETTINGS: dict[str, Any] = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_utility": "on",
    "pg_stat_statements.max": "10000",
    "compute_query_id": "on",
    "track_io_timing": "on",
    "track_wal_io_timing": "on",
    # As on the shared server: autovacuum off, so the services' upkeep (mode auto) maintains the
    # queue tables during the run. fsync changes no count; off spares the shared disk.
    "autovacuum": "off",
    "fsync": "off",
    "shared_buffers": "'128MB'",
    "max_connections": "200",
}

#: Background intervals of the run (environment of the three services), chosen so each job runs
#: several times in a window of ~10 s. Heartbeats keep their 5 s default.
BACKGROUND_ENV = {
    "CONNECTOR_EXECUTOR_UPKEEP_MODE": "auto",
    "CONNECTOR_MATERIALIZER_UPKEEP_MODE": "auto",
    "CONNECTOR_EXECUTOR_UPKEEP_INTERVAL_S": "2",
    "CONNECTOR_MATERIALIZER_UPKEEP_INTERVAL_S": "2",
    "CONNECTOR_EXECUTOR_UPKEEP_VACUUM_DEAD_ROWS": "2000",
    "CONNECTOR_MATERIALIZER_UPKEEP_VACUUM_DEAD_ROWS": "2000",
    "CONNECTOR_EXECUTOR_UPKEEP_ANALYZE_ROWS": "2000",
    "CONNECTOR_MATERIALIZER_UPKEEP_ANALYZE_ROWS": "2000",
    "CONNECTOR_EXECUTOR_RETENTION_INTERVAL_S": "2",
    "CONNECTOR_EXECUTOR_RETENTION_DELIVERED_S": "3",
    "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "2",
    "CONNECTOR_EXECUTOR_RECLAIM_INTERVAL_S": "2",
    "CONNECTOR_INGRESS_ROUTES_REFRESH_S": "2",
    "CONNECTOR_MATERIALIZER_ROUTES_REFRESH_S": "2",
    "CONNECTOR_EXECUTOR_ROUTES_REFRESH_S": "2",
}

#: Named statements sent by background jobs (not per delivery): the reason each is background.
#: A statement not listed here is hot-loop work of the process that sent it.
BACKGROUND: dict[str, str] = {
    "connector.common.maintenance.upkeep": (
        "upkeep (ADR 008): table state, VACUUM / ANALYZE every upkeep interval"
    ),
    "connector.common.maintenance.retention": "retention (ADR 009): the sweep every retention interval",
    "connector.common.core.background": "a background job's session lock (retention, upkeep)",
    "connector.common.store.processes": "process registry: register, heartbeat every 5 s, prune",
    "connector.common.store.deliveries": "retention (ADR 009): classify and delete retired deliveries",
    "connector.common.store.receipts.admin.RECEIPT_OLDEST_AGE": "retention: the oldest receipt's age (gauge)",
    "connector.common.store.receipts.routing.RECEIPT_ROUTING_LAG": "materializer's routing-lag gauge",
    "connector.common.store.packs.ROUTE_LIST_ACTIVE": "ingress route table refresh (NOTIFY, every refresh_s)",
    "connector.common.store.packs.PACK_LIST_ACTIVE": "materializer route cache refresh (NOTIFY, refresh_s)",
    "connector.common.store.work_items.finalize.WORK_ITEM_RECLAIM_CANDIDATES": "reclaimer (every reclaim)",
    "connector.ingress.service.READY_PROBE": "readiness probe (/readyz, every orchestrator probe)",
    "connector.executor.service.AUTOVACUUM_SETTING": "read once at start",
    "connector.common.core.listener": "LISTEN on a (re)connect of a service's listener",
    "connector.common.store.admin_requests.ADMIN_REQUEST_DELETE_EXPIRED": "retention of admin request ids",
    "connector.common.store.work_items.stats.WORK_ITEM_QUEUE_DEPTH": "stats sampler (every stats interval)",
    "connector.common.store.work_items.stats.WORK_ITEM_BLOCKED_LANES": "stats sampler (every stats interval)",
    "connector.common.store.work_items.finalize.WORK_ITEM_RECLAIM_EXPIRED": "reclaimer (every reclaim)",
    "connector.common.store.lanes.LANE_LIST_STUCK": "lane repair (background)",
}

# --------------------------------------------------------------------------------------------------
# Normalization: the same canonical text for a constant and for pg_stat_statements' digest of it
# --------------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<lc>--[^\n]*)
  | (?P<bc>/\*.*?\*/)
  | (?P<str>(?:[EeBbXx]|[Uu]&)?'(?:[^']|'')*')
  | (?P<dq>\$(?P<tag>[A-Za-z_][A-Za-z_0-9]*)?\$.*?\$(?P=tag)?\$)
  | (?P<param>\$\d+|%\(\w+\)[sbt]|%[sbt])
  | (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<qid>"(?:[^"]|"")*")
  | (?P<id>[A-Za-z_][A-Za-z_0-9$]*)
  | (?P<tpl>\{[A-Za-z_0-9]*(?:![rsa])?(?::[^}]*)?\})
  | (?P<op>::|<=|>=|<>|!=|=>|\|\||[^\s])
    """,
    re.X | re.S,
)
LITERAL = "?"
SLOT = "\x00"  # a {...} slot of a statement template


def tokens(text: str) -> list[str]:
    """Canonical tokens: parameters, literals and boolean/NULL constants are ``?`` (as
    pg_stat_statements replaces constants by ``$n``), identifiers lower-case and unquoted, comments
    and whitespace dropped, a minus sign in front of a constant folded into it."""
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # pragma: no cover - the op alternative matches any character
            break
        pos = m.end()
        kind = m.lastgroup
        if kind in ("ws", "lc", "bc"):
            continue
        if kind in ("str", "param", "num", "dq"):
            tok = LITERAL
        elif kind == "qid":
            tok = m.group().strip('"').replace('""', '"').lower()
        elif kind == "id":
            tok = m.group().lower()
            if len(out) >= 2 and out[-1] == "(" and out[-2] == "extract":
                tok = LITERAL  # extract(epoch FROM x) is extract('epoch', x): a constant
            elif tok in ("true", "false"):
                tok = LITERAL
            elif tok == "null" and not (out and out[-1] in ("is", "not")):
                tok = LITERAL
        elif kind == "tpl":
            tok = SLOT
        else:
            tok = m.group()
        if tok == LITERAL and out and out[-1] == "-":
            out.pop()
        out.append(tok)
    return out


def statements_of(text: str) -> list[list[str]]:
    """The canonical token lists of the statements in ``text`` (split on top-level ``;``)."""
    parts: list[list[str]] = [[]]
    for tok in tokens(text):
        if tok == ";":
            parts.append([])
        else:
            parts[-1].append(tok)
    return [p for p in parts if p]


def canonical(text: str) -> str:
    return " ".join(" ".join(p) for p in statements_of(text))


# --------------------------------------------------------------------------------------------------
# The catalog of named statements
# --------------------------------------------------------------------------------------------------

_SQL_START = re.compile(
    r"^\s*(?:--[^\n]*\n\s*)*\(?\s*(SELECT|INSERT|UPDATE|DELETE|WITH|VACUUM|ANALYZE|LISTEN|NOTIFY|UNLISTEN"
    r"|SET|RESET|SHOW|LOCK|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|TRUNCATE|VALUES)\b",
    re.I,
)
#: Statements psycopg sends itself (``conn.transaction()``), not a constant of ours.
DRIVER_STATEMENTS = {
    "psycopg.BEGIN": "BEGIN",
    "psycopg.COMMIT": "COMMIT",
    "psycopg.ROLLBACK": "ROLLBACK",
    "psycopg.SAVEPOINT": 'SAVEPOINT "_pg3_1"',
    "psycopg.RELEASE_SAVEPOINT": 'RELEASE "_pg3_1"',
    "psycopg.ROLLBACK_TO_SAVEPOINT": 'ROLLBACK TO "_pg3_1"',
}


@dataclass
class Named:
    name: str  # module.CONSTANT[#k] (k: the k-th statement of a multi-statement constant)
    module: str
    text: str
    canon: str
    pattern: re.Pattern[str] | None = None  # templates only
    aliases: list[str] = field(default_factory=list)


def _modules() -> Iterator[str]:
    """Module names of the ``connector`` namespace, from the source roots (``libs/*/connector``,
    ``services/*/connector``: the editable install's finder lists no modules to ``pkgutil``)."""
    for top in sorted([*ROOT.glob("libs/*/connector"), *ROOT.glob("services/*/connector")]):
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top.parent).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if (
                "migrations" in parts
                or name.startswith("connector.v1")
                or parts[-1].endswith(("_pb2", "_pb2_grpc", "__main__"))
            ):
                continue
            yield name


def catalog() -> tuple[list[Named], list[str]]:
    """Every named SQL statement of the ``connector`` packages: upper-case module constants whose
    text starts like SQL (tuples of such strings: one name per element). The store's modules come
    first, so a constant re-exported elsewhere keeps its store name. Returns (statements, modules
    that failed to import)."""
    found: dict[str, Named] = {}
    failed: list[str] = []
    names = sorted(_modules(), key=lambda n: (not n.startswith("connector.common.store."), n))
    for modname in names:
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # an optional dependency missing: listed, never silent
            failed.append(f"{modname}: {type(exc).__name__}")
            continue
        for attr, value in sorted(vars(mod).items()):
            if not attr.isupper() or attr.startswith("__"):
                continue
            texts: list[tuple[str, str]] = []
            if isinstance(value, str) and _SQL_START.match(value):
                texts = [(f"{modname}.{attr}", value)]
            elif isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
                if all(_SQL_START.match(v) for v in value):
                    texts = [(f"{modname}.{attr}[{i}]", v) for i, v in enumerate(value)]
            for name, text in texts:
                parts = statements_of(text)
                for k, part in enumerate(parts):
                    canon = " ".join(part)
                    full = name if len(parts) == 1 else f"{name}#{k + 1}"
                    if canon in found:
                        if found[canon].name != full and full not in found[canon].aliases:
                            found[canon].aliases.append(full)
                        continue
                    found[canon] = Named(full, modname, text, canon, _template(part))
    for name, text in DRIVER_STATEMENTS.items():
        canon = canonical(text)
        found.setdefault(canon, Named(name, "psycopg", text, canon))
    return list(found.values()), failed


def _template(part: list[str]) -> re.Pattern[str] | None:
    if SLOT not in part:
        return None
    rx = "".join("(?: .*?)?" if t == SLOT else " " + re.escape(t) for t in part)
    return re.compile("^" + rx + "$", re.S)


class Matcher:
    def __init__(self, named: Sequence[Named]) -> None:
        self.exact = {n.canon: n for n in named if n.pattern is None}
        self.templates = [n for n in named if n.pattern is not None]

    def match(self, query: str) -> Named | None:
        canon = canonical(query)
        hit = self.exact.get(canon)
        if hit is not None:
            return hit
        if canon.startswith("savepoint ") or canon.startswith(("release ", "rollback to ")):
            key = {"s": "psycopg.SAVEPOINT", "r": "psycopg.RELEASE_SAVEPOINT"}.get(canon[0])
            if canon.startswith("rollback to "):
                key = "psycopg.ROLLBACK_TO_SAVEPOINT"
            return next((n for n in self.exact.values() if n.name == key), None)
        for n in self.templates:
            assert n.pattern is not None
            if n.pattern.match(" " + canon):
                return n
        return None


_FK_PARENT = re.compile(
    r'^SELECT (?:1|\$\d+) FROM ONLY "\w+"\."(?P<table>\w+)" x '
    r'WHERE "(?P<col>\w+)" OPERATOR\(pg_catalog\.=\) \$1'
    r"(?: AND .*)? FOR KEY SHARE OF x$",
    re.S,
)
_FK_CHILD = re.compile(
    r'^SELECT (?:1|\$\d+) FROM ONLY "\w+"\."(?P<table>\w+)" x '
    r'WHERE \$1 OPERATOR\(pg_catalog\.=\) "(?P<col>\w+)"'
    r"(?: AND .*)? FOR KEY SHARE OF x$",
    re.S,
)


def foreign_keys() -> set[tuple[str, str, str, str]]:
    """(child table, child column, parent table, parent column) of every foreign key of the schema
    (first column of each)."""
    from connector.common.store import schema

    out = set()
    for table in schema.metadata.tables.values():
        for fk in table.foreign_key_constraints:
            el = fk.elements[0]
            out.add((table.name, el.parent.name, el.column.table.name, el.column.name))
    return out


def fk_check_name(query: str, fks: set[tuple[str, str, str, str]]) -> str | None:
    """The name of a foreign-key trigger's row check (PostgreSQL's ``ri_triggers.c`` text), when it
    checks one of the schema's foreign keys: ``fk.parent_exists:P.col`` (a referencing row was
    inserted, or updated in the transaction that inserted it) or ``fk.no_reference:C.col`` (a
    referenced row was deleted: no row may still point at it)."""
    m = _FK_PARENT.match(query)
    if m and any(p == m["table"] and pc == m["col"] for _, _, p, pc in fks):
        return f"fk.parent_exists:{m['table']}.{m['col']}"
    m = _FK_CHILD.match(query)
    if m and any(c == m["table"] and cc == m["col"] for c, cc, _, _ in fks):
        return f"fk.no_reference:{m['table']}.{m['col']}"
    return None


def background_reason(name: str) -> str | None:
    base = name.split("[", 1)[0].split("#", 1)[0]
    if base in BACKGROUND:
        return BACKGROUND[base]
    module = base.rsplit(".", 1)[0]
    return BACKGROUND.get(module)


_WRITE = re.compile(r"(?:^|[()] )(insert into|update|delete from) ", re.S)


def is_write(canon: str) -> bool:
    """An INSERT / UPDATE / DELETE statement (also under WITH), not ``FOR UPDATE``."""
    return bool(_WRITE.search(canon)) and not canon.startswith(("select", "vacuum", "analyze"))


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    rate: float = 400.0
    duration: float = 10.0
    burst: int = 32
    concurrency: int = 64
    lanes: bool = False
    #: Retention deletes every delivery 3 s after it retired, inside the counters (False: kept).
    retention: bool = True
    #: GET /readyz of the ingress every this many seconds during the load (an orchestrator's probe).
    probe_every_s: float = 1.0
    body_bytes: int = 512
    #: Replace a service's command (tests: an executor with an injected per-item statement).
    commands: dict[str, list[str]] = field(default_factory=dict)
    #: The services started. Ingress alone: the deliveries stay receipts (no drain, no retention),
    #: and the counters hold the ingress hot path only (``--stages ingress``; ``--rate 0``: closed loop).
    stages: tuple[str, ...] = ("ingress", "materializer", "executor")
    drain_limit_s: float = 90.0


def _manifest(lanes: bool) -> dict[str, Any]:
    doc = e2e_bench._manifest()
    doc["name"] = "sql-budget"
    if lanes:
        doc["work_types"]["noop_lane"] = {
            "handler": {"kind": "python", "target": e2e_bench.HANDLER},
            "lanes": {"source_fifo": True},
        }
        route = doc["routes"][0]
        route["extract"].update(source_object_kind={"pointer": "/type"}, source_object_id={"pointer": "/id"})
        route["fan_out"].append({"work_type": "noop_lane"})
    return doc


async def _install(url: str, lanes: bool) -> None:
    import psycopg

    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await install.pack_apply(conn, parse_manifest(_manifest(lanes)), activate=True, actor="sql-budget")


class BudgetCluster:
    """A private cluster with pg_stat_statements, the stage roles and a migrated template."""

    def __init__(self) -> None:
        self.cluster = PrivateCluster(CLUSTER_SETTINGS, prefix="connector-sqlbudget-")
        self._n = 0

    def __enter__(self) -> BudgetCluster:
        import psycopg

        from connector.common.store import migrate

        self.cluster.start()
        try:
            with psycopg.connect(self.cluster.url("postgres", "postgres"), autocommit=True) as conn:
                for role in (*ROLES.values(), HARNESS_ROLE):
                    # Superusers: a throwaway cluster, and upkeep may VACUUM only tables it owns.
                    conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
                conn.execute("CREATE DATABASE connector_tpl")
            migrate.upgrade(self.cluster.url("postgres", "connector_tpl"))
            with psycopg.connect(self.cluster.url("postgres", "connector_tpl"), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
        except BaseException:
            self.cluster.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop()

    def fresh_database(self) -> str:
        import psycopg

        self._n += 1
        name = f"{DBNAME}_{self._n}"
        with psycopg.connect(self.cluster.url("postgres", "postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE connector_tpl")
        return name

    def url(self, stage_or_role: str, dbname: str) -> str:
        return self.cluster.url(ROLES.get(stage_or_role, stage_or_role), dbname)


_SNAPSHOT = """
SELECT r.rolname, s.toplevel, s.queryid, s.query, s.calls, s.rows, s.shared_blks_hit,
       s.shared_blks_read, s.shared_blks_dirtied, s.shared_blks_written, s.wal_records, s.wal_fpi,
       s.wal_bytes::float8, s.total_exec_time
FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_SNAPSHOT_COLUMNS = (
    "role", "toplevel", "queryid", "query", "calls", "rows", "blks_hit", "blks_read", "blks_dirtied",
    "blks_written", "wal_records", "wal_fpi", "wal_bytes", "total_ms",
)  # fmt: skip
_WAL = "SELECT wal_records, wal_fpi, wal_bytes::float8 FROM pg_stat_wal"
_OUTSTANDING = """
SELECT (SELECT count(*) FROM connector_ingress_receipt WHERE router_status NOT IN ('materialized', 'failed'))
     + (SELECT count(*) FROM connector_work_item WHERE state NOT IN ('succeeded', 'dead'))
"""
_RECEIPTS = "SELECT count(*) FROM connector_ingress_receipt"


def _spawn(name: str, argv: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    log = (logs / f"sql-budget-{name}.log").open("wb")
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _wait(cond: Any, what: str, limit_s: float, procs: dict[str, subprocess.Popen[bytes]]) -> float:
    """Poll ``cond()`` until true; returns the seconds waited; raises after ``limit_s``."""
    t0 = time.monotonic()
    while not cond():
        e2e_bench._check_alive(procs)
        if time.monotonic() - t0 > limit_s:
            raise RuntimeError(f"sql-budget: {what} not reached within {limit_s:g} s")
        time.sleep(0.1)
    return time.monotonic() - t0


def _probe_loop(port: int, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).close()


def run_scenario(bc: BudgetCluster, sc: Scenario) -> dict[str, Any]:
    """One run on a fresh database of ``bc``; returns the raw counters (``report`` turns them into
    figures)."""
    import psycopg

    dbname = bc.fresh_database()
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    os.environ[e2e_bench.SECRET_ENV] = secret  # the pack apply checks the reference resolves
    asyncio.run(_install(bc.url("admin", dbname), sc.lanes))
    logs = ROOT / ".bench" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    free = e2e_bench._free_port
    http_port = free()
    base_env = {
        **os.environ,
        **BACKGROUND_ENV,
        "CONNECTOR_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        e2e_bench.SECRET_ENV: secret,
        "CONNECTOR_INGRESS_METRICS_PORT": str(free()),
        "CONNECTOR_MATERIALIZER_GRPC_PORT": str(free()),
        "CONNECTOR_MATERIALIZER_METRICS_PORT": str(free()),
        "CONNECTOR_EXECUTOR_GRPC_PORT": str(free()),
        "CONNECTOR_EXECUTOR_METRICS_PORT": str(free()),
    }
    connector = str(Path(sys.executable).with_name("connector"))
    commands = {
        "ingress": [connector, "ingress", "--http-port", str(http_port), "--grpc-port", str(free())],
        "materializer": [connector, "materializer"],
        "executor": [connector, "executor", "--no-admin"],
        **sc.commands,
    }
    commands = {k: v for k, v in commands.items() if k in sc.stages}
    pipeline = "executor" in sc.stages and "materializer" in sc.stages
    retention = sc.retention and pipeline
    if not retention:
        base_env["CONNECTOR_EXECUTOR_RETENTION_DELIVERED_S"] = "0"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    gen: subprocess.Popen[str] | None = None
    stop_probe = threading.Event()
    prober = threading.Thread(target=_probe_loop, args=(http_port, sc.probe_every_s, stop_probe), daemon=True)
    try:
        for name, argv in commands.items():
            env = {**base_env, "CONNECTOR_DATABASE_URL": bc.url(name, dbname)}
            procs[name] = _spawn(name, argv, env, logs)
        with psycopg.connect(bc.url(HARNESS_ROLE, dbname), autocommit=True) as conn:

            def scalar(q: str) -> int:
                row = conn.execute(q).fetchone()
                return int(row[0]) if row else 0

            e2e_bench._wait_ready(http_port, procs)
            if pipeline:
                e2e_bench._prime(conn, http_port, secret, procs)
            elif e2e_bench._post_one(http_port, secret, f"prime_{os.urandom(4).hex()}") != 200:
                raise RuntimeError("the priming delivery was not accepted")
            # The priming delivery's whole life ends before the counters start.
            if retention:
                _wait(lambda: scalar(_RECEIPTS) == 0, "retention of the priming delivery", 60, procs)
            conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("SELECT pg_stat_reset_shared('wal')")
            wal_before = conn.execute(_WAL).fetchone()
            t0 = time.time()
            prober.start()
            cfg = {"host": "127.0.0.1", "port": http_port, "concurrency": sc.concurrency,
                   "duration": sc.duration, "warmup": 0.0, "body_bytes": sc.body_bytes,
                   "rate": sc.rate, "burst": sc.burst}  # fmt: skip
            gen = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.e2e_bench", "--loadgen", json.dumps(cfg)],
                cwd=ROOT, env={**os.environ, e2e_bench.SECRET_ENV: secret}, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            out, _ = gen.communicate(timeout=sc.duration + 120)
            if gen.returncode != 0:
                raise RuntimeError(f"load generator exited with code {gen.returncode}")
            load = json.loads(out.strip().splitlines()[-1])
            t_load = time.time()
            drain_s = (
                _wait(lambda: scalar(_OUTSTANDING) == 0, "drain", sc.drain_limit_s, procs)
                if pipeline
                else 0.0
            )
            retire_s = (
                _wait(lambda: scalar(_RECEIPTS) == 0, "retention of every delivery", 60, procs)
                if retention
                else 0.0
            )
            stop_probe.set()
            prober.join(10)
            span = time.time() - t0
            raw = [dict(zip(_SNAPSHOT_COLUMNS, r, strict=True)) for r in conn.execute(_SNAPSHOT).fetchall()]
            wal_after = conn.execute(_WAL).fetchone()
    finally:
        stop_probe.set()
        if gen is not None and gen.poll() is None:
            gen.kill()
        e2e_bench._stop(list(procs.values()))
    assert wal_before is not None and wal_after is not None
    return {
        "scenario": {k: v for k, v in vars(sc).items() if k != "commands"}
        | {"commands_replaced": sorted(sc.commands)},
        "deliveries": int(load["accepted_total"]),
        "statuses": load["statuses"],
        "load_s": round(t_load - t0, 2),
        "drain_s": round(drain_s, 2),
        "retire_s": round(retire_s, 2),
        "span_s": round(span, 2),
        "wal": {
            k: float(wal_after[i]) - float(wal_before[i]) for i, k in enumerate(("records", "fpi", "bytes"))
        },
        "statements": [r for r in raw if r["role"] != HARNESS_ROLE],
    }


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------

_PER = ("calls", "rows", "blks_hit", "blks_read", "blks_dirtied", "wal_bytes")


def report(raw: dict[str, Any], named: Sequence[Named] | None = None) -> dict[str, Any]:
    """Per named statement and process: totals and per-delivery figures; per stage totals; the
    headline figures; statements that map to no name (``unknown``)."""
    if named is None:
        named = catalog()[0]
    matcher = Matcher(named)
    n = max(1, raw["deliveries"])
    span = max(1e-9, raw["span_s"])
    fks = foreign_keys()
    rows: dict[tuple[str, str, bool], dict[str, Any]] = {}
    unknown: list[dict[str, Any]] = []
    for s in raw["statements"]:
        hit = matcher.match(s["query"])
        process = STAGE_OF_ROLE.get(s["role"], s["role"])
        fk = None if hit is not None or s["toplevel"] else fk_check_name(s["query"], fks)
        if fk is not None:
            name, process = fk, "database"
        elif hit is None:
            name = "UNKNOWN"
            unknown.append({"process": process, "toplevel": s["toplevel"], "calls": s["calls"],
                            "query": s["query"][:400]})  # fmt: skip
        else:
            name = " / ".join([hit.name, *hit.aliases]) if hit.aliases else hit.name
        key = (name, process, bool(s["toplevel"]))
        row = rows.get(key)
        if row is None:
            reason = background_reason(hit.name) if hit is not None else None
            row = rows[key] = {
                "name": name,
                "process": process,
                "stage": "background" if reason else process,
                "nested": not s["toplevel"],
                "background": reason,
                "toplevel": bool(s["toplevel"]),
                "write": bool(hit and is_write(hit.canon)),
                "digests": 0,
                "calls": 0,
                "rows": 0,
                "blks_hit": 0,
                "blks_read": 0,
                "blks_dirtied": 0,
                "blks_written": 0,
                "wal_records": 0,
                "wal_fpi": 0,
                "wal_bytes": 0.0,
                "total_ms": 0.0,
                "query": (hit.canon if hit is not None else canonical(s["query"]))[:300],
            }
        row["digests"] += 1
        for k in ("calls", "rows", "blks_hit", "blks_read", "blks_dirtied", "blks_written", "wal_records",
                  "wal_fpi", "wal_bytes", "total_ms"):  # fmt: skip
            row[k] += s[k]
    out_rows = []
    for row in sorted(rows.values(), key=lambda r: (STAGES.index(r["stage"]) if r["stage"] in STAGES
                                                     else 99, -r["calls"])):  # fmt: skip
        row["per_delivery"] = {k: row[k] / n for k in _PER}
        row["mean_ms"] = row["total_ms"] / row["calls"] if row["calls"] else 0.0
        row["per_s"] = row["calls"] / span
        out_rows.append(row)
    top = [r for r in out_rows if r["toplevel"]]
    stages: dict[str, dict[str, float]] = {}
    for r in out_rows:
        st = stages.setdefault(r["stage"], dict.fromkeys((*_PER, "total_ms"), 0.0))
        for k in (*_PER, "total_ms"):
            st[k] += r[k] if k == "total_ms" else r["per_delivery"][k]
    for st in stages.values():
        st["total_ms"] = st["total_ms"] / n
    writes = sum(r["rows"] for r in top if r["write"])
    headline = {
        "statements_per_delivery": sum(r["calls"] for r in top) / n,
        "hot_statements_per_delivery": sum(r["calls"] for r in top if r["stage"] != "background") / n,
        "nested_statements_per_delivery": sum(r["calls"] for r in out_rows if not r["toplevel"]) / n,
        "row_writes_per_delivery": writes / n,
        "wal_bytes_per_delivery": raw["wal"]["bytes"] / n,
        "statement_wal_bytes_per_delivery": sum(r["wal_bytes"] for r in top) / n,
        "blocks_per_delivery": sum(r["blks_hit"] + r["blks_read"] for r in top) / n,
        "db_time_ms_per_delivery": sum(r["total_ms"] for r in top) / n,
    }
    return {
        "deliveries": raw["deliveries"],
        "statuses": raw["statuses"],
        "span_s": raw["span_s"],
        "timing": {k: raw[k] for k in ("load_s", "drain_s", "retire_s")},
        "scenario": raw["scenario"],
        "wal": raw["wal"],
        "headline": headline,
        "stages": stages,
        "statements": out_rows,
        "unknown": unknown,
        "digests": raw["statements"],
    }


def render(rep: dict[str, Any]) -> str:
    h = rep["headline"]
    sc = rep["scenario"]
    lines = [
        f"sql-budget: {rep['deliveries']:,} deliveries "
        + (f"at {sc['rate']:g}/s in bursts of {sc['burst']} " if sc["rate"] else "closed loop ")
        + f"({', '.join(sc['stages'])}; "
        + ("fan out to a plain and a source-lane work type" if sc["lanes"] else "one no-op WorkItem")
        + f"); counters over {rep['span_s']:.1f} s (load {rep['timing']['load_s']:.1f} s, drain "
        f"{rep['timing']['drain_s']:.1f} s, retention {rep['timing']['retire_s']:.1f} s)",
        f"  statements per delivery  {h['statements_per_delivery']:8.2f}   (hot loop "
        f"{h['hot_statements_per_delivery']:.2f}, background the rest; PostgreSQL's own foreign-key "
        f"row checks inside them: {h['nested_statements_per_delivery']:.2f})",
        f"  row writes per delivery  {h['row_writes_per_delivery']:8.2f}",
        f"  WAL bytes per delivery   {h['wal_bytes_per_delivery']:8,.0f}   (statements' own "
        f"{h['statement_wal_bytes_per_delivery']:,.0f}; the rest: commit records, VACUUM, FPIs)",
        f"  buffers per delivery     {h['blocks_per_delivery']:8.1f}   database time per delivery "
        f"{h['db_time_ms_per_delivery']:.3f} ms",
        "",
        f"{'stage':<12} {'process':<12} {'statement':<58} {'calls/d':>8} {'rows/d':>7} {'hit/d':>7} "
        f"{'read/d':>6} {'dirt/d':>6} {'WAL B/d':>8} {'mean ms':>8} {'calls/s':>7}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in rep["statements"]:
        pd = r["per_delivery"]
        name = r["name"].removeprefix("connector.common.store.").removeprefix("connector.")
        if not r["toplevel"]:
            name = "(nested) " + name
        lines.append(
            f"{r['stage']:<12} {r['process']:<12} {name[:58]:<58} {pd['calls']:>8.3f} {pd['rows']:>7.2f} "
            f"{pd['blks_hit']:>7.1f} {pd['blks_read']:>6.2f} {pd['blks_dirtied']:>6.2f} "
            f"{pd['wal_bytes']:>8.0f} {r['mean_ms']:>8.3f} {r['per_s']:>7.1f}"
        )
    lines += ["", f"{'stage totals':<12} {'calls/d':>8} {'rows/d':>7} {'hit/d':>7} {'read/d':>6} "
              f"{'dirt/d':>6} {'WAL B/d':>8} {'ms/d':>8}"]  # fmt: skip
    for stage in STAGES:
        st = rep["stages"].get(stage)
        if st:
            lines.append(
                f"{stage:<12} {st['calls']:>8.3f} {st['rows']:>7.2f} {st['blks_hit']:>7.1f} "
                f"{st['blks_read']:>6.2f} {st['blks_dirtied']:>6.2f} {st['wal_bytes']:>8.0f} "
                f"{st['total_ms']:>8.3f}"
            )
    if rep["unknown"]:
        lines += ["", f"UNKNOWN statements (no named constant): {len(rep['unknown'])}"]
        lines += [f"  {u['process']}: {u['calls']} calls: {u['query'][:160]}" for u in rep["unknown"]]
    return "\n".join(lines)


def _rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks import common

    h = rep["headline"]
    extra = {"deliveries": rep["deliveries"], "scenario": rep["scenario"], "stages": rep["stages"],
             "unknown_statements": len(rep["unknown"]), "higher_is_better": False}  # fmt: skip
    return [
        common.make_row("sql.statements_per_delivery", "SQL statements per delivery (all stages)",
                        h["statements_per_delivery"], "stmts/delivery", extra=extra),
        common.make_row("sql.row_writes_per_delivery", "SQL row writes per delivery",
                        h["row_writes_per_delivery"], "rows/delivery", extra={"higher_is_better": False}),
        common.make_row("sql.wal_bytes_per_delivery", "WAL bytes per delivery",
                        h["wal_bytes_per_delivery"], "B/delivery", extra={"higher_is_better": False}),
    ]  # fmt: skip


def measure(sc: Scenario) -> dict[str, Any]:
    with BudgetCluster() as bc:
        return report(run_scenario(bc, sc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a 5 s load (default 20 s)")
    parser.add_argument("--json-out", type=Path, help='write {"rows": [...]} (benchmark contract)')
    parser.add_argument("--report-out", type=Path, default=ROOT / ".bench" / "sql-budget.json",
                        help="the whole report (default .bench/sql-budget.json)")  # fmt: skip
    parser.add_argument("--rate", type=float, default=400.0, help="deliveries/s (open loop; 0: closed loop)")
    parser.add_argument(
        "--stages",
        default="ingress,materializer,executor",
        help="services to start (ingress alone: its hot path)",
    )
    parser.add_argument("--duration", type=float, default=None, help="load seconds (20; quick 5)")
    parser.add_argument("--burst", type=int, default=32, help="deliveries due together (1: evenly spaced)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--lanes", action="store_true", help="also fan out to a FIFO source-lane work type")
    parser.add_argument(
        "--no-retention",
        action="store_true",
        help="keep the deliveries (no retention deletes in the counters)",
    )
    args = parser.parse_args(argv)
    duration = args.duration if args.duration is not None else (5.0 if args.quick else 20.0)
    sc = Scenario(rate=args.rate, duration=duration, burst=args.burst, concurrency=args.concurrency,
                  lanes=args.lanes, retention=not args.no_retention,
                  stages=tuple(x.strip() for x in args.stages.split(",") if x.strip()))  # fmt: skip
    from benchmarks import common

    # A SIGTERM (the suite harness's timeout) unwinds: the services stop and the cluster is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with common.bench_lock():
        rep = measure(sc)
    print(render(rep))
    args.report_out.parent.mkdir(parents=True, exist_ok=True)
    args.report_out.write_text(json.dumps(rep, indent=2, default=str) + "\n")
    print(f"\nsql-budget: report written to {args.report_out}")
    common.write_json_out(args.json_out, _rows(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
