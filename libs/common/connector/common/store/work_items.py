"""Every statement on ``connector_work_item`` (ADR 005): the claim path first — claim, renew, finalize,
release, reclaim — then the reads and transitions of the sampler, the admin API, the cutover gates
and the legacy-outcome projection, and last their creation (the materializer's multi-row insert).

Joins held here (their driving table is the WorkItem): the claimed batch's event facts and payloads
(``work_item_event_batch``: ``connector_event`` + ``connector_ingress_receipt`` by primary key); the
admin API's dead letters and WorkItem with their event and receipt (``work_item_list_dead``,
``work_item_get``, built from the aliased select lists ``WORK_ITEM_SELECT_COLUMNS``,
``events.EVENT_SELECT_COLUMNS``, ``receipts.RECEIPT_SELECT_COLUMNS``), the replay checks' item,
event and receipt (``work_item_replay_candidates``), and its queue and lane statistics driven from
the pack and generation rows (``work_item_stats_*``, ``work_item_lanes_blocked``).

The WorkItem row is the sole distributed execution authority. Rules every claim-path statement
here follows:

* **Claim** is one statement: per (pack, queue class) group a candidate read of the partial ready
  index, due rows in claim order (``schema.claim_rank``: the due time less the priority head start,
  docs/adr/014-priorities.md) ``ORDER BY claim_rank, work_id LIMIT n FOR UPDATE SKIP LOCKED``
  (never waits on a row), then a
  primary-key update of exactly those rows that sets ``processing``, ``lease_token + 1`` (strictly
  increasing per row), the owner and ``lease_until`` from the *database* clock. The update re-checks
  no state: the candidates are locked by this statement with their conditions re-evaluated on the
  newest row version (READ COMMITTED EvalPlanQual) and stay locked until commit; a state predicate
  there would let the planner drive the update from the ready index, whose row estimate comes from
  statistics taken when the backlog was small (a walk of the whole backlog per claim). The statement joins
  ``connector_claim_authority`` and locks the authority rows ``FOR SHARE``: it claims only where the
  WorkItem path is the active owner with a cutover receipt, and an authority change (an ``UPDATE`` of
  that row) waits for claim transactions in flight, so every later claim sees the new phase. Anything
  else fails closed (no rows). A paused pack or queue class (``paused_queue_classes`` of those
  authority rows, ``store.pauses``) drops out of the admitted generations the same way: the pause
  updates the rows, so it waits for the claims in flight and every later claim sees it. A group
  with no admitted generation (paused, or not WorkItem-owned) is cut off before its index scan by
  ``cardinality(ag.gens) > 0``, a one-time filter: the generation is not in the ready index, so
  without it the scan would read (and discard) every ready row of the group.
* **Renew, complete, retry, dead, release** are batched and fenced row by row: ``work_id = id AND
  lease_token = token AND state = 'processing'``. The hot two (renew, complete) look the token up
  by position instead of joining ``unnest(ids, tokens)`` (a prepared statement's generic plan cannot
  size the unnest and picks a nested-loop join, which is quadratic in the batch size): ``ids`` is
  sorted and unique, so ``width_bucket(work_id, ids)`` — a binary search — is the row's position
  and ``tokens[width_bucket(...)]`` its token. (``array_position``, the linear search used before,
  cost ~2.5 us per row at 256 ids, a seventh of the complete: docs/benchmarks.md, "The fenced
  lookup".) A stale holder's write matches zero rows; the
  caller counts it and abandons the item. Arrays are passed sorted by ``work_id`` so batched
  finalizes lock rows in one global order (DESIGN §8 trap 1).
* **Reclaim** of an expired lease re-checks state, token and expiry (``lease_until <
  clock_timestamp()``) in the same statement that moves the row to ``retry`` or, when attempts are
  exhausted, ``dead`` — a row that was finished or re-claimed in between is left alone.
* Lane members (source or target lane key) are finalized, released and reclaimed inside one
  transaction that first takes the lanes' advisory locks (``lane_lock_batch``) and finally settles
  them (``lane_settle_batch``), per ADR 003. Lanes never appear in the claim statement.
* State lists are inlined literals and ``now()`` (statement start) is used in candidate reads, while
  leases use ``clock_timestamp()`` (DESIGN §8 trap 5). A new ``run_after`` (retry, reclaim) is
  ``now()`` + delay, so the rows of one batch share it and keep their ``work_id`` order.
* The claim and the ready-groups read are prepared (``prepare=True``). The by-id statements (renew,
  complete, fail, reclaim) and the reclaim candidate read are sent unprepared (``BY_ID_PREPARE``): a
  prepared statement's generic plan is built once per connection, and one built while the table was
  nearly empty and unanalyzed (a fresh deployment, autovacuum off) walked a whole index for
  ``work_id = ANY(ids)``, a cost that grows with every item finished since the last vacuum. A
  custom plan is made for the table as it is; planning costs ~0.1 ms per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from itertools import pairwise
from typing import Any, NamedTuple

from psycopg import AsyncConnection

from connector.common.schema import CHANNEL_WORK, EVENT_FACT_COLUMNS, NOW_RANK, PARKED, claim_rank
from connector.common.store.circuits import NEUTRAL, CircuitKey, Transition, circuit_record
from connector.common.store.debounce import DebounceKey, debounce_lock, debounce_unpark_newest
from connector.common.store.events import EVENT_SELECT_COLUMNS, unnest_columns
from connector.common.store.flow import RateKey, SlotKey, rate_key_lock, slots_release
from connector.common.store.lanes import (
    Lane,
    LaneKind,
    lane_holding,
    lane_lock_batch,
    lane_settle_batch,
    lanes_of,
)
from connector.common.store.packs import pack_filter
from connector.common.store.receipts import RECEIPT_SELECT_COLUMNS
from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]

# False: by-id statements get a custom plan per execution (see the module docstring; psycopg would
# otherwise prepare a statement after 5 executions). tests/executor/test_explain.py reads this.
BY_ID_PREPARE = False

# Authority rows admitting WorkItem claims, locked FOR SHARE for the statement's transaction, in
# (pack, generation) order: a pause locks a pack's rows in the same order (store.pauses), so the
# two never wait on each other crosswise. ``paused_queue_classes`` is what the claim skips.
_AUTHORITY = """
  SELECT a.installed_pack_id, a.generation, a.paused_queue_classes FROM connector_claim_authority a
  WHERE a.installed_pack_id = ANY(%(packs)s::bigint[])
    AND a.claim_path = 'work_item' AND a.phase = 'work_item_active' AND a.cutover_receipt_id IS NOT NULL
  ORDER BY a.installed_pack_id, a.generation
  FOR SHARE
