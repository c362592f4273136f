"""Every statement on ``connector_ingress_receipt`` (DESIGN §2: the ingress inserts, the
materializer owns the routing columns, retention deletes retired deliveries in store/deliveries.py).

Rules: one named constant per statement, noun first, with one function of the same name. The ingress
insert is one multi-row statement per group commit (``receipt_insert_batch``, docs/adr/002); routing
writes are fenced by ``claim_token`` and batched through ``unnest`` with binary arrays (ADR 004);
state literals are inlined so plans use the partial indexes (DESIGN §8 trap 5). Plans are asserted
by tests/ingress/test_plans.py and tests/materializer/test_plans.py.

Joins held here: a receipt replay's check of its events and its namespace's active route
(``receipt_replay_check``), the claimant count of the admin's receipt statistics
(``receipt_stats``: ``connector_process``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from psycopg import AsyncConnection

from connector.common.store import schema
from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]

# --------------------------------------------------------------------------------------------------
# Ingress: the group commit
# --------------------------------------------------------------------------------------------------

RECEIPT_INSERT_BATCH = f"""
WITH input AS (
  SELECT j.r->>0 AS namespace, j.r->>1 AS route_key, (j.r->>2)::int8 AS route_id,
         (j.r->>3)::int4 AS route_version, j.r->>4 AS provider_delivery_id, j.r->>5 AS idempotency_key,
         j.r->>6 AS method, j.r->>7 AS content_type, j.r->>8 AS event_kind,
         to_timestamp((j.r->>9)::float8) AS received_at, (j.r->>10)::jsonb AS correlation_ids,
         j.r->>11 AS verification, j.r->>12 AS traceparent, b.payload_sha256, b.body, j.ord
  FROM jsonb_array_elements(%(envelope)s::jsonb) WITH ORDINALITY AS j(r, ord)
  JOIN unnest(%(payload_sha256)b::bytea[], %(body)b::bytea[]) WITH ORDINALITY AS b(payload_sha256, body, ord)
    USING (ord)
), inserted AS (
  INSERT INTO connector_ingress_receipt (namespace, route_key, route_id, route_version,
    provider_delivery_id, idempotency_key, method, content_type, event_kind, received_at,
    correlation_ids, verification, traceparent, payload_sha256, body)
  SELECT namespace, route_key, route_id, route_version, provider_delivery_id, idempotency_key, method,
         content_type, event_kind, received_at, correlation_ids, verification, traceparent,
         payload_sha256, body
  FROM input ORDER BY ord
  ON CONFLICT (namespace, idempotency_key) DO NOTHING
  RETURNING namespace, idempotency_key, receipt_id
)
SELECT namespace, idempotency_key, receipt_id, true AS inserted,
       (SELECT 1 FROM pg_notify('{schema.CHANNEL_RECEIPTS}', '')) AS notified
FROM inserted
UNION ALL
SELECT r.namespace, r.idempotency_key, r.receipt_id, false, NULL
FROM connector_ingress_receipt r
JOIN (SELECT DISTINCT namespace, idempotency_key FROM input) i USING (namespace, idempotency_key)
"""

# Keys whose conflicting row committed after the batch statement's snapshot was taken.
RECEIPT_GET_BY_KEYS = """
SELECT r.namespace, r.idempotency_key, r.receipt_id
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


ReceiptKey = tuple[str, str]


def _insert_params(batch: Sequence[ReceiptInsert]) -> dict[str, Any]:
    """The batch as three parameters: the envelope as one JSON array of rows (serialized by the C
    encoder in one call; positions match ``RECEIPT_INSERT_BATCH``) and two binary arrays for the
    bytes. Fourteen typed arrays cost the writer ~40% more CPU per batch in parameter adaptation
    alone (measured: ~500 vs ~300 us per 16 rows)."""
    envelope = [
        [
            i.namespace, i.route_key, i.route_id, i.route_version, i.provider_delivery_id, i.idempotency_key,
            i.method, i.content_type, i.event_kind, i.received_at, i.correlation_ids, i.verification,
            i.traceparent,
        ]
        for i in batch
    ]  # fmt: skip
    return {
        "envelope": json.dumps(envelope, separators=(",", ":")),
        "payload_sha256": [i.payload_sha256 for i in batch],
        "body": [i.body for i in batch],
    }


