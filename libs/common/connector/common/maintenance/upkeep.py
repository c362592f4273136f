"""Queue-table upkeep: VACUUM and ANALYZE of the tables a service churns, when autovacuum does not
cover them (docs/adr/008-queue-table-upkeep.md: why, thresholds, modes, metrics, measurements).

Contract: every ``interval_s`` one read of ``pg_stat_user_tables`` for the owned tables; ``VACUUM
(SKIP_LOCKED)`` / ``ANALYZE (SKIP_LOCKED)`` of a table past its threshold (``vacuum_due``,
``analyze_due``); one process per table across all services, by the session advisory lock
``(UPKEEP_LOCK_CLASS, table oid)``, tried and never waited for, on the upkeep's own autocommit
connection; a table the role may not vacuum is reported once and skipped. Modes: ``auto`` (only
while autovacuum is off for the table, re-checked every minute), ``on``, ``off``.

Its SQL stays here, outside ``connector.common.store``, because it is maintenance *on tables*, not
statements on their rows: catalog reads (``pg_class``, ``pg_stat_user_tables``, server settings),
``VACUUM``/``ANALYZE`` of a table by identifier and session settings (its advisory lock is
``background.session_lock_try``, shared with retention). The store holds the statements on the
runtime's rows; tests/test_import_contract.py exempts this module for that reason and checks that
it reads nothing but catalogs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from prometheus_client import Counter, Gauge, Histogram
from psycopg import sql

from connector.common.core.background import BackgroundJob, session_lock_release, session_lock_try
from connector.common.core.metrics import LATENCY_BUCKETS, SHARED

log = logging.getLogger("connector.upkeep")

UPKEEP_LOCK_CLASS = 7234102
MODES = ("auto", "on", "off")
SETTINGS_RECHECK_S = 60.0

UPKEEP_ACTIVE = Gauge(
    "connector_upkeep_active",
    "1 when this process vacuums/analyzes the table (autovacuum off for it, or mode on), else 0",
    ["service", "table"],
    registry=SHARED,
)
UPKEEP_DEAD_ROWS = Gauge(
    "connector_upkeep_dead_rows",
    "Dead row versions of the table at the last upkeep check (pg_stat_user_tables.n_dead_tup)",
    ["service", "table"],
    registry=SHARED,
)
UPKEEP_RUNS = Counter(
    "connector_upkeep_runs_total",
    "VACUUM / ANALYZE runs done by this process",
    ["service", "table", "op"],
    registry=SHARED,
)
UPKEEP_SECONDS = Histogram(
    "connector_upkeep_seconds",
    "Duration of upkeep VACUUM / ANALYZE runs",
    ["service", "table", "op"],
    buckets=(*LATENCY_BUCKETS, 30.0, 60.0, 300.0),
    registry=SHARED,
)
UPKEEP_ERRORS = Counter(
    "connector_upkeep_errors_total",
    "Upkeep runs that failed or were refused (permission, lock timeout, connection)",
    ["service", "table"],
    registry=SHARED,
)

# One row per owned table: the activity counters and what decides whether autovacuum covers it.
_TABLE_STATE = """
SELECT c.relname, c.oid::int, s.n_live_tup, s.n_dead_tup, s.n_mod_since_analyze, c.reltuples,
       greatest(s.last_analyze, s.last_autoanalyze) IS NOT NULL AS analyzed,
       coalesce(c.reloptions, '{}'::text[]) @> ARRAY['autovacuum_enabled=false']
         OR coalesce(c.reloptions, '{}'::text[]) @> ARRAY['autovacuum_enabled=off'] AS table_autovacuum_off,
       pg_has_role(current_user, c.relowner, 'USAGE') AS may_vacuum
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relname = ANY(%(tables)s::text[]) AND c.relnamespace = to_regnamespace(current_schema())::oid
"""

_SERVER_AUTOVACUUM = "SELECT current_setting('autovacuum') = 'on' AND current_setting('track_counts') = 'on'"

# The maintenance itself, on one table by identifier (a lock it cannot have is skipped, never
# queued for), and the session settings of the job's connection. Named so that a statement digest
# maps back to them (benchmarks/sql_budget.py).
VACUUM_TABLE = "VACUUM (SKIP_LOCKED) {}"
ANALYZE_TABLE = "ANALYZE (SKIP_LOCKED) {}"
SESSION_SETTINGS = ("SET statement_timeout = 0", "SET lock_timeout = '1s'")


class _UpkeepSettings(Protocol):
    """The ``upkeep_*`` fields of ``settings.UpkeepSettings`` (this job depends on settings, never the
    other way round)."""

    @property
    def upkeep_mode(self) -> str: ...
    @property
    def upkeep_interval_s(self) -> float: ...
    @property
    def upkeep_vacuum_dead_rows(self) -> int: ...
    @property
    def upkeep_vacuum_dead_fraction(self) -> float: ...
    @property
    def upkeep_analyze_rows(self) -> int: ...
    @property
    def upkeep_analyze_fraction(self) -> float: ...


@dataclass(frozen=True, slots=True)
class UpkeepConfig:
    mode: str = "auto"
    interval_s: float = 2.0
    vacuum_dead_rows: int = 20_000
    vacuum_dead_fraction: float = 0.05
    analyze_rows: int = 100_000
    analyze_fraction: float = 0.50

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"upkeep mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    @classmethod
    def from_settings(cls, s: _UpkeepSettings) -> UpkeepConfig:
        return cls(
            mode=s.upkeep_mode,
            interval_s=s.upkeep_interval_s,
            vacuum_dead_rows=s.upkeep_vacuum_dead_rows,
            vacuum_dead_fraction=s.upkeep_vacuum_dead_fraction,
            analyze_rows=s.upkeep_analyze_rows,
            analyze_fraction=s.upkeep_analyze_fraction,
        )


@dataclass(slots=True)
class TableStatus:
    name: str
    oid: int
    live: int
    dead: int
    changed: int
    analyzed: bool
    autovacuum_off: bool
    may_vacuum: bool


@dataclass(slots=True)
class PassResult:
    """What one ``run_once`` did, per table (for tests, the CLI and the benchmark)."""

    vacuumed: list[str] = field(default_factory=list)
    analyzed: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    inactive: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def is_active(mode: str, server_autovacuum: bool, table_autovacuum_off: bool) -> bool:
    """Whether this process maintains a table: always in mode ``on``, never in ``off``, and in
    ``auto`` exactly when autovacuum does not cover it."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return not server_autovacuum or table_autovacuum_off


