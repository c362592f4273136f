"""Every statement on ``connector_circuit``: circuit breakers per handler target
(docs/adr/013-circuit-breakers.md).

The claim statement (``work_items.claim.WORK_ITEM_CLAIM_BATCH``) is the gate: it admits a circuit's items
while the circuit is closed, and at most ``half_open_probes`` probes at once while it is half-open
(it records them in ``probe_ids``). Here are the other statements: the materializer's declaration
of the circuits of the WorkItems it inserts (same transaction, so a breaker's WorkItem is never
claimable before its circuit row exists), the outcome feed of the finalize and reclaim
transactions, the operator's open / close, and the reads of the sampler, the admin API and the
trace view.

**Locks.** The claim locks a closed (or open, not yet probing) circuit ``FOR KEY SHARE SKIP
LOCKED``: claims never conflict with each other on it, nor with the feed's counter updates (``FOR
NO KEY UPDATE``), so a closed breaker costs claims and finalizes no waiting. Every change that
*closes the gate* — a closed circuit opening — takes ``FOR UPDATE``, which conflicts with ``KEY
SHARE``: it waits for the claims in flight, and a claim that locks the row after it re-reads its
newest version (READ COMMITTED), so **no claim that commits after the open commits admits an
item**. Probes are admitted under ``FOR UPDATE SKIP LOCKED`` (the claim writes ``probe_ids``), so
two processes never admit more than ``half_open_probes`` together. Feeders lock their rows in
(pack, key) order and only the rows they change (a success of a closed circuit with no failure in
a row and no ratio window changes nothing, and locks nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.packs import pack_filter
from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]

#: Outcome codes the feed takes (the executor classifies; docs/adr/013-circuit-breakers.md).
SUCCESS = "s"
FAILURE = "f"
NEUTRAL = "n"

#: States (``connector_circuit.state``) and the stats' ``half_open`` view of an expired open.
CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)


@dataclass(frozen=True, slots=True, order=True)
class CircuitKey:
    """A circuit as a WorkItem declares it (the latest declaration sets the policy)."""

    installed_pack_id: int
    circuit_key: str
    work_type: str
    consecutive_failures: int
    failure_ratio: float | None
    window_s: float
    min_outcomes: int
    open_s: float
    half_open_probes: int


# Keys sorted by (pack, key). New circuits start closed; a changed policy is re-declared, keeping
# the state and counts. Only rows whose policy differs are written (an unchanged circuit is not
# locked).
CIRCUIT_DECLARE = """
WITH d AS (
  SELECT * FROM unnest(%(packs)s::bigint[], %(keys)s::text[], %(work_types)s::text[], %(cons)s::int[],
                       %(ratios)s::float8[], %(windows)s::float8[], %(mins)s::int[], %(opens)s::float8[],
                       %(probes)s::int[])
    AS d(pack, circuit_key, work_type, consecutive_failures, failure_ratio, window_s, min_outcomes,
         open_s, half_open_probes)
), ins AS (
  INSERT INTO connector_circuit (installed_pack_id, circuit_key, work_type, consecutive_failures,
                                 failure_ratio, window_s, min_outcomes, open_s, half_open_probes)
  SELECT pack, circuit_key, work_type, consecutive_failures, failure_ratio, window_s, min_outcomes,
         open_s, half_open_probes
  FROM d ORDER BY pack, circuit_key
  ON CONFLICT (installed_pack_id, circuit_key) DO NOTHING
  RETURNING 1
)
UPDATE connector_circuit k
SET work_type = d.work_type, consecutive_failures = d.consecutive_failures,
    failure_ratio = d.failure_ratio, window_s = d.window_s, min_outcomes = d.min_outcomes,
    open_s = d.open_s, half_open_probes = d.half_open_probes
FROM d
WHERE k.installed_pack_id = d.pack AND k.circuit_key = d.circuit_key
  AND (k.work_type, k.consecutive_failures, k.failure_ratio, k.window_s, k.min_outcomes, k.open_s,
       k.half_open_probes)
      IS DISTINCT FROM (d.work_type, d.consecutive_failures, d.failure_ratio, d.window_s,
                        d.min_outcomes, d.open_s, d.half_open_probes)
