"""The cutover gates' reads over a generation's WorkItems, gate 4's rollback fence and the projection
of legacy outcome receipts onto WorkItems (docs/cutover.md, ADR 007)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]

# ------------------------------------------------------------------------------------------------
# The cutover gates over a whole generation (docs/cutover.md; called under the authority lock)
# ------------------------------------------------------------------------------------------------

# Unfinished WorkItems of the generation, per state (one range of the (pack, generation, state)
# index each), with started attempts, expired leases and cross-generation events.
WORK_ITEM_OPEN_COUNTS = """
SELECT s.state, count(w.work_id)::bigint AS n,
       count(w.work_id) FILTER (WHERE w.attempts > 0)::bigint AS started,
       count(w.work_id) FILTER (WHERE w.lease_until < clock_timestamp())::bigint AS expired,
       count(w.work_id) FILTER (WHERE e.generation <> w.generation)::bigint AS cross_generation
FROM (VALUES ('pending'), ('blocked'), ('processing'), ('retry'), ('awaiting_legacy_outcome'),
             ('dead')) AS s(state)
LEFT JOIN connector_work_item w
  ON w.installed_pack_id = %(pack)s AND w.generation = %(generation)s AND w.state = s.state
     AND w.state <> 'succeeded'  -- lets the planner use the partial (pack, generation, state) index
LEFT JOIN connector_event e ON e.event_id = w.event_id
GROUP BY s.state
"""

WORK_ITEM_STARTED_SAMPLE = """
SELECT work_id FROM connector_work_item
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s
  AND state IN ('pending', 'blocked', 'retry', 'processing') AND attempts > 0
ORDER BY work_id LIMIT 10
"""

WORK_ITEM_AWAITING_SPLIT = """
SELECT count(*) FILTER (WHERE w.legacy_outcome_receipt_version IS NOT NULL)::bigint AS unknown,
       count(*) FILTER (WHERE w.legacy_outcome_receipt_version IS NULL)::bigint AS awaiting,
       coalesce((array_agg(w.work_id ORDER BY w.work_id))[1:10], '{}') AS sample
FROM connector_work_item w
WHERE w.installed_pack_id = %(pack)s AND w.generation = %(generation)s
  AND w.state = 'awaiting_legacy_outcome'
"""

WORK_ITEM_RECONCILED_COUNT = """
SELECT count(*)::bigint FROM connector_work_item
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s AND state = 'reconciled_legacy_terminal'
"""

# An unfinished member is *held by a dead lane head* when an earlier member of its source or target
# lane is dead and, by the route's policy, keeps holding the lane. It cannot run on any path until the
# head is replayed (a WorkItem-path operation), so the fence leaves it blocked on the WorkItem path.
_HELD_BY_DEAD_HEAD = """(
  (w.source_lane_key IS NOT NULL AND EXISTS (
     SELECT 1 FROM connector_work_item d
     WHERE d.installed_pack_id = w.installed_pack_id AND d.source_lane_key = w.source_lane_key
       AND d.state = 'dead' AND d.dead_blocks_lane
       AND (d.delivery_seq, d.work_id) < (w.delivery_seq, w.work_id)))
  OR (w.target_mutation_lane_key IS NOT NULL AND EXISTS (
     SELECT 1 FROM connector_work_item d
     WHERE d.installed_pack_id = w.installed_pack_id
       AND d.target_mutation_lane_key = w.target_mutation_lane_key
       AND d.state = 'dead' AND d.dead_blocks_lane
       AND (d.delivery_seq, d.work_id) < (w.delivery_seq, w.work_id))))"""

WORK_ITEM_FENCE_PLAN = f"""
SELECT count(*) FILTER (WHERE NOT {_HELD_BY_DEAD_HEAD})::bigint AS fenceable,
       count(*) FILTER (WHERE {_HELD_BY_DEAD_HEAD})::bigint AS held_by_dead_head
