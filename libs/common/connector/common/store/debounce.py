"""Debounce: the key rows ``connector_debounce`` and the statements that keep a key's waiting
WorkItems in shape (docs/packs.md#debounce, docs/executor.md#debounce).

The contract, per (pack, work type, debounce key):

* **Creation is serialized per key.** The materializer locks the batch's key rows (``FOR UPDATE``
  through ``debounce_declare``, sorted by key, so two materializers never wait on each other
  crosswise) before it inserts their WorkItems: the items of a key are created one transaction at a
  time, so their ``work_id`` order is their commit order.
* **Only the newest waiting item is live.** A new item is inserted due at ``least(now() + window_s,
  oldest waiting item's created_at + max_wait_s)``; the earlier items of the same batch are inserted
  *parked* (``run_after = PARKED``) and the previous newest is parked by ``debounce_schedule`` in
  the same transaction. A parked item always has a newer waiting item of its key.
* **The claim coalesces** (``work_items.claim.WORK_ITEM_CLAIM_BATCH``, key row ``FOR UPDATE SKIP LOCKED``):
  a due candidate that is its key's newest waiting item is claimed and every older waiting item of
  the key ends ``coalesced`` with ``covered_by`` = it, in the same statement; an older candidate is
  parked (the newest will cover it); an item older than the key's ``last_claimed_id`` (a retry of an
  execution a newer one has overtaken) is coalesced into that newer execution instead of running
  again. So per key the executed items' ids only grow, and every coalesced item was committed before
  the execution covering it was claimed.

``debounce_covered_batch`` is the handler's view: the items (and events) an execution covers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.vocabulary import PARKED

Conn = AsyncConnection[Any]


@dataclass(frozen=True, slots=True, order=True)
class DebounceKey:
    """A debounce key as a WorkItem declares it (the latest declaration sets the window)."""

    installed_pack_id: int
    work_type: str
    debounce_key: str
    window_s: float
    max_wait_s: float


# Keys sorted by (pack, work type, key): every existing row is locked (ON CONFLICT DO UPDATE locks
# the row even when its WHERE leaves it unchanged) and waited for, in that order; a changed window is
# re-declared. The lock is held to the end of the materializer's transaction.
DEBOUNCE_DECLARE = """
INSERT INTO connector_debounce AS k (installed_pack_id, work_type, debounce_key, window_s, max_wait_s)
SELECT * FROM unnest(%(packs)s::bigint[], %(work_types)s::text[], %(keys)s::text[], %(windows)s::float8[],
                     %(max_waits)s::float8[]) AS d(pack, work_type, debounce_key, window_s, max_wait_s)
ORDER BY 1, 2, 3
ON CONFLICT (installed_pack_id, work_type, debounce_key) DO UPDATE
SET window_s = excluded.window_s, max_wait_s = excluded.max_wait_s
WHERE (k.window_s, k.max_wait_s) IS DISTINCT FROM (excluded.window_s, excluded.max_wait_s)
"""


def _unique(keys: Sequence[DebounceKey]) -> list[DebounceKey]:
    return sorted({(k.installed_pack_id, k.work_type, k.debounce_key): k for k in keys}.values())


def _arrays(keys: Sequence[DebounceKey]) -> dict[str, list[Any]]:
    return {
        "packs": [k.installed_pack_id for k in keys],
        "work_types": [k.work_type for k in keys],
        "keys": [k.debounce_key for k in keys],
        "windows": [float(k.window_s) for k in keys],
        "max_waits": [float(k.max_wait_s) for k in keys],
    }


async def debounce_declare(conn: Conn, keys: Sequence[DebounceKey]) -> None:
    """Create (or re-declare) and lock the debounce keys of WorkItems about to be inserted, in the
    caller's transaction (it must be one: the locks are held to its end)."""
    if keys:
        await conn.execute(DEBOUNCE_DECLARE, _arrays(_unique(keys)), prepare=True)