async def receipt_insert_batch(
    conn: Conn, batch: Sequence[ReceiptInsert]
) -> tuple[dict[ReceiptKey, int], dict[ReceiptKey, int]]:
    """Insert a batch in one statement (one transaction when ``conn`` is in autocommit). Returns
    (receipt ids inserted, receipt ids of earlier duplicates seen by the statement's snapshot), both
    keyed by (namespace, idempotency key)."""
    cur = await conn.execute(RECEIPT_INSERT_BATCH, _insert_params(batch))
    inserted: dict[ReceiptKey, int] = {}
    existing: dict[ReceiptKey, int] = {}
    for namespace, key, receipt_id, was_inserted, _notified in await cur.fetchall():
        (inserted if was_inserted else existing)[(namespace, key)] = receipt_id
    return inserted, existing


async def receipt_get_by_keys(conn: Conn, items: Sequence[ReceiptInsert]) -> dict[ReceiptKey, int]:
    cur = await conn.execute(
        RECEIPT_GET_BY_KEYS,
        {
            "namespace": [i.namespace for i in items],
            "idempotency_key": [i.idempotency_key for i in items],
        },
    )
    return {(ns, key): rid for ns, key, rid in await cur.fetchall()}


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
RECEIPT_CLAIM_ROUTABLE = """
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
SET router_status = 'routing', claim_owner = %(owner)s, claim_token = r.claim_token + 1,
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


# --------------------------------------------------------------------------------------------------
# Retention
# --------------------------------------------------------------------------------------------------

# The lowest receipt id is the oldest receipt left (ids follow acceptance): one primary-key probe.
RECEIPT_OLDEST_AGE = """
SELECT coalesce((SELECT extract(epoch FROM now() - accepted_at)::float8
                 FROM connector_ingress_receipt ORDER BY receipt_id LIMIT 1), 0)
"""


async def receipt_oldest_age(conn: Conn) -> float:
    """Seconds since the oldest receipt left was accepted (0: none)."""
    cur = await conn.execute(RECEIPT_OLDEST_AGE, {})
    row = await cur.fetchone()
    assert row is not None
    return float(row[0])


# --------------------------------------------------------------------------------------------------
# A delivery followed to its WorkItem (``connector up`` waits for its demo delivery with it)
# --------------------------------------------------------------------------------------------------

RECEIPT_WORK_OUTCOME = """
SELECT r.receipt_id, r.router_status, w.work_id, w.state
FROM connector_ingress_receipt r
LEFT JOIN connector_event e ON e.receipt_id = r.receipt_id
LEFT JOIN connector_work_item w ON w.event_id = e.event_id
WHERE r.namespace = %s AND r.provider_delivery_id = %s
"""


async def receipt_work_outcome(conn: Conn, namespace: str, delivery_id: str) -> tuple[Any, ...] | None:
    """``(receipt_id, router_status, work_id, work item state)`` of a provider delivery (``None``
    before its receipt commits; work columns NULL until it is materialized)."""
    cur = await conn.execute(RECEIPT_WORK_OUTCOME, (namespace, delivery_id))
    return await cur.fetchone()


# --------------------------------------------------------------------------------------------------
# The admin API: receipt reads (sanitized by construction: the select list never includes the
# signature, the verification secret reference or the body; the body only when asked for)
# --------------------------------------------------------------------------------------------------

# A receipt row as the admin API shows it, each column aliased ``r_<column>`` so it can share a row
# with a WorkItem's and an event's (``connector.executor.admin.convert.receipt`` reads these names).
RECEIPT_SELECT_COLUMNS = """
  r.receipt_id AS r_receipt_id, r.namespace AS r_namespace, r.route_key AS r_route_key,
  r.provider_delivery_id AS r_provider_delivery_id, r.method AS r_method,
  r.content_type AS r_content_type, r.event_kind AS r_event_kind, r.received_at AS r_received_at,
  r.accepted_at AS r_accepted_at, r.correlation_ids AS r_correlation_ids,
  r.payload_sha256 AS r_payload_sha256, r.router_status AS r_router_status, r.attempts AS r_attempts,
  r.enqueued_event_ids AS r_enqueued_event_ids, r.error_class AS r_error_class,
  r.error_summary AS r_error_summary"""

# Failed receipts, newest first, keyset on the id: ``ix_connector_ingress_receipt_failed``
# (namespace, receipt_id) WHERE router_status = 'failed'. ``{where}``: the filters present (constant
# fragments, never a ``param IS NULL OR`` catch-all, whose generic plan ignores the partial index).
RECEIPT_LIST_FAILED = (
    f"SELECT {RECEIPT_SELECT_COLUMNS} FROM connector_ingress_receipt r WHERE {{where}}"
    " ORDER BY r.receipt_id DESC LIMIT %(limit)s"
)

RECEIPT_REPLAY_CHECK = """
SELECT r.receipt_id, r.router_status, r.namespace, r.route_key,
       (r.body IS NOT NULL OR r.body_ref IS NOT NULL) AS has_body,
       EXISTS (SELECT 1 FROM connector_event e WHERE e.receipt_id = r.receipt_id) AS has_events,
       p.installed_pack_id, p.active_generation,
       EXISTS (SELECT 1 FROM connector_route rt
               WHERE rt.installed_pack_id = p.installed_pack_id AND rt.generation = p.active_generation
                 AND rt.route_key = r.route_key) AS route_exists
