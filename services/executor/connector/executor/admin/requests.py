"""AIP-155 request ids: a retried mutation with the same ``request_id`` gets the first answer.

The serialized response is stored in ``connector_admin_request`` in the same transaction as the
mutation, so "mutated" and "remembered" commit together. A transaction-scoped advisory lock on the
request id serializes concurrent duplicates: the second waits, then finds the stored answer.
Failed calls store nothing (their transaction rolls back), so a retry is evaluated afresh.
"""

from __future__ import annotations

from typing import Any, TypeVar

from google.protobuf.message import Message
from psycopg import AsyncConnection

from connector.executor.admin.errors import Reason, invalid_argument

M = TypeVar("M", bound=Message)

MAX_REQUEST_ID_LENGTH = 200

ADMIN_REQUEST_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('connector_admin_request:' || %(id)s, 0))"
ADMIN_REQUEST_GET = "SELECT method, response FROM connector_admin_request WHERE request_id = %(id)s"
ADMIN_REQUEST_INSERT = """
INSERT INTO connector_admin_request (request_id, method, response) VALUES (%(id)s, %(method)s, %(response)s)
"""


def check(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise invalid_argument(
            f"request_id longer than {MAX_REQUEST_ID_LENGTH} characters", field="request_id"
        )


async def admin_request_get(
    conn: AsyncConnection[Any], request_id: str, method: str, response_type: type[M]
) -> M | None:
    """Inside the mutation's transaction: lock the id, return the stored answer if there is one."""
    if not request_id:
        return None
    check(request_id)
    await conn.execute(ADMIN_REQUEST_LOCK, {"id": request_id})
    cur = await conn.execute(ADMIN_REQUEST_GET, {"id": request_id})
    row = await cur.fetchone()
    if row is None:
        return None
    stored_method, payload = row[0], row[1]
    if stored_method != method:
        raise invalid_argument(
            f"request_id was already used for {stored_method}", Reason.REQUEST_ID_REUSED, field="request_id"
        )
    return response_type.FromString(bytes(payload))


async def admin_request_put(
    conn: AsyncConnection[Any], request_id: str, method: str, response: Message
) -> None:
    if request_id:
        await conn.execute(
            ADMIN_REQUEST_INSERT,
            {"id": request_id, "method": method, "response": response.SerializeToString()},
        )
