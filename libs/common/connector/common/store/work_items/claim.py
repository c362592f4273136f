"""The claim statements on ``connector_work_item`` (ADR 005, ADR 011, ADR 013): the plain, rate and
flow claims built from shared fragments (the authority rows, what a claim takes, the held-back
count rows, the circuit gate, the rate spend), the ready groups read of discovery, and the claimed
batch's event facts and payloads (``work_item_event_batch``: ``connector_event`` +
``connector_ingress_receipt`` by primary key)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from psycopg import AsyncConnection

from connector.common.store.flow import rate_key_lock
from connector.common.store.tokens import token_next
from connector.common.store.vocabulary import EVENT_FACT_COLUMNS, NOW_RANK, PARKED, claim_rank

Conn = AsyncConnection[Any]

# Authority rows admitting WorkItem claims, locked FOR SHARE for the statement's transaction, in
# (pack, generation) order: a pause locks a pack's rows in the same order (store.pauses), so the
# two never wait on each other crosswise. ``paused_queue_classes`` is what the claim skips.
AUTHORITY_ROWS = """
  SELECT a.installed_pack_id, a.generation, a.paused_queue_classes FROM connector_claim_authority a
  WHERE a.installed_pack_id = ANY(%(packs)s::bigint[])
    AND a.claim_path = 'work_item' AND a.phase = 'work_item_active' AND a.cutover_receipt_id IS NOT NULL
  ORDER BY a.installed_pack_id, a.generation
  FOR SHARE
"""

# The claim statements' authority rows: with ``process`` (an executor's process id; NULL = a tool or
# a statement-level test) a generation is admitted only while the process's registry row names its
# admitting receipt: the process has observed that exact receipt (gate 3), and a process that has
# not (started during a rollback, or dropped it when admission was disabled) holds off that
# generation; rollback counts the processes naming it as claim-capable (gate 4, docs/cutover.md).
# One primary-key probe per authority row. (The reclaim keeps ``AUTHORITY_ROWS``: it runs nothing.)
CLAIM_AUTHORITY_ROWS = AUTHORITY_ROWS.replace(
    "\n  ORDER BY",
    """
    AND (%(process)s::text IS NULL OR EXISTS (SELECT 1 FROM connector_process p
         WHERE p.process_id = %(process)s::text AND a.cutover_receipt_id = ANY (p.admitted_receipt_ids)))
  ORDER BY""",
).replace("FOR SHARE", "FOR SHARE OF a")


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
    #: Its due time (``run_after``) and its receipt's acceptance (``accepted_at``, NULL when not
    #: known), Unix seconds on the database clock: the figures' scheduling delay and receipt ->
    #: executed latency (docs/metrics.md "Figures without Prometheus").
    due_s: float
    accepted_s: float | None


CLAIM_COLUMNS = ClaimedRow._fields
#: Returned columns that are expressions rather than a column of the same name.
_CLAIM_EXPRESSIONS = {
    "due_s": "extract(epoch FROM w.run_after)::float8 AS due_s",
    "accepted_s": "extract(epoch FROM w.accepted_at)::float8 AS accepted_s",
}

#: What every claim statement writes on a row it takes (the lease, the next fencing token, one
#: attempt) and returns of it (``ClaimedRow``).
_TAKE = f"""SET state = 'processing', lease_token = {token_next("w.lease_token")}, lease_owner = %(owner)s,
      lease_until = clock_timestamp() + make_interval(secs => %(lease_s)s::float8),
      attempts = w.attempts + 1, started_at = clock_timestamp(), updated_at = clock_timestamp()"""
_TAKEN = ", ".join(_CLAIM_EXPRESSIONS.get(c, "w." + c) for c in CLAIM_COLUMNS)
#: The same, for the finalize's lane handoff (``work_items.finalize``): a claim by another statement.
TAKE, TAKEN = _TAKE, _TAKEN
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

#: The claim levels (the executor's ``claim_levels``): the statement a candidate needs. ``PLAIN``
#: no flow key; ``CIRCUIT`` a circuit breaker's key only (the circuit statement: closed circuits
#: under ``KEY SHARE``, docs/adr/013-circuit-breakers.md "Closed circuits on the plain path");
#: ``RATE`` rate-limit keys only; ``FLOW`` anything else (concurrency, debounce, a rate key with a
#: circuit, or a circuit the circuit statement could not admit).
PLAIN, CIRCUIT, RATE, FLOW = 0, 1, 2, 3
#: The level a candidate needs, as SQL over ``w``.
CLAIM_NEED = (
    "(CASE WHEN w.concurrency_key IS NOT NULL OR w.debounce_key IS NOT NULL"
    f" OR (w.rate_key IS NOT NULL AND w.circuit_key IS NOT NULL) THEN {FLOW}"
    f" WHEN w.rate_key IS NOT NULL THEN {RATE} WHEN w.circuit_key IS NOT NULL THEN {CIRCUIT}"
    f" ELSE {PLAIN} END)"
)

#: The plain claim: the statement of a batch whose groups carry no flow keys (an unlimited pack pays
#: nothing for the flow CTEs). It never claims a keyed candidate: it locks it for an instant and
#: leaves it untouched, and every returned row carries, after the ``CLAIM_COLUMNS``, the pack, the
#: queue class and the claim level it needs (``CLAIM_NEED``) of each keyed candidate it left (three
#: arrays, NULL when none; computed once per statement); the claimer sends those groups' next
#: batches through the circuit, the rate or the flow statement. So a
#: limit holds whichever statement a process sends (a process that has not yet seen a key is safe).
#: The update is the top-level statement, as the claim was before flow limits: returning its rows
#: through a CTE and a per-group count branch (``UNION ALL``) cost ~0.4 ms per claim of 256
#: (docs/benchmarks.md, "Session 6"). A claim that updates nothing returns nothing, so it cannot tell
#: whether it left keyed candidates: the claimer learns that from the ready-groups read, whose rows
#: say whether a group's first ready row is keyed (``WORK_ITEM_READY_GROUPS``).
WORK_ITEM_CLAIM_PLAIN_BATCH = f"""
WITH auth AS MATERIALIZED ({CLAIM_AUTHORITY_ROWS}
), cand AS ({_candidates("c.keyed, c.need", f"{FLOW_KEYED} AS keyed, {CLAIM_NEED} AS need")}
)
UPDATE connector_work_item w
{_TAKE}
WHERE w.work_id = ANY (ARRAY(SELECT c.work_id FROM cand c WHERE NOT c.keyed))
RETURNING {_TAKEN},
  (SELECT array_agg(c.pack) FROM cand c WHERE c.keyed), (SELECT array_agg(c.qc) FROM cand c WHERE c.keyed),
  (SELECT array_agg(c.need) FROM cand c WHERE c.keyed)
