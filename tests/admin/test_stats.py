"""GetQueueStats, ListBlockedLanes and GetCutoverState — and EXPLAIN proof that every admin read
uses indexes, not a scan of connector_work_item, on a sizeable table."""

from __future__ import annotations

import json
from typing import Any

import grpc
import psycopg
import pytest

from connector.common.store import authority, receipts, work_items
from connector.executor.admin import servicer as servicer_module
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

from .conftest import VIEW, Admin, Seed, expect_error

# --- GetQueueStats --------------------------------------------------------------------------------


async def test_queue_stats_per_rate_limit_key(admin: Admin, seed: Seed) -> None:
    """Each rate-limit key with its limit, the budget left now (GCRA: burst minus what ``tat`` is
    ahead of now, in emission intervals), when the next claim may go, and its waiting and in-flight
    items; a pack filter applies; more keys than shown say so."""
    pack = await seed.pack(routes={"orders": ["sync"]})
    other = await seed.pack("crm")
    waiting = [await seed.item(pack, state="pending") for _ in range(3)]
    busy = await seed.item(pack, state="processing")
    await seed.item(pack, state="succeeded")
    await seed.conn.execute(
        "UPDATE connector_work_item SET rate_key = 'acct:1' WHERE work_id = ANY(%s)", ([*waiting, busy],)
    )
    # acct:1: 10 per 200 s, burst 4, tat 40 s ahead: 4 - 40 / 20 = 2 claims left now (refilling at
    # 0.05 per second: the time the call takes does not matter).
    # acct:2: 1 per 60 s, tat 90 s ahead: no budget; the next claim in 90 - 0 = 90 s.
    await seed.conn.execute(
        """INSERT INTO connector_rate_limit (installed_pack_id, rate_key, work_type, limit_n, period_s,
             burst, tat) VALUES (%s, 'acct:1', 'sync', 10, 200, 4, clock_timestamp() + interval '40 s'),
                                (%s, 'acct:2', 'sync', 1, 60, 1, clock_timestamp() + interval '90 s'),
                                (%s, 'crm', 'sync', 5, 1, 1, now())""",
        (pack, pack, other),
    )
    response = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    rows = {(r.installed_pack_id, r.key): r for r in response.rate_limits}
    assert list(rows) == [(pack, "acct:1"), (pack, "acct:2"), (other, "crm")]
    a1 = rows[(pack, "acct:1")]
    assert (a1.pack_name, a1.work_type, a1.limit, a1.burst) == ("shop", "sync", 10, 4)
    assert a1.period.ToTimedelta().total_seconds() == 200.0
    assert a1.budget == pytest.approx(2.0, abs=0.1)
    assert a1.next_claim_in.ToTimedelta().total_seconds() == 0
    assert (a1.waiting, a1.in_flight) == (3, 1)
    a2 = rows[(pack, "acct:2")]
    assert a2.budget == 0 and 85 < a2.next_claim_in.ToTimedelta().total_seconds() <= 90
    assert (a2.waiting, a2.in_flight) == (0, 0)
    assert not response.rate_limits_truncated
    only = await admin.stub.GetQueueStats(
        pb.GetQueueStatsRequest(installed_pack_id=other), metadata=Admin.md(VIEW)
    )
    assert [r.key for r in only.rate_limits] == ["crm"]
    await seed.conn.execute(
        """INSERT INTO connector_rate_limit (installed_pack_id, rate_key, work_type, limit_n, period_s, burst)
           SELECT %s, 'many:' || i, 'sync', 1, 1, 1 FROM generate_series(1, 200) i""",
        (pack,),
    )
    full = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    assert len(full.rate_limits) == 200 and full.rate_limits_truncated


async def test_queue_stats_receipts_scoped_to_the_pack(admin: Admin, seed: Seed) -> None:
    """With a pack, the receipt counts are those of the pack's namespace (its routes): a failed,
    unrouted or routing receipt of another namespace is not counted (#24: `stats --pack X` showed
    every namespace's failures); without one, every receipt."""
    shop = await seed.pack("shop", routes={"orders": ["sync"]})
    crm = await seed.pack("crm", routes={"contacts": ["sync"]})
    await seed.receipt("shop", "orders", status="failed", error_class="required_missing")
    await seed.receipt("crm", "contacts", status="failed", error_class="required_missing")
    await seed.receipt("crm", "contacts", status="failed", error_class="parse_error")
    await seed.receipt("crm", "contacts", status="pending")
    await seed.receipt("crm", "contacts", status="routing")

    async def counts(pack: int) -> tuple[int, int, int]:
        r = await admin.stub.GetQueueStats(
            pb.GetQueueStatsRequest(installed_pack_id=pack), metadata=Admin.md(VIEW)
        )
        return r.receipts_failed, r.receipts_unrouted, r.receipts_routing

    assert await counts(shop) == (1, 0, 0)
    assert await counts(crm) == (2, 1, 1)
    assert await counts(0) == (3, 1, 1)


