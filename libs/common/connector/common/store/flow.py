"""Flow control: the rate-limit key rows ``connector_rate_limit`` (docs/adr/011-rate-limits.md).

The claim statement (``work_items.claim.WORK_ITEM_CLAIM_BATCH``) spends a key's budget; here are the other
statements on the key rows: the materializer's declaration of the keys of the WorkItems it inserts
(in the same transaction, so a limited WorkItem is never claimable before its key row exists) and
the reads of the sampler and the admin API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.vocabulary import PARKED

Conn = AsyncConnection[Any]


@dataclass(frozen=True, slots=True, order=True)
class RateKey:
    """A rate-limit key as a WorkItem declares it (the latest declaration sets the limit)."""

    installed_pack_id: int
    rate_key: str
    work_type: str
    limit_n: int
    period_s: float
    burst: int


# Idle key rows are deleted (``flow_keys_retire``) under this lock, taken exclusively; every
# declaration takes it shared for the rest of its transaction (the one that inserts the key's
# WorkItems). So a retirement's check "no WorkItem needs this key" runs after every declaring
# transaction before it has committed (it sees their WorkItems), and a declaration after it re-creates
# a key it deleted (``ON CONFLICT DO NOTHING`` finds no row). Declarations never wait on each other.
FLOW_KEYS_LOCK_CLASS = 7234104
KEYS_LOCK_SHARED = f"SELECT pg_advisory_xact_lock_shared({FLOW_KEYS_LOCK_CLASS}, 0)"

# Every writer of a rate-limit key row takes the key's advisory lock first (``RATE_KEY_LOCK``: this
# class and a hash of pack and key). The claim statements only *try* it, for each key whose budget
# they would spend, and leave a key another transaction holds (its candidates wait for a later
# claim); the declaration of a changed limit waits for it (in key order) and the retirement of idle
# keys tries it. So a claim's update of a key row never waits on the row (DESIGN §8 trap 1): no
# other transaction holds one without the lock, and the lock is taken without a row lock (no WAL
# record, unlike ``FOR UPDATE``). Two keys whose hashes collide share a lock: while a transaction
# holds one, the other is skipped too.
RATE_KEY_LOCK_CLASS = 7234105


def rate_key_lock(pack: str, key: str) -> str:
    """The advisory lock arguments of the rate-limit key ``(pack, key)``, over two SQL expressions."""
    return f"{RATE_KEY_LOCK_CLASS}, hashtext({pack}::text || '/' || {key})"


# Keys sorted by (pack, key). New keys are inserted with their budget full (``tat`` now, so
# ``burst`` claims may go at once); a key whose declared limit changed gets the new limit, keeping
# its ``tat``. Only rows whose limit differs are updated, and locked (their advisory locks first, in
# key order), so an unchanged key is not held (a claim would skip it while this transaction runs).
RATE_LIMIT_DECLARE = f"""
WITH lk AS MATERIALIZED ({KEYS_LOCK_SHARED}
), d AS (
  SELECT d.* FROM lk, unnest(%(packs)s::bigint[], %(keys)s::text[], %(work_types)s::text[], %(limits)s::int[],
                             %(periods)s::float8[], %(bursts)s::int[])
    AS d(pack, rate_key, work_type, limit_n, period_s, burst)
), ins AS (
  INSERT INTO connector_rate_limit (installed_pack_id, rate_key, work_type, limit_n, period_s, burst)
  SELECT pack, rate_key, work_type, limit_n, period_s, burst FROM d ORDER BY pack, rate_key
  ON CONFLICT (installed_pack_id, rate_key) DO NOTHING
  RETURNING 1
), changed AS MATERIALIZED (
  SELECT d.*, pg_advisory_xact_lock({rate_key_lock("d.pack", "d.rate_key")}) IS NULL AS locked
  FROM d JOIN connector_rate_limit k ON k.installed_pack_id = d.pack AND k.rate_key = d.rate_key
  WHERE (k.limit_n, k.period_s, k.burst, k.work_type)
        IS DISTINCT FROM (d.limit_n, d.period_s, d.burst, d.work_type)
  ORDER BY d.pack, d.rate_key
)
UPDATE connector_rate_limit k
SET work_type = d.work_type, limit_n = d.limit_n, period_s = d.period_s, burst = d.burst
FROM changed d
WHERE k.installed_pack_id = d.pack AND k.rate_key = d.rate_key
  AND (k.limit_n, k.period_s, k.burst, k.work_type)
      IS DISTINCT FROM (d.limit_n, d.period_s, d.burst, d.work_type)
