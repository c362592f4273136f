"""A connection that records the statements the admin code sends (plan tests, batching tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg


class Recording:
    """An async connection that records every statement (and its parameters) it is sent."""

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self._conn = conn
        self.statements: list[tuple[str, Any]] = []

    async def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        self.statements.append((str(query), params))
        return await self._conn.execute(query, params, **kw)

    def cursor(self, *args: Any, **kw: Any) -> Any:
        return _Cursor(self, self._conn.cursor(*args, **kw))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class OnePool:
    """Enough of a pool for ``admin.session.connection``: one recording connection."""

    def __init__(self, conn: Recording) -> None:
        self.conn = conn

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Recording]:
        yield self.conn

    def get_stats(self) -> dict[str, int]:
        return {}


class _Cursor:
    def __init__(self, owner: Recording, cur: Any) -> None:
        self._owner, self._cur = owner, cur

    async def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        self._owner.statements.append((str(query), params))
        await self._cur.execute(query, params, **kw)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)
