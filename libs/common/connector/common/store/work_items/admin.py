"""The admin API's reads and transitions on ``connector_work_item``: dead letters and one WorkItem
with their event and receipt (built from the aliased select lists ``WORK_ITEM_SELECT_COLUMNS``,
``events.EVENT_SELECT_COLUMNS``, ``receipts.admin.RECEIPT_SELECT_COLUMNS``), replay, cancel, and the
lookups of find and trace."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.debounce import debounce_lock, debounce_unpark_newest
from connector.common.store.events import EVENT_SELECT_COLUMNS
from connector.common.store.lanes import (
    Lane,
    lane_lock_batch,
    lane_settle_batch,
)
from connector.common.store.receipts.admin import RECEIPT_SELECT_COLUMNS
from connector.common.store.rows import fetch_dict, fetch_dicts
from connector.common.store.schema import PARKED
from connector.common.store.work_items.finalize import work_notify

Conn = AsyncConnection[Any]

# ------------------------------------------------------------------------------------------------
# The admin API
# ------------------------------------------------------------------------------------------------

# A WorkItem row as the admin API shows it, each column aliased ``w_<column>`` so it can share a row
# with its event's and receipt's (``connector.executor.admin.convert.work_item`` reads these names).
WORK_ITEM_SELECT_COLUMNS = """
  w.work_id AS w_work_id, w.event_id AS w_event_id, w.installed_pack_id AS w_installed_pack_id,
  w.generation AS w_generation, w.work_type AS w_work_type, w.queue_class AS w_queue_class,
  w.state AS w_state, w.run_after AS w_run_after, w.priority AS w_priority, w.attempts AS w_attempts,
  w.max_attempts AS w_max_attempts, w.delivery_seq AS w_delivery_seq,
  w.source_lane_key AS w_source_lane_key, w.target_mutation_lane_key AS w_target_mutation_lane_key,
  w.lease_owner AS w_lease_owner, w.lease_token AS w_lease_token, w.lease_until AS w_lease_until,
  w.outcome AS w_outcome, w.failure_class AS w_failure_class, w.failure_summary AS w_failure_summary,
  w.replay_count AS w_replay_count, w.created_at AS w_created_at, w.updated_at AS w_updated_at,
  w.finished_at AS w_finished_at, w.rate_key AS w_rate_key, w.concurrency_key AS w_concurrency_key,
  w.debounce_key AS w_debounce_key, w.covered_by AS w_covered_by, w.circuit_key AS w_circuit_key,
  w.priority_head_s AS w_priority_head_s"""


# The failure read path follows the generation's claim path (seed: "Failure, DLQ, And Replay Read
# Path"): a generation admitted by a rollback receipt (legacy_event / legacy_active, or quiescing on
# its way back) has its failures on the legacy path (``legacy.LEGACY_FAILURE_DEAD_LETTERS``); every
# other generation's on its WorkItems. The authority row is one per generation (primary key).
WORK_ITEM_FAILURE_OWNED = (
    "NOT EXISTS (SELECT 1 FROM connector_claim_authority a WHERE a.installed_pack_id = w.installed_pack_id"
    " AND a.generation = w.generation AND (a.claim_path = 'legacy_event' OR a.phase = 'quiescing'))"
)


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters a list or a bulk replay covers. Statements are built from constant
    fragments for the filters present (never a ``param IS NULL OR`` catch-all, which gives generic
    plans that ignore the partial indexes)."""

    installed_pack_id: int | None = None
    generation: int | None = None
    work_type: str | None = None
    failure_class: str | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    #: Exactly this failure summary (a failure group's, ListFailureGroups).
    failure_summary: str | None = None
    #: Only these items (a selection; ``work_item_list_dead_ids``).
    work_ids: tuple[int, ...] | None = None

    def legacy_where(self) -> tuple[list[str], dict[str, Any]]:
        """The same filter on a legacy outcome receipt ``o`` (its creation is the finish time)."""
        clauses: list[str] = []
        params: dict[str, Any] = {}
        for value, clause, name in (
            (self.installed_pack_id, "o.installed_pack_id = %(pack)s", "pack"),
            (self.generation, "o.generation = %(generation)s", "generation"),
            (self.work_type, "o.work_type = %(work_type)s", "work_type"),
            (self.failure_class, "o.failure_class = %(failure_class)s", "failure_class"),
            (self.finished_after, "o.created_at >= %(after)s", "after"),
            (self.finished_before, "o.created_at < %(before)s", "before"),
            (self.failure_summary, "o.failure_summary = %(summary)s", "summary"),
        ):
            if value is not None:
                clauses.append(clause)
                params[name] = value
        if self.work_ids is not None:
            clauses.append("w.work_id = ANY(%(ids)s::bigint[])")
            params["ids"] = list(self.work_ids)
        return clauses or ["true"], params

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pack": self.installed_pack_id,
            "generation": self.generation,
            "work_type": self.work_type,
            "failure_class": self.failure_class,
            "after": self.finished_after.isoformat() if self.finished_after else None,
            "before": self.finished_before.isoformat() if self.finished_before else None,
        }
        if self.failure_summary is not None:  # absent keys keep earlier page tokens valid
            out["summary"] = self.failure_summary
        if self.work_ids is not None:
            out["ids"] = list(self.work_ids)
        return out

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """Conditions on alias ``w`` (state = 'dead' included) and their parameters. Only items of
        generations whose failures the WorkItem path owns (``WORK_ITEM_FAILURE_OWNED``)."""
        clauses = ["w.state = 'dead'", WORK_ITEM_FAILURE_OWNED]
        params: dict[str, Any] = {}
        if self.installed_pack_id is not None:
            clauses.append("w.installed_pack_id = %(pack)s")
            params["pack"] = self.installed_pack_id
        if self.generation is not None:
            clauses.append("w.generation = %(generation)s")
            params["generation"] = self.generation
        if self.work_type is not None:
            clauses.append("w.work_type = %(work_type)s")
            params["work_type"] = self.work_type
        if self.failure_class is not None:
            clauses.append("w.failure_class = %(failure_class)s")
            params["failure_class"] = self.failure_class
        if self.finished_after is not None:
            clauses.append("w.finished_at >= %(after)s")
            params["after"] = self.finished_after
        if self.finished_before is not None:
            clauses.append("w.finished_at < %(before)s")
            params["before"] = self.finished_before
        if self.failure_summary is not None:
            clauses.append("w.failure_summary = %(summary)s")
            params["summary"] = self.failure_summary
        if self.work_ids is not None:
            clauses.append("w.work_id = ANY(%(ids)s::bigint[])")
            params["ids"] = list(self.work_ids)
        return clauses, params


