"""Every statement on ``connector_installed_pack``, ``connector_pack_generation`` and
``connector_route`` (DESIGN §2: the admin API installs and activates packs; the ingress and the
materializer read the active routes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

Conn = AsyncConnection[Any]

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


async def route_list_active(conn: Conn) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(ROUTE_LIST_ACTIVE)
        return await cur.fetchall()


async def pack_list_active(conn: Conn) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(PACK_LIST_ACTIVE)
    return await cur.fetchall()


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
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(ROUTE_GET_WITH_MANIFEST, {"ids": sorted(route_ids)})
    return await cur.fetchall()
