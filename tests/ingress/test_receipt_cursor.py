"""The group commit keeps one cursor per pooled connection (``receipts.insert._cursor``): psycopg then
keeps the parameters' dumpers between batches. Batches on one connection share it and still get
their own answers; another connection gets its own cursor; the receive time survives the
integer-microsecond encoding to the microsecond."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime

import psycopg

from connector.common.store.receipts import insert
from connector.ingress.receipts import PendingReceipt, receipt_commit_batch


def _item(key: str, received_at: float) -> PendingReceipt:
    body = b'{"id":"%s"}' % key.encode()
    return PendingReceipt(
        namespace="ns", route_key="r", route_id=1, route_version=1, provider_delivery_id=key,
        idempotency_key=f"r:id:{key}", method="POST", content_type="application/json",
        event_kind=None, received_at=received_at, correlation_ids="{}",
        payload_sha256=hashlib.sha256(body).digest(), body=body, verification="none",
    )  # fmt: skip


async def test_one_cursor_per_connection_and_each_batch_its_own_answers(db_url: str) -> None:
    stamp = 1_767_225_600.123457  # 2026-01-01 00:00:00.123457 UTC
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        first = await receipt_commit_batch(conn, [_item("a", stamp), _item("b", stamp)])
        cursor = insert._CURSORS[conn]
        second = await receipt_commit_batch(conn, [_item("b", stamp), _item("c", stamp)])
        assert insert._CURSORS[conn] is cursor
        assert [(r.duplicate, r.failure) for r in first] == [(False, None), (False, None)]
        assert [(r.duplicate, r.failure) for r in second] == [(True, None), (False, None)]
        assert second[0].receipt_id == first[1].receipt_id
        assert len({first[0].receipt_id, first[1].receipt_id, second[1].receipt_id}) == 3
        cur = await conn.execute("SELECT DISTINCT received_at FROM connector_ingress_receipt")
        rows = await cur.fetchall()
        assert rows == [(datetime(2026, 1, 1, 0, 0, 0, 123457, tzinfo=UTC),)]
    # Another connection (the pool replaced one) gets its own cursor.
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as other:
        results = await receipt_commit_batch(other, [_item("d", time.time())])
        assert results[0].failure is None and not results[0].duplicate
        assert insert._CURSORS[other] is not cursor
