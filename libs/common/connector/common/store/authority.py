"""Every statement on the claim control plane: ``connector_claim_authority``,
``connector_cutover_receipt``, ``connector_rollback_fence``, ``connector_scheduler_lease``
(docs/adr/007-cutover.md, docs/cutover.md).

The authority row of a (pack, generation) names the one claim path that may claim (``claim_path``,
``phase``). Both paths' claim statements join it ``FOR SHARE``; a transition locks it ``FOR UPDATE``
(``claim_authority_lock``), which waits for every claim transaction in flight — the lock order of a
transition is the pack row first (``pack_lock``, held here because it is the first step of that
protocol), then the authority row. Cutover receipts are immutable and bind a transition's proof;
rollback fences group the WorkItems a rollback made non-executable. The legacy path's scheduler
lease is one row per generation with a strictly increasing token.

Reads joined here: the authority with its admitting receipt's kind (``claim_authority_get``,
``claim_authority_lock``); the claim schema revision (``alembic_version``) and the database clock
that a receipt's proof records. The admin API's cutover state: each generation's authority with its
open fences and the WorkItems, legacy events and outcome receipts the gates wait for
(``cutover_state_list``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from connector.common.store.packs import pack_filter
from connector.common.store.rows import fetch_dict, fetch_dicts
from connector.common.store.vocabulary import CHANNEL_PACKS

Conn = AsyncConnection[Any]

# --------------------------------------------------------------------------------------------------
# Pack row and claim authority (transition lock order: pack, then authority)
# --------------------------------------------------------------------------------------------------

PACK_LOCK = """
SELECT installed_pack_id, name, active_generation FROM connector_installed_pack
WHERE installed_pack_id = %(pack)s FOR UPDATE
"""

PACK_ACTIVE_GENERATION = (
    "SELECT active_generation FROM connector_installed_pack WHERE installed_pack_id = %(pack)s"
)

PACK_RESOLVE = """
SELECT installed_pack_id, active_generation FROM connector_installed_pack
WHERE name = %(pack)s OR (%(pack)s ~ '^[0-9]+$' AND installed_pack_id = %(pack)s::bigint)
"""

CLAIM_AUTHORITY_GET = """
SELECT a.claim_path, a.phase, a.version, a.cutover_receipt_id, r.kind AS receipt_kind
FROM connector_claim_authority a
LEFT JOIN connector_cutover_receipt r ON r.cutover_receipt_id = a.cutover_receipt_id
WHERE a.installed_pack_id = %(pack)s AND a.generation = %(generation)s
"""

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

# An authority change: ingress and materializer caches reload on ``connector_packs``.
AUTHORITY_NOTIFY = f"SELECT pg_notify('{CHANNEL_PACKS}', '')"


# The claim authority of several (pack, generation) pairs (the admin trace): whether each admits
# WorkItem claims — the same condition the claim statement's authority read holds — and the
# queue classes the claim skips there (``paused_queue_classes``, '*': the whole pack; store/pauses.py).
CLAIM_AUTHORITY_LIST = """
SELECT k.pack AS installed_pack_id, k.generation, a.claim_path, a.phase,
       coalesce(a.claim_path = 'work_item' AND a.phase = 'work_item_active'
                AND a.cutover_receipt_id IS NOT NULL, false) AS admits_work_items,
       coalesce(a.paused_queue_classes, '{}') AS paused_queue_classes