"""


class ClaimedRow(NamedTuple):
    """A claimed item as the claim statement returns it. The rows stay plain tuples (no row factory
    on the hot path); this names their positions once: ``CLAIM_COLUMNS`` is the RETURNING list."""

    work_id: int
    lease_token: int
    installed_pack_id: int
    generation: int
    queue_class: str
    work_type: str
    event_id: int
    attempts: int
    max_attempts: int
    source_lane_key: str | None
    target_mutation_lane_key: str | None
    #: The parent of the attempt's span (docs/tracing.md); NULL while tracing is off.
    traceparent: str | None
    #: The concurrency key whose slot the item holds while processing (docs/adr/011-rate-limits.md).
    concurrency_key: str | None
    #: The debounce key: the executor reads the items this execution covers (docs/packs.md#debounce).
    debounce_key: str | None
    #: The circuit (handler target) its outcome feeds (docs/adr/013-circuit-breakers.md).
    circuit_key: str | None


CLAIM_COLUMNS = ClaimedRow._fields

#: What every claim statement writes on a row it takes (the lease, the next fencing token, one
#: attempt) and returns of it (``ClaimedRow``).
_TAKE = """SET state = 'processing', lease_token = w.lease_token + 1, lease_owner = %(owner)s,
      lease_until = clock_timestamp() + make_interval(secs => %(lease_s)s::float8),
      attempts = w.attempts + 1, started_at = clock_timestamp(), updated_at = clock_timestamp()"""
_TAKEN = ", ".join("w." + c for c in CLAIM_COLUMNS)
#: The select list of the flow and rate statements' per-group count rows over ``h (pack, qc, due,
#: why)``: ``(NULL, count, pack, ms until the first due, queue class, marker, NULL…)``.
_HELD_BACK = f"""SELECT NULL, count(*), h.pack, (extract(epoch FROM min(h.due) - now()) * 1000)::int,
       h.qc, h.why, {", ".join(["NULL"] * (len(CLAIM_COLUMNS) - 6))}"""


def _candidates(out: str, inner: str) -> str:
    """The candidate read both claim statements share: per group ``(pack, qc, n)`` of the parameters, up
    to ``n`` due rows of an admitted (WorkItem-owned, not paused) generation from the ready index in
    claim order, locked ``SKIP LOCKED``. ``out`` / ``inner``: the extra columns it returns (``c.``) and
    reads (``w.``). Columns ``work_id, pack, qc`` always come first."""
    return f"""
  SELECT c.work_id, g.pack, g.qc, {out}
  FROM unnest(%(packs)s::bigint[], %(queue_classes)s::text[], %(limits)s::int[]) AS g(pack, qc, n)
  CROSS JOIN LATERAL (
    SELECT ARRAY(SELECT a.generation FROM auth a WHERE a.installed_pack_id = g.pack
                 AND NOT (a.paused_queue_classes && ARRAY['*', g.qc])) AS gens) ag
  CROSS JOIN LATERAL (
    SELECT w.work_id, {inner} FROM connector_work_item w
    WHERE w.installed_pack_id = g.pack AND w.queue_class = g.qc
      AND w.state IN ('pending', 'retry') AND {claim_rank("w")} <= {NOW_RANK} AND w.run_after <= now()
      AND w.generation = ANY (ag.gens) AND cardinality(ag.gens) > 0
    ORDER BY {claim_rank("w")}, w.work_id
    LIMIT g.n
    FOR UPDATE OF w SKIP LOCKED
  ) c"""


#: A candidate the plain claim statement must leave to the flow statement: it carries a flow key (a
#: rate limit, concurrency or debounce key: docs/packs.md#debounce; a circuit breaker).
FLOW_KEYED = (
    "(w.rate_key IS NOT NULL OR w.concurrency_key IS NOT NULL OR w.debounce_key IS NOT NULL"
    " OR w.circuit_key IS NOT NULL)"
)

#: A candidate the rate statement must leave to the flow statement: a flow key other than a rate key.
FLOW_OTHER = "(w.concurrency_key IS NOT NULL OR w.debounce_key IS NOT NULL OR w.circuit_key IS NOT NULL)"

#: The plain claim: the statement of a batch whose groups carry no flow keys (an unlimited pack pays
#: nothing for the flow CTEs). It never claims a keyed candidate: it locks it for an instant and
#: leaves it untouched, and every returned row carries, after the ``CLAIM_COLUMNS``, the pack, the
#: queue class and whether it has a flow key other than a rate key (``FLOW_OTHER``) of each keyed
#: candidate it left (three arrays, NULL when none; computed once per statement); the claimer sends
#: those groups' next batches through the rate statement (rate keys only) or the flow statement. So a
#: limit holds whichever statement a process sends (a process that has not yet seen a key is safe).
#: The update is the top-level statement, as the claim was before flow limits: returning its rows
#: through a CTE and a per-group count branch (``UNION ALL``) cost ~0.4 ms per claim of 256
#: (docs/benchmarks.md, "Session 6"). A claim that updates nothing returns nothing, so it cannot tell
#: whether it left keyed candidates: the claimer learns that from the ready-groups read, whose rows
#: say whether a group's first ready row is keyed (``WORK_ITEM_READY_GROUPS``).
WORK_ITEM_CLAIM_PLAIN_BATCH = f"""
WITH auth AS MATERIALIZED ({_AUTHORITY}
), cand AS ({_candidates("c.keyed, c.other", f"{FLOW_KEYED} AS keyed, {FLOW_OTHER} AS other")}
)
UPDATE connector_work_item w
{_TAKE}
WHERE w.work_id = ANY (ARRAY(SELECT c.work_id FROM cand c WHERE NOT c.keyed))
RETURNING {_TAKEN},
  (SELECT array_agg(c.pack) FROM cand c WHERE c.keyed), (SELECT array_agg(c.qc) FROM cand c WHERE c.keyed),
  (SELECT array_agg(c.other) FROM cand c WHERE c.keyed)
