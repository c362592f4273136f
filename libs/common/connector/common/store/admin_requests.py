"""Every statement on ``connector_admin_request``: the admin API's AIP-155 request-id
de-duplication (``connector.executor.admin.requests``: lock the id, read the stored answer, store
the answer in the mutation's transaction) and retention of expired request ids (ADR 009)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

Conn = AsyncConnection[Any]

# Concurrent duplicates of one request id serialize on a transaction-scoped advisory lock.
ADMIN_REQUEST_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('connector_admin_request:' || %(id)s, 0))"
ADMIN_REQUEST_GET = "SELECT method, response FROM connector_admin_request WHERE request_id = %(id)s"
ADMIN_REQUEST_INSERT = """
INSERT INTO connector_admin_request (request_id, method, response) VALUES (%(id)s, %(method)s, %(response)s)
"""


async def admin_request_lock(conn: Conn, request_id: str) -> None:
    await conn.execute(ADMIN_REQUEST_LOCK, {"id": request_id})


async def admin_request_get(conn: Conn, request_id: str) -> tuple[str, bytes] | None:
    """``(method, serialized response)`` stored for ``request_id``."""
    cur = await conn.execute(ADMIN_REQUEST_GET, {"id": request_id})
    row = await cur.fetchone()
    return None if row is None else (str(row[0]), bytes(row[1]))


async def admin_request_insert(conn: Conn, request_id: str, method: str, response: bytes) -> None:
    await conn.execute(ADMIN_REQUEST_INSERT, {"id": request_id, "method": method, "response": response})


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
