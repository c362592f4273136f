"""Every statement on ``connector_installed_pack``, ``connector_pack_generation`` and
``connector_route`` (DESIGN §2: the admin API installs and activates packs; the ingress and the
materializer read the active routes). ``connector.common.packs.install`` holds the install logic
(route versions, the install receipt) over these statements; the install receipt, the claim
authority row and the packs notification are store/authority.py's, the event count store/events.py's.

Joins held here: a generation's routes with its manifest (``route_latest_by_key``), routes of the
active generations, the active generation with its claim authority (``pack_list_active``,
``pack_active_check``; with its manifest and route keys for the replay checks:
``pack_active_get``) and the pack list with its route counts (``pack_list``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]


def pack_filter(alias: str, pack: int | None) -> str:
    """The condition scoping a statement to one pack (``%(pack)s``) on ``alias``, or none."""
    return f"{alias}.installed_pack_id = %(pack)s" if pack is not None else "true"


# --------------------------------------------------------------------------------------------------
# Active routes: the ingress route table (one row per route) and the materializer's route cache (one
# row per pack, with its claim authority and routes)
# --------------------------------------------------------------------------------------------------

# Routes of every active generation, a later generation last (it wins in the table).
ROUTE_LIST_ACTIVE = """
SELECT r.route_id, r.installed_pack_id, r.generation, r.namespace, r.route_key, r.route_version, r.config
FROM connector_route r
JOIN connector_pack_generation g USING (installed_pack_id, generation)
WHERE g.status = 'active'
ORDER BY r.namespace, r.route_key, r.generation
"""

# Active generation of every pack, its claim authority and routes (the materializer's route cache).
PACK_LIST_ACTIVE = """
SELECT p.installed_pack_id, p.name, p.namespace, p.incarnation, p.active_generation AS generation,
       g.manifest, a.claim_path, a.phase,
       coalesce(json_agg(json_build_object('route_id', r.route_id, 'route_key', r.route_key,
                                           'route_version', r.route_version, 'config', r.config)
                         ORDER BY r.route_key) FILTER (WHERE r.route_id IS NOT NULL), '[]'::json) AS routes
FROM connector_installed_pack p
JOIN connector_pack_generation g
  ON g.installed_pack_id = p.installed_pack_id AND g.generation = p.active_generation AND g.status = 'active'
LEFT JOIN connector_claim_authority a
  ON a.installed_pack_id = p.installed_pack_id AND a.generation = p.active_generation
LEFT JOIN connector_route r
  ON r.installed_pack_id = p.installed_pack_id AND r.generation = p.active_generation
GROUP BY p.installed_pack_id, g.manifest, a.claim_path, a.phase
"""


# The work types of every pack's active generation (the executor's sampler starts each one's outcome
# series at zero: a counter series born at its first increment shows Prometheus no increase).
PACK_WORK_TYPES_ACTIVE = """
SELECT p.installed_pack_id, wt.name
FROM connector_installed_pack p
JOIN connector_pack_generation g
  ON g.installed_pack_id = p.installed_pack_id AND g.generation = p.active_generation
CROSS JOIN LATERAL jsonb_object_keys(g.manifest -> 'work_types') AS wt(name)
"""


async def pack_work_types_active(conn: Conn) -> list[tuple[int, str]]:
    cur = await conn.execute(PACK_WORK_TYPES_ACTIVE)
    return [(int(r[0]), str(r[1])) for r in await cur.fetchall()]


async def route_list_active(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, ROUTE_LIST_ACTIVE)


async def pack_list_active(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, PACK_LIST_ACTIVE)


# --------------------------------------------------------------------------------------------------
# Materializer: the snapshot check of a batch, route snapshots of events (backfill)
# --------------------------------------------------------------------------------------------------

# Pack rows and claim authority of the batch's namespaces, share-locked for the transaction: an
# activation or a cutover waits for the batch, and the batch sees one consistent snapshot.
PACK_ACTIVE_CHECK = """
SELECT p.namespace, p.installed_pack_id, p.incarnation, p.active_generation, a.claim_path, a.phase
FROM connector_installed_pack p
JOIN connector_claim_authority a
  ON a.installed_pack_id = p.installed_pack_id AND a.generation = p.active_generation
WHERE p.namespace = ANY(%(namespaces)b::text[])
FOR SHARE OF p, a
"""

ROUTE_GET_WITH_MANIFEST = """
SELECT r.route_id, r.route_version, r.route_key, r.config, g.manifest, p.name
FROM connector_route r
JOIN connector_pack_generation g USING (installed_pack_id, generation)
JOIN connector_installed_pack p USING (installed_pack_id)
WHERE r.route_id = ANY(%(ids)s::bigint[])
"""


async def pack_active_check(conn: Conn, namespaces: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """Share-lock the packs (and claim authorities) of ``namespaces``; their current snapshots."""
    cur = await conn.execute(PACK_ACTIVE_CHECK, {"namespaces": sorted(set(namespaces))}, prepare=True)
    return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), r[4], r[5]) for r in await cur.fetchall()}


async def route_get_with_manifest(conn: Conn, route_ids: Iterable[int]) -> list[dict[str, Any]]:
    """Route rows by id with their generation's manifest and pack name (any generation)."""
    return await fetch_dicts(conn, ROUTE_GET_WITH_MANIFEST, {"ids": sorted(route_ids)})


