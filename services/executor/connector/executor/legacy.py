"""The legacy Event claim path (``connector executor --claim-path event``): a rollback bridge.

This is the compatibility mode of the seed's "older/custom binary": it claims ``connector_event`` rows
instead of WorkItems, for **one** pack generation, and only while that generation's claim authority
admits it (``claim_path = 'legacy_event'``, ``phase = 'legacy_active'``, set by a rollback receipt;
docs/cutover.md). Rules:

* **Admission is the database's.** Every legacy claim, lease acquisition and reclaim statement joins
  the generation's ``connector_claim_authority`` row ``FOR SHARE`` and requires ``legacy_active``, so
  a quiesce (an ``UPDATE`` of that row) waits for legacy claim transactions in flight and every later
  one admits nothing. A process started for a generation that is not ``legacy_active`` refuses to
  start (``LegacyNotAdmitted``; the CLI exits 2), and a running one stops claiming when the phase
  changes, finishes or loses what it holds, deregisters and exits (drain).
* **One claimer per generation:** claims also require the pack-wide ``connector_scheduler_lease``
  row of the generation, held by this process under its current token (the pre-WorkItem
  compatibility contract). Other legacy processes of the generation stand by.
* **Claims** are one statement: candidates from the partial legacy index in ``event_id`` order,
  ``FOR UPDATE SKIP LOCKED``, skipping events whose source object has an earlier unfinished event
  (source-object FIFO), then ``processing`` with ``legacy_lease_token + 1`` and a lease from the
  database clock. Renewals, finalizes and reclaims are fenced by that token.
* **What runs:** for each work type of the event's route fan-out (in order): skipped when its latest
  ``connector_legacy_outcome_receipt`` is final or ``unknown`` (quarantined), or when a WorkItem row
  exists that is not ``awaiting_legacy_outcome`` (that work belongs to the WorkItem path). Otherwise
  the work type's handler runs (same handler kinds and ``HandlerContext`` as the WorkItem path; the
  idempotency key ``"<event_id>:<work_type>"`` is the same on both paths).
* **Outcomes:** success → ``succeeded``; a permanent failure → ``failed``; a retry → the event goes
  back to ``retry`` with backoff (``failed`` once the work type's max attempts are used up); a
  permanent failure whose class is ``outcome_unknown`` (a handler that cannot tell whether its effect
  happened), or an attempt past the maximum (the final attempt lost its lease mid-dispatch) →
  ``unknown``: quarantined, never retried, blocks re-cutover until an operator resolves it
  (``legacy_outcome_resolve``).
* **Finalize** is one statement: the Event's ``legacy_state`` and one versioned
  ``connector_legacy_outcome_receipt`` per work type that reached an outcome, in the same
  transaction, fenced by the lease token. A duplicate delivery of the same outcome (same digest as the
  latest receipt) writes nothing.
* **Projection** (``legacy_outcome_project``) is a separate step, run right after each finalize and
  periodically (the reconciler), by the admin API and inside the cutover transaction: it moves the
  matching WorkItem from ``awaiting_legacy_outcome`` to ``reconciled_legacy_terminal`` with the
  receipt version and digest (or inserts that row when the Event had no WorkItem for the work type:
  the historical mirror), marks the receipt projected and resolves rollback fences whose every row is
  reconciled. A crash between the finalize commit and the projection leaves an unprojected receipt,
  which the next projection repairs. Reconciled rows are never touched again (a trigger refuses it).

Statements are named noun-first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, start_http_server
from psycopg import AsyncConnection, Notify
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from connector.common import db as dbmod
from connector.common import runtime
from connector.common.listener import Listener, ListenerConfig
from connector.common.metrics import stop_server as stop_metrics_server
from connector.common.packs import sha256_hex
from connector.common.process_registry import ProcessRegistration
from connector.common.runtime import cancel_task
from connector.common.schema import CHANNEL_PACKS, CHANNEL_WORK
from connector.common.settings import DatabaseSettings, ExecutorSettings, PoolSettings
from connector.common.store import work_items
from connector.common.store.lanes import lane_holding, lane_lock_batch, lane_settle_batch, lanes_of
from connector.common.store.work_items import EVENT_ROW_BODY, EVENT_ROW_CONTENT_TYPE
from connector.executor.handlers import (
    EventFact,
    HandlerContext,
    Outcome,
    backoff_delay,
    classify,
    sanitize_summary,
)
from connector.executor.handlers.registry import HandlerRegistry, WorkTypeRuntime

log = logging.getLogger(__name__)

Conn = AsyncConnection[Any]

SERVICE = "executor-legacy"
#: Failure classes a handler uses to say "I cannot tell whether the effect happened".
AMBIGUOUS_FAILURE_CLASSES = frozenset({"outcome_unknown"})
#: Test-only fault injection (comma-separated points); never set in production.
FAULT_ENV = "CONNECTOR_TEST_FAULT_INJECT"
FAULT_AFTER_RECEIPT_COMMIT = "legacy_after_receipt_commit"

CLAIMED = Counter("connector_legacy_claimed_total", "Events claimed on the legacy Event path")
OUTCOMES = Counter(
    "connector_legacy_outcomes_total", "Legacy work type outcomes written as receipts", ["outcome"]
)
STALE = Counter("connector_legacy_stale_total", "Legacy writes refused by the lease token", ["op"])
PROJECTED = Counter(
    "connector_legacy_receipts_projected_total", "Legacy outcome receipts projected", ["result"]
)
ADMITTED = Gauge("connector_legacy_admitted", "1 while this generation admits the legacy path")


def service_scope(installed_pack_id: int, generation: int) -> str:
    """The ``connector_process.service`` of a legacy process: names the generation it may claim."""
    return f"{SERVICE}:{installed_pack_id}:{generation}"


def outcome_digest(event_id: int, work_type: str, outcome: str, failure_class: str | None) -> str:
    """Content digest of a legacy outcome (version-independent: a duplicate delivery has the same)."""
    return sha256_hex(
        {"event_id": event_id, "work_type": work_type, "outcome": outcome, "failure_class": failure_class}
    )


# --------------------------------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------------------------------

CLAIM_AUTHORITY_GET = """
SELECT a.claim_path, a.phase, a.version, a.cutover_receipt_id, r.kind AS receipt_kind
FROM connector_claim_authority a
LEFT JOIN connector_cutover_receipt r ON r.cutover_receipt_id = a.cutover_receipt_id
WHERE a.installed_pack_id = %(pack)s AND a.generation = %(generation)s
"""

# The generation's authority row when it admits legacy claims, share-locked for the transaction.
_LEGACY_AUTHORITY = """
  SELECT a.installed_pack_id FROM connector_claim_authority a
  WHERE a.installed_pack_id = %(pack)s AND a.generation = %(generation)s
    AND a.claim_path = 'legacy_event' AND a.phase = 'legacy_active'
  FOR SHARE