"""


async def rate_limit_declare(conn: Conn, keys: Sequence[RateKey]) -> None:
    """Create (or re-declare) the rate-limit keys of WorkItems being inserted, in the caller's
    transaction. ``keys``: one per (pack, key)."""
    if not keys:
        return
    uniq = sorted({(k.installed_pack_id, k.rate_key): k for k in keys}.values())
    await conn.execute(
        RATE_LIMIT_DECLARE,
        {
            "packs": [k.installed_pack_id for k in uniq],
            "keys": [k.rate_key for k in uniq],
            "work_types": [k.work_type for k in uniq],
            "limits": [k.limit_n for k in uniq],
            "periods": [float(k.period_s) for k in uniq],
            "bursts": [k.burst for k in uniq],
        },
        prepare=True,
    )


#: The rate-limited items in flight, per (pack, key): a read of the processing rows (their partial
#: index and the rows; bounded by the executors' capacity), which ``ix_connector_work_item_rate_key``
#: leaves out. A fragment of the statements below.
RATE_IN_FLIGHT = """
  SELECT w.installed_pack_id, w.rate_key, count(*) AS n FROM connector_work_item w
  WHERE w.state = 'processing' AND w.rate_key IS NOT NULL GROUP BY 1, 2"""

# Per key of a pack (or of every pack): the limit, the budget left now (claims that may go at once),
# when the next claim may go, and its WorkItems waiting (due or deferred to their budget's time) and
# in flight. Bounded by ``limit``; keys with waiting items first. Waiting: index reads of
# ``ix_connector_work_item_rate_key`` filtered by key (a key's backlog, not the table); in flight:
# ``RATE_IN_FLIGHT``, once.
RATE_LIMIT_STATS = f"""
WITH busy AS MATERIALIZED ({RATE_IN_FLIGHT}
)
SELECT k.installed_pack_id, p.name, k.work_type, k.rate_key, k.limit_n, k.period_s, k.burst,
       greatest(0, least(k.burst::float8,
         k.burst - extract(epoch FROM k.tat - now()) / (k.period_s / k.limit_n)))::float8 AS budget,
       greatest(0, extract(epoch FROM k.tat - now())
         - (k.burst - 1) * k.period_s / k.limit_n)::float8 AS next_in_s,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = k.installed_pack_id AND w.rate_key = k.rate_key
          AND w.state IN ('pending', 'retry')) AS waiting,
       coalesce((SELECT b.n FROM busy b
                 WHERE b.installed_pack_id = k.installed_pack_id AND b.rate_key = k.rate_key), 0) AS in_flight
FROM connector_rate_limit k JOIN connector_installed_pack p ON p.installed_pack_id = k.installed_pack_id
WHERE (%(pack)s::bigint IS NULL OR k.installed_pack_id = %(pack)s::bigint)
ORDER BY k.installed_pack_id, k.rate_key
LIMIT %(limit)s
"""


async def rate_limit_stats(conn: Conn, pack: int | None, limit: int = 1000) -> list[dict[str, Any]]:
    cur = await conn.execute(RATE_LIMIT_STATS, {"pack": pack, "limit": limit})
    cols = [d.name for d in cur.description or ()]
    return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]


# The sampler's gauges per (pack, work type): keys, keys without budget now, and their WorkItems
# waiting and in flight (bounded labels: never the key). A scan of the key rows (one per key), an
# index read of the waiting limited WorkItems (``ix_connector_work_item_rate_key``) and
# ``RATE_IN_FLIGHT``; never the claim loop.
RATE_LIMIT_SAMPLE = f"""
WITH k AS (
  SELECT installed_pack_id, work_type, count(*) AS keys,
         count(*) FILTER (WHERE tat - make_interval(secs => (burst - 1) * period_s / limit_n) > now())
           AS exhausted
  FROM connector_rate_limit GROUP BY 1, 2
), w AS (
  SELECT x.installed_pack_id, k.work_type, sum(x.waiting) AS waiting, sum(x.in_flight) AS in_flight
  FROM (SELECT w.installed_pack_id, w.rate_key, count(*) AS waiting, 0 AS in_flight
        FROM connector_work_item w
        WHERE w.rate_key IS NOT NULL AND w.state IN ('pending', 'retry') GROUP BY 1, 2
        UNION ALL
        SELECT b.installed_pack_id, b.rate_key, 0, b.n FROM ({RATE_IN_FLIGHT}) b) x
  JOIN connector_rate_limit k ON k.installed_pack_id = x.installed_pack_id AND k.rate_key = x.rate_key
  GROUP BY 1, 2
)
SELECT k.installed_pack_id, k.work_type, k.keys, k.exhausted, coalesce(w.waiting, 0)::bigint,
       coalesce(w.in_flight, 0)::bigint
