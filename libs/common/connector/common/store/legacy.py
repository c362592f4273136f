"""Every statement of the legacy Event claim path (``connector executor --claim-path event``, a rollback
bridge; docs/cutover.md): the legacy columns of ``connector_event`` (``execution_owner``,
``legacy_state``, lease and attempts) and ``connector_legacy_outcome_receipt``.

Contract: every legacy claim, renewal and reclaim joins the generation's authority row ``FOR SHARE``
and requires ``legacy_active`` plus this process's scheduler lease (``store.authority``); renewals,
finalizes and reclaims are fenced by the Event's legacy lease token; a finalize writes the Event's
state and its versioned outcome receipts in one statement. State lists are inlined literals (DESIGN
§8 trap 5); the claim update finds its rows by key only (ADR 008; tests/cutover/test_legacy_plans.py).

Reads joined here (driving table ``connector_event`` or the receipts): the route fan-out with each
work type's WorkItem and latest receipt (``event_legacy_work_plan``, ``event_legacy_latest_outcomes``),
the authority of an event (``event_legacy_get_for_update``), the cutover gates' drain, coverage and
ownership switch of a whole generation (``event_legacy_drain``, ``event_generation_coverage``,
``event_owner_switch_to_work_item``), the admin API's legacy failure list with each receipt's event,
delivery and WorkItem state (``legacy_outcome_receipt_list_failed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.authority import LEGACY_AUTHORITY as _LEGACY_AUTHORITY
from connector.common.store.authority import SCHEDULER_LEASE_HELD as _SCHEDULER_LEASE_HELD
from connector.common.store.events import EVENT_SELECT_COLUMNS
from connector.common.store.lanes import lane_holding
from connector.common.store.receipts.admin import RECEIPT_SELECT_COLUMNS
from connector.common.store.rows import fetch_dict, fetch_dicts
from connector.common.store.tokens import token_next

Conn = AsyncConnection[Any]

# One claim statement (see the module docstring). Inlined state literals (DESIGN §8 trap 5). The
# update finds its rows by key only: the candidates are locked by this statement with their
# conditions re-evaluated on the newest row version, so a state re-check would be redundant, and it
# let the planner drive the update from the partial legacy index, whose estimate comes from
# statistics taken when nothing was pending (ADR 008; tests/cutover/test_legacy_plans.py).
EVENT_LEGACY_CLAIM_BATCH = f"""
WITH auth AS MATERIALIZED ({_LEGACY_AUTHORITY}
), lease AS MATERIALIZED ({_SCHEDULER_LEASE_HELD}
), cand AS (
  SELECT e.event_id FROM connector_event e
  WHERE e.installed_pack_id = %(pack)s AND e.generation = %(generation)s
    AND e.legacy_state IN ('pending', 'retry')
    AND EXISTS (SELECT 1 FROM auth) AND EXISTS (SELECT 1 FROM lease)
    AND e.execution_owner = 'legacy_event'
    AND (e.legacy_run_after IS NULL OR e.legacy_run_after <= now())
    AND NOT EXISTS (
      SELECT 1 FROM connector_event p
      WHERE p.installed_pack_id = e.installed_pack_id AND p.generation = e.generation
        AND p.source_object_id = e.source_object_id AND p.event_id < e.event_id
        AND p.legacy_state IN ('pending', 'processing', 'retry')
        AND p.source_object_kind IS NOT DISTINCT FROM e.source_object_kind)
  ORDER BY e.event_id
  LIMIT %(limit)s
  FOR UPDATE OF e SKIP LOCKED
)
UPDATE connector_event e
SET legacy_state = 'processing', legacy_lease_token = {token_next("e.legacy_lease_token")},
    legacy_lease_owner = %(owner)s,
    legacy_lease_until = clock_timestamp() + make_interval(secs => %(lease_s)s::float8),
    legacy_attempts = e.legacy_attempts + 1, legacy_run_after = NULL
WHERE e.event_id = ANY (ARRAY(SELECT cand.event_id FROM cand))
RETURNING e.event_id, e.legacy_lease_token, e.legacy_attempts
"""

EVENT_LEGACY_RENEW_LEASE_BATCH = """
UPDATE connector_event e
SET legacy_lease_until = clock_timestamp() + make_interval(secs => %(lease_s)s::float8)
WHERE e.event_id = ANY(%(ids)s::bigint[]) AND e.legacy_state = 'processing'
  AND e.legacy_lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], e.event_id)]