FROM connector_ingress_receipt r
LEFT JOIN connector_installed_pack p ON p.namespace = r.namespace
WHERE r.receipt_id = %(receipt_id)s
FOR UPDATE OF r
"""

# The materializer owns routing state; a replay hands the receipt back to it as a fresh routable
# receipt. claim_token + 1 fences any stale holder of an old routing claim.
RECEIPT_REPLAY = f"""
UPDATE connector_ingress_receipt r SET
  router_status = 'pending', attempts = 0, next_attempt_at = now(),
  claim_owner = NULL, claim_token = r.claim_token + 1, lease_until = NULL, routed_at = NULL
WHERE r.receipt_id = %(receipt_id)s AND r.router_status = 'failed'
RETURNING {RECEIPT_SELECT_COLUMNS}
"""

RECEIPT_NOTIFY = f"SELECT pg_notify('{schema.CHANNEL_RECEIPTS}', '')"

RECEIPT_GET = (
    f"SELECT {RECEIPT_SELECT_COLUMNS} FROM connector_ingress_receipt r WHERE r.receipt_id = %(receipt_id)s"
)


async def receipt_list_failed(
    conn: Conn, namespace: str | None, *, after: int | None, limit: int
) -> list[dict[str, Any]]:
    """Failed receipts (of ``namespace``, when given) with ids below ``after``, newest first."""
    clauses = ["r.router_status = 'failed'"]
    params: dict[str, Any] = {"limit": limit}
    if namespace is not None:
        clauses.append("r.namespace = %(namespace)s")
        params["namespace"] = namespace
    if after is not None:
        clauses.append("r.receipt_id < %(after)s")
        params["after"] = after
    return await fetch_dicts(conn, RECEIPT_LIST_FAILED.format(where=" AND ".join(clauses)), params)


async def receipt_get(conn: Conn, receipt_id: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, RECEIPT_GET, {"receipt_id": receipt_id})


async def receipt_replay_check(conn: Conn, receipt_id: int) -> dict[str, Any] | None:
    """What a receipt replay checks: the receipt (locked ``FOR UPDATE``), whether it has events, its
    namespace's active generation and whether its route is in it."""
    return await fetch_dict(conn, RECEIPT_REPLAY_CHECK, {"receipt_id": receipt_id})


async def receipt_replay(conn: Conn, receipt_id: int) -> dict[str, Any] | None:
    """A failed receipt back to ``pending`` (``None``: it is not failed)."""
    return await fetch_dict(conn, RECEIPT_REPLAY, {"receipt_id": receipt_id})


async def receipt_notify(conn: Conn) -> None:
    """Wake the materializers (``connector_receipts``)."""
    await conn.execute(RECEIPT_NOTIFY)


# Receipt counts of the admin API's queue statistics (the partial routable / routing / failed receipt
# indexes) and the WorkItem claimants heartbeating within ``stale_s``.
RECEIPT_STATS = """
SELECT
  (SELECT count(*) FROM connector_ingress_receipt WHERE router_status IN ('pending', 'retry')) AS unrouted,
  (SELECT now() - next_attempt_at FROM connector_ingress_receipt
   WHERE router_status IN ('pending', 'retry') AND next_attempt_at <= now()
   ORDER BY next_attempt_at LIMIT 1) AS oldest_unrouted_age,
  (SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'routing') AS routing,
  (SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'failed') AS failed,
  (SELECT count(*) FROM connector_process
   WHERE claim_capability = 'work_item' AND heartbeat_at >= now() - make_interval(secs => %(stale_s)s))
    AS active_claimants
"""