# Dead WorkItems with their event and receipt, newest finish first, keyset on (finished_at,
# work_id): ``ix_connector_work_item_dead`` (installed_pack_id, finished_at, work_id) WHERE state =
# 'dead'. ``{where}``: ``DeadLetterFilter.where()`` and the keyset.
WORK_ITEM_LIST_DEAD = (
    f"SELECT {WORK_ITEM_SELECT_COLUMNS}, {EVENT_SELECT_COLUMNS}, {RECEIPT_SELECT_COLUMNS} "
    "\nFROM connector_work_item w"
    "\nJOIN connector_event e ON e.event_id = w.event_id"
    "\nJOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id"
    " WHERE {where} ORDER BY w.finished_at DESC, w.work_id DESC LIMIT %(limit)s"
)

# One WorkItem with its event and receipt (outer joins: shown even without them); the body only
# when ``with_body`` (a caller allowed to see payloads).
WORK_ITEM_GET = f"""
SELECT {WORK_ITEM_SELECT_COLUMNS}, {EVENT_SELECT_COLUMNS}, {RECEIPT_SELECT_COLUMNS},
       CASE WHEN %(with_body)s THEN r.body END AS r_body
FROM connector_work_item w
LEFT JOIN connector_event e ON e.event_id = w.event_id
LEFT JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
WHERE w.work_id = %(work_id)s
"""


# The ids of every dead letter matching a filter (a bulk replay's worklist), in lane order
# ((delivery_seq, work_id), ADR 003): a batch boundary never replays a later member of a lane before
# an earlier one.
WORK_ITEM_LIST_DEAD_IDS = (
    "SELECT w.work_id FROM connector_work_item w WHERE {where} ORDER BY w.delivery_seq, w.work_id"
)