"""

#: The circuit statement: the plain claim for groups whose keyed candidates carry a circuit
#: breaker's key and nothing else (``CLAIM_NEED`` = ``CIRCUIT``), so a closed breaker costs a branch
#: of the plain statement instead of the flow statement (docs/adr/013-circuit-breakers.md, "Closed
#: circuits on the plain path"). Each distinct circuit of the window is probed by primary key and
#: locked ``FOR KEY SHARE SKIP LOCKED`` only if its newest version is closed (a lock re-reads a row
#: changed since the statement's snapshot, READ COMMITTED): the lock the flow statement takes on a
#: closed circuit, so an open (``FOR UPDATE``) still waits for this claim and every later claim sees
#: it. Their candidates are claimed. A circuit that is not closed (open, half-open, or held ``FOR
#: UPDATE`` by an opener or a prober at that instant) leaves its candidates untouched, reported at
#: level ``FLOW`` (deferral and probes are the flow statement's); candidates with other keys are left
#: and reported as the plain statement does. It returns what the plain statement returns.
WORK_ITEM_CLAIM_CIRCUIT_BATCH = f"""
WITH auth AS MATERIALIZED ({CLAIM_AUTHORITY_ROWS}
), cand AS ({_candidates("c.need, c.circuit_key", f"{CLAIM_NEED} AS need, w.circuit_key")}
), circ AS (
  SELECT k.installed_pack_id AS pack, k.circuit_key
  FROM (SELECT DISTINCT c.pack, c.circuit_key FROM cand c WHERE c.need = {CIRCUIT}) d
  CROSS JOIN LATERAL (
    SELECT k.installed_pack_id, k.circuit_key FROM connector_circuit k
    WHERE k.installed_pack_id = d.pack AND k.circuit_key = d.circuit_key AND k.state = 'closed'
    FOR KEY SHARE SKIP LOCKED) k
), lft AS (
  SELECT c.pack, c.qc, CASE WHEN c.need = {CIRCUIT} THEN {FLOW} ELSE c.need END AS need FROM cand c
  WHERE c.need > {CIRCUIT} OR (c.need = {CIRCUIT} AND NOT EXISTS (
    SELECT 1 FROM circ k WHERE k.pack = c.pack AND k.circuit_key = c.circuit_key))
)
UPDATE connector_work_item w
{_TAKE}
WHERE w.work_id = ANY (ARRAY(
  SELECT c.work_id FROM cand c WHERE c.need = {PLAIN}
  UNION ALL
  SELECT c.work_id FROM cand c JOIN circ k ON k.pack = c.pack AND k.circuit_key = c.circuit_key
  WHERE c.need = {CIRCUIT}))