FROM k LEFT JOIN w ON w.installed_pack_id = k.installed_pack_id AND w.work_type = k.work_type
"""


async def rate_limit_sample(conn: Conn) -> list[tuple[int, str, int, int, int, int]]:
    """``(pack, work type, keys, keys without budget, waiting, in flight)``."""
    cur = await conn.execute(RATE_LIMIT_SAMPLE)
    return [(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in await cur.fetchall()]


# --------------------------------------------------------------------------------------------------
# Concurrency slots (``connector_concurrency_limit``)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class SlotKey:
    """A concurrency key as a WorkItem declares it (the latest declaration sets the limit)."""

    installed_pack_id: int
    concurrency_key: str
    work_type: str
    max_in_flight: int


# Like RATE_LIMIT_DECLARE: new keys start with no slot taken; a changed limit applies at once (a
# lower one lets the items in flight finish: nothing is taken back).
CONCURRENCY_DECLARE = f"""
WITH lk AS MATERIALIZED ({KEYS_LOCK_SHARED}
), d AS (
  SELECT d.* FROM lk, unnest(%(packs)s::bigint[], %(keys)s::text[], %(work_types)s::text[], %(limits)s::int[])
    AS d(pack, concurrency_key, work_type, max_in_flight)
), ins AS (
  INSERT INTO connector_concurrency_limit (installed_pack_id, concurrency_key, work_type, max_in_flight)
  SELECT pack, concurrency_key, work_type, max_in_flight FROM d ORDER BY pack, concurrency_key
  ON CONFLICT (installed_pack_id, concurrency_key) DO NOTHING
  RETURNING 1
)
UPDATE connector_concurrency_limit k
SET work_type = d.work_type, max_in_flight = d.max_in_flight
FROM d
WHERE k.installed_pack_id = d.pack AND k.concurrency_key = d.concurrency_key
  AND (k.max_in_flight, k.work_type) IS DISTINCT FROM (d.max_in_flight, d.work_type)