# Dead letters grouped into incidents (ListFailureGroups): per pack the newest %(scan)s dead items
# (a backward range of ``ix_connector_work_item_dead`` (installed_pack_id, finished_at, work_id)),
# grouped by work type, failure class and summary; ``pack_truncated``: the pack has more. ``{packs}``:
# every installed pack, or one (WORK_ITEM_DEAD_GROUP_PACKS_*). Only dead letters of generations whose
# failures the WorkItem path owns are counted (``owned``: the rule of ``WORK_ITEM_FAILURE_OWNED``, as
# ListDeadLetters), computed on the rows of the range, never in its WHERE: a filter there made the
# planner read every dead row at 1M rows (a bitmap scan and a sort instead of the backward range).
WORK_ITEM_DEAD_GROUP = """
SELECT * FROM (
    SELECT g.installed_pack_id, p.name AS pack_name, g.work_type, g.failure_class, g.failure_summary,
           count(*) FILTER (WHERE g.rn <= %(scan)s AND g.owned) AS n,
           min(g.finished_at) FILTER (WHERE g.rn <= %(scan)s AND g.owned) AS first_at,
           max(g.finished_at) FILTER (WHERE g.rn <= %(scan)s AND g.owned) AS last_at,
           max(g.work_id) FILTER (WHERE g.rn <= %(scan)s AND g.owned) AS sample_work_id,
           max(max(g.rn)) OVER (PARTITION BY g.installed_pack_id) > %(scan)s AS pack_truncated
    FROM connector_installed_pack p
    CROSS JOIN LATERAL (
        SELECT w.installed_pack_id, w.work_type, w.failure_class, w.failure_summary, w.finished_at,
               w.work_id, row_number() OVER (ORDER BY w.finished_at DESC, w.work_id DESC) AS rn,
               w.generation <> ALL (ARRAY(SELECT a.generation FROM connector_claim_authority a
                                          WHERE a.installed_pack_id = p.installed_pack_id
                                            AND (a.claim_path = 'legacy_event' OR a.phase = 'quiescing')))
                 AS owned
        FROM connector_work_item w
        WHERE w.state = 'dead' AND w.installed_pack_id = p.installed_pack_id
        ORDER BY w.finished_at DESC, w.work_id DESC
        LIMIT %(scan)s + 1
    ) g
    WHERE {packs}
    GROUP BY g.installed_pack_id, p.name, g.work_type, g.failure_class, g.failure_summary
) grouped
WHERE n > 0
ORDER BY n DESC, last_at DESC, installed_pack_id, work_type
LIMIT %(limit)s
"""
WORK_ITEM_DEAD_GROUP_PACKS_ALL = "TRUE"
WORK_ITEM_DEAD_GROUP_PACKS_ONE = "p.installed_pack_id = %(pack)s"

WORK_ITEM_GET_MANY = f"""
SELECT {WORK_ITEM_SELECT_COLUMNS} FROM connector_work_item w WHERE w.work_id = ANY(%(ids)s::bigint[])
"""

# Replay (admin/replay.py checks; docs/admin.md): what the checks read of each item, its event and
# its receipt.
WORK_ITEM_REPLAY_CANDIDATES = """
SELECT w.work_id, w.state, w.replay_count, w.installed_pack_id, w.work_type,
       w.source_lane_key, w.target_mutation_lane_key,
       e.incarnation, e.execution_owner, r.route_key,
       (r.body IS NOT NULL OR r.body_ref IS NOT NULL) AS has_body,
       e.companion, e.idempotency_key, e.payload_sha256, r.provider_delivery_id
FROM connector_work_item w
JOIN connector_event e ON e.event_id = w.event_id
JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
WHERE w.work_id = ANY(%(ids)s::bigint[])
"""

# The stored bodies of replay candidates whose current route takes the delivery id from the body
# (replay re-derives the event's identity from it); by primary keys.
WORK_ITEM_REPLAY_BODIES = """
SELECT w.work_id, r.body
FROM connector_work_item w
JOIN connector_event e ON e.event_id = w.event_id
JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
WHERE w.work_id = ANY(%(ids)s::bigint[])
"""