# --------------------------------------------------------------------------------------------------
# Install, activate, list (the admin API and the CLIs through connector.common.packs.install; the pack
# row is locked first, so concurrent applies of one pack serialize)
# --------------------------------------------------------------------------------------------------

PACK_GET_FOR_UPDATE = """
SELECT installed_pack_id, name, namespace, incarnation, active_generation
FROM connector_installed_pack WHERE name = %(name)s FOR UPDATE
"""
PACK_INSERT = """
INSERT INTO connector_installed_pack (name, namespace) VALUES (%(name)s, %(namespace)s)
ON CONFLICT DO NOTHING
RETURNING installed_pack_id, name, namespace, incarnation, active_generation
"""
PACK_NAMESPACE_OWNER = "SELECT name FROM connector_installed_pack WHERE namespace = %(namespace)s"
PACK_GENERATION_LATEST = """
SELECT generation, status, manifest_sha256 FROM connector_pack_generation
WHERE installed_pack_id = %(id)s ORDER BY generation DESC LIMIT 1
"""
PACK_GENERATION_INSERT = """
INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest, manifest_sha256)
VALUES (%(id)s, %(generation)s, 'staged', %(manifest)s, %(sha)s)
"""
# The latest earlier occurrence of each route key, with the manifest of its generation.
ROUTE_LATEST_BY_KEY = """
SELECT DISTINCT ON (r.route_key) r.route_key, r.route_version, r.generation, g.manifest
FROM connector_route r
JOIN connector_pack_generation g USING (installed_pack_id, generation)
WHERE r.installed_pack_id = %(id)s
ORDER BY r.route_key, r.generation DESC
"""
ROUTE_INSERT_BATCH = """
INSERT INTO connector_route (installed_pack_id, generation, namespace, route_key, route_version, config,
                             config_sha256)
SELECT %(id)s, %(generation)s, %(namespace)s, k, v, c::jsonb, h
FROM unnest(%(keys)s::text[], %(versions)s::int[], %(configs)s::text[], %(hashes)s::text[]) AS t(k, v, c, h)
RETURNING route_id, route_key, route_version
"""
ROUTE_LIST_GENERATION = """
SELECT route_id, route_key, route_version FROM connector_route
WHERE installed_pack_id = %(id)s AND generation = %(generation)s ORDER BY route_key
"""
PACK_GENERATION_GET = """
SELECT status FROM connector_pack_generation WHERE installed_pack_id = %(id)s AND generation = %(generation)s
"""
PACK_GENERATION_RETIRE_ACTIVE = """
UPDATE connector_pack_generation SET status = 'retired'
WHERE installed_pack_id = %(id)s AND status = 'active' AND generation <> %(generation)s
"""
PACK_GENERATION_SET_ACTIVE = """
UPDATE connector_pack_generation SET status = 'active', activated_at = now()
WHERE installed_pack_id = %(id)s AND generation = %(generation)s
"""
PACK_SET_ACTIVE_GENERATION = """
UPDATE connector_installed_pack SET active_generation = %(generation)s, updated_at = now()
WHERE installed_pack_id = %(id)s
"""
PACK_LIST = """
SELECT p.installed_pack_id, p.name, p.namespace, p.incarnation, p.active_generation,
       g.generation, g.status, g.manifest_sha256, g.created_at, g.activated_at,
       (SELECT count(*) FROM connector_route r
        WHERE r.installed_pack_id = g.installed_pack_id AND r.generation = g.generation) AS route_count
FROM connector_installed_pack p
LEFT JOIN connector_pack_generation g ON g.installed_pack_id = p.installed_pack_id
ORDER BY p.name, g.generation
"""


# The active generation of packs, with its manifest, claim authority and route keys (the replay
# checks); in a mutation share-locked so an activation cannot commit before the replay does.
_PACK_ACTIVE = """
SELECT p.installed_pack_id, p.incarnation, p.active_generation,
       g.manifest, g.manifest_sha256,
       a.claim_path, a.phase, a.cutover_receipt_id,
       ARRAY(SELECT rt.route_key FROM connector_route rt
             WHERE rt.installed_pack_id = p.installed_pack_id AND rt.generation = p.active_generation)
         AS route_keys
FROM connector_installed_pack p
LEFT JOIN connector_pack_generation g
  ON g.installed_pack_id = p.installed_pack_id AND g.generation = p.active_generation
LEFT JOIN connector_claim_authority a
  ON a.installed_pack_id = p.installed_pack_id AND a.generation = p.active_generation
WHERE p.installed_pack_id = ANY(%(packs)s::bigint[])
"""
PACK_ACTIVE_GET = _PACK_ACTIVE
PACK_ACTIVE_GET_FOR_SHARE = _PACK_ACTIVE + " FOR SHARE OF p"


