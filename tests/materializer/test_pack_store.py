"""Pack store: generations with versioned routes, WorkItem-owned installs, atomic activation with a
notification, idempotent re-apply, and concurrent applies without duplicate generations."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import psycopg
import pytest

from connector.common.packs import install
from connector.common.packs.document import parse_manifest
from connector.common.packs.install import PackStoreError
from connector.common.packs.routes import RouteCache

from .conftest import apply, manifest, rows, scalar, work_type


def _two_routes(**sync: Any) -> dict[str, Any]:
    doc = manifest(work_types={"sync": work_type(**sync), "audit": work_type()})
    doc["routes"].append(
        {"key": "refunds", "verification": {"scheme": "none"}, "fan_out": [{"work_type": "audit"}]}
    )
    return doc


async def test_apply_installs_a_work_item_owned_generation_and_activation_is_explicit(adb) -> None:
    applied = await apply(adb, _two_routes(), activate=False)
    assert (applied.generation, applied.status, applied.created_pack) == (1, "staged", True)
    assert [(r.route_key, r.route_version, r.change) for r in applied.routes] == [
        ("orders", 1, "new"),
        ("refunds", 1, "new"),
    ]
    assert await scalar(adb, "SELECT active_generation FROM connector_installed_pack") is None
    authority = await rows(
        adb,
        """SELECT a.claim_path, a.phase, c.kind, c.claim_path, c.proof->>'events_in_generation'
           FROM connector_claim_authority a JOIN connector_cutover_receipt c USING (cutover_receipt_id)""",
    )
    assert authority == [("work_item", "work_item_active", "install", "work_item", "0")]
    # The install receipt is an immutable proof.
    with pytest.raises(psycopg.errors.RestrictViolation):
        await adb.execute("UPDATE connector_cutover_receipt SET actor = 'x'")

    await install.pack_generation_activate(adb, applied.installed_pack_id, 1)
    packs = await install.pack_list(adb)
    assert [(p.name, p.active_generation, [g.status for g in p.generations]) for p in packs] == [
        ("shop", 1, ["active"])
    ]
    assert packs[0].generations[0].route_count == 2


async def test_route_versions_follow_effective_config_changes(adb) -> None:
    first = await apply(adb, _two_routes())
    # Same manifest again: nothing new is installed.
    again = await apply(adb, _two_routes())
    assert (again.generation, again.created_generation) == (first.generation, False)
    # A change in a work type that only `orders` fans out to bumps `orders` only.
    second = await apply(adb, _two_routes(queue_class="urgent"))
    assert second.generation == 2
    assert {r.route_key: (r.route_version, r.change) for r in second.routes} == {
        "orders": (2, "changed"),
        "refunds": (1, "unchanged"),
    }
    # Back to the first config: a new version (versions never go back), refunds still unchanged.
    third = await apply(adb, _two_routes())
    assert {r.route_key: r.route_version for r in third.routes} == {"orders": 3, "refunds": 1}
    statuses = await rows(adb, "SELECT generation, status FROM connector_pack_generation ORDER BY 1")
    assert statuses == [(1, "retired"), (2, "retired"), (3, "active")]
    stored = await scalar(
        adb, "SELECT config FROM connector_route WHERE generation = 3 AND route_key = 'orders'"
    )
    assert stored == parse_manifest(_two_routes()).routes[0].model_dump(mode="json")


async def test_activation_is_atomic_and_notifies(adb, db_url: str) -> None:
    applied = await apply(adb, manifest(), activate=True)
    second = await apply(adb, manifest(work_types={"sync": work_type(priority=3)}), activate=False)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN connector_packs")
        await install.pack_generation_activate(adb, applied.installed_pack_id, second.generation)
        notes = listener.notifies(timeout=5.0, stop_after=1)
        got = [n.channel async for n in notes]
    assert got == ["connector_packs"]
    assert await rows(adb, "SELECT generation, status FROM connector_pack_generation ORDER BY 1") == [
        (1, "retired"),
        (2, "active"),
    ]
    cache = RouteCache()
    await cache.refresh(adb)
    pack = cache.pack("shop")
    assert pack is not None and pack.generation == 2
    assert pack.routes["orders"].work_types["sync"].priority == 3
    # Activating a retired generation again is allowed (config rollback); unknown ones are refused.
    await install.pack_generation_activate(adb, applied.installed_pack_id, 1)
    assert await scalar(adb, "SELECT active_generation FROM connector_installed_pack") == 1
    with pytest.raises(PackStoreError) as info:
        await install.pack_generation_activate(adb, applied.installed_pack_id, 9)
    assert info.value.reason == "not_found"


async def test_concurrent_applies_of_one_pack_make_distinct_generations(db_url: str) -> None:
    docs = [manifest(work_types={"sync": work_type(priority=i)}) for i in range(6)]
    conns = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in docs]
    try:
        applies = [
            install.pack_apply(c, parse_manifest(d), activate=False, actor="t")
            for c, d in zip(conns, docs, strict=True)
        ]
        results = await asyncio.gather(*applies)
        generations = sorted(r.generation for r in results)
        assert generations == [1, 2, 3, 4, 5, 6]
        assert sum(r.created_pack for r in results) == 1
        assert await scalar(conns[0], "SELECT count(*) FROM connector_installed_pack") == 1
        assert await scalar(conns[0], "SELECT count(*) FROM connector_claim_authority") == 6
    finally:
        for c in conns:
            await c.close()


async def test_namespace_belongs_to_one_pack(adb) -> None:
    await apply(adb, manifest())
    other = copy.deepcopy(manifest(name="other"))
    with pytest.raises(PackStoreError) as info:
        await apply(adb, other)
    assert info.value.reason == "namespace_taken"
    moved = manifest(namespace="elsewhere")
    with pytest.raises(PackStoreError) as info:
        await apply(adb, moved)
    assert info.value.reason == "namespace_changed"
    assert await scalar(adb, "SELECT count(*) FROM connector_pack_generation") == 1