"""


async def concurrency_declare(conn: Conn, keys: Sequence[SlotKey]) -> None:
    """Create (or re-declare) the concurrency keys of WorkItems being inserted (caller's
    transaction). ``keys``: one per (pack, key)."""
    if not keys:
        return
    uniq = sorted({(k.installed_pack_id, k.concurrency_key): k for k in keys}.values())
    await conn.execute(
        CONCURRENCY_DECLARE,
        {
            "packs": [k.installed_pack_id for k in uniq],
            "keys": [k.concurrency_key for k in uniq],
            "work_types": [k.work_type for k in uniq],
            "limits": [k.max_in_flight for k in uniq],
        },
        prepare=True,
    )


# Give back ``n`` slots per key (the rows that just left ``processing`` in this transaction), the key
# rows locked in (pack, key) order (finalizers and reclaimers never lock them in different orders;
# the claim statement never waits for them). ``in_flight`` never goes below zero (a count the check
# would then find too low).
SLOTS_RELEASE = """
WITH r AS (
  SELECT * FROM unnest(%(packs)s::bigint[], %(keys)s::text[], %(ns)s::int[]) AS r(pack, concurrency_key, n)
), l AS (
  SELECT k.installed_pack_id, k.concurrency_key FROM connector_concurrency_limit k
  WHERE (k.installed_pack_id, k.concurrency_key) IN (SELECT r.pack, r.concurrency_key FROM r)
  ORDER BY k.installed_pack_id, k.concurrency_key
  FOR UPDATE
)
UPDATE connector_concurrency_limit k SET in_flight = greatest(0, k.in_flight - r.n)
FROM l JOIN r ON r.pack = l.installed_pack_id AND r.concurrency_key = l.concurrency_key
WHERE k.installed_pack_id = l.installed_pack_id AND k.concurrency_key = l.concurrency_key
"""

# Wake (make due) up to ``n`` parked items per key, oldest first. A separate statement after
# SLOTS_RELEASE: it runs once the key rows are locked, so it sees every item a claim parked before
# (the claim parks under the same key-row lock). It *waits* for a parked row another transaction
# holds, never skips it: a claim whose snapshot predates the parking still sees the item due, and
# its candidate read locks the row's newest version, finds it no longer due and leaves it out, but
# keeps the lock until its statement ends. Skipping that row woke nobody while the key had a free
# slot, and the item stayed parked until the slot check (test_concurrency_limits, "stale claim").
# The wait is a claim statement's length at most: claims never wait, so there is no cycle.
SLOTS_WAKE = f"""
UPDATE connector_work_item w SET run_after = now(), updated_at = clock_timestamp()
WHERE w.work_id = ANY (ARRAY(
  SELECT p.work_id
  FROM unnest(%(packs)s::bigint[], %(keys)s::text[], %(ns)s::int[]) AS r(pack, concurrency_key, n)
  CROSS JOIN LATERAL (
    SELECT p.work_id FROM connector_work_item p
    WHERE p.installed_pack_id = r.pack AND p.concurrency_key = r.concurrency_key
      AND p.state IN ('pending', 'retry') AND p.run_after = {PARKED}
    ORDER BY p.work_id LIMIT r.n
    FOR UPDATE) p))
  AND w.state IN ('pending', 'retry') AND w.run_after = {PARKED}