FROM unnest(%(packs)s::bigint[], %(generations)s::int[]) AS k(pack, generation)
LEFT JOIN connector_claim_authority a ON a.installed_pack_id = k.pack AND a.generation = k.generation
"""


async def claim_authority_list(
    conn: Conn, pairs: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], dict[str, Any]]:
    uniq = sorted(set(pairs))
    if not uniq:
        return {}
    rows = await fetch_dicts(
        conn, CLAIM_AUTHORITY_LIST, {"packs": [p for p, _ in uniq], "generations": [g for _, g in uniq]}
    )
    return {(int(r["installed_pack_id"]), int(r["generation"])): r for r in rows}


async def pack_lock(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, PACK_LOCK, params)


async def pack_active_generation(conn: Conn, pack: int) -> tuple[bool, int | None]:
    """``(pack exists, its active generation)``."""
    cur = await conn.execute(PACK_ACTIVE_GENERATION, {"pack": pack})
    row = await cur.fetchone()
    if row is None:
        return False, None
    return True, None if row[0] is None else int(row[0])


async def pack_resolve(conn: Conn, pack: str) -> tuple[int, int | None] | None:
    """A pack by name or id: ``(installed_pack_id, active generation)``."""
    cur = await conn.execute(PACK_RESOLVE, {"pack": pack})
    row = await cur.fetchone()
    if row is None:
        return None
    return int(row[0]), None if row[1] is None else int(row[1])


async def claim_authority_get(conn: Conn, pack: int, generation: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, CLAIM_AUTHORITY_GET, {"pack": pack, "generation": generation})


async def claim_authority_lock(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, CLAIM_AUTHORITY_LOCK, params)


async def claim_authority_set(conn: Conn, params: dict[str, Any]) -> dict[str, Any]:
    """Move the authority (``pack``, ``generation``, ``claim_path``, ``phase``, ``receipt_id``,
    ``fence_id``); returns the new ``claim_path``, ``phase``, ``version``."""
    row = await fetch_dict(conn, CLAIM_AUTHORITY_SET, params)
    assert row is not None
    return row


async def authority_notify(conn: Conn) -> None:
    await conn.execute(AUTHORITY_NOTIFY)


# --------------------------------------------------------------------------------------------------
# Cutover receipts and what their proofs record
# --------------------------------------------------------------------------------------------------

CUTOVER_RECEIPT_INSERT = """
INSERT INTO connector_cutover_receipt (installed_pack_id, generation, kind, claim_path, proof, proof_sha256,
                                       actor)
VALUES (%(pack)s, %(generation)s, %(kind)s, %(claim_path)s, %(proof)s, %(proof_sha256)s, %(actor)s)
RETURNING cutover_receipt_id
"""

CUTOVER_RECEIPT_GET = """
SELECT cutover_receipt_id, kind, claim_path, proof_sha256, actor, created_at
FROM connector_cutover_receipt WHERE cutover_receipt_id = %(id)s
"""

ALEMBIC_REVISION = "SELECT version_num FROM alembic_version"

DATABASE_NOW = "SELECT clock_timestamp()"


async def cutover_receipt_insert(
    conn: Conn,
    *,
    pack: int,
    generation: int,
    kind: str,
    claim_path: str,
    proof: dict[str, Any],
    proof_sha256: str,
    actor: str,
) -> int:
    cur = await conn.execute(
        CUTOVER_RECEIPT_INSERT,
        {
            "pack": pack,
            "generation": generation,
            "kind": kind,
            "claim_path": claim_path,
            "proof": Jsonb(proof),
            "proof_sha256": proof_sha256,
            "actor": actor,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def cutover_receipt_get(conn: Conn, receipt_id: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, CUTOVER_RECEIPT_GET, {"id": receipt_id})


async def alembic_revision(conn: Conn) -> str | None:
    cur = await conn.execute(ALEMBIC_REVISION)
    row = await cur.fetchone()
    return str(row[0]) if row is not None else None


async def database_now(conn: Conn) -> str:
    cur = await conn.execute(DATABASE_NOW)
    row = await cur.fetchone()
    assert row is not None
    return str(row[0].isoformat())


# --------------------------------------------------------------------------------------------------
# Rollback fences
# --------------------------------------------------------------------------------------------------

ROLLBACK_FENCE_INSERT = """
INSERT INTO connector_rollback_fence (installed_pack_id, generation, status, fenced_work_items)
VALUES (%(pack)s, %(generation)s, 'open', %(n)s)
RETURNING fence_id
"""

ROLLBACK_FENCE_OPEN = """
SELECT coalesce(array_agg(fence_id ORDER BY fence_id), '{}') FROM connector_rollback_fence
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s AND status = 'open'
"""

ROLLBACK_FENCE_RESOLVED_IDS = """
SELECT coalesce(array_agg(fence_id ORDER BY fence_id), '{}') FROM connector_rollback_fence
WHERE installed_pack_id = %(pack)s AND generation = %(generation)s AND status = 'resolved'
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


