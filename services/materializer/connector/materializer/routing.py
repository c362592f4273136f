"""The materializer's statements, named noun-first (STYLE.md), and their repository functions.

Every write back to a claimed receipt is fenced by its ``claim_token`` (incremented by each claim):
a holder whose lease expired and was re-claimed writes nothing. Multi-row statements take parallel
arrays through ``unnest`` (one statement per batch, never one per row), sent in binary (``%(x)b``:
measured ~40 % cheaper than text arrays for a 768-row WorkItem batch). State literals are inlined so
plans use the partial indexes (DESIGN §8 trap 5); the candidate read uses ``now()``, the lease uses
``clock_timestamp()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from connector.common.lanes import LANE_HOLDING_PREDICATE, Lane
from connector.common.packs import canonical_json
from connector.common.schema import CHANNEL_WORK
from connector.materializer.extract import EventDraft, ReceiptRow

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
          r.body_ref IS NOT NULL
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

# Pack rows and claim authority of the batch's namespaces, share-locked for the transaction: an
# activation or a cutover waits for the batch, and the batch sees one consistent snapshot.
PACK_ACTIVE_CHECK = """
SELECT p.namespace, p.installed_pack_id, p.incarnation, p.active_generation, a.claim_path, a.phase
FROM connector_installed_pack p
JOIN connector_claim_authority a
  ON a.installed_pack_id = p.installed_pack_id AND a.generation = p.active_generation
WHERE p.namespace = ANY(%(namespaces)b::text[])
FOR SHARE OF p, a
"""

EVENT_ID_RESERVE = (
    "SELECT nextval(pg_get_serial_sequence('connector_event', 'event_id')) FROM generate_series(1, %(n)s)"
)

_EVENT_COLUMNS = (
    ("event_id", "int8"), ("receipt_id", "int8"), ("installed_pack_id", "int8"), ("generation", "int4"),
    ("incarnation", "int4"), ("route_id", "int8"), ("route_version", "int4"), ("namespace", "text"),
    ("event_kind", "text"), ("source_object_kind", "text"), ("source_object_id", "text"),
    ("idempotency_key", "text"), ("delivery_seq", "int8"), ("payload_sha256", "bytea"),
    ("companion", "text"), ("correlation_ids", "text"), ("execution_owner", "text"),
    ("legacy_state", "text"),
)  # fmt: skip

EVENT_INSERT_BATCH = f"""
INSERT INTO connector_event ({", ".join(c for c, _ in _EVENT_COLUMNS)}, event_index, parse_outcome)
SELECT {", ".join(f"{c}::jsonb" if c in ("companion", "correlation_ids") else c for c, _ in _EVENT_COLUMNS)},
       0, 'ok'
FROM unnest({", ".join(f"%({c})b::{t}[]" for c, t in _EVENT_COLUMNS)})
  AS e({", ".join(c for c, _ in _EVENT_COLUMNS)})
"""

_WORK_COLUMNS = (
    ("event_id", "int8"), ("installed_pack_id", "int8"), ("generation", "int4"), ("work_type", "text"),
    ("queue_class", "text"), ("state", "text"), ("priority", "int2"), ("max_attempts", "int4"),
    ("delivery_seq", "int8"), ("source_lane_key", "text"), ("target_mutation_lane_key", "text"),
    ("dead_blocks_lane", "bool"),
)  # fmt: skip

# Rows go in (delivery_seq, fan-out order), so work_id order agrees with lane order. Priority is a
# bounded head start: run_after = now() - priority seconds (docs/adr/004-materializer.md).
WORK_ITEM_INSERT_BATCH = f"""
INSERT INTO connector_work_item ({", ".join(c for c, _ in _WORK_COLUMNS)}, run_after)
SELECT {", ".join(c for c, _ in _WORK_COLUMNS)}, now() - make_interval(secs => priority)
FROM unnest({", ".join(f"%({c})b::{t}[]" for c, t in _WORK_COLUMNS)})
  WITH ORDINALITY AS w({", ".join(c for c, _ in _WORK_COLUMNS)}, ord)