async def test_queue_stats_per_concurrency_key(admin: Admin, seed: Seed) -> None:
    """Each concurrency key with its limit, the slots its row counts, and its items due, parked
    (``run_after = '9999-01-01 00:00:00+00'``) and in flight."""
    pack = await seed.pack(routes={"orders": ["sync"]})
    due = [await seed.item(pack, state="pending") for _ in range(2)]
    parked = [await seed.item(pack, state="pending") for _ in range(3)]
    busy = await seed.item(pack, state="processing")
    await seed.conn.execute(
        "UPDATE connector_work_item SET concurrency_key = 'acct:1' WHERE work_id = ANY(%s)",
        ([*due, *parked, busy],),
    )
    await seed.conn.execute(
        "UPDATE connector_work_item SET run_after = '9999-01-01 00:00:00+00' WHERE work_id = ANY(%s)",
        (parked,),
    )
    await seed.conn.execute(
        """INSERT INTO connector_concurrency_limit (installed_pack_id, concurrency_key, work_type,
             max_in_flight, in_flight) VALUES (%s, 'acct:1', 'sync', 3, 1), (%s, 'acct:2', 'sync', 1, 0)""",
        (pack, pack),
    )
    response = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    rows = {c.key: c for c in response.concurrency}
    assert list(rows) == ["acct:1", "acct:2"] and not response.concurrency_truncated
    c1 = rows["acct:1"]
    assert (c1.pack_name, c1.work_type, c1.limit, c1.slots_taken) == ("shop", "sync", 3, 1)
    assert (c1.waiting, c1.parked, c1.in_flight) == (2, 3, 1)
    c2 = rows["acct:2"]
    assert (c2.limit, c2.slots_taken, c2.waiting, c2.parked, c2.in_flight) == (1, 0, 0, 0, 0)


