"""Pack install over the store: apply a manifest as a new generation, activate a generation, list
packs (docs/packs.md, "Generations, activation, versions"). The materializer's cache of active routes
is ``packs.routes``.

Contract: every function takes a connection and runs its own transaction (a savepoint inside the
caller's). ``pack_apply`` locks the pack row (concurrent applies of one pack serialize), installs
the generation WorkItem-owned (an ``install`` cutover receipt and a claim authority row) with one
route row per route, keeping a route's version while its effective config is unchanged; re-applying
the latest manifest installs nothing. ``pack_generation_activate`` retires the previous generation,
activates this one and notifies ``connector_packs`` in one transaction. The statements are
store/packs.py's (and store/authority.py's, store/events.py's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from connector.common.core.refusal import Refused
from connector.common.packs.manifest import (
    Manifest,
    canonical_json,
    route_effective_config,
    sha256_hex,
)
from connector.common.store import authority, events
from connector.common.store import packs as store_packs

log = logging.getLogger(__name__)


class PackStoreError(Refused):
    """A refused pack operation. ``reason`` is machine-readable (``not_found``, ``namespace_taken``,
    ``namespace_changed``, ``no_claim_authority``); the message is safe to show."""


@dataclass(frozen=True, slots=True)
class AppliedRoute:
    route_key: str
    route_id: int
    route_version: int
    #: ``new`` (first time this key exists), ``changed`` (version incremented) or ``unchanged``.
    change: str


@dataclass(frozen=True, slots=True)
class AppliedPack:
    installed_pack_id: int
    name: str
    namespace: str
    incarnation: int
    generation: int
    manifest_sha256: str
    #: The pack row was created by this apply.
    created_pack: bool
    #: A new generation was installed (False: the manifest equals the latest generation's).
    created_generation: bool
    #: Status of ``generation`` after the apply: ``staged``, ``active`` or ``retired``.
    status: str
    routes: tuple[AppliedRoute, ...]
    cutover_receipt_id: int | None


@dataclass(frozen=True, slots=True)
class PackGenerationInfo:
    generation: int
    status: str
    manifest_sha256: str
    created_at: datetime
    activated_at: datetime | None
    route_count: int


@dataclass(frozen=True, slots=True)
class PackInfo:
    installed_pack_id: int
    name: str
    namespace: str
    incarnation: int
    active_generation: int | None
    generations: tuple[PackGenerationInfo, ...]


# --------------------------------------------------------------------------------------------------
# Apply / activate / list
# --------------------------------------------------------------------------------------------------


async def pack_apply(
    conn: AsyncConnection[Any], manifest: Manifest, *, activate: bool, actor: str
) -> AppliedPack:
    """Install ``manifest`` as a new generation of its pack (created on first apply); with
    ``activate``, activate it in the same transaction. Re-applying the latest generation's manifest
    creates nothing (and activates that generation when asked)."""
    document = manifest.model_dump(mode="json")
    manifest_sha = sha256_hex(document)
    async with conn.transaction():
        pack, created_pack = await _pack_lock_or_create(conn, manifest)
        pack_id = int(pack["installed_pack_id"])
        latest = await store_packs.pack_generation_latest(conn, pack_id)
        if latest is not None and latest["manifest_sha256"] == manifest_sha:
            generation = int(latest["generation"])
            routes = tuple(
                AppliedRoute(r["route_key"], int(r["route_id"]), int(r["route_version"]), "unchanged")
                for r in await store_packs.route_list_generation(conn, pack_id, generation)
            )
            created_generation, receipt_id, status = False, None, str(latest["status"])
        else:
            generation = (int(latest["generation"]) if latest is not None else 0) + 1
            await store_packs.pack_generation_insert(conn, pack_id, generation, Jsonb(document), manifest_sha)
            routes = await _routes_insert(conn, pack_id, generation, manifest)
            receipt_id = await _install_receipt(conn, pack_id, generation, manifest, manifest_sha, actor)
            created_generation, status = True, "staged"
        if activate and status != "active":
            await pack_generation_activate(conn, pack_id, generation)
            status = "active"
    return AppliedPack(
        installed_pack_id=pack_id,
        name=str(pack["name"]),
        namespace=str(pack["namespace"]),
        incarnation=int(pack["incarnation"]),
        generation=generation,
        manifest_sha256=manifest_sha,
        created_pack=created_pack,
        created_generation=created_generation,
        status=status,
        routes=routes,
        cutover_receipt_id=receipt_id,
    )


async def _pack_lock_or_create(conn: AsyncConnection[Any], manifest: Manifest) -> tuple[dict[str, Any], bool]:
    pack = await store_packs.pack_get_for_update(conn, manifest.name)
    created = False
    if pack is None:
        # A concurrent apply of the same new pack waits here on the unique index, then finds it.
        pack = await store_packs.pack_insert(conn, manifest.name, manifest.namespace)
        created = pack is not None
        if pack is None:
            pack = await store_packs.pack_get_for_update(conn, manifest.name)
    if pack is None:
        owner = await store_packs.pack_namespace_owner(conn, manifest.namespace)
        raise PackStoreError(
            "namespace_taken",
            f"namespace {manifest.namespace!r} belongs to pack {owner if owner else '?'!r}",
        )
    if pack["namespace"] != manifest.namespace:
        raise PackStoreError(
            "namespace_changed",
            f"pack {manifest.name!r} is installed with namespace {pack['namespace']!r}; the namespace of an"
            " installed pack cannot change (install a new pack instead)",
        )
    return pack, created


async def _routes_insert(
    conn: AsyncConnection[Any], pack_id: int, generation: int, manifest: Manifest
) -> tuple[AppliedRoute, ...]:
    previous: dict[str, tuple[int, str | None]] = {}
    manifests: dict[int, Manifest | None] = {}
    for row in await store_packs.route_latest_by_key(conn, pack_id):
        gen = int(row["generation"])
        if gen not in manifests:
            manifests[gen] = _manifest_or_none(row["manifest"])
        old = manifests[gen]
        old_route = old.route(row["route_key"]) if old is not None else None
        old_hash = sha256_hex(route_effective_config(old, old_route)) if old and old_route else None
        previous[row["route_key"]] = (int(row["route_version"]), old_hash)
    keys, versions, configs, hashes, changes = [], [], [], [], {}
    for route in manifest.routes:
        effective = sha256_hex(route_effective_config(manifest, route))
        prior = previous.get(route.key)
        if prior is None:
            version, change = 1, "new"
        elif prior[1] == effective:
            version, change = prior[0], "unchanged"
        else:
            version, change = prior[0] + 1, "changed"
        config = route.model_dump(mode="json")
        keys.append(route.key)
        versions.append(version)
        configs.append(canonical_json(config))
        hashes.append(sha256_hex(config))
        changes[route.key] = change
    rows = await store_packs.route_insert_batch(
        conn,
        {
            "id": pack_id,
            "generation": generation,
            "namespace": manifest.namespace,
            "keys": keys,
            "versions": versions,
            "configs": configs,
            "hashes": hashes,
        },
    )
    return tuple(
        sorted(
            (
                AppliedRoute(
                    r["route_key"], int(r["route_id"]), int(r["route_version"]), changes[r["route_key"]]
                )
                for r in rows
            ),
            key=lambda r: r.route_key,
        )
    )


def _manifest_or_none(raw: Any) -> Manifest | None:
    try:
        return Manifest.model_validate(raw)
    except ValidationError:
        return None  # an older generation this code cannot read: its routes count as changed


async def _install_receipt(
    conn: AsyncConnection[Any],
    pack_id: int,
    generation: int,
    manifest: Manifest,
    manifest_sha: str,
    actor: str,
) -> int:
    events_in_generation, legacy_active = await events.event_count_generation(conn, pack_id, generation)
    proof = {
        "kind": "install",
        "statement": "new generation installed WorkItem-owned: no event of it exists, so no legacy Event "
        "claim, lease or transaction can exist and there is nothing to drain",
        "pack": manifest.name,
        "namespace": manifest.namespace,
        "generation": generation,
        "manifest_sha256": manifest_sha,
        "claim_path": "work_item",
        "events_in_generation": events_in_generation,
        "legacy_active_events": legacy_active,
    }
    receipt_id = await authority.cutover_receipt_insert(
        conn,
        pack=pack_id,
        generation=generation,
        kind="install",
        claim_path="work_item",
        proof=proof,
        proof_sha256=sha256_hex(proof),
        actor=actor,
    )
    await authority.claim_authority_insert(conn, pack_id, generation, receipt_id)
    return receipt_id


async def pack_generation_activate(
    conn: AsyncConnection[Any], installed_pack_id: int, generation: int
) -> None:
    """Make ``generation`` the active one, atomically (previous active → retired), and notify
    ``connector_packs`` in the same transaction. Activating the active generation changes nothing."""
    async with conn.transaction():
        pack = await authority.pack_lock(conn, {"pack": installed_pack_id})
        if pack is None:
            raise PackStoreError("not_found", f"pack {installed_pack_id} does not exist")
        gen = await store_packs.pack_generation_get(conn, installed_pack_id, generation)
        if gen is None:
            raise PackStoreError("not_found", f"pack {pack['name']!r} has no generation {generation}")
        if await authority.claim_authority_get(conn, installed_pack_id, generation) is None:
            raise PackStoreError(
                "no_claim_authority",
                f"generation {generation} of pack {pack['name']!r} has no claim authority; it cannot be"
                " activated",
            )
        if pack["active_generation"] == generation and gen["status"] == "active":
            return
        await store_packs.pack_generation_retire_active(conn, installed_pack_id, generation)
        await store_packs.pack_generation_set_active(conn, installed_pack_id, generation)
        await store_packs.pack_set_active_generation(conn, installed_pack_id, generation)
        await authority.authority_notify(conn)


async def pack_list(conn: AsyncConnection[Any]) -> list[PackInfo]:
    """Every installed pack with its generations (oldest first)."""
    packs: dict[int, tuple[dict[str, Any], list[PackGenerationInfo]]] = {}
    for row in await store_packs.pack_list(conn):
        pack_id = int(row["installed_pack_id"])
        entry = packs.setdefault(pack_id, (row, []))
        if row["generation"] is not None:
            entry[1].append(
                PackGenerationInfo(
                    generation=int(row["generation"]),
                    status=str(row["status"]),
                    manifest_sha256=str(row["manifest_sha256"]),
                    created_at=row["created_at"],
                    activated_at=row["activated_at"],
                    route_count=int(row["route_count"]),
                )
            )
    return [
        PackInfo(
            installed_pack_id=pack_id,
            name=str(row["name"]),
            namespace=str(row["namespace"]),
            incarnation=int(row["incarnation"]),
            active_generation=row["active_generation"],
            generations=tuple(gens),
        )
        for pack_id, (row, gens) in packs.items()
    ]