def vacuum_due(cfg: UpkeepConfig, t: TableStatus) -> bool:
    return t.dead > cfg.vacuum_dead_rows + cfg.vacuum_dead_fraction * t.live


def analyze_due(cfg: UpkeepConfig, t: TableStatus) -> bool:
    if not t.analyzed and t.live + t.dead >= 1_000:
        return True
    return t.changed > cfg.analyze_rows + cfg.analyze_fraction * t.live


class Upkeep(BackgroundJob):
    """The upkeep loop of one service process for its ``tables``."""

    kind = "upkeep"

    def __init__(self, url: str, service: str, tables: Sequence[str], cfg: UpkeepConfig) -> None:
        super().__init__(url, service, interval_s=cfg.interval_s)
        self.tables = list(tables)
        self.cfg = cfg
        self._server_autovacuum: bool | None = None
        self._settings_at = 0.0
        self._refused_reported: set[str] = set()
        self._active_reported: dict[str, bool] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.cfg.mode == "off":
            for t in self.tables:
                UPKEEP_ACTIVE.labels(self.service, t).set(0)
            return
        super().start()

    async def setup(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # A VACUUM of a large table may run for minutes; a lock it cannot have is skipped
        # (SKIP_LOCKED), never queued for.
        for statement in SESSION_SETTINGS:
            await conn.execute(statement)

    def on_failure(self, exc: BaseException) -> None:
        self._log_error("*", exc)

    # -- one pass ----------------------------------------------------------------------------

    async def table_status(self) -> list[TableStatus]:
        conn = await self.connection()
        cur = await conn.execute(_TABLE_STATE, {"tables": self.tables})
        return [
            TableStatus(
                name=str(r[0]),
                oid=int(r[1]),
                live=int(r[2]),
                dead=int(r[3]),
                changed=int(r[4]),
                analyzed=bool(r[6]) or float(r[5]) >= 0,
                autovacuum_off=bool(r[7]),
                may_vacuum=bool(r[8]),
            )
            for r in await cur.fetchall()
        ]

    async def run_once(self) -> PassResult:
        """Check every owned table once and vacuum / analyze those that are due."""
        conn = await self.connection()
        now = time.monotonic()
        if self._server_autovacuum is None or now - self._settings_at > SETTINGS_RECHECK_S:
            cur = await conn.execute(_SERVER_AUTOVACUUM)
            row = await cur.fetchone()
            self._server_autovacuum = bool(row and row[0])
            self._settings_at = now
        result = PassResult()
        for t in await self.table_status():
            UPKEEP_DEAD_ROWS.labels(self.service, t.name).set(t.dead)
            active = is_active(self.cfg.mode, self._server_autovacuum, t.autovacuum_off)
            UPKEEP_ACTIVE.labels(self.service, t.name).set(1 if active and t.may_vacuum else 0)
            self._report_activity(t.name, active)
            if not active:
                result.inactive.append(t.name)
                continue
            do_vacuum, do_analyze = vacuum_due(self.cfg, t), analyze_due(self.cfg, t)
            if not (do_vacuum or do_analyze):
                continue
            if not t.may_vacuum:
                result.refused.append(t.name)
                if t.name not in self._refused_reported:
                    self._refused_reported.add(t.name)
                    log.warning(
                        "upkeep: this role does not own the table and cannot vacuum it; grant "
                        "ownership or turn autovacuum on",
                        extra={"table": t.name},
                    )
                continue
            await self._maintain(conn, t, do_vacuum, do_analyze, result)
        return result

    async def _maintain(
        self,
        conn: psycopg.AsyncConnection[Any],
        t: TableStatus,
        do_vacuum: bool,
        do_analyze: bool,
        result: PassResult,
    ) -> None:
        if not await session_lock_try(conn, UPKEEP_LOCK_CLASS, t.oid):
            result.busy.append(t.name)  # another process is on it
            return
        try:
            ident = sql.Identifier(t.name)
            ops = [("vacuum", do_vacuum), ("analyze", do_analyze)]
            for op, due in ops:
                if not due:
                    continue
                stmt = VACUUM_TABLE if op == "vacuum" else ANALYZE_TABLE
                t0 = time.perf_counter()
                try:
                    await conn.execute(sql.SQL(stmt).format(ident))
                except psycopg.Error as exc:
                    self._report_error(t.name, exc)
                    UPKEEP_ERRORS.labels(self.service, t.name).inc()
                    return
                UPKEEP_SECONDS.labels(self.service, t.name, op).observe(time.perf_counter() - t0)
                UPKEEP_RUNS.labels(self.service, t.name, op).inc()
                (result.vacuumed if op == "vacuum" else result.analyzed).append(t.name)
        finally:
            await session_lock_release(conn, UPKEEP_LOCK_CLASS, t.oid)

    # -- reporting (never per run: state changes and rate-limited errors only) -----------------

    def _report_activity(self, table: str, active: bool) -> None:
        if self._active_reported.get(table) == active:
            return
        self._active_reported[table] = active
        if active:
            log.info(
                "upkeep: vacuuming and analyzing this table from the service (autovacuum does not "
                "cover it, or upkeep mode is on)",
                extra={"table": table, "mode": self.cfg.mode},
            )
        else:
            log.info("upkeep: autovacuum covers this table", extra={"table": table})

    def _report_error(self, table: str, exc: BaseException) -> None:
        if self.should_report(table):
            self._log_error(table, exc)

    def _log_error(self, table: str, exc: BaseException) -> None:
        log.warning(
            "upkeep run failed; retried next interval",
            extra={
                "table": table,
                "exc_type": type(exc).__name__,
                "sqlstate": getattr(exc, "sqlstate", None),
            },
        )