"""


async def circuit_declare(conn: Conn, keys: Sequence[CircuitKey]) -> None:
    """Create (or re-declare) the circuits of WorkItems being inserted, in the caller's transaction."""
    if not keys:
        return
    uniq = sorted({(k.installed_pack_id, k.circuit_key): k for k in keys}.values())
    await conn.execute(
        CIRCUIT_DECLARE,
        {
            "packs": [k.installed_pack_id for k in uniq],
            "keys": [k.circuit_key for k in uniq],
            "work_types": [k.work_type for k in uniq],
            "cons": [k.consecutive_failures for k in uniq],
            "ratios": [k.failure_ratio for k in uniq],
            "windows": [float(k.window_s) for k in uniq],
            "mins": [k.min_outcomes for k in uniq],
            "opens": [float(k.open_s) for k in uniq],
            "probes": [k.half_open_probes for k in uniq],
        },
        prepare=True,
    )


# The outcome feed, one statement per flush (``circuit_record``). Per circuit of the flush, the
# executor gives its outcomes in finish order as runs: ``lead`` failures before the first success
# (all of them when there is none), the longest run ``inner`` between two successes, ``trail``
# failures after the last success, and the counts. Ids: every WorkItem of the flush that left
# ``processing`` (``done``) and those that succeeded / failed — a half-open circuit's probes are
# looked up in them.
#
# * open / half-open: the counts stay those that opened it (what ``circuit list`` shows: "5 in a
#   row" of the failures that opened it); a succeeded probe closes it and they start again at 0.
# * closed: ``consecutive`` becomes the failures in a row at the end of the flush — or, when a run
#   of the flush reached ``consecutive_failures``, that run (so the RETURNING sees it); the ratio
#   window counts the outcomes (a new window starts once ``window_s`` passed). It does not open
#   here: ``trip`` says it must, and ``CIRCUIT_OPEN`` does it under ``FOR UPDATE``.
# * half-open: a failed probe opens it again for ``open_s``; else a succeeded probe closes it; the
#   ids that left processing without a verdict (released, reclaimed) give their probe slot back.
# * open: outcomes of items claimed before it opened change nothing.
#
# Only rows that change are locked (in (pack, key) order): a closed circuit with no failures in a
# row, no ratio window and only successes in the flush is left alone.
CIRCUIT_RECORD = """
WITH o AS (
  SELECT * FROM unnest(%(packs)s::bigint[], %(keys)s::text[], %(lead)s::int[], %(inner)s::int[],
                       %(trail)s::int[], %(succ)s::int[], %(fail)s::int[])
    AS o(pack, circuit_key, lead, inner_run, trail, succ, fail)
), l AS (
  SELECT k.installed_pack_id, k.circuit_key, k.state, k.probe_ids, k.window_start, k.window_s
  FROM connector_circuit k
  JOIN o ON o.pack = k.installed_pack_id AND o.circuit_key = k.circuit_key
  WHERE (k.state <> 'closed' OR o.fail > 0 OR k.consecutive > 0 OR k.failure_ratio IS NOT NULL)
  ORDER BY k.installed_pack_id, k.circuit_key
  FOR NO KEY UPDATE OF k
), x AS (  -- from the locked (newest) versions: nobody changes them before the update below
  SELECT l.installed_pack_id, l.circuit_key, o.lead, o.inner_run, o.trail, o.succ, o.fail,
         l.state = 'half_open' AND l.probe_ids && %(failed)s::bigint[] AS probe_failed,
         l.state = 'half_open' AND l.probe_ids && %(succeeded)s::bigint[] AS probe_ok,
         clock_timestamp() >= l.window_start + make_interval(secs => l.window_s) AS new_window
  FROM l JOIN o ON o.pack = l.installed_pack_id AND o.circuit_key = l.circuit_key
)
UPDATE connector_circuit k SET
  consecutive = CASE
    WHEN x.probe_ok THEN 0
    WHEN k.state <> 'closed' THEN k.consecutive
    WHEN k.consecutive_failures > 0
         AND greatest(k.consecutive + x.lead, x.inner_run) >= k.consecutive_failures
      THEN greatest(k.consecutive + x.lead, x.inner_run, x.trail)
    WHEN x.succ > 0 THEN x.trail
    ELSE k.consecutive + x.fail END,
  window_start = CASE WHEN x.probe_ok OR (k.state = 'closed' AND x.new_window) THEN clock_timestamp()
    ELSE k.window_start END,
  window_outcomes = CASE WHEN x.probe_ok THEN 0 WHEN k.state <> 'closed' THEN k.window_outcomes
    WHEN x.new_window THEN x.succ + x.fail ELSE k.window_outcomes + x.succ + x.fail END,
  window_failures = CASE WHEN x.probe_ok THEN 0 WHEN k.state <> 'closed' THEN k.window_failures
    WHEN x.new_window THEN x.fail ELSE k.window_failures + x.fail END,
  state = CASE WHEN x.probe_failed THEN 'open' WHEN x.probe_ok THEN 'closed' ELSE k.state END,
  open_until = CASE WHEN x.probe_failed THEN clock_timestamp() + make_interval(secs => k.open_s)
    WHEN x.probe_ok THEN NULL ELSE k.open_until END,
  probe_ids = CASE WHEN x.probe_failed OR x.probe_ok THEN '{}'::bigint[]
    ELSE ARRAY(SELECT unnest(k.probe_ids) EXCEPT SELECT unnest(%(done)s::bigint[])) END,
  reason = CASE WHEN x.probe_failed THEN 'probe_failed' WHEN x.probe_ok THEN 'probe_succeeded'
    ELSE k.reason END,
  changed_at = CASE WHEN x.probe_failed OR x.probe_ok THEN clock_timestamp() ELSE k.changed_at END,
  opened_count = k.opened_count + CASE WHEN x.probe_failed THEN 1 ELSE 0 END
FROM x
WHERE k.installed_pack_id = ANY (%(packs)s::bigint[]) AND k.circuit_key = ANY (%(keys)s::text[])
  AND k.installed_pack_id = x.installed_pack_id AND k.circuit_key = x.circuit_key
RETURNING k.installed_pack_id, k.circuit_key, k.state,
  (x.probe_failed OR x.probe_ok) AS changed,
  k.state = 'closed' AND NOT k.forced AND (
    (k.consecutive_failures > 0 AND k.consecutive >= k.consecutive_failures)
    OR (k.failure_ratio IS NOT NULL AND k.window_outcomes >= k.min_outcomes
        AND k.window_failures >= k.failure_ratio * k.window_outcomes)) AS trip
"""