async def receipt_stats(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, RECEIPT_STATS, params)


# --------------------------------------------------------------------------------------------------
# The admin API: finding deliveries (FindDeliveries) and tracing one (TraceDelivery). A delivery is
# a receipt with its events and WorkItems; the search is driven from the receipt, newest first,
# keyset on receipt_id. docs/admin.md, "Find" and "Trace".
# --------------------------------------------------------------------------------------------------

#: Receipt routing states a find may filter on.
RECEIPT_STATUSES = schema.RECEIPT_STATES
#: A scan without a key examines at most this many receipts per call (its page may be short).
FIND_SCAN_LIMIT = 5000
#: Acceptance-time bounds are turned into receipt-id bounds widened by this much: a receipt's id is
#: taken inside its insert, its ``accepted_at`` is its transaction's start, so ids and times agree
#: in order up to the duration of one insert (the exact time filter still applies to every row).
FIND_TIME_MARGIN_S = 300.0


@dataclass(frozen=True, slots=True)
class DeliveryFilter:
    """What FindDeliveries (and TraceDelivery by provider id) looks for. Keys pick the index the
    search reads; every other field is a condition on the rows found (constant SQL fragments for
    the fields present, never a ``param IS NULL OR`` catch-all)."""

    receipt_id: int | None = None
    work_id: int | None = None
    provider_delivery_id: str | None = None
    idempotency_key: str | None = None
    correlation: tuple[str, str] | None = None
    namespace: str | None = None
    route_key: str | None = None
    event_kind: str | None = None
    receipt_status: str | None = None
    work_item_state: str | None = None
    accepted_after: datetime | None = None
    accepted_before: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """The filter as the page token binds it."""
        return {
            "receipt": self.receipt_id,
            "work": self.work_id,
            "delivery": self.provider_delivery_id,
            "idem": self.idempotency_key,
            "corr": list(self.correlation) if self.correlation else None,
            "ns": self.namespace,
            "route": self.route_key,
            "kind": self.event_kind,
            "rstatus": self.receipt_status,
            "wstate": self.work_item_state,
            "after": self.accepted_after.isoformat() if self.accepted_after else None,
            "before": self.accepted_before.isoformat() if self.accepted_before else None,
        }

    @property
    def empty(self) -> bool:
        return not any(v is not None for v in self.as_dict().values())

    @property
    def keyed(self) -> bool:
        """Whether an index lookup finds the candidates (else the receipts are scanned)."""
        return (
            self.receipt_id is not None
            or self.work_id is not None
            or self.provider_delivery_id is not None
            or self.idempotency_key is not None
            or self.correlation is not None
            or (self.receipt_status is not None and self.receipt_status != "materialized")
        )

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """Conditions on the receipt alias ``r`` and their parameters."""
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if self.receipt_id is not None:
            clauses.append(_FIND_BY_RECEIPT)
            params["receipt_id"] = self.receipt_id
        if self.work_id is not None:
            clauses.append(_FIND_BY_WORK)
            params["work_id"] = self.work_id
        if self.provider_delivery_id is not None:
            clauses.append(_FIND_BY_DELIVERY)
            params["delivery_id"] = self.provider_delivery_id
        if self.idempotency_key is not None:
            clauses.append(_FIND_BY_IDEMPOTENCY_KEY)
            params["idempotency_key"] = self.idempotency_key
            # An event's key is its receipt's key + "#<event index>".
            base, sep, index = self.idempotency_key.rpartition("#")
            params["receipt_key"] = base if sep and index.isdigit() else self.idempotency_key
        if self.correlation is not None:
            clauses.append(_FIND_BY_CORRELATION)
            params["correlation"] = json.dumps({self.correlation[0]: self.correlation[1]})
        if self.namespace is not None:
            clauses.append("r.namespace = %(namespace)s")
            params["namespace"] = self.namespace
        if self.route_key is not None:
            clauses.append("r.route_key = %(route_key)s")
            params["route_key"] = self.route_key
        if self.receipt_status is not None:
            # A literal, so the partial routing indexes match (DESIGN §8 trap 5).
            assert self.receipt_status in RECEIPT_STATUSES
            clauses.append(f"r.router_status = '{self.receipt_status}'")
        if self.event_kind is not None:
            clauses.append(_FIND_EVENT_KIND)
            params["event_kind"] = self.event_kind
        if self.work_item_state is not None:
            assert self.work_item_state in schema.WORK_STATES
            clauses.append(_FIND_WORK_STATE.format(state=self.work_item_state))
        if self.accepted_after is not None:
            clauses.append("r.accepted_at >= %(accepted_after)s")
            params["accepted_after"] = self.accepted_after
        if self.accepted_before is not None:
            clauses.append("r.accepted_at < %(accepted_before)s")
            params["accepted_before"] = self.accepted_before
        return clauses, params


