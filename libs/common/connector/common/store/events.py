"""Every statement on ``connector_event``'s fact columns (DESIGN §2: the materializer inserts events;
their fact columns are immutable, enforced by a trigger). The legacy-compatibility columns' Event
claim path lives in store/legacy.py; retention's delete of whole deliveries in store/deliveries.py.

Inserts are multi-row ``unnest`` statements with binary arrays (one per batch, ADR 004); event ids
are reserved before the batch transaction so receipts and events can be written in one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]

EVENT_ID_RESERVE = (
    "SELECT nextval(pg_get_serial_sequence('connector_event', 'event_id')) FROM generate_series(1, %(n)s)"
)

EVENT_COLUMNS = (
    ("event_id", "int8"), ("receipt_id", "int8"), ("installed_pack_id", "int8"), ("generation", "int4"),
    ("incarnation", "int4"), ("route_id", "int8"), ("route_version", "int4"), ("namespace", "text"),
    ("event_kind", "text"), ("source_object_kind", "text"), ("source_object_id", "text"),
    ("idempotency_key", "text"), ("delivery_seq", "int8"), ("payload_sha256", "bytea"),
    ("companion", "text"), ("correlation_ids", "text"), ("execution_owner", "text"),
    ("legacy_state", "text"),
)  # fmt: skip

# The admin API's event row: every fact column a reader may see, each aliased ``e_<column>`` so it
# can share a row with a WorkItem's and a receipt's (``connector.executor.admin.convert.event``
# reads these names). Not ``EVENT_COLUMNS``, the insert's (column, type) list: this one adds
# ``parse_outcome`` and ``created_at`` and leaves out the companion and the legacy columns.
EVENT_SELECT_COLUMNS = """
  e.event_id AS e_event_id, e.receipt_id AS e_receipt_id, e.installed_pack_id AS e_installed_pack_id,
  e.generation AS e_generation, e.incarnation AS e_incarnation, e.route_id AS e_route_id,
  e.route_version AS e_route_version, e.namespace AS e_namespace, e.event_kind AS e_event_kind,
  e.source_object_kind AS e_source_object_kind, e.source_object_id AS e_source_object_id,
  e.idempotency_key AS e_idempotency_key, e.delivery_seq AS e_delivery_seq,
  e.payload_sha256 AS e_payload_sha256, e.parse_outcome AS e_parse_outcome,
  e.correlation_ids AS e_correlation_ids, e.created_at AS e_created_at"""

EVENT_INSERT_BATCH = f"""
INSERT INTO connector_event ({", ".join(c for c, _ in EVENT_COLUMNS)}, event_index, parse_outcome)
SELECT {", ".join(f"{c}::jsonb" if c in ("companion", "correlation_ids") else c for c, _ in EVENT_COLUMNS)},
       0, 'ok'
FROM unnest({", ".join(f"%({c})b::{t}[]" for c, t in EVENT_COLUMNS)})
  AS e({", ".join(c for c, _ in EVENT_COLUMNS)})
"""

# --------------------------------------------------------------------------------------------------
# Backfill: events of a generation that have no WorkItem yet (docs/cutover.md, "Migration")
# --------------------------------------------------------------------------------------------------

_ELIGIBLE = """
  a.phase IN ('quiescing', 'work_item_active')
  AND (e.legacy_state IS NULL OR e.legacy_state IN ('pending', 'retry'))
  AND NOT EXISTS (SELECT 1 FROM connector_work_item w
                  WHERE w.event_id = e.event_id AND w.state <> 'reconciled_legacy_terminal')
"""
_SCOPE = """
  (%(pack)s::bigint IS NULL OR e.installed_pack_id = %(pack)s)
  AND (%(generation)s::int IS NULL OR e.generation = %(generation)s)
"""

EVENT_LIST_BACKFILL_CANDIDATES = f"""
SELECT e.event_id, e.receipt_id, e.installed_pack_id, e.generation, e.incarnation, e.route_id,
       e.delivery_seq, e.namespace, r.route_key, r.idempotency_key, r.event_kind, r.provider_delivery_id,
       r.correlation_ids, r.payload_sha256, r.body, r.body_ref IS NOT NULL AS has_body_ref,
       r.traceparent, extract(epoch FROM r.accepted_at)::float8 AS accepted_at