"""

_SCHEDULER_LEASE_HELD = """
  SELECT s.installed_pack_id FROM connector_scheduler_lease s
  WHERE s.installed_pack_id = %(pack)s AND s.generation = %(generation)s AND s.holder = %(owner)s
    AND s.token = %(lease_token)s AND s.lease_until > clock_timestamp()
  FOR SHARE
"""

# Acquire or renew the pack-wide scheduler lease (only while the authority admits legacy claims). A
# renewal keeps the token; a takeover (free, released or expired) increments it.
SCHEDULER_LEASE_ACQUIRE = f"""
WITH auth AS MATERIALIZED ({_LEGACY_AUTHORITY})
INSERT INTO connector_scheduler_lease AS s (installed_pack_id, generation, holder, token, lease_until)
SELECT %(pack)s, %(generation)s, %(owner)s, 1,
       clock_timestamp() + make_interval(secs => %(lease_s)s::float8)
FROM auth
ON CONFLICT (installed_pack_id, generation) DO UPDATE
SET holder = EXCLUDED.holder,
    token = CASE WHEN s.holder = EXCLUDED.holder AND s.lease_until >= clock_timestamp()
                 THEN s.token ELSE s.token + 1 END,
    lease_until = EXCLUDED.lease_until
WHERE (s.holder = EXCLUDED.holder AND s.lease_until >= clock_timestamp())
   OR s.holder IS NULL OR s.lease_until IS NULL OR s.lease_until < clock_timestamp()
RETURNING s.token
"""

SCHEDULER_LEASE_RELEASE = """
UPDATE connector_scheduler_lease SET holder = NULL, lease_until = NULL, token = token + 1
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s AND holder = %(owner)s
"""

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
SET legacy_state = 'processing', legacy_lease_token = e.legacy_lease_token + 1,
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
SET legacy_state = 'retry', legacy_lease_token = e.legacy_lease_token + 1, legacy_lease_owner = NULL,
    legacy_lease_until = NULL, legacy_run_after = now()
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

# Fences of a generation whose every fenced row is reconciled (and as many as were fenced).
ROLLBACK_FENCE_RESOLVE = """
UPDATE connector_rollback_fence f SET status = 'resolved', resolved_at = clock_timestamp()
WHERE f.status = 'open' AND f.installed_pack_id = %(pack)s AND f.generation = %(generation)s
  AND NOT EXISTS (
    SELECT 1 FROM connector_work_item w
    WHERE w.installed_pack_id = f.installed_pack_id AND w.generation = f.generation
      AND w.state = 'awaiting_legacy_outcome' AND w.rollback_execution_fence_id = f.fence_id)
  AND f.fenced_work_items = (
    SELECT count(*) FROM connector_work_item w
    WHERE w.installed_pack_id = f.installed_pack_id AND w.generation = f.generation
      AND w.state = 'reconciled_legacy_terminal' AND w.rollback_execution_fence_id = f.fence_id
      AND w.legacy_outcome_receipt_version IS NOT NULL)
RETURNING f.fence_id
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


# --------------------------------------------------------------------------------------------------
# Receipt projection (the reconciler)
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ProjectionReport:
    #: Receipts whose outcome moved a WorkItem (reconciled, quarantined or mirrored).
    projected: int = 0
    #: Receipts that changed nothing: a duplicate delivery or a superseded version.
    duplicates: int = 0
    #: Receipts left unprojected because they contradict the WorkItem row (fail closed).
    conflicts: int = 0
    conflict_receipt_ids: list[int] = field(default_factory=list)
    #: Rollback fences resolved (every fenced row reconciled with a receipt).
    fences_resolved: list[int] = field(default_factory=list)

    def add(self, other: ProjectionReport) -> None:
        self.projected += other.projected
        self.duplicates += other.duplicates
        self.conflicts += other.conflicts
        self.conflict_receipt_ids.extend(other.conflict_receipt_ids)
        self.fences_resolved.extend(other.fences_resolved)