RETURNING e.event_id
"""

# Expired legacy leases go back to retry (the token moves on, so the stale holder's writes match
# nothing). Only the scheduler lease holder reclaims, and only while legacy claims are admitted.
EVENT_LEGACY_RECLAIM_EXPIRED = f"""
WITH auth AS MATERIALIZED ({_LEGACY_AUTHORITY}
), lease AS MATERIALIZED ({_SCHEDULER_LEASE_HELD}
)
UPDATE connector_event e
SET legacy_state = 'retry', legacy_lease_token = {token_next("e.legacy_lease_token")},
    legacy_lease_owner = NULL, legacy_lease_until = NULL, legacy_run_after = now()
WHERE e.installed_pack_id = %(pack)s AND e.generation = %(generation)s
  AND e.legacy_state = 'processing' AND e.legacy_lease_until < clock_timestamp()
  AND EXISTS (SELECT 1 FROM auth) AND EXISTS (SELECT 1 FROM lease)
RETURNING e.event_id
"""

_HOLD_P = lane_holding("p")

# Per claimed event: the route's fan-out work types in order, the WorkItem of each (if any), the
# latest legacy outcome receipt of each (if any), and whether a fenced WorkItem must still wait for an
# earlier member of its source or target lane (ADR 003 order, kept on the legacy path too).
EVENT_LEGACY_WORK_PLAN = f"""
SELECT e.event_id, f.ord::int AS ord, f.spec->>'work_type' AS work_type,
       w.work_id, w.state AS work_state, w.source_lane_key, w.target_mutation_lane_key,
       w.queue_class, l.version AS receipt_version, l.outcome AS receipt_outcome,
       coalesce(w.state = 'awaiting_legacy_outcome' AND (
         (w.source_lane_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM connector_work_item p
            WHERE p.installed_pack_id = w.installed_pack_id AND p.source_lane_key = w.source_lane_key
              AND {_HOLD_P} AND (p.delivery_seq, p.work_id) < (w.delivery_seq, w.work_id)))
         OR (w.target_mutation_lane_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM connector_work_item p
            WHERE p.installed_pack_id = w.installed_pack_id
              AND p.target_mutation_lane_key = w.target_mutation_lane_key
              AND {_HOLD_P} AND (p.delivery_seq, p.work_id) < (w.delivery_seq, w.work_id)))), false)
         AS lane_wait
FROM connector_event e
JOIN connector_route r ON r.route_id = e.route_id
CROSS JOIN LATERAL jsonb_array_elements(r.config->'fan_out') WITH ORDINALITY AS f(spec, ord)
LEFT JOIN connector_work_item w ON w.event_id = e.event_id AND w.work_type = f.spec->>'work_type'
LEFT JOIN LATERAL (
  SELECT o.version, o.outcome FROM connector_legacy_outcome_receipt o
  WHERE o.event_id = e.event_id AND o.work_type = f.spec->>'work_type'
  ORDER BY o.version DESC LIMIT 1) l ON true
