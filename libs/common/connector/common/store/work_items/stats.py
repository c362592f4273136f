"""Queue and lane statistics on ``connector_work_item``: the sampler's diagnostics and the admin
API's stats, driven from the pack and generation rows (``work_item_stats_*``,
``work_item_lanes_blocked``)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from connector.common.store.lanes import (
    lane_holding,
)
from connector.common.store.packs import pack_filter
from connector.common.store.rows import fetch_dicts
from connector.common.store.work_items.admin import WORK_ITEM_SELECT_COLUMNS

Conn = AsyncConnection[Any]

# Queue diagnostics of the sampler (never read by the claim loop): exact depth over the
# non-terminal states, and lane heads that hold their lanes while not runnable.
WORK_ITEM_QUEUE_DEPTH = """
SELECT installed_pack_id, queue_class, state, count(*) FROM connector_work_item
WHERE state IN ('pending', 'retry', 'processing', 'blocked', 'awaiting_legacy_outcome')
GROUP BY 1, 2, 3
"""

WORK_ITEM_BLOCKED_LANES = """
SELECT installed_pack_id,
       count(*) FILTER (WHERE state = 'dead') AS dead_head,
       count(*) FILTER (WHERE state = 'retry') AS retry_wait
FROM connector_work_item
WHERE (source_lane_key IS NOT NULL OR target_mutation_lane_key IS NOT NULL)
  AND ((state = 'dead' AND dead_blocks_lane) OR (state = 'retry' AND run_after > now()))
GROUP BY 1
"""


# ------------------------------------------------------------------------------------------------
# Queue diagnostics (the sampler)
# ------------------------------------------------------------------------------------------------


async def work_item_queue_depth(conn: Conn) -> list[tuple[int, str, str, int]]:
    """``(pack, queue class, state, count)`` over the non-terminal states."""
    cur = await conn.execute(WORK_ITEM_QUEUE_DEPTH)
    return [(int(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in await cur.fetchall()]


async def work_item_blocked_lanes(conn: Conn) -> list[tuple[int, int, int]]:
    """``(pack, dead heads holding their lane, heads waiting for their retry time)``."""
    cur = await conn.execute(WORK_ITEM_BLOCKED_LANES)
    return [(int(r[0]), int(r[1]), int(r[2])) for r in await cur.fetchall()]


# ------------------------------------------------------------------------------------------------
# The admin API's queue and lane statistics (admin/stats.py assembles them; tests/admin/test_stats.py
# asserts every plan with EXPLAIN). Each count is driven from the small control tables (packs,
# generations) into equality ranges of WorkItem indexes, never a scan of ``connector_work_item``;
# ``params``: ``pack`` (None: every pack), ``window`` (seconds, the rates).
# ------------------------------------------------------------------------------------------------

# The queue states counted as depth (succeeded and reconciled rows are history, not depth).
QUEUE_STATES = ("pending", "blocked", "processing", "retry", "dead", "awaiting_legacy_outcome")
_STATES_VALUES = ", ".join(f"('{s}')" for s in QUEUE_STATES)


def work_item_stats_depth_sql(pack: int | None) -> str:
    return f"""
SELECT g.installed_pack_id, s.state, sum(c.n)::bigint AS n
FROM connector_pack_generation g
CROSS JOIN (VALUES {_STATES_VALUES}) AS s(state)
CROSS JOIN LATERAL (
  SELECT count(*) AS n FROM connector_work_item w
  WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation AND w.state = s.state
    AND w.state <> 'succeeded'  -- lets the planner use the partial (pack, generation, state) index
) c
WHERE {pack_filter("g", pack)}
GROUP BY g.installed_pack_id, s.state
"""


def work_item_stats_rates_sql(pack: int | None) -> str:
    return f"""
SELECT p.installed_pack_id, p.name,
  (SELECT count(*) FROM connector_work_item w
   WHERE w.installed_pack_id = p.installed_pack_id AND w.state = 'dead'
     AND w.finished_at >= now() - make_interval(secs => %(window)s)) AS dead_recent,
  (SELECT coalesce(sum(r.n), 0) FROM connector_pack_generation g CROSS JOIN LATERAL (
     SELECT count(*) AS n FROM connector_work_item w
     WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
       AND w.state = 'retry' AND w.updated_at >= now() - make_interval(secs => %(window)s)) r
   WHERE g.installed_pack_id = p.installed_pack_id)::bigint AS retry_recent
FROM connector_installed_pack p
WHERE {pack_filter("p", pack)}
ORDER BY p.installed_pack_id
"""


# Loose index scan over the ready index: one descent per (pack, queue class).
def work_item_stats_classes_sql(pack: int | None) -> str:
    return f"""
