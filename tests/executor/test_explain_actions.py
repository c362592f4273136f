"""EXPLAIN ANALYZE of the claim path's statements that pauses and cancels touch, at 1M ready rows.

The claim statement reads the pause from the authority rows it already locks; nothing paused, it
must cost what it did (the ready index, then the primary key, 64 rows, a bounded number of buffers).
A paused group must stop before its index scan (``cardinality(ag.gens) > 0`` is a one-time filter:
the scan is "never executed"): without it the scan reads every ready row of the group, since the
generation is not in the ready index. Control: the claim statement as it was before the gate
(``_UNGATED``) walks the million rows — the buffer bound below catches it. Both plan-cache modes
(DESIGN §8 trap 5).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from connector.common.store import pauses, work_items
from tests.executor import seed
from tests.plans import claimed_update, explain_in_rollback

pytestmark = pytest.mark.slow

READY = 1_000_000
CLAIM = {"queue_classes": ["default"], "limits": [64], "owner": "o", "lease_s": 30.0, "process": None}
_GATE = "\n      AND w.generation = ANY (ag.gens) AND cardinality(ag.gens) > 0"
# The claim statement without the one-time gate (the control).
_UNGATED = work_items.claim.WORK_ITEM_CLAIM_BATCH.replace(_GATE, "\n      AND w.generation = ANY (ag.gens)")
assert _UNGATED != work_items.claim.WORK_ITEM_CLAIM_BATCH
# The claim statements: the plain one (no flow keys), the rate one (rate keys only) and the flow one
# share the candidate read.
STATEMENTS = pytest.mark.parametrize(
    "claim",
    [
        work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH,
        work_items.claim.WORK_ITEM_CLAIM_RATE_BATCH,
        work_items.claim.WORK_ITEM_CLAIM_BATCH,
    ],
    ids=["plain", "rate", "flow"],
)


@pytest.fixture(scope="module")
def big() -> Iterator[tuple[psycopg.Connection, int]]:
    with seed.detached_queue() as (db, pack):
        db.execute(
            """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type,
                 queue_class, state, delivery_seq, run_after)
               SELECT i, %s, 1, 'w', CASE WHEN i %% 10 = 0 THEN 'slow' ELSE 'default' END,
                 CASE WHEN i %% 1000 = 0 THEN 'dead' ELSE 'pending' END, i, now() - make_interval(secs => 60)
               FROM generate_series(1, %s) i""",
            (pack, READY),
        )
        db.execute("VACUUM ANALYZE connector_work_item")
        yield db, pack


def _ready_scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [n for n in nodes if n.get("Index Name") == "ix_connector_work_item_ready"]


def _no_seq_scan(nodes: list[dict[str, Any]]) -> None:
    seq = [
        n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "connector_work_item"
    ]
    assert not seq, seq


def _pause(pack: int, classes: str) -> tuple[str, ...]:
    return (
        f"UPDATE connector_claim_authority SET paused_queue_classes = '{classes}'"
        f" WHERE installed_pack_id = {pack}",
    )


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@STATEMENTS
def test_claim_costs_the_same_when_nothing_is_paused(big, claim, mode) -> None:
    db, pack = big
    nodes = explain_in_rollback(db, claim, {**CLAIM, "packs": [pack]}, mode)
    _no_seq_scan(nodes)
    # The claimed rows (the statement's rate-limit part adds a "held back" row per group only when
    # a candidate had a rate-limit key: none here).
    assert claimed_update(nodes)[0]["Node Type"] == "ModifyTable" and nodes[0]["Actual Rows"] == 64
    [scan] = _ready_scans(nodes)
    assert scan["Actual Rows"] == 64
    assert nodes[0]["Shared Hit Blocks"] + nodes[0].get("Shared Read Blocks", 0) < 3000
    assert any(n.get("Index Name") == "pk_connector_work_item" for n in nodes)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("paused", ["{*}", "{default}"])
@STATEMENTS
def test_a_paused_group_stops_before_its_index_scan(big, claim, mode, paused) -> None:
    db, pack = big
    nodes = explain_in_rollback(db, claim, {**CLAIM, "packs": [pack]}, mode, _pause(pack, paused))
    _no_seq_scan(nodes)
    assert nodes[0]["Actual Rows"] == 0
    [scan] = _ready_scans(nodes)
    assert scan["Actual Loops"] == 0  # never executed
    assert nodes[0]["Shared Hit Blocks"] + nodes[0].get("Shared Read Blocks", 0) < 50


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@STATEMENTS
def test_a_paused_class_beside_a_running_one(big, claim, mode) -> None:
    db, pack = big
    params = {**CLAIM, "packs": [pack, pack], "queue_classes": ["default", "slow"], "limits": [32, 32]}
    nodes = explain_in_rollback(db, claim, params, mode, _pause(pack, "{slow}"))
    _no_seq_scan(nodes)
    assert nodes[0]["Actual Rows"] == 32  # the default class only
    [scan] = _ready_scans(nodes)
    assert scan["Actual Loops"] == 1 and scan["Actual Rows"] == 32


def test_control_the_ungated_claim_walks_the_paused_group(big) -> None:
    """Control: without the one-time gate the paused group's scan reads every ready row."""
    db, pack = big
    nodes = explain_in_rollback(
        db, _UNGATED, {**CLAIM, "packs": [pack]}, "force_custom_plan", _pause(pack, "{*}")
    )
    [scan] = _ready_scans(nodes)
    assert scan["Actual Loops"] == 1 and scan.get("Rows Removed by Filter", 0) > 0.8 * READY * 0.9
    assert nodes[0]["Shared Hit Blocks"] + nodes[0].get("Shared Read Blocks", 0) > 1000


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_ready_groups_and_cancel_statements_use_their_indexes(big, mode) -> None:
    db, pack = big
    setup = (
        "INSERT INTO connector_pause (installed_pack_id, queue_class, actor, reason)"
        f" VALUES ({pack}, 'slow', 'a', 'r')",
    )
    nodes = explain_in_rollback(db, work_items.claim.WORK_ITEM_READY_GROUPS, {}, mode, setup)
    _no_seq_scan(nodes)
    assert _ready_scans(nodes)
    assert nodes[0]["Shared Hit Blocks"] + nodes[0].get("Shared Read Blocks", 0) < 200
    work_id = db.execute("SELECT max(work_id) FROM connector_work_item").fetchone()[0]
    for query, params in (
        (work_items.admin.WORK_ITEM_CANCEL_CANDIDATE, {"id": work_id}),
        (work_items.admin.WORK_ITEM_CANCEL, {"id": work_id, "token": 0, "summary": "s"}),
    ):
        nodes = explain_in_rollback(db, query, params, mode)
        _no_seq_scan(nodes)
        assert any(n.get("Index Name") == "pk_connector_work_item" for n in nodes), nodes
    nodes = explain_in_rollback(db, pauses.PAUSE_LIST.format(where="true"), {}, mode)
    assert not [n for n in nodes if n.get("Relation Name") == "connector_work_item"]