"""


def _slot_arrays(released: Mapping[tuple[int, str], int]) -> dict[str, list[Any]]:
    keys = sorted(k for k, n in released.items() if n > 0)
    return {"packs": [k[0] for k in keys], "keys": [k[1] for k in keys], "ns": [released[k] for k in keys]}


async def slots_release(conn: Conn, released: Mapping[tuple[int, str], int]) -> int:
    """Give back ``released[(pack, key)]`` slots and wake as many parked items of each key, inside
    the caller's transaction (the one that moved those rows out of ``processing``). Returns the
    number of parked items woken."""
    params = _slot_arrays(released)
    if not params["packs"]:
        return 0
    await conn.execute(SLOTS_RELEASE, params, prepare=True)
    cur = await conn.execute(SLOTS_WAKE, params, prepare=True)
    return cur.rowcount


# The check (ADR 011: the slot counts are a materialized fact, rebuildable from the rows), per page
# of keys in one transaction: lock the keys (CONCURRENCY_CHECK_LOCK; claims skip them, finalizers
# wait), then, in a second statement whose snapshot follows the locks (so it sees every claim and
# finalize of those keys that committed before), recount ``in_flight`` from the processing rows and
# wake as many parked items as there are free slots not already taken by due items. A healthy system
# recounts nothing; the wake-up is what rescues parked items whose key lost its waker (e.g. a woken
# item cancelled before it ran).
CONCURRENCY_CHECK_LOCK = """
SELECT k.installed_pack_id, k.concurrency_key FROM connector_concurrency_limit k
WHERE (k.installed_pack_id, k.concurrency_key) > (%(after_pack)s::bigint, %(after_key)s::text)
ORDER BY k.installed_pack_id, k.concurrency_key
LIMIT %(limit)s
FOR UPDATE
"""

CONCURRENCY_CHECK_FIX = f"""
WITH c AS (
  SELECT k.installed_pack_id, k.concurrency_key, k.max_in_flight, k.in_flight,
    (SELECT count(*) FROM connector_work_item w WHERE w.installed_pack_id = k.installed_pack_id
       AND w.concurrency_key = k.concurrency_key AND w.state = 'processing') AS processing,
    (SELECT count(*) FROM connector_work_item w WHERE w.installed_pack_id = k.installed_pack_id
       AND w.concurrency_key = k.concurrency_key AND w.state IN ('pending', 'retry')
       AND w.run_after <> {PARKED}) AS due
  FROM unnest(%(packs)s::bigint[], %(keys)s::text[]) AS l(pack, concurrency_key)
  JOIN connector_concurrency_limit k ON k.installed_pack_id = l.pack AND k.concurrency_key = l.concurrency_key
), fixed AS (
  UPDATE connector_concurrency_limit k SET in_flight = c.processing
  FROM c WHERE k.installed_pack_id = c.installed_pack_id AND k.concurrency_key = c.concurrency_key
    AND k.in_flight <> c.processing
  RETURNING 1
), woken AS (
  UPDATE connector_work_item w SET run_after = now(), updated_at = clock_timestamp()
  WHERE w.work_id = ANY (ARRAY(
    SELECT p.work_id FROM c CROSS JOIN LATERAL (
      SELECT p.work_id FROM connector_work_item p
      WHERE p.installed_pack_id = c.installed_pack_id AND p.concurrency_key = c.concurrency_key
        AND p.state IN ('pending', 'retry') AND p.run_after = {PARKED}
      ORDER BY p.work_id LIMIT greatest(0, c.max_in_flight - c.processing - c.due)
      FOR UPDATE SKIP LOCKED) p))
  RETURNING 1
)
SELECT (SELECT count(*) FROM fixed), (SELECT count(*) FROM woken)
"""


@dataclass(frozen=True, slots=True)
class SlotCheck:
    recounted: int  # keys whose in_flight disagreed with their processing rows (healthy: 0)
    woken: int  # parked items woken because their key had free slots nobody was going to use
    keys: int  # keys checked


async def concurrency_check(conn: Conn, *, limit: int = 500) -> SlotCheck:
    """Check every concurrency key, ``limit`` keys per transaction: recount its slots from the
    processing rows and wake parked items that have free slots."""
    recounted = woken = keys = 0
    after: tuple[int, str] = (-1, "")
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                CONCURRENCY_CHECK_LOCK, {"after_pack": after[0], "after_key": after[1], "limit": limit}
            )
            page = [(int(r[0]), str(r[1])) for r in await cur.fetchall()]
            if page:
                cur = await conn.execute(
                    CONCURRENCY_CHECK_FIX, {"packs": [p[0] for p in page], "keys": [p[1] for p in page]}
                )
                row = await cur.fetchone()
                assert row is not None
                recounted += int(row[0])
                woken += int(row[1])
        keys += len(page)
        if len(page) < limit:
            return SlotCheck(recounted, woken, keys)
        after = page[-1]


# The sampler's gauges per (pack, work type): concurrency keys, keys with no free slot, and their
# items due, parked and in flight (bounded labels: never the key).
CONCURRENCY_SAMPLE = f"""
WITH k AS (
  SELECT installed_pack_id, work_type, count(*) AS keys,
         count(*) FILTER (WHERE in_flight >= max_in_flight) AS full_keys
  FROM connector_concurrency_limit GROUP BY 1, 2
), w AS (
  SELECT w.installed_pack_id, k.work_type,
         count(*) FILTER (WHERE w.state IN ('pending', 'retry') AND w.run_after <> {PARKED}) AS waiting,
         count(*) FILTER (WHERE w.state IN ('pending', 'retry') AND w.run_after = {PARKED}) AS parked,
         count(*) FILTER (WHERE w.state = 'processing') AS in_flight
  FROM connector_work_item w
  JOIN connector_concurrency_limit k
    ON k.installed_pack_id = w.installed_pack_id AND k.concurrency_key = w.concurrency_key
  WHERE w.concurrency_key IS NOT NULL AND w.state IN ('pending', 'retry', 'processing')
  GROUP BY 1, 2
)
SELECT k.installed_pack_id, k.work_type, k.keys, k.full_keys, coalesce(w.waiting, 0),
       coalesce(w.parked, 0), coalesce(w.in_flight, 0)