RETURNING {_TAKEN},
  (SELECT array_agg(l.pack) FROM lft l), (SELECT array_agg(l.qc) FROM lft l),
  (SELECT array_agg(l.need) FROM lft l)
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
WITH auth AS MATERIALIZED ({CLAIM_AUTHORITY_ROWS}
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
WITH auth AS MATERIALIZED ({CLAIM_AUTHORITY_ROWS}
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
# through the statement of its ``need`` (``CLAIM_NEED``: the circuit, rate or flow statement; the
# plain and circuit statements cannot report keyed candidates when they claim nothing). A head
# whose only key is a circuit that is not closed (one primary-key probe) needs the flow statement:
# the circuit statement would leave it, and only the flow statement defers it or admits its probes.
WORK_ITEM_READY_GROUPS = f"""
WITH RECURSIVE g AS (
  (SELECT w.installed_pack_id AS pack, w.queue_class AS qc, w.run_after, {FLOW_KEYED} AS keyed,
         {CLAIM_NEED} AS need, w.circuit_key
   FROM connector_work_item w WHERE w.state IN ('pending', 'retry')
   ORDER BY w.installed_pack_id, w.queue_class, {claim_rank("w")}, w.work_id LIMIT 1)
  UNION ALL
  SELECT n.pack, n.qc, n.run_after, n.keyed, n.need, n.circuit_key FROM g CROSS JOIN LATERAL (
    SELECT w.installed_pack_id AS pack, w.queue_class AS qc, w.run_after, {FLOW_KEYED} AS keyed,
         {CLAIM_NEED} AS need, w.circuit_key
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
       g.keyed,
       CASE WHEN g.need = {CIRCUIT} AND NOT EXISTS (
              SELECT 1 FROM connector_circuit k
              WHERE k.installed_pack_id = g.pack AND k.circuit_key = g.circuit_key AND k.state = 'closed'
              OFFSET 0)
            THEN {FLOW} ELSE g.need END
FROM g
"""

# A ``work_item_event_batch`` row: the event fact columns a handler sees (``handlers.EventFact``, in
# vocabulary.EVENT_FACT_COLUMNS' order), then these positions.
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
    process: str | None = None,
) -> list[tuple[Any, ...]]:
    """Send a claim statement (prepared) with its parameters; its rows as they come. ``process``: the
    claiming executor's process id, whose admitted receipts gate the generations
    (``CLAIM_AUTHORITY_ROWS``)."""
    cur = await conn.execute(
        statement,
        {
            "packs": list(packs),
            "queue_classes": list(queue_classes),
            "limits": list(limits),
            "owner": owner,
            "lease_s": float(lease_s),
            "process": process,
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
    process: str | None = None,
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
        await _claim_rows(conn, WORK_ITEM_CLAIM_BATCH, packs, queue_classes, limits, owner, lease_s, process)
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
    process: str | None = None,
) -> list[tuple[Any, ...]]:
    """``work_item_claim_batch`` for groups whose keys are rate-limit keys only
    (``WORK_ITEM_CLAIM_RATE_BATCH``): the candidates held back for their limit are added to
    ``held_back`` (and ``due_in``) as there; those with another flow key, which it leaves untouched,
    to ``keyed`` per ``(pack, queue class)`` (those groups belong to the flow statement)."""
    claimed, counts = _counts_apart(
        await _claim_rows(
            conn, WORK_ITEM_CLAIM_RATE_BATCH, packs, queue_classes, limits, owner, lease_s, process
        )
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
    needs: dict[tuple[int, str], int] | None = None,
    process: str | None = None,
) -> list[tuple[Any, ...]]:
    """``work_item_claim_batch`` for groups without flow keys (``WORK_ITEM_CLAIM_PLAIN_BATCH``):
    claims the unkeyed due items only; the count of keyed candidates it left, per ``(pack, queue
    class)``, is added to ``keyed`` (those groups belong to a statement of a higher level), and the
    highest level they need (``CLAIM_NEED``: ``CIRCUIT``, ``RATE`` or ``FLOW``) to ``needs``. When it
    claims nothing it cannot tell (``keyed`` stays as it was). The rows carry three more columns after
    ``CLAIM_COLUMNS``."""
    return await _claim_left(
        conn, WORK_ITEM_CLAIM_PLAIN_BATCH, packs, queue_classes, limits, owner, lease_s, process, keyed, needs
    )


async def work_item_claim_circuit_batch(
    conn: Conn,
    packs: Sequence[int],
    queue_classes: Sequence[str],
    limits: Sequence[int],
    *,
    owner: str,
    lease_s: float,
    keyed: dict[tuple[int, str], int],
    needs: dict[tuple[int, str], int] | None = None,
    process: str | None = None,
) -> list[tuple[Any, ...]]:
    """``work_item_claim_plain_batch`` that also claims the candidates of closed circuit breakers
    (``WORK_ITEM_CLAIM_CIRCUIT_BATCH``); those of a circuit that is not closed are left and reported
    at level ``FLOW``. Same rows as the plain claim."""
    return await _claim_left(
        conn,
        WORK_ITEM_CLAIM_CIRCUIT_BATCH,
        packs,
        queue_classes,
        limits,
        owner,
        lease_s,
        process,
        keyed,
        needs,
    )


async def _claim_left(
    conn: Conn,
    statement: str,
    packs: Sequence[int],
    queue_classes: Sequence[str],
    limits: Sequence[int],
    owner: str,
    lease_s: float,
    process: str | None,
    keyed: dict[tuple[int, str], int],
    needs: dict[tuple[int, str], int] | None,
) -> list[tuple[Any, ...]]:
    """The plain or circuit claim's rows; what it left (its rows' last three columns) counted into
    ``keyed`` and ``needs``."""
    rows = await _claim_rows(conn, statement, packs, queue_classes, limits, owner, lease_s, process)
    if rows and rows[0][-3] is not None:
        for pack, qc, need in zip(rows[0][-3], rows[0][-2], rows[0][-1], strict=True):
            keyed[pack, qc] = keyed.get((pack, qc), 0) + 1
            if needs is not None and need > needs.get((pack, qc), PLAIN):
                needs[pack, qc] = need
    return rows


class ReadyGroup(NamedTuple):
    pack: int
    queue_class: str
    due_in: float  # seconds until the group's first row is due (<= 0: due)
    paused: bool
    keyed: bool = False  # the group's first-ranked ready row carries a flow key (``FLOW_KEYED``)
    need: int = PLAIN  # ... and needs the statement of this level (``CLAIM_NEED``)


async def work_item_ready_groups(conn: Conn) -> list[ReadyGroup]:
    cur = await conn.execute(WORK_ITEM_READY_GROUPS, prepare=True)
    return [
        ReadyGroup(int(r[0]), str(r[1]), float(r[2]), bool(r[3]), bool(r[4]), int(r[5]))
        for r in await cur.fetchall()
    ]


# ------------------------------------------------------------------------------------------------
# Handler context reads
# ------------------------------------------------------------------------------------------------


async def work_item_event_batch(conn: Conn, event_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    cur = await conn.execute(WORK_ITEM_EVENT_BATCH, {"ids": list(event_ids)}, prepare=True)
    return await cur.fetchall()
