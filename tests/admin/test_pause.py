"""PausePack / ResumePack: a durable pause of a pack or a queue class that every claim statement
honours (the projection on the claim authority rows), visible in GetQueueStats, audited, idempotent,
with dry runs and AIP-155 request ids; the pause waits for the claims in flight."""

from __future__ import annotations

import asyncio
import logging

import grpc
import psycopg
import pytest
import yaml

from connector.common.store import pauses, work_items
from connector.v1 import admin_service_pb2 as pb

from .conftest import OPERATOR, REPLAY, VIEW, Admin, Seed, expect_error, manifest


async def _pause(
    admin: Admin, pack: int, queue_class: str = "", *, reason: str = "provider outage", **kw: object
) -> pb.PausePackResponse:
    return await admin.stub.PausePack(
        pb.PausePackRequest(installed_pack_id=pack, queue_class=queue_class, reason=reason, **kw),  # type: ignore[arg-type]
        metadata=Admin.md(OPERATOR),
    )


async def _resume(admin: Admin, pack: int, queue_class: str = "", **kw: object) -> pb.ResumePackResponse:
    return await admin.stub.ResumePack(
        pb.ResumePackRequest(installed_pack_id=pack, queue_class=queue_class, **kw),  # type: ignore[arg-type]
        metadata=Admin.md(OPERATOR),
    )


async def _claim(conn: psycopg.AsyncConnection, pack: int, qc: str = "default", n: int = 10) -> list[int]:
    rows = await work_items.claim.work_item_claim_batch(conn, [pack], [qc], [n], owner="t", lease_s=30)
    return [int(r[0]) for r in rows]


