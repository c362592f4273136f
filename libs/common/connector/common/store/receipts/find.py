"""Finding deliveries (FindDeliveries) and tracing one (TraceDelivery): keyed and scanning searches
over receipts, the receipt at a time, and one receipt as the trace shows it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from connector.common.store import vocabulary
from connector.common.store.receipts.admin import RECEIPT_SELECT_COLUMNS
from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]

# --------------------------------------------------------------------------------------------------
# The admin API: finding deliveries (FindDeliveries) and tracing one (TraceDelivery). A delivery is
# a receipt with its events and WorkItems; the search is driven from the receipt, newest first,
# keyset on receipt_id. docs/admin.md, "Find" and "Trace".
# --------------------------------------------------------------------------------------------------

#: Receipt routing states a find may filter on.
RECEIPT_STATUSES = vocabulary.RECEIPT_STATES
#: Receipt origins a find may filter on (``webhook``: the column is NULL).
RECEIPT_ORIGINS = ("webhook", *vocabulary.RECEIPT_ORIGINS)
#: A scan without a key examines at most this many receipts per call (its page may be short).
FIND_SCAN_LIMIT = 5000
#: ... and this many when a filter looks into each receipt's events or WorkItems (event kind,
#: WorkItem state): ~10 index probes per receipt instead of one, so ~the same cost per call (the
#: console's "dead in the last day" took 150-290 ms at 1M rows on a loaded machine with 5,000).
FIND_SCAN_LIMIT_JOINED = 1000
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
    #: How the receipt came: ``webhook`` or ``reconciled`` (docs/reconcile.md).
    origin: str | None = None
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
            "origin": self.origin,
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
        if self.origin is not None:
            # A literal per value (a webhook's origin is NULL: no byte on its row).
            assert self.origin in RECEIPT_ORIGINS
            clauses.append("r.origin IS NULL" if self.origin == "webhook" else f"r.origin = '{self.origin}'")
        if self.receipt_status is not None:
            # A literal, so the partial routing indexes match (DESIGN §8 trap 5).
            assert self.receipt_status in RECEIPT_STATUSES
            clauses.append(f"r.router_status = '{self.receipt_status}'")
        if self.event_kind is not None:
            clauses.append(_FIND_EVENT_KIND)
            params["event_kind"] = self.event_kind
        if self.work_item_state is not None:
            assert self.work_item_state in vocabulary.WORK_STATES
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
# Correlation ids of routed deliveries: the events' (GIN ``ix_connector_event_correlation_ids``,
# partial: events with ids only; the filter names one id, so ``<> '{}'`` changes no answer and lets
# the planner use the partial index).
_FIND_BY_CORRELATION = """r.receipt_id IN (
  SELECT e.receipt_id FROM connector_event e
  WHERE e.correlation_ids @> %(correlation)s::jsonb AND e.correlation_ids <> '{}'::jsonb)"""
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


def find_scan_limit(flt: DeliveryFilter) -> int:
    """Receipts a scan without a key examines per call under ``flt``."""
    joined = flt.event_kind is not None or flt.work_item_state is not None
    return FIND_SCAN_LIMIT_JOINED if joined else FIND_SCAN_LIMIT


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
