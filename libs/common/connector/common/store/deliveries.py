"""Every statement whose unit is a whole delivery — one ingress receipt, its events and their
WorkItems — rather than one table: retention's classification and delete of retired deliveries
(ADR 009).

Why one module across three tables: the retirement rule is one predicate over the receipt, its
events and WorkItems (and the legacy outcome receipts that pin them); the classification computes it
and each delete repeats its own part of it, so a row that changed in between stays and the foreign
keys refuse the rest of the delivery. Correctness depends on reading the four statements together
and running them in one transaction in foreign-key order (WorkItems, events, receipt); split over
the three table modules the rule would exist in four places nobody reads side by side. The caller
(``connector.common.maintenance.retention``) owns the transaction and the lock.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from psycopg import AsyncConnection

Conn = AsyncConnection[Any]

# One chunk of receipts in primary-key order, each with its verdict: NULL keep_reason = retired.
# The per-receipt lateral runs only for old materialized receipts (a one-time filter), and every
# probe is an index lookup: events by (receipt_id, event_index), WorkItems by (event_id, work_type),
# legacy outcome receipts by (event_id, work_type, version). One row per (event, WorkItem) is
# aggregated per receipt; ``work_ids`` / ``event_ids`` are what the chunk's deletes look up by key.
RECEIPT_CHUNK_CLASSIFY = """
WITH chunk AS MATERIALIZED (
  SELECT r.receipt_id, r.router_status, r.accepted_at
  FROM connector_ingress_receipt r
  WHERE r.receipt_id > %(after)s::bigint
  ORDER BY r.receipt_id
  LIMIT %(batch)s::int
)
SELECT c.receipt_id,
       c.accepted_at < %(cutoff)s::timestamptz AS old,
       CASE
         WHEN c.accepted_at >= %(cutoff)s::timestamptz THEN 'young'
         WHEN c.router_status <> 'materialized' THEN 'not_materialized'
         WHEN d.legacy_owned THEN 'legacy_owned'
         WHEN d.legacy_history THEN 'legacy_history'
         WHEN d.legacy_outcome THEN 'legacy_outcome'
         WHEN d.dead THEN 'dead_letter'
         WHEN d.unfinished THEN 'unfinished'
         WHEN d.fenced THEN 'rollback_fenced'
         WHEN d.no_work_item THEN 'no_work_item'
       END AS keep_reason,
       coalesce(d.event_ids, '{}') AS event_ids,
       coalesce(d.work_ids, '{}') AS work_ids
FROM chunk c
LEFT JOIN LATERAL (
  SELECT array_agg(DISTINCT e.event_id) AS event_ids,
         array_agg(x.work_id) FILTER (WHERE x.work_id IS NOT NULL) AS work_ids,
         bool_or(e.execution_owner <> 'work_item') AS legacy_owned,
         bool_or(e.legacy_state IS NOT NULL) AS legacy_history,
         bool_or(EXISTS (SELECT 1 FROM connector_legacy_outcome_receipt l
                         WHERE l.event_id = e.event_id)) AS legacy_outcome,
         bool_or(x.state = 'dead') AS dead,
         bool_or(x.state NOT IN ('succeeded', 'cancelled', 'coalesced')) AS unfinished,
         bool_or(x.rollback_execution_fence_id IS NOT NULL
                 OR x.legacy_outcome_receipt_version IS NOT NULL) AS fenced,
         bool_or(x.work_id IS NULL) AS no_work_item
  FROM connector_event e
  LEFT JOIN connector_work_item x ON x.event_id = e.event_id
  WHERE e.receipt_id = c.receipt_id
    AND c.accepted_at < %(cutoff)s::timestamptz AND c.router_status = 'materialized'
) d ON true
ORDER BY c.receipt_id
"""

# The deletes of one chunk, by key, in foreign-key order. The ids are looked up one by one: an
# ``ANY(ARRAY(subquery))`` has no length the planner can see (it assumes a few elements), so it is
# never planned as a sequential scan of a table it takes for small (a literal array of ~1,000 ids
# was: 50k WorkItems, 8 ms instead of 1.3 ms per chunk, growing with the table). Each statement
# repeats its part of the predicate: a row that changed since the classification stays, and a
# WorkItem that appeared since is not in the list; the next delete then fails on the foreign key
# (the chunk rolls back) instead of deleting part of a delivery.
#
# A WorkItem's ended attempts (``connector_work_attempt``, no foreign key) go with it, in the same
# statement: a data-modifying CTE deletes those of the WorkItems actually deleted (most have none:
# one primary-key probe each). The result is the number of WorkItems deleted.
WORK_ITEM_DELETE_RETIRED = """
WITH d AS (
  DELETE FROM connector_work_item
  WHERE work_id = ANY(ARRAY(SELECT unnest(%(work_ids)s::bigint[])))
    AND state IN ('succeeded', 'cancelled', 'coalesced')
    AND rollback_execution_fence_id IS NULL AND legacy_outcome_receipt_version IS NULL
  RETURNING work_id
), a AS (
  DELETE FROM connector_work_attempt a WHERE a.work_id = ANY(ARRAY(SELECT d.work_id FROM d))
)
SELECT count(*) FROM d
"""
EVENT_DELETE_RETIRED = """
DELETE FROM connector_event
WHERE event_id = ANY(ARRAY(SELECT unnest(%(event_ids)s::bigint[])))
  AND execution_owner = 'work_item' AND legacy_state IS NULL
"""
RECEIPT_DELETE_RETIRED = """
DELETE FROM connector_ingress_receipt
WHERE receipt_id = ANY(ARRAY(SELECT unnest(%(receipt_ids)s::bigint[])))
  AND router_status = 'materialized' AND accepted_at < %(cutoff)s::timestamptz
"""


async def receipt_chunk_classify(
    conn: Conn, after: int, batch: int, cutoff: dt.datetime | None
) -> list[tuple[Any, ...]]:
    """Rows (receipt_id, old, keep_reason, event_ids, work_ids) of the chunk after ``after``."""
    cur = await conn.execute(RECEIPT_CHUNK_CLASSIFY, {"after": after, "batch": batch, "cutoff": cutoff})
    return await cur.fetchall()


async def work_item_delete_retired(conn: Conn, work_ids: list[int]) -> int:
    row = await (await conn.execute(WORK_ITEM_DELETE_RETIRED, {"work_ids": work_ids})).fetchone()
    return int(row[0]) if row else 0


async def event_delete_retired(conn: Conn, event_ids: list[int]) -> int:
    return (await conn.execute(EVENT_DELETE_RETIRED, {"event_ids": event_ids})).rowcount


async def receipt_delete_retired(conn: Conn, receipt_ids: list[int], cutoff: dt.datetime | None) -> int:
    cur = await conn.execute(RECEIPT_DELETE_RETIRED, {"receipt_ids": receipt_ids, "cutoff": cutoff})
    return cur.rowcount
