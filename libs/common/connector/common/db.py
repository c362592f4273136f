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
from psycopg_pool import AsyncConnectionPool

from connector.common import metrics
from connector.common.settings import DatabaseSettings, PoolSettings

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


def conninfo_with(url: str, *, application_name: str, statement_timeout_ms: int) -> str:
    extra = {"application_name": application_name}
    if statement_timeout_ms:
        extra["options"] = f"-c statement_timeout={statement_timeout_ms}"
    return psycopg.conninfo.make_conninfo(url, **extra)


async def open_pool(
    service: str,
    db: DatabaseSettings,
    pool: PoolSettings,
    *,
    url: str | None = None,
) -> AsyncConnectionPool:
    """Open the service's own pool (waits until ``pool_min_size`` connections are up)."""
    conninfo = conninfo_with(
        url or db.url(),
        application_name=f"connector-{service}",
        statement_timeout_ms=db.statement_timeout_ms,
    )
    p: AsyncConnectionPool = AsyncConnectionPool(
        conninfo,
        min_size=pool.pool_min_size,
        max_size=max(pool.pool_max_size, pool.pool_min_size),
        timeout=pool.pool_timeout_s,
        configure=_configure,
        name=f"connector-{service}",
        open=False,
    )
    await p.open(wait=True, timeout=max(10.0, pool.pool_timeout_s))
    _POOLS[service] = p
    return p


async def close_pool(service: str) -> None:
    p = _POOLS.pop(service, None)
    if p is not None:
        await p.close()