ORDER BY ord
ON CONFLICT (event_id, work_type) DO NOTHING
"""

_HOLD_W = LANE_HOLDING_PREDICATE.replace("state", "w.state").replace("dead_blocks_lane", "w.dead_blocks_lane")

# For each lane a batch adds members to (with the smallest new delivery_seq): is its first holding
# member *later*, and ready (it must go back to blocked: demote) or already started (an inversion)?
WORK_ITEM_LANE_OVERTAKEN = f"""
WITH n AS (
  SELECT * FROM unnest(%(packs)b::bigint[], %(kinds)b::text[], %(keys)b::text[], %(seqs)b::bigint[])
    AS n(pack, kind, key, seq)
), firsts AS (
  SELECT n.seq, f.state, f.delivery_seq FROM n CROSS JOIN LATERAL (
    SELECT w.state, w.delivery_seq FROM connector_work_item w
    WHERE n.kind = 's' AND w.installed_pack_id = n.pack AND w.source_lane_key = n.key AND {_HOLD_W}
    ORDER BY w.delivery_seq, w.work_id LIMIT 1) f
  UNION ALL
  SELECT n.seq, f.state, f.delivery_seq FROM n CROSS JOIN LATERAL (
    SELECT w.state, w.delivery_seq FROM connector_work_item w
    WHERE n.kind = 't' AND w.installed_pack_id = n.pack AND w.target_mutation_lane_key = n.key AND {_HOLD_W}
    ORDER BY w.delivery_seq, w.work_id LIMIT 1) f
)
SELECT count(*) FILTER (WHERE state IN ('pending', 'retry')),
       count(*) FILTER (WHERE state = 'processing')
FROM firsts WHERE delivery_seq > seq
"""

WORK_NOTIFY = f"SELECT pg_notify('{CHANNEL_WORK}', '')"


# --------------------------------------------------------------------------------------------------
# Repository functions (named after their statements)
# --------------------------------------------------------------------------------------------------


def _columns(spec: Sequence[tuple[str, str]], rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Row tuples → one list per column (the ``unnest`` parameters)."""
    transposed = list(zip(*rows, strict=True)) if rows else [() for _ in spec]
    return {name: list(col) for (name, _), col in zip(spec, transposed, strict=True)}


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


async def pack_active_check(
    conn: AsyncConnection[Any], namespaces: Iterable[str]
) -> dict[str, tuple[Any, ...]]:
    """Share-lock the packs (and claim authorities) of ``namespaces``; their current snapshots."""
    cur = await conn.execute(PACK_ACTIVE_CHECK, {"namespaces": sorted(set(namespaces))}, prepare=True)
    return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), r[4], r[5]) for r in await cur.fetchall()}


async def event_id_reserve(conn: AsyncConnection[Any], n: int) -> list[int]:
    if n <= 0:
        return []
    cur = await conn.execute(EVENT_ID_RESERVE, {"n": n}, prepare=True)
    return [int(r[0]) for r in await cur.fetchall()]


async def event_insert_batch(
    conn: AsyncConnection[Any], drafts: Sequence[EventDraft], event_ids: Mapping[int, int]
) -> int:
    """Insert the events of ``drafts`` (event ids reserved, keyed by receipt id)."""
    if not drafts:
        return 0
    rows = [
        (
            event_ids[d.receipt.receipt_id],
            d.receipt.receipt_id,
            d.pack.installed_pack_id,
            d.pack.generation,
            d.pack.incarnation,
            d.route.route_id,
            d.route.route_version,
            d.receipt.namespace,
            d.event_kind,
            d.source_object_kind,
            d.source_object_id,
            f"{d.receipt.idempotency_key}#0",
            d.receipt.receipt_id,
            d.receipt.payload_sha256,
            canonical_json(dict(d.companion)),
            canonical_json(dict(d.correlation_ids)),
            "legacy_event" if d.legacy_owned else "work_item",
            "pending" if d.legacy_owned else None,
        )
        for d in drafts
    ]
    cols = _columns(_EVENT_COLUMNS, rows)
    cur = await conn.execute(EVENT_INSERT_BATCH, cols, prepare=True)
    return cur.rowcount


