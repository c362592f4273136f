"""ApplyPack, ListPacks and ActivateGeneration over the pack store."""

from __future__ import annotations

import json

import grpc
import yaml

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

from .conftest import OPERATOR, REPLAY, VIEW, Admin, Seed, expect_error, manifest


def _doc(name: str = "shop", routes: dict[str, list[str]] | None = None, **kw) -> str:
    return yaml.safe_dump(manifest(name, name, routes, **kw))


async def _apply(admin: Admin, text: str, **kw) -> pb.ApplyPackResponse:
    return await admin.stub.ApplyPack(pb.ApplyPackRequest(manifest=text, **kw), metadata=Admin.md(OPERATOR))


async def test_apply_list_activate(admin: Admin, seed: Seed) -> None:
    first = await _apply(admin, _doc(), activate=True, request_id="apply-1")
    pack_id = first.pack.installed_pack_id
    assert first.generation == 1 and first.pack.name == "shop" and first.pack.active_generation == 1
    assert [(g.generation, g.status, g.route_count) for g in first.pack.generations] == [(1, "active", 1)]
    assert await _apply(admin, _doc(), activate=True, request_id="apply-1") == first  # AIP-155

    # The same manifest again installs nothing (idempotent apply); a changed one stages generation 2.
    again = await _apply(admin, _doc())
    assert again.generation == 1
    second = await _apply(admin, _doc(routes={"orders": ["sync"], "refunds": ["sync"]}))
    assert second.generation == 2
    assert [(g.generation, g.status) for g in second.pack.generations] == [(1, "active"), (2, "staged")]
    assert second.pack.active_generation == 1

    activated = await admin.stub.ActivateGeneration(
        pb.ActivateGenerationRequest(installed_pack_id=pack_id, generation=2, request_id="act-1"),
        metadata=Admin.md(OPERATOR),
    )
    assert activated.pack.active_generation == 2
    assert [(g.generation, g.status) for g in activated.pack.generations] == [(1, "retired"), (2, "active")]
    assert all(g.HasField("create_time") for g in activated.pack.generations)

    listed = await admin.stub.ListPacks(pb.ListPacksRequest(), metadata=Admin.md(VIEW))
    assert [(p.name, p.active_generation) for p in listed.packs] == [("shop", 2)]

    # The new generation is WorkItem-owned (install receipt + authority), as cutover status shows.
    state = await admin.stub.GetCutoverState(
        pb.GetCutoverStateRequest(installed_pack_id=pack_id), metadata=Admin.md(VIEW)
    )
    assert [(g.generation, g.claim_path, g.active) for g in state.generations] == [
        (1, types_pb2.CLAIM_PATH_WORK_ITEM, False),
        (2, types_pb2.CLAIM_PATH_WORK_ITEM, True),
    ]
    assert [r.kind for r in state.generations[1].receipts] == ["install"]
    assert state.generations[1].receipts[0].actor.startswith("admin key:")


async def test_replay_follows_a_generation_applied_through_the_api(admin: Admin, seed: Seed) -> None:
    applied = await _apply(admin, _doc(), activate=True)
    pack_id = applied.pack.installed_pack_id
    work_id = await seed.item(pack_id, generation=1)
    await _apply(admin, _doc(queue_class="fast"), activate=True)
    response = await admin.stub.ReplayWorkItem(
        pb.ReplayWorkItemRequest(work_id=work_id), metadata=Admin.md(REPLAY)
    )
    assert response.work_item.generation == 2 and response.work_item.queue_class == "fast"


async def test_invalid_manifest(admin: Admin, seed: Seed) -> None:
    bad = json.dumps({"name": "Shop!", "namespace": "shop", "work_types": {}, "routes": []})
    exc = await expect_error(_apply(admin, bad), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MANIFEST")
    assert "name" in (exc.details() or "")
    checked = await _apply(admin, bad, validate_only=True)
    assert len(checked.errors) >= 2 and not checked.HasField("pack")
    valid = await _apply(admin, _doc(), validate_only=True)
    assert list(valid.errors) == [] and not valid.HasField("pack")
    await expect_error(_apply(admin, "{not yaml: ["), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MANIFEST")
    await expect_error(
        _apply(admin, _doc(), validate_only=True, activate=True), grpc.StatusCode.INVALID_ARGUMENT
    )
    listed = await admin.stub.ListPacks(pb.ListPacksRequest(), metadata=Admin.md(VIEW))
    assert list(listed.packs) == []  # nothing installed


async def test_store_refusals(admin: Admin, seed: Seed) -> None:
    applied = await _apply(admin, _doc("shop"))
    taken = yaml.safe_dump(manifest("other", "shop"))
    await expect_error(_apply(admin, taken), grpc.StatusCode.FAILED_PRECONDITION, "NAMESPACE_TAKEN")

    async def activate(pack: int, generation: int) -> None:
        await admin.stub.ActivateGeneration(
            pb.ActivateGenerationRequest(installed_pack_id=pack, generation=generation),
            metadata=Admin.md(OPERATOR),
        )

    await expect_error(activate(9999, 1), grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    await expect_error(activate(applied.pack.installed_pack_id, 7), grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    await expect_error(activate(0, 1), grpc.StatusCode.INVALID_ARGUMENT)


async def test_list_packs_pages_by_name(admin: Admin, seed: Seed) -> None:
    for name in ("delta", "alpha", "charlie", "bravo"):
        await _apply(admin, _doc(name))
    names: list[str] = []
    token = ""
    while True:
        page = await admin.stub.ListPacks(
            pb.ListPacksRequest(page_size=3, page_token=token), metadata=Admin.md(VIEW)
        )
        names.extend(p.name for p in page.packs)
        token = page.next_page_token
        if not token:
            break
    assert names == ["alpha", "bravo", "charlie", "delta"]
