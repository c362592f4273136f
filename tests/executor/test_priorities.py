"""Priorities in the claim order (docs/adr/014-priorities.md) against a real database: a due item
ranks by ``due time - priority_head_s``; the claim takes the best-ranked due items of its group, so
a higher priority goes first through retries, delays and release, an item is never overtaken by one
that became due more than the head difference after it (the starvation bound), not-yet-due items
stay out whatever their priority, and lanes keep delivery order (only heads are ready).

Controls: the same items without heads are claimed in due order (so the ordering checks can fail).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from connector.common.packs.document import ManifestError, parse_manifest
from connector.common.packs.manifest import Manifest, priority_heads
from connector.common.store import work_items
from connector.common.store.lanes import lanes_of
from tests.executor import seed

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}


async def _claim(adb: Any, pack: int, n: int) -> list[int]:
    """The ids a claim of ``n`` takes, sorted (a batch comes back in no particular order)."""
    rows = await work_items.claim.work_item_claim_batch(adb, [pack], ["default"], [n], owner="me", lease_s=30)
    return sorted(int(r[0]) for r in rows)


async def _one_by_one(adb: Any, pack: int, n: int) -> list[int]:
    """Claim order: ``n`` claims of one item each."""
    return [i for _ in range(n) for i in await _claim(adb, pack, 1)]


async def test_a_higher_priority_due_item_is_claimed_before_older_lower_ones(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    # 20 low items due 50 s ago, then 5 high ones due now with a 100 s head start: rank now - 100.
    low = seed.seed_items(db, pack, 20, run_after_s=-50)
    high = seed.seed_items(db, pack, 5, heads=[100.0] * 5)
    assert await _claim(adb, pack, 5) == high
    assert await _claim(adb, pack, 5) == low[:5]  # then due order among equals


async def test_control_without_heads_the_same_items_go_in_due_order(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    low = seed.seed_items(db, pack, 20, run_after_s=-50)
    seed.seed_items(db, pack, 5)
    assert await _claim(adb, pack, 5) == low[:5]


async def test_the_head_start_is_bounded_an_item_due_long_enough_before_goes_first(db, adb) -> None:
    """The starvation bound: an item is never overtaken by one that became due more than the head
    difference after it. A low item due 120 s ago outranks a high item (head 100 s) due now; one due
    80 s ago does not."""
    pack = seed.seed_pack(db, "p", WT)
    old = seed.seed_items(db, pack, 1, run_after_s=-120)
    high = seed.seed_items(db, pack, 1, heads=[100.0])
    recent = seed.seed_items(db, pack, 1, run_after_s=-80)
    assert await _one_by_one(adb, pack, 3) == old + high + recent


async def test_priority_survives_a_retry_and_a_release(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    high = seed.seed_items(db, pack, 1, heads=[100.0])
    rows = await work_items.claim.work_item_claim_batch(adb, [pack], ["default"], [1], owner="me", lease_s=30)
    assert [r[0] for r in rows] == high
    low = seed.seed_items(db, pack, 10, run_after_s=-50)
    # The retry is due now (delay 0): its rank is now - 100, ahead of the low items due 50 s ago.
    await work_items.finalize.work_item_retry_batch(adb, high, [rows[0][1]], [0.0], ["x"], ["failed"])
    again = await work_items.claim.work_item_claim_batch(
        adb, [pack], ["default"], [1], owner="me", lease_s=30
    )
    assert [r[0] for r in again] == high
    await work_items.finalize.work_item_release_batch(adb, high, [again[0][1]], [True])
    assert await _one_by_one(adb, pack, 2) == [high[0], low[0]]


async def test_a_delayed_high_item_waits_for_its_time_then_goes_first(db, adb) -> None:
    """A not-yet-due item is never claimed, even with a rank already in the past (due in 2 s, head
    100 s); once due it goes before older low items. The ready-groups read says the group is due
    while its first-ranked row is not."""
    pack = seed.seed_pack(db, "p", WT)
    delayed = seed.seed_items(db, pack, 1, heads=[100.0], run_after_s=2.0)
    low = seed.seed_items(db, pack, 3, run_after_s=-10)
    groups = await work_items.claim.work_item_ready_groups(adb)
    assert [(g.pack, g.due_in <= 0) for g in groups] == [(pack, True)]
    assert await _claim(adb, pack, 1) == low[:1]  # the delayed item is ranked first but not due
    db.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (delayed[0],))
    assert await _one_by_one(adb, pack, 2) == [delayed[0], low[1]]


async def test_only_a_not_due_item_the_group_reports_its_due_time(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 1, heads=[100.0], run_after_s=30.0)
    groups = await work_items.claim.work_item_ready_groups(adb)
    assert len(groups) == 1 and 25 < groups[0].due_in <= 30
    assert await _claim(adb, pack, 5) == []


async def test_a_source_lane_keeps_delivery_order_whatever_the_priority(db, adb) -> None:
    """Lanes only promote their head: a later member with a head start waits for the earlier one."""
    pack = seed.seed_pack(db, "p", WT)
    members = seed.seed_items(db, pack, 3, source_lanes=["L"] * 3, heads=[0.0, 100.0, 50.0])
    other = seed.seed_items(db, pack, 2, heads=[10.0, 10.0], run_after_s=-1)
    order: list[int] = []
    for _ in range(5):
        rows = await work_items.claim.work_item_claim_batch(
            adb, [pack], ["default"], [5], owner="me", lease_s=30
        )
        order.extend(int(r[0]) for r in rows)
        for r in rows:
            lanes = lanes_of(pack, r[9], r[10])
            await work_items.finalize.work_item_finalize(
                adb, [int(r[0])], [int(r[1])], work_items.finalize.FailBatch(), lanes
            )
    assert [w for w in order if w in members] == members
    assert sorted(order) == sorted(members + other)


def test_manifest_priority_heads_and_validation() -> None:
    doc = seed.manifest(
        "m",
        {
            "a": {**seed.python_work_type("x:y"), "priority": 10},
            "b": {**seed.python_work_type("x:y"), "priority": -5},
            "c": {**seed.python_work_type("x:y", queue_class="bulk"), "priority": 3},
            "d": seed.python_work_type("x:y", queue_class="bulk"),
        },
    )
    doc["queue_classes"] = {"bulk": {"priority_step_s": 60}}
    m = Manifest.model_validate(doc)
    # default class: lowest -5, step 1 s; bulk: lowest 0, step 60 s.
    assert m.priority_heads() == {"a": 15.0, "b": 0.0, "c": 180.0, "d": 0.0}
    assert priority_heads(m.model_dump(mode="json")) == m.priority_heads()
    bad = dict(doc, queue_classes={"nope": {"priority_step_s": 1}, "bulk": {"priority_step_s": -1}})
    with pytest.raises(ManifestError) as err:
        parse_manifest(bad)
    text = "\n".join(err.value.errors)
    assert "queue_classes.nope: no work type has this queue class" in text
    assert "queue_classes.bulk.priority_step_s" in text


def test_claim_rank_is_an_index_expression(db: psycopg.Connection) -> None:
    """The ready index is on ``claim_rank``: due time less the head, in epoch seconds."""
    pack = seed.seed_pack(db, "p", WT)
    (wid,) = seed.seed_items(db, pack, 1, heads=[42.5])
    from connector.common.store.vocabulary import claim_rank

    got = db.execute(
        f"SELECT {claim_rank()} - extract(epoch FROM run_after)::float8 FROM connector_work_item"
        " WHERE work_id = %s",
        (wid,),
    ).fetchone()
    assert got is not None and abs(got[0] + 42.5) < 1e-3
