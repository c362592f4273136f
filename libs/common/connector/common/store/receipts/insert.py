"""The ingress's statements on ``connector_ingress_receipt``: the group commit's one multi-row
insert per batch (``receipt_insert_batch``, docs/adr/002-ingress-group-commit.md) and the lookup of
the keys a batch found taken."""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from psycopg import AsyncConnection, AsyncCursor

from connector.common.store import vocabulary

Conn = AsyncConnection[Any]

# --------------------------------------------------------------------------------------------------
# Ingress: the group commit
# --------------------------------------------------------------------------------------------------

RECEIPT_INSERT_BATCH = f"""
WITH input AS (
  SELECT j.r->>0 AS namespace, j.r->>1 AS route_key, (j.r->>2)::int8 AS route_id,
         (j.r->>3)::int4 AS route_version, j.r->>4 AS provider_delivery_id, j.r->>5 AS idempotency_key,
         j.r->>6 AS method, j.r->>7 AS content_type, j.r->>8 AS event_kind,
         to_timestamp((j.r->>9)::int8 / 1e6::float8) AS received_at, (j.r->>10)::jsonb AS correlation_ids,
         j.r->>11 AS verification, j.r->>12 AS traceparent, j.r->>13 AS origin, b.payload_sha256, b.body,
         j.ord
  FROM jsonb_array_elements(%(envelope)s::jsonb) WITH ORDINALITY AS j(r, ord)
  JOIN unnest(%(payload_sha256)b::bytea[], %(body)b::bytea[]) WITH ORDINALITY AS b(payload_sha256, body, ord)
    USING (ord)
), inserted AS (
  INSERT INTO connector_ingress_receipt (namespace, route_key, route_id, route_version,
    provider_delivery_id, idempotency_key, method, content_type, event_kind, received_at,
    correlation_ids, verification, traceparent, origin, payload_sha256, body)
  SELECT namespace, route_key, route_id, route_version, provider_delivery_id, idempotency_key, method,
         content_type, event_kind, received_at, correlation_ids, verification, traceparent, origin,
         payload_sha256, body
  FROM input ORDER BY ord
  ON CONFLICT (namespace, idempotency_key) DO NOTHING
  RETURNING namespace, idempotency_key, receipt_id
)
SELECT namespace, idempotency_key, receipt_id, true AS inserted,
       (SELECT 1 FROM pg_notify('{vocabulary.CHANNEL_RECEIPTS}', '')) AS notified,
       NULL::bytea AS payload_sha256
FROM inserted
UNION ALL
SELECT r.namespace, r.idempotency_key, r.receipt_id, false, NULL, r.payload_sha256
FROM connector_ingress_receipt r
JOIN (SELECT DISTINCT namespace, idempotency_key FROM input) i USING (namespace, idempotency_key)
"""

#: ``CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT`` (ADR 020): the same statement, whose own (implicit)
#: transaction commits at ``%(synchronous_commit)s``: ``set_config(…, true)`` is ``SET LOCAL`` of that
#: transaction, evaluated once (an InitPlan of the input), and PostgreSQL reads the level when the
#: statement commits. One round trip, as without the setting (an explicit ``BEGIN``, ``SET LOCAL``,
#: insert, ``COMMIT`` doubled the client's CPU per batch: benchmarks/receipt_sync_commit.py).
RECEIPT_INSERT_BATCH_SYNCHRONOUS = RECEIPT_INSERT_BATCH.replace(
    "    USING (ord)\n), inserted AS (",
    "    USING (ord)\n"
    "  WHERE (SELECT set_config('synchronous_commit', %(synchronous_commit)s, true)) IS NOT NULL\n"
    "), inserted AS (",
    1,
)
assert RECEIPT_INSERT_BATCH_SYNCHRONOUS != RECEIPT_INSERT_BATCH

# Keys whose conflicting row committed after the batch statement's snapshot was taken.
RECEIPT_GET_BY_KEYS = """
SELECT r.namespace, r.idempotency_key, r.receipt_id, r.payload_sha256
FROM connector_ingress_receipt r
JOIN unnest(%(namespace)s::text[], %(idempotency_key)s::text[]) AS k(namespace, idempotency_key)
  USING (namespace, idempotency_key)
"""


class ReceiptInsert(Protocol):
    """One verified delivery as the insert reads it (the ingress' ``PendingReceipt``)."""

    namespace: str
    route_key: str
    route_id: int
    route_version: int
    provider_delivery_id: str | None
    idempotency_key: str
    method: str
    content_type: str | None
    event_kind: str | None
    received_at: float
    correlation_ids: str
    payload_sha256: bytes
    body: bytes
    verification: str
    #: W3C traceparent of the ingress span (``None`` while tracing is off).
    traceparent: str | None
    #: ``None`` for a webhook, ``"reconciled"`` for a delivery the reconciler admitted.
    origin: str | None


