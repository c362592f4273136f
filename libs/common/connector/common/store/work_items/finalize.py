"""What follows a claim on ``connector_work_item``: lease renewal, the fenced finalize (complete,
retry, dead, release, with the lanes, slots, circuits and debounce keys it settles in the same
transaction), the reclaim of expired leases and the claimers' wake-up."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.circuits import NEUTRAL, Transition, circuit_record
from connector.common.store.flow import slots_release
from connector.common.store.lanes import (
    LANE_SETTLE_HEADS,
    Lane,
    LaneKind,
    lane_lock_batch,
    lane_settle_batch,
    settle_params,
)
from connector.common.store.tokens import TOKEN_COUNTER_BITS
from connector.common.store.vocabulary import CHANNEL_WORK, NOW_RANK, claim_rank
from connector.common.store.work_items.claim import (
    AUTHORITY_ROWS,
    CLAIM_AUTHORITY_ROWS,
    CLAIM_COLUMNS,
    TAKE,
    TAKEN,
)

Conn = AsyncConnection[Any]

# False: by-id statements get a custom plan per execution (see the module docstring; psycopg would
# otherwise prepare a statement after 5 executions). tests/executor/test_explain.py reads this.
BY_ID_PREPARE = False


WORK_ITEM_RENEW_LEASE_BATCH = """
UPDATE connector_work_item w
SET lease_until = clock_timestamp() + make_interval(secs => %(lease_s)s::float8)
WHERE w.work_id = ANY(%(ids)s::bigint[]) AND w.state = 'processing'
  AND w.lease_token = (%(tokens)s::bigint[])[width_bucket(w.work_id, %(ids)s::bigint[])]
RETURNING w.work_id
"""

WORK_ITEM_COMPLETE_BATCH = """
UPDATE connector_work_item w
SET state = 'succeeded', outcome = 'succeeded', lease_owner = NULL, lease_until = NULL,
    failure_class = NULL, failure_summary = NULL,
    finished_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE w.work_id = ANY(%(ids)s::bigint[]) AND w.state = 'processing'
  AND w.lease_token = (%(tokens)s::bigint[])[width_bucket(w.work_id, %(ids)s::bigint[])]
