"""Cutover and rollback of one pack generation's claim path: the seed's gates 1 to 7 (docs/cutover.md,
docs/adr/007-cutover.md).

Every transition is one transaction that first locks the pack row and then the generation's
``connector_claim_authority`` row ``FOR UPDATE``. Both claim paths' claim statements (WorkItem claim
and reclaim in ``claims.py``; legacy claim, scheduler-lease acquisition and reclaim in ``legacy.py``)
join that row ``FOR SHARE`` and admit only in their own active phase, so acquiring the lock *waits for
every claim transaction in flight*, and every claim transaction that starts after the commit sees
the new phase. Holding the lock is therefore the proof of "zero active claim transactions" of the
path being stopped; the time spent waiting for it is recorded in the proof.

Phases (``claim_path`` / ``phase``) and transitions:

* ``legacy_quiesce`` (gate 1): ``legacy_event/legacy_active`` → ``none/quiescing``. Legacy claims,
  scheduler-lease acquisition and reclaim stop; the scheduler lease is revoked; legacy processes stop
  claiming, finish what they hold and exit, and refuse to restart.
* ``cutover_complete`` (gates 2, 3, 5): ``none/quiescing`` → ``work_item/work_item_active`` with a
  ``cutover`` receipt, only when: zero legacy ``processing`` Events (no active or orphaned Event
  lease), the scheduler lease is free, zero fresh legacy-capable processes for the generation, zero
  WorkItems in flight, the database is at the code's Alembic head (claim schema), every legacy
  outcome receipt is projected without conflict, zero ``awaiting_legacy_outcome`` rows (fenced or
  quarantined ``unknown``) and zero ``unknown`` Events, every rollback fence resolved, and — after
  running the materializer's backfill inside this transaction — every work type of every Event of the
  generation has its WorkItem row (executable for unfinished Events, the reconciled mirror for work
  executed on the legacy path). Then every Event of the generation is switched to
  ``execution_owner = 'work_item'`` and the receipt binding all of it is written. Any gap: nothing
  changes, ``CutoverBlocked`` lists why.
* ``rollback_begin`` (gate 4, admission): ``work_item/work_item_active`` → ``none/rollback_fenced``.
  WorkItem claim and reclaim admit nothing for the generation from the commit on.
* ``rollback_complete`` (gate 4, fence + owner receipt): ``none/rollback_fenced`` →
  ``legacy_event/legacy_active`` with a ``rollback`` receipt, only when: zero WorkItems
  ``processing`` (active or expired lease), zero unfinished WorkItems with a started attempt
  (``attempts > 0``: a prior dispatch whose outcome the legacy path cannot know), zero unfinished
  WorkItems of this generation whose Event belongs to another generation (a cross-generation replay
  the legacy path of this generation cannot run), and the claim schema. In the same transaction every
  remaining ``pending``/``blocked``/``retry`` WorkItem (all with ``attempts = 0``) becomes
  ``awaiting_legacy_outcome`` under a new ``connector_rollback_fence``, their Events become
  ``legacy_event``-owned (``legacy_state = 'pending'``), and the receipt binds the zero proof and the
  fenced set (count, first/last id, SHA-256 of the sorted ids).
* ``transition_abort``: ``quiescing`` → back to the legacy path (as a rollback: WorkItems created
  meanwhile are fenced, a new ``rollback`` receipt re-admits the legacy path), or ``rollback_fenced``
  → back to ``work_item_active`` under its existing cutover receipt (no legacy claimant was admitted
  in between, so that receipt's proof still holds).

"Zero running WorkItem-claim-capable processes for the generation" is a database fact, not a process
list: WorkItem executors serve every pack, but their claim and reclaim statements cannot claim a
generation whose authority is not ``work_item_active``. After ``rollback_begin`` committed no process
is claim-capable *for this generation*; ``processing = 0`` under the lock proves none holds its work.
Fresh WorkItem executor registrations are recorded in the proof for audit. For the legacy path, a
legacy process registers with ``service = 'executor-legacy:<pack>:<generation>'``; a fresh
(``heartbeat_at`` within ``process_stale_s``) ``legacy_event`` process with that scope — or with an
unknown scope — blocks the cutover.

Statements are named noun-first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from connector.common import migrate
from connector.common.packs import sha256_hex
from connector.common.schema import CHANNEL_PACKS
from connector.common.store import work_items
from connector.executor.legacy import (
    ROLLBACK_FENCE_RESOLVE,
    ProjectionReport,
    legacy_outcome_project,
    service_scope,
)

log = logging.getLogger(__name__)

Conn = AsyncConnection[Any]

#: Longest a transition waits for claim transactions in flight before answering "retry".
LOCK_TIMEOUT = "15s"
#: Cutover and rollback-complete run backfill and coverage checks over a whole generation.
TRANSITION_STATEMENT_TIMEOUT = "600s"
SAMPLE = 10


# --------------------------------------------------------------------------------------------------
# Results and refusals
# --------------------------------------------------------------------------------------------------


class CutoverError(Exception):
    """A transition that does not apply. ``reason``: ``not_found`` (pack, generation or authority),
    ``wrong_phase`` (the generation is not in a phase this transition starts from)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Blocker:
    """One reason a gate refuses: a stable ``code``, how many rows/processes, and what to do."""

    code: str
    count: int
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "count": self.count, "message": self.message}