# Open the circuits the feed found tripped: ``FOR UPDATE`` (see the module docstring), in key order,
# re-checked on the newest version (still closed). The counts that tripped it are kept while it is
# not closed (the feed leaves them alone) and start again when it closes.
CIRCUIT_OPEN = """
WITH l AS (
  SELECT k.installed_pack_id, k.circuit_key
  FROM unnest(%(packs)s::bigint[], %(keys)s::text[]) AS t(pack, circuit_key)
  JOIN connector_circuit k ON k.installed_pack_id = t.pack AND k.circuit_key = t.circuit_key
  ORDER BY k.installed_pack_id, k.circuit_key
  FOR UPDATE OF k
)
UPDATE connector_circuit k SET
  state = 'open', open_until = clock_timestamp() + make_interval(secs => k.open_s),
  reason = CASE WHEN k.consecutive_failures > 0 AND k.consecutive >= k.consecutive_failures
    THEN 'consecutive_failures' ELSE 'failure_ratio' END,
  changed_at = clock_timestamp(), opened_count = k.opened_count + 1, probe_ids = '{}'
FROM l
WHERE k.installed_pack_id = ANY (%(packs)s::bigint[]) AND k.circuit_key = ANY (%(keys)s::text[])
  AND k.installed_pack_id = l.installed_pack_id AND k.circuit_key = l.circuit_key AND k.state = 'closed'
RETURNING k.installed_pack_id, k.circuit_key, k.reason
"""


@dataclass(frozen=True, slots=True)
class Transition:
    installed_pack_id: int
    circuit_key: str
    state: str  # the new state
    reason: str