# After ``debounce_declare`` (a new statement, so its snapshot has every earlier transaction of these
# keys): park each key's newest waiting item (the previous live one; a new one is about to replace
# it) and return, per key, when the new newest is due: ``window_s`` from now, but no later than
# ``max_wait_s`` after the oldest waiting item of the key was created. Two index probes per key.
DEBOUNCE_SCHEDULE = f"""
WITH k AS (
  SELECT * FROM unnest(%(packs)s::bigint[], %(work_types)s::text[], %(keys)s::text[], %(windows)s::float8[],
                       %(max_waits)s::float8[]) AS k(pack, work_type, debounce_key, window_s, max_wait_s)
), live AS (
  SELECT n.work_id FROM k CROSS JOIN LATERAL (
    SELECT w.work_id, w.run_after FROM connector_work_item w
    WHERE w.installed_pack_id = k.pack AND w.work_type = k.work_type AND w.debounce_key = k.debounce_key
      AND w.state IN ('pending', 'retry')
    ORDER BY w.work_id DESC LIMIT 1) n
  WHERE n.run_after <> {PARKED}
), parked AS (
  UPDATE connector_work_item w SET run_after = {PARKED}, updated_at = clock_timestamp()
  WHERE w.work_id = ANY (ARRAY(SELECT l.work_id FROM live l)) AND w.state IN ('pending', 'retry')
  RETURNING 1
)
SELECT k.pack, k.work_type, k.debounce_key,
       least(now() + make_interval(secs => k.window_s),
             coalesce(o.created_at, now()) + make_interval(secs => k.max_wait_s)) AS due,
       (SELECT count(*) FROM parked) AS parked
FROM k LEFT JOIN LATERAL (
  SELECT w.created_at FROM connector_work_item w
  WHERE w.installed_pack_id = k.pack AND w.work_type = k.work_type AND w.debounce_key = k.debounce_key
    AND w.state IN ('pending', 'retry')
  ORDER BY w.work_id LIMIT 1) o ON true
"""


async def debounce_schedule(conn: Conn, keys: Sequence[DebounceKey]) -> dict[tuple[int, str, str], datetime]:
    """Park each key's live item and return when each key's new newest item is due (database time),
    keyed by (pack, work type, key). Call after ``debounce_declare``, before the insert."""
    if not keys:
        return {}
    cur = await conn.execute(DEBOUNCE_SCHEDULE, _arrays(_unique(keys)), prepare=True)
    return {(int(r[0]), str(r[1]), str(r[2])): r[3] for r in await cur.fetchall()}


# The items each given execution covers, transitively (an item coalesced into one that was itself
# coalesced later is covered by the later one too): ``covered_by`` always points to a newer item, so
# the recursion ends. Only an item that ran itself (``attempts > 0``) can have covered others, so the
# recursion probes only those; each probe is a LATERAL index read of ``covered_by`` (``OFFSET 0``
# keeps it one: pulled up into a plain join, the planner, whose estimate for fresh coalesced rows was
# one, scanned the covered items once per covered item, 2.5 s for 4,500 of them).
DEBOUNCE_COVERED_BATCH = """
WITH RECURSIVE c AS (
  SELECT w.covered_by AS root, w.work_id, w.event_id, w.attempts FROM connector_work_item w
  WHERE w.covered_by = ANY(%(ids)s::bigint[]) AND w.state = 'coalesced'
  UNION ALL
  SELECT c.root, x.work_id, x.event_id, x.attempts FROM c CROSS JOIN LATERAL (
    SELECT w.work_id, w.event_id, w.attempts FROM connector_work_item w
    WHERE w.covered_by = c.work_id AND w.state = 'coalesced' OFFSET 0) x
  WHERE c.attempts > 0
)
SELECT root, work_id, event_id FROM c ORDER BY root, work_id
"""


async def debounce_covered_batch(conn: Conn, ids: Sequence[int]) -> dict[int, list[tuple[int, int]]]:
    """Per executed item id: ``[(work_id, event_id), ...]`` of the items it covers, oldest first."""
    if not ids:
        return {}
    cur = await conn.execute(DEBOUNCE_COVERED_BATCH, {"ids": list(ids)}, prepare=True)
    out: dict[int, list[tuple[int, int]]] = {}
    for r in await cur.fetchall():
        out.setdefault(int(r[0]), []).append((int(r[1]), int(r[2])))
    return out