class CutoverBlocked(Exception):
    """The gate's proof found gaps; nothing was changed (fail closed)."""

    def __init__(self, action: str, blockers: list[Blocker]) -> None:
        super().__init__(
            f"{action} blocked: " + "; ".join(f"{b.code} ({b.count}): {b.message}" for b in blockers)
        )
        self.action = action
        self.blockers = blockers


@dataclass(slots=True)
class Transition:
    installed_pack_id: int
    generation: int
    action: str
    claim_path: str
    phase: str
    version: int
    #: False when the generation already was where the transition leads (idempotent repeat).
    changed: bool
    receipt_id: int | None = None
    receipt_kind: str | None = None
    fence_id: int | None = None
    fenced_work_items: int = 0
    proof: dict[str, Any] | None = None
    proof_sha256: str | None = None
    #: Only for dry runs: what would block (a real run raises ``CutoverBlocked`` instead).
    blockers: list[Blocker] = field(default_factory=list)
    dry_run: bool = False


# --------------------------------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------------------------------

PACK_LOCK = """
SELECT installed_pack_id, name, active_generation FROM connector_installed_pack
WHERE installed_pack_id = %(pack)s FOR UPDATE
"""

PACK_ACTIVE_GENERATION = (
    "SELECT active_generation FROM connector_installed_pack WHERE installed_pack_id = %(pack)s"
)

CLAIM_AUTHORITY_LOCK = """
SELECT a.claim_path, a.phase, a.version, a.cutover_receipt_id, a.rollback_fence_id, r.kind AS receipt_kind
FROM connector_claim_authority a
LEFT JOIN connector_cutover_receipt r ON r.cutover_receipt_id = a.cutover_receipt_id
WHERE a.installed_pack_id = %(pack)s AND a.generation = %(generation)s
FOR UPDATE OF a
"""

CLAIM_AUTHORITY_SET = """
UPDATE connector_claim_authority
SET claim_path = %(claim_path)s, phase = %(phase)s, cutover_receipt_id = %(receipt_id)s,
    rollback_fence_id = %(fence_id)s, version = version + 1, updated_at = clock_timestamp()
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s
RETURNING claim_path, phase, version
"""

SCHEDULER_LEASE_REVOKE = """
WITH old AS (
  SELECT holder, lease_until >= clock_timestamp() AS active FROM connector_scheduler_lease
  WHERE installed_pack_id = %(pack)s AND generation = %(generation)s FOR UPDATE
), revoked AS (
  UPDATE connector_scheduler_lease SET holder = NULL, lease_until = NULL, token = token + 1
  WHERE installed_pack_id = %(pack)s AND generation = %(generation)s
  RETURNING token
)
SELECT (SELECT holder FROM old), coalesce((SELECT active FROM old), false), (SELECT token FROM revoked)
"""

SCHEDULER_LEASE_GET = """
SELECT holder, token, coalesce(lease_until >= clock_timestamp(), false) AS active
FROM connector_scheduler_lease WHERE installed_pack_id = %(pack)s AND generation = %(generation)s
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

# Legacy-capable processes that could claim this generation: scoped to it, or of unknown scope.
PROCESS_LEGACY_FRESH = """
SELECT process_id, service, hostname, pid, version,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s
FROM connector_process
WHERE claim_capability = 'legacy_event'
  AND heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8)
  AND (service = %(scope)s OR service NOT LIKE 'executor-legacy:%%')
ORDER BY process_id
"""

PROCESS_WORK_ITEM_FRESH = """
SELECT count(*)::bigint FROM connector_process
WHERE claim_capability = 'work_item' AND heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8)
"""

ALEMBIC_REVISION = "SELECT version_num FROM alembic_version"

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

LEGACY_OUTCOME_RECEIPT_UNPROJECTED_COUNT = """
SELECT count(*)::bigint AS n,
       coalesce((array_agg(legacy_outcome_receipt_id ORDER BY legacy_outcome_receipt_id))[1:10],
                '{}') AS sample