_FIND_BY_RECEIPT = "r.receipt_id = %(receipt_id)s"
# The WorkItem's event's receipt: two primary-key probes.
_FIND_BY_WORK = """r.receipt_id = (
  SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e ON e.event_id = w.event_id
  WHERE w.work_id = %(work_id)s)"""
# A delivery with a provider id has the idempotency key ``<route_key>:id:<delivery id>``
# (ingress/admission.py): one probe of the unique (namespace, idempotency_key) index per route
# known in any generation — no index of its own on the ingress' insert path.
_FIND_BY_DELIVERY = """r.provider_delivery_id = %(delivery_id)s
  AND (r.namespace, r.idempotency_key) IN (
    SELECT DISTINCT rt.namespace, rt.route_key || ':id:' || %(delivery_id)s FROM connector_route rt)"""
_FIND_BY_IDEMPOTENCY_KEY = """r.idempotency_key = %(receipt_key)s
  AND r.namespace IN (SELECT DISTINCT rt.namespace FROM connector_route rt)"""
# Correlation ids of routed deliveries: the events' (GIN ``ix_connector_event_correlation_ids``).
_FIND_BY_CORRELATION = """r.receipt_id IN (
  SELECT e.receipt_id FROM connector_event e WHERE e.correlation_ids @> %(correlation)s::jsonb)"""
_FIND_EVENT_KIND = """(r.event_kind = %(event_kind)s OR EXISTS (
  SELECT 1 FROM connector_event e WHERE e.receipt_id = r.receipt_id AND e.event_kind = %(event_kind)s))"""
_FIND_WORK_STATE = """EXISTS (
  SELECT 1 FROM connector_event e JOIN connector_work_item w ON w.event_id = e.event_id
  WHERE e.receipt_id = r.receipt_id AND w.state = '{state}')"""

# A keyed search: the candidates come from the key's index; ``{where}``: ``DeliveryFilter.where()``
# and the keyset (``r.receipt_id < %(after)s``).
RECEIPT_FIND = (
    "SELECT r.receipt_id FROM connector_ingress_receipt r WHERE {where}"
    " ORDER BY r.receipt_id DESC LIMIT %(limit)s"
)

# A search without a key: the next ``scan_limit`` receipts below the keyset (primary key, newest
# first), of which those matching ``{where}``. Always one row: how many were examined, the lowest id
# examined (where the next call resumes) and the matches.
RECEIPT_FIND_SCAN = """
WITH scan AS MATERIALIZED (
  SELECT s.receipt_id FROM connector_ingress_receipt s WHERE {bounds}
  ORDER BY s.receipt_id DESC LIMIT %(scan_limit)s
)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT min(receipt_id) FROM scan) AS scanned_min,
  ARRAY(SELECT r.receipt_id FROM connector_ingress_receipt r
        WHERE r.receipt_id IN (SELECT receipt_id FROM scan) AND {where}
        ORDER BY r.receipt_id DESC LIMIT %(limit)s) AS ids
"""

# The first receipt id accepted at or after a time: a bisection of the primary key (about 2 log2(n)
# probes), no index on the acceptance time (which the ingress would pay for on every insert).
# ``lo``/``hi`` bracket the id; a probe reads the first receipt at or above the midpoint.
RECEIPT_ID_AT = """
WITH RECURSIVE b(lo, hi) AS (
  SELECT (SELECT receipt_id FROM connector_ingress_receipt ORDER BY receipt_id LIMIT 1),
         (SELECT receipt_id FROM connector_ingress_receipt ORDER BY receipt_id DESC LIMIT 1) + 1
  UNION ALL
  SELECT CASE WHEN p.accepted_at < %(at)s THEN p.receipt_id + 1 ELSE b.lo END,
         CASE WHEN p.accepted_at < %(at)s THEN b.hi ELSE (b.lo + b.hi) / 2 END
  FROM b CROSS JOIN LATERAL (
    SELECT x.receipt_id, x.accepted_at FROM connector_ingress_receipt x
    WHERE x.receipt_id >= (b.lo + b.hi) / 2 ORDER BY x.receipt_id LIMIT 1) p
  WHERE b.lo < b.hi
)
SELECT min(hi) FROM b
"""

