"""Queue, lane and cutover statistics from indexed reads only (tests assert the plans with EXPLAIN).

Every count is driven from the small control tables (packs, generations) into equality ranges of
WorkItem indexes, never a scan of ``connector_work_item``:

* depth by state: ``ix_connector_work_item_installed_pack_id_generation_state`` with
  (pack, generation, state) all equal, per generation of ``connector_pack_generation`` and per
  *queue* state (``QUEUE_STATES``: succeeded and reconciled rows are history, not depth, and are not
  counted: their number only grows);
* per queue class: the partial ready index (pack, queue_class, run_after) — a loose index scan finds
  the classes, then ready / due counts and the oldest due ``run_after``; in-flight per class from the
  partial processing index;
* dead rate: dead rows whose ``finished_at`` is in the window (partial dead index); retry rate: rows
  in ``retry`` whose ``updated_at`` is in the window (state index). Both are per second over
  ``RATE_WINDOW_S``; the retry rate is a lower bound (an item that retried and was claimed again
  within the window is not in ``retry`` any more). Exact rates are the executor's counters.
* receipts: the partial routable / routing / failed receipt indexes.

These are scoped diagnostics for operators (seed: "exact full queue stats remain scoped diagnostics,
not a hot-loop scheduler or admission dependency"): nothing in the runtime polls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from connector.common.store.lanes import lane_holding
from connector.common.store.processes import process_count_by_capability
from connector.common.store.work_items import WORK_ITEM_SELECT_COLUMNS as WORK_ITEM_COLUMNS

QUEUE_STATES = ("pending", "blocked", "processing", "retry", "dead", "awaiting_legacy_outcome")
RATE_WINDOW_S = 300

_STATES_VALUES = ", ".join(f"('{s}')" for s in QUEUE_STATES)


def _pack_filter(alias: str, pack: int | None) -> str:
    return f"{alias}.installed_pack_id = %(pack)s" if pack is not None else "true"


def queue_depth_sql(pack: int | None) -> str:
    return f"""
SELECT g.installed_pack_id, s.state, sum(c.n)::bigint AS n
FROM connector_pack_generation g
CROSS JOIN (VALUES {_STATES_VALUES}) AS s(state)
CROSS JOIN LATERAL (
  SELECT count(*) AS n FROM connector_work_item w
  WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation AND w.state = s.state
    AND w.state <> 'succeeded'  -- lets the planner use the partial (pack, generation, state) index
) c
WHERE {_pack_filter("g", pack)}
GROUP BY g.installed_pack_id, s.state
"""


def queue_rates_sql(pack: int | None) -> str:
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
WHERE {_pack_filter("p", pack)}
ORDER BY p.installed_pack_id
"""


# Loose index scan over the ready index: one descent per (pack, queue class).
def queue_classes_sql(pack: int | None) -> str:
    return f"""
WITH RECURSIVE qc(installed_pack_id, queue_class) AS (
  SELECT p.installed_pack_id,
         (SELECT w.queue_class FROM connector_work_item w
          WHERE w.installed_pack_id = p.installed_pack_id AND w.state IN ('pending', 'retry')
          ORDER BY w.queue_class LIMIT 1)
  FROM connector_installed_pack p WHERE {_pack_filter("p", pack)}
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
  (SELECT now() - w.run_after FROM connector_work_item w
   WHERE w.installed_pack_id = qc.installed_pack_id AND w.queue_class = qc.queue_class
     AND w.state IN ('pending', 'retry') AND w.run_after <= now()
   ORDER BY w.run_after LIMIT 1) AS oldest_due_age
FROM qc WHERE qc.queue_class IS NOT NULL
"""


def processing_by_class_sql(pack: int | None) -> str:
    return f"""
SELECT w.installed_pack_id, w.queue_class, count(*) AS n
FROM connector_work_item w
WHERE w.state = 'processing' AND {_pack_filter("w", pack)}
GROUP BY w.installed_pack_id, w.queue_class
"""


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


@dataclass(slots=True)
class QueueRow:
    installed_pack_id: int
    pack_name: str
    queue_class: str  # "" = the whole pack
    depth_by_state: dict[str, int] = field(default_factory=dict)
    oldest_ready_age: timedelta | None = None
    due: int = 0
    in_flight: int = 0
    retry_rate: float = 0.0
    dead_rate: float = 0.0