WHERE e.event_id = ANY(%(ids)s::bigint[])
ORDER BY e.event_id, f.ord
"""

# Finalize one legacy attempt: the Event's state and its outcome receipts, one statement (so one
# transaction), fenced by the lease token. A receipt whose digest equals the latest one of its work
# type (a duplicate delivery of the same outcome) is not written again.
EVENT_LEGACY_FINALIZE = """
WITH ev AS (
  UPDATE connector_event e
  SET legacy_state = %(state)s, legacy_lease_owner = NULL, legacy_lease_until = NULL,
      legacy_attempts = e.legacy_attempts - %(refund)s,
      legacy_run_after = CASE WHEN %(state)s = 'retry'
                              THEN now() + make_interval(secs => %(delay_s)s::float8) END
  WHERE e.event_id = %(event_id)s AND e.legacy_lease_token = %(token)s
    AND e.legacy_state = 'processing' AND e.execution_owner = 'legacy_event'
  RETURNING e.event_id, e.installed_pack_id, e.generation
), t AS (
  SELECT * FROM unnest(%(work_types)s::text[], %(outcomes)s::text[], %(classes)s::text[],
                       %(summaries)s::text[], %(digests)s::text[])
    WITH ORDINALITY AS t(work_type, outcome, failure_class, failure_summary, digest, ord)
), ins AS (
  INSERT INTO connector_legacy_outcome_receipt (installed_pack_id, generation, event_id, work_type,
    version, outcome, failure_class, failure_summary, actor, digest)
  SELECT ev.installed_pack_id, ev.generation, ev.event_id, t.work_type, coalesce(l.version, 0) + 1,
         t.outcome, t.failure_class, t.failure_summary, %(actor)s, t.digest
  FROM ev CROSS JOIN t
  LEFT JOIN LATERAL (
    SELECT o.version, o.digest FROM connector_legacy_outcome_receipt o
    WHERE o.event_id = ev.event_id AND o.work_type = t.work_type
    ORDER BY o.version DESC LIMIT 1) l ON true
  WHERE l.digest IS DISTINCT FROM t.digest
  ORDER BY t.ord
  ON CONFLICT (event_id, work_type, version) DO NOTHING
  RETURNING legacy_outcome_receipt_id
)
SELECT (SELECT count(*) FROM ev)::int, ARRAY(SELECT legacy_outcome_receipt_id FROM ins)
"""

LEGACY_OUTCOME_RECEIPT_LATEST = """
SELECT o.legacy_outcome_receipt_id, o.version, o.outcome, o.digest, o.projected
FROM connector_legacy_outcome_receipt o
WHERE o.event_id = %(event_id)s AND o.work_type = %(work_type)s
ORDER BY o.version DESC LIMIT 1
"""

LEGACY_OUTCOME_RECEIPT_INSERT = """
INSERT INTO connector_legacy_outcome_receipt (installed_pack_id, generation, event_id, work_type, version,
  outcome, failure_class, failure_summary, actor, digest)
VALUES (%(pack)s, %(generation)s, %(event_id)s, %(work_type)s, %(version)s, %(outcome)s,
        %(failure_class)s, %(failure_summary)s, %(actor)s, %(digest)s)
RETURNING legacy_outcome_receipt_id, version
"""

# Unprojected receipts in id order after a keyset (conflicts stay unprojected and are passed over).
LEGACY_OUTCOME_RECEIPT_UNPROJECTED = """
SELECT o.legacy_outcome_receipt_id, o.installed_pack_id, o.generation, o.event_id, o.work_type,
       o.version, o.outcome, o.failure_class, o.failure_summary, o.digest, o.created_at
FROM connector_legacy_outcome_receipt o
WHERE NOT o.projected AND o.legacy_outcome_receipt_id > %(after)s
  AND (%(pack)s::bigint IS NULL OR o.installed_pack_id = %(pack)s)
  AND (%(generation)s::int IS NULL OR o.generation = %(generation)s)
  AND (%(events)s::bigint[] IS NULL OR o.event_id = ANY(%(events)s::bigint[]))
ORDER BY o.legacy_outcome_receipt_id
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED
"""

LEGACY_OUTCOME_RECEIPT_MARK_PROJECTED = """
UPDATE connector_legacy_outcome_receipt SET projected = true
WHERE legacy_outcome_receipt_id = ANY(%(ids)s::bigint[]) AND NOT projected
"""

EVENT_LEGACY_GET_FOR_UPDATE = """
SELECT e.event_id, e.installed_pack_id, e.generation, e.execution_owner, e.legacy_state,
       a.claim_path, a.phase
FROM connector_event e
LEFT JOIN connector_claim_authority a
  ON a.installed_pack_id = e.installed_pack_id AND a.generation = e.generation
WHERE e.event_id = %(event_id)s
FOR UPDATE OF e
"""

# The latest outcome of every work type of one event (after a resolution: the event's new state).
EVENT_LEGACY_LATEST_OUTCOMES = """
SELECT f.spec->>'work_type' AS work_type, l.outcome, w.state AS work_state
FROM connector_event e
JOIN connector_route r ON r.route_id = e.route_id
CROSS JOIN LATERAL jsonb_array_elements(r.config->'fan_out') f(spec)
LEFT JOIN connector_work_item w ON w.event_id = e.event_id AND w.work_type = f.spec->>'work_type'
LEFT JOIN LATERAL (
  SELECT o.outcome FROM connector_legacy_outcome_receipt o
  WHERE o.event_id = e.event_id AND o.work_type = f.spec->>'work_type'
  ORDER BY o.version DESC LIMIT 1) l ON true
WHERE e.event_id = %(event_id)s
"""

EVENT_LEGACY_SET_STATE = """
UPDATE connector_event SET legacy_state = %(state)s,
  legacy_run_after = CASE WHEN %(state)s = 'retry' THEN now() END