def outcome_runs(codes: Sequence[str]) -> tuple[int, int, int, int, int]:
    """``(lead, inner, trail, successes, failures)`` of one circuit's outcome codes in finish order
    (neutral ones skipped: they neither break nor extend a run)."""
    lead = inner = run = succ = fail = 0
    seen_success = False
    for c in codes:
        if c == FAILURE:
            fail += 1
            run += 1
        elif c == SUCCESS:
            if seen_success:
                inner = max(inner, run)
            else:
                lead = run
            seen_success = True
            succ += 1
            run = 0
    if not seen_success:
        return run, 0, 0, 0, fail
    return lead, inner, run, succ, fail


async def circuit_record(conn: Conn, outcomes: Sequence[tuple[int, str, int, str]]) -> list[Transition]:
    """Feed the outcomes of WorkItems that just left ``processing`` (caller's transaction, after
    their fenced updates): ``(pack, circuit key, work id, code)`` in finish order, codes
    ``SUCCESS`` / ``FAILURE`` / ``NEUTRAL``. Returns the state changes it made."""
    if not outcomes:
        return []
    by_key: dict[tuple[int, str], list[str]] = {}
    done: list[int] = []
    succeeded: list[int] = []
    failed: list[int] = []
    for pack, key, wid, code in outcomes:
        by_key.setdefault((pack, key), []).append(code)
        done.append(wid)
        if code == SUCCESS:
            succeeded.append(wid)
        elif code == FAILURE:
            failed.append(wid)
    keys = sorted(by_key)
    runs = [outcome_runs(by_key[k]) for k in keys]
    cur = await conn.execute(
        CIRCUIT_RECORD,
        {
            "packs": [k[0] for k in keys],
            "keys": [k[1] for k in keys],
            "lead": [r[0] for r in runs],
            "inner": [r[1] for r in runs],
            "trail": [r[2] for r in runs],
            "succ": [r[3] for r in runs],
            "fail": [r[4] for r in runs],
            "done": done,
            "succeeded": succeeded,
            "failed": failed,
        },
        prepare=True,
    )
    out: list[Transition] = []
    trips: list[tuple[int, str]] = []
    for pack, key, state, changed, trip in await cur.fetchall():
        if changed:
            reason = "probe_failed" if state == OPEN else "probe_succeeded"
            out.append(Transition(int(pack), str(key), str(state), reason))
        if trip:
            trips.append((int(pack), str(key)))
    if trips:
        cur = await conn.execute(
            CIRCUIT_OPEN, {"packs": [t[0] for t in trips], "keys": [t[1] for t in trips]}, prepare=True
        )
        out.extend(Transition(int(r[0]), str(r[1]), OPEN, str(r[2])) for r in await cur.fetchall())
    return out


# --------------------------------------------------------------------------------------------------
# The operator (admin API: OpenCircuit / CloseCircuit) and the reads
# --------------------------------------------------------------------------------------------------

CIRCUIT_COLUMNS = """
  k.installed_pack_id, k.circuit_key, k.work_type, k.state, k.forced, k.open_until, k.reason,
  k.changed_at, k.opened_count, k.consecutive, k.window_outcomes, k.window_failures,
  cardinality(k.probe_ids) AS probes_in_flight, k.consecutive_failures, k.failure_ratio, k.window_s,
  k.min_outcomes, k.open_s, k.half_open_probes, k.actor, k.note,
  CASE WHEN k.state = 'open' AND NOT k.forced AND k.open_until <= now() THEN 'half_open' ELSE k.state END
    AS effective_state,
  greatest(0, extract(epoch FROM k.open_until - now()))::float8 AS open_for_s
"""