async def legacy_outcome_project(
    conn: Conn,
    *,
    installed_pack_id: int | None = None,
    generation: int | None = None,
    event_ids: Sequence[int] | None = None,
    batch: int = 200,
) -> ProjectionReport:
    """Project unprojected legacy outcome receipts onto WorkItems (one transaction per batch; nests as
    a savepoint inside a caller's transaction). Idempotent and safe under concurrent projectors."""
    report = ProjectionReport()
    scopes: set[tuple[int, int]] = set()
    if installed_pack_id is not None and generation is not None:
        scopes.add((installed_pack_id, generation))
    after = 0
    while True:
        async with conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                LEGACY_OUTCOME_RECEIPT_UNPROJECTED,
                {
                    "after": after,
                    "pack": installed_pack_id,
                    "generation": generation,
                    "events": list(event_ids) if event_ids is not None else None,
                    "limit": batch,
                },
            )
            receipts = await cur.fetchall()
            if not receipts:
                break
            after = int(receipts[-1]["legacy_outcome_receipt_id"])
            part = await _project_batch(conn, receipts)
            report.add(part)
            scopes.update((int(r["installed_pack_id"]), int(r["generation"])) for r in receipts)
        if len(receipts) < batch:
            break
    # Fences are resolved after the batches committed: a concurrent projector's rows are then visible
    # to whichever of the two commits last (resolving inside each batch transaction could leave a
    # fence open when two projectors finish its last rows at the same time).
    for pack, gen in sorted(scopes):
        fence_cur = await conn.execute(ROLLBACK_FENCE_RESOLVE, {"pack": pack, "generation": gen})
        report.fences_resolved.extend(int(x[0]) for x in await fence_cur.fetchall())
    return report


async def _project_batch(conn: Conn, receipts: list[dict[str, Any]]) -> ProjectionReport:
    report = ProjectionReport()
    cur = conn.cursor(row_factory=dict_row)
    # Lanes of the rows about to change: locked first, settled last (ADR 003).
    lanes: set[tuple[int, str, str]] = set()
    for r in receipts:
        await cur.execute(WORK_ITEM_LEGACY_PROJECTION_GET, r)
        row = await cur.fetchone()
        if row is not None and row["state"] == "awaiting_legacy_outcome":
            lanes.update(
                lanes_of(
                    int(row["installed_pack_id"]), row["source_lane_key"], row["target_mutation_lane_key"]
                )
            )
    locked = await lane_lock_batch(conn, lanes) if lanes else []
    done: list[int] = []
    for r in receipts:
        result = await _project_one(conn, r)
        PROJECTED.labels(result).inc()
        if result == "conflict":
            report.conflicts += 1
            report.conflict_receipt_ids.append(int(r["legacy_outcome_receipt_id"]))
            log.error(
                "legacy outcome receipt contradicts its WorkItem; left unprojected (blocks re-cutover)",
                extra={"receipt_id": r["legacy_outcome_receipt_id"], "event_id": r["event_id"]},
            )
            continue
        done.append(int(r["legacy_outcome_receipt_id"]))
        if result == "duplicate":
            report.duplicates += 1
        else:
            report.projected += 1
    if done:
        await conn.execute(LEGACY_OUTCOME_RECEIPT_MARK_PROJECTED, {"ids": done})
    if locked:
        settled = await lane_settle_batch(conn, locked)
        if settled.promoted:
            await work_items.work_notify(conn, "legacy")
    return report


async def _project_one(conn: Conn, r: dict[str, Any]) -> str:
    """``projected`` | ``duplicate`` | ``conflict`` for one receipt (rows locked by the caller's
    transaction)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(WORK_ITEM_LEGACY_PROJECTION_LOCK, r)
    w = await cur.fetchone()
    outcome = str(r["outcome"])
    final = outcome in ("succeeded", "failed")
    values = {
        "event_id": r["event_id"],
        "work_type": r["work_type"],
        "version": r["version"],
        "digest": r["digest"],
        "at": r["created_at"],
        "outcome": outcome if final else None,
        "failure_class": r["failure_class"] if outcome != "succeeded" else None,
        "failure_summary": r["failure_summary"] if outcome != "succeeded" else None,
    }
    if not final:
        values["failure_class"] = r["failure_class"] or "legacy_outcome_unknown"
    if w is None:
        values["state"] = "reconciled_legacy_terminal" if final else "awaiting_legacy_outcome"
        cur2 = await conn.execute(WORK_ITEM_LEGACY_MIRROR_INSERT, values)
        return "projected" if await cur2.fetchone() is not None else "conflict"
    seen_version = w["legacy_outcome_receipt_version"]
    if w["state"] == "awaiting_legacy_outcome":
        if seen_version is not None and int(seen_version) >= int(r["version"]):
            return "duplicate"  # an older version projected after a newer one: superseded
        values["work_id"] = w["work_id"]
        if final:
            await conn.execute(WORK_ITEM_LEGACY_RECONCILE, values)
        else:
            await conn.execute(WORK_ITEM_LEGACY_QUARANTINE, values)
        return "projected"
    if w["state"] == "reconciled_legacy_terminal":
        if w["legacy_outcome_digest"] == r["digest"] or (
            seen_version is not None and int(seen_version) > int(r["version"])
        ):
            return "duplicate"  # the same outcome delivered again, or superseded: nothing to change
        return "conflict"
    # The WorkItem path owns this row (pending, processing, succeeded, dead, ...): a legacy outcome for
    # it means ambiguous ownership. Never overwrite; fail closed.
    return "conflict"


# --------------------------------------------------------------------------------------------------
# Operator resolution of an unknown outcome
# --------------------------------------------------------------------------------------------------


class LegacyOutcomeError(Exception):
    """A refused resolution. ``reason``: ``not_found``, ``not_legacy_owned``, ``in_flight``,
    ``not_unknown``, ``invalid``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Resolution:
    event_id: int
    work_type: str
    version: int
    outcome: str
    digest: str
    event_legacy_state: str
    projection: ProjectionReport