FROM connector_work_item w
WHERE w.installed_pack_id = %(pack)s AND w.generation = %(generation)s
  AND w.state IN ('pending', 'blocked', 'retry') AND w.attempts = 0
"""

# Gate 4's fence: every unstarted unfinished WorkItem becomes non-executable awaiting the legacy
# outcome, and its Event is handed to the legacy path (an Event already waiting there keeps its
# legacy state and attempts).
WORK_ITEM_ROLLBACK_FENCE = f"""
WITH fenced AS (
  UPDATE connector_work_item w
  SET state = 'awaiting_legacy_outcome', rollback_execution_fence_id = %(fence_id)s,
      updated_at = clock_timestamp()
  WHERE w.installed_pack_id = %(pack)s AND w.generation = %(generation)s
    AND w.state IN ('pending', 'blocked', 'retry') AND w.attempts = 0
    AND NOT {_HELD_BY_DEAD_HEAD}
  RETURNING w.work_id, w.event_id
), events AS (
  UPDATE connector_event e
  SET execution_owner = 'legacy_event',
      legacy_state = CASE WHEN e.legacy_state IN ('pending', 'retry') THEN e.legacy_state ELSE 'pending' END,
      legacy_attempts = CASE WHEN e.legacy_state IN ('pending', 'retry') THEN e.legacy_attempts ELSE 0 END,
      legacy_run_after = CASE WHEN e.legacy_state IN ('pending', 'retry') THEN e.legacy_run_after END,
      legacy_lease_owner = NULL, legacy_lease_until = NULL
  WHERE e.event_id IN (SELECT event_id FROM fenced)
  RETURNING e.event_id
)
SELECT (SELECT count(*) FROM fenced)::bigint,
       (SELECT count(*) FROM events)::bigint,
       (SELECT encode(sha256(convert_to(coalesce(string_agg(work_id::text, ',' ORDER BY work_id), ''),
                                        'UTF8')), 'hex') FROM fenced),
       (SELECT min(work_id) FROM fenced),
       (SELECT max(work_id) FROM fenced)
"""


async def work_item_open_counts(conn: Conn, params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Unfinished WorkItems of the generation per state: ``n``, ``started``, ``expired``,
    ``cross_generation``."""
    return {str(r["state"]): r for r in await fetch_dicts(conn, WORK_ITEM_OPEN_COUNTS, params)}


async def work_item_started_sample(conn: Conn, params: dict[str, Any]) -> list[int]:
    cur = await conn.execute(WORK_ITEM_STARTED_SAMPLE, params)
    return [int(r[0]) for r in await cur.fetchall()]


async def work_item_awaiting_split(conn: Conn, params: dict[str, Any]) -> dict[str, Any]:
    row = await fetch_dict(conn, WORK_ITEM_AWAITING_SPLIT, params)
    assert row is not None
    return row


async def work_item_reconciled_count(conn: Conn, params: dict[str, Any]) -> int:
    cur = await conn.execute(WORK_ITEM_RECONCILED_COUNT, params)
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def work_item_fence_plan(conn: Conn, params: dict[str, Any]) -> tuple[int, int]:
    """``(fenceable, held by a dead lane head)`` of the generation's unstarted unfinished items."""
    cur = await conn.execute(WORK_ITEM_FENCE_PLAN, params)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def work_item_rollback_fence(conn: Conn, params: dict[str, Any]) -> tuple[Any, ...]:
    """Gate 4's fence (``pack``, ``generation``, ``fence_id``): ``(fenced, events handed to the
    legacy path, SHA-256 of the sorted ids, first id, last id)``."""
    cur = await conn.execute(WORK_ITEM_ROLLBACK_FENCE, params)
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


# ------------------------------------------------------------------------------------------------
# Projection of legacy outcome receipts (rows locked by the caller's transaction)
# ------------------------------------------------------------------------------------------------