async def rollback_fence_insert(conn: Conn, pack: int, generation: int, n: int) -> int:
    cur = await conn.execute(ROLLBACK_FENCE_INSERT, {"pack": pack, "generation": generation, "n": n})
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def rollback_fence_open(conn: Conn, pack: int, generation: int) -> list[int]:
    cur = await conn.execute(ROLLBACK_FENCE_OPEN, {"pack": pack, "generation": generation})
    row = await cur.fetchone()
    return [int(x) for x in (row[0] if row is not None else [])]


async def rollback_fence_resolved_ids(conn: Conn, pack: int, generation: int) -> list[int]:
    cur = await conn.execute(ROLLBACK_FENCE_RESOLVED_IDS, {"pack": pack, "generation": generation})
    row = await cur.fetchone()
    return [int(x) for x in (row[0] if row is not None else [])]


async def rollback_fence_resolve(conn: Conn, pack: int, generation: int) -> list[int]:
    """Resolve the generation's open fences whose every row is reconciled; returns their ids."""
    cur = await conn.execute(ROLLBACK_FENCE_RESOLVE, {"pack": pack, "generation": generation})
    return [int(r[0]) for r in await cur.fetchall()]


# --------------------------------------------------------------------------------------------------
# The legacy path's scheduler lease (one claimer per generation)
# --------------------------------------------------------------------------------------------------

# The generation's authority row when it admits legacy claims, share-locked for the transaction.
LEGACY_AUTHORITY = """
  SELECT a.installed_pack_id FROM connector_claim_authority a
  WHERE a.installed_pack_id = %(pack)s AND a.generation = %(generation)s
    AND a.claim_path = 'legacy_event' AND a.phase = 'legacy_active'
  FOR SHARE
"""

SCHEDULER_LEASE_HELD = """
  SELECT s.installed_pack_id FROM connector_scheduler_lease s
  WHERE s.installed_pack_id = %(pack)s AND s.generation = %(generation)s AND s.holder = %(owner)s
    AND s.token = %(lease_token)s AND s.lease_until > clock_timestamp()
  FOR SHARE
"""

# Acquire or renew the pack-wide scheduler lease (only while the authority admits legacy claims). A
# renewal keeps the token; a takeover (free, released or expired) increments it.
SCHEDULER_LEASE_ACQUIRE = f"""
WITH auth AS MATERIALIZED ({LEGACY_AUTHORITY})
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


async def scheduler_lease_acquire(conn: Conn, params: dict[str, Any]) -> int | None:
    """Acquire or renew (``pack``, ``generation``, ``owner``, ``lease_s``); the token, or ``None``
    when another holder has it or the authority does not admit the legacy path."""
    cur = await conn.execute(SCHEDULER_LEASE_ACQUIRE, params)
    row = await cur.fetchone()
    return int(row[0]) if row is not None else None


async def scheduler_lease_release(conn: Conn, params: dict[str, Any]) -> None:
    await conn.execute(SCHEDULER_LEASE_RELEASE, params)


async def scheduler_lease_revoke(conn: Conn, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """``(previous holder, was active, new token)``."""
    cur = await conn.execute(SCHEDULER_LEASE_REVOKE, params)
    return await cur.fetchone()


async def scheduler_lease_get(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, SCHEDULER_LEASE_GET, params)


# --------------------------------------------------------------------------------------------------
# Pack install: a new generation is bound WorkItem-owned by its install receipt
# (connector.common.packs.install; the receipt is ``cutover_receipt_insert`` of kind ``install``)
# --------------------------------------------------------------------------------------------------

CLAIM_AUTHORITY_INSERT = """
INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase, cutover_receipt_id,
                                       paused_queue_classes)
VALUES (%(id)s, %(generation)s, 'work_item', 'work_item_active', %(receipt_id)s,
        coalesce((SELECT array_agg(p.queue_class ORDER BY p.queue_class) FROM connector_pause p
                  WHERE p.installed_pack_id = %(id)s), '{}'))
"""


async def claim_authority_insert(conn: Conn, pack: int, generation: int, receipt_id: int) -> None:
    """The authority row of a newly installed generation: WorkItem path, ``work_item_active``, with
    the pack's pauses projected (``store.pauses``: a pause covers every generation of the pack)."""
    await conn.execute(
        CLAIM_AUTHORITY_INSERT, {"id": pack, "generation": generation, "receipt_id": receipt_id}
    )


# --------------------------------------------------------------------------------------------------
# The admin API's cutover state: per generation its authority, open fences and what the gates wait
# for; the cutover receipts. ``params``: ``pack`` (None: every pack).
# --------------------------------------------------------------------------------------------------