FROM connector_legacy_outcome_receipt
WHERE NOT projected AND installed_pack_id = %(pack)s AND generation = %(generation)s
"""

ROLLBACK_FENCE_OPEN = """
SELECT coalesce(array_agg(fence_id ORDER BY fence_id), '{}') FROM connector_rollback_fence
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s AND status = 'open'
"""

ROLLBACK_FENCE_RESOLVED_IDS = """
SELECT coalesce(array_agg(fence_id ORDER BY fence_id), '{}') FROM connector_rollback_fence
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s AND status = 'resolved'
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

ROLLBACK_FENCE_INSERT = """
INSERT INTO connector_rollback_fence (installed_pack_id, generation, status, fenced_work_items)
VALUES (%(pack)s, %(generation)s, 'open', %(n)s)
RETURNING fence_id
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

CUTOVER_RECEIPT_INSERT = """
INSERT INTO connector_cutover_receipt (installed_pack_id, generation, kind, claim_path, proof, proof_sha256,
                                       actor)
VALUES (%(pack)s, %(generation)s, %(kind)s, %(claim_path)s, %(proof)s, %(proof_sha256)s, %(actor)s)
RETURNING cutover_receipt_id
"""

DATABASE_NOW = "SELECT clock_timestamp()"

NOTIFY_PACKS = f"SELECT pg_notify('{CHANNEL_PACKS}', '')"


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def expected_schema_revision() -> str:
    """The Alembic head this code was built against (the claim schema a receipt binds)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(migrate.alembic_config("")).get_current_head()
    return str(head)


async def generation_resolve(conn: Conn, installed_pack_id: int, generation: int | None) -> int:
    """``generation``, or the pack's active generation when ``None``/0."""
    if generation:
        return generation
    cur = await conn.execute(PACK_ACTIVE_GENERATION, {"pack": installed_pack_id})
    row = await cur.fetchone()
    if row is None:
        raise CutoverError("not_found", f"pack {installed_pack_id} not found")
    if row[0] is None:
        raise CutoverError("not_found", f"pack {installed_pack_id} has no active generation; name one")
    return int(row[0])


@dataclass(slots=True)
class _Locked:
    pack_name: str
    authority: dict[str, Any]
    lock_wait_ms: float
    params: dict[str, Any]


async def _lock(conn: Conn, pack: int, generation: int, *, long: bool = False) -> _Locked:
    """Inside the caller's transaction: pack row, then authority row, ``FOR UPDATE``."""
    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    if long:
        await conn.execute(f"SET LOCAL statement_timeout = '{TRANSITION_STATEMENT_TIMEOUT}'")
    params = {"pack": pack, "generation": generation}
    cur = conn.cursor(row_factory=dict_row)
    t0 = time.monotonic()
    await cur.execute(PACK_LOCK, params)
    pack_row = await cur.fetchone()
    if pack_row is None:
        raise CutoverError("not_found", f"pack {pack} not found")
    await cur.execute(CLAIM_AUTHORITY_LOCK, params)
    authority = await cur.fetchone()
    waited = (time.monotonic() - t0) * 1000.0
    if authority is None:
        raise CutoverError(
            "not_found", f"pack {pack_row['name']!r} generation {generation} has no claim authority"
        )
    return _Locked(str(pack_row["name"]), authority, round(waited, 3), params)


def _unchanged(pack: int, generation: int, action: str, authority: dict[str, Any]) -> Transition:
    return Transition(
        installed_pack_id=pack,
        generation=generation,
        action=action,
        claim_path=str(authority["claim_path"]),
        phase=str(authority["phase"]),
        version=int(authority["version"]),
        changed=False,
        receipt_id=authority["cutover_receipt_id"],
        receipt_kind=authority["receipt_kind"],
        fence_id=authority["rollback_fence_id"],
    )


def _wrong_phase(locked: _Locked, generation: int, action: str, expected: str) -> CutoverError:
    a = locked.authority
    return CutoverError(
        "wrong_phase",
        f"{action}: pack {locked.pack_name!r} generation {generation} is {a['claim_path']}/{a['phase']};"
        f" {action} starts from {expected}",
    )


