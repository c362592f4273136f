"""Database access: one async psycopg pool per service, with pool metrics labelled by service.

SQLAlchemy Core owns the schema (``schema.py``) and Alembic applies it. Hot-path statements are
named SQL kept beside the component that owns them (``claims.py`` and friends) and executed on a raw
psycopg connection, so no statement is compiled per call; their plans are asserted by EXPLAIN tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager, suppress
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from connector.common.core import metrics
from connector.common.core.settings import DatabaseSettings, PoolSettings

log = logging.getLogger(__name__)

_POOLS: dict[str, AsyncConnectionPool] = {}
#: Per pool name: a change of database server seen by its ``ServerWatch`` (core/server_watch.py).
FAILOVERS_SEEN: dict[str, int] = {}
#: Per pool name: connections closed because their server was read-only (SQLSTATE 25006).
READ_ONLY_EVICTIONS: dict[str, int] = {}
#: Per pool name of a service that needs a synchronous standby: 1 when the server has one (ServerWatch).
SYNC_STANDBY_READY: dict[str, int] = {}


def _collect_pools() -> Iterable[Metric]:
    size = GaugeMetricFamily("connector_db_pool_size", "Connections open in the pool", labels=["service"])
    avail = GaugeMetricFamily(
        "connector_db_pool_available", "Idle connections in the pool", labels=["service"]
    )
    waiting = GaugeMetricFamily(
        "connector_db_pool_waiting", "Requests waiting for a connection", labels=["service"]
    )
    maxsize = GaugeMetricFamily("connector_db_pool_max", "Pool maximum size", labels=["service"])
    reconnects = CounterMetricFamily(
        "connector_db_reconnects",
        "Connections the pool opened after its first fill (a lost, drained or expired one replaced)",
        labels=["service"],
    )
    failovers = CounterMetricFamily(
        "connector_db_failovers_seen",
        "Changes of database server seen (system identifier, timeline, address or recovery state)",
        labels=["service"],
    )
    evicted = CounterMetricFamily(
        "connector_db_read_only_evictions",
        "Pooled connections closed because their server was read-only (SQLSTATE 25006, in recovery)",
        labels=["service"],
    )
    sync_ready = GaugeMetricFamily(
        "connector_db_synchronous_standby_ready",
        "1 when the server can honour the synchronous_commit this service asks for (it names"
        " synchronous standbys and one is connected as sync or quorum), 0 when not",
        labels=["service"],
    )
    for service, ready in list(SYNC_STANDBY_READY.items()):
        sync_ready.add_metric([service], ready)
    for service, pool in list(_POOLS.items()):
        stats = pool.get_stats()
        size.add_metric([service], stats.get("pool_size", 0))
        avail.add_metric([service], stats.get("pool_available", 0))
        waiting.add_metric([service], stats.get("requests_waiting", 0))
        maxsize.add_metric([service], pool.max_size)
        opened = getattr(pool, "opened", 0)
        reconnects.add_metric([service], max(0, opened - pool.min_size))
        failovers.add_metric([service], FAILOVERS_SEEN.get(service, 0))
        evicted.add_metric([service], READ_ONLY_EVICTIONS.get(service, 0))
    return [size, avail, waiting, maxsize, reconnects, failovers, evicted, sync_ready]


_collector = metrics.register_callback(_collect_pools)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # Autocommit by default: every statement that needs a transaction opens one explicitly.
    await conn.set_autocommit(True)
    pool = getattr(conn, "_pool", None)
    if isinstance(pool, Pool):
        pool.opened += 1


class CappedBackoff(AttemptWithBackoff):
    """psycopg_pool's reconnect schedule (1 s, then doubling, until ``reconnect_timeout``) with no
    wait longer than ``max_delay_s``: a pool that lost its server tries again every few seconds, so
    it is back within ``max_delay_s`` (plus one connect) of the new primary taking writes."""

    def __init__(self, *, timeout: float, max_delay_s: float) -> None:
        super().__init__(timeout=timeout)
        self.max_delay_s = max_delay_s

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, self.max_delay_s)


class Pool(AsyncConnectionPool):
    """A service's pool. With ``evict_read_only`` (``CONNECTOR_EVICT_READ_ONLY``, default true) a
    connection whose statement fails because its server is read-only (SQLSTATE 25006: an old
    primary fenced or back as a standby, a URL that landed on a standby) is closed at once and the
    idle rest drained, so the next checkout connects anew and a multi-host URL with
    ``target_session_attrs=read-write`` finds the writable server (ADR 020). Without it such a
    connection stays in the pool and every write on it fails until it expires (an hour).

    ``reconnect_max_delay_s`` (``CONNECTOR_DB_RECONNECT_MAX_DELAY_S``, default 2; 0 = psycopg_pool's
    uncapped doubling) caps the wait between attempts to replace a lost connection."""

    def __init__(
        self,
        *args: Any,
        service: str,
        evict_read_only: bool = True,
        reconnect_max_delay_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.service = service
        self.evict_read_only = evict_read_only
        self.reconnect_max_delay_s = reconnect_max_delay_s
        #: Connections opened (configured) so far: the reconnect counter's source.
        self.opened = 0
        #: Drains so far: a loop that keeps a connection for itself (``getconn``) compares it with
        #: the count when it took the connection and gives it back once it moved (``drained_since``),
        #: since a drain replaces only the connections in the pool and those given back.
        self.drains = 0
        self._drained_at_s = 0.0
        self._drain_logged: tuple[str, float] = ("", -1e9)

    @asynccontextmanager
    async def connection(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 - the pool's API: its checkout wait
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with super().connection(timeout) as conn:
            try:
                yield conn
            except pg_errors.ReadOnlySqlTransaction:
                await evict_if_read_only(conn)
                raise

    async def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        # psycopg_pool makes a fresh AttemptWithBackoff for a first try and hands the same one to
        # each retry it schedules (AddConnection): start the series with the capped one instead.
        if attempt is None and self.reconnect_max_delay_s > 0:
            attempt = CappedBackoff(timeout=self.reconnect_timeout, max_delay_s=self.reconnect_max_delay_s)
        await super()._add_connection(attempt, growing=growing)

    async def drain_for(self, reason: str) -> None:
        """Close the idle connections and open new ones (connections in use are replaced when
        given back); at most once a second, one log line each time."""
        now = time.monotonic()
        if now - self._drained_at_s < 1.0:
            return
        self._drained_at_s = now
        # One line per event: a pool kept on a standby is drained every watch round, logged once a minute.
        if reason != self._drain_logged[0] or now - self._drain_logged[1] >= 60.0:
            self._drain_logged = (reason, now)
            log.warning("database pool drained", extra={"service": self.service, "reason": reason})
        self.drains += 1
        with suppress(Exception):
            await self.drain()


#: The checkout check of off-hot-path pools: the connection answers, and its server takes writes.
WRITABLE_CHECK = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"


async def check_writable(conn: psycopg.AsyncConnection[Any]) -> None:
    """``check`` of pools off the hot path: one round trip; a connection whose server is read-only
    is evicted (the pool then takes or opens another)."""
    cur = await conn.execute(WRITABLE_CHECK)
    row = await cur.fetchone()
    if row is not None and row[0]:
        await evict_if_read_only(conn)
        raise pg_errors.ReadOnlySqlTransaction("the server is read-only: connection evicted")


def is_read_only(exc: BaseException) -> bool:
    """SQLSTATE 25006 (read_only_sql_transaction): the server refuses writes (a standby, a fenced
    or demoted old primary)."""
    return isinstance(exc, pg_errors.ReadOnlySqlTransaction)


async def evict_if_read_only(
    conn: psycopg.AsyncConnection[Any] | None, exc: BaseException | None = None
) -> bool:
    """After ``exc`` (default: the caller already knows it was 25006): close ``conn`` when its
    pool evicts read-only connections, drain that pool's idle rest. True when closed. For loops
    that keep a pool connection (``getconn``): they replace a closed one on their next round."""
    if conn is None or (exc is not None and not is_read_only(exc)):
        return False
    pool = getattr(conn, "_pool", None)
    if not isinstance(pool, Pool) or not pool.evict_read_only:
        return False
    READ_ONLY_EVICTIONS[pool.service] = READ_ONLY_EVICTIONS.get(pool.service, 0) + 1
    with suppress(Exception):
        await conn.close()
    await pool.drain_for("read_only")
    return True


def conninfo_with(
    url: str,
    *,
    application_name: str,
    statement_timeout_ms: int,
    disable_jit: bool = False,
    lock_timeout_ms: int = 0,
) -> str:
    """``url`` (a conninfo or URL) with this connection's name and startup options. The network
    parameters (connect timeout, keepalives, ``tcp_user_timeout``) come with ``url`` itself: a
    service takes it from ``DatabaseSettings.conninfo()``."""
    extra = {"application_name": application_name}
    options = []
    if statement_timeout_ms:
        options.append(f"-c statement_timeout={statement_timeout_ms}")
    if lock_timeout_ms and (not statement_timeout_ms or lock_timeout_ms < statement_timeout_ms):
        options.append(f"-c lock_timeout={lock_timeout_ms}")
    if disable_jit:
        options.append("-c jit=off")
    if options:
        extra["options"] = " ".join(options)
    return psycopg.conninfo.make_conninfo(url, **extra)


async def open_pool(
    service: str,
    db: DatabaseSettings,
    pool: PoolSettings,
    *,
    url: str | None = None,
    check: bool = False,
) -> AsyncConnectionPool:
    """Open the service's own pool (waits until ``pool_min_size`` connections are up).

    ``check``: test every connection when it is taken from the pool (one round trip,
    ``check_writable``: also whether its server takes writes, unless ``CONNECTOR_EVICT_READ_ONLY``
    is false) and replace it when the server dropped it (a database restart,
    ``pg_terminate_backend``, an idle timeout on the way) or became read-only, so the first call
    after an outage does not fail on a dead connection. Only for pools off the hot path (the admin API's):
    a claim or receipt batch would pay the round trip on every batch."""
    conninfo = conninfo_with(
        db.conninfo(url),
        application_name=f"connector-{service}",
        statement_timeout_ms=db.statement_timeout_ms,
        disable_jit=db.disable_jit,
        lock_timeout_ms=db.lock_timeout_ms,
    )
    p = Pool(
        conninfo,
        service=service,
        evict_read_only=db.evict_read_only,
        reconnect_max_delay_s=db.db_reconnect_max_delay_s,
        min_size=pool.pool_min_size,
        max_size=max(pool.pool_max_size, pool.pool_min_size),
        timeout=pool.pool_timeout_s,
        configure=_configure,
        check=(check_writable if db.evict_read_only else AsyncConnectionPool.check_connection)
        if check
        else None,
        name=f"connector-{service}",
        open=False,
    )
    wait_s = max(db.connect_timeout_s, pool.pool_timeout_s)
    try:
        await p.open(wait=True, timeout=wait_s)
    except PoolTimeout:
        await p.close()
        raise DatabaseUnavailable(
            f"connector {service}: the database at {where(conninfo)} accepted no connection within "
            f"{wait_s:g} s: {await _probe(conninfo)} (CONNECTOR_DATABASE_URL, CONNECTOR_CONNECT_TIMEOUT_S)"
        ) from None
    _POOLS[service] = p
    return p


#: SQLSTATEs of a server that dropped the connection or refuses connections for now: connection
#: exceptions (08), admin shutdown / crash shutdown / cannot connect now (57P01-57P03), insufficient
#: resources (53: too many connections, out of memory, disk full).
_LOST_STATES = ("08", "57P01", "57P02", "57P03", "53")


def connection_lost(exc: BaseException) -> bool:
    """True when ``exc`` says the database connection is gone or the server cannot serve it now (a
    retry on a new connection may succeed): libpq-level failures (no SQLSTATE: "server closed the
    connection unexpectedly", "the connection is closed", connect failures) and the SQLSTATEs above.
    Deadlocks, serialization failures, lock and statement timeouts are not: they are answered on a
    healthy connection and have their own codes."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(_LOST_STATES)


class DatabaseUnavailable(SystemExit):
    """A service could not open its pool at start: exits with the reason, not a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def where(conninfo: str) -> str:
    """``host:port/dbname`` of a connection string, never its user or password."""
    parts = psycopg.conninfo.conninfo_to_dict(conninfo)
    return f"{parts.get('host') or 'localhost'}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


async def _probe(conninfo: str) -> str:
    """One direct connection attempt: the server's or libpq's own reason, password removed."""
    password = str(psycopg.conninfo.conninfo_to_dict(conninfo).get("password") or "")
    try:
        conn = await psycopg.AsyncConnection.connect(conninfo, connect_timeout=5)
    except Exception as exc:
        reason = " ".join(str(exc).split())
        return reason.replace(password, "***") if password else reason
    await conn.close()
    return "a direct connection works now (the server was starting or busy)"


async def close_pool(service: str) -> None:
    p = _POOLS.pop(service, None)
    if p is not None:
        await p.close()


async def close_own_pool(service: str, pool: AsyncConnectionPool | None) -> None:
    """Close a service instance's own pool. The registry (pool metrics) is keyed by service name:
    its entry is dropped only when it is this pool, so stopping one instance never closes or
    unlists another instance's pool in the same process (tests, ``connector up``)."""
    if pool is None:
        return
    if _POOLS.get(service) is pool:
        await close_pool(service)
    else:
        await pool.close()