# The live claim-capable processes of a generation ``g`` (GetCutoverState), by the gates' own rules:
# a WorkItem executor whose claim admission names a receipt of the generation, or that declares none
# (an older build claims every admitted generation; gate 4, ``processes.PROCESS_LIST_ADMITTING``);
# a legacy Event executor scoped to the generation (service ``executor-legacy:<pack>:<generation>``,
# ``legacy.service.service_scope``) or to none (gate 2, ``processes.PROCESS_LIST_LEGACY_FRESH``).
CLAIMERS_WORK_ITEM_OF_GENERATION = """(pr.admitted_receipt_ids IS NULL OR EXISTS (
            SELECT 1 FROM connector_cutover_receipt r
            WHERE r.cutover_receipt_id = ANY (pr.admitted_receipt_ids)
              AND r.installed_pack_id = g.installed_pack_id AND r.generation = g.generation))"""
CLAIMERS_LEGACY_OF_GENERATION = """(
            pr.service = 'executor-legacy:' || g.installed_pack_id || ':' || g.generation
            OR pr.service NOT LIKE 'executor-legacy:%%')"""


def cutover_state_list_sql(pack: int | None) -> str:
    return f"""
SELECT g.installed_pack_id, g.generation, g.status,
       (p.active_generation IS NOT DISTINCT FROM g.generation) AS active,
       a.claim_path, a.phase,
       (SELECT count(*) FROM connector_rollback_fence f
        WHERE f.installed_pack_id = g.installed_pack_id AND f.generation = g.generation
          AND f.status = 'open') AS open_fences,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
          AND w.state = 'awaiting_legacy_outcome') AS awaiting_legacy_outcome,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
          AND w.state = 'processing') AS processing,
       (SELECT count(*) FROM connector_work_item w
        WHERE w.installed_pack_id = g.installed_pack_id AND w.generation = g.generation
          AND w.state = 'awaiting_legacy_outcome'
          AND w.legacy_outcome_receipt_version IS NOT NULL) AS awaiting_legacy_unknown,
       (SELECT count(*) FROM connector_event e
        WHERE e.installed_pack_id = g.installed_pack_id AND e.generation = g.generation
          AND e.legacy_state IN ('pending', 'retry')) AS legacy_pending,
       (SELECT count(*) FROM connector_event e
        WHERE e.installed_pack_id = g.installed_pack_id AND e.generation = g.generation
          AND e.legacy_state = 'processing') AS legacy_in_flight,
       (SELECT count(*) FROM connector_legacy_outcome_receipt o
        WHERE NOT o.projected AND o.installed_pack_id = g.installed_pack_id
          AND o.generation = g.generation) AS unprojected_legacy_receipts,
       (SELECT count(*) FROM connector_process pr
        WHERE pr.claim_capability = 'work_item'
          AND pr.heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8)
          AND {CLAIMERS_WORK_ITEM_OF_GENERATION}) AS work_item_claim_processes,
       (SELECT count(*) FROM connector_process pr
        WHERE pr.claim_capability = 'legacy_event'
          AND pr.heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8)
          AND {CLAIMERS_LEGACY_OF_GENERATION}) AS legacy_event_claim_processes,
       a.version AS authority_version, a.rollback_fence_id, a.cutover_receipt_id
FROM connector_pack_generation g
JOIN connector_installed_pack p ON p.installed_pack_id = g.installed_pack_id
LEFT JOIN connector_claim_authority a
  ON a.installed_pack_id = g.installed_pack_id AND a.generation = g.generation
WHERE {pack_filter("g", pack)}
ORDER BY g.installed_pack_id, g.generation
"""


def cutover_receipt_list_sql(pack: int | None) -> str:
    return f"""
SELECT r.cutover_receipt_id, r.installed_pack_id, r.generation, r.kind, r.claim_path, r.proof_sha256,
       r.actor, r.created_at
FROM connector_cutover_receipt r
WHERE {pack_filter("r", pack)}
ORDER BY r.installed_pack_id, r.generation, r.cutover_receipt_id
"""


async def cutover_state_list(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, cutover_state_list_sql(params["pack"]), params)


async def cutover_receipt_list(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, cutover_receipt_list_sql(params["pack"]), params)