FROM k LEFT JOIN w ON w.installed_pack_id = k.installed_pack_id AND w.work_type = k.work_type
"""


async def concurrency_sample(conn: Conn) -> list[tuple[int, str, int, int, int, int, int]]:
    """``(pack, work type, keys, full keys, waiting, parked, in flight)``."""
    cur = await conn.execute(CONCURRENCY_SAMPLE)
    return [
        (int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]))
        for r in await cur.fetchall()
    ]


# Per concurrency key of a pack (or of every pack), bounded, in key order: limit, slots taken, and
# its items waiting (due), parked and in flight.
CONCURRENCY_STATS = f"""
SELECT k.installed_pack_id, p.name, k.work_type, k.concurrency_key, k.max_in_flight, k.in_flight,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = k.installed_pack_id AND w.concurrency_key = k.concurrency_key
          AND w.state IN ('pending', 'retry') AND w.run_after <> {PARKED}) AS waiting,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = k.installed_pack_id AND w.concurrency_key = k.concurrency_key
          AND w.state IN ('pending', 'retry') AND w.run_after = {PARKED}) AS parked,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = k.installed_pack_id AND w.concurrency_key = k.concurrency_key
          AND w.state = 'processing') AS processing
FROM connector_concurrency_limit k
JOIN connector_installed_pack p ON p.installed_pack_id = k.installed_pack_id
WHERE (%(pack)s::bigint IS NULL OR k.installed_pack_id = %(pack)s::bigint)
ORDER BY k.installed_pack_id, k.concurrency_key
LIMIT %(limit)s
"""


async def concurrency_stats(conn: Conn, pack: int | None, limit: int = 1000) -> list[dict[str, Any]]:
    cur = await conn.execute(CONCURRENCY_STATS, {"pack": pack, "limit": limit})
    cols = [d.name for d in cur.description or ()]
    return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]


# --------------------------------------------------------------------------------------------------
# Idle key rows
# --------------------------------------------------------------------------------------------------

#: A key row is idle, and deleted, once no WorkItem needs it: every WorkItem of the key is
#: ``succeeded`` (the states in ``ix_connector_work_item_concurrency_key``, and for a rate key those
#: in ``ix_connector_work_item_rate_key`` plus the processing ones, ``RATE_IN_FLIGHT``: a dead or
#: cancelled one may be replayed, a blocked one promoted), its budget is full (``tat`` at least
#: ``idle_s`` in the past: a new row would start the same) or no slot is taken, and it is at least
#: ``idle_s`` old. A new WorkItem of the key re-creates it (the materializer's declaration).
FLOW_KEYS_RETIRE_LOCK = f"SELECT pg_advisory_xact_lock({FLOW_KEYS_LOCK_CLASS}, 0)"

# One page of keys after the cursor, in key order, whose advisory locks it gets (a key a claim holds
# is left for the next round), locked SKIP LOCKED, deleted through their primary key (both columns
# ``= ANY`` of the page, so a generic plan probes the index too instead of hashing the key table).
# Returns the page's size, how many rows were deleted and the page's last key. The second
# statement of the retirement's transaction: its snapshot follows the exclusive lock.
RATE_LIMIT_RETIRE = f"""
WITH busy AS MATERIALIZED ({RATE_IN_FLIGHT}
), page AS (
  SELECT k.installed_pack_id, k.rate_key FROM connector_rate_limit k
  WHERE (k.installed_pack_id, k.rate_key) > (%(after_pack)s::bigint, %(after_key)s::text)
    AND pg_try_advisory_xact_lock({rate_key_lock("k.installed_pack_id", "k.rate_key")})
  ORDER BY k.installed_pack_id, k.rate_key
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM connector_rate_limit k USING page p
  WHERE k.installed_pack_id = ANY (ARRAY(SELECT p.installed_pack_id FROM page p))
    AND k.rate_key = ANY (ARRAY(SELECT p.rate_key FROM page p))
    AND k.installed_pack_id = p.installed_pack_id AND k.rate_key = p.rate_key
    AND k.tat <= now() - make_interval(secs => %(idle_s)s::float8)
    AND k.created_at <= now() - make_interval(secs => %(idle_s)s::float8)
    AND NOT EXISTS (SELECT 1 FROM connector_work_item w
                    WHERE w.installed_pack_id = k.installed_pack_id AND w.rate_key = k.rate_key
                      AND w.state NOT IN ('succeeded', 'processing'))
    AND NOT EXISTS (SELECT 1 FROM busy b
                    WHERE b.installed_pack_id = k.installed_pack_id AND b.rate_key = k.rate_key)
  RETURNING 1
)
SELECT (SELECT count(*) FROM page), (SELECT count(*) FROM gone), l.installed_pack_id, l.rate_key
FROM (SELECT 1) one
LEFT JOIN (SELECT p.installed_pack_id, p.rate_key FROM page p
           ORDER BY p.installed_pack_id DESC, p.rate_key DESC LIMIT 1) l ON true
