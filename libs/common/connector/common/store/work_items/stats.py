"""Queue and lane statistics on ``connector_work_item``: the sampler's diagnostics and the admin
API's stats, driven from the pack and generation rows (``work_item_stats_*``,
``work_item_lanes_walk``)."""

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
_HEAD_IN = ", ".join(f"'{s}'" for s in HEAD_STATES)
#: The lane kinds in listing order, with their column (``LaneKind`` values).
LANE_COLUMNS = (("s", "source_lane_key"), ("t", "target_mutation_lane_key"))


def work_item_lanes_walk_sql(target: bool, after: bool) -> str:
    """The heads of one pack's lanes of one kind in key order, after a key or from the first: a loose
    index scan of the lane's partial index (``ix_connector_work_item_source_lane`` / ``_target_lane``,
    (pack, key, delivery_seq, work_id) over the holding members), one descent per lane, whose first
    entry *is* the lane's head (its first holding member). The walk stops after ``%(scan)s`` lanes or
    when ``%(limit)s`` heads hold their lane while not runnable (``HEAD_STATES``: dead and blocking,
    retrying, rollback-fenced); it returns those heads (with how many members wait behind each) and
    the last lane it read (``last``: where the next page resumes). Reads only lane heads: never the
    members of a lane, never every dead or retrying item."""
    column = "target_mutation_lane_key" if target else "source_lane_key"
    first = f"w.{column} > %(after)s" if after else f"w.{column} IS NOT NULL"
    hold_w, hold_m = lane_holding("w"), lane_holding("m")
    step = f"""SELECT w.{column} AS lane_key, w.work_id, w.state FROM connector_work_item w
    WHERE w.installed_pack_id = %(pack)s AND {{cond}} AND {hold_w}
    ORDER BY w.{column}, w.delivery_seq, w.work_id LIMIT 1"""
    return f"""
WITH RECURSIVE walk (lane_key, work_id, state, n, found) AS (
  (SELECT h.lane_key, h.work_id, h.state, 1, (h.state IN ({_HEAD_IN}))::int
   FROM ({step.format(cond=first)}) h)
  UNION ALL
  SELECT h.lane_key, h.work_id, h.state, walk.n + 1, walk.found + (h.state IN ({_HEAD_IN}))::int
  FROM walk CROSS JOIN LATERAL ({step.format(cond=f"w.{column} > walk.lane_key")}) h
  WHERE walk.n < %(scan)s AND walk.found < %(limit)s
), seen AS (
  SELECT walk.*, walk.n = max(walk.n) OVER () AS last FROM walk
)
SELECT {WORK_ITEM_SELECT_COLUMNS}, seen.lane_key, seen.n, seen.found, seen.last,
  seen.state IN ({_HEAD_IN}) AS blocked,
  CASE WHEN seen.state IN ({_HEAD_IN}) THEN
    (SELECT count(*) FROM connector_work_item m
     WHERE m.installed_pack_id = %(pack)s AND m.{column} = seen.lane_key AND {hold_m}
       AND (m.delivery_seq, m.work_id) > (w.delivery_seq, w.work_id)) END AS waiting
FROM seen JOIN connector_work_item w ON w.work_id = seen.work_id
WHERE seen.state IN ({_HEAD_IN}) OR seen.last
ORDER BY seen.n
"""


async def work_item_lanes_walk(
    conn: Conn, pack: int, kind: str, *, after: str | None, scan: int, limit: int
) -> tuple[list[dict[str, Any]], str | None, int, bool]:
    """One pack's lanes of ``kind`` (``"s"`` / ``"t"``) after ``after``: (blocked heads in key order,
    each with ``lane_key`` and ``waiting``; the last lane key read (None: none); lanes read; whether
    the walk found no more lanes). ``limit`` heads at most, ``scan`` lanes at most."""
    params: dict[str, Any] = {"pack": pack, "after": after, "scan": scan, "limit": limit}
    rows = await fetch_dicts(conn, work_item_lanes_walk_sql(kind == "t", after is not None), params)
    if not rows:
        return [], None, 0, True
    last = rows[-1]
    read = int(last["n"])
    exhausted = read < scan and int(last["found"]) < limit
    return [r for r in rows if r["blocked"]], str(last["lane_key"]), read, exhausted