async def test_a_paused_pack_is_not_claimed_until_resumed(
    admin: Admin, seed: Seed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pack = await seed.pack()
    other = await seed.pack("crm")
    a = [await seed.item(pack, state="pending") for _ in range(3)]
    b = await seed.item(other, state="pending")
    assert await _claim(seed.conn, pack, n=1) == [a[0]]  # control: claimable before the pause
    response = await _pause(admin, pack, request_id="pause-1")
    assert response.changed and response.pause.queue_class == "*" and response.pause.actor.startswith("key:")
    assert response.pause.reason == "provider outage" and response.pause.request_id == "pause-1"
    assert await _claim(seed.conn, pack) == []
    assert await _claim(seed.conn, other) == [b]  # other packs are not affected
    groups = {
        (g.pack, g.queue_class): g.paused for g in await work_items.claim.work_item_ready_groups(seed.conn)
    }
    assert groups == {(pack, "default"): True}
    stats = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    assert [(p.installed_pack_id, p.queue_class, p.pack_name) for p in stats.pauses] == [(pack, "*", "shop")]
    assert {(q.installed_pack_id, q.queue_class): q.paused for q in stats.queues}[(pack, "")] is True
    assert {(q.installed_pack_id, q.queue_class): q.paused for q in stats.queues}[(other, "")] is False
    resumed = await _resume(admin, pack)
    assert resumed.changed and resumed.pause.reason == "provider outage"
    assert sorted(await _claim(seed.conn, pack)) == a[1:]
    assert await pauses.pause_projection_mismatches(seed.conn) == []
    [paused] = [r for r in caplog.records if r.getMessage() == "pack paused"]
    assert paused.event == "pack_paused" and paused.pack == "shop" and paused.queue_class == "*"  # type: ignore[attr-defined]
    assert paused.request_id == "pause-1" and paused.actor.startswith("key:")  # type: ignore[attr-defined]
    [line] = [r for r in caplog.records if r.getMessage() == "pack resumed"]
    assert line.event == "pack_resumed"  # type: ignore[attr-defined]


async def test_a_paused_queue_class_leaves_the_others(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack(routes={"orders": ["sync", "bulk"]})
    await seed.generation(pack, 2, routes={"orders": ["sync"]}, queue_class="slow", activate=False)
    fast = await seed.item(pack, state="pending")
    slow = await seed.item(pack, state="pending", queue_class="slow")
    await expect_error(_pause(admin, pack, "nope"), grpc.StatusCode.INVALID_ARGUMENT, "QUEUE_CLASS_UNKNOWN")
    assert (await _pause(admin, pack, "slow")).pause.queue_class == "slow"
    assert await _claim(seed.conn, pack, "slow") == []
    assert await _claim(seed.conn, pack, "default") == [fast]
    stats = await admin.stub.GetQueueStats(
        pb.GetQueueStatsRequest(installed_pack_id=pack), metadata=Admin.md(VIEW)
    )
    by = {q.queue_class: q.paused for q in stats.queues}
    assert by[""] is False and by["slow"] is True
    await _resume(admin, pack, "slow")
    assert await _claim(seed.conn, pack, "slow") == [slow]


async def test_pause_is_idempotent_and_dry_runs_change_nothing(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    dry = await _pause(admin, pack, dry_run=True, request_id="ignored")
    assert dry.dry_run and dry.changed and dry.pause.queue_class == "*"
    assert await seed.one("SELECT count(*) FROM connector_pause") == 0
    assert await seed.one("SELECT count(*) FROM connector_admin_request") == 0
    first = await _pause(admin, pack, reason="first")
    again = await _pause(admin, pack, reason="second")
    assert (
        not again.changed
        and again.pause.reason == "first"
        and again.pause.pause_time == first.pause.pause_time
    )
    assert (await _pause(admin, pack, reason="x", request_id="r1")) == (
        await _pause(admin, pack, reason="x", request_id="r1")
    )
    dry_resume = await _resume(admin, pack, dry_run=True)
    assert dry_resume.changed and dry_resume.dry_run
    assert await seed.one("SELECT count(*) FROM connector_pause") == 1
    assert (await _resume(admin, pack)).changed
    assert not (await _resume(admin, pack)).changed


async def test_pause_refusals(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    await expect_error(_pause(admin, 10**9), grpc.StatusCode.NOT_FOUND, "PACK_NOT_FOUND")
    await expect_error(_pause(admin, 0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    await expect_error(_pause(admin, pack, reason=""), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    for call in (
        admin.stub.PausePack(
            pb.PausePackRequest(installed_pack_id=pack, reason="x"), metadata=Admin.md(REPLAY)
        ),
        admin.stub.ResumePack(pb.ResumePackRequest(installed_pack_id=pack), metadata=Admin.md(REPLAY)),
    ):
        await expect_error(call, grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")
    assert await seed.one("SELECT count(*) FROM connector_pause") == 0


async def test_a_new_generation_inherits_the_pause(admin: Admin, seed: Seed) -> None:
    """The projection is filled for an authority row made after the pause (pack apply)."""
    doc = yaml.safe_dump(manifest("applied", "applied", None))
    applied = await admin.stub.ApplyPack(
        pb.ApplyPackRequest(manifest=doc, activate=True), metadata=Admin.md()
    )
    pack = applied.pack.installed_pack_id
    await _pause(admin, pack)
    doc2 = yaml.safe_dump(manifest("applied", "applied", {"orders": ["sync", "more"]}))
    await admin.stub.ApplyPack(pb.ApplyPackRequest(manifest=doc2, activate=True), metadata=Admin.md())
    paused = await seed.one(
        "SELECT array_agg(paused_queue_classes::text ORDER BY generation) FROM connector_claim_authority"
        " WHERE installed_pack_id = %s",
        (pack,),
    )
    assert paused == ["{*}", "{*}"]
    assert await pauses.pause_projection_mismatches(seed.conn) == []


async def test_the_pause_waits_for_claims_in_flight_and_later_claims_see_it(
    admin: Admin, seed: Seed, db_url: str
) -> None:
    """No claim commits after the pause has committed: the pause's update of the authority rows waits
    for every claim transaction holding them FOR SHARE; a claim arriving later either joins before the
    pause commits (and commits first: the pause waits for it too) or re-reads the paused row."""
    pack = await seed.pack()
    ids = [await seed.item(pack, state="pending") for _ in range(6)]
    async with (
        await psycopg.AsyncConnection.connect(db_url) as t1,
        await psycopg.AsyncConnection.connect(db_url) as t2,
    ):
        assert await _claim(t1, pack, n=1) == [ids[0]]  # in flight: uncommitted
        call = asyncio.ensure_future(_pause(admin, pack))
        await _wait_lock_waiter(seed)
        task2 = asyncio.ensure_future(_claim(t2, pack, n=1))
        # t2 either joins t1's share lock at once (it finishes) or queues behind the pause (it waits).
        for _ in range(500):
            if task2.done() or await _waits(seed, t2.info.backend_pid):
                break
            await asyncio.sleep(0.01)
        assert not call.done()  # the pause waits while t1 holds the authority row
        await t1.commit()
        if task2.done():  # joined before the pause: the pause waits for its commit too
            assert task2.result() == [ids[1]]
            await _wait_lock_waiter(seed)  # the pause waits on, for t2 now
            assert not call.done()
            await t2.commit()
            response = await call
        else:  # queued behind the pause: re-reads the paused row after the pause commits
            response = await call
            assert await task2 == []
            await t2.commit()
        assert response.changed
    assert await _claim(seed.conn, pack) == []


async def _waits(seed: Seed, pid: int | None) -> bool:
    """Whether backend ``pid`` (None: any session of this database) waits on a lock."""
    n = await seed.one(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database() AND (%s::int IS NULL OR pid = %s::int)",
        (pid, pid),
    )
    return bool(n)


async def _wait_lock_waiter(seed: Seed) -> None:
    for _ in range(500):
        if await _waits(seed, None):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing waited on a lock")