ReceiptKey = tuple[str, str]
#: An earlier receipt of a key: its id and the SHA-256 of its body.
Earlier = tuple[int, bytes]


#: One JSON encoder for every batch (``json.dumps`` with an argument builds one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode

#: The group commit's cursor of each pooled connection. psycopg keeps a cursor's adaptation context
#: (the dumpers it found for the parameters' types) while it executes the same statement object
#: again; a new cursor per batch looked them up again every time (~5 µs of the writer's CPU per
#: receipt at 22 per batch, docs/benchmarks.md "Ingress CPU per ack"). Weak: a connection the
#: pool closes takes its cursor with it.
_CURSORS: weakref.WeakKeyDictionary[Conn, AsyncCursor[Any]] = weakref.WeakKeyDictionary()


def _cursor(conn: Conn) -> AsyncCursor[Any]:
    cur = _CURSORS.get(conn)
    if cur is None or cur.closed:
        cur = _CURSORS[conn] = conn.cursor()
    return cur


def _insert_params(batch: Sequence[ReceiptInsert]) -> dict[str, Any]:
    """The batch as three parameters: the envelope as one JSON array of rows (serialized by the C
    encoder in one call; positions match ``RECEIPT_INSERT_BATCH``; the receive time in integer
    microseconds, whose text is cheaper to make than a float's) and two binary arrays for the
    bytes. Fourteen typed arrays cost the writer ~40% more CPU per batch in parameter adaptation
    alone (measured: ~500 vs ~300 us per 16 rows)."""
    envelope = [
        [
            i.namespace, i.route_key, i.route_id, i.route_version, i.provider_delivery_id, i.idempotency_key,
            i.method, i.content_type, i.event_kind, round(i.received_at * 1e6), i.correlation_ids,
            i.verification, i.traceparent, i.origin,
        ]
        for i in batch
    ]  # fmt: skip
    return {
        "envelope": _ENCODE(envelope),
        "payload_sha256": [i.payload_sha256 for i in batch],
        "body": [i.body for i in batch],
    }


async def receipt_insert_batch(
    conn: Conn, batch: Sequence[ReceiptInsert], synchronous_commit: str | None = None
) -> tuple[dict[ReceiptKey, int], dict[ReceiptKey, Earlier]]:
    """Insert a batch in one statement (one transaction when ``conn`` is in autocommit), committed
    at ``synchronous_commit`` when given (None: the session's level). Returns (receipt ids
    inserted, receipt id and body hash of earlier duplicates seen by the statement's snapshot),
    both keyed by (namespace, idempotency key)."""
    params = _insert_params(batch)
    cur = _cursor(conn)
    if synchronous_commit is None:
        await cur.execute(RECEIPT_INSERT_BATCH, params)
    else:
        params["synchronous_commit"] = synchronous_commit
        await cur.execute(RECEIPT_INSERT_BATCH_SYNCHRONOUS, params)
    inserted: dict[ReceiptKey, int] = {}
    existing: dict[ReceiptKey, Earlier] = {}
    for namespace, key, receipt_id, was_inserted, _notified, sha in await cur.fetchall():
        if was_inserted:
            inserted[(namespace, key)] = receipt_id
        else:
            existing[(namespace, key)] = (receipt_id, bytes(sha))
    return inserted, existing


async def receipt_get_by_keys(conn: Conn, items: Sequence[ReceiptInsert]) -> dict[ReceiptKey, Earlier]:
    cur = await conn.execute(
        RECEIPT_GET_BY_KEYS,
        {
            "namespace": [i.namespace for i in items],
            "idempotency_key": [i.idempotency_key for i in items],
        },
    )
    return {(ns, key): (rid, bytes(sha)) for ns, key, rid, sha in await cur.fetchall()}


# Which of a page of delivery keys of one namespace have a receipt (the reconciler's diff against
# the sender's list, docs/reconcile.md): probes of the unique (namespace, idempotency_key) index, one
# statement per page.
RECEIPT_KEYS_PRESENT = """
SELECT r.idempotency_key FROM connector_ingress_receipt r
WHERE r.namespace = %(namespace)s AND r.idempotency_key = ANY(%(keys)s::text[])
"""


async def receipt_keys_present(conn: Conn, namespace: str, keys: Sequence[str]) -> set[str]:
    cur = await conn.execute(RECEIPT_KEYS_PRESENT, {"namespace": namespace, "keys": list(keys)}, prepare=True)
    return {row[0] for row in await cur.fetchall()}