async def legacy_outcome_resolve(
    conn: Conn,
    *,
    event_id: int,
    work_type: str,
    outcome: str,
    reason: str,
    actor: str,
) -> Resolution:
    """Confirm the outcome of a quarantined (``unknown``) legacy work type after checking the external
    system: writes the next receipt version (``succeeded`` or ``failed``) and the Event's new state in
    one transaction, then projects it. Refused unless the latest receipt is ``unknown``."""
    if outcome not in ("succeeded", "failed"):
        raise LegacyOutcomeError("invalid", "outcome must be succeeded or failed")
    summary = sanitize_summary(reason) or None
    if summary is None:
        raise LegacyOutcomeError("invalid", "a reason is required (what was checked, by whom)")
    async with conn.transaction():
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(EVENT_LEGACY_GET_FOR_UPDATE, {"event_id": event_id})
        ev = await cur.fetchone()
        if ev is None:
            raise LegacyOutcomeError("not_found", f"event {event_id} not found")
        if ev["execution_owner"] != "legacy_event":
            raise LegacyOutcomeError("not_legacy_owned", f"event {event_id} is owned by the WorkItem path")
        if ev["legacy_state"] == "processing":
            raise LegacyOutcomeError("in_flight", f"event {event_id} is being executed on the legacy path")
        await cur.execute(LEGACY_OUTCOME_RECEIPT_LATEST, {"event_id": event_id, "work_type": work_type})
        latest = await cur.fetchone()
        if latest is None or latest["outcome"] != "unknown":
            have = (
                "no receipt"
                if latest is None
                else f"latest receipt v{latest['version']} is {latest['outcome']}"
            )
            raise LegacyOutcomeError(
                "not_unknown",
                f"event {event_id} work type {work_type!r}: {have}; only unknown outcomes resolve",
            )
        failure_class = None if outcome == "succeeded" else "operator_confirmed_failed"
        digest = outcome_digest(event_id, work_type, outcome, failure_class)
        version = int(latest["version"]) + 1
        await cur.execute(
            LEGACY_OUTCOME_RECEIPT_INSERT,
            {
                "pack": ev["installed_pack_id"],
                "generation": ev["generation"],
                "event_id": event_id,
                "work_type": work_type,
                "version": version,
                "outcome": outcome,
                "failure_class": failure_class,
                "failure_summary": summary,
                "actor": actor,
                "digest": digest,
            },
        )
        await cur.execute(EVENT_LEGACY_LATEST_OUTCOMES, {"event_id": event_id})
        new_state = _event_state_from_latest(await cur.fetchall(), str(ev["legacy_state"]))
        await conn.execute(EVENT_LEGACY_SET_STATE, {"event_id": event_id, "state": new_state})
        projection = await legacy_outcome_project(conn, event_ids=[event_id])
    log.info(
        "legacy outcome resolved by an operator",
        extra={"event_id": event_id, "work_type": work_type, "outcome": outcome, "actor": actor},
    )
    return Resolution(event_id, work_type, version, outcome, digest, new_state, projection)


def _event_state_from_latest(rows: Sequence[dict[str, Any]], current: str) -> str:
    if current in ("pending", "retry"):
        return current  # still has work to run; the resolved work type is skipped from now on
    legacy = [
        r for r in rows if r["work_state"] in (None, "awaiting_legacy_outcome", "reconciled_legacy_terminal")
    ]
    outcomes = [r["outcome"] for r in legacy]
    if any(o is None for o in outcomes):
        return "retry"
    if "unknown" in outcomes:
        return "unknown"
    if "failed" in outcomes:
        return "failed"
    return "succeeded"


# --------------------------------------------------------------------------------------------------
# The legacy executor
# --------------------------------------------------------------------------------------------------


class LegacyNotAdmitted(Exception):
    """The generation's claim authority does not admit the legacy Event path (fail closed)."""


@dataclass
class LegacyConfig:
    workers: int = 4
    claim_batch: int = 16
    lease_s: float = 30.0
    poll_interval_s: float = 0.5
    reconcile_interval_s: float = 5.0
    shutdown_grace_s: float = 10.0


@dataclass(slots=True)
class _TypeRun:
    work_type: str
    work_id: int
    queue_class: str
    source_lane_key: str | None
    target_lane_key: str | None
    #: ``run`` | ``done`` (a receipt is final) | ``quarantined`` (unknown receipt) | ``work_item``
    #: (the WorkItem path owns it) | ``lane_wait`` (an earlier lane member is not finished)
    decision: str
    prior_outcome: str | None


@dataclass(slots=True)
class _Held:
    event_id: int
    token: int
    attempt: int
    deadline: float
    lost: bool = False
    task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class _TypeResult:
    work_type: str
    outcome: str  # succeeded | failed | unknown | retry
    failure_class: str | None = None
    summary: str | None = None
    delay_s: float = 0.0


def _fault_point(name: str) -> None:
    points = os.environ.get(FAULT_ENV, "")
    if points and name in points.split(","):
        log.error("test fault injection: SIGKILL", extra={"fault_point": name})
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