# The replay transition, fenced by the state seen (``dead``, or ``cancelled``: a cancel can be
# undone by a replay) and ``replay_count = <seen>``: a concurrent replay or transition makes a row
# match nothing. The item moves to the active generation with its work
# type's settings; lane members go ``blocked`` (the settle promotes the runnable ones).
WORK_ITEM_REPLAY_BATCH = """
UPDATE connector_work_item w SET
  state = CASE WHEN w.source_lane_key IS NULL AND w.target_mutation_lane_key IS NULL
               THEN 'pending' ELSE 'blocked' END,
  generation = v.generation,
  queue_class = v.queue_class,
  priority = v.priority,
  priority_head_s = v.priority_head_s,
  max_attempts = v.max_attempts,
  dead_blocks_lane = v.dead_blocks_lane,
  attempts = 0,
  run_after = now(),
  replay_count = w.replay_count + 1,
  outcome = NULL,
  lease_owner = NULL,
  lease_until = NULL,
  started_at = NULL,
  finished_at = NULL,
  updated_at = clock_timestamp()
FROM unnest(%(ids)s::bigint[], %(seen)s::int[], %(generations)s::int[], %(queue_classes)s::text[],
            %(priorities)s::smallint[], %(heads)s::float8[], %(max_attempts)s::int[],
            %(dead_blocks)s::boolean[], %(seen_states)s::text[])
  AS v(work_id, seen_replay_count, generation, queue_class, priority, priority_head_s, max_attempts,
       dead_blocks_lane, seen_state)
WHERE w.work_id = v.work_id AND w.state IN ('dead', 'cancelled') AND w.state = v.seen_state
  AND w.replay_count = v.seen_replay_count
RETURNING w.work_id
"""


@dataclass(frozen=True, slots=True)
class Replayable:
    """A dead item that passed the replay checks: the replay count it was seen with (the fence) and
    the active generation's settings for its work type."""

    work_id: int
    seen_replay_count: int
    installed_pack_id: int
    generation: int
    queue_class: str
    priority: int
    max_attempts: int
    dead_blocks_lane: bool
    lanes: tuple[Lane, ...]
    seen_state: str = "dead"
    #: The active generation's head start for its work type (``packs.priority_heads``).
    priority_head_s: float = 0.0