RECEIPT_GET_MANY = (
    f"SELECT {RECEIPT_SELECT_COLUMNS} FROM connector_ingress_receipt r"
    " WHERE r.receipt_id = ANY(%(ids)s::bigint[])"
)

# One receipt as the trace shows it: the admin columns, the routing state, the verification label
# (scheme and key reference name, never a secret or a signature; ingress/verify.py), the W3C
# traceparent of the ingress span (NULL while tracing is off), the body only
# when ``with_body``, and the database clock the trace compares against.
RECEIPT_TRACE_GET = f"""
SELECT {RECEIPT_SELECT_COLUMNS}, r.verification AS r_verification,
       r.next_attempt_at AS r_next_attempt_at, r.routed_at AS r_routed_at,
       r.claim_owner AS r_claim_owner, r.lease_until AS r_lease_until, r.traceparent AS r_traceparent,
       CASE WHEN %(with_body)s THEN r.body END AS r_body, clock_timestamp() AS db_now
FROM connector_ingress_receipt r WHERE r.receipt_id = %(receipt_id)s
"""


async def receipt_find(conn: Conn, flt: DeliveryFilter, *, after: int | None, limit: int) -> list[int]:
    """Receipt ids of a keyed search (``flt.keyed``) below ``after``, newest first."""
    clauses, params = flt.where()
    if after is not None:
        clauses.append("r.receipt_id < %(after)s")
        params["after"] = after
    params["limit"] = limit
    cur = await conn.execute(RECEIPT_FIND.format(where=" AND ".join(clauses)), params)
    return [int(r[0]) for r in await cur.fetchall()]


@dataclass(frozen=True, slots=True)
class ScanPage:
    ids: list[int]
    scanned: int
    #: The lowest receipt id examined (the next call resumes below it); None when none was.
    scanned_min: int | None


async def receipt_find_scan(
    conn: Conn,
    flt: DeliveryFilter,
    *,
    after: int | None,
    id_range: tuple[int | None, int | None],
    limit: int,
    scan_limit: int = FIND_SCAN_LIMIT,
) -> ScanPage:
    """A search without a key: examine up to ``scan_limit`` receipts below ``after`` (within
    ``id_range`` = [low, high)), newest first; the matches among them, at most ``limit``."""
    clauses, params = flt.where()
    bounds: list[str] = []
    if after is not None:
        bounds.append("s.receipt_id < %(after)s")
        params["after"] = after
    low, high = id_range
    if low is not None:
        bounds.append("s.receipt_id >= %(id_low)s")
        params["id_low"] = low
    if high is not None:
        bounds.append("s.receipt_id < %(id_high)s")
        params["id_high"] = high
    params.update(limit=limit, scan_limit=scan_limit)
    statement = RECEIPT_FIND_SCAN.format(
        bounds=" AND ".join(bounds) or "true", where=" AND ".join(clauses) or "true"
    )
    row = await fetch_dict(conn, statement, params)
    assert row is not None
    return ScanPage(
        [int(i) for i in row["ids"] or ()],
        int(row["scanned"]),
        int(row["scanned_min"]) if row["scanned_min"] is not None else None,
    )


async def receipt_id_at(conn: Conn, at: datetime) -> int | None:
    """The lowest receipt id accepted at or after ``at`` as far as id order tells (one above the
    highest id when none is; ``None`` without receipts)."""
    cur = await conn.execute(RECEIPT_ID_AT, {"at": at})
    row = await cur.fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None


async def receipt_get_many(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    rows = await fetch_dicts(conn, RECEIPT_GET_MANY, {"ids": list(ids)})
    return {int(r["r_receipt_id"]): r for r in rows}


async def receipt_trace_get(conn: Conn, receipt_id: int, *, with_body: bool) -> dict[str, Any] | None:
    return await fetch_dict(conn, RECEIPT_TRACE_GET, {"receipt_id": receipt_id, "with_body": with_body})