WITH RECURSIVE qc(installed_pack_id, queue_class) AS (
  SELECT p.installed_pack_id,
         (SELECT w.queue_class FROM connector_work_item w
          WHERE w.installed_pack_id = p.installed_pack_id AND w.state IN ('pending', 'retry')
          ORDER BY w.queue_class LIMIT 1)
  FROM connector_installed_pack p WHERE {pack_filter("p", pack)}
  UNION ALL
  SELECT qc.installed_pack_id,
         (SELECT w.queue_class FROM connector_work_item w
          WHERE w.installed_pack_id = qc.installed_pack_id AND w.state IN ('pending', 'retry')
            AND w.queue_class > qc.queue_class
          ORDER BY w.queue_class LIMIT 1)
  FROM qc WHERE qc.queue_class IS NOT NULL
)
SELECT qc.installed_pack_id, qc.queue_class,
  (SELECT count(*) FROM connector_work_item w
   WHERE w.installed_pack_id = qc.installed_pack_id AND w.queue_class = qc.queue_class
     AND w.state IN ('pending', 'retry')) AS ready,
  (SELECT count(*) FROM connector_work_item w
   WHERE w.installed_pack_id = qc.installed_pack_id AND w.queue_class = qc.queue_class
     AND w.state IN ('pending', 'retry') AND w.run_after <= now()) AS due,
  (SELECT now() - min(w.run_after) FROM connector_work_item w
   WHERE w.installed_pack_id = qc.installed_pack_id AND w.queue_class = qc.queue_class
     AND w.state IN ('pending', 'retry') AND w.run_after <= now()) AS oldest_due_age
FROM qc WHERE qc.queue_class IS NOT NULL
"""


def work_item_stats_processing_sql(pack: int | None) -> str:
    return f"""
SELECT w.installed_pack_id, w.queue_class, count(*) AS n
FROM connector_work_item w
WHERE w.state = 'processing' AND {pack_filter("w", pack)}
GROUP BY w.installed_pack_id, w.queue_class
"""


async def work_item_stats_depth(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    """``(installed_pack_id, state, n)`` per pack and queue state."""
    return await fetch_dicts(conn, work_item_stats_depth_sql(params["pack"]), params)


async def work_item_stats_rates(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Per pack: its name, dead and retry rows of the last ``window`` seconds."""
    return await fetch_dicts(conn, work_item_stats_rates_sql(params["pack"]), params)


async def work_item_stats_classes(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (pack, queue class) with ready items: ready, due and the oldest due age."""
    return await fetch_dicts(conn, work_item_stats_classes_sql(params["pack"]), params)


async def work_item_stats_processing(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    """In-flight items per (pack, queue class)."""
    return await fetch_dicts(conn, work_item_stats_processing_sql(params["pack"]), params)


HEAD_STATES = ("dead", "retry", "awaiting_legacy_outcome")
_HEAD_VALUES = ", ".join(f"('{s}')" for s in HEAD_STATES)


def _lane_branch(kind: str, column: str) -> str:
    return f"""
  SELECT c.*, '{kind}'::text AS lane_kind, c.{column} AS lane_key,
    (SELECT count(*) FROM connector_work_item m
     WHERE m.installed_pack_id = c.installed_pack_id AND m.{column} = c.{column}
       AND m.{column} IS NOT NULL AND {lane_holding("m")}
       AND (m.delivery_seq, m.work_id) > (c.delivery_seq, c.work_id)) AS waiting
  FROM cand c
  WHERE c.{column} IS NOT NULL
    AND NOT EXISTS (
      SELECT 1 FROM connector_work_item e
      WHERE e.installed_pack_id = c.installed_pack_id AND e.{column} = c.{column}
        AND e.{column} IS NOT NULL AND {lane_holding("e")}
        AND (e.delivery_seq, e.work_id) < (c.delivery_seq, c.work_id))"""


def work_item_lanes_blocked_sql(pack: int | None, after: bool) -> str:
    """Lane heads (first holding member in (delivery_seq, work_id) order) that are dead (and hold
    their lane by policy), retrying, or rollback-fenced. Candidates come from the state index per
    (pack, generation, state); head and waiting checks from the lane partial indexes."""
    keyset = "(l.installed_pack_id, l.lane_kind, l.lane_key) > (%(k_pack)s, %(k_kind)s, %(k_key)s)"
    return f"""
WITH cand AS (
  SELECT w.* FROM connector_pack_generation g
  CROSS JOIN (VALUES {_HEAD_VALUES}) AS s(state)
  CROSS JOIN LATERAL (
    SELECT w.* FROM connector_work_item w
    WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
      AND w.state = s.state AND w.state <> 'succeeded'  -- (the partial state index's predicate)
      AND (w.source_lane_key IS NOT NULL OR w.target_mutation_lane_key IS NOT NULL)
      AND (w.state <> 'dead' OR w.dead_blocks_lane)
    OFFSET 0) w  -- a fence: keep the per-(pack, generation, state) index range (no hash join)
  WHERE {pack_filter("g", pack)}
), lanes AS ({_lane_branch("s", "source_lane_key")}
  UNION ALL{_lane_branch("t", "target_mutation_lane_key")}
)
SELECT {WORK_ITEM_SELECT_COLUMNS.replace("w.", "l.")}, l.lane_kind, l.lane_key, l.waiting
FROM lanes l
WHERE {keyset if after else "true"}
ORDER BY l.installed_pack_id, l.lane_kind, l.lane_key
LIMIT %(limit)s
"""


async def work_item_lanes_blocked(
    conn: Conn, pack: int | None, *, after: tuple[int, str, str] | None, limit: int
) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"pack": pack, "limit": limit}
    if after is not None:
        params.update(k_pack=after[0], k_kind=after[1], k_key=after[2])
    return await fetch_dicts(conn, work_item_lanes_blocked_sql(pack, after is not None), params)