# Per debounce key of a pack (or of every pack), bounded by ``limit``: its window and bound, its
# waiting items (the live newest and the parked ones behind it), when the live one is due, and the
# newest item an execution claimed. Index reads of ``ix_connector_work_item_debounce`` per key.
DEBOUNCE_STATS = f"""
SELECT k.installed_pack_id, p.name, k.work_type, k.debounce_key, k.window_s, k.max_wait_s,
       k.last_claimed_id, n.waiting, n.parked, n.next_due_s
FROM connector_debounce k
JOIN connector_installed_pack p ON p.installed_pack_id = k.installed_pack_id
CROSS JOIN LATERAL (
  SELECT count(*) AS waiting, count(*) FILTER (WHERE w.run_after = {PARKED}) AS parked,
         extract(epoch FROM min(w.run_after) FILTER (WHERE w.run_after <> {PARKED}) - now())::float8
           AS next_due_s
  FROM connector_work_item w
  WHERE w.installed_pack_id = k.installed_pack_id AND w.work_type = k.work_type
    AND w.debounce_key = k.debounce_key AND w.state IN ('pending', 'retry')) n
WHERE (%(pack)s::bigint IS NULL OR k.installed_pack_id = %(pack)s::bigint)
ORDER BY k.installed_pack_id, k.work_type, k.debounce_key
LIMIT %(limit)s
"""


async def debounce_stats(conn: Conn, pack: int | None, limit: int = 1000) -> list[dict[str, Any]]:
    cur = await conn.execute(DEBOUNCE_STATS, {"pack": pack, "limit": limit})
    cols = [d.name for d in cur.description or ()]
    return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]


# One key row, locked for the caller's transaction (waits, like the materializer's declaration).
DEBOUNCE_LOCK = """
SELECT 1 FROM connector_debounce
WHERE installed_pack_id = %(pack)s AND work_type = %(work_type)s AND debounce_key = %(key)s
FOR UPDATE
"""


async def debounce_lock(conn: Conn, pack: int, work_type: str, key: str) -> None:
    await conn.execute(DEBOUNCE_LOCK, {"pack": pack, "work_type": work_type, "key": key})


# The key's newest waiting item made live (due now) if it is parked: after the live one left the
# waiting states other than by a claim (an operator's cancel), so the parked ones behind it are
# still covered by a later execution. Under the key row lock (``debounce_lock``).
DEBOUNCE_UNPARK_NEWEST = f"""
UPDATE connector_work_item w SET run_after = now(), updated_at = clock_timestamp()
WHERE w.work_id = (
    SELECT n.work_id FROM connector_work_item n
    WHERE n.installed_pack_id = %(pack)s AND n.work_type = %(work_type)s AND n.debounce_key = %(key)s
      AND n.state IN ('pending', 'retry')
    ORDER BY n.work_id DESC LIMIT 1)
  AND w.run_after = {PARKED} AND w.state IN ('pending', 'retry')
"""


async def debounce_unpark_newest(conn: Conn, pack: int, work_type: str, key: str) -> None:
    await conn.execute(DEBOUNCE_UNPARK_NEWEST, {"pack": pack, "work_type": work_type, "key": key})


# The sampler's gauge per (pack, work type): waiting debounced items, live (a key's newest: its
# window running or due) and parked (to be covered by a newer one). Reads the waiting debounced
# items only (``ix_connector_work_item_debounce``); never the claim loop.
DEBOUNCE_SAMPLE = f"""
SELECT w.installed_pack_id, w.work_type,
       count(*) FILTER (WHERE w.run_after <> {PARKED}) AS live,
       count(*) FILTER (WHERE w.run_after = {PARKED}) AS parked
FROM connector_work_item w
WHERE w.debounce_key IS NOT NULL AND w.state IN ('pending', 'retry')
GROUP BY 1, 2
"""