async def work_item_list_dead(
    conn: Conn,
    flt: DeadLetterFilter,
    *,
    after: tuple[datetime | None, int] | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Dead WorkItems matching ``flt`` with event and receipt context, after the keyset."""
    clauses, params = flt.where()
    if after is not None:
        finished, work_id = after
        params["k_work_id"] = work_id
        if finished is None:  # NULL finish times sort first in DESC order
            clauses.append("(w.finished_at IS NOT NULL OR w.work_id < %(k_work_id)s)")
        else:
            params["k_finished"] = finished
            clauses.append("(w.finished_at, w.work_id) < (%(k_finished)s, %(k_work_id)s)")
    params["limit"] = limit
    return await fetch_dicts(conn, WORK_ITEM_LIST_DEAD.format(where=" AND ".join(clauses)), params)


async def work_item_get(conn: Conn, work_id: int, *, with_body: bool) -> dict[str, Any] | None:
    return await fetch_dict(conn, WORK_ITEM_GET, {"work_id": work_id, "with_body": with_body})


async def work_item_list_dead_ids(conn: Conn, flt: DeadLetterFilter) -> list[int]:
    clauses, params = flt.where()
    cur = await conn.execute(WORK_ITEM_LIST_DEAD_IDS.format(where=" AND ".join(clauses)), params)
    return [int(r[0]) for r in await cur.fetchall()]


async def work_item_dead_group(
    conn: Conn, installed_pack_id: int | None, *, scan: int, limit: int
) -> list[dict[str, Any]]:
    """Dead-letter groups over the newest ``scan`` dead items of each pack (or of one pack), most
    frequent first; ``pack_truncated``: the pack has older dead items than those grouped."""
    packs = WORK_ITEM_DEAD_GROUP_PACKS_ALL if installed_pack_id is None else WORK_ITEM_DEAD_GROUP_PACKS_ONE
    return await fetch_dicts(
        conn,
        WORK_ITEM_DEAD_GROUP.format(packs=packs),
        {"scan": scan, "limit": limit, "pack": installed_pack_id},
    )


async def work_item_get_many(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    return {int(r["w_work_id"]): r for r in await fetch_dicts(conn, WORK_ITEM_GET_MANY, {"ids": list(ids)})}


async def work_item_replay_candidates(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    rows = await fetch_dicts(conn, WORK_ITEM_REPLAY_CANDIDATES, {"ids": list(ids)})
    return {int(r["work_id"]): r for r in rows}


async def work_item_replay_bodies(conn: Conn, ids: Sequence[int]) -> dict[int, bytes | None]:
    """Work id → its receipt's inline body (``None``: offloaded)."""
    if not ids:
        return {}
    cur = await conn.execute(WORK_ITEM_REPLAY_BODIES, {"ids": list(ids)})
    return {int(r[0]): (bytes(r[1]) if r[1] is not None else None) for r in await cur.fetchall()}


async def work_item_replay_batch(conn: Conn, eligible: Sequence[Replayable]) -> list[int]:
    """The transition for checked items (caller's transaction), lane locks first (ADR 003): lock,
    fenced update, settle, wake-up. Returns the ids replayed; an id missing from the result lost its
    fence (changed since the check)."""
    if not eligible:
        return []
    todo = sorted(eligible, key=lambda r: r.work_id)  # fixed row order (DESIGN §8 trap 1)
    locked = await lane_lock_batch(conn, [lane for r in todo for lane in r.lanes])
    cur = await conn.execute(
        WORK_ITEM_REPLAY_BATCH,
        {
            "ids": [r.work_id for r in todo],
            "seen": [r.seen_replay_count for r in todo],
            "generations": [r.generation for r in todo],
            "queue_classes": [r.queue_class for r in todo],
            "priorities": [r.priority for r in todo],
            "heads": [float(r.priority_head_s) for r in todo],
            "max_attempts": [r.max_attempts for r in todo],
            "dead_blocks": [r.dead_blocks_lane for r in todo],
            "seen_states": [r.seen_state for r in todo],
        },
    )
    replayed = sorted(int(row[0]) for row in await cur.fetchall())
    if locked:
        # demote: a replayed member is earlier than members that moved on while it was dead (a
        # "continue" dead head); they wait again behind it.
        await lane_settle_batch(conn, locked, demote=True)
    if replayed:
        await work_notify(conn)
    return replayed


# Cancel (admin/actions.py; docs/admin.md): what the checks read of one item and its event.
WORK_ITEM_CANCEL_CANDIDATE = """
SELECT w.work_id, w.state, w.lease_token, w.installed_pack_id, w.source_lane_key,
       w.target_mutation_lane_key, w.failure_class, w.failure_summary, e.execution_owner,
       w.work_type, w.debounce_key
FROM connector_work_item w JOIN connector_event e ON e.event_id = w.event_id
WHERE w.work_id = %(id)s
"""

# The cancel transition, fenced by the lease token seen by the checks and a cancellable state: a
# claim in between (``processing``, token + 1) makes it match nothing. A claimer holding the row
# (its claim statement has it locked) makes this wait for that statement's commit and then re-check
# the new row version (READ COMMITTED), which no longer matches; a claimer arriving later skips the
# row this holds (``SKIP LOCKED``). Lane promotions in between (blocked -> pending) keep the token.
WORK_ITEM_CANCEL = """
UPDATE connector_work_item w
SET state = 'cancelled', outcome = 'cancelled', failure_class = 'cancelled',
    failure_summary = left(%(summary)s, 512), lease_owner = NULL, lease_until = NULL,
    finished_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE w.work_id = %(id)s AND w.lease_token = %(token)s
  AND w.state IN ('pending', 'blocked', 'retry', 'dead')
RETURNING w.work_id
"""


async def work_item_cancel_candidate(conn: Conn, work_id: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, WORK_ITEM_CANCEL_CANDIDATE, {"id": work_id})


async def work_item_cancel(
    conn: Conn,
    work_id: int,
    token: int,
    lanes: Sequence[Lane],
    *,
    summary: str,
    debounce: tuple[int, str, str] | None = None,
) -> tuple[bool, int]:
    """Cancel one checked item (caller's transaction), lane locks first (ADR 003): lock, fenced
    update, settle (the lane's next member becomes runnable), wake-up when one was promoted.
    Returns ``(cancelled, lane members promoted)``; ``False``: the fence did not match (claimed or
    changed since the check). A debounced item (``debounce``: pack, work type, key) locks its key
    row first, as the materializer does, and afterwards makes its key's newest waiting item live
    again if it was parked (docs/packs.md#debounce: the cancelled one may have been the live one)."""
    locked = await lane_lock_batch(conn, lanes)
    if debounce is not None:
        await debounce_lock(conn, *debounce)
    cur = await conn.execute(WORK_ITEM_CANCEL, {"id": work_id, "token": token, "summary": summary})
    done = await cur.fetchone() is not None
    if done and debounce is not None:
        await debounce_unpark_newest(conn, *debounce)
    promoted = 0
    if done and locked:
        promoted = (await lane_settle_batch(conn, locked)).promoted
        if promoted:
            await work_notify(conn, "lanes")
    return done, promoted


WORK_ITEM_STATE_BY_EVENT = """
SELECT state FROM connector_work_item WHERE event_id = %(event_id)s AND work_type = %(work_type)s
"""


async def work_item_state_by_event(conn: Conn, event_id: int, work_type: str) -> str | None:
    """The state of an event's WorkItem of ``work_type`` (``None``: there is none)."""
    cur = await conn.execute(WORK_ITEM_STATE_BY_EVENT, {"event_id": event_id, "work_type": work_type})
    row = await cur.fetchone()
    return None if row is None else str(row[0])


# The WorkItems of found or traced deliveries (one statement per page or trace), by their events:
# ``uq_connector_work_item_event_id_work_type``; with the lane policy the trace's wait reads.
WORK_ITEM_LIST_BY_EVENTS = f"""
SELECT {WORK_ITEM_SELECT_COLUMNS}, w.dead_blocks_lane AS w_dead_blocks_lane,
  w.started_at AS w_started_at
FROM connector_work_item w WHERE w.event_id = ANY(%(ids)s::bigint[])
ORDER BY w.event_id, w.work_id
"""


async def work_item_list_by_events(conn: Conn, event_ids: Sequence[int]) -> list[dict[str, Any]]:
    if not event_ids:
        return []
    return await fetch_dicts(conn, WORK_ITEM_LIST_BY_EVENTS, {"ids": list(event_ids)})


# The kept ended attempts of a delivery's WorkItems (the trace, issue #25): primary-key ranges of
# ``connector_work_attempt`` (at most ``finalize.ATTEMPTS_KEPT`` rows per item), in claim order.
WORK_ATTEMPT_LIST = """
SELECT a.work_id, a.lease_token, a.attempt, a.lease_owner, a.started_at, a.ended_at, a.outcome,
       a.failure_class, a.failure_summary
FROM connector_work_attempt a WHERE a.work_id = ANY(%(ids)s::bigint[])
ORDER BY a.work_id, a.lease_token
"""


async def work_attempt_list(conn: Conn, work_ids: Sequence[int]) -> list[dict[str, Any]]:
    if not work_ids:
        return []
    return await fetch_dicts(conn, WORK_ATTEMPT_LIST, {"ids": list(work_ids)})


# The receipt of a WorkItem's event (TraceDelivery by work id): two primary-key probes.
WORK_ITEM_RECEIPT_ID = """
SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e ON e.event_id = w.event_id
WHERE w.work_id = %(work_id)s
"""


async def work_item_receipt_id(conn: Conn, work_id: int) -> int | None:
    cur = await conn.execute(WORK_ITEM_RECEIPT_ID, {"work_id": work_id})
    row = await cur.fetchone()
    return None if row is None else int(row[0])


# --------------------------------------------------------------------------------------------------
# A circuit closed by an operator (admin CloseCircuit): its held items are due at once
# --------------------------------------------------------------------------------------------------

# The waiting items of one circuit whose due time some transition moved (``updated_at > created_at``):
# held back by the open circuit at a claim (deferred to the end of its open period), or retrying a
# failure of its target. Closing the circuit says the target answers again, so they are due now; an
# item whose ``run_after`` nothing moved (a delayed first run) keeps it, and so do items parked by a
# concurrency or debounce key (``PARKED``) and debounced items (their due time is the debounce
# window's). Index: ``ix_connector_work_item_circuit_key`` (pack, key, state). Caller's transaction,
# after the circuit row was locked and closed (``circuits.circuit_set``).
WORK_ITEM_CIRCUIT_RELEASE = f"""
UPDATE connector_work_item w SET run_after = now(), updated_at = clock_timestamp()
WHERE w.installed_pack_id = %(pack)s AND w.circuit_key = %(key)s AND w.state IN ('pending', 'retry')
  AND w.run_after > now() AND w.run_after <> {PARKED} AND w.debounce_key IS NULL
  AND w.updated_at > w.created_at
"""


async def work_item_circuit_release(conn: Conn, pack: int, key: str) -> int:
    """Make the held items of circuit ``(pack, key)`` due now; how many (caller's transaction)."""
    cur = await conn.execute(WORK_ITEM_CIRCUIT_RELEASE, {"pack": pack, "key": key})
    count = cur.rowcount
    if count:
        await work_notify(conn)
    return max(0, count)
