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

from connector.common.store import admin_requests as store
from connector.executor.admin.errors import Reason, invalid_argument

M = TypeVar("M", bound=Message)

MAX_REQUEST_ID_LENGTH = 200


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
    await store.admin_request_lock(conn, request_id)
    row = await store.admin_request_get(conn, request_id)
    if row is None:
        return None
    stored_method, payload = row
    if stored_method != method:
        raise invalid_argument(
            f"request_id was already used for {stored_method}", Reason.REQUEST_ID_REUSED, field="request_id"
        )
    return response_type.FromString(payload)


async def admin_request_put(
    conn: AsyncConnection[Any], request_id: str, method: str, response: Message
) -> None:
    if request_id:
        await store.admin_request_insert(conn, request_id, method, response.SerializeToString())
