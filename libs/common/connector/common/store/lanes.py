"""Lanes: which member of a source lane or target mutation lane may run (docs/adr/003-lanes.md).

Every statement of the lane facts on ``connector_work_item`` (the lane membership columns and the
blocked/ready split). The contract (ADR 003 has the measurements behind it):

* Only a lane's *runnable* member is in a ready state (``pending``/``retry``); every other member is
  ``blocked``, outside the ready index the claim reads (DESIGN §8 trap 3). Lanes never appear in the
  claim statement.
* A lane's runnable member is its first *holding* member (``lane_holding``) in ``(delivery_seq,
  work_id)`` order, and only while no member of the lane is ``processing``; a member runs when it is
  runnable in every lane it belongs to (one global order: lanes cannot deadlock each other).
* Membership changes happen under transaction-scoped advisory locks of the lanes concerned, taken in
  one sorted batch (``lane_lock_batch``), followed in the same transaction by ``lane_settle_batch``.
* ``lane_repair`` is the periodic check that the lane facts agree with the rows (it should find none).

A lane is identified by (installed_pack_id, kind, key), kind a ``LaneKind``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.rows import fetch_dicts
from connector.common.store.vocabulary import LANE_HOLDING_PREDICATE, WORK_LANE_HOLDING


class LaneKind(StrEnum):
    """The kind of a lane (its value is what the statements compare: ``g.kind = 's'``)."""

    SOURCE = "s"  # source_lane_key: members run one at a time, in delivery order
    TARGET = "t"  # target_mutation_lane_key: at most one member in flight


Lane = tuple[int, str, str]  # (installed_pack_id, LaneKind, key)


def lane_holding(alias: str = "") -> str:
    """The condition "this member holds its lane" on the WorkItem alias ``alias`` (``""``: bare
    column names, as in ``vocabulary.LANE_HOLDING_PREDICATE``, the partial lane indexes' predicate)."""
    col = f"{alias}." if alias else ""
    states = ", ".join(repr(s) for s in WORK_LANE_HOLDING)
    return f"({col}state IN ({states}) OR ({col}state = 'dead' AND {col}dead_blocks_lane))"


assert lane_holding() == LANE_HOLDING_PREDICATE  # one definition: the index predicate is this piece

_HOLD_W = lane_holding("w")


def lanes_of(installed_pack_id: int, source_key: str | None, target_key: str | None) -> list[Lane]:
    out: list[Lane] = []
    if source_key is not None:
        out.append((installed_pack_id, LaneKind.SOURCE, source_key))
    if target_key is not None:
        out.append((installed_pack_id, LaneKind.TARGET, target_key))
    return out


def _arrays(lanes: Iterable[Lane]) -> dict[str, list[Any]]:
    uniq = sorted(set(lanes))
    return {
        "packs": [lane[0] for lane in uniq],
        "kinds": [lane[1] for lane in uniq],
        "keys": [lane[2] for lane in uniq],
    }


# The first members of each given lane, in order; their other lanes join the lock set.
LANE_LOCK_BATCH = f"""
WITH given AS (
  SELECT * FROM unnest(%(packs)s::bigint[], %(kinds)s::text[], %(keys)s::text[]) AS g(pack, kind, key)
), firsts AS (
  SELECT m.* FROM given g CROSS JOIN LATERAL (
    SELECT w.installed_pack_id, w.source_lane_key, w.target_mutation_lane_key
    FROM connector_work_item w
    WHERE g.kind = 's' AND w.installed_pack_id = g.pack AND w.source_lane_key = g.key AND {_HOLD_W}
    ORDER BY w.delivery_seq, w.work_id LIMIT 3) m
  UNION ALL
  SELECT m.* FROM given g CROSS JOIN LATERAL (
    SELECT w.installed_pack_id, w.source_lane_key, w.target_mutation_lane_key
    FROM connector_work_item w
    WHERE g.kind = 't' AND w.installed_pack_id = g.pack AND w.target_mutation_lane_key = g.key
      AND {_HOLD_W}
    ORDER BY w.delivery_seq, w.work_id LIMIT 3) m
), lock_set AS (
  SELECT pack, kind, key FROM given
  UNION SELECT installed_pack_id, 's', source_lane_key FROM firsts WHERE source_lane_key IS NOT NULL
  UNION SELECT installed_pack_id, 't', target_mutation_lane_key FROM firsts
    WHERE target_mutation_lane_key IS NOT NULL
), keyed AS (
  SELECT pack, kind, key, hashtextextended(kind || ':' || pack || ':' || key, 0) AS lock_key FROM lock_set
)
SELECT pack, kind, key, pg_advisory_xact_lock(lock_key) IS NULL
FROM (SELECT * FROM keyed ORDER BY lock_key, pack, kind, key) ordered
"""

# Promote each locked lane's first member when it is blocked, nothing in its lanes is processing,
# and it is first in its other lane too (which must be locked as well). With demote, ready members
# that are not runnable any more (an earlier delivery materialized late) go back to blocked.
# ``idle`` marks lanes known to have nothing in processing: the caller's transaction moved the
# lane's member out of processing (fenced), and the partial UNIQUE index on processing lane members
# lets no other member be processing in any snapshot of that transaction. Their "busy" probe is
# skipped: with the processing index full of entries left since the last vacuum, it was most of the
# statement's buffers (the planner scans ix_connector_work_item_processing whole for it;
# /work/helpers/lanes-design.md has the breakdown). ``LANE_SETTLE_HEADS`` (each lane's head and the
# promotable members) is shared with the finalize's handoff (``work_items.finalize``).
LANE_SETTLE_HEADS = f"""
WITH locked AS (
  SELECT * FROM unnest(%(packs)s::bigint[], %(kinds)s::text[], %(keys)s::text[], %(idle)s::bool[])
    AS l(pack, kind, key, idle)
), heads AS (
  SELECT l.pack, l.kind, l.key, h.work_id AS first_id, h.state AS first_state,
         CASE WHEN l.idle THEN false ELSE EXISTS (
           SELECT 1 FROM connector_work_item p
           WHERE p.installed_pack_id = l.pack AND p.source_lane_key = l.key AND p.state = 'processing')
         END AS busy
  FROM locked l LEFT JOIN LATERAL (
    SELECT w.work_id, w.state FROM connector_work_item w
    WHERE w.installed_pack_id = l.pack AND w.source_lane_key = l.key AND {_HOLD_W}
    ORDER BY w.delivery_seq, w.work_id LIMIT 1) h ON true
  WHERE l.kind = 's'
  UNION ALL
  SELECT l.pack, l.kind, l.key, h.work_id, h.state,
         CASE WHEN l.idle THEN false ELSE EXISTS (
           SELECT 1 FROM connector_work_item p
           WHERE p.installed_pack_id = l.pack AND p.target_mutation_lane_key = l.key
             AND p.state = 'processing')
         END
  FROM locked l LEFT JOIN LATERAL (
    SELECT w.work_id, w.state FROM connector_work_item w
    WHERE w.installed_pack_id = l.pack AND w.target_mutation_lane_key = l.key AND {_HOLD_W}
    ORDER BY w.delivery_seq, w.work_id LIMIT 1) h ON true
  WHERE l.kind = 't'
), promotable AS (
  SELECT DISTINCT x.work_id
  FROM heads h JOIN connector_work_item x ON x.work_id = h.first_id
  WHERE h.first_state = 'blocked'
    AND (x.source_lane_key IS NULL OR EXISTS (
          SELECT 1 FROM heads hs WHERE hs.kind = 's' AND hs.pack = x.installed_pack_id
            AND hs.key = x.source_lane_key AND hs.first_id = x.work_id AND NOT hs.busy))
    AND (x.target_mutation_lane_key IS NULL OR EXISTS (
          SELECT 1 FROM heads ht WHERE ht.kind = 't' AND ht.pack = x.installed_pack_id
            AND ht.key = x.target_mutation_lane_key AND ht.first_id = x.work_id AND NOT ht.busy))
"""
LANE_SETTLE_BATCH = f"""
{LANE_SETTLE_HEADS}), demotable AS (
  SELECT w.work_id FROM heads h JOIN connector_work_item w
    ON w.installed_pack_id = h.pack
   AND ((h.kind = 's' AND w.source_lane_key = h.key) OR (h.kind = 't' AND w.target_mutation_lane_key = h.key))
  WHERE %(demote)s AND w.state IN ('pending', 'retry') AND (h.busy OR w.work_id <> h.first_id)
), promoted AS (
  UPDATE connector_work_item w SET state = 'pending', updated_at = clock_timestamp()
  FROM promotable p WHERE w.work_id = p.work_id AND w.state = 'blocked'
  RETURNING w.work_id
), demoted AS (
  UPDATE connector_work_item w SET state = 'blocked', updated_at = clock_timestamp()
  FROM demotable d WHERE w.work_id = d.work_id AND w.state IN ('pending', 'retry')
  RETURNING w.work_id
)
SELECT (SELECT count(*) FROM promoted), (SELECT count(*) FROM demoted)
"""

# Lanes whose first member is blocked: candidates for repair (bounded).
LANE_LIST_STUCK = """
(SELECT installed_pack_id, 's', source_lane_key FROM connector_work_item
 WHERE state = 'blocked' AND source_lane_key IS NOT NULL
 GROUP BY 1, 3 LIMIT %(limit)s)
UNION
(SELECT installed_pack_id, 't', target_mutation_lane_key FROM connector_work_item
 WHERE state = 'blocked' AND target_mutation_lane_key IS NOT NULL
 GROUP BY 1, 3 LIMIT %(limit)s)
"""


@dataclass(frozen=True, slots=True)
class SettleResult:
    promoted: int
    demoted: int


async def lane_lock_batch(conn: AsyncConnection[Any], lanes: Iterable[Lane]) -> list[Lane]:
    """Take the advisory locks of ``lanes`` and of their first members' other lanes, sorted, in the
    caller's transaction; returns every lane locked."""
    arrays = _arrays(lanes)
    if not arrays["packs"]:
        return []
    cur = await conn.execute(LANE_LOCK_BATCH, arrays, prepare=True)
    return [(int(r[0]), str(r[1]), str(r[2])) for r in await cur.fetchall()]


def settle_params(locked: Sequence[Lane], idle: Collection[Lane]) -> dict[str, list[Any]]:
    """``LANE_SETTLE_HEADS``' parameters: the locked lanes, each flagged idle or not."""
    arrays = _arrays(locked)
    arrays["idle"] = [
        (p, k, key) in idle
        for p, k, key in zip(arrays["packs"], arrays["kinds"], arrays["keys"], strict=True)
    ]
    return arrays


async def lane_settle_batch(
    conn: AsyncConnection[Any], locked: Sequence[Lane], *, demote: bool = False, idle: Collection[Lane] = ()
) -> SettleResult:
    """Promote (and with ``demote``, re-block) members of lanes locked by ``lane_lock_batch``.
    ``idle``: lanes whose processing member this transaction has already moved out of processing
    (nothing else of theirs can be processing: no probe)."""
    if not locked:
        return SettleResult(0, 0)
    params: dict[str, Any] = {**settle_params(locked, idle), "demote": demote}
    cur = await conn.execute(LANE_SETTLE_BATCH, params, prepare=True)
    row = await cur.fetchone()
    assert row is not None
    return SettleResult(int(row[0]), int(row[1]))


async def lanes_change(
    conn: AsyncConnection[Any], lanes: Iterable[Lane], *, demote: bool = False
) -> tuple[list[Lane], SettleResult]:
    """Lock then settle, for callers that changed membership before (reclaim, replay, finalize)
    while already holding the locks is not needed. Must run inside a transaction."""
    locked = await lane_lock_batch(conn, lanes)
    return locked, await lane_settle_batch(conn, locked, demote=demote)


async def lane_list_stuck(conn: AsyncConnection[Any], limit: int = 500) -> list[Lane]:
    """Lanes whose members are blocked (candidates for ``lane_repair``), bounded."""
    cur = await conn.execute(LANE_LIST_STUCK, {"limit": limit})
    return [(int(r[0]), str(r[1]), str(r[2])) for r in await cur.fetchall()]


async def lane_repair(conn: AsyncConnection[Any], limit: int = 500) -> SettleResult:
    """Settle lanes whose members are all blocked (a lost promotion). Returns what it fixed; a
    healthy system reports zero. Runs its own transaction."""
    stuck = await lane_list_stuck(conn, limit)
    if not stuck:
        return SettleResult(0, 0)
    async with conn.transaction():
        _, result = await lanes_change(conn, stuck)
    return result


# For each lane a batch adds members to (with the smallest new delivery_seq): is its first holding
# member *later*, and ready (it must go back to blocked: demote) or already started (an inversion)?
LANE_OVERTAKEN = f"""
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


async def lane_overtaken(conn: AsyncConnection[Any], first_seq: Mapping[Lane, int]) -> tuple[int, int]:
    """Before new members join lanes (``first_seq``: each lane → the smallest new delivery_seq, the
    lanes locked): (lanes whose later first member is ready → demote, lanes whose later member
    already started)."""
    if not first_seq:
        return 0, 0
    lanes = sorted(first_seq)
    cur = await conn.execute(
        LANE_OVERTAKEN,
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


# --------------------------------------------------------------------------------------------------
# The admin trace: where a member stands in each of its lanes (read only, no locks)
# --------------------------------------------------------------------------------------------------

#: ``ahead`` counts at most this many members (a longer queue shows as this number).
LANE_AHEAD_MAX = 10_000


def _position_branch(kind: LaneKind, column: str) -> str:
    return f"""
SELECT m.pack, m.kind, m.key, m.work_id,
       h.work_id AS head_work_id, h.state AS head_state, h.lease_owner AS head_lease_owner,
       h.run_after AS head_run_after,
       p.work_id AS processing_work_id, p.lease_owner AS processing_lease_owner,
       (SELECT count(*) FROM (
          SELECT 1 FROM connector_work_item a
          WHERE a.installed_pack_id = m.pack AND a.{column} = m.key AND {lane_holding("a")}
            AND (a.delivery_seq, a.work_id) < (m.seq, m.work_id)
          LIMIT {LANE_AHEAD_MAX}) x) AS ahead
FROM m
LEFT JOIN LATERAL (
  SELECT w.work_id, w.state, w.lease_owner, w.run_after FROM connector_work_item w
  WHERE w.installed_pack_id = m.pack AND w.{column} = m.key AND {_HOLD_W}
  ORDER BY w.delivery_seq, w.work_id LIMIT 1) h ON true
LEFT JOIN LATERAL (
  SELECT w.work_id, w.lease_owner FROM connector_work_item w
  WHERE w.installed_pack_id = m.pack AND w.{column} = m.key AND w.state = 'processing'
  LIMIT 1) p ON true
WHERE m.kind = '{kind.value}'"""


# Per (lane, member): the lane's head (first holding member, ``lane_holding`` order), its member in
# flight, and how many holding members are ahead of the member. The lane partial indexes and the
# unique in-flight backstops; one statement for every lane of a trace.
LANE_POSITION_BATCH = f"""
WITH m AS (
  SELECT * FROM unnest(%(packs)s::bigint[], %(kinds)s::text[], %(keys)s::text[], %(seqs)s::bigint[],
                       %(ids)s::bigint[]) AS m(pack, kind, key, seq, work_id)
){_position_branch(LaneKind.SOURCE, "source_lane_key")}
UNION ALL{_position_branch(LaneKind.TARGET, "target_mutation_lane_key")}
"""


@dataclass(frozen=True, slots=True)
class LaneMember:
    """A WorkItem as one member of one lane."""

    lane: Lane
    delivery_seq: int
    work_id: int


async def lane_position_batch(
    conn: AsyncConnection[Any], members: Sequence[LaneMember]
) -> dict[tuple[Lane, int], dict[str, Any]]:
    """Keyed by (lane, member work id): ``head_work_id``, ``head_state``, ``head_lease_owner``,
    ``head_run_after``, ``processing_work_id``, ``processing_lease_owner``, ``ahead``."""
    if not members:
        return {}
    params = {
        "packs": [m.lane[0] for m in members],
        "kinds": [str(m.lane[1]) for m in members],
        "keys": [m.lane[2] for m in members],
        "seqs": [m.delivery_seq for m in members],
        "ids": [m.work_id for m in members],
    }
    rows = await fetch_dicts(conn, LANE_POSITION_BATCH, params)
    return {((int(r["pack"]), str(r["kind"]), str(r["key"])), int(r["work_id"])): r for r in rows}