WHERE event_id = %(event_id)s AND execution_owner = 'legacy_event' AND legacy_state <> 'processing'
"""

# Legacy Event leases of the generation (the partial legacy index): active, expired with a live
# holder, orphaned (expired, holder gone).
EVENT_LEGACY_DRAIN = """
SELECT count(*)::bigint AS processing,
       count(*) FILTER (WHERE e.legacy_lease_until >= clock_timestamp())::bigint AS leases_active,
       count(*) FILTER (WHERE e.legacy_lease_until < clock_timestamp()
                          AND p.process_id IS NOT NULL)::bigint AS expired_holder_alive,
       count(*) FILTER (WHERE (e.legacy_lease_until IS NULL OR e.legacy_lease_until < clock_timestamp())
                          AND p.process_id IS NULL)::bigint AS orphaned,
       coalesce(array_agg(e.event_id ORDER BY e.event_id), '{}') AS event_ids
FROM connector_event e
LEFT JOIN connector_process p
  ON p.process_id = e.legacy_lease_owner
 AND p.heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8)
WHERE e.installed_pack_id = %(pack)s AND e.generation = %(generation)s AND e.legacy_state = 'processing'
"""

LEGACY_OUTCOME_RECEIPT_UNPROJECTED_COUNT = """
SELECT count(*)::bigint AS n,
       coalesce((array_agg(legacy_outcome_receipt_id ORDER BY legacy_outcome_receipt_id))[1:10],
                '{}') AS sample
FROM connector_legacy_outcome_receipt
WHERE NOT projected AND installed_pack_id = %(pack)s AND generation = %(generation)s
"""

# One pass over the generation's events: ownership, legacy states, and every (event, work type) of
# the route fan-out that has no WorkItem row (a missing route counts as a gap).
EVENT_GENERATION_COVERAGE = """
WITH ev AS (
  SELECT e.event_id, e.execution_owner, e.legacy_state, r.config->'fan_out' AS fan_out
  FROM connector_event e
  LEFT JOIN connector_route r ON r.route_id = e.route_id
  WHERE e.installed_pack_id = %(pack)s AND e.generation = %(generation)s
), gaps AS (
  SELECT ev.event_id FROM ev
  CROSS JOIN LATERAL jsonb_array_elements(coalesce(ev.fan_out, '[{}]'::jsonb)) AS f(spec)
  WHERE NOT EXISTS (SELECT 1 FROM connector_work_item w
                    WHERE w.event_id = ev.event_id AND w.work_type = f.spec->>'work_type')
)
SELECT (SELECT count(*) FROM ev)::bigint AS events,
       (SELECT count(*) FROM ev WHERE execution_owner = 'legacy_event')::bigint AS legacy_owned,
       (SELECT count(*) FROM ev WHERE legacy_state IN ('pending', 'retry'))::bigint AS legacy_open,
       (SELECT count(*) FROM ev WHERE legacy_state IN ('succeeded', 'failed'))::bigint AS legacy_terminal,
       (SELECT count(*) FROM ev WHERE legacy_state = 'unknown')::bigint AS legacy_unknown,
       (SELECT count(*) FROM gaps)::bigint AS missing_work_items,
       coalesce((SELECT array_agg(event_id) FROM (
          SELECT DISTINCT event_id FROM gaps ORDER BY event_id LIMIT 10) s), '{}') AS missing_sample
"""

# Gate 3's Event ownership field: the whole generation moves to the WorkItem path. Unfinished legacy
# states are cleared (their WorkItems own them now); final ones stay as provenance.
EVENT_OWNER_SWITCH_TO_WORK_ITEM = """
UPDATE connector_event e
SET execution_owner = 'work_item',
    legacy_state = CASE WHEN e.legacy_state IN ('pending', 'retry') THEN NULL ELSE e.legacy_state END,
    legacy_lease_owner = NULL, legacy_lease_until = NULL, legacy_run_after = NULL
WHERE e.installed_pack_id = %(pack)s AND e.generation = %(generation)s
  AND e.execution_owner = 'legacy_event'
