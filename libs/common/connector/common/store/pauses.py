"""Every statement on ``connector_pause``: paused packs and queue classes (PausePack / ResumePack,
docs/admin.md "Pause and resume"), and the projection of them onto the claim authority rows.

``connector_pause`` is the durable record (who, why, when, request id); one row per (pack, queue
class), ``'*'`` for the whole pack. The claim statement does not read it: it reads
``connector_claim_authority.paused_queue_classes``, which ``pause_project`` rewrites from the pause
rows in the same transaction as every pause and resume, and ``claim_authority_insert`` fills for a
new generation (``store.authority``). Why a projection on that row: the claim statement already
locks the authority rows of its packs ``FOR SHARE`` (``store.work_items``), so the projection's
``UPDATE`` waits for every claim statement in flight on the pack, and a claim that locks the rows
after it re-reads their newest version (READ COMMITTED) — so no claim that commits after the pause
commits can claim paused work. A filter on ``connector_pause`` inside the claim would be read with
the claim statement's snapshot, taken before it waits. ``pause_projection_mismatches`` is the check
that the two agree (it should find none).

The rows of a pack are locked ``ORDER BY generation`` before the update: the claim locks authority
rows in (pack, generation) order too, so a pause and a claim never wait on each other crosswise.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from connector.common.store.packs import pack_filter
from connector.common.store.rows import fetch_dict, fetch_dicts
from connector.common.store.vocabulary import CHANNEL_WORK

Conn = AsyncConnection[Any]

PAUSE_COLUMNS = "p.installed_pack_id, p.queue_class, p.actor, p.reason, p.request_id, p.paused_at"

PAUSE_INSERT = f"""
INSERT INTO connector_pause AS p (installed_pack_id, queue_class, actor, reason, request_id)
VALUES (%(pack)s, %(queue_class)s, %(actor)s, %(reason)s, %(request_id)s)
ON CONFLICT (installed_pack_id, queue_class) DO NOTHING
RETURNING {PAUSE_COLUMNS}
"""

PAUSE_DELETE = f"""
DELETE FROM connector_pause p WHERE p.installed_pack_id = %(pack)s AND p.queue_class = %(queue_class)s
RETURNING {PAUSE_COLUMNS}
"""

PAUSE_GET = f"""
SELECT {PAUSE_COLUMNS} FROM connector_pause p
WHERE p.installed_pack_id = %(pack)s AND p.queue_class = %(queue_class)s
"""

# Every pause with its pack's name (a small table: operator actions only), optionally of one pack.
PAUSE_LIST = (
    f"SELECT {PAUSE_COLUMNS}, k.name AS pack_name,"
    "\n       extract(epoch FROM now() - p.paused_at)::float8 AS paused_for_s"
    "\nFROM connector_pause p JOIN connector_installed_pack k ON k.installed_pack_id = p.installed_pack_id"
    "\nWHERE {where} ORDER BY p.installed_pack_id, p.queue_class"
)

# The pack's authority rows, locked in generation order (see the module docstring).
PAUSE_AUTHORITY_LOCK = """
SELECT a.generation FROM connector_claim_authority a WHERE a.installed_pack_id = %(pack)s
ORDER BY a.generation FOR UPDATE
"""

PAUSE_PROJECT = """
UPDATE connector_claim_authority a
SET paused_queue_classes = coalesce(
  (SELECT array_agg(p.queue_class ORDER BY p.queue_class) FROM connector_pause p
   WHERE p.installed_pack_id = a.installed_pack_id), '{}')
WHERE a.installed_pack_id = %(pack)s
"""

# Authority rows whose projection disagrees with the pause rows (the check; expected empty).
PAUSE_PROJECTION_MISMATCHES = """
SELECT a.installed_pack_id, a.generation, a.paused_queue_classes
FROM connector_claim_authority a
WHERE a.paused_queue_classes IS DISTINCT FROM coalesce(
  (SELECT array_agg(p.queue_class ORDER BY p.queue_class) FROM connector_pause p
   WHERE p.installed_pack_id = a.installed_pack_id), '{}')
"""

# The queue classes the pack's generations declare (what a pause may name), from the manifests.
PACK_QUEUE_CLASSES = """
SELECT DISTINCT coalesce(t.value->>'queue_class', 'default') AS queue_class
FROM connector_pack_generation g CROSS JOIN LATERAL jsonb_each(g.manifest->'work_types') t
WHERE g.installed_pack_id = %(pack)s
"""

# Resume wakes every claimer: the paused groups' rows are ready again (``''``: rediscover groups).
PAUSE_NOTIFY = f"SELECT pg_notify('{CHANNEL_WORK}', 'pause')"


async def pause_get(conn: Conn, pack: int, queue_class: str) -> dict[str, Any] | None:
    return await fetch_dict(conn, PAUSE_GET, {"pack": pack, "queue_class": queue_class})


async def pause_list(conn: Conn, pack: int | None = None) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, PAUSE_LIST.format(where=pack_filter("p", pack)), {"pack": pack})


async def pack_queue_classes(conn: Conn, pack: int) -> set[str]:
    cur = await conn.execute(PACK_QUEUE_CLASSES, {"pack": pack})
    return {str(r[0]) for r in await cur.fetchall()}


async def pause_authority_lock(conn: Conn, pack: int) -> None:
    await conn.execute(PAUSE_AUTHORITY_LOCK, {"pack": pack})


async def pause_project(conn: Conn, pack: int) -> None:
    """Lock the pack's authority rows in generation order, then rewrite their projection."""
    await pause_authority_lock(conn, pack)
    await conn.execute(PAUSE_PROJECT, {"pack": pack})


async def pause_notify(conn: Conn) -> None:
    await conn.execute(PAUSE_NOTIFY)


async def pause_insert(
    conn: Conn, pack: int, queue_class: str, *, actor: str, reason: str, request_id: str | None
) -> dict[str, Any] | None:
    """Pause (caller's transaction): the row and its projection. ``None``: already paused (nothing
    changed). Commits only after every claim statement in flight on the pack has committed."""
    params = {"pack": pack, "queue_class": queue_class, "actor": actor, "reason": reason}
    row = await fetch_dict(conn, PAUSE_INSERT, {**params, "request_id": request_id})
    if row is not None:
        await pause_project(conn, pack)
        await pause_notify(conn)
    return row


async def pause_delete(conn: Conn, pack: int, queue_class: str) -> dict[str, Any] | None:
    """Resume (caller's transaction): delete the row, rewrite the projection, wake the claimers.
    Returns the pause that ended; ``None``: it was not paused."""
    row = await fetch_dict(conn, PAUSE_DELETE, {"pack": pack, "queue_class": queue_class})
    if row is not None:
        await pause_project(conn, pack)
        await pause_notify(conn)
    return row


async def pause_projection_mismatches(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, PAUSE_PROJECTION_MISMATCHES, {})