async def debounce_sample(conn: Conn) -> list[tuple[int, str, int, int]]:
    """``(pack, work type, live items, parked items)``."""
    cur = await conn.execute(DEBOUNCE_SAMPLE)
    return [(int(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in await cur.fetchall()]


# Idle key rows are deleted (the reclaimer's periodic round, ``flow_key_idle_s``): a key none of
# whose WorkItems is in any state but succeeded and coalesced (``ix_connector_work_item_debounce``
# holds every other state: a waiting, running, dead or cancelled item still needs its key), at least
# ``idle_s`` old, whose last claimed item did not start within ``idle_s``. Nothing is lost: with no
# open item of the key, ``last_claimed_id`` orders nothing any more, and the next WorkItem of the key
# re-creates the row (the materializer's declaration). Two statements in one transaction: the page's
# rows locked ``SKIP LOCKED`` (a materializer or claim holding a key leaves it for the next round; a
# materializer that comes after waits for this transaction and then inserts the row anew), then the
# check and the delete in a statement whose snapshot follows the locks (so it sees the WorkItems of
# every declaration that held a key before). The rows are found by primary key through ``= ANY`` of
# each column's *distinct* values (the index is descended once per combination: a page of one work
# type is one descent per key; arrays with one entry per key made that the cube of the page size,
# and the planner rightly preferred to scan the key table), then matched exactly against the page.
DEBOUNCE_RETIRE_LOCK = """
SELECT k.installed_pack_id, k.work_type, k.debounce_key FROM connector_debounce k
WHERE (k.installed_pack_id, k.work_type, k.debounce_key) > (%(after_pack)s::bigint, %(after_wt)s::text,
                                                              %(after_key)s::text)
ORDER BY k.installed_pack_id, k.work_type, k.debounce_key
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

DEBOUNCE_RETIRE = """
DELETE FROM connector_debounce k
USING unnest(%(packs)s::bigint[], %(work_types)s::text[], %(keys)s::text[]) AS p(pack, work_type, key)
WHERE k.installed_pack_id = ANY (%(upacks)s::bigint[]) AND k.work_type = ANY (%(uwork_types)s::text[])
  AND k.debounce_key = ANY (%(ukeys)s::text[])
  AND k.installed_pack_id = p.pack AND k.work_type = p.work_type AND k.debounce_key = p.key
  AND k.created_at <= now() - make_interval(secs => %(idle_s)s::float8)
  AND NOT EXISTS (SELECT 1 FROM connector_work_item w
                  WHERE w.installed_pack_id = k.installed_pack_id AND w.work_type = k.work_type
                    AND w.debounce_key = k.debounce_key AND w.state NOT IN ('succeeded', 'coalesced'))
  AND NOT EXISTS (SELECT 1 FROM connector_work_item l
                  WHERE l.work_id = k.last_claimed_id
                    AND l.started_at > now() - make_interval(secs => %(idle_s)s::float8))
"""


def _page_arrays(page: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    packs, work_types, keys = [int(r[0]) for r in page], [str(r[1]) for r in page], [str(r[2]) for r in page]
    return {
        "packs": packs,
        "work_types": work_types,
        "keys": keys,
        "upacks": sorted(set(packs)),
        "uwork_types": sorted(set(work_types)),
        "ukeys": sorted(set(keys)),
    }


@dataclass(slots=True)
class DebounceCursor:
    """Where the idle-key walk continues (a few pages per round, wrapped at the table's end)."""

    pack: int = -1
    work_type: str = ""
    key: str = ""


async def debounce_retire(
    conn: Conn, cursor: DebounceCursor, *, idle_s: float, limit: int = 500, pages: int = 4
) -> int:
    """Delete idle debounce key rows, at most ``pages`` pages of ``limit`` keys after ``cursor``,
    each page one short transaction (see ``DEBOUNCE_RETIRE``). Returns the rows deleted."""
    deleted = 0
    for _ in range(pages):
        async with conn.transaction():
            after = {"after_pack": cursor.pack, "after_wt": cursor.work_type, "after_key": cursor.key}
            cur = await conn.execute(DEBOUNCE_RETIRE_LOCK, {**after, "limit": limit})
            page = await cur.fetchall()
            if page:
                cur = await conn.execute(DEBOUNCE_RETIRE, {**_page_arrays(page), "idle_s": float(idle_s)})
                deleted += cur.rowcount
        if len(page) < limit:
            cursor.pack, cursor.work_type, cursor.key = -1, "", ""
            break
        cursor.pack, cursor.work_type, cursor.key = int(page[-1][0]), str(page[-1][1]), str(page[-1][2])
    return deleted