"""


# --------------------------------------------------------------------------------------------------
# Claim, renew, reclaim, finalize (the legacy executor)
# --------------------------------------------------------------------------------------------------


async def event_legacy_claim_batch(conn: Conn, params: dict[str, Any]) -> list[tuple[int, int, int]]:
    """Claim up to ``limit`` events (``pack``, ``generation``, ``owner``, ``lease_token`` of the
    scheduler lease, ``lease_s``); ``(event_id, legacy lease token, attempt)`` each."""
    cur = await conn.execute(EVENT_LEGACY_CLAIM_BATCH, params)
    return [(int(r[0]), int(r[1]), int(r[2])) for r in await cur.fetchall()]


async def event_legacy_renew_lease_batch(
    conn: Conn, ids: Sequence[int], tokens: Sequence[int], *, lease_s: float
) -> set[int]:
    """Extend the legacy leases still held; returns the event ids renewed."""
    cur = await conn.execute(
        EVENT_LEGACY_RENEW_LEASE_BATCH, {"ids": list(ids), "tokens": list(tokens), "lease_s": lease_s}
    )
    return {int(r[0]) for r in await cur.fetchall()}


async def event_legacy_reclaim_expired(conn: Conn, params: dict[str, Any]) -> int:
    """Expired legacy leases back to retry (the scheduler lease holder only); how many."""
    cur = await conn.execute(EVENT_LEGACY_RECLAIM_EXPIRED, params)
    return len(await cur.fetchall())


async def event_legacy_work_plan(conn: Conn, event_ids: Sequence[int]) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, EVENT_LEGACY_WORK_PLAN, {"ids": list(event_ids)})


async def event_legacy_finalize(conn: Conn, params: dict[str, Any]) -> tuple[int, list[int]]:
    """``(events matched: 0 when the lease was lost, receipt ids written)``."""
    cur = await conn.execute(EVENT_LEGACY_FINALIZE, params)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), [int(x) for x in (row[1] or [])]


# --------------------------------------------------------------------------------------------------
# Legacy outcome receipts
# --------------------------------------------------------------------------------------------------


async def legacy_outcome_receipt_latest(conn: Conn, event_id: int, work_type: str) -> dict[str, Any] | None:
    return await fetch_dict(
        conn, LEGACY_OUTCOME_RECEIPT_LATEST, {"event_id": event_id, "work_type": work_type}
    )


async def legacy_outcome_receipt_insert(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, LEGACY_OUTCOME_RECEIPT_INSERT, params)


async def legacy_outcome_receipt_unprojected(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Unprojected receipts after the keyset ``after``, locked (SKIP LOCKED) for the transaction."""
    return await fetch_dicts(conn, LEGACY_OUTCOME_RECEIPT_UNPROJECTED, params)


async def legacy_outcome_receipt_mark_projected(conn: Conn, ids: Sequence[int]) -> None:
    await conn.execute(LEGACY_OUTCOME_RECEIPT_MARK_PROJECTED, {"ids": list(ids)})


async def legacy_outcome_receipt_unprojected_count(conn: Conn, params: dict[str, Any]) -> dict[str, Any]:
    row = await fetch_dict(conn, LEGACY_OUTCOME_RECEIPT_UNPROJECTED_COUNT, params)
    assert row is not None
    return row


# --------------------------------------------------------------------------------------------------
# Operator resolution of an unknown outcome
# --------------------------------------------------------------------------------------------------


async def event_legacy_get_for_update(conn: Conn, event_id: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, EVENT_LEGACY_GET_FOR_UPDATE, {"event_id": event_id})


async def event_legacy_latest_outcomes(conn: Conn, event_id: int) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, EVENT_LEGACY_LATEST_OUTCOMES, {"event_id": event_id})


async def event_legacy_set_state(conn: Conn, event_id: int, state: str) -> None:
    await conn.execute(EVENT_LEGACY_SET_STATE, {"event_id": event_id, "state": state})


# --------------------------------------------------------------------------------------------------
# The cutover gates over a whole generation
# --------------------------------------------------------------------------------------------------


async def event_legacy_drain(conn: Conn, params: dict[str, Any]) -> dict[str, Any]:
    row = await fetch_dict(conn, EVENT_LEGACY_DRAIN, params)
    assert row is not None
    return row


async def event_generation_coverage(conn: Conn, params: dict[str, Any]) -> dict[str, Any]:
    row = await fetch_dict(conn, EVENT_GENERATION_COVERAGE, params)
    assert row is not None
    return row


async def event_owner_switch_to_work_item(conn: Conn, params: dict[str, Any]) -> int:
    """Gate 3's ownership switch; how many events moved to the WorkItem path."""
    return (await conn.execute(EVENT_OWNER_SWITCH_TO_WORK_ITEM, params)).rowcount


