"""Every statement on ``connector_admin_request`` outside the admin API's own request-id
de-duplication: retention of expired AIP-155 request ids (ADR 009)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

Conn = AsyncConnection[Any]

# AIP-155 request ids past their de-duplication window (a small table: operator mutations only).
ADMIN_REQUEST_DELETE_EXPIRED = """
DELETE FROM connector_admin_request WHERE created_at < now() - make_interval(secs => %(s)s::float8)
"""
ADMIN_REQUEST_COUNT_EXPIRED = """
SELECT count(*) FROM connector_admin_request WHERE created_at < now() - make_interval(secs => %(s)s::float8)
"""


async def admin_request_delete_expired(conn: Conn, older_than_s: float) -> int:
    return (await conn.execute(ADMIN_REQUEST_DELETE_EXPIRED, {"s": older_than_s})).rowcount


async def admin_request_count_expired(conn: Conn, older_than_s: float) -> int:
    cur = await conn.execute(ADMIN_REQUEST_COUNT_EXPIRED, {"s": older_than_s})
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
