"""Database access: one async psycopg pool per service, with pool metrics labelled by service.

SQLAlchemy Core owns the schema (``schema.py``) and Alembic applies it. Hot-path statements are
named SQL kept beside the component that owns them (``claims.py`` and friends) and executed on a raw
psycopg connection, so no statement is compiled per call; their plans are asserted by EXPLAIN tests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from prometheus_client.core import GaugeMetricFamily
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from connector.common.core import metrics
from connector.common.core.settings import DatabaseSettings, PoolSettings

log = logging.getLogger(__name__)

_POOLS: dict[str, AsyncConnectionPool] = {}


def _collect_pools() -> Iterable[GaugeMetricFamily]:
    size = GaugeMetricFamily("connector_db_pool_size", "Connections open in the pool", labels=["service"])
    avail = GaugeMetricFamily(
        "connector_db_pool_available", "Idle connections in the pool", labels=["service"]
    )
    waiting = GaugeMetricFamily(
        "connector_db_pool_waiting", "Requests waiting for a connection", labels=["service"]
    )
    maxsize = GaugeMetricFamily("connector_db_pool_max", "Pool maximum size", labels=["service"])
    for service, pool in list(_POOLS.items()):
        stats = pool.get_stats()
        size.add_metric([service], stats.get("pool_size", 0))
        avail.add_metric([service], stats.get("pool_available", 0))
        waiting.add_metric([service], stats.get("requests_waiting", 0))
        maxsize.add_metric([service], pool.max_size)
    return [size, avail, waiting, maxsize]


_collector = metrics.register_callback(_collect_pools)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # Autocommit by default: every statement that needs a transaction opens one explicitly.
    await conn.set_autocommit(True)


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

    ``check``: test every connection when it is taken from the pool (one empty-query round trip,
    ``AsyncConnectionPool.check_connection``) and replace it when the server dropped it (a database
    restart, ``pg_terminate_backend``, an idle timeout on the way), so the first call after an
    outage does not fail on a dead connection. Only for pools off the hot path (the admin API's):
    a claim or receipt batch would pay the round trip on every batch."""
    conninfo = conninfo_with(
        db.conninfo(url),
        application_name=f"connector-{service}",
        statement_timeout_ms=db.statement_timeout_ms,
        disable_jit=db.disable_jit,
        lock_timeout_ms=db.lock_timeout_ms,
    )
    p: AsyncConnectionPool = AsyncConnectionPool(
        conninfo,
        min_size=pool.pool_min_size,
        max_size=max(pool.pool_max_size, pool.pool_min_size),
        timeout=pool.pool_timeout_s,
        configure=_configure,
        check=AsyncConnectionPool.check_connection if check else None,
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