RETURNING w.work_id
"""


#: Ended attempts kept per WorkItem (``connector_work_attempt``: a ring of this many slots).
ATTEMPTS_KEPT = 20

# The attempt a fail / reclaim statement ends (schema ``connector_work_attempt``): written in the same
# statement, as a data-modifying CTE over the rows the update changed (a stale row writes none). The
# lease owner is the row's value before the update (which clears it): a scalar subquery reads it in
# the statement's snapshot, one primary-key probe of a row the update has just visited. The slot is the
# claim counter of the token modulo ``ATTEMPTS_KEPT``: the insert overwrites the attempt of the claim
# ``ATTEMPTS_KEPT`` claims earlier, so the table stays bounded per item without a delete.
_OLD_OWNER = "(SELECT o.lease_owner FROM connector_work_item o WHERE o.work_id = w.work_id) AS owner"
_SLOT = f"mod(u.lease_token & {(1 << TOKEN_COUNTER_BITS) - 1}, {ATTEMPTS_KEPT})::smallint"
_ATTEMPT_INSERT = """INSERT INTO connector_work_attempt (work_id, slot, lease_token, attempt, lease_owner,
    started_at, ended_at, outcome, failure_class, failure_summary)"""
_ATTEMPT_UPSERT = """ON CONFLICT (work_id, slot) DO UPDATE SET lease_token = excluded.lease_token,
    attempt = excluded.attempt, lease_owner = excluded.lease_owner, started_at = excluded.started_at,
    ended_at = excluded.ended_at, outcome = excluded.outcome, failure_class = excluded.failure_class,
    failure_summary = excluded.failure_summary"""


class FailOp(StrEnum):
    """A non-success transition of ``WORK_ITEM_FAIL_BATCH`` (its value is the statement's op code)."""

    RETRY = "r"
    DEAD = "d"
    RELEASE = "l"


# retry / dead / release in one sorted pass (ops: FailOp values). A retry whose
# attempts are exhausted becomes dead. A release returns the row to the ready set at once (its
# run_after is unchanged, so it keeps its place); ``unstarted`` gives back the attempt of an item whose
# handler never started.
WORK_ITEM_FAIL_BATCH = f"""
WITH f AS (
  SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(ops)s::text[], %(delays)s::float8[],
                       %(unstarted)s::int[], %(classes)s::text[], %(summaries)s::text[])
    AS f(id, token, op, delay, unstarted, fclass, summary)
), u AS (
UPDATE connector_work_item w
SET state = CASE
      WHEN f.op = 'd' OR (f.op = 'r' AND w.attempts >= w.max_attempts) THEN 'dead'
      WHEN f.op = 'r' THEN 'retry'
      WHEN w.attempts - f.unstarted > 0 THEN 'retry'
      ELSE 'pending' END,
    attempts = w.attempts - f.unstarted,
    run_after = CASE WHEN f.op = 'r' AND w.attempts < w.max_attempts
      THEN now() + make_interval(secs => f.delay) ELSE w.run_after END,
    outcome = CASE WHEN f.op = 'd' OR (f.op = 'r' AND w.attempts >= w.max_attempts)
      THEN 'failed' ELSE NULL END,
    failure_class = CASE WHEN f.op = 'l' THEN w.failure_class ELSE f.fclass END,
    failure_summary = CASE
      WHEN f.op = 'l' THEN w.failure_summary
      WHEN f.op = 'r' AND w.attempts >= w.max_attempts
        THEN left('gave up after ' || w.attempts || ' attempts: ' || f.summary, 512)
      ELSE f.summary END,
    finished_at = CASE WHEN f.op = 'd' OR (f.op = 'r' AND w.attempts >= w.max_attempts)
      THEN clock_timestamp() ELSE NULL END,
    lease_owner = NULL, lease_until = NULL, updated_at = clock_timestamp()
FROM f
WHERE w.work_id = ANY(%(ids)s::bigint[]) AND w.work_id = f.id AND w.lease_token = f.token
  AND w.state = 'processing'
RETURNING w.work_id, w.state, f.op, f.unstarted, w.lease_token, w.attempts, w.started_at, w.updated_at,
  w.failure_class, w.failure_summary, {_OLD_OWNER}
), a AS (
  {_ATTEMPT_INSERT}
  SELECT u.work_id, {_SLOT}, u.lease_token, u.attempts, u.owner, u.started_at, u.updated_at,
         CASE WHEN u.op = 'l' THEN 'released' ELSE u.state END,
         CASE WHEN u.op = 'l' THEN NULL ELSE u.failure_class END,
         CASE WHEN u.op = 'l' THEN NULL ELSE u.failure_summary END
  FROM u WHERE u.op <> 'l' OR u.unstarted = 0
  {_ATTEMPT_UPSERT}
)
SELECT u.work_id, u.state FROM u
"""

# Expired leases: a small set read from the processing index (slots x processes rows at most), in
# its order (work_id): an index scan marks the entries of finished rows dead as it passes them.
WORK_ITEM_RECLAIM_CANDIDATES = """
SELECT w.work_id, w.lease_token, w.installed_pack_id, w.source_lane_key, w.target_mutation_lane_key,
       w.concurrency_key, w.circuit_key
FROM connector_work_item w
WHERE w.state = 'processing' AND w.lease_until < now()
ORDER BY w.work_id
LIMIT %(limit)s
"""

# The authority check is a per-row filter (a correlated ARRAY, as in the claim), not a join: joined, the
# planner drove the update from the authority rows through the (pack, generation, state) index, a walk
# of every processing entry left since the last vacuum (tests/executor/test_explain.py).
WORK_ITEM_RECLAIM_EXPIRED = f"""
WITH auth AS MATERIALIZED ({AUTHORITY_ROWS}
), u AS (
UPDATE connector_work_item w
SET state = CASE WHEN w.attempts >= w.max_attempts THEN 'dead' ELSE 'retry' END,
    run_after = now(),
    outcome = CASE WHEN w.attempts >= w.max_attempts THEN 'failed' ELSE NULL END,
    failure_class = 'lease_expired',
    failure_summary = 'the lease expired before its holder finished (holder presumed dead or paused)',
    finished_at = CASE WHEN w.attempts >= w.max_attempts THEN clock_timestamp() ELSE NULL END,
    lease_owner = NULL, lease_until = NULL, updated_at = clock_timestamp()
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE w.work_id = ANY(%(ids)s::bigint[]) AND w.work_id = f.id AND w.lease_token = f.token
  AND w.state = 'processing' AND w.lease_until < clock_timestamp()
  AND w.generation = ANY (ARRAY(SELECT a.generation FROM auth a
                               WHERE a.installed_pack_id = w.installed_pack_id))
RETURNING w.work_id, w.state, w.installed_pack_id, w.lease_token, w.attempts, w.started_at, w.updated_at,
  w.failure_class, w.failure_summary, {_OLD_OWNER}
), a AS (
  {_ATTEMPT_INSERT}
  SELECT u.work_id, {_SLOT}, u.lease_token, u.attempts, u.owner, u.started_at, u.updated_at,
         'lease_expired', u.failure_class, u.failure_summary
  FROM u
  {_ATTEMPT_UPSERT}
)
SELECT u.work_id, u.state, u.installed_pack_id FROM u
"""


# The lane handoff (docs/adr/022-lane-handoff.md): the finalize's settle, where the finalizing process
# has room, claims the members it makes runnable itself, in the same transaction (blocked ->
# processing under a new fencing token and lease, as a claim does: ``TAKE``), instead of making them
# pending for a later claim. At most %(handoff)s of them, first by work id; only members a claim
# would take now: no flow key (rate, concurrency, debounce, circuit: the flow statements gate those),
# due (``run_after``, the claim rank), and of a generation the claim authority admits to this process
# and not paused (the claim's authority rows, ``FOR SHARE``). The others become pending as in
# ``LANE_SETTLE_BATCH``. Rows: the handed-off items (``CLAIM_COLUMNS``, count NULL), then one row of
# NULLs with the number made pending.
LANE_HANDOFF_BATCH = f"""
{LANE_SETTLE_HEADS}), auth AS MATERIALIZED ({CLAIM_AUTHORITY_ROWS}
), ranked AS (
  SELECT c.work_id, c.can AND row_number() OVER (PARTITION BY c.can ORDER BY c.work_id) <= %(handoff)s AS hand
  FROM (
    SELECT x.work_id,
           (x.rate_key IS NULL AND x.concurrency_key IS NULL AND x.debounce_key IS NULL
            AND x.circuit_key IS NULL AND x.run_after <= now() AND {claim_rank("x")} <= {NOW_RANK}
            AND x.generation = ANY (ARRAY(SELECT a.generation FROM auth a
                                          WHERE a.installed_pack_id = x.installed_pack_id
                                            AND NOT (a.paused_queue_classes && ARRAY['*', x.queue_class]))))
             AS can
    FROM promotable p JOIN connector_work_item x ON x.work_id = p.work_id) c
), handed AS (
  UPDATE connector_work_item w
  {TAKE}
  FROM ranked r WHERE w.work_id = r.work_id AND r.hand AND w.state = 'blocked'
  RETURNING {TAKEN}
), promoted AS (
  UPDATE connector_work_item w SET state = 'pending', updated_at = clock_timestamp()
  FROM ranked r WHERE w.work_id = r.work_id AND NOT r.hand AND w.state = 'blocked'
  RETURNING w.work_id
)
SELECT h.*, NULL::bigint FROM handed h
UNION ALL
SELECT {", ".join(["NULL"] * len(CLAIM_COLUMNS))}, (SELECT count(*) FROM promoted)
"""


@dataclass(frozen=True, slots=True)
class Handoff:
    """What the finalizing process can take over by a lane handoff: at most ``n`` members, leased to
    ``owner`` for ``lease_s`` (``process``: its registry id, for the claim authority's gate)."""

    n: int
    owner: str
    lease_s: float
    process: str | None


# A wake-up for every claimer (``connector_work``). The hint is the payload: ``lanes`` (promotions
# within known groups), ``reclaim``, ``authority``, ``legacy``, or empty (new groups may exist).
WORK_NOTIFY = f"SELECT pg_notify('{CHANNEL_WORK}', %(hint)s)"


# ------------------------------------------------------------------------------------------------
# Renew and finalize (fenced by token, batched, sorted)
# ------------------------------------------------------------------------------------------------


async def work_item_renew_lease_batch(
    conn: Conn, ids: Sequence[int], tokens: Sequence[int], *, lease_s: float
) -> set[int]:
    """Extend the leases still held; returns the ids renewed (the others are lost). ``ids`` unique."""
    if not ids:
        return set()
    ids, tokens = _ascending(ids, tokens)
    cur = await conn.execute(
        WORK_ITEM_RENEW_LEASE_BATCH,
        {"ids": ids, "tokens": tokens, "lease_s": float(lease_s)},
        prepare=BY_ID_PREPARE,
    )
    return {int(r[0]) for r in await cur.fetchall()}


async def work_item_complete_batch(conn: Conn, ids: Sequence[int], tokens: Sequence[int]) -> list[int]:
    """Mark held items succeeded; returns the ids that matched (the others were stale). ``ids``
    unique."""
    if not ids:
        return []
    ids, tokens = _ascending(ids, tokens)
    cur = await conn.execute(WORK_ITEM_COMPLETE_BATCH, {"ids": ids, "tokens": tokens}, prepare=BY_ID_PREPARE)
    return [r[0] for r in await cur.fetchall()]


@dataclass(slots=True)
class FailBatch:
    """Non-success transitions of one flush, each row with its own token."""

    ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    ops: list[FailOp] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    unstarted: list[int] = field(default_factory=list)
    classes: list[str | None] = field(default_factory=list)
    summaries: list[str | None] = field(default_factory=list)

    def add(
        self,
        work_id: int,
        token: int,
        op: FailOp,
        *,
        delay: float = 0.0,
        unstarted: bool = False,
        failure_class: str | None = None,
        summary: str | None = None,
    ) -> None:
        self.ids.append(work_id)
        self.tokens.append(token)
        self.ops.append(op)
        self.delays.append(delay)
        self.unstarted.append(1 if unstarted else 0)
        self.classes.append(failure_class)
        self.summaries.append(summary)

    def __len__(self) -> int:
        return len(self.ids)

    def sorted_params(self) -> dict[str, list[Any]]:
        order = sorted(range(len(self.ids)), key=self.ids.__getitem__)
        return {
            "ids": [self.ids[i] for i in order],
            "tokens": [self.tokens[i] for i in order],
            "ops": [self.ops[i] for i in order],
            "delays": [self.delays[i] for i in order],
            "unstarted": [self.unstarted[i] for i in order],
            "classes": [self.classes[i] for i in order],
            "summaries": [self.summaries[i] for i in order],
        }


async def work_item_fail_batch(conn: Conn, batch: FailBatch) -> list[tuple[int, str]]:
    """Retry / dead / release transitions; returns ``(work_id, new_state)`` of rows that matched."""
    if not batch.ids:
        return []
    cur = await conn.execute(WORK_ITEM_FAIL_BATCH, batch.sorted_params(), prepare=BY_ID_PREPARE)
    return [(int(r[0]), str(r[1])) for r in await cur.fetchall()]


async def work_item_retry_batch(
    conn: Conn,
    ids: Sequence[int],
    tokens: Sequence[int],
    delays: Sequence[float],
    failure_classes: Sequence[str],
    summaries: Sequence[str],
) -> list[tuple[int, str]]:
    """Retry held items after ``delays[i]`` seconds of database time (dead when attempts are
    exhausted). Lane members must go through ``work_item_finalize`` (it locks and settles lanes)."""
    batch = FailBatch()
    for i, work_id in enumerate(ids):
        batch.add(
            work_id,
            tokens[i],
            FailOp.RETRY,
            delay=delays[i],
            failure_class=failure_classes[i],
            summary=summaries[i],
        )
    return await work_item_fail_batch(conn, batch)


async def work_item_dead_batch(
    conn: Conn,
    ids: Sequence[int],
    tokens: Sequence[int],
    failure_classes: Sequence[str],
    summaries: Sequence[str],
) -> list[tuple[int, str]]:
    """Dead-letter held items (terminal, with a sanitized failure class and summary)."""
    batch = FailBatch()
    for i, work_id in enumerate(ids):
        batch.add(work_id, tokens[i], FailOp.DEAD, failure_class=failure_classes[i], summary=summaries[i])
    return await work_item_fail_batch(conn, batch)


async def work_item_release_batch(
    conn: Conn, ids: Sequence[int], tokens: Sequence[int], unstarted: Sequence[bool]
) -> list[tuple[int, str]]:
    """Give held items back, immediately claimable elsewhere (shutdown drain)."""
    batch = FailBatch()
    for i, work_id in enumerate(ids):
        batch.add(work_id, tokens[i], FailOp.RELEASE, unstarted=unstarted[i])
    return await work_item_fail_batch(conn, batch)


@dataclass(slots=True)
class FinalizeResult:
    completed: list[int] = field(default_factory=list)
    complete_stale: int = 0
    transitions: list[tuple[int, str]] = field(default_factory=list)
    fail_stale: int = 0
    promoted: int = 0
    #: Parked items woken by the concurrency slots this flush gave back.
    woken: int = 0
    #: Circuits whose state the flush's outcomes changed (opened, closed by a probe, re-opened).
    circuits: list[Transition] = field(default_factory=list)
    #: Lane members handed off to the finalizing process (claimed rows, ``CLAIM_COLUMNS``).
    handed: list[tuple[Any, ...]] = field(default_factory=list)


def _released(slots: Mapping[int, tuple[int, str]], left: Iterable[int]) -> dict[tuple[int, str], int]:
    """Slots given back: one per row that left ``processing`` (a stale row left nothing)."""
    out: dict[tuple[int, str], int] = {}
    for wid in left:
        key = slots.get(wid)
        if key is not None:
            out[key] = out.get(key, 0) + 1
    return out


def _circuit_outcomes(
    circuits: Mapping[int, tuple[int, str, str]], left: Iterable[int]
) -> list[tuple[int, str, int, str]]:
    """The circuit feed of the rows that left ``processing`` (a stale row fed nothing), in the
    flush's finish order (``circuits`` is filled in that order)."""
    gone = set(left)
    return [(pack, key, wid, code) for wid, (pack, key, code) in circuits.items() if wid in gone]


def _ascending(ids: Sequence[int], tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(ids, tokens)`` as lists in ascending id order, as the fenced by-position lookup
    (``width_bucket``) needs; the callers' batches mostly are already (a check, no sort)."""
    ids, tokens = list(ids), list(tokens)
    if all(a < b for a, b in pairwise(ids)):
        return ids, tokens
    return _sorted_pairs(ids, tokens)


def _sorted_pairs(ids: list[int], tokens: list[int]) -> tuple[list[int], list[int]]:
    if len(ids) < 2:
        return ids, tokens
    pairs = sorted(zip(ids, tokens, strict=True))
    return [p[0] for p in pairs], [p[1] for p in pairs]


async def _finalize_fenced(
    conn: Conn, ids: list[int], tokens: list[int], fail: FailBatch, result: FinalizeResult
) -> None:
    """The fenced updates of one flush: completes, then the other transitions (counting stale rows)."""
    if ids:
        result.completed = await work_item_complete_batch(conn, ids, tokens)
        result.complete_stale = len(ids) - len(result.completed)
    if len(fail):
        result.transitions = await work_item_fail_batch(conn, fail)
        result.fail_stale = len(fail) - len(result.transitions)


async def work_item_finalize(
    conn: Conn,
    complete_ids: list[int],
    complete_tokens: list[int],
    fail: FailBatch,
    lanes: Iterable[Lane] = (),
    *,
    notify_above: int = 0,
    slots: Mapping[int, tuple[int, str]] | None = None,
    circuits: Mapping[int, tuple[int, str, str]] | None = None,
    member_lanes: Mapping[int, Sequence[Lane]] | None = None,
    handoff: Handoff | None = None,
) -> FinalizeResult:
    """Apply one flush of finalizes. Without lanes or concurrency slots: at most two autocommit
    statements. Otherwise one transaction: ``lane_lock_batch`` → fenced updates → the slots of the
    rows that left ``processing`` given back (``slots``: work id → (pack, concurrency key); parked
    items of those keys woken) → ``lane_settle_batch``, plus a NOTIFY when more lane members were
    promoted or parked items woken than ``notify_above`` (the caller's free capacity: what it cannot
    claim itself right away, other claimers should look at). ``circuits`` (work id → (pack, circuit
    key, outcome code), in finish order): the outcomes the circuit breakers count, fed after the
    slots for the rows that actually left ``processing`` (``circuits.circuit_record``).
    ``member_lanes`` (work id → its lanes): the lanes of the rows that left ``processing`` here are
    idle for the settle (``lane_settle_batch``'s ``idle``: no busy probe). ``handoff``: the settle
    claims up to ``handoff.n`` of the members it makes runnable for the caller (``LANE_HANDOFF_BATCH``;
    ``result.handed``), the rest become pending."""
    result = FinalizeResult()
    ids, tokens = _sorted_pairs(complete_ids, complete_tokens)
    lane_list = list(lanes)
    if not lane_list and not slots and not circuits:
        await _finalize_fenced(conn, ids, tokens, fail, result)
        return result
    async with conn.transaction():
        locked = await lane_lock_batch(conn, lane_list) if lane_list else []
        await _finalize_fenced(conn, ids, tokens, fail, result)
        left = [*result.completed, *(wid for wid, _ in result.transitions)]
        if slots:
            result.woken = await slots_release(conn, _released(slots, left))
        if circuits:
            result.circuits = await circuit_record(conn, _circuit_outcomes(circuits, left))
        if locked:
            idle = {lane for wid in left for lane in member_lanes.get(wid, ())} if member_lanes else set()
            if handoff is not None and handoff.n > 0:
                await _handoff(conn, locked, idle, handoff, result)
            else:
                settled = await lane_settle_batch(conn, locked, idle=idle)
                result.promoted = settled.promoted
        if result.promoted + result.woken > notify_above - len(result.handed):
            await work_notify(conn, "lanes")
    return result


async def _handoff(
    conn: Conn, locked: list[Lane], idle: set[Lane], handoff: Handoff, result: FinalizeResult
) -> None:
    params: dict[str, Any] = {
        **settle_params(locked, idle),
        "handoff": handoff.n,
        "owner": handoff.owner,
        "lease_s": float(handoff.lease_s),
        "process": handoff.process,
    }
    cur = await conn.execute(LANE_HANDOFF_BATCH, params, prepare=True)
    rows = await cur.fetchall()
    result.handed = [r[:-1] for r in rows if r[-1] is None]
    result.promoted = sum(int(r[-1]) for r in rows if r[-1] is not None)


# ------------------------------------------------------------------------------------------------
# Reclaim
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reclaimed:
    work_id: int
    state: str  # 'retry' or 'dead'
    installed_pack_id: int


async def work_item_reclaim_expired(conn: Conn, *, limit: int = 500) -> list[Reclaimed]:
    """Move expired leases to retry (or dead when attempts are exhausted). Safe under any number of
    concurrent reclaimers: each row is re-checked (state, token, expiry) by the updating statement."""
    cur = await conn.execute(WORK_ITEM_RECLAIM_CANDIDATES, {"limit": limit}, prepare=BY_ID_PREPARE)
    cands = await cur.fetchall()
    if not cands:
        return []
    cands.sort(key=lambda r: r[0])
    packs = sorted({int(r[2]) for r in cands})
    lanes: set[Lane] = set()
    for r in cands:
        if r[3] is not None:
            lanes.add((int(r[2]), LaneKind.SOURCE, str(r[3])))
        if r[4] is not None:
            lanes.add((int(r[2]), LaneKind.TARGET, str(r[4])))
    params = {"ids": [int(r[0]) for r in cands], "tokens": [int(r[1]) for r in cands], "packs": packs}
    slots = {int(r[0]): (int(r[2]), str(r[5])) for r in cands if r[5] is not None}
    # A reclaimed lease says nothing about the target (its holder died or stalled): neutral for the
    # circuit, but a half-open circuit's probe slot is given back (docs/adr/013-circuit-breakers.md).
    circuits = {int(r[0]): (int(r[2]), str(r[6]), NEUTRAL) for r in cands if r[6] is not None}
    if slots or circuits:
        # A reclaimed item gives its concurrency slot back in the transaction that moves it out of
        # processing: exactly once (the update re-checks state, token and expiry).
        async with conn.transaction():
            locked = await lane_lock_batch(conn, lanes) if lanes else []
            cur = await conn.execute(WORK_ITEM_RECLAIM_EXPIRED, params, prepare=BY_ID_PREPARE)
            rows = [Reclaimed(int(r[0]), str(r[1]), int(r[2])) for r in await cur.fetchall()]
            gone = [r.work_id for r in rows]
            woken = await slots_release(conn, _released(slots, gone)) if slots else 0
            if circuits:
                await circuit_record(conn, _circuit_outcomes(circuits, gone))
            promoted = (await lane_settle_batch(conn, locked)).promoted if locked else 0
            if rows or promoted or woken:
                await work_notify(conn, "reclaim")
        return rows
    if not lanes:
        cur = await conn.execute(WORK_ITEM_RECLAIM_EXPIRED, params, prepare=BY_ID_PREPARE)
        rows = [Reclaimed(int(r[0]), str(r[1]), int(r[2])) for r in await cur.fetchall()]
        if rows:
            await work_notify(conn, "reclaim")
        return rows
    async with conn.transaction():
        locked = await lane_lock_batch(conn, lanes)
        cur = await conn.execute(WORK_ITEM_RECLAIM_EXPIRED, params, prepare=BY_ID_PREPARE)
        rows = [Reclaimed(int(r[0]), str(r[1]), int(r[2])) for r in await cur.fetchall()]
        settled = await lane_settle_batch(conn, locked)
        if rows or settled.promoted:
            await work_notify(conn, "reclaim")
    return rows


async def work_notify(conn: Conn, hint: str = "") -> None:
    """Wake every claimer (in the caller's transaction: delivered at its commit)."""
    await conn.execute(WORK_NOTIFY, {"hint": hint}, prepare=True)
