"""Reading rows by name: the store's functions that return ``dict`` rows (psycopg's ``dict_row``)
use these two. The claim path reads plain tuples (no row factory per row) and names their positions
instead (``work_items.claim.ClaimedRow``)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row


async def fetch_dicts(conn: AsyncConnection[Any], statement: str, params: Any = None) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(statement, params)
    return await cur.fetchall()


async def fetch_dict(conn: AsyncConnection[Any], statement: str, params: Any = None) -> dict[str, Any] | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(statement, params)
    return await cur.fetchone()


#: One consistent, read-only snapshot for a multi-statement read (the admin trace); the first
#: statement of a transaction.
SNAPSHOT_READ_ONLY = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"


async def snapshot_read_only(conn: AsyncConnection[Any]) -> None:
    await conn.execute(SNAPSHOT_READ_ONLY)