class LegacyExecutor:
    """Claims and executes legacy-owned Events of one pack generation (see the module docstring)."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        installed_pack_id: int,
        generation: int,
        owner: str,
        cfg: LegacyConfig | None = None,
    ) -> None:
        self.pool = pool
        self.pack = installed_pack_id
        self.generation = generation
        self.owner = owner
        self.cfg = cfg or LegacyConfig()
        self.actor = f"legacy:{owner}"
        self.threads = ThreadPoolExecutor(max_workers=self.cfg.workers, thread_name_prefix="connector-legacy")
        self.registry = HandlerRegistry(self.threads)
        self.held: dict[int, _Held] = {}
        self.admitted = False
        self.lease_token: int | None = None
        #: Set once the generation stopped admitting the legacy path and nothing is held any more.
        self.drained = asyncio.Event()
        self._wake = asyncio.Event()
        self._tick = asyncio.Event()
        self._stopping = False
        self._claiming = True
        self._tasks: list[asyncio.Task[Any]] = []
        self._listener: Listener | None = None
        self._routes: dict[str, Any] = {}
        self.stats = {"claimed": 0, "finalized": 0, "stale": 0, "reclaimed": 0, "receipts": 0}

    # -------------------------------------------------------------------------------- admission

    async def admission(self, conn: Conn) -> tuple[bool, str]:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(CLAIM_AUTHORITY_GET, {"pack": self.pack, "generation": self.generation})
        row = await cur.fetchone()
        if row is None:
            return False, f"pack {self.pack} generation {self.generation} has no claim authority"
        if row["claim_path"] != "legacy_event" or row["phase"] != "legacy_active":
            return False, (
                f"pack {self.pack} generation {self.generation} is {row['claim_path']}/{row['phase']},"
                " not legacy_event/legacy_active: the legacy Event path may not claim it"
            )
        if row["receipt_kind"] != "rollback":
            return False, (
                f"pack {self.pack} generation {self.generation} has no rollback receipt admitting the"
                " legacy Event path"
            )
        return True, ""

    async def start(self) -> None:
        async with self.pool.connection() as conn:
            ok, why = await self.admission(conn)
            if not ok:
                raise LegacyNotAdmitted(why)
            found = await work_items.pack_generation_manifest(conn, self.pack, self.generation)
            if found is None:
                raise LegacyNotAdmitted(f"pack {self.pack} generation {self.generation} has no manifest")
            self.registry.install(self.pack, self.generation, found[0], found[1])
            # Repair first: a predecessor may have died between a finalize and its projection.
            await legacy_outcome_project(conn, installed_pack_id=self.pack, generation=self.generation)
        self.admitted = True
        ADMITTED.set(1)
        self._tasks = [
            asyncio.create_task(self._lease_loop(), name="legacy-lease"),
            asyncio.create_task(self._claim_loop(), name="legacy-claim"),
            asyncio.create_task(self._reconcile_loop(), name="legacy-reconcile"),
        ]
        self._listener = Listener(
            str(self.pool.conninfo),
            ListenerConfig(channels=(CHANNEL_WORK, CHANNEL_PACKS), name="legacy-listen"),
            on_wake=self._on_notify,
            on_error=lambda exc: log.warning("legacy listener error", extra={"exc_type": type(exc).__name__}),
        )
        await self._listener.start()

    async def stop(self, grace_s: float | None = None) -> None:
        grace = self.cfg.shutdown_grace_s if grace_s is None else grace_s
        self._claiming = False
        self._wake.set()
        running = [h.task for h in self.held.values() if h.task is not None]
        if running:
            with contextlib.suppress(Exception):
                await asyncio.wait(running, timeout=grace)
        for h in list(self.held.values()):
            if h.task is not None and not h.task.done():
                h.task.cancel()
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._listener is not None:
            await self._listener.stop()
        with contextlib.suppress(Exception):
            async with self.pool.connection() as conn:
                await conn.execute(
                    SCHEDULER_LEASE_RELEASE,
                    {"pack": self.pack, "generation": self.generation, "owner": self.owner},
                )
        await self.registry.close()
        self.threads.shutdown(wait=False, cancel_futures=True)
        ADMITTED.set(0)

    # ------------------------------------------------------------------------------- loops

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"pack": self.pack, "generation": self.generation, "owner": self.owner, **extra}

    async def _lease_loop(self) -> None:
        interval = max(0.05, self.cfg.lease_s / 3.0)
        while not self._stopping:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("legacy lease loop error", extra={"exc_type": type(exc).__name__})
            self._tick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tick.wait(), timeout=interval)

    async def tick(self) -> None:
        """Admission check, scheduler lease, expired-lease reclaim, renewal of held leases."""
        async with self.pool.connection() as conn:
            admitted, why = await self.admission(conn)
            if admitted != self.admitted:
                log.warning(
                    "legacy admission changed", extra={"admitted": admitted, "reason": why or "admitted"}
                )
            self.admitted = admitted
            ADMITTED.set(1 if admitted else 0)
            token: int | None = None
            if admitted and self._claiming:
                cur = await conn.execute(SCHEDULER_LEASE_ACQUIRE, self._params(lease_s=self.cfg.lease_s))
                row = await cur.fetchone()
                token = int(row[0]) if row is not None else None
            if token != self.lease_token:
                self._wake.set()
            self.lease_token = token
            if token is not None:
                cur = await conn.execute(EVENT_LEGACY_RECLAIM_EXPIRED, self._params(lease_token=token))
                reclaimed = len(await cur.fetchall())
                if reclaimed:
                    self.stats["reclaimed"] += reclaimed
                    self._wake.set()
            live = sorted((h for h in self.held.values() if not h.lost), key=lambda h: h.event_id)
            if live:
                t0 = time.monotonic()
                cur = await conn.execute(
                    EVENT_LEGACY_RENEW_LEASE_BATCH,
                    {
                        "ids": [h.event_id for h in live],
                        "tokens": [h.token for h in live],
                        "lease_s": self.cfg.lease_s,
                    },
                )
                renewed = {int(r[0]) for r in await cur.fetchall()}
                for h in live:
                    if h.event_id in renewed:
                        h.deadline = t0 + self.cfg.lease_s
                    else:
                        self._lose(h)
        now = time.monotonic()
        for h in list(self.held.values()):
            if not h.lost and h.deadline <= now:
                self._lose(h)
        if not self.admitted and not self.held:
            self.drained.set()

    def _lose(self, h: _Held) -> None:
        h.lost = True
        STALE.labels("renew").inc()
        self.stats["stale"] += 1
        if h.task is not None and not h.task.done():
            h.task.cancel()

    async def _claim_loop(self) -> None:
        conn: Conn | None = None
        backoff = 0.1
        while self._claiming:
            try:
                free = self.cfg.workers - len(self.held)
                if not (self.admitted and self.lease_token is not None and free > 0):
                    await self._wait(self.cfg.poll_interval_s)
                    continue
                if conn is None or conn.closed:
                    conn = await self.pool.getconn()
                cur = await conn.execute(
                    EVENT_LEGACY_CLAIM_BATCH,
                    self._params(
                        lease_token=self.lease_token,
                        limit=min(free, self.cfg.claim_batch),
                        lease_s=self.cfg.lease_s,
                    ),
                )
                rows = await cur.fetchall()
                backoff = 0.1
                if not rows:
                    await self._wait(self.cfg.poll_interval_s)
                    continue
                CLAIMED.inc(len(rows))
                self.stats["claimed"] += len(rows)
                deadline = time.monotonic() + self.cfg.lease_s
                for event_id, token, attempt in rows:
                    h = _Held(int(event_id), int(token), int(attempt), deadline)
                    self.held[h.event_id] = h
                    h.task = asyncio.create_task(self._run_event(h), name=f"legacy-event-{h.event_id}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("legacy claim loop error", extra={"exc_type": type(exc).__name__})
                if conn is not None and (conn.closed or conn.broken):
                    with contextlib.suppress(Exception):
                        await self.pool.putconn(conn)
                    conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        if conn is not None:
            with contextlib.suppress(Exception):
                await self.pool.putconn(conn)

    async def _wait(self, limit_s: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=limit_s)

    async def _reconcile_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.cfg.reconcile_interval_s)
            try:
                async with self.pool.connection() as conn:
                    await legacy_outcome_project(
                        conn, installed_pack_id=self.pack, generation=self.generation
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("legacy reconcile error", extra={"exc_type": type(exc).__name__})

    def _on_notify(self, notes: list[Notify]) -> None:
        if any(note.channel == CHANNEL_PACKS for note in notes):
            self._tick.set()  # an authority change: check admission now
        self._wake.set()

    # ----------------------------------------------------------------------------- one event

    async def _run_event(self, h: _Held) -> None:
        try:
            await self._execute_event(h)
        except asyncio.CancelledError:
            if not self._stopping and not h.lost:
                raise
        except Exception as exc:
            # The lease expires and the event is reclaimed (retry) by the scheduler lease holder.
            log.warning(
                "legacy event failed to run", extra={"event_id": h.event_id, "exc_type": type(exc).__name__}
            )
        finally:
            self.held.pop(h.event_id, None)
            self._wake.set()
            if not self.admitted and not self.held:
                self.drained.set()

    async def _plan(self, conn: Conn, event_id: int) -> list[_TypeRun]:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(EVENT_LEGACY_WORK_PLAN, {"ids": [event_id]})
        plan: list[_TypeRun] = []
        for r in await cur.fetchall():
            outcome = r["receipt_outcome"]
            if outcome in ("succeeded", "failed"):
                decision = "done"
            elif outcome == "unknown":
                decision = "quarantined"
            elif r["work_id"] is not None and r["work_state"] != "awaiting_legacy_outcome":
                decision = "work_item"
            elif r["lane_wait"]:
                decision = "lane_wait"
            else:
                decision = "run"
            plan.append(
                _TypeRun(
                    work_type=str(r["work_type"]),
                    work_id=int(r["work_id"]) if r["work_id"] is not None else 0,
                    queue_class=str(r["queue_class"] or "default"),
                    source_lane_key=r["source_lane_key"],
                    target_lane_key=r["target_mutation_lane_key"],
                    decision=decision,
                    prior_outcome=outcome,
                )
            )
        return plan

    async def _execute_event(self, h: _Held) -> None:
        async with self.pool.connection() as conn:
            plan = await self._plan(conn, h.event_id)
            fact: EventFact | None = None
            payload: bytes | None = None
            content_type: str | None = None
            if any(t.decision == "run" for t in plan):
                rows = await work_items.work_item_event_batch(conn, [h.event_id])
                if rows:
                    r = rows[0]
                    fact = EventFact(*r[:EVENT_ROW_BODY])
                    body = r[EVENT_ROW_BODY]
                    payload = bytes(body) if body is not None else None
                    content_type = r[EVENT_ROW_CONTENT_TYPE]
        results: list[_TypeResult] = []
        for t in plan:
            if t.decision != "run":
                continue
            if h.lost:
                return
            results.append(await self._execute_type(h, t, fact, payload, content_type))
        if h.lost:
            return
        state, delay = _event_outcome(plan, results, self.cfg.poll_interval_s)
        finals = [r for r in results if r.outcome != "retry"]
        params = {
            "event_id": h.event_id,
            "token": h.token,
            "state": state,
            "delay_s": delay,
            # Waiting for a lane is not an attempt: give it back when nothing ran.
            "refund": 1 if not results and any(t.decision == "lane_wait" for t in plan) else 0,
            "work_types": [r.work_type for r in finals],
            "outcomes": [r.outcome for r in finals],
            "classes": [r.failure_class for r in finals],
            "summaries": [r.summary for r in finals],
            "digests": [outcome_digest(h.event_id, r.work_type, r.outcome, r.failure_class) for r in finals],
            "actor": self.actor,
        }
        async with self.pool.connection() as conn:
            cur = await conn.execute(EVENT_LEGACY_FINALIZE, params)
            row = await cur.fetchone()
            assert row is not None
            matched, receipt_ids = int(row[0]), list(row[1] or [])
            if not matched:
                STALE.labels("finalize").inc()
                self.stats["stale"] += 1
                log.warning("legacy finalize fenced off (lease lost)", extra={"event_id": h.event_id})
                return
            self.stats["finalized"] += 1
            self.stats["receipts"] += len(receipt_ids)
            for f in finals:
                OUTCOMES.labels(f.outcome).inc()
            # The Event and its receipts are committed. The projection is a separate step: a crash
            # here is repaired from the unprojected receipts by the next projection.
            _fault_point(FAULT_AFTER_RECEIPT_COMMIT)
            if receipt_ids:
                await legacy_outcome_project(conn, event_ids=[h.event_id])

    async def _execute_type(
        self,
        h: _Held,
        t: _TypeRun,
        fact: EventFact | None,
        payload: bytes | None,
        content_type: str | None,
    ) -> _TypeResult:
        rt: WorkTypeRuntime = self.registry.lookup(self.pack, self.generation, t.work_type)
        max_attempts = rt.retry.max_attempts
        if h.attempt > max_attempts:
            return _TypeResult(
                t.work_type,
                "unknown",
                "lease_lost_final_attempt",
                f"attempt {h.attempt - 1} of {max_attempts} (the last) lost its lease before reporting an"
                " outcome; whether its effect happened is unknown",
            )
        row = (
            t.work_id,
            h.token,
            self.pack,
            self.generation,
            t.queue_class,
            t.work_type,
            h.event_id,
            h.attempt,
            max_attempts,
            t.source_lane_key,
            t.target_lane_key,
        )
        ctx = HandlerContext(row, h.deadline)
        ctx.event, ctx.payload, ctx.content_type = fact, payload, content_type
        out: Outcome | None
        if rt.handler is None:
            out = (
                Outcome.fail("unknown_work_type", "the pack generation declares no such work type")
                if rt.unknown
                else Outcome.retry(None, "handler_unavailable", rt.unavailable or "handler unavailable")
            )
        else:
            try:
                out = await asyncio.wait_for(rt.handler(ctx), timeout=rt.timeout_s)
            except TimeoutError:
                out = Outcome.retry(None, "timeout", "the handler overran its timeout")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                out = classify(exc, payload)
        if out is None or out.kind == "success":
            return _TypeResult(t.work_type, "succeeded")
        summary = sanitize_summary(out.summary, payload) or None
        if out.kind == "fail":
            kind = "unknown" if out.failure_class in AMBIGUOUS_FAILURE_CLASSES else "failed"
            return _TypeResult(t.work_type, kind, out.failure_class or "permanent", summary)
        if h.attempt >= max_attempts:
            return _TypeResult(
                t.work_type,
                "failed",
                out.failure_class or "retry",
                sanitize_summary(f"gave up after {h.attempt} attempts: {out.summary}", payload)[:512],
            )
        delay = out.delay_s
        if delay is None:
            pol = rt.retry
            delay = backoff_delay(h.attempt, pol.backoff_base_s, pol.backoff_cap_s, pol.jitter)
        return _TypeResult(t.work_type, "retry", out.failure_class, summary, max(0.0, float(delay)))


def _event_outcome(
    plan: list[_TypeRun], results: list[_TypeResult], lane_wait_s: float = 0.5
) -> tuple[str, float]:
    """The Event's legacy state after an attempt, and the retry delay."""
    retries = [r.delay_s for r in results if r.outcome == "retry"]
    retries += [lane_wait_s for t in plan if t.decision == "lane_wait"]
    if retries:
        return "retry", min(retries)
    outcomes = [r.outcome for r in results]
    outcomes += [t.prior_outcome for t in plan if t.decision in ("done", "quarantined") and t.prior_outcome]
    if not plan or all(t.decision == "work_item" for t in plan):
        # Nothing of this event belongs to the legacy path (cannot happen through the gates): say so
        # loudly and fail closed rather than report an execution that did not take place.
        log.error("legacy-owned event has no legacy work types", extra={"n_types": len(plan)})
        return "unknown", 0.0
    if "unknown" in outcomes:
        return "unknown", 0.0
    if "failed" in outcomes:
        return "failed", 0.0
    return "succeeded", 0.0