@dataclass(frozen=True, slots=True)
class WorkRow:
    event_id: int
    installed_pack_id: int
    generation: int
    work_type: str
    queue_class: str
    priority: int
    max_attempts: int
    delivery_seq: int
    source_lane_key: str | None
    target_lane_key: str | None
    dead_blocks_lane: bool

    @property
    def lanes(self) -> list[Lane]:
        out: list[Lane] = []
        if self.source_lane_key is not None:
            out.append((self.installed_pack_id, "s", self.source_lane_key))
        if self.target_lane_key is not None:
            out.append((self.installed_pack_id, "t", self.target_lane_key))
        return out


def work_rows(drafts: Sequence[EventDraft], event_ids: Mapping[int, int]) -> list[WorkRow]:
    rows: list[WorkRow] = []
    for d in sorted(drafts, key=lambda d: d.receipt.receipt_id):
        for w in d.work:
            rows.append(
                WorkRow(
                    event_id=event_ids[d.receipt.receipt_id],
                    installed_pack_id=d.pack.installed_pack_id,
                    generation=d.pack.generation,
                    work_type=w.work_type,
                    queue_class=w.queue_class,
                    priority=w.priority,
                    max_attempts=w.max_attempts,
                    delivery_seq=d.receipt.receipt_id,
                    source_lane_key=w.source_lane_key,
                    target_lane_key=w.target_lane_key,
                    dead_blocks_lane=w.dead_blocks_lane,
                )
            )
    return rows


async def work_item_insert_batch(conn: AsyncConnection[Any], rows: Sequence[WorkRow]) -> int:
    """Insert WorkItems (conflicts on ``(event_id, work_type)`` ignored); lane members go in
    ``blocked`` — the lane settle that follows promotes the runnable ones."""
    if not rows:
        return 0
    values = [
        (
            w.event_id,
            w.installed_pack_id,
            w.generation,
            w.work_type,
            w.queue_class,
            "blocked" if w.source_lane_key is not None or w.target_lane_key is not None else "pending",
            w.priority,
            w.max_attempts,
            w.delivery_seq,
            w.source_lane_key,
            w.target_lane_key,
            w.dead_blocks_lane,
        )
        for w in rows
    ]
    cols = _columns(_WORK_COLUMNS, values)
    cur = await conn.execute(WORK_ITEM_INSERT_BATCH, cols, prepare=True)
    return cur.rowcount


async def work_item_lane_overtaken(conn: AsyncConnection[Any], rows: Sequence[WorkRow]) -> tuple[int, int]:
    """(lanes whose later first member is ready → demote, lanes whose later member already started)."""
    first_seq: dict[Lane, int] = {}
    for w in rows:
        for lane in w.lanes:
            if lane not in first_seq or w.delivery_seq < first_seq[lane]:
                first_seq[lane] = w.delivery_seq
    if not first_seq:
        return 0, 0
    lanes = sorted(first_seq)
    cur = await conn.execute(
        WORK_ITEM_LANE_OVERTAKEN,
        {
            "packs": [lane[0] for lane in lanes],
            "kinds": [lane[1] for lane in lanes],
            "keys": [lane[2] for lane in lanes],
            "seqs": [first_seq[lane] for lane in lanes],
        },
        prepare=True,
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def work_notify(conn: AsyncConnection[Any]) -> None:
    await conn.execute(WORK_NOTIFY, prepare=True)
