"""Queue diagnostics sampled into gauges every ``stats_interval_s`` (never read by the claim loop).

Depth by (pack, queue class, state) is an exact count over the non-terminal states; oldest ready
age comes from the ready index (one descent per group); blocked lanes counts lane members that
hold their lanes while not runnable: dead heads whose route blocks on dead, and heads waiting for
their retry time. Active claimants: registered ``work_item`` processes with a fresh heartbeat.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from connector.common.process_registry import process_list
from connector.executor import claims
from connector.executor import metrics as m

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


async def sample_once(conn: AsyncConnection[Any], heartbeat_s: float) -> None:
    cur = await conn.execute(WORK_ITEM_QUEUE_DEPTH)
    depth = await cur.fetchall()
    m.QUEUE_DEPTH.clear()
    for pack, qc, state, n in depth:
        m.QUEUE_DEPTH.labels(str(pack), qc, state).set(n)
    groups = await claims.work_item_ready_groups(conn)
    m.OLDEST_READY_AGE.clear()
    for pack, qc, due_in in groups:
        m.OLDEST_READY_AGE.labels(str(pack), qc).set(max(0.0, -due_in))
    cur = await conn.execute(WORK_ITEM_BLOCKED_LANES)
    m.BLOCKED_LANES.clear()
    for pack, dead_head, retry_wait in await cur.fetchall():
        m.BLOCKED_LANES.labels(str(pack), "dead_head").set(dead_head)
        m.BLOCKED_LANES.labels(str(pack), "retry_wait").set(retry_wait)
    claimants = await process_list(conn, capability="work_item", fresh_within_s=3 * heartbeat_s)
    m.ACTIVE_CLAIMANTS.set(len(claimants))