# --------------------------------------------------------------------------------------------------
# The admin API's legacy failure list
# --------------------------------------------------------------------------------------------------

# The latest receipt per (event, work type) when it is failed or unknown, newest first: a backward
# range of the partial index ix_connector_legacy_outcome_receipt_failed, each row checked for a newer
# version by the unique (event_id, work_type, version) index.
LEGACY_OUTCOME_RECEIPT_LIST_FAILED = f"""
SELECT o.legacy_outcome_receipt_id, o.work_type, o.version, o.outcome, o.failure_class,
       o.failure_summary, o.actor, o.created_at, e.legacy_state, w.work_id, w.state AS work_state,
       {EVENT_SELECT_COLUMNS}, {RECEIPT_SELECT_COLUMNS}
FROM connector_legacy_outcome_receipt o
JOIN connector_event e ON e.event_id = o.event_id
JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
LEFT JOIN connector_work_item w ON w.event_id = o.event_id AND w.work_type = o.work_type
WHERE o.installed_pack_id = %(pack)s AND o.generation = %(generation)s
  AND o.outcome IN ('failed', 'unknown') AND o.legacy_outcome_receipt_id < %(after)s
  AND NOT EXISTS (SELECT 1 FROM connector_legacy_outcome_receipt n
                  WHERE n.event_id = o.event_id AND n.work_type = o.work_type AND n.version > o.version)
ORDER BY o.legacy_outcome_receipt_id DESC
LIMIT %(limit)s
"""


# The legacy path's dead letters in ListDeadLetters: the latest failed / unknown outcome receipt of
# every (event, work type) of generations whose failures the legacy path owns (admitted by a rollback
# receipt: legacy_event / legacy_active, or quiescing), newest first by (created_at, id), after a
# keyset; per generation through ``ix_connector_legacy_outcome_receipt_failed``. ``{where}``:
# ``DeadLetterFilter.legacy_where``.
LEGACY_FAILURE_DEAD_LETTERS = f"""
SELECT o.legacy_outcome_receipt_id, o.work_type, o.version, o.outcome, o.failure_class,
       o.failure_summary, o.actor, o.created_at, e.legacy_state, w.work_id, w.state AS work_state,
       {EVENT_SELECT_COLUMNS}, {RECEIPT_SELECT_COLUMNS}
FROM connector_claim_authority a
JOIN connector_legacy_outcome_receipt o
  ON o.installed_pack_id = a.installed_pack_id AND o.generation = a.generation
 AND o.outcome IN ('failed', 'unknown')
JOIN connector_event e ON e.event_id = o.event_id
JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
LEFT JOIN connector_work_item w ON w.event_id = o.event_id AND w.work_type = o.work_type
WHERE (a.claim_path = 'legacy_event' OR a.phase = 'quiescing') AND {{where}}
  AND NOT EXISTS (SELECT 1 FROM connector_legacy_outcome_receipt n
                  WHERE n.event_id = o.event_id AND n.work_type = o.work_type AND n.version > o.version)
ORDER BY o.created_at DESC, o.legacy_outcome_receipt_id DESC
LIMIT %(limit)s
"""


async def legacy_failure_dead_letters(
    conn: Conn, clauses: list[str], params: dict[str, Any], *, after: tuple[Any, int] | None, limit: int
) -> list[dict[str, Any]]:
    """Legacy-owned generations' dead letters matching ``clauses`` (``DeadLetterFilter.legacy_where``),
    after the keyset ``(created_at, receipt id)``."""
    clauses, params = list(clauses), dict(params)
    if after is not None:
        params["k_created"], params["k_id"] = after
        clauses.append("(o.created_at, o.legacy_outcome_receipt_id) < (%(k_created)s, %(k_id)s)")
    params["limit"] = limit
    return await fetch_dicts(conn, LEGACY_FAILURE_DEAD_LETTERS.format(where=" AND ".join(clauses)), params)


async def legacy_outcome_receipt_list_failed(
    conn: Conn, pack: int, generation: int, *, after: int, limit: int
) -> list[dict[str, Any]]:
    """Failed or unknown latest receipts of a generation with ids below ``after``, newest first,
    with their event, receipt and WorkItem state."""
    params = {"pack": pack, "generation": generation, "after": after, "limit": limit}
    return await fetch_dicts(conn, LEGACY_OUTCOME_RECEIPT_LIST_FAILED, params)