@dataclass(slots=True)
class QueueStats:
    queues: list[QueueRow]
    receipts_unrouted: int
    oldest_unrouted_age: timedelta | None
    receipts_routing: int
    receipts_failed: int
    active_claimants: int


async def queue_stats(conn: AsyncConnection[Any], pack: int | None, *, stale_s: float) -> QueueStats:
    params: dict[str, Any] = {"pack": pack, "window": RATE_WINDOW_S, "stale_s": stale_s}
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queue_rates_sql(pack), params)
        packs = {int(r["installed_pack_id"]): r for r in await cur.fetchall()}
        await cur.execute(queue_depth_sql(pack), params)
        depth = await cur.fetchall()
        await cur.execute(queue_classes_sql(pack), params)
        classes = await cur.fetchall()
        await cur.execute(processing_by_class_sql(pack), params)
        processing = await cur.fetchall()
        await cur.execute(RECEIPT_STATS, params)
        receipts = await cur.fetchone()
    assert receipts is not None
    totals: dict[int, QueueRow] = {}
    for pack_id, row in packs.items():
        totals[pack_id] = QueueRow(
            installed_pack_id=pack_id,
            pack_name=row["name"],
            queue_class="",
            depth_by_state=dict.fromkeys(QUEUE_STATES, 0),
            retry_rate=int(row["retry_recent"]) / RATE_WINDOW_S,
            dead_rate=int(row["dead_recent"]) / RATE_WINDOW_S,
        )
    for row in depth:
        total = totals.get(int(row["installed_pack_id"]))
        if total is not None:
            total.depth_by_state[row["state"]] = int(row["n"] or 0)
    by_class: dict[tuple[int, str], QueueRow] = {}

    def class_row(pack_id: int, queue_class: str) -> QueueRow:
        key = (pack_id, queue_class)
        if key not in by_class:
            by_class[key] = QueueRow(
                installed_pack_id=pack_id,
                pack_name=totals[pack_id].pack_name if pack_id in totals else "",
                queue_class=queue_class,
                depth_by_state={"ready": 0, "processing": 0},
            )
        return by_class[key]

    for row in classes:
        q = class_row(int(row["installed_pack_id"]), row["queue_class"])
        q.depth_by_state["ready"] = int(row["ready"])
        q.due = int(row["due"])
        q.oldest_ready_age = row["oldest_due_age"]
    for row in processing:
        q = class_row(int(row["installed_pack_id"]), row["queue_class"])
        q.depth_by_state["processing"] = int(row["n"])
        q.in_flight = int(row["n"])
    for total in totals.values():
        total.in_flight = total.depth_by_state.get("processing", 0)
        mine = [q for (p, _), q in by_class.items() if p == total.installed_pack_id]
        total.due = sum(q.due for q in mine)
        ages = [q.oldest_ready_age for q in mine if q.oldest_ready_age is not None]
        total.oldest_ready_age = max(ages) if ages else None
    queues: list[QueueRow] = []
    for pack_id in sorted(totals):
        queues.append(totals[pack_id])
        queues.extend(by_class[k] for k in sorted(by_class) if k[0] == pack_id)
    queues.extend(by_class[k] for k in sorted(by_class) if k[0] not in totals)
    return QueueStats(
        queues=queues,
        receipts_unrouted=int(receipts["unrouted"]),
        oldest_unrouted_age=receipts["oldest_unrouted_age"],
        receipts_routing=int(receipts["routing"]),
        receipts_failed=int(receipts["failed"]),
        active_claimants=int(receipts["active_claimants"]),
    )


# ------------------------------------------------------------------------------------------------
# Blocked lanes
# ------------------------------------------------------------------------------------------------

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