async def _set_authority(
    conn: Conn,
    locked: _Locked,
    *,
    claim_path: str,
    phase: str,
    receipt_id: int | None,
    fence_id: int | None,
) -> dict[str, Any]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        CLAIM_AUTHORITY_SET,
        {
            **locked.params,
            "claim_path": claim_path,
            "phase": phase,
            "receipt_id": receipt_id,
            "fence_id": fence_id,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    await conn.execute(NOTIFY_PACKS)
    await work_items.work_notify(conn, "authority")
    return row


async def _schema_proof(conn: Conn, blockers: list[Blocker]) -> dict[str, Any]:
    cur = await conn.execute(ALEMBIC_REVISION)
    row = await cur.fetchone()
    found = str(row[0]) if row is not None else None
    expected = expected_schema_revision()
    if found != expected:
        blockers.append(
            Blocker(
                "claim_schema_mismatch",
                1,
                f"database schema revision {found!r} is not the code's head {expected!r}: run"
                " `connector db upgrade` (or deploy the matching release) first",
            )
        )
    return {"alembic_revision": found, "expected": expected}


async def _receipt(
    conn: Conn,
    locked: _Locked,
    *,
    kind: str,
    claim_path: str,
    proof: dict[str, Any],
    actor: str,
) -> tuple[int, str]:
    digest = sha256_hex(proof)
    cur = await conn.execute(
        CUTOVER_RECEIPT_INSERT,
        {
            **locked.params,
            "kind": kind,
            "claim_path": claim_path,
            "proof": Jsonb(proof),
            "proof_sha256": digest,
            "actor": actor,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), digest


async def _db_now(conn: Conn) -> str:
    cur = await conn.execute(DATABASE_NOW)
    row = await cur.fetchone()
    assert row is not None
    return str(row[0].isoformat())


# --------------------------------------------------------------------------------------------------
# Gate 1: quiesce the legacy Event path
# --------------------------------------------------------------------------------------------------


async def legacy_quiesce(conn: Conn, installed_pack_id: int, generation: int, *, actor: str) -> Transition:
    """Stop legacy Event claim admission for the generation and revoke its scheduler lease."""
    async with conn.transaction():
        locked = await _lock(conn, installed_pack_id, generation)
        a = locked.authority
        if a["phase"] == "quiescing":
            return _unchanged(installed_pack_id, generation, "quiesce", a)
        if a["phase"] != "legacy_active":
            raise _wrong_phase(locked, generation, "quiesce", "legacy_event/legacy_active")
        cur = await conn.execute(SCHEDULER_LEASE_REVOKE, locked.params)
        lease = await cur.fetchone()
        row = await _set_authority(
            conn,
            locked,
            claim_path="none",
            phase="quiescing",
            receipt_id=a["cutover_receipt_id"],
            fence_id=a["rollback_fence_id"],
        )
    log.warning(
        "legacy Event claim admission stopped (quiescing)",
        extra={
            "installed_pack_id": installed_pack_id,
            "generation": generation,
            "actor": actor,
            "scheduler_lease_revoked": bool(lease and lease[1]),
            "lock_wait_ms": locked.lock_wait_ms,
        },
    )
    return Transition(
        installed_pack_id, generation, "quiesce", row["claim_path"], row["phase"], row["version"], True,
        receipt_id=a["cutover_receipt_id"], receipt_kind=a["receipt_kind"], fence_id=a["rollback_fence_id"],
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Gates 2, 3 and 5: drain proof, materialization, ownership switch, cutover receipt
# --------------------------------------------------------------------------------------------------


async def cutover_complete(
    conn: Conn,
    installed_pack_id: int,
    generation: int,
    *,
    actor: str,
    process_stale_s: float = 30.0,
    dry_run: bool = False,
) -> Transition:
    """Prove the drain and the re-cutover conditions, complete the materialization, switch Event
    ownership and write the ``cutover`` receipt admitting WorkItem claims — or, when anything is
    missing, change nothing and raise ``CutoverBlocked`` (with ``dry_run``: return the blockers)."""
    from connector.common.backfill import backfill

    async with conn.transaction(force_rollback=dry_run):
        locked = await _lock(conn, installed_pack_id, generation, long=True)
        a = locked.authority
        if a["phase"] == "work_item_active" and not dry_run:
            return _unchanged(installed_pack_id, generation, "cutover", a)
        if a["phase"] != "quiescing":
            raise _wrong_phase(locked, generation, "cutover", "none/quiescing (run quiesce first)")
        p = locked.params
        blockers: list[Blocker] = []
        cur = conn.cursor(row_factory=dict_row)

        # -- gate 2: zero Event claim tokens/leases, processing rows, old claimers, transactions --
        await cur.execute(EVENT_LEGACY_DRAIN, {**p, "stale_s": process_stale_s})
        drain = await cur.fetchone()
        assert drain is not None
        if drain["leases_active"] or drain["expired_holder_alive"]:
            blockers.append(
                Blocker(
                    "legacy_lease_active",
                    int(drain["leases_active"]) + int(drain["expired_holder_alive"]),
                    "Events are still processing under a legacy lease (events "
                    f"{list(drain['event_ids'])[:SAMPLE]}): wait for the legacy executor to finish them"
                    " (it exits by itself when drained)",
                )
            )
        if drain["orphaned"]:
            blockers.append(
                Blocker(
                    "legacy_lease_orphaned",
                    int(drain["orphaned"]),
                    "Events hold an expired legacy lease whose holder is gone (outcome unknown to the"
                    " runtime): abort (`connector admin cutover abort`) so a legacy executor reclaims and"
                    " finishes them, then quiesce again",
                )
            )
        await cur.execute(SCHEDULER_LEASE_GET, p)
        lease = await cur.fetchone()
        if lease is not None and lease["active"]:
            blockers.append(
                Blocker(
                    "scheduler_lease_active",
                    1,
                    "the legacy scheduler lease is held (a legacy executor still claims): stop it",
                )
            )
        await cur.execute(
            PROCESS_LEGACY_FRESH,
            {"stale_s": process_stale_s, "scope": service_scope(installed_pack_id, generation)},
        )
        legacy_procs = await cur.fetchall()
        if legacy_procs:
            who = ", ".join(f"{r['hostname']}:{r['pid']} ({r['service']})" for r in legacy_procs[:SAMPLE])
            blockers.append(
                Blocker(
                    "legacy_process_running",
                    len(legacy_procs),
                    f"legacy-capable processes are alive for this generation: {who}; stop them (a"
                    f" killed process stops counting {process_stale_s:g}s after its last heartbeat)",
                )
            )
        await cur.execute(WORK_ITEM_OPEN_COUNTS, p)
        open_counts = {r["state"]: r for r in await cur.fetchall()}
        if open_counts["processing"]["n"]:
            blockers.append(
                Blocker(
                    "work_item_processing",
                    int(open_counts["processing"]["n"]),
                    "WorkItems of the generation are processing although WorkItem claims are not admitted",
                )
            )
        schema = await _schema_proof(conn, blockers)

        # -- gate 5: every legacy outcome projected, nothing awaiting or unknown, fences resolved --
        projection = await legacy_outcome_project(
            conn, installed_pack_id=installed_pack_id, generation=generation
        )
        await conn.execute(ROLLBACK_FENCE_RESOLVE, p)
        await cur.execute(LEGACY_OUTCOME_RECEIPT_UNPROJECTED_COUNT, p)
        unprojected = await cur.fetchone()
        assert unprojected is not None
        n_unprojected = int(unprojected["n"])
        if n_unprojected:
            blockers.append(
                Blocker(
                    "legacy_receipt_conflict",
                    n_unprojected,
                    f"legacy outcome receipts {list(unprojected['sample'])} contradict their WorkItem rows"
                    " (ambiguous ownership): investigate; they are never overwritten",
                )
            )
        await cur.execute(WORK_ITEM_AWAITING_SPLIT, p)
        awaiting = await cur.fetchone()
        assert awaiting is not None
        if awaiting["awaiting"]:
            blockers.append(
                Blocker(
                    "awaiting_legacy_outcome",
                    int(awaiting["awaiting"]),
                    f"rollback-fenced WorkItems (e.g. {list(awaiting['sample'])}) have no legacy outcome"
                    " receipt yet: abort (`cutover abort`) and let the legacy executor finish them",
                )
            )
        await cur.execute(EVENT_GENERATION_COVERAGE, p)
        before = await cur.fetchone()
        assert before is not None
        if awaiting["unknown"] or before["legacy_unknown"]:
            blockers.append(
                Blocker(
                    "legacy_outcome_unknown",
                    max(int(awaiting["unknown"]), int(before["legacy_unknown"])),
                    "legacy outcomes are unknown (quarantined): check the external effect and confirm each"
                    " with `connector admin cutover resolve`",
                )
            )
        await cur.execute(ROLLBACK_FENCE_OPEN, p)
        fences_open = list((await cur.fetchone() or {"coalesce": []})["coalesce"])
        if fences_open:
            blockers.append(
                Blocker(
                    "rollback_fence_unresolved",
                    len(fences_open),
                    f"rollback fences {fences_open} are not resolved (a fenced row lacks a confirmed"
                    " terminal receipt)",
                )
            )

        # -- gate 3: complete WorkItem materialization (backfill in this transaction), then verify --
        fill = await backfill(conn, installed_pack_id=installed_pack_id, generation=generation)
        await cur.execute(EVENT_GENERATION_COVERAGE, p)
        cov = await cur.fetchone()
        assert cov is not None
        if cov["missing_work_items"]:
            failed = ", ".join(f"{k}: {v}" for k, v in sorted(fill.failed.items())) or "none"
            blockers.append(
                Blocker(
                    "materialization_incomplete",
                    int(cov["missing_work_items"]),
                    f"(event, work type) pairs without a WorkItem row after backfill (events"
                    f" {list(cov['missing_sample'])}; backfill failures: {failed})",
                )
            )
        if blockers:
            if dry_run:
                return Transition(
                    installed_pack_id, generation, "cutover", str(a["claim_path"]), str(a["phase"]),
                    int(a["version"]), False, blockers=blockers, dry_run=True,
                )  # fmt: skip
            raise CutoverBlocked("cutover", blockers)

        switched = (await conn.execute(EVENT_OWNER_SWITCH_TO_WORK_ITEM, p)).rowcount
        await cur.execute(WORK_ITEM_RECONCILED_COUNT, p)
        reconciled = int((await cur.fetchone() or {"count": 0})["count"])
        await cur.execute(ROLLBACK_FENCE_RESOLVED_IDS, p)
        fences_resolved = list((await cur.fetchone() or {"coalesce": []})["coalesce"])
        proof: dict[str, Any] = {
            "kind": "cutover",
            "pack": locked.pack_name,
            "installed_pack_id": installed_pack_id,
            "generation": generation,
            "claim_path": "work_item",
            "checked_at": await _db_now(conn),
            "previous": {
                "claim_path": a["claim_path"],
                "phase": a["phase"],
                "authority_version": a["version"],
                "admitting_receipt_id": a["cutover_receipt_id"],
            },
            "zero_old_claimers": {
                "claim_transactions": "authority row locked FOR UPDATE after every legacy claim/lease/"
                "reclaim transaction (each holds it FOR SHARE) released it; legacy admission requires"
                " phase legacy_active, stopped since the quiesce",
                "authority_lock_wait_ms": locked.lock_wait_ms,
                "legacy_processing_events": int(drain["processing"]),
                "legacy_leases_active": int(drain["leases_active"]),
                "scheduler_lease": {
                    "holder": lease["holder"] if lease else None,
                    "token": lease["token"] if lease else None,
                    "active": bool(lease and lease["active"]),
                },
                "legacy_processes_fresh": len(legacy_procs),
                "process_stale_s": process_stale_s,
                "work_items_processing": int(open_counts["processing"]["n"]),
            },
            "claim_schema": schema,
            "materialization": {
                "events": int(cov["events"]),
                "backfilled_events": fill.events,
                "backfilled_work_items": fill.work_items,
                "missing_work_items": 0,
                "ineligible_by_reason": fill.ineligible,
            },
            "event_ownership": {
                "switched_to_work_item": switched,
                "legacy_owned_before": int(before["legacy_owned"]),
                "legacy_open_transferred": int(before["legacy_open"]),
            },
            "historical_mirror": {
                "legacy_terminal_events": int(cov["legacy_terminal"]),
                "reconciled_legacy_terminal_work_items": reconciled,
                "receipts_projected_now": projection.projected,
                "receipts_duplicate": projection.duplicates,
                "unprojected_receipts": 0,
            },
            "rollback_fences": {"resolved": fences_resolved, "open": 0, "awaiting_legacy_outcome": 0},
        }
        receipt_id, digest = await _receipt(
            conn, locked, kind="cutover", claim_path="work_item", proof=proof, actor=actor
        )
        row = await _set_authority(
            conn,
            locked,
            claim_path="work_item",
            phase="work_item_active",
            receipt_id=receipt_id,
            fence_id=None,
        )
    if not dry_run:
        log.warning(
            "cutover receipt written: WorkItem claims admitted",
            extra={
                "installed_pack_id": installed_pack_id,
                "generation": generation,
                "receipt_id": receipt_id,
                "actor": actor,
            },
        )
    return Transition(
        installed_pack_id, generation, "cutover",
        row["claim_path"], row["phase"], row["version"],  # a dry run: where it would be (rolled back)
        not dry_run,
        receipt_id=None if dry_run else receipt_id, receipt_kind="cutover", proof=proof,
        proof_sha256=digest, dry_run=dry_run,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Gate 4: rollback (admission, then fence + owner receipt)
# --------------------------------------------------------------------------------------------------


async def rollback_begin(conn: Conn, installed_pack_id: int, generation: int, *, actor: str) -> Transition:
    """Disable WorkItem claim and reclaim admission for the generation."""
    async with conn.transaction():
        locked = await _lock(conn, installed_pack_id, generation)
        a = locked.authority
        if a["phase"] == "rollback_fenced":
            return _unchanged(installed_pack_id, generation, "rollback_begin", a)
        if a["phase"] != "work_item_active":
            raise _wrong_phase(locked, generation, "rollback", "work_item/work_item_active")
        row = await _set_authority(
            conn,
            locked,
            claim_path="none",
            phase="rollback_fenced",
            receipt_id=a["cutover_receipt_id"],
            fence_id=a["rollback_fence_id"],
        )
    log.warning(
        "WorkItem claim admission disabled (rollback_fenced)",
        extra={"installed_pack_id": installed_pack_id, "generation": generation, "actor": actor},
    )
    return Transition(
        installed_pack_id, generation, "rollback_begin", row["claim_path"], row["phase"], row["version"],
        True, receipt_id=a["cutover_receipt_id"], receipt_kind=a["receipt_kind"],
    )  # fmt: skip


async def rollback_complete(
    conn: Conn,
    installed_pack_id: int,
    generation: int,
    *,
    actor: str,
    process_stale_s: float = 30.0,
    dry_run: bool = False,
) -> Transition:
    """Prove zero WorkItem claimers and started attempts, fence every remaining unstarted WorkItem
    and write the ``rollback`` receipt admitting the legacy Event path (or raise ``CutoverBlocked``)."""
    async with conn.transaction(force_rollback=dry_run):
        locked = await _lock(conn, installed_pack_id, generation, long=True)
        a = locked.authority
        if a["phase"] == "legacy_active" and not dry_run:
            return _unchanged(installed_pack_id, generation, "rollback", a)
        # A dry run may also preview from work_item_active (items in flight then count as blockers;
        # normally they finish once admission is disabled).
        if a["phase"] != "rollback_fenced" and not (dry_run and a["phase"] == "work_item_active"):
            raise _wrong_phase(
                locked, generation, "rollback", "none/rollback_fenced (run rollback begin first)"
            )
        return await _to_legacy(conn, locked, "rollback", actor, process_stale_s, dry_run)


async def transition_abort(
    conn: Conn,
    installed_pack_id: int,
    generation: int,
    *,
    actor: str,
    process_stale_s: float = 30.0,
) -> Transition:
    """Return a generation in transition to the path it came from (see the module docstring)."""
    async with conn.transaction():
        locked = await _lock(conn, installed_pack_id, generation, long=True)
        a = locked.authority
        if a["phase"] == "quiescing":
            return await _to_legacy(conn, locked, "abort", actor, process_stale_s, False)
        if a["phase"] == "rollback_fenced":
            if a["cutover_receipt_id"] is None or a["receipt_kind"] not in ("install", "cutover"):
                raise CutoverError(
                    "wrong_phase",
                    "the generation has no cutover receipt to return to; complete the rollback instead",
                )
            row = await _set_authority(
                conn,
                locked,
                claim_path="work_item",
                phase="work_item_active",
                receipt_id=a["cutover_receipt_id"],
                fence_id=a["rollback_fence_id"],
            )
            log.warning(
                "rollback aborted: WorkItem claims admitted again under the existing receipt",
                extra={"installed_pack_id": installed_pack_id, "generation": generation, "actor": actor},
            )
            return Transition(
                installed_pack_id, generation, "abort", row["claim_path"], row["phase"], row["version"], True,
                receipt_id=a["cutover_receipt_id"], receipt_kind=a["receipt_kind"],
            )  # fmt: skip
        raise _wrong_phase(locked, generation, "abort", "quiescing or rollback_fenced")


async def _to_legacy(
    conn: Conn, locked: _Locked, action: str, actor: str, process_stale_s: float, dry_run: bool
) -> Transition:
    """Gate 4 inside the caller's locked transaction: proof, fence, ``rollback`` receipt, authority."""
    a = locked.authority
    p = locked.params
    pack, generation = int(p["pack"]), int(p["generation"])
    blockers: list[Blocker] = []
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(WORK_ITEM_OPEN_COUNTS, p)
    counts = {r["state"]: r for r in await cur.fetchall()}
    processing = counts["processing"]
    if processing["n"]:
        blockers.append(
            Blocker(
                "work_item_processing",
                int(processing["n"]),
                f"WorkItems are processing ({int(processing['expired'])} with an expired lease): wait for"
                " their executors to finish them; an expired lease is reclaimed only while WorkItem claims"
                " are admitted, so for those abort (`cutover abort`), let them finish, and roll back again",
            )
        )
    started = sum(int(counts[s]["started"]) for s in ("pending", "blocked", "retry"))
    if started:
        await cur.execute(WORK_ITEM_STARTED_SAMPLE, p)
        sample = [int(r["work_id"]) for r in await cur.fetchall()]
        blockers.append(
            Blocker(
                "prior_dispatch",
                started,
                f"unfinished WorkItems already had a started attempt (e.g. {sample}); the legacy path"
                " cannot know their external outcome: abort (`cutover abort`), let the WorkItem path"
                " finish them (succeeded or dead), then roll back again",
            )
        )
    cross = sum(int(counts[s]["cross_generation"]) for s in ("pending", "blocked", "retry"))
    if cross:
        blockers.append(
            Blocker(
                "cross_generation_item",
                cross,
                "unfinished WorkItems of this generation belong to Events of another generation (replays);"
                " the legacy path of this generation cannot run them: let them finish first",
            )
        )
    schema = await _schema_proof(conn, blockers)
    cur2 = await conn.execute(WORK_ITEM_FENCE_PLAN, p)
    plan = await cur2.fetchone()
    assert plan is not None
    fenceable, held_by_dead_head = int(plan[0]), int(plan[1])
    cur2 = await conn.execute(PROCESS_WORK_ITEM_FRESH, {"stale_s": process_stale_s})
    wi_row = await cur2.fetchone()
    work_item_procs = int(wi_row[0]) if wi_row is not None else 0
    if blockers:
        if dry_run:
            return Transition(
                pack, generation, action, str(a["claim_path"]), str(a["phase"]), int(a["version"]), False,
                blockers=blockers, dry_run=True, fenced_work_items=fenceable,
            )  # fmt: skip
        raise CutoverBlocked(action, blockers)

    fence_id: int | None = None
    fenced, fenced_events, fenced_sha, first_id, last_id = 0, 0, sha256_hex(""), None, None
    if fenceable:
        cur2 = await conn.execute(ROLLBACK_FENCE_INSERT, {**p, "n": fenceable})
        frow = await cur2.fetchone()
        assert frow is not None
        fence_id = int(frow[0])
        cur2 = await conn.execute(WORK_ITEM_ROLLBACK_FENCE, {**p, "fence_id": fence_id})
        r = await cur2.fetchone()
        assert r is not None
        fenced, fenced_events, fenced_sha, first_id, last_id = int(r[0]), int(r[1]), str(r[2]), r[3], r[4]
        if fenced != fenceable:  # cannot happen under the locks; never write a partial proof
            raise CutoverBlocked(
                action, [Blocker("fence_incomplete", fenceable, f"planned {fenceable} rows, fenced {fenced}")]
            )
    proof: dict[str, Any] = {
        "kind": "rollback",
        "pack": locked.pack_name,
        "installed_pack_id": pack,
        "generation": generation,
        "claim_path": "legacy_event",
        "from_phase": a["phase"],
        "checked_at": await _db_now(conn),
        "previous": {
            "claim_path": a["claim_path"],
            "phase": a["phase"],
            "authority_version": a["version"],
            "admitting_receipt_id": a["cutover_receipt_id"],
        },
        "zero_work_item_claimers": {
            "claim_transactions": "authority row locked FOR UPDATE after every WorkItem claim/reclaim"
            " transaction (each holds it FOR SHARE) released it; both statements require phase"
            " work_item_active, which ended when WorkItem admission was disabled",
            "authority_lock_wait_ms": locked.lock_wait_ms,
            "processing": int(processing["n"]),
            "expired_leases": int(processing["expired"]),
            "started_attempts_unfinished": started,
            "claim_capable_processes_for_generation": 0,
            "definition": "a process is WorkItem-claim-capable for a generation only through the claim and"
            " reclaim statements, which admit nothing unless the authority is work_item_active; with the"
            " authority disabled and processing = 0 under the lock, no process holds or can take its work",
            "work_item_processes_fresh_any_pack": work_item_procs,
            "process_stale_s": process_stale_s,
        },
        "claim_schema": schema,
        "fence": {
            "fence_id": fence_id,
            "fenced_work_items": fenced,
            "fenced_set_sha256": fenced_sha,
            "first_work_id": first_id,
            "last_work_id": last_id,
            "events_to_legacy": fenced_events,
            "previously_awaiting": int(counts["awaiting_legacy_outcome"]["n"]),
            "dead_kept_on_work_item_path": int(counts["dead"]["n"]),
            "held_by_dead_lane_head_kept_on_work_item_path": held_by_dead_head,
        },
    }
    receipt_id, digest = await _receipt(
        conn, locked, kind="rollback", claim_path="legacy_event", proof=proof, actor=actor
    )
    row = await _set_authority(
        conn,
        locked,
        claim_path="legacy_event",
        phase="legacy_active",
        receipt_id=receipt_id,
        fence_id=fence_id,
    )
    if not dry_run:
        log.warning(
            "rollback receipt written: legacy Event path admitted",
            extra={
                "installed_pack_id": pack,
                "generation": generation,
                "receipt_id": receipt_id,
                "fence_id": fence_id,
                "fenced_work_items": fenced,
                "actor": actor,
            },
        )
    return Transition(
        pack, generation, action,
        row["claim_path"], row["phase"], row["version"],  # a dry run: where it would be (rolled back)
        not dry_run,
        receipt_id=None if dry_run else receipt_id, receipt_kind="rollback",
        fence_id=None if dry_run else fence_id, fenced_work_items=fenced,
        proof=proof, proof_sha256=digest, dry_run=dry_run,
    )  # fmt: skip


async def legacy_reconcile(
    conn: Conn, installed_pack_id: int | None = None, generation: int | None = None
) -> ProjectionReport:
    """Project every unprojected legacy outcome receipt (of one generation, or all) and resolve fences."""
    return await legacy_outcome_project(conn, installed_pack_id=installed_pack_id, generation=generation)


__all__ = [
    "Blocker",
    "CutoverBlocked",
    "CutoverError",
    "Transition",
    "cutover_complete",
    "expected_schema_revision",
    "generation_resolve",
    "legacy_quiesce",
    "legacy_reconcile",
    "rollback_begin",
    "rollback_complete",
    "transition_abort",
]