# --------------------------------------------------------------------------------------------------
# Service and CLI (``connector executor --claim-path event --pack NAME [--generation N]``)
# --------------------------------------------------------------------------------------------------

PACK_RESOLVE = """
SELECT installed_pack_id, active_generation FROM connector_installed_pack
WHERE name = %(pack)s OR (%(pack)s ~ '^[0-9]+$' AND installed_pack_id = %(pack)s::bigint)
"""


async def pack_generation_resolve(conn: Conn, pack: str, generation: int | None) -> tuple[int, int]:
    cur = await conn.execute(PACK_RESOLVE, {"pack": pack})
    row = await cur.fetchone()
    if row is None:
        raise LegacyNotAdmitted(f"no pack {pack!r}")
    if generation is None:
        if row[1] is None:
            raise LegacyNotAdmitted(f"pack {pack!r} has no active generation; pass --generation")
        generation = int(row[1])
    return int(row[0]), generation


class LegacyService:
    """Pool, admission check, process registration (capability ``legacy_event``, scoped to the
    generation), the legacy executor, metrics. ``exited`` is set when the generation stopped admitting
    the legacy path and everything held was finished or released (the process then exits 0)."""

    name = SERVICE

    def __init__(
        self,
        db: DatabaseSettings,
        cfg: ExecutorSettings,
        *,
        pack: str,
        generation: int | None,
        url: str | None = None,
        heartbeat_s: float = 5.0,
        serve_metrics: bool = True,
    ) -> None:
        self.db = db
        self.cfg = cfg
        self.pack_spec = pack
        self.generation_spec = generation
        self._url = url
        self._heartbeat_s = heartbeat_s
        self._serve_metrics = serve_metrics
        self.pool: AsyncConnectionPool | None = None
        self.registration: ProcessRegistration | None = None
        self.executor: LegacyExecutor | None = None
        self.exited = asyncio.Event()
        self._metrics_server: Any = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        url = self._url or self.db.url()
        self.pool = await dbmod.open_pool(
            SERVICE,
            self.db,
            PoolSettings(pool_min_size=1, pool_max_size=max(4, self.cfg.workers + 3), pool_timeout_s=5.0),
            url=url,
        )
        try:
            async with self.pool.connection() as conn:
                pack_id, generation = await pack_generation_resolve(
                    conn, self.pack_spec, self.generation_spec
                )
            self.registration = ProcessRegistration(
                self.pool,
                service=service_scope(pack_id, generation),
                capability="legacy_event",
                interval_s=self._heartbeat_s,
            )
            self.executor = LegacyExecutor(
                self.pool,
                installed_pack_id=pack_id,
                generation=generation,
                owner=self.registration.process_id,
                cfg=LegacyConfig(
                    workers=self.cfg.workers,
                    claim_batch=self.cfg.claim_batch,
                    lease_s=self.cfg.lease_s,
                    poll_interval_s=self.cfg.poll_interval_s,
                    reconcile_interval_s=max(1.0, self.cfg.reclaim_interval_s),
                    shutdown_grace_s=self.cfg.shutdown_grace_s,
                ),
            )
            # Fail closed before registering: a refused process never looks like a claimer.
            async with self.pool.connection() as conn:
                ok, why = await self.executor.admission(conn)
            if not ok:
                raise LegacyNotAdmitted(why)
            await self.registration.start()
            await self.executor.start()
            if self._serve_metrics and self.cfg.metrics_port:
                server, _thread = start_http_server(
                    self.cfg.metrics_port, addr=self.cfg.metrics_host, registry=REGISTRY
                )
                self._metrics_server = server
            self._watch = asyncio.create_task(self._watch_drained(), name="legacy-drained")
        except BaseException:
            await self.stop()
            raise
        log.info(
            "legacy Event path started",
            extra={
                "installed_pack_id": pack_id,
                "generation": generation,
                "process_id": self.registration.process_id,
            },
        )

    async def _watch_drained(self) -> None:
        assert self.executor is not None
        await self.executor.drained.wait()
        log.warning(
            "generation no longer admits the legacy Event path and nothing is held: exiting",
            extra={"installed_pack_id": self.executor.pack, "generation": self.executor.generation},
        )
        self.exited.set()

    async def stop(self) -> None:
        task, self._watch = self._watch, None
        await cancel_task(task)
        if self.executor is not None:
            await self.executor.stop()
            self.executor = None
        if self.registration is not None:
            await self.registration.stop()
            self.registration = None
        pool, self.pool = self.pool, None
        await dbmod.close_own_pool(SERVICE, pool)
        if self._metrics_server is not None:
            server, self._metrics_server = self._metrics_server, None
            await stop_metrics_server(server)