def lanes_blocked_sql(pack: int | None, after: bool) -> str:
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
  WHERE {_pack_filter("g", pack)}
), lanes AS ({_lane_branch("s", "source_lane_key")}
  UNION ALL{_lane_branch("t", "target_mutation_lane_key")}
)
SELECT {WORK_ITEM_COLUMNS.replace("w.", "l.")}, l.lane_kind, l.lane_key, l.waiting
FROM lanes l
WHERE {keyset if after else "true"}
ORDER BY l.installed_pack_id, l.lane_kind, l.lane_key
LIMIT %(limit)s
"""


async def lanes_blocked_list(
    conn: AsyncConnection[Any], pack: int | None, *, after: tuple[int, str, str] | None, limit: int
) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"pack": pack, "limit": limit}
    if after is not None:
        params.update(k_pack=after[0], k_kind=after[1], k_key=after[2])
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(lanes_blocked_sql(pack, after is not None), params)
        return await cur.fetchall()


# ------------------------------------------------------------------------------------------------
# Cutover state
# ------------------------------------------------------------------------------------------------


def cutover_generations_sql(pack: int | None) -> str:
    return f"""
SELECT g.installed_pack_id, g.generation, g.status,
       (p.active_generation IS NOT DISTINCT FROM g.generation) AS active,
       a.claim_path, a.phase,
       (SELECT count(*) FROM connector_rollback_fence f
        WHERE f.installed_pack_id = g.installed_pack_id AND f.generation = g.generation
          AND f.status = 'open') AS open_fences,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
          AND w.state = 'awaiting_legacy_outcome') AS awaiting_legacy_outcome,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
          AND w.state = 'processing') AS processing,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
          AND w.state = 'awaiting_legacy_outcome'
          AND w.legacy_outcome_receipt_version IS NOT NULL) AS awaiting_legacy_unknown,
       (SELECT count(*) FROM connector_event e
        WHERE e.installed_pack_id = g.installed_pack_id AND e.generation = g.generation
          AND e.legacy_state IN ('pending', 'retry')) AS legacy_pending,
       (SELECT count(*) FROM connector_event e
        WHERE e.installed_pack_id = g.installed_pack_id AND e.generation = g.generation
          AND e.legacy_state = 'processing') AS legacy_in_flight,
       (SELECT count(*) FROM connector_legacy_outcome_receipt o
        WHERE NOT o.projected AND o.installed_pack_id = g.installed_pack_id
          AND o.generation = g.generation) AS unprojected_legacy_receipts,
       a.version AS authority_version, a.rollback_fence_id, a.cutover_receipt_id
FROM connector_pack_generation g
JOIN connector_installed_pack p ON p.installed_pack_id = g.installed_pack_id
LEFT JOIN connector_claim_authority a
  ON a.installed_pack_id = g.installed_pack_id AND a.generation = g.generation
WHERE {_pack_filter("g", pack)}
ORDER BY g.installed_pack_id, g.generation
"""


def cutover_receipts_sql(pack: int | None) -> str:
    return f"""
SELECT r.cutover_receipt_id, r.installed_pack_id, r.generation, r.kind, r.claim_path, r.proof_sha256,
       r.actor, r.created_at
FROM connector_cutover_receipt r
WHERE {_pack_filter("r", pack)}
ORDER BY r.installed_pack_id, r.generation, r.cutover_receipt_id
"""


PACK_EXISTS = "SELECT 1 FROM connector_installed_pack WHERE installed_pack_id = %(pack)s"


@dataclass(slots=True)
class CutoverState:
    generations: list[dict[str, Any]]
    receipts: dict[tuple[int, int], list[dict[str, Any]]]
    processes: dict[str, int]


async def pack_exists(conn: AsyncConnection[Any], pack: int) -> bool:
    cur = await conn.execute(PACK_EXISTS, {"pack": pack})
    return await cur.fetchone() is not None


async def cutover_state_get(conn: AsyncConnection[Any], pack: int | None, *, stale_s: float) -> CutoverState:
    params: dict[str, Any] = {"pack": pack, "stale_s": stale_s}
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(cutover_generations_sql(pack), params)
        generations = await cur.fetchall()
        await cur.execute(cutover_receipts_sql(pack), params)
        receipts: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for row in await cur.fetchall():
            receipts.setdefault((int(row["installed_pack_id"]), int(row["generation"])), []).append(row)
    processes = await process_count_by_capability(conn, stale_s=stale_s)
    return CutoverState(generations=generations, receipts=receipts, processes=processes)