"""

# Circuit breakers (docs/adr/013-circuit-breakers.md, ``store.circuits``): a gate before the flow
# limits, so a candidate it holds back spends no budget and takes no slot. ``cand_all`` is the
# candidate read; ``cand`` what the circuits let through (all of it when no candidate has a
# circuit: the CTEs read no row). The window's circuit rows are read in the statement's snapshot to
# choose the lock: a closed circuit (or one open and not yet due for probes) is locked ``FOR KEY
# SHARE SKIP LOCKED`` — claims never conflict on it, and an opening (``FOR UPDATE``) waits for them
# and is seen by every later claim —, the others ``FOR UPDATE SKIP LOCKED`` (this claim may admit
# probes and write ``probe_ids``). On the newest version: closed admits all; half-open (or open with
# ``open_until`` passed, which becomes half-open) admits the first ``half_open_probes - probes in
# flight`` candidates of the circuit, recorded as its probes (``CIRCUIT_PROBES``, only those the
# flow limits then admitted too); anything else holds its candidates back without an attempt,
# deferred to ``open_until`` (open), ``now() + open_s`` (forced open) or ``now() + least(open_s,
# PROBE_RECHECK_S)`` (half-open without a free probe), so they leave the head of the ready order.
# A circuit row held by another claim or feed at that instant leaves its candidates untouched.
PROBE_RECHECK_S = 2.0
#: The columns the flow statement's candidates carry (after ``work_id, pack, qc``).
_FLOW_OUT = "c.rate_key, c.concurrency_key, c.rank, c.work_type, c.debounce_key"
_FLOW_IN = f"w.rate_key, w.concurrency_key, {claim_rank('w')} AS rank, w.work_type, w.debounce_key"
CIRCUIT_GATE = f"""
), circ_seen AS (
  SELECT d.pack, d.circuit_key, k.readonly
  FROM (SELECT DISTINCT c.pack, c.circuit_key FROM cand_all c WHERE c.circuit_key IS NOT NULL) d
  CROSS JOIN LATERAL (
    SELECT k.state = 'closed' OR (k.state = 'open' AND (k.forced OR k.open_until > now())) AS readonly
    FROM connector_circuit k WHERE k.installed_pack_id = d.pack AND k.circuit_key = d.circuit_key
    LIMIT 1) k  -- LIMIT: a primary-key probe per circuit (not pulled up into a join of the table)
), circ AS (
  SELECT s.pack, s.circuit_key, k.state, k.forced, k.open_until, k.open_s, 0 AS free, false AS probing
  FROM circ_seen s CROSS JOIN LATERAL (
    SELECT k.state, k.forced, k.open_until, k.open_s FROM connector_circuit k
    WHERE k.installed_pack_id = s.pack AND k.circuit_key = s.circuit_key AND s.readonly
    FOR KEY SHARE SKIP LOCKED) k
  UNION ALL
  SELECT s.pack, s.circuit_key, k.state, k.forced, k.open_until, k.open_s,
         k.half_open_probes - cardinality(k.probe_ids), true
  FROM circ_seen s CROSS JOIN LATERAL (
    SELECT k.state, k.forced, k.open_until, k.open_s, k.half_open_probes, k.probe_ids
    FROM connector_circuit k
    WHERE k.installed_pack_id = s.pack AND k.circuit_key = s.circuit_key AND NOT s.readonly
    FOR UPDATE SKIP LOCKED) k
), circ_verdict AS (
  SELECT q.work_id, q.pack, q.qc, q.circuit_key, k.state IS NOT NULL AS locked,
         coalesce(k.state = 'closed' OR (k.probing AND q.r <= k.free), false) AS ok,
         coalesce(k.state <> 'closed' AND k.probing AND q.r <= k.free, false) AS probe,
         CASE WHEN k.state IS NULL THEN NULL
              WHEN k.state = 'open' AND NOT k.forced AND k.open_until > now() THEN k.open_until
              WHEN k.state = 'open' AND k.forced THEN now() + make_interval(secs => k.open_s)
              ELSE now() + make_interval(secs => least(k.open_s, {PROBE_RECHECK_S})) END AS due
  FROM (SELECT c.work_id, c.pack, c.qc, c.circuit_key,
               row_number() OVER (PARTITION BY c.pack, c.circuit_key ORDER BY c.rank, c.work_id) AS r
        FROM cand_all c WHERE c.circuit_key IS NOT NULL) q
  LEFT JOIN (SELECT c.pack, c.circuit_key, c.state, c.forced, c.open_until, c.open_s,
                    c.probing AND (c.state = 'half_open' OR (c.state = 'open' AND NOT c.forced
                                                             AND c.open_until <= now())) AS probing,
                    c.free
             FROM circ c) k ON k.pack = q.pack AND k.circuit_key = q.circuit_key
), circ_deferred AS (
  UPDATE connector_work_item d SET run_after = v.due, updated_at = clock_timestamp()
  FROM circ_verdict v
  WHERE d.work_id = ANY (ARRAY(SELECT v.work_id FROM circ_verdict v WHERE v.locked AND NOT v.ok))
    AND d.work_id = v.work_id
), cand AS (  -- a filter, not a join: the planner's row estimates stay those of the candidate read
  SELECT c.work_id, c.pack, c.qc, {_FLOW_OUT} FROM cand_all c
  WHERE c.circuit_key IS NULL OR c.work_id = ANY (ARRAY(SELECT v.work_id FROM circ_verdict v WHERE v.ok))"""

# The probes the claim admitted (after the flow limits), added to their circuits' ``probe_ids``; a
# circuit whose ``open_s`` passed becomes half-open with them.
CIRCUIT_PROBES = """, circ_probes AS (
  SELECT v.pack, v.circuit_key, array_agg(v.work_id) AS ids FROM circ_verdict v
  WHERE v.probe AND v.work_id = ANY (ARRAY(SELECT a.work_id FROM admitted a))
  GROUP BY v.pack, v.circuit_key
), circ_probe AS (
  UPDATE connector_circuit k
  SET probe_ids = k.probe_ids || x.ids, state = 'half_open',
      reason = CASE WHEN k.state = 'open' THEN 'open_s_elapsed' ELSE k.reason END,
      changed_at = CASE WHEN k.state = 'open' THEN clock_timestamp() ELSE k.changed_at END
  FROM circ_probes x
  WHERE k.installed_pack_id = ANY (ARRAY(SELECT x.pack FROM circ_probes x))
    AND k.circuit_key = ANY (ARRAY(SELECT x.circuit_key FROM circ_probes x))
    AND k.installed_pack_id = x.pack AND k.circuit_key = x.circuit_key"""

# The GCRA part of the claim statements that enforce rate limits (the flow statement and the rate
# statement), over a CTE ``rq (work_id, pack, qc, rate_key, concurrency_key, rank)`` of the rate-keyed
# candidates to decide. ``keys`` counts each key's candidates and tries its advisory lock
# (``flow.RATE_KEY_LOCK``: a key another transaction holds is left alone this round); ``budget``
# updates the rows of the keys it got, in one statement without a row lock of its own: it counts how
# many of the key's candidates the budget admits now, advances ``tat`` by that many, and returns both.
# The update lands on the row's newest version (READ COMMITTED EvalPlanQual: a claim that committed
# after this statement's snapshot is seen), so the count and ``tat`` are computed from the same
# version and never stale. ``verdict`` admits or defers each candidate; ``_RATE_DEFERRED`` moves the
# deferred ones to their due time.
#
# The r-th candidate of a key (in claim order) goes when ``greatest(tat, now()) + (r - 1) * T <=
# now() + (burst - 1) * T``, that is ``r <= burst - ceil(W / T)`` with ``W`` the wait until ``tat``
# and ``T`` the emission interval, both in whole microseconds as timestamps are, so the count is exact
# (a ``T`` that rounds to 0 admits every candidate while ``tat`` is not ahead). A key whose budget
# covers all its candidates admits them without ranking them: only the candidates of keys that bind
# (or that another transaction holds) are ranked, and a deferred one is due at ``tat + (r - burst -
# a) * T`` (``tat`` after the spend of the ``a`` admitted).
_T_US = "(extract(epoch FROM make_interval(secs => k.period_s / k.limit_n)) * 1000000)::bigint"
_W_US = "(extract(epoch FROM greatest(k.tat, now()) - now()) * 1000000)::bigint"
_RATE_ADMITS = (
    f"CASE WHEN {_T_US} = 0 THEN CASE WHEN k.tat <= now() THEN d.n ELSE 0 END"
    f" ELSE least(d.n, greatest(0, k.burst - ({_W_US} + {_T_US} - 1) / {_T_US})) END"
)
_RATE_SPEND = f"""), keys AS MATERIALIZED (
  SELECT q.pack, q.rate_key, count(*)::int AS n,
         pg_try_advisory_xact_lock({rate_key_lock("q.pack", "q.rate_key")}) AS mine
  FROM rq q GROUP BY 1, 2
), budget AS (
  UPDATE connector_rate_limit k
  SET tat = greatest(k.tat, now()) + {_RATE_ADMITS} * make_interval(secs => k.period_s / k.limit_n),
      admitted = {_RATE_ADMITS}
  FROM keys d
  WHERE k.installed_pack_id = ANY (ARRAY(SELECT d.pack FROM keys d WHERE d.mine))
    AND k.rate_key = ANY (ARRAY(SELECT d.rate_key FROM keys d WHERE d.mine))
    AND k.installed_pack_id = d.pack AND k.rate_key = d.rate_key AND d.mine
  RETURNING d.pack, d.rate_key, d.n, k.admitted AS a, k.tat,
            make_interval(secs => k.period_s / k.limit_n) AS t, k.burst - 1 AS slack
), judged AS (
  SELECT q.work_id, q.pack, q.qc, q.rate_key, q.concurrency_key, q.rank, b.a, b.n, b.tat, b.t, b.slack
  FROM rq q LEFT JOIN budget b ON b.pack = q.pack AND b.rate_key = q.rate_key
), verdict AS (
  SELECT j.work_id, j.pack, j.qc, j.rate_key, j.concurrency_key, true AS locked, true AS ok,
         NULL::timestamptz AS due
  FROM judged j WHERE j.a >= j.n
  UNION ALL
  SELECT x.work_id, x.pack, x.qc, x.rate_key, x.concurrency_key, x.a IS NOT NULL, x.r <= x.a,
         x.tat + (x.r - 1 - x.slack - x.a) * x.t
  FROM (SELECT j.*, row_number() OVER (PARTITION BY j.pack, j.rate_key ORDER BY j.rank, j.work_id) AS r
        FROM judged j WHERE j.a IS NULL OR j.a < j.n) x
"""

_RATE_DEFERRED = """), deferred AS (
  UPDATE connector_work_item d SET run_after = v.due, updated_at = clock_timestamp()
  FROM verdict v
  WHERE d.work_id = ANY (ARRAY(SELECT v.work_id FROM verdict v WHERE v.locked AND NOT v.ok))
    AND d.work_id = v.work_id AND v.locked AND NOT v.ok
"""

# Flow limits (docs/adr/011-rate-limits.md) are the only limit logic here; lanes are not (ADR 003).
# Candidates with a key are ranked per key in due order; their concurrency and debounce key rows are
# locked ``FOR UPDATE SKIP LOCKED``, their rate-limit keys' advisory locks tried (``_RATE_SPEND``): the
# statement never waits, so it cannot deadlock; a key another claim holds at that instant is left
# alone this round. The lock returns the key row's newest version (EvalPlanQual),
# so the budget read is never stale; the key rows are then updated through their primary key (both
# columns ``= ANY``, so the generic plan probes the index too), which again lands on that newest
# version. Not by tuple id: a version committed after the statement's snapshot is invisible to a
# TID scan, and the update would be lost.
#
# * Concurrency: the r-th candidate of a key goes while ``r <= max_in_flight - in_flight``;
#   ``in_flight`` grows by the items claimed. A candidate without a slot is *parked* (``run_after =
#   '9999-01-01'``, no attempt): a finishing member of its key wakes it (``flow.slots_release``).
# * Rate (GCRA), over the candidates concurrency let through: the r-th of a key goes when
#   ``greatest(tat, now()) + (r - 1) * T <= now() + (burst - 1) * T`` (``T = period_s / limit_n``);
#   ``tat`` advances by ``a * T`` for the ``a`` admitted. A candidate without budget is not claimed
#   (no attempt): its ``run_after`` moves to the time its key's budget is expected for it.
#
# Either way a held-back candidate leaves the head of the ready order instead of filling the next
# candidate window (DESIGN §8 trap 3). Items without keys pass straight through: with no limits
# declared the key CTEs read no row. The statement returns the claimed rows and, per group, one row
# ``(NULL, held back, pack, ms until the first deferred one is due, queue class)`` counting candidates
# it did not claim, so the scheduler knows the group is not drained and when to look again.
WORK_ITEM_CLAIM_BATCH = f"""
WITH auth AS MATERIALIZED ({_AUTHORITY}
), cand_all AS ({_candidates(_FLOW_OUT + ", c.circuit_key", _FLOW_IN + ", w.circuit_key")}{CIRCUIT_GATE}
), cranked AS (
  SELECT c.work_id, c.pack, c.qc, c.rate_key, c.concurrency_key, c.rank,
         row_number() OVER (PARTITION BY c.pack, c.concurrency_key ORDER BY c.rank, c.work_id) AS r
  FROM cand c WHERE c.concurrency_key IS NOT NULL
), slots AS (
  SELECT s.installed_pack_id AS pack, s.concurrency_key, greatest(0, s.max_in_flight - s.in_flight) AS free
  FROM (SELECT DISTINCT q.pack, q.concurrency_key FROM cranked q) d
  CROSS JOIN LATERAL (
    SELECT s.* FROM connector_concurrency_limit s
    WHERE s.installed_pack_id = d.pack AND s.concurrency_key = d.concurrency_key
    FOR UPDATE SKIP LOCKED
  ) s
), cverdict AS (
  SELECT q.work_id, q.pack, q.qc, q.rate_key, q.concurrency_key, q.rank,
         s.free IS NOT NULL AS locked, q.r <= s.free AS ok
  FROM cranked q LEFT JOIN slots s ON s.pack = q.pack AND s.concurrency_key = q.concurrency_key
), rq AS (
  SELECT c.work_id, c.pack, c.qc, c.rate_key, c.concurrency_key, c.rank
  FROM cand c WHERE c.rate_key IS NOT NULL AND c.concurrency_key IS NULL
  UNION ALL
  SELECT v.work_id, v.pack, v.qc, v.rate_key, v.concurrency_key, v.rank
  FROM cverdict v WHERE v.rate_key IS NOT NULL AND v.ok
{_RATE_SPEND}), dkeys AS (
  SELECT d.pack, d.work_type, d.debounce_key, k.last_claimed_id, greatest(n.newest, d.top) AS newest
  FROM (SELECT c.pack, c.work_type, c.debounce_key, max(c.work_id) AS top FROM cand c
        WHERE c.debounce_key IS NOT NULL AND c.rate_key IS NULL AND c.concurrency_key IS NULL
        GROUP BY 1, 2, 3) d
  CROSS JOIN LATERAL (
    SELECT k.last_claimed_id FROM connector_debounce k
    WHERE k.installed_pack_id = d.pack AND k.work_type = d.work_type AND k.debounce_key = d.debounce_key
    FOR UPDATE SKIP LOCKED
  ) k
  CROSS JOIN LATERAL (
    SELECT max(w.work_id) AS newest FROM connector_work_item w
    WHERE w.installed_pack_id = d.pack AND w.work_type = d.work_type AND w.debounce_key = d.debounce_key
      AND w.state IN ('pending', 'retry')
  ) n
), dverdict AS (
  SELECT c.work_id, c.pack, c.qc, k.newest IS NOT NULL AS locked,
         k.newest >= k.last_claimed_id AND c.work_id = k.newest AS run
  FROM cand c LEFT JOIN dkeys k
    ON k.pack = c.pack AND k.work_type = c.work_type AND k.debounce_key = c.debounce_key
  WHERE c.debounce_key IS NOT NULL AND c.rate_key IS NULL AND c.concurrency_key IS NULL
), dcover AS (
  SELECT x.work_id, t.into, t.late FROM (
    SELECT k.pack, k.work_type, k.debounce_key, k.newest < k.last_claimed_id AS late,
           CASE WHEN k.newest < k.last_claimed_id THEN k.last_claimed_id ELSE k.newest END AS into,
           CASE WHEN k.newest < k.last_claimed_id THEN k.newest + 1 ELSE k.newest END AS below
    FROM dkeys k
    WHERE k.newest < k.last_claimed_id OR k.newest IN (SELECT v.work_id FROM dverdict v WHERE v.run)) t
  CROSS JOIN LATERAL (
    SELECT w.work_id FROM connector_work_item w
    WHERE w.installed_pack_id = t.pack AND w.work_type = t.work_type AND w.debounce_key = t.debounce_key
      AND w.state IN ('pending', 'retry') AND w.work_id < t.below
    ORDER BY w.work_id
    FOR UPDATE OF w SKIP LOCKED
  ) x
), dcoalesced AS (
  UPDATE connector_work_item x
  SET state = 'coalesced', outcome = CASE WHEN d.late THEN 'overtaken' ELSE 'coalesced' END,
      covered_by = d.into, lease_owner = NULL, lease_until = NULL, finished_at = clock_timestamp(),
      updated_at = clock_timestamp()
  FROM dcover d
  WHERE x.work_id = ANY (ARRAY(SELECT d.work_id FROM dcover d)) AND x.work_id = d.work_id
), dparked AS (
  UPDATE connector_work_item p SET run_after = {PARKED}, updated_at = clock_timestamp()
  WHERE p.work_id = ANY (ARRAY(
    SELECT v.work_id FROM dverdict v
    WHERE v.locked AND NOT v.run AND v.work_id NOT IN (SELECT d.work_id FROM dcover d)))
), dlast AS (
  UPDATE connector_debounce k SET last_claimed_id = x.newest
  FROM (SELECT k.pack, k.work_type, k.debounce_key, k.newest FROM dkeys k
        WHERE k.newest > k.last_claimed_id AND k.newest IN (SELECT v.work_id FROM dverdict v WHERE v.run)) x
  WHERE k.installed_pack_id = ANY (ARRAY(SELECT x.pack FROM dkeys x))
    AND k.work_type = ANY (ARRAY(SELECT x.work_type FROM dkeys x))
    AND k.debounce_key = ANY (ARRAY(SELECT x.debounce_key FROM dkeys x))
    AND k.installed_pack_id = x.pack AND k.work_type = x.work_type AND k.debounce_key = x.debounce_key
), admitted AS (
  SELECT c.work_id, NULL::bigint AS pack, NULL::text AS concurrency_key
  FROM cand c WHERE c.rate_key IS NULL AND c.concurrency_key IS NULL AND c.debounce_key IS NULL
  UNION ALL
  SELECT v.work_id, NULL, NULL FROM dverdict v WHERE v.run
  UNION ALL
  SELECT v.work_id, v.pack, v.concurrency_key FROM cverdict v WHERE v.ok AND v.rate_key IS NULL
  UNION ALL
  SELECT v.work_id, v.pack, v.concurrency_key FROM verdict v WHERE v.ok
), taken AS (
  SELECT a.pack, a.concurrency_key, count(*) AS n
  FROM admitted a WHERE a.concurrency_key IS NOT NULL GROUP BY 1, 2
), take AS (
  UPDATE connector_concurrency_limit s SET in_flight = s.in_flight + x.n
  FROM taken x
  WHERE s.installed_pack_id = ANY (ARRAY(SELECT x.pack FROM taken x))
    AND s.concurrency_key = ANY (ARRAY(SELECT x.concurrency_key FROM taken x))
    AND s.installed_pack_id = x.pack AND s.concurrency_key = x.concurrency_key
), parked AS (
  UPDATE connector_work_item p SET run_after = {PARKED}, updated_at = clock_timestamp()
  WHERE p.work_id = ANY (ARRAY(SELECT v.work_id FROM cverdict v WHERE v.locked AND NOT v.ok))
{_RATE_DEFERRED}){CIRCUIT_PROBES}
), claimed AS (
  UPDATE connector_work_item w
  {_TAKE}
  WHERE w.work_id = ANY (ARRAY(SELECT a.work_id FROM admitted a))
  RETURNING {_TAKEN}
)
SELECT * FROM claimed
UNION ALL
{_HELD_BACK}
FROM (SELECT v.pack, v.qc, NULL::timestamptz AS due, 'limit' AS why FROM cverdict v WHERE v.ok IS NOT TRUE
      UNION ALL SELECT v.pack, v.qc, v.due, 'limit' FROM verdict v WHERE v.ok IS NOT TRUE
      UNION ALL SELECT v.pack, v.qc, NULL, 'debounce' FROM dverdict v WHERE v.run IS NOT TRUE
      UNION ALL SELECT v.pack, v.qc, v.due, 'limit' FROM circ_verdict v WHERE NOT v.ok) h
GROUP BY h.pack, h.qc, h.why
"""

#: The marker (in the ``work_type`` position) of the rate statement's row counting candidates with
#: another flow key.
KEYED_MARKER = "keyed"

#: The rate statement: the claim of a batch whose groups carry rate-limit keys and no other flow key
#: (docs/adr/011-rate-limits.md, "Cost"): the candidate read, the GCRA part of the flow statement
#: (``_RATE_SPEND``, ``_RATE_DEFERRED``) and the update, without the circuit, concurrency and debounce
#: CTEs, which a rate-limited drain would plan (~3 ms per claim) and run for nothing. Like the plain
#: statement it never claims a candidate it cannot judge: one with another flow key (``FLOW_OTHER``)
#: is left untouched and counted (marker ``'keyed'``), and the claimer sends that group through the
#: flow statement. It returns what the flow statement returns: the claimed rows, then per group the
#: held-back count rows (marker ``'limit'``, with the first deferred one's due time).
_RATE_IN = f"w.rate_key, {claim_rank('w')} AS rank, {FLOW_OTHER} AS other"
WORK_ITEM_CLAIM_RATE_BATCH = f"""
WITH auth AS MATERIALIZED ({_AUTHORITY}
), cand AS ({_candidates("c.rate_key, c.rank, c.other", _RATE_IN)}
), rq AS (
  SELECT c.work_id, c.pack, c.qc, c.rate_key, NULL::text AS concurrency_key, c.rank
  FROM cand c WHERE c.rate_key IS NOT NULL AND NOT c.other
{_RATE_SPEND}{_RATE_DEFERRED}
), claimed AS (
  UPDATE connector_work_item w
  {_TAKE}
  WHERE w.work_id = ANY (ARRAY(SELECT c.work_id FROM cand c WHERE c.rate_key IS NULL AND NOT c.other
                               UNION ALL SELECT v.work_id FROM verdict v WHERE v.ok))
  RETURNING {_TAKEN}
)
SELECT * FROM claimed
UNION ALL
{_HELD_BACK}
FROM (SELECT v.pack, v.qc, v.due, 'limit' AS why FROM verdict v WHERE v.ok IS NOT TRUE
      UNION ALL SELECT c.pack, c.qc, NULL, '{KEYED_MARKER}' FROM cand c WHERE c.other) h
GROUP BY h.pack, h.qc, h.why
"""

#: How the claimer's connection has PostgreSQL plan its claim statements (``plan_cache_mode``, one
#: ``SET`` when the statement the claimer sends changes kind; docs/executor.md, "Plans"): the plain
#: and rate statements (``True``) by their generic plan, the flow statement (``False``) as the server
#: is configured. Left alone, PostgreSQL custom-plans every execution of all three: it estimates
#: their generic plans ten times dearer (an array parameter counts ten groups where a custom plan
#: sees the one it is given), although they are the custom plans' own shape (test_explain.py asserts
#: both modes). Planning was a tenth of a plain claim of 256 and more of a rate claim; the flow
#: statement's generic plan runs slower (docs/benchmarks.md, "Session 7").
CLAIM_PLANS = {True: "SET plan_cache_mode = force_generic_plan", False: "RESET plan_cache_mode"}


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


class FailOp(StrEnum):
    """A non-success transition of ``WORK_ITEM_FAIL_BATCH`` (its value is the statement's op code)."""

    RETRY = "r"
    DEAD = "d"
    RELEASE = "l"


# retry / dead / release in one sorted pass (ops: FailOp values). A retry whose
# attempts are exhausted becomes dead. A release returns the row to the ready set at once (its
# run_after is unchanged, so it keeps its place); ``unstarted`` gives back the attempt of an item whose
# handler never started.
WORK_ITEM_FAIL_BATCH = """
WITH f AS (
  SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(ops)s::text[], %(delays)s::float8[],
                       %(unstarted)s::int[], %(classes)s::text[], %(summaries)s::text[])
    AS f(id, token, op, delay, unstarted, fclass, summary)
)
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
RETURNING w.work_id, w.state
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
WITH auth AS MATERIALIZED ({_AUTHORITY}
)
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
RETURNING w.work_id, w.state, w.installed_pack_id
"""

# Which (pack, queue class) groups have ready rows, when their first row is due (seconds from the
# database's now; <= 0 means due) and whether the group is paused (the claimer leaves paused groups
# out of its allocation; the claim statement is what enforces a pause). A skip scan: one index
# descent per group, and one primary-key probe of the (tiny) pause table. The index is in claim
# order (``claim_rank``), so a group's first row is its first by rank: with no priorities, its
# earliest due row, as before. With priorities the first-ranked row may be a prioritized one that
# is not due yet while another is: then one more descent looks for a due row (rank <= now, the
# only place a due row can be: heads are never negative). When none is due the group reports its
# first-ranked row's due time, which may be later than the earliest: the next discovery (every
# poll interval) corrects it, so a due row waits at most one poll for it (docs/adr/014-priorities.md).
# ``keyed``: the first-ranked row carries a flow key (``FLOW_KEYED``), so the claimer sends the group
# through the rate statement or, with ``other`` (a key other than a rate key: ``FLOW_OTHER``), the
# flow statement (the plain one cannot report keyed candidates when it claims nothing).
WORK_ITEM_READY_GROUPS = f"""
WITH RECURSIVE g AS (
  (SELECT w.installed_pack_id AS pack, w.queue_class AS qc, w.run_after, {FLOW_KEYED} AS keyed,
         {FLOW_OTHER} AS other
   FROM connector_work_item w WHERE w.state IN ('pending', 'retry')
   ORDER BY w.installed_pack_id, w.queue_class, {claim_rank("w")}, w.work_id LIMIT 1)
  UNION ALL
  SELECT n.pack, n.qc, n.run_after, n.keyed, n.other FROM g CROSS JOIN LATERAL (
    SELECT w.installed_pack_id AS pack, w.queue_class AS qc, w.run_after, {FLOW_KEYED} AS keyed,
         {FLOW_OTHER} AS other
    FROM connector_work_item w
    WHERE w.state IN ('pending', 'retry') AND (w.installed_pack_id, w.queue_class) > (g.pack, g.qc)
    ORDER BY w.installed_pack_id, w.queue_class, {claim_rank("w")}, w.work_id LIMIT 1) n
)
SELECT g.pack, g.qc,
       CASE WHEN g.run_after > now() AND (
              SELECT true FROM connector_work_item w
              WHERE w.installed_pack_id = g.pack AND w.queue_class = g.qc
                AND w.state IN ('pending', 'retry') AND {claim_rank("w")} <= {NOW_RANK}
                AND w.run_after <= now()
              ORDER BY w.installed_pack_id, w.queue_class, {claim_rank("w")} LIMIT 1)
            THEN 0::float8
            ELSE extract(epoch FROM g.run_after - now())::float8 END,
       EXISTS (SELECT 1 FROM connector_pause p
               WHERE p.installed_pack_id = g.pack AND p.queue_class IN ('*', g.qc)) AS paused,
       g.keyed, g.other
FROM g
"""

# A ``work_item_event_batch`` row: the event fact columns a handler sees (``handlers.EventFact``, in
# schema.EVENT_FACT_COLUMNS' order), then these positions.
EVENT_ROW_BODY = len(EVENT_FACT_COLUMNS)
EVENT_ROW_CONTENT_TYPE = EVENT_ROW_BODY + 2

# Event facts and payloads of a claimed batch: primary-key lookups only.
WORK_ITEM_EVENT_BATCH = """
SELECT e.event_id, e.receipt_id, e.event_index, e.installed_pack_id, e.generation, e.incarnation,
       e.route_id, e.route_version, e.namespace, e.event_kind, e.source_object_kind,
       e.source_object_id, e.idempotency_key, e.delivery_seq, e.payload_sha256, e.parse_outcome,
       e.companion, e.correlation_ids, e.created_at, r.body, r.body_ref, r.content_type
FROM connector_event e JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
WHERE e.event_id = ANY(%(ids)s::bigint[])
"""

PACK_GENERATION_MANIFEST = """
SELECT g.manifest, p.name FROM connector_pack_generation g
JOIN connector_installed_pack p ON p.installed_pack_id = g.installed_pack_id
WHERE g.installed_pack_id = %(pack)s AND g.generation = %(generation)s
"""

PACK_NAMES = "SELECT installed_pack_id, name FROM connector_installed_pack"

# A wake-up for every claimer (``connector_work``). The hint is the payload: ``lanes`` (promotions
# within known groups), ``reclaim``, ``authority``, ``legacy``, or empty (new groups may exist).
WORK_NOTIFY = f"SELECT pg_notify('{CHANNEL_WORK}', %(hint)s)"

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
# Claim
# ------------------------------------------------------------------------------------------------


async def _claim_rows(
    conn: Conn,
    statement: str,
    packs: Sequence[int],
    queue_classes: Sequence[str],
    limits: Sequence[int],
    owner: str,
    lease_s: float,
) -> list[tuple[Any, ...]]:
    """Send a claim statement (prepared) with its parameters; its rows as they come."""
    cur = await conn.execute(
        statement,
        {
            "packs": list(packs),
            "queue_classes": list(queue_classes),
            "limits": list(limits),
            "owner": owner,
            "lease_s": float(lease_s),
        },
        prepare=True,
    )
    return await cur.fetchall()


def _counts_apart(rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows of the flow or the rate claim statement as (claimed rows, count rows): both return
    their per-group count rows ``(NULL, count, pack, …, queue class, marker, …)`` after the claimed
    ones (UNION ALL)."""
    if not rows or rows[-1][0] is not None:  # no count row (they come last)
        return rows, []
    return [r for r in rows if r[0] is not None], [r for r in rows if r[0] is None]


async def work_item_claim_batch(
    conn: Conn,
    packs: Sequence[int],
    queue_classes: Sequence[str],
    limits: Sequence[int],
    *,
    owner: str,
    lease_s: float,
    held_back: dict[tuple[int, str], int] | None = None,
    due_in: dict[tuple[int, str], float] | None = None,
    debounced: dict[tuple[int, str], int] | None = None,
) -> list[tuple[Any, ...]]:
    """Claim up to ``limits[i]`` due items of each group ``(packs[i], queue_classes[i])``. Candidates
    a rate limit held back (deferred, or their key busy in another claim) are not returned; with
    ``held_back`` given, their count per ``(pack, queue class)`` is added to it; with ``due_in``, the
    seconds until the first candidate deferred for its rate limit is due, per group. Debounced
    candidates that did not run (coalesced, parked behind a newer item, or their key busy: docs/
    packs.md#debounce) are added to ``held_back`` too and, with ``debounced`` given, to it."""
    claimed, counts = _counts_apart(
        await _claim_rows(conn, WORK_ITEM_CLAIM_BATCH, packs, queue_classes, limits, owner, lease_s)
    )
    for r in counts:
        key = (int(r[2]), str(r[4]))
        if held_back is not None:
            held_back[key] = held_back.get(key, 0) + int(r[1])
        if debounced is not None and r[5] == "debounce":
            debounced[key] = debounced.get(key, 0) + int(r[1])
        if due_in is not None and r[3] is not None:
            due_in[key] = max(0.0, int(r[3]) / 1000.0)
    return claimed


async def work_item_claim_rate_batch(
    conn: Conn,
    packs: Sequence[int],
    queue_classes: Sequence[str],
    limits: Sequence[int],
    *,
    owner: str,
    lease_s: float,
    held_back: dict[tuple[int, str], int],
    due_in: dict[tuple[int, str], float],
    keyed: dict[tuple[int, str], int],
) -> list[tuple[Any, ...]]:
    """``work_item_claim_batch`` for groups whose keys are rate-limit keys only
    (``WORK_ITEM_CLAIM_RATE_BATCH``): the candidates held back for their limit are added to
    ``held_back`` (and ``due_in``) as there; those with another flow key, which it leaves untouched,
    to ``keyed`` per ``(pack, queue class)`` (those groups belong to the flow statement)."""
    claimed, counts = _counts_apart(
        await _claim_rows(conn, WORK_ITEM_CLAIM_RATE_BATCH, packs, queue_classes, limits, owner, lease_s)
    )
    for r in counts:
        key = (int(r[2]), str(r[4]))
        if r[5] == KEYED_MARKER:
            keyed[key] = keyed.get(key, 0) + int(r[1])
            continue
        held_back[key] = held_back.get(key, 0) + int(r[1])
        if r[3] is not None:
            due_in[key] = max(0.0, int(r[3]) / 1000.0)
    return claimed


async def work_item_claim_plain_batch(
    conn: Conn,
    packs: Sequence[int],
    queue_classes: Sequence[str],
    limits: Sequence[int],
    *,
    owner: str,
    lease_s: float,
    keyed: dict[tuple[int, str], int],
    other: set[tuple[int, str]] | None = None,
) -> list[tuple[Any, ...]]:
    """``work_item_claim_batch`` for groups without flow keys (``WORK_ITEM_CLAIM_PLAIN_BATCH``):
    claims the unkeyed due items only; the count of keyed candidates it left, per ``(pack, queue
    class)``, is added to ``keyed`` (those groups belong to the rate or the flow statement), and the
    groups of those with a flow key other than a rate key to ``other`` (the flow statement's). When it
    claims nothing it cannot tell (``keyed`` stays as it was). The rows carry three more columns after
    ``CLAIM_COLUMNS``."""
    rows = await _claim_rows(conn, WORK_ITEM_CLAIM_PLAIN_BATCH, packs, queue_classes, limits, owner, lease_s)
    if rows and rows[0][-3] is not None:
        for pack, qc, beyond in zip(rows[0][-3], rows[0][-2], rows[0][-1], strict=True):
            keyed[pack, qc] = keyed.get((pack, qc), 0) + 1
            if beyond and other is not None:
                other.add((pack, qc))
    return rows


class ReadyGroup(NamedTuple):
    pack: int
    queue_class: str
    due_in: float  # seconds until the group's first row is due (<= 0: due)
    paused: bool
    keyed: bool = False  # the group's first-ranked ready row carries a flow key (``FLOW_KEYED``)
    other: bool = False  # ... one other than a rate key (``FLOW_OTHER``)


async def work_item_ready_groups(conn: Conn) -> list[ReadyGroup]:
    cur = await conn.execute(WORK_ITEM_READY_GROUPS, prepare=True)
    return [
        ReadyGroup(int(r[0]), str(r[1]), float(r[2]), bool(r[3]), bool(r[4]), bool(r[5]))
        for r in await cur.fetchall()
    ]


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
) -> FinalizeResult:
    """Apply one flush of finalizes. Without lanes or concurrency slots: at most two autocommit
    statements. Otherwise one transaction: ``lane_lock_batch`` → fenced updates → the slots of the
    rows that left ``processing`` given back (``slots``: work id → (pack, concurrency key); parked
    items of those keys woken) → ``lane_settle_batch``, plus a NOTIFY when more lane members were
    promoted or parked items woken than ``notify_above`` (the caller's free capacity: what it cannot
    claim itself right away, other claimers should look at). ``circuits`` (work id → (pack, circuit
    key, outcome code), in finish order): the outcomes the circuit breakers count, fed after the
    slots for the rows that actually left ``processing`` (``circuits.circuit_record``)."""
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
            settled = await lane_settle_batch(conn, locked)
            result.promoted = settled.promoted
        if result.promoted + result.woken > notify_above:
            await work_notify(conn, "lanes")
    return result


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


# ------------------------------------------------------------------------------------------------
# Handler context reads
# ------------------------------------------------------------------------------------------------


async def work_item_event_batch(conn: Conn, event_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    cur = await conn.execute(WORK_ITEM_EVENT_BATCH, {"ids": list(event_ids)}, prepare=True)
    return await cur.fetchall()


async def pack_generation_manifest(conn: Conn, pack: int, generation: int) -> tuple[Any, str] | None:
    cur = await conn.execute(PACK_GENERATION_MANIFEST, {"pack": pack, "generation": generation})
    row = await cur.fetchone()
    return None if row is None else (row[0], str(row[1]))


async def pack_names(conn: Conn) -> dict[int, str]:
    cur = await conn.execute(PACK_NAMES)
    return {int(r[0]): str(r[1]) for r in await cur.fetchall()}


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "pack": self.installed_pack_id,
            "generation": self.generation,
            "work_type": self.work_type,
            "failure_class": self.failure_class,
            "after": self.finished_after.isoformat() if self.finished_after else None,
            "before": self.finished_before.isoformat() if self.finished_before else None,
        }

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """Conditions on alias ``w`` (state = 'dead' included) and their parameters."""
        clauses = ["w.state = 'dead'"]
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


# The ids of every dead letter matching a filter (a bulk replay's worklist), in id order.
WORK_ITEM_LIST_DEAD_IDS = "SELECT w.work_id FROM connector_work_item w WHERE {where} ORDER BY w.work_id"

WORK_ITEM_GET_MANY = f"""
SELECT {WORK_ITEM_SELECT_COLUMNS} FROM connector_work_item w WHERE w.work_id = ANY(%(ids)s::bigint[])
"""

# Replay (admin/replay.py checks; docs/admin.md): what the checks read of each item, its event and
# its receipt.
WORK_ITEM_REPLAY_CANDIDATES = """
SELECT w.work_id, w.state, w.replay_count, w.installed_pack_id, w.work_type,
       w.source_lane_key, w.target_mutation_lane_key,
       e.incarnation, e.execution_owner, r.route_key,
       (r.body IS NOT NULL OR r.body_ref IS NOT NULL) AS has_body
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


async def work_item_get_many(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    return {int(r["w_work_id"]): r for r in await fetch_dicts(conn, WORK_ITEM_GET_MANY, {"ids": list(ids)})}


async def work_item_replay_candidates(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    rows = await fetch_dicts(conn, WORK_ITEM_REPLAY_CANDIDATES, {"ids": list(ids)})
    return {int(r["work_id"]): r for r in rows}


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
SELECT {WORK_ITEM_SELECT_COLUMNS}, w.dead_blocks_lane AS w_dead_blocks_lane
FROM connector_work_item w WHERE w.event_id = ANY(%(ids)s::bigint[])
ORDER BY w.event_id, w.work_id
"""


async def work_item_list_by_events(conn: Conn, event_ids: Sequence[int]) -> list[dict[str, Any]]:
    if not event_ids:
        return []
    return await fetch_dicts(conn, WORK_ITEM_LIST_BY_EVENTS, {"ids": list(event_ids)})


# The receipt of a WorkItem's event (TraceDelivery by work id): two primary-key probes.
WORK_ITEM_RECEIPT_ID = """
SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e ON e.event_id = w.event_id
WHERE w.work_id = %(work_id)s
"""


async def work_item_receipt_id(conn: Conn, work_id: int) -> int | None:
    cur = await conn.execute(WORK_ITEM_RECEIPT_ID, {"work_id": work_id})
    row = await cur.fetchone()
    return None if row is None else int(row[0])


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


# ------------------------------------------------------------------------------------------------
# The cutover gates over a whole generation (docs/cutover.md; called under the authority lock)
# ------------------------------------------------------------------------------------------------

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


async def work_item_open_counts(conn: Conn, params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Unfinished WorkItems of the generation per state: ``n``, ``started``, ``expired``,
    ``cross_generation``."""
    return {str(r["state"]): r for r in await fetch_dicts(conn, WORK_ITEM_OPEN_COUNTS, params)}


async def work_item_started_sample(conn: Conn, params: dict[str, Any]) -> list[int]:
    cur = await conn.execute(WORK_ITEM_STARTED_SAMPLE, params)
    return [int(r[0]) for r in await cur.fetchall()]


async def work_item_awaiting_split(conn: Conn, params: dict[str, Any]) -> dict[str, Any]:
    row = await fetch_dict(conn, WORK_ITEM_AWAITING_SPLIT, params)
    assert row is not None
    return row


async def work_item_reconciled_count(conn: Conn, params: dict[str, Any]) -> int:
    cur = await conn.execute(WORK_ITEM_RECONCILED_COUNT, params)
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def work_item_fence_plan(conn: Conn, params: dict[str, Any]) -> tuple[int, int]:
    """``(fenceable, held by a dead lane head)`` of the generation's unstarted unfinished items."""
    cur = await conn.execute(WORK_ITEM_FENCE_PLAN, params)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def work_item_rollback_fence(conn: Conn, params: dict[str, Any]) -> tuple[Any, ...]:
    """Gate 4's fence (``pack``, ``generation``, ``fence_id``): ``(fenced, events handed to the
    legacy path, SHA-256 of the sorted ids, first id, last id)``."""
    cur = await conn.execute(WORK_ITEM_ROLLBACK_FENCE, params)
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


# ------------------------------------------------------------------------------------------------
# Projection of legacy outcome receipts (rows locked by the caller's transaction)
# ------------------------------------------------------------------------------------------------

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


async def work_item_legacy_projection_get(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, WORK_ITEM_LEGACY_PROJECTION_GET, params)


async def work_item_legacy_projection_lock(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, WORK_ITEM_LEGACY_PROJECTION_LOCK, params)


async def work_item_legacy_reconcile(conn: Conn, values: dict[str, Any]) -> None:
    await conn.execute(WORK_ITEM_LEGACY_RECONCILE, values)


async def work_item_legacy_quarantine(conn: Conn, values: dict[str, Any]) -> None:
    await conn.execute(WORK_ITEM_LEGACY_QUARANTINE, values)


async def work_item_legacy_mirror_insert(conn: Conn, values: dict[str, Any]) -> bool:
    """The historical mirror row; False when one exists already (a conflict for the caller)."""
    cur = await conn.execute(WORK_ITEM_LEGACY_MIRROR_INSERT, values)
    return await cur.fetchone() is not None


# ------------------------------------------------------------------------------------------------
# Creation (the materializer is the sole writer: the routing loop, the backfill and the cutover's
# backfill through connector.common.materialization)
# ------------------------------------------------------------------------------------------------

WORK_ITEM_INSERT_COLUMNS = (
    ("event_id", "int8"), ("installed_pack_id", "int8"), ("generation", "int4"), ("work_type", "text"),
    ("queue_class", "text"), ("state", "text"), ("priority", "int2"), ("priority_head_s", "float8"),
    ("max_attempts", "int4"), ("delivery_seq", "int8"), ("source_lane_key", "text"),
    ("target_mutation_lane_key", "text"), ("dead_blocks_lane", "bool"), ("traceparent", "text"),
    ("rate_key", "text"), ("concurrency_key", "text"), ("debounce_key", "text"), ("circuit_key", "text"),
)  # fmt: skip

# Rows go in (delivery_seq, fan-out order), so work_id order agrees with lane order. ``run_after``
# is the due time: now, or a delay's instant (``not_before``, NULL without one; ``greatest`` ignores
# NULL; a past one is due now). Priority is not in it: the claim orders by ``schema.claim_rank``
# (due time less ``priority_head_s``, docs/adr/014-priorities.md), so it survives retries and delays.
_INSERT_INPUT = (*WORK_ITEM_INSERT_COLUMNS, ("not_before", "timestamptz"))
WORK_ITEM_INSERT_BATCH = f"""
INSERT INTO connector_work_item ({", ".join(c for c, _ in WORK_ITEM_INSERT_COLUMNS)}, run_after)
SELECT {", ".join(c for c, _ in WORK_ITEM_INSERT_COLUMNS)}, greatest(now(), not_before)
FROM unnest({", ".join(f"%({c})b::{t}[]" for c, t in _INSERT_INPUT)})
  WITH ORDINALITY AS w({", ".join(c for c, _ in _INSERT_INPUT)}, ord)
ORDER BY ord
ON CONFLICT (event_id, work_type) DO NOTHING
"""


@dataclass(frozen=True, slots=True)
class WorkRow:
    """A WorkItem to create."""

    event_id: int
    installed_pack_id: int
    generation: int
    work_type: str
    queue_class: str
    priority: int
    max_attempts: int
    delivery_seq: int
    source_lane_key: str | None
    target_lane_key: str | None
    dead_blocks_lane: bool
    #: Head start in the claim order, seconds (``packs.priority_heads``; docs/adr/014-priorities.md).
    priority_head_s: float = 0.0
    #: W3C traceparent the attempts' spans continue (docs/tracing.md).
    traceparent: str | None = None
    #: Not runnable before this instant (a work type's delay, docs/packs.md); None: at once.
    run_after: datetime | None = None
    #: Rate-limit key and limit (docs/adr/011-rate-limits.md); its row is declared in the same
    #: transaction (``flow.rate_limit_declare``).
    rate: RateKey | None = None
    #: Concurrency key and limit; its row is declared in the same transaction
    #: (``flow.concurrency_declare``).
    slot: SlotKey | None = None
    #: Debounce key and window; its row is declared and locked in the same transaction, before the
    #: insert (``debounce.debounce_declare``), which also gives ``run_after`` (docs/packs.md#debounce).
    debounce: DebounceKey | None = None
    #: Circuit (the handler target) and breaker policy (docs/adr/013-circuit-breakers.md); its row
    #: is declared in the same transaction (``circuits.circuit_declare``).
    circuit: CircuitKey | None = None

    @property
    def lanes(self) -> list[Lane]:
        return lanes_of(self.installed_pack_id, self.source_lane_key, self.target_lane_key)


async def work_item_insert_batch(conn: Conn, rows: Sequence[WorkRow]) -> int:
    """Insert WorkItems in ``rows`` order (conflicts on ``(event_id, work_type)`` ignored); lane
    members go in ``blocked`` — the lane settle that follows promotes the runnable ones."""
    if not rows:
        return 0
    values = [
        (
            w.event_id,
            w.installed_pack_id,
            w.generation,
            w.work_type,
            w.queue_class,
            "blocked" if w.source_lane_key is not None or w.target_lane_key is not None else "pending",
            w.priority,
            float(w.priority_head_s),
            w.max_attempts,
            w.delivery_seq,
            w.source_lane_key,
            w.target_lane_key,
            w.dead_blocks_lane,
            w.traceparent,
            w.rate.rate_key if w.rate is not None else None,
            w.slot.concurrency_key if w.slot is not None else None,
            w.debounce.debounce_key if w.debounce is not None else None,
            w.circuit.circuit_key if w.circuit is not None else None,
            w.run_after,
        )
        for w in rows
    ]
    cols = unnest_columns(_INSERT_INPUT, values)
    cur = await conn.execute(WORK_ITEM_INSERT_BATCH, cols, prepare=True)
    return cur.rowcount