FROM connector_event e
JOIN connector_claim_authority a ON a.installed_pack_id = e.installed_pack_id AND a.generation = e.generation
JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
WHERE e.event_id > %(after)s AND {_SCOPE} AND {_ELIGIBLE}
ORDER BY e.event_id
LIMIT %(limit)s
"""

# Events without WorkItems that backfill leaves alone, by reason (operator report).
EVENT_COUNT_BACKFILL_INELIGIBLE = f"""
SELECT CASE
         WHEN a.phase IS NULL THEN 'no_claim_authority'
         WHEN a.phase NOT IN ('quiescing', 'work_item_active') THEN 'generation_' || a.phase
         WHEN e.legacy_state = 'processing' THEN 'legacy_in_flight'
         WHEN e.legacy_state = 'unknown' THEN 'legacy_outcome_unknown'
         ELSE 'legacy_terminal'
       END AS reason,
       count(*)
FROM connector_event e
LEFT JOIN connector_claim_authority a
  ON a.installed_pack_id = e.installed_pack_id AND a.generation = e.generation
WHERE {_SCOPE}
  AND NOT EXISTS (SELECT 1 FROM connector_work_item w
                  WHERE w.event_id = e.event_id AND w.state <> 'reconciled_legacy_terminal')
  AND NOT (coalesce(a.phase IN ('quiescing', 'work_item_active'), false)
           AND (e.legacy_state IS NULL OR e.legacy_state IN ('pending', 'retry')))
GROUP BY 1 ORDER BY 1
"""


def unnest_columns(spec: Sequence[tuple[str, str]], rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Row tuples → one list per column (the ``unnest`` parameters)."""
    transposed = list(zip(*rows, strict=True)) if rows else [() for _ in spec]
    return {name: list(col) for (name, _), col in zip(spec, transposed, strict=True)}


async def event_id_reserve(conn: Conn, n: int) -> list[int]:
    if n <= 0:
        return []
    cur = await conn.execute(EVENT_ID_RESERVE, {"n": n}, prepare=True)
    return [int(r[0]) for r in await cur.fetchall()]


async def event_insert_batch(conn: Conn, rows: Sequence[tuple[Any, ...]]) -> int:
    """Insert events; ``rows`` are tuples in ``EVENT_COLUMNS`` order (ids reserved)."""
    if not rows:
        return 0
    cur = await conn.execute(EVENT_INSERT_BATCH, unnest_columns(EVENT_COLUMNS, rows), prepare=True)
    return cur.rowcount


async def event_list_backfill_candidates(
    conn: Conn, scope: dict[str, Any], *, after: int, limit: int
) -> list[dict[str, Any]]:
    """Eligible events after ``after`` in event order, with their receipt's envelope and body."""
    return await fetch_dicts(conn, EVENT_LIST_BACKFILL_CANDIDATES, {**scope, "after": after, "limit": limit})


async def event_count_backfill_ineligible(conn: Conn, scope: dict[str, Any]) -> dict[str, int]:
    cur = await conn.execute(EVENT_COUNT_BACKFILL_INELIGIBLE, scope)
    return {str(reason): int(n) for reason, n in await cur.fetchall()}


# --------------------------------------------------------------------------------------------------
# Pack install: what the install receipt of a new generation proves (connector.common.packs.install)
# --------------------------------------------------------------------------------------------------

EVENT_COUNT_GENERATION = """
SELECT count(*) AS events,
       count(*) FILTER (WHERE execution_owner = 'legacy_event'
                        AND legacy_state IN ('pending', 'processing', 'retry')) AS legacy_active
FROM connector_event WHERE installed_pack_id = %(id)s AND generation = %(generation)s
"""


async def event_count_generation(conn: Conn, pack: int, generation: int) -> tuple[int, int]:
    """``(events of the generation, of them legacy-owned and not finished)``."""
    row = await fetch_dict(conn, EVENT_COUNT_GENERATION, {"id": pack, "generation": generation})
    assert row is not None
    return int(row["events"]), int(row["legacy_active"])


# --------------------------------------------------------------------------------------------------
# The admin API: the events of found or traced deliveries (one statement per page or trace)
# --------------------------------------------------------------------------------------------------

# Events of the given receipts, in receipt and event order: ``uq_connector_event_receipt_id_event_index``.
# With the claim path that owns each one (and the legacy path's state of a legacy-owned event).
EVENT_LIST_BY_RECEIPTS = f"""
SELECT {EVENT_SELECT_COLUMNS}, e.execution_owner AS e_execution_owner, e.legacy_state AS e_legacy_state
FROM connector_event e WHERE e.receipt_id = ANY(%(ids)s::bigint[])
ORDER BY e.receipt_id, e.event_index
"""


async def event_list_by_receipts(conn: Conn, receipt_ids: Sequence[int]) -> list[dict[str, Any]]:
    if not receipt_ids:
        return []
    return await fetch_dicts(conn, EVENT_LIST_BY_RECEIPTS, {"ids": list(receipt_ids)})