WORK_ITEM_LEGACY_PROJECTION_GET = """
SELECT w.work_id, w.state, w.legacy_outcome_receipt_version, w.legacy_outcome_digest,
       w.installed_pack_id, w.source_lane_key, w.target_mutation_lane_key
FROM connector_work_item w
WHERE w.event_id = %(event_id)s AND w.work_type = %(work_type)s
"""

WORK_ITEM_LEGACY_PROJECTION_LOCK = WORK_ITEM_LEGACY_PROJECTION_GET + " FOR UPDATE"

WORK_ITEM_LEGACY_RECONCILE = """
UPDATE connector_work_item
SET state = 'reconciled_legacy_terminal', outcome = %(outcome)s, failure_class = %(failure_class)s,
    failure_summary = %(failure_summary)s, legacy_outcome_receipt_version = %(version)s,
    legacy_outcome_digest = %(digest)s, lease_owner = NULL, lease_until = NULL,
    finished_at = %(at)s, updated_at = clock_timestamp()
WHERE work_id = %(work_id)s AND state = 'awaiting_legacy_outcome'
"""

# An unknown outcome: the row stays non-executable (awaiting), stamped with the receipt.
WORK_ITEM_LEGACY_QUARANTINE = """
UPDATE connector_work_item
SET failure_class = %(failure_class)s, failure_summary = %(failure_summary)s,
    legacy_outcome_receipt_version = %(version)s, legacy_outcome_digest = %(digest)s,
    updated_at = clock_timestamp()
WHERE work_id = %(work_id)s AND state = 'awaiting_legacy_outcome'
"""

# The historical mirror: a WorkItem row for logical work that only ever ran on the legacy path
# (reconciled when final, awaiting when unknown). Its unique (event_id, work_type) keeps any later
# materialization from creating executable work for it.
WORK_ITEM_LEGACY_MIRROR_INSERT = """
INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, queue_class, state,
  attempts, max_attempts, delivery_seq, outcome, failure_class, failure_summary,
  legacy_outcome_receipt_version, legacy_outcome_digest, run_after, finished_at)
SELECT e.event_id, e.installed_pack_id, e.generation, %(work_type)s,
       coalesce(g.manifest->'work_types'->%(work_type)s->>'queue_class', 'default'),
       %(state)s, e.legacy_attempts,
       coalesce((g.manifest->'work_types'->%(work_type)s->'retry'->>'max_attempts')::int, 10),
       e.delivery_seq, %(outcome)s, %(failure_class)s, %(failure_summary)s, %(version)s, %(digest)s,
       now(), CASE WHEN %(state)s = 'reconciled_legacy_terminal' THEN %(at)s::timestamptz END
FROM connector_event e
LEFT JOIN connector_pack_generation g
  ON g.installed_pack_id = e.installed_pack_id AND g.generation = e.generation
WHERE e.event_id = %(event_id)s
ON CONFLICT (event_id, work_type) DO NOTHING
RETURNING work_id
"""


async def work_item_legacy_projection_get(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, WORK_ITEM_LEGACY_PROJECTION_GET, params)


async def work_item_legacy_projection_lock(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, WORK_ITEM_LEGACY_PROJECTION_LOCK, params)


async def work_item_legacy_reconcile(conn: Conn, values: dict[str, Any]) -> None:
    await conn.execute(WORK_ITEM_LEGACY_RECONCILE, values)


async def work_item_legacy_quarantine(conn: Conn, values: dict[str, Any]) -> None:
    await conn.execute(WORK_ITEM_LEGACY_QUARANTINE, values)


async def work_item_legacy_mirror_insert(conn: Conn, values: dict[str, Any]) -> bool:
    """The historical mirror row; False when one exists already (a conflict for the caller)."""
    cur = await conn.execute(WORK_ITEM_LEGACY_MIRROR_INSERT, values)
    return await cur.fetchone() is not None