"""

CONCURRENCY_RETIRE = """
WITH page AS (
  SELECT k.installed_pack_id, k.concurrency_key FROM connector_concurrency_limit k
  WHERE (k.installed_pack_id, k.concurrency_key) > (%(after_pack)s::bigint, %(after_key)s::text)
  ORDER BY k.installed_pack_id, k.concurrency_key
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM connector_concurrency_limit k USING page p
  WHERE k.installed_pack_id = ANY (ARRAY(SELECT p.installed_pack_id FROM page p))
    AND k.concurrency_key = ANY (ARRAY(SELECT p.concurrency_key FROM page p))
    AND k.installed_pack_id = p.installed_pack_id AND k.concurrency_key = p.concurrency_key
    AND k.in_flight = 0
    AND k.created_at <= now() - make_interval(secs => %(idle_s)s::float8)
    AND NOT EXISTS (SELECT 1 FROM connector_work_item w
                    WHERE w.installed_pack_id = k.installed_pack_id
                      AND w.concurrency_key = k.concurrency_key AND w.state <> 'succeeded')
  RETURNING 1
)
SELECT (SELECT count(*) FROM page), (SELECT count(*) FROM gone), l.installed_pack_id, l.concurrency_key
FROM (SELECT 1) one
LEFT JOIN (SELECT p.installed_pack_id, p.concurrency_key FROM page p
           ORDER BY p.installed_pack_id DESC, p.concurrency_key DESC LIMIT 1) l ON true
"""


@dataclass(slots=True)
class KeyCursor:
    """Where the retirement of one key table continues (it walks the keys a few pages per round)."""

    pack: int = -1
    key: str = ""


async def _retire_page(
    conn: Conn, statement: str, cursor: KeyCursor, idle_s: float, limit: int
) -> tuple[int, bool]:
    """One page of ``statement`` after ``cursor`` in one transaction (the exclusive keys lock first);
    moves the cursor. Returns (rows deleted, whether the table's end was reached)."""
    params = {"after_pack": cursor.pack, "after_key": cursor.key, "limit": limit, "idle_s": float(idle_s)}
    async with conn.transaction():
        await conn.execute(FLOW_KEYS_RETIRE_LOCK)
        cur = await conn.execute(statement, params)
        row = await cur.fetchone()
    assert row is not None
    if int(row[0]) < limit:  # the end of the table: start over next time
        cursor.pack, cursor.key = -1, ""
        return int(row[1]), True
    cursor.pack, cursor.key = int(row[2]), str(row[3])
    return int(row[1]), False


async def rate_limit_retire(
    conn: Conn, cursor: KeyCursor, *, idle_s: float, limit: int = 500
) -> tuple[int, bool]:
    """Delete the idle rate-limit keys of one page after ``cursor`` (see ``RATE_LIMIT_RETIRE``)."""
    return await _retire_page(conn, RATE_LIMIT_RETIRE, cursor, idle_s, limit)


async def concurrency_retire(
    conn: Conn, cursor: KeyCursor, *, idle_s: float, limit: int = 500
) -> tuple[int, bool]:
    """Delete the idle concurrency keys of one page after ``cursor`` (see ``CONCURRENCY_RETIRE``)."""
    return await _retire_page(conn, CONCURRENCY_RETIRE, cursor, idle_s, limit)


async def flow_keys_retire(
    conn: Conn,
    cursors: tuple[KeyCursor, KeyCursor],
    *,
    idle_s: float,
    limit: int = 500,
    pages: int = 4,
) -> tuple[int, int]:
    """Delete idle rate-limit and concurrency key rows: at most ``pages`` pages of ``limit`` keys of
    each table per call, continuing from ``cursors`` (rate, concurrency; wrapped at the table's end),
    each page one short transaction. Returns the rows deleted (rate, concurrency)."""
    deleted = [0, 0]
    for i, (retire, cursor) in enumerate(zip((rate_limit_retire, concurrency_retire), cursors, strict=True)):
        for _ in range(pages):
            n, end = await retire(conn, cursor, idle_s=idle_s, limit=limit)
            deleted[i] += n
            if end:
                break
    return deleted[0], deleted[1]
