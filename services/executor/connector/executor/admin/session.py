"""Connections for admin calls: pool waits and database conflicts become canonical errors.

* pool saturated (``PoolTimeout``) → RESOURCE_EXHAUSTED ``DATABASE_BUSY`` (retry later);
* deadlock / serialization failure / lock timeout → ABORTED ``CONCURRENT_CHANGE`` (retry);
* statement timeout → DEADLINE_EXCEEDED ``STATEMENT_TIMEOUT``.
Anything else is unexpected and becomes INTERNAL (without detail) in the server's error interceptor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from psycopg import AsyncConnection, errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from connector.common.grpc_server import ServiceError
from connector.executor.admin.errors import Reason, aborted, resource_exhausted


@asynccontextmanager
async def connection(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection[Any]]:
    try:
        async with pool.connection() as conn:
            yield conn
    except PoolTimeout:
        raise resource_exhausted(Reason.DATABASE_BUSY, "database busy: no connection available") from None
    except (errors.DeadlockDetected, errors.SerializationFailure, errors.LockNotAvailable):
        raise aborted("concurrent change in the database; retry") from None
    except errors.QueryCanceled:
        raise ServiceError(
            grpc.StatusCode.DEADLINE_EXCEEDED, Reason.STATEMENT_TIMEOUT, "database statement timed out"
        ) from None