async def test_queue_stats(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack(routes={"orders": ["sync", "bulk"]})
    other = await seed.pack("crm")
    for _ in range(3):
        await seed.item(pack, state="pending")
    await seed.item(pack, state="pending", work_type="bulk", queue_class="slow")
    await seed.item(pack, state="retry", queue_class="slow")
    for _ in range(2):
        await seed.item(pack, state="processing")
    await seed.item(pack, state="processing", queue_class="slow", source_lane="l1")
    await seed.item(pack, state="blocked", source_lane="l1")
    await seed.item(pack, state="dead", finished_ago_s=30)
    await seed.item(pack, state="dead", finished_ago_s=3600)  # outside the rate window
    await seed.item(pack, state="succeeded")
    await seed.item(pack, state="awaiting_legacy_outcome")
    await seed.item(other, state="pending")
    # Not yet due: counts as ready, not due.
    future = await seed.item(pack, state="pending")
    await seed.conn.execute(
        "UPDATE connector_work_item SET run_after = now() + interval '1 hour' WHERE work_id = %s", (future,)
    )
    await seed.receipt(status="pending")
    await seed.receipt(status="retry")
    await seed.receipt(status="routing")
    await seed.receipt(status="failed")
    await seed.process("work_item")
    await seed.process("work_item", age_s=120)  # stale heartbeat
    await seed.process("legacy_event")

    response = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    rows = {(q.installed_pack_id, q.queue_class): q for q in response.queues}
    assert list(rows) == [(pack, ""), (pack, "default"), (pack, "slow"), (other, ""), (other, "default")]

    total = rows[(pack, "")]
    assert total.pack_name == "shop"
    assert dict(total.depth_by_state) == {
        "pending": 5,
        "blocked": 1,
        "processing": 3,
        "retry": 1,
        "dead": 2,
        "awaiting_legacy_outcome": 1,
    }
    assert total.in_flight == 3
    assert total.due == 5  # 4 due pending + 1 retry; the future one is not due
    assert total.dead_rate == pytest.approx(1 / 300)
    assert total.retry_rate == pytest.approx(1 / 300)
    assert total.oldest_ready_age.ToTimedelta().total_seconds() >= 1.0

    default = rows[(pack, "default")]
    assert dict(default.depth_by_state) == {"ready": 4, "processing": 2}
    assert default.due == 3 and default.in_flight == 2
    slow = rows[(pack, "slow")]
    assert dict(slow.depth_by_state) == {"ready": 2, "processing": 1}
    assert slow.due == 2

    assert response.receipts_unrouted == 2
    assert response.receipts_routing == 1
    assert response.receipts_failed == 1
    assert response.oldest_unrouted_age.ToTimedelta().total_seconds() >= 0
    assert response.active_claimants == 1

    only = await admin.stub.GetQueueStats(
        pb.GetQueueStatsRequest(installed_pack_id=other), metadata=Admin.md(VIEW)
    )
    assert {(q.installed_pack_id, q.queue_class) for q in only.queues} == {(other, ""), (other, "default")}
    await expect_error(
        admin.stub.GetQueueStats(pb.GetQueueStatsRequest(installed_pack_id=12345), metadata=Admin.md(VIEW)),
        grpc.StatusCode.NOT_FOUND,
        "PACK_NOT_FOUND",
    )
    # The keys view (the console's Lanes page) counts nothing: no queue rows, receipt counts zero;
    # the pauses, keys and circuits are the full view's.
    await seed.conn.execute(
        "INSERT INTO connector_pause (installed_pack_id, queue_class, reason, actor)"
        " VALUES (%s, '*', 'INC-1', 'test')",
        (pack,),
    )
    full = await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
    keys = await admin.stub.GetQueueStats(
        pb.GetQueueStatsRequest(view=pb.QUEUE_STATS_VIEW_KEYS), metadata=Admin.md(VIEW)
    )
    assert not keys.queues
    assert (keys.receipts_unrouted, keys.receipts_failed, keys.active_claimants) == (0, 0, 0)
    assert [p.reason for p in keys.pauses] == [p.reason for p in full.pauses] == ["INC-1"]
    assert full.queues and full.receipts_failed == 1  # control: the full view counts
    await expect_error(
        admin.stub.GetQueueStats(pb.GetQueueStatsRequest(view=7), metadata=Admin.md(VIEW)),  # type: ignore[arg-type]
        grpc.StatusCode.INVALID_ARGUMENT,
    )


# --- ListBlockedLanes -----------------------------------------------------------------------------


async def test_blocked_lanes(admin: Admin, seed: Seed, monkeypatch: pytest.MonkeyPatch) -> None:
    pack = await seed.pack()
    other = await seed.pack("crm")
    dead_head = await seed.item(pack, state="dead", source_lane="o:1")
    await seed.item(pack, state="blocked", source_lane="o:1")
    await seed.item(pack, state="blocked", source_lane="o:1")
    retry_head = await seed.item(pack, state="retry", target_lane="acct:1")
    await seed.item(pack, state="blocked", target_lane="acct:1")
    # A dead member whose policy lets the lane continue holds nothing.
    await seed.item(pack, state="dead", source_lane="o:2", dead_blocks=False)
    await seed.item(pack, state="pending", source_lane="o:2")
    # A healthy lane and a dead member behind a running head.
    await seed.item(pack, state="pending", source_lane="o:3")
    await seed.item(pack, state="processing", source_lane="o:4")
    await seed.item(pack, state="dead", source_lane="o:4")
    fenced = await seed.item(pack, state="awaiting_legacy_outcome", source_lane="o:5")
    other_head = await seed.item(other, state="dead", target_lane="acct:1")

    response = await admin.stub.ListBlockedLanes(pb.ListBlockedLanesRequest(), metadata=Admin.md(VIEW))
    got = [(b.installed_pack_id, b.kind, b.lane_key, b.head.work_id, b.waiting) for b in response.lanes]
    assert got == [
        (pack, pb.LANE_KIND_SOURCE, "o:1", dead_head, 2),
        (pack, pb.LANE_KIND_SOURCE, "o:5", fenced, 0),
        (pack, pb.LANE_KIND_TARGET_MUTATION, "acct:1", retry_head, 1),
        (other, pb.LANE_KIND_TARGET_MUTATION, "acct:1", other_head, 0),
    ]
    assert response.lanes[0].head.state == types_pb2.WORK_ITEM_STATE_DEAD
    assert response.lanes[2].head.state == types_pb2.WORK_ITEM_STATE_RETRY

    walked: list[tuple[int, str]] = []
    token = ""
    while True:
        page = await admin.stub.ListBlockedLanes(
            pb.ListBlockedLanesRequest(installed_pack_id=pack, page_size=1, page_token=token),
            metadata=Admin.md(VIEW),
        )
        walked.extend((b.kind, b.lane_key) for b in page.lanes)
        token = page.next_page_token
        if not token:
            break
    assert walked == [
        (pb.LANE_KIND_SOURCE, "o:1"),
        (pb.LANE_KIND_SOURCE, "o:5"),
        (pb.LANE_KIND_TARGET_MUTATION, "acct:1"),
    ]
    # A page reads at most LANES_SCAN lanes (one index descent each, blocked or not): with 2, the
    # pages end early (a token after the last lane read) and together list the same lanes, in order.
    monkeypatch.setattr(servicer_module, "LANES_SCAN", 2)
    short: list[tuple[int, int, str]] = []
    token, pages = "", 0
    while True:
        page = await admin.stub.ListBlockedLanes(
            pb.ListBlockedLanesRequest(page_size=100, page_token=token), metadata=Admin.md(VIEW)
        )
        pages += 1
        assert len(page.lanes) <= 2
        short.extend((b.installed_pack_id, b.kind, b.lane_key) for b in page.lanes)
        token = page.next_page_token
        if not token:
            break
    assert short == [(b.installed_pack_id, b.kind, b.lane_key) for b in response.lanes]
    assert pages >= 4  # 8 lanes holding members over two packs, 2 read per page
    monkeypatch.undo()
    page = await admin.stub.ListBlockedLanes(
        pb.ListBlockedLanesRequest(installed_pack_id=pack, page_size=1), metadata=Admin.md(VIEW)
    )
    await expect_error(
        admin.stub.ListBlockedLanes(
            pb.ListBlockedLanesRequest(page_token=page.next_page_token), metadata=Admin.md(VIEW)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PAGE_TOKEN_FILTER_MISMATCH",
    )


# --- GetCutoverState ------------------------------------------------------------------------------


async def test_cutover_state(admin: Admin, seed: Seed) -> None:
    pack = await seed.pack()
    other = await seed.pack("crm")
    await seed.generation(pack, 2, claim_path="none", activate=False)
    await seed.conn.execute(
        "INSERT INTO connector_rollback_fence (installed_pack_id, generation, status, fenced_work_items)"
        " VALUES (%s, 1, 'open', 2), (%s, 1, 'resolved', 1)",
        (pack, pack),
    )
    await seed.item(pack, state="awaiting_legacy_outcome")
    await seed.item(pack, state="awaiting_legacy_outcome")
    await seed.item(pack, state="processing")
    await seed.process("work_item")
    await seed.process("work_item")
    await seed.process("work_item", age_s=300)
    await seed.process("legacy_event")
    await seed.process("none")

    response = await admin.stub.GetCutoverState(
        pb.GetCutoverStateRequest(installed_pack_id=pack), metadata=Admin.md(VIEW)
    )
    assert [(g.installed_pack_id, g.generation) for g in response.generations] == [(pack, 1), (pack, 2)]
    g1, g2 = response.generations
    assert g1.claim_path == types_pb2.CLAIM_PATH_WORK_ITEM
    assert g1.phase == types_pb2.CUTOVER_PHASE_WORK_ITEM_ACTIVE
    assert [(r.kind, r.claim_path, r.actor) for r in g1.receipts] == [
        ("install", types_pb2.CLAIM_PATH_WORK_ITEM, "test")
    ]
    assert len(g1.receipts[0].proof_sha256) == 64 and g1.receipts[0].HasField("create_time")
    assert g1.open_rollback_fences == 1
    assert g1.awaiting_legacy_outcome == 2 and g1.processing == 1
    assert (g1.claim_capable_processes, g1.work_item_claim_processes, g1.legacy_event_claim_processes) == (
        3,
        2,
        1,
    )
    assert g1.generation_status == "active" and g1.active
    assert g2.claim_path == types_pb2.CLAIM_PATH_NONE and g2.phase == types_pb2.CUTOVER_PHASE_QUIESCING
    assert list(g2.receipts) == []
    assert g2.generation_status == "staged" and not g2.active

    everything = await admin.stub.GetCutoverState(pb.GetCutoverStateRequest(), metadata=Admin.md(VIEW))
    assert [(g.installed_pack_id, g.generation, g.active) for g in everything.generations] == [
        (pack, 1, True),
        (pack, 2, False),
        (other, 1, True),
    ]
    await expect_error(
        admin.stub.GetCutoverState(pb.GetCutoverStateRequest(installed_pack_id=999), metadata=Admin.md(VIEW)),
        grpc.StatusCode.NOT_FOUND,
        "PACK_NOT_FOUND",
    )


async def test_cutover_state_counts_each_generations_own_claimers(admin: Admin, seed: Seed) -> None:
    await claimers_per_generation(admin, seed)


async def test_control_the_registry_wide_count_fails_it(
    admin: Admin, seed: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the count as it was (every fresh claim-capable process, whatever it may claim)."""
    from connector.common.store import authority

    monkeypatch.setattr(authority, "CLAIMERS_WORK_ITEM_OF_GENERATION", "TRUE")
    monkeypatch.setattr(authority, "CLAIMERS_LEGACY_OF_GENERATION", "TRUE")
    with pytest.raises(AssertionError, match="own claimers"):
        await claimers_per_generation(admin, seed)


async def claimers_per_generation(admin: Admin, seed: Seed) -> None:
    """The claim-capable processes of a generation, by the gates' rules (#28 leftover: the count was
    the whole registry's for every generation): a WorkItem executor counts where its claim admission
    names a receipt of the generation (one declaring none, an older build, everywhere); a legacy
    executor where its service names the generation (one naming none, everywhere)."""
    from connector.executor.legacy.service import service_scope

    shop = await seed.pack()
    crm = await seed.pack("crm")
    await seed.generation(shop, 2, claim_path="none", activate=False)
    receipt = {
        (int(p), int(g)): int(r)
        for p, g, r in await (
            await seed.conn.execute(
                "SELECT installed_pack_id, generation, min(cutover_receipt_id) FROM connector_cutover_receipt"
                " GROUP BY 1, 2"
            )
        ).fetchall()
    }
    await seed.process("work_item", admitted=[receipt[(shop, 1)]])
    await seed.process("work_item", admitted=[receipt[(shop, 1)], receipt[(crm, 1)]])
    await seed.process("work_item", admitted=[])  # admits nothing now
    await seed.process("work_item", admitted=[receipt[(crm, 1)]], age_s=300)  # stale
    await seed.process("work_item")  # declares no admission: an older build
    await seed.process("legacy_event", service=service_scope(shop, 2))
    await seed.process("legacy_event", service=service_scope(crm, 1))
    await seed.process("legacy_event", service=service_scope(crm, 1), age_s=300)  # stale
    await seed.process("none")

    response = await admin.stub.GetCutoverState(pb.GetCutoverStateRequest(), metadata=Admin.md(VIEW))
    got = {
        (g.installed_pack_id, g.generation): (
            g.claim_capable_processes,
            g.work_item_claim_processes,
            g.legacy_event_claim_processes,
        )
        for g in response.generations
    }
    assert got == {(shop, 1): (3, 3, 0), (shop, 2): (2, 1, 1), (crm, 1): (3, 2, 1)}, (
        "each generation's own claimers"
    )


# --- plans ----------------------------------------------------------------------------------------


def _scans(plan: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            out.append((node["Node Type"], node["Relation Name"]))
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan[0]["Plan"])
    return out


BIG = ("connector_work_item", "connector_ingress_receipt")


@pytest.fixture
def big_queue(db: psycopg.Connection) -> psycopg.Connection:
    """50,000 WorkItems over two packs x two generations, in every state, plus 20,000 receipts."""
    db.execute(
        "ALTER TABLE connector_work_item DROP CONSTRAINT fk_connector_work_item_event_id_connector_event"
    )
    db.execute(
        "INSERT INTO connector_installed_pack (name, namespace, active_generation)"
        " VALUES ('a', 'a', 2), ('b', 'b', 2)"
    )
    db.execute(
        "INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,"
        " manifest_sha256)"
        " SELECT p, g, CASE g WHEN 2 THEN 'active' ELSE 'retired' END, '{}', 'x'"
        " FROM generate_series(1, 2) p, generate_series(1, 2) g"
    )
    db.execute(
        """
        INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, queue_class,
          state, delivery_seq, source_lane_key, target_mutation_lane_key, lease_owner, lease_until,
          finished_at, run_after, updated_at)
        SELECT i, 1 + i % 2, 1 + (i / 7) % 2, 'w', CASE WHEN i % 3 = 0 THEN 'slow' ELSE 'default' END, s,
          i, CASE WHEN i % 5 = 0 THEN 'lane:' || (i % 400) END,
          CASE WHEN i % 11 = 0 AND s <> 'processing' THEN 't:' || (i % 50) END,
          CASE WHEN s = 'processing' THEN 'x' END, CASE WHEN s = 'processing' THEN now() END,
          CASE WHEN s IN ('dead', 'succeeded') THEN now() - make_interval(secs => i % 900) END,
          now() - make_interval(secs => i % 60), now() - make_interval(secs => i % 900)
        FROM (SELECT i, CASE
                WHEN i % 100 < 80 THEN 'succeeded' WHEN i % 100 < 90 THEN 'pending'
                WHEN i % 100 < 92 THEN 'retry' WHEN i % 100 < 96 THEN 'dead'
                WHEN i % 100 < 97 THEN 'processing' WHEN i % 100 < 99 THEN 'blocked'
                ELSE 'awaiting_legacy_outcome' END AS s
              FROM generate_series(1, 50000) i) x
        """
    )
    db.execute(
        "INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method, received_at,"
        " payload_sha256, body, verification, router_status)"
        " SELECT 'a', 'r', 'k' || i, 'POST', now(), '\\x00', '\\x00', 'none',"
        " CASE WHEN i % 100 = 0 THEN 'failed' WHEN i % 100 = 1 THEN 'pending' ELSE 'materialized' END"
        " FROM generate_series(1, 20000) i"
    )
    db.execute("VACUUM ANALYZE connector_work_item")
    db.execute("VACUUM ANALYZE connector_ingress_receipt")
    db.execute("ANALYZE connector_installed_pack")
    db.execute("ANALYZE connector_pack_generation")
    return db


def _plans() -> list[tuple[str, str, dict[str, Any]]]:
    params = {"window": 300, "stale_s": 30.0, "limit": 51}
    out: list[tuple[str, str, dict[str, Any]]] = []
    for pack in (None, 1):
        p = {**params, "pack": pack}
        out += [
            ("depth", work_items.stats.work_item_stats_depth_sql(pack), p),
            ("rates", work_items.stats.work_item_stats_rates_sql(pack), p),
            ("classes", work_items.stats.work_item_stats_classes_sql(pack), p),
            ("processing", work_items.stats.work_item_stats_processing_sql(pack), p),
            *(
                (
                    f"lanes-{kind}-{after}",
                    work_items.stats.work_item_lanes_walk_sql(kind, after),
                    {**p, "pack": 1, "after": "lane:1", "scan": 1000},
                )
                for kind in (False, True)
                for after in (False, True)
            ),
            ("cutover", authority.cutover_state_list_sql(pack), p),
            ("receipts", receipts.admin.RECEIPT_STATS, p),  # pack: its namespace's receipts
        ]
    clauses, dparams = work_items.admin.DeadLetterFilter(installed_pack_id=1).where()
    out.append(
        (
            "dlq",
            f"SELECT w.work_id FROM connector_work_item w WHERE {' AND '.join(clauses)}"
            " ORDER BY w.finished_at DESC, w.work_id DESC LIMIT 51",
            dparams,
        )
    )
    return out


def test_admin_reads_use_indexes_on_a_sizeable_queue(big_queue: psycopg.Connection) -> None:
    for name, query, params in _plans():
        (plan,) = big_queue.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
        plan = plan if isinstance(plan, list) else json.loads(plan)
        scans = _scans(plan)
        assert scans, name
        seq = [s for s in scans if s[0] == "Seq Scan" and s[1] in BIG]
        assert not seq, f"{name}: {seq}"
        assert any(s[1] == "connector_work_item" or s[1] == "connector_ingress_receipt" for s in scans), name


def test_the_plan_check_can_fail(big_queue: psycopg.Connection) -> None:
    """Control: a stats query written naively (GROUP BY over the table) is caught."""
    (plan,) = big_queue.execute(
        "EXPLAIN (FORMAT JSON) SELECT installed_pack_id, queue_class, state, count(*)"
        " FROM connector_work_item GROUP BY 1, 2, 3"
    ).fetchone()
    assert ("Seq Scan", "connector_work_item") in _scans(plan)
