"""ListFailureGroups (the console's incident list) and the bulk replay of a selection or a group:
dead letters grouped by pack, work type, failure class and summary, failed receipts by namespace,
route, error class and summary; ReplayDeadLetters by failure summary and by explicit work ids, its dry
run naming the lanes, its worklist in lane order."""

from __future__ import annotations

import asyncio

import grpc

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc

from .conftest import OPERATOR, REPLAY, VIEW, Admin, Seed, expect_error


async def _summary(seed: Seed, work_id: int, summary: str, failure_class: str = "handler_error") -> None:
    await seed.conn.execute(
        "UPDATE connector_work_item SET failure_summary = %s, failure_class = %s WHERE work_id = %s",
        (summary, failure_class, work_id),
    )


async def test_dead_letters_and_failed_receipts_are_grouped(admin: Admin, seed: Seed) -> None:
    shop = await seed.pack("shop")
    crm = await seed.pack("crm")
    timeouts = [await seed.item(shop, finished_ago_s=100 - i) for i in range(5)]
    for w in timeouts:
        await _summary(seed, w, "timed out after 30 s", "timeout")
    refused = [await seed.item(shop, finished_ago_s=50) for _ in range(2)]
    other = await seed.item(crm, finished_ago_s=5)
    await seed.item(shop, state="pending")  # not a dead letter
    for _ in range(3):
        await seed.receipt(
            "shop", "orders", status="failed", error_class="required_missing", error_summary="no id"
        )
    await seed.receipt("crm", "orders", status="failed", error_class="bad_json", error_summary="not json")
    groups = await admin.stub.ListFailureGroups(pb.ListFailureGroupsRequest(), metadata=Admin.md(VIEW))
    got = [
        (g.pack_name, g.work_type, g.failure_class, g.failure_summary, g.count, g.sample_work_id)
        for g in groups.dead_letters
    ]
    assert got == [
        ("shop", "sync", "timeout", "timed out after 30 s", 5, max(timeouts)),
        ("shop", "sync", "handler_error", "handler raised ValueError", 2, max(refused)),
        ("crm", "sync", "handler_error", "handler raised ValueError", 1, other),
    ]
    first = groups.dead_letters[0]
    assert first.first_time.ToDatetime() < first.last_time.ToDatetime()
    assert [(g.namespace, g.error_class, g.count) for g in groups.receipt_failures] == [
        ("shop", "required_missing", 3),
        ("crm", "bad_json", 1),
    ]
    assert not groups.truncated
    one = await admin.stub.ListFailureGroups(
        pb.ListFailureGroupsRequest(installed_pack_id=crm, scan_limit=1), metadata=Admin.md(VIEW)
    )
    assert [g.count for g in one.dead_letters] == [1] and [g.namespace for g in one.receipt_failures] == [
        "crm"
    ]
    assert not one.truncated
    small = await admin.stub.ListFailureGroups(
        pb.ListFailureGroupsRequest(installed_pack_id=shop, scan_limit=3, page_size=1),
        metadata=Admin.md(VIEW),
    )
    # the newest 3 of shop: the 2 refused ones and the newest timeout; the most frequent group first
    assert small.truncated and [(g.failure_class, g.count) for g in small.dead_letters] == [
        ("handler_error", 2)
    ]
    # Pages (AIP-158): one group of each kind per page, in the same order as the whole answer.
    pages, token = [], ""
    while True:
        page = await admin.stub.ListFailureGroups(
            pb.ListFailureGroupsRequest(page_size=1, page_token=token), metadata=Admin.md(VIEW)
        )
        pages.append(([g.count for g in page.dead_letters], [g.count for g in page.receipt_failures]))
        token = page.next_page_token
        if not token:
            break
    assert pages == [([5], [3]), ([2], [1]), ([1], [])]
    first_page = await admin.stub.ListFailureGroups(
        pb.ListFailureGroupsRequest(page_size=1), metadata=Admin.md(VIEW)
    )
    await expect_error(  # a token is bound to the filters it was issued for
        admin.stub.ListFailureGroups(
            pb.ListFailureGroupsRequest(
                page_size=1, installed_pack_id=crm, page_token=first_page.next_page_token
            ),
            metadata=Admin.md(VIEW),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    await expect_error(
        admin.stub.ListFailureGroups(
            pb.ListFailureGroupsRequest(page_token="x.y.z"), metadata=Admin.md(VIEW)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    await expect_error(
        admin.stub.ListFailureGroups(pb.ListFailureGroupsRequest(scan_limit=-1), metadata=Admin.md(VIEW)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    await expect_error(
        admin.stub.ListFailureGroups(pb.ListFailureGroupsRequest(), metadata=Admin.md(REPLAY)),
        grpc.StatusCode.PERMISSION_DENIED,
        "ROLE_REQUIRED",
    )


async def _drain(admin: Admin, request: pb.ReplayDeadLettersRequest) -> pb.ReplayDeadLettersResponse:
    last = None
    async for message in admin.stub.ReplayDeadLetters(request, metadata=Admin.md(OPERATOR)):
        last = message
    assert last is not None and last.done
    return last


async def test_bulk_replay_of_a_group_or_a_selection(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    lane_a = [await seed.item(pack, source_lane="sync:a") for _ in range(3)]
    lane_b = [await seed.item(pack, source_lane="sync:b") for _ in range(2)]
    loose = await seed.item(pack)
    for w in lane_b:
        await _summary(seed, w, "refused by crm")
    # the dry run of a group: how many, which lanes
    dry = await _drain(
        admin,
        pb.ReplayDeadLettersRequest(installed_pack_id=pack, failure_summary="refused by crm", dry_run=True),
    )
    assert (dry.total, dry.eligible, dry.lanes, list(dry.lane_keys)) == (2, 2, 1, ["sync:b"])
    everything = await _drain(admin, pb.ReplayDeadLettersRequest(installed_pack_id=pack, dry_run=True))
    assert (everything.total, everything.lanes, list(everything.lane_keys)) == (6, 2, ["sync:a", "sync:b"])
    # a selection (must match the filter too): only those items
    picked = [lane_a[0], loose, 999_999]
    done = await _drain(
        admin, pb.ReplayDeadLettersRequest(installed_pack_id=pack, work_ids=picked, request_id="pick-1")
    )
    assert (done.total, done.replayed) == (2, 2)
    states = {w: await seed.state(w) for w in [*lane_a, *lane_b, loose]}
    assert states[lane_a[0]] == "pending" and states[loose] == "pending"
    assert [states[w] for w in lane_a[1:] + lane_b] == ["dead"] * 4
    # the group replay: the summary filter holds
    done = await _drain(
        admin, pb.ReplayDeadLettersRequest(installed_pack_id=pack, failure_summary="refused by crm")
    )
    assert done.replayed == 2 and [await seed.state(w) for w in lane_b] == ["pending", "blocked"]
    await expect_error(
        _drain(admin, pb.ReplayDeadLettersRequest(installed_pack_id=pack, work_ids=[0])),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    await expect_error(
        _drain(admin, pb.ReplayDeadLettersRequest(installed_pack_id=pack, work_ids=list(range(1, 1003)))),
        grpc.StatusCode.INVALID_ARGUMENT,
    )


async def test_bulk_replay_goes_in_lane_order_across_batches(db_url: str, seed: Seed) -> None:
    """The worklist is in lane order (delivery_seq, work_id), not id order: with batches of 10, the
    first batch replays the 10 earliest members of the lane even when their ids are the highest (here
    delivery order is the reverse of id order). Under the `continue` dead-head policy a later member
    replayed first would run first. Control: id order would have picked the other ten."""
    from .conftest import start_admin

    running = await start_admin(db_url, replay_batch_size=10, bulk_replay_concurrency=1)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}")
    try:
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        pack = await seed.pack(dead_head="continue")
        ids = [await seed.item(pack, source_lane="sync:o-1", dead_blocks=False) for _ in range(20)]
        await seed.conn.execute(
            "UPDATE connector_work_item SET delivery_seq = 1000 - work_id WHERE work_id = ANY(%s)", (ids,)
        )
        call = stub.ReplayDeadLetters(
            pb.ReplayDeadLettersRequest(installed_pack_id=pack, rate_limit=10), metadata=Admin.md(OPERATOR)
        )
        first = await call.read()
        assert first.replayed == 10 and not first.done
        call.cancel()
        for _ in range(500):
            if not running.api.servicer._bulk_slots.locked():
                break
            await asyncio.sleep(0.01)
        replayed = {w for w in ids if await seed.state(w) != "dead"}
        earliest = set(sorted(ids, key=lambda w: 1000 - w)[:10])  # lane order: the highest ids
        by_id = set(sorted(ids)[:10])
        assert earliest != by_id  # the control: the two orders pick different items here
        assert replayed == earliest
    finally:
        await channel.close()
        await running.stop()


async def test_groups_follow_the_generations_failure_owner(admin: Admin, seed: Seed) -> None:
    """Issue #28 item 4: a generation the legacy path owns (a rollback receipt admits it) has no
    WorkItem dead-letter groups — its failures are the legacy path's (ListDeadLetters lists those) —
    so a group never leads to an empty dead-letter list; the WorkItem-owned pack's stay grouped."""
    shop = await seed.pack("shop")
    crm = await seed.pack("crm", claim_path="legacy_event")
    kept = await seed.item(shop, finished_ago_s=5)
    await seed.item(crm, finished_ago_s=5)  # the WorkItem period's dead item of a legacy-owned pack
    groups = await admin.stub.ListFailureGroups(pb.ListFailureGroupsRequest(), metadata=Admin.md(VIEW))
    assert [(g.pack_name, g.count, g.sample_work_id) for g in groups.dead_letters] == [("shop", 1, kept)]
    listed = await admin.stub.ListDeadLetters(pb.ListDeadLettersRequest(), metadata=Admin.md(VIEW))
    assert [d.work_item.work_id for d in listed.dead_letters] == [kept]