async def pack_get_for_update(conn: Conn, name: str) -> dict[str, Any] | None:
    """The pack named ``name``, locked for the transaction."""
    return await fetch_dict(conn, PACK_GET_FOR_UPDATE, {"name": name})


async def pack_insert(conn: Conn, name: str, namespace: str) -> dict[str, Any] | None:
    """A new pack row, or ``None`` when the name or the namespace exists (a concurrent insert of the
    same name waits on the unique index, then conflicts)."""
    return await fetch_dict(conn, PACK_INSERT, {"name": name, "namespace": namespace})


async def pack_namespace_owner(conn: Conn, namespace: str) -> str | None:
    row = await fetch_dict(conn, PACK_NAMESPACE_OWNER, {"namespace": namespace})
    return None if row is None else str(row["name"])


async def pack_generation_latest(conn: Conn, pack: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, PACK_GENERATION_LATEST, {"id": pack})


async def pack_generation_insert(conn: Conn, pack: int, generation: int, manifest: Any, sha: str) -> None:
    """A ``staged`` generation; ``manifest`` is the document (``Jsonb``)."""
    params = {"id": pack, "generation": generation, "manifest": manifest, "sha": sha}
    await conn.execute(PACK_GENERATION_INSERT, params)


async def route_latest_by_key(conn: Conn, pack: int) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, ROUTE_LATEST_BY_KEY, {"id": pack})


async def route_insert_batch(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    """One route row per key (``id``, ``generation``, ``namespace`` and the ``keys``, ``versions``,
    ``configs``, ``hashes`` arrays); returns their ids and versions."""
    return await fetch_dicts(conn, ROUTE_INSERT_BATCH, params)


async def route_list_generation(conn: Conn, pack: int, generation: int) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, ROUTE_LIST_GENERATION, {"id": pack, "generation": generation})


async def pack_generation_get(conn: Conn, pack: int, generation: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, PACK_GENERATION_GET, {"id": pack, "generation": generation})


async def pack_generation_retire_active(conn: Conn, pack: int, generation: int) -> None:
    """The pack's active generation other than ``generation`` becomes ``retired``."""
    await conn.execute(PACK_GENERATION_RETIRE_ACTIVE, {"id": pack, "generation": generation})


async def pack_generation_set_active(conn: Conn, pack: int, generation: int) -> None:
    await conn.execute(PACK_GENERATION_SET_ACTIVE, {"id": pack, "generation": generation})


async def pack_set_active_generation(conn: Conn, pack: int, generation: int) -> None:
    await conn.execute(PACK_SET_ACTIVE_GENERATION, {"id": pack, "generation": generation})


async def pack_list(conn: Conn) -> list[dict[str, Any]]:
    """Every pack with each of its generations (one row per generation; a pack without any: one row
    with NULL generation columns), by pack name and generation."""
    return await fetch_dicts(conn, PACK_LIST)


async def _pack_active(conn: Conn, statement: str, packs: Sequence[int]) -> dict[int, dict[str, Any]]:
    rows = await fetch_dicts(conn, statement, {"packs": list(packs)})
    return {int(r["installed_pack_id"]): r for r in rows}


async def pack_active_get(conn: Conn, packs: Sequence[int]) -> dict[int, dict[str, Any]]:
    return await _pack_active(conn, PACK_ACTIVE_GET, packs)


async def pack_active_get_for_share(conn: Conn, packs: Sequence[int]) -> dict[int, dict[str, Any]]:
    return await _pack_active(conn, PACK_ACTIVE_GET_FOR_SHARE, packs)


PACK_EXISTS = "SELECT 1 FROM connector_installed_pack WHERE installed_pack_id = %(pack)s"


async def pack_exists(conn: Conn, pack: int) -> bool:
    cur = await conn.execute(PACK_EXISTS, {"pack": pack})
    return await cur.fetchone() is not None


PACK_GENERATION_MANIFEST = """
SELECT g.manifest, p.name FROM connector_pack_generation g
JOIN connector_installed_pack p ON p.installed_pack_id = g.installed_pack_id
WHERE g.installed_pack_id = %(pack)s AND g.generation = %(generation)s
"""

PACK_NAMES = "SELECT installed_pack_id, name FROM connector_installed_pack"


async def pack_generation_manifest(conn: Conn, pack: int, generation: int) -> tuple[Any, str] | None:
    cur = await conn.execute(PACK_GENERATION_MANIFEST, {"pack": pack, "generation": generation})
    row = await cur.fetchone()
    return None if row is None else (row[0], str(row[1]))


async def pack_names(conn: Conn) -> dict[int, str]:
    cur = await conn.execute(PACK_NAMES)
    return {int(r[0]): str(r[1]) for r in await cur.fetchall()}
