"""Connections for admin calls: pool waits and database conflicts become canonical errors.

* pool saturated (``PoolTimeout``) → RESOURCE_EXHAUSTED ``DATABASE_BUSY`` (retry later), unless the
  pool failed to open a connection since the last call that got one: the database is unreachable →
  UNAVAILABLE ``DATABASE_UNAVAILABLE``;
* deadlock / serialization failure / lock timeout → ABORTED ``CONCURRENT_CHANGE`` (retry);
* statement timeout → DEADLINE_EXCEEDED ``STATEMENT_TIMEOUT``.
A connection lost under the call becomes UNAVAILABLE ``DATABASE_UNAVAILABLE`` in the server's error
interceptor (``connector.common.core.grpc_server``); anything else unexpected becomes INTERNAL there.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from psycopg import AsyncConnection, errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from connector.common.core.grpc_server import ServiceError
from connector.executor.admin.errors import Reason, aborted, resource_exhausted


def _connect_errors(pool: AsyncConnectionPool) -> int:
    return int(pool.get_stats().get("connections_errors", 0))


#: Per pool: its count of failed connection attempts when a call last got a connection.
_ERRORS_AT_LAST_SUCCESS: weakref.WeakKeyDictionary[AsyncConnectionPool, int] = weakref.WeakKeyDictionary()


@asynccontextmanager
async def connection(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection[Any]]:
    try:
        async with pool.connection() as conn:
            _ERRORS_AT_LAST_SUCCESS[pool] = _connect_errors(pool)
            yield conn
    except PoolTimeout:
        if _connect_errors(pool) > _ERRORS_AT_LAST_SUCCESS.get(pool, 0):
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                Reason.DATABASE_UNAVAILABLE,
                "database unavailable: no connection could be opened; retry with backoff",
            ) from None
        raise resource_exhausted(Reason.DATABASE_BUSY, "database busy: no connection available") from None
    except (errors.DeadlockDetected, errors.SerializationFailure, errors.LockNotAvailable):
        raise aborted("concurrent change in the database; retry") from None
    except errors.QueryCanceled:
        raise ServiceError(
            grpc.StatusCode.DEADLINE_EXCEEDED, Reason.STATEMENT_TIMEOUT, "database statement timed out"
        ) from None