# A forced open (no ``open_until``: it stays open until an operator closes it) or a close (counts
# start again, probes forgotten: their outcomes change nothing), ``FOR UPDATE`` like every change
# that can close the gate.
CIRCUIT_SET = f"""
WITH l AS (
  SELECT k.installed_pack_id, k.circuit_key FROM connector_circuit k
  WHERE k.installed_pack_id = %(pack)s AND k.circuit_key = %(key)s
  FOR UPDATE
)
UPDATE connector_circuit k SET
  state = CASE WHEN %(open)s THEN 'open' ELSE 'closed' END, forced = %(open)s, open_until = NULL,
  reason = CASE WHEN %(open)s THEN 'manual_open' ELSE 'manual_close' END,
  changed_at = clock_timestamp(),
  opened_count = k.opened_count + CASE WHEN %(open)s AND k.state <> 'open' THEN 1 ELSE 0 END,
  consecutive = 0, window_start = clock_timestamp(), window_outcomes = 0, window_failures = 0,
  probe_ids = '{{}}', actor = %(actor)s, note = %(note)s
FROM l
WHERE k.installed_pack_id = l.installed_pack_id AND k.circuit_key = l.circuit_key
RETURNING {CIRCUIT_COLUMNS}
"""

CIRCUIT_GET = f"""
SELECT {CIRCUIT_COLUMNS} FROM connector_circuit k
WHERE k.installed_pack_id = %(pack)s AND k.circuit_key = %(key)s
"""


async def circuit_set(
    conn: Conn, pack: int, key: str, *, open_: bool, actor: str | None = None, note: str | None = None
) -> dict[str, Any] | None:
    """Force ``(pack, key)`` open (until closed by an operator) or close it, recording who and why;
    ``None``: no such circuit."""
    return await fetch_dict(
        conn, CIRCUIT_SET, {"pack": pack, "key": key, "open": open_, "actor": actor, "note": note}
    )


async def circuit_get(conn: Conn, pack: int, key: str) -> dict[str, Any] | None:
    return await fetch_dict(conn, CIRCUIT_GET, {"pack": pack, "key": key})


# Per circuit of a pack (or of every pack), bounded, not-closed ones first (the partial index
# ``ix_connector_circuit_not_closed``), each in (pack, key) order: its state and its WorkItems
# waiting and in flight (index reads of ``ix_connector_work_item_circuit_key``).
CIRCUIT_STATS = f"""
SELECT s.*, p.name AS pack_name,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = s.installed_pack_id AND w.circuit_key = s.circuit_key
          AND w.state IN ('pending', 'retry')) AS waiting,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = s.installed_pack_id AND w.circuit_key = s.circuit_key
          AND w.state = 'processing') AS in_flight
FROM (
  (SELECT {CIRCUIT_COLUMNS}, 0 AS listed FROM connector_circuit k
   WHERE {{where}} AND k.state <> 'closed' ORDER BY k.installed_pack_id, k.circuit_key LIMIT %(limit)s)
  UNION ALL
  (SELECT {CIRCUIT_COLUMNS}, 1 FROM connector_circuit k
   WHERE {{where}} AND k.state = 'closed' ORDER BY k.installed_pack_id, k.circuit_key LIMIT %(limit)s)
  ORDER BY listed, installed_pack_id, circuit_key LIMIT %(limit)s
) s
JOIN connector_installed_pack p ON p.installed_pack_id = s.installed_pack_id
ORDER BY s.listed, s.installed_pack_id, s.circuit_key
"""


async def circuit_stats(conn: Conn, pack: int | None, limit: int = 1000) -> list[dict[str, Any]]:
    sql = CIRCUIT_STATS.format(where=pack_filter("k", pack))
    return await fetch_dicts(conn, sql, {"pack": pack, "limit": limit})


# The sampler's gauges: every circuit's state (labels pack and target: a circuit key is a handler
# target's scheme and authority, never a path, query or user info) and how long it has been in it.
CIRCUIT_SAMPLE = """
SELECT k.installed_pack_id, k.circuit_key,
       CASE WHEN k.state = 'open' AND NOT k.forced AND k.open_until <= now() THEN 'half_open'
            ELSE k.state END,
       extract(epoch FROM now() - k.changed_at)::float8
FROM connector_circuit k
ORDER BY k.installed_pack_id, k.circuit_key
LIMIT 10000
"""


async def circuit_sample(conn: Conn) -> list[tuple[int, str, str, float]]:
    """``(pack, circuit key, state, seconds in that state)``."""
    cur = await conn.execute(CIRCUIT_SAMPLE)
    return [(int(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in await cur.fetchall()]
