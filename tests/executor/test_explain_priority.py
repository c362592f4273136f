"""EXPLAIN ANALYZE of the claim order with priorities (docs/adr/014-priorities.md) at 1M ready rows.

The ready index is on ``claim_rank`` (due time less ``priority_head_s``). A million ready rows of one
group: 900k priority-0 rows due over the last hour, 80k prioritized rows (head 100 s) due over the
same hour, and 20k prioritized rows *not yet due* (in retry backoff or delayed, due within their
head start: their rank is already in the past, the one place the rank index reads rows it must
skip). The claim must take its window from the ready index in rank order (the prioritized due rows
first), read a bounded number of buffers, and never scan the table; the ready-groups read (its
first-ranked row is a not-due one here, so it makes its extra probe for a due row) stays a bounded
skip scan. Both plan-cache modes (DESIGN §8 trap 5). Control: the same claim on a copy of the index
on ``run_after`` alone (the old order) takes priority-0 rows first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from connector.common.store import work_items
from tests.executor import seed
from tests.plans import explain_in_rollback

pytestmark = pytest.mark.slow

READY = 1_000_000
CLAIM = {"queue_classes": ["default"], "limits": [64], "owner": "o", "lease_s": 30.0, "process": None}


@pytest.fixture(scope="module")
def big() -> Iterator[tuple[psycopg.Connection, int]]:
    with seed.detached_queue() as (db, pack):
        # i % 50 in 1..4: prioritized (head 100 s) and due over the last hour; i % 500 = 0:
        # prioritized with a head of 7,200 s, in retry backoff for 10 minutes more: ranked ahead of
        # everything, not due.
        db.execute(
            """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type,
                 queue_class, state, delivery_seq, run_after, priority, priority_head_s)
               SELECT i, %s, 1, 'w', 'default', CASE WHEN i %% 500 = 0 THEN 'retry' ELSE 'pending' END, i,
                 CASE WHEN i %% 500 = 0 THEN now() + make_interval(secs => 600 + (i %% 9))
                      ELSE now() - make_interval(secs => 3600 * (1 - i::float8 / %s)) END,
                 CASE WHEN i %% 500 = 0 OR i %% 50 BETWEEN 1 AND 4 THEN 100 ELSE 0 END,
                 CASE WHEN i %% 500 = 0 THEN 7200 WHEN i %% 50 BETWEEN 1 AND 4 THEN 100 ELSE 0 END
               FROM generate_series(1, %s) i""",
            (pack, READY, READY),
        )
        db.execute("VACUUM ANALYZE connector_work_item")
        yield db, pack


def _buffers(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"] + node.get("Shared Read Blocks", 0))


def _seq_scans(nodes: list[dict[str, Any]]) -> list[str]:
    return [n.get("Relation Name", "?") for n in nodes if n["Node Type"] == "Seq Scan"]


@pytest.mark.parametrize("statement", ["flow", "plain"])
@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_claim_reads_the_rank_index_prioritized_due_rows_first(big, mode, statement) -> None:
    """Both claim statements share the candidate read (``work_items.claim._candidates``)."""
    db, pack = big
    query = (
        work_items.claim.WORK_ITEM_CLAIM_BATCH
        if statement == "flow"
        else work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH
    )
    nodes = explain_in_rollback(db, query, {**CLAIM, "packs": [pack]}, mode)
    assert not _seq_scans(nodes), _seq_scans(nodes)
    ready = [n for n in nodes if n.get("Index Name") == "ix_connector_work_item_ready"]
    assert len(ready) == 1 and ready[0]["Actual Rows"] == 64
    # The 2,000 not-due rows ranked first are skipped by the index condition on run_after: no heap
    # visit (no row removed by a filter), a few index pages; never the backlog.
    assert ready[0].get("Rows Removed by Filter", 0) == 0
    assert _buffers(nodes[0]) < 3000
    # What it takes: prioritized due rows, oldest first (run for real, rolled back).
    with db.transaction(force_rollback=True):
        rows = db.execute(query, {**CLAIM, "packs": [pack]}).fetchall()
        ids = [int(r[0]) for r in rows if r[0] is not None]
        got = db.execute(
            "SELECT count(*) FILTER (WHERE priority = 100 AND run_after <= now()), count(*)"
            " FROM connector_work_item WHERE work_id = ANY(%s)",
            (ids,),
        ).fetchone()
    assert got == (64, 64)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_ready_groups_skip_scan_stays_bounded_with_a_not_due_first_row(big, mode) -> None:
    db, pack = big
    # The group's first-ranked row: a not-due prioritized one (rank in the past, due in the future).
    first = db.execute(
        "SELECT run_after > now() FROM connector_work_item WHERE state IN ('pending', 'retry')"
        " ORDER BY (date_part('epoch', run_after - '1970-01-01 00:00:00+00'::timestamptz) - priority_head_s),"
        " work_id LIMIT 1"
    ).fetchone()
    assert first == (True,)
    nodes = explain_in_rollback(db, work_items.claim.WORK_ITEM_READY_GROUPS, {}, mode)
    assert not _seq_scans(nodes), _seq_scans(nodes)
    assert all(
        n.get("Index Name")
        in (None, "ix_connector_work_item_ready", "pk_connector_pause", "pk_connector_circuit")
        for n in nodes
    ), [n.get("Index Name") for n in nodes]
    assert _buffers(nodes[0]) < 200
    groups = db.execute(work_items.claim.WORK_ITEM_READY_GROUPS).fetchall()
    assert [(g[0], g[2] <= 0) for g in groups] == [(pack, True)]  # due, though its first row is not


def test_control_the_old_due_order_takes_priority_zero_rows_first(big) -> None:
    db, pack = big
    with db.transaction(force_rollback=True):
        got = db.execute(
            """SELECT count(*) FILTER (WHERE priority = 100) FROM (
                 SELECT priority FROM connector_work_item
                 WHERE installed_pack_id = %s AND queue_class = 'default' AND state IN ('pending', 'retry')
                   AND run_after <= now()
                 ORDER BY run_after, work_id LIMIT 64) x""",
            (pack,),
        ).fetchone()
    assert got is not None and got[0] < 64
