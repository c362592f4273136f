"""The materializer's statements on ``connector_ingress_receipt``: routing claims fenced by
``claim_token``, the marks of a routed batch, release, the ordering gate and the routing lag
(docs/adr/004-materializer.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.tokens import token_next

Conn = AsyncConnection[Any]

# --------------------------------------------------------------------------------------------------
# Materializer: routing (claims fenced by claim_token)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    """The columns of a claimed receipt the materializer reads."""

    receipt_id: int
    claim_token: int
    attempts: int
    namespace: str
    route_key: str
    idempotency_key: str
    event_kind: str | None
    provider_delivery_id: str | None
    correlation_ids: Mapping[str, Any]
    payload_sha256: bytes
    body: bytes | None
    has_body_ref: bool
    #: W3C traceparent stored by the ingress (``None`` when it traced nothing).
    traceparent: str | None = None
    #: When the database accepted it, Unix seconds (the clock a work type's delay starts from; a
    #: float: a timestamptz costs the claim ~0.4 µs more per row to decode).
    accepted_at: float | None = None


#: Advisory lock serialising receipt claims, so concurrent claimers take contiguous ranges of the
#: due order instead of interleaving (a claim holds it for one short statement).
RECEIPT_CLAIM_LOCK_KEY = 7234101

RECEIPT_CLAIM_LOCK = "SELECT pg_advisory_xact_lock(%(lock)s)"

# Due receipts (pending, or retry whose time has come) in due order, plus receipts whose routing
# lease expired — re-checked in the same CAS. The commit horizon: a pending receipt is claimed only
# once the transaction that inserted it is older than every transaction still running in this
# database, so no receipt with a smaller id can still commit after it (ids are taken before commit;
# DESIGN §8 trap 4; docs/adr/004-materializer.md). A receipt that waited ``horizon_wait_s`` is
# claimed anyway (a long transaction elsewhere must not stall routing). ``age()`` compares 32-bit
# xids wrap-safely.
# The update finds its rows by primary key only and re-checks no state: the candidates were locked
# FOR UPDATE by this statement, their conditions re-evaluated on the newest row version (READ
# COMMITTED EvalPlanQual), and they stay locked until commit, so a re-check here is redundant. It is
# also a trap: a state predicate lets the planner drive the update from the partial indexes, whose
# row estimates come from statistics in which a backlog is rare. It did: a nested loop of the whole
# backlog x the batch (7.9M comparisons, 1.6-2.8 s per claim with 30k receipts due), and the
# materializer fell behind for good (tests/materializer/test_plans.py).
RECEIPT_CLAIM_ROUTABLE = f"""
WITH horizon AS MATERIALIZED (
  SELECT max(age(backend_xid)) AS oldest_running_age FROM pg_stat_activity
  WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
), due AS (
  SELECT r.receipt_id FROM connector_ingress_receipt r, horizon h
  WHERE r.router_status IN ('pending', 'retry') AND r.next_attempt_at <= now()
    AND (age(r.xmin) > coalesce(h.oldest_running_age, -1)
         OR r.next_attempt_at < now() - make_interval(secs => %(horizon_wait_s)s))
  ORDER BY r.next_attempt_at, r.receipt_id
  LIMIT %(limit)s
  FOR UPDATE OF r SKIP LOCKED
), expired AS (
  SELECT r.receipt_id FROM connector_ingress_receipt r
  WHERE r.router_status = 'routing' AND r.lease_until < now()
  ORDER BY r.receipt_id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
UPDATE connector_ingress_receipt r
SET router_status = 'routing', claim_owner = %(owner)s, claim_token = {token_next("r.claim_token")},
    attempts = r.attempts + 1, lease_until = clock_timestamp() + make_interval(secs => %(lease_s)s)
WHERE r.receipt_id = ANY (ARRAY(SELECT receipt_id FROM due UNION SELECT receipt_id FROM expired))
RETURNING r.receipt_id, r.claim_token, r.attempts, r.namespace, r.route_key, r.idempotency_key,
          r.event_kind, r.provider_delivery_id, r.correlation_ids, r.payload_sha256, r.body,
          r.body_ref IS NOT NULL, r.traceparent,
          extract(epoch FROM r.accepted_at)::float8
"""

# The earliest receipt of each namespace held by *another* live claim (the ordering gate).
RECEIPT_INFLIGHT_FLOOR = """
SELECT namespace, min(receipt_id) FROM connector_ingress_receipt
WHERE router_status = 'routing' AND namespace = ANY(%(namespaces)b::text[])
  AND NOT (receipt_id = ANY(%(mine)b::bigint[])) AND lease_until > clock_timestamp()
GROUP BY namespace
"""

RECEIPT_MARK_MATERIALIZED_BATCH = """
UPDATE connector_ingress_receipt r
SET router_status = 'materialized', enqueued_event_ids = ARRAY[m.event_id], routed_at = clock_timestamp(),
    lease_until = NULL, error_class = NULL, error_summary = NULL
FROM unnest(%(ids)b::bigint[], %(tokens)b::bigint[], %(event_ids)b::bigint[])
  AS m(receipt_id, token, event_id)
WHERE r.receipt_id = m.receipt_id AND r.claim_token = m.token AND r.router_status = 'routing'
RETURNING r.receipt_id
"""

RECEIPT_MARK_FAILED_BATCH = """
UPDATE connector_ingress_receipt r
SET router_status = 'failed', routed_at = clock_timestamp(), lease_until = NULL,
    error_class = f.error_class, error_summary = f.summary
FROM unnest(%(ids)b::bigint[], %(tokens)b::bigint[], %(classes)b::text[], %(summaries)b::text[])
  AS f(receipt_id, token, error_class, summary)
WHERE r.receipt_id = f.receipt_id AND r.claim_token = f.token AND r.router_status = 'routing'
RETURNING r.receipt_id
"""

RECEIPT_MARK_RETRY_BATCH = """
UPDATE connector_ingress_receipt r
SET router_status = 'retry', lease_until = NULL, error_class = f.error_class, error_summary = f.summary,
    next_attempt_at = clock_timestamp() + make_interval(secs => f.delay_s)
FROM unnest(%(ids)b::bigint[], %(tokens)b::bigint[], %(classes)b::text[], %(summaries)b::text[],
            %(delays)b::float8[]) AS f(receipt_id, token, error_class, summary, delay_s)
WHERE r.receipt_id = f.receipt_id AND r.claim_token = f.token AND r.router_status = 'routing'
RETURNING r.receipt_id
"""

# Give claimed receipts back untouched (shutdown): the attempt is not counted and the due position
# (next_attempt_at) is kept.
RECEIPT_RELEASE_BATCH = """
UPDATE connector_ingress_receipt r
SET router_status = CASE WHEN r.attempts <= 1 THEN 'pending' ELSE 'retry' END,
    attempts = greatest(r.attempts - 1, 0), lease_until = NULL
FROM unnest(%(ids)b::bigint[], %(tokens)b::bigint[]) AS f(receipt_id, token)
WHERE r.receipt_id = f.receipt_id AND r.claim_token = f.token AND r.router_status = 'routing'
"""

# Routing lag: the age of the oldest receipt that is due but unrouted (for a fresh receipt,
# next_attempt_at is its acceptance time), or that is claimed but not finished (acceptance time of
# the oldest receipt in flight: grows when a holder died and its lease has not been re-claimed). One
# probe of the routable index plus the small set of in-flight receipts (partial routing index).
RECEIPT_ROUTING_LAG = """
SELECT greatest(
  (SELECT extract(epoch FROM clock_timestamp() - next_attempt_at)
   FROM connector_ingress_receipt
   WHERE router_status IN ('pending', 'retry') AND next_attempt_at <= now()
   ORDER BY next_attempt_at, receipt_id LIMIT 1),
  (SELECT extract(epoch FROM clock_timestamp() - min(accepted_at))
   FROM connector_ingress_receipt WHERE router_status = 'routing'),
  0)::float8
"""


async def receipt_claim_routable(
    conn: AsyncConnection[Any],
    *,
    owner: str,
    limit: int,
    lease_s: float,
    horizon_wait_s: float,
) -> list[ReceiptRow]:
    """Claim up to ``limit`` routable receipts (one short transaction, serialized with other
    claimers by an advisory lock). Returned in receipt order."""
    async with conn.transaction():
        await conn.execute(RECEIPT_CLAIM_LOCK, {"lock": RECEIPT_CLAIM_LOCK_KEY}, prepare=True)
        cur = await conn.execute(
            RECEIPT_CLAIM_ROUTABLE,
            {"owner": owner, "limit": limit, "lease_s": lease_s, "horizon_wait_s": horizon_wait_s},
            prepare=True,
        )
        rows = await cur.fetchall()
    out = [
        ReceiptRow(
            receipt_id=int(r[0]),
            claim_token=int(r[1]),
            attempts=int(r[2]),
            namespace=r[3],
            route_key=r[4],
            idempotency_key=r[5],
            event_kind=r[6],
            provider_delivery_id=r[7],
            correlation_ids=r[8] if isinstance(r[8], dict) else {},
            payload_sha256=bytes(r[9]),
            body=bytes(r[10]) if r[10] is not None else None,
            has_body_ref=bool(r[11]),
            traceparent=r[12],
            accepted_at=r[13],
        )
        for r in rows
    ]
    out.sort(key=lambda r: r.receipt_id)
    return out


async def receipt_inflight_floor(
    conn: AsyncConnection[Any], namespaces: Iterable[str], mine: Sequence[int]
) -> dict[str, int]:
    cur = await conn.execute(
        RECEIPT_INFLIGHT_FLOOR, {"namespaces": sorted(set(namespaces)), "mine": list(mine)}, prepare=True
    )
    return {str(ns): int(floor) for ns, floor in await cur.fetchall()}


async def receipt_mark_materialized_batch(
    conn: AsyncConnection[Any], receipts: Sequence[ReceiptRow], event_ids: Sequence[int]
) -> set[int]:
    """Fenced: returns the receipt ids still owned (and now materialized)."""
    if not receipts:
        return set()
    cur = await conn.execute(
        RECEIPT_MARK_MATERIALIZED_BATCH,
        {
            "ids": [r.receipt_id for r in receipts],
            "tokens": [r.claim_token for r in receipts],
            "event_ids": list(event_ids),
        },
        prepare=True,
    )
    return {int(row[0]) for row in await cur.fetchall()}


async def receipt_mark_failed_batch(
    conn: AsyncConnection[Any], items: Sequence[tuple[ReceiptRow, str, str]]
) -> set[int]:
    """Fenced; ``items`` are (receipt, error_class, sanitized summary)."""
    if not items:
        return set()
    cur = await conn.execute(
        RECEIPT_MARK_FAILED_BATCH,
        {
            "ids": [r.receipt_id for r, _, _ in items],
            "tokens": [r.claim_token for r, _, _ in items],
            "classes": [c for _, c, _ in items],
            "summaries": [s for _, _, s in items],
        },
        prepare=True,
    )
    return {int(row[0]) for row in await cur.fetchall()}


async def receipt_mark_retry_batch(
    conn: AsyncConnection[Any], items: Sequence[tuple[ReceiptRow, str, str, float]]
) -> set[int]:
    """Fenced; ``items`` are (receipt, error_class, sanitized summary, delay seconds)."""
    if not items:
        return set()
    cur = await conn.execute(
        RECEIPT_MARK_RETRY_BATCH,
        {
            "ids": [r.receipt_id for r, _, _, _ in items],
            "tokens": [r.claim_token for r, _, _, _ in items],
            "classes": [c for _, c, _, _ in items],
            "summaries": [s for _, _, s, _ in items],
            "delays": [d for _, _, _, d in items],
        },
        prepare=True,
    )
    return {int(row[0]) for row in await cur.fetchall()}


async def receipt_release_batch(conn: AsyncConnection[Any], receipts: Sequence[ReceiptRow]) -> int:
    if not receipts:
        return 0
    cur = await conn.execute(
        RECEIPT_RELEASE_BATCH,
        {"ids": [r.receipt_id for r in receipts], "tokens": [r.claim_token for r in receipts]},
    )
    return cur.rowcount


async def receipt_routing_lag(conn: AsyncConnection[Any]) -> float:
    cur = await conn.execute(RECEIPT_ROUTING_LAG, prepare=True)
    row = await cur.fetchone()
    return float(row[0]) if row is not None and row[0] is not None else 0.0