def cli(args: argparse.Namespace, db: DatabaseSettings, cfg: ExecutorSettings) -> int:
    """Run the legacy Event path for one pack generation until SIGTERM/SIGINT or until the
    generation stops admitting it (drained). Exit 2 when it is not admitted (fail closed)."""
    pack = getattr(args, "pack", None)
    if not pack:
        print("connector executor: --claim-path event needs --pack NAME_OR_ID", file=sys.stderr)
        return 2
    db.url()
    # Heartbeat well inside the lease, so "a live legacy process" is visible to the cutover gate.
    heartbeat_s = max(0.5, min(5.0, cfg.lease_s / 3.0))
    service = LegacyService(
        db, cfg, pack=str(pack), generation=getattr(args, "generation", None), heartbeat_s=heartbeat_s
    )
    refused: list[str] = []

    async def main() -> None:
        try:
            await runtime.run_until_signal([service], stop=service.exited)
        except LegacyNotAdmitted as exc:
            refused.append(str(exc))

    runtime.run(main)
    if refused:
        print(f"connector executor: refusing to start the legacy Event path: {refused[0]}", file=sys.stderr)
        return 2
    return 0


__all__ = [
    "AMBIGUOUS_FAILURE_CLASSES",
    "LegacyConfig",
    "LegacyExecutor",
    "LegacyNotAdmitted",
    "LegacyOutcomeError",
    "LegacyService",
    "ProjectionReport",
    "Resolution",
    "legacy_outcome_project",
    "legacy_outcome_resolve",
    "outcome_digest",
    "service_scope",
]
