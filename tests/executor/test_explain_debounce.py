"""EXPLAIN ANALYZE of the debounce statements (docs/packs.md#debounce) at 1M ready rows.

Half the rows are debounced over 20,000 keys (25 items a key, a key row each; 180,000 more key
rows of other work types): each key's newest
item is live and due, the older ones parked; for 1,000 keys (d10000..d10999) the parked ones are
already coalesced into the newest. The claim statement must read the ready index for its window,
find the window's key rows by primary key (one probe per distinct key), each key's newest waiting
item and the items to coalesce through ``ix_connector_work_item_debounce``, and update the
coalesced, parked and key rows by key — with candidates that run (their keys' parked items
coalesced) and candidates that are superseded (parked); a window without debounced candidates probes
no key row. The materializer's declaration and scheduling, the handler's covered read, the stats,
the cancel's unpark and the idle-key retirement are index probes too. Both plan-cache modes (DESIGN
§8 trap 5). Control: the covered read without its index scans the table (so the scan check can
fail).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from connector.common.store import debounce, work_items
from tests.executor import seed
from tests.plans import explain_in_rollback, subplan

pytestmark = pytest.mark.slow

READY = 1_000_000
KEYS = 20_000
CLAIM = {"queue_classes": ["default"], "limits": [64], "owner": "o", "lease_s": 30.0, "process": None}
PARKED = "'9999-01-01 00:00:00+00'"


@pytest.fixture(scope="module")
def big() -> Iterator[tuple[psycopg.Connection, int]]:
    with seed.detached_queue() as (db, pack):
        # Undebounced rows due a minute ago; debounced rows (even i) parked, key (i / 2) mod KEYS.
        db.execute(
            f"""INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type,
                 queue_class, state, delivery_seq, run_after, debounce_key)
               SELECT i, %s, 1, 'w', 'default', 'pending', i,
                 CASE WHEN i %% 2 = 0 THEN {PARKED} ELSE now() - interval '60 s' END,
                 CASE WHEN i %% 2 = 0 THEN 'd' || ((i / 2) %% %s) END
               FROM generate_series(1, %s) i""",
            (pack, KEYS, READY),
        )
        # Each key's newest item is live and due first (2 minutes ago).
        db.execute(
            """UPDATE connector_work_item w SET run_after = now() - interval '120 s'
               FROM (SELECT max(work_id) AS id FROM connector_work_item WHERE debounce_key IS NOT NULL
                     GROUP BY debounce_key) n WHERE w.work_id = n.id"""
        )
        db.execute(
            """INSERT INTO connector_debounce
                 (installed_pack_id, work_type, debounce_key, window_s, max_wait_s)
               SELECT %s, 'w', 'd' || i, 1, 10 FROM generate_series(0, %s - 1) i""",
            (pack, KEYS),
        )
        # Key rows of other work types without waiting items (a key table of many pages: on a few
        # hundred, a sequential scan is the planner's right choice for a page of keys).
        db.execute(
            """INSERT INTO connector_debounce
                 (installed_pack_id, work_type, debounce_key, window_s, max_wait_s)
               SELECT %s, 'x' || (i %% 10), 'e' || i, 1, 10 FROM generate_series(1, 180000) i""",
            (pack,),
        )
        # Keys d10000..d10999: their parked items already coalesced into the newest.
        db.execute(
            f"""UPDATE connector_work_item w SET state = 'coalesced', outcome = 'coalesced',
                 covered_by = n.id, finished_at = now()
               FROM (SELECT debounce_key, max(work_id) AS id FROM connector_work_item
                     WHERE debounce_key IN (SELECT 'd' || i FROM generate_series(10000, 10999) i)
                     GROUP BY debounce_key) n
               WHERE w.debounce_key = n.debounce_key AND w.work_id < n.id AND w.run_after = {PARKED}"""
        )
        db.execute("VACUUM ANALYZE connector_work_item")
        db.execute("VACUUM ANALYZE connector_debounce")
        yield db, pack


def _seq_scans(nodes: list[dict[str, Any]]) -> list[str]:
    return [n.get("Relation Name", "?") for n in nodes if n["Node Type"] == "Seq Scan"]


def _buffers(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"] + node.get("Shared Read Blocks", 0))


def _index(nodes: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [n for n in nodes if n.get("Index Name") == name]


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("case", ["run", "superseded", "undebounced"])
def test_claim_with_debounced_candidates(big, mode, case) -> None:
    db, pack = big
    setup: tuple[str, ...] = ()
    if case == "superseded":
        # The second-newest item of every key is live and due before the newest:
        # the window's candidates are all superseded (parked again; the newest will cover them).
        setup = (
            f"""UPDATE connector_work_item w SET run_after = now() - interval '200 s'
               FROM (SELECT debounce_key, max(work_id) AS newest FROM connector_work_item
                     WHERE debounce_key IS NOT NULL AND state = 'pending' GROUP BY debounce_key) n
               WHERE w.debounce_key = n.debounce_key AND w.work_id = n.newest - 2 * {KEYS}
                 AND w.state = 'pending'""",
        )
    elif case == "undebounced":
        # Every key's newest item waits for its window: the window holds undebounced rows only.
        setup = (
            "UPDATE connector_work_item SET run_after = now() + interval '1 h'"
            f" WHERE debounce_key IS NOT NULL AND run_after <> {PARKED}",
        )
    nodes = explain_in_rollback(
        db, work_items.claim.WORK_ITEM_CLAIM_BATCH, {**CLAIM, "packs": [pack]}, mode, setup
    )
    assert not _seq_scans(nodes), _seq_scans(nodes)
    ready = _index(nodes, "ix_connector_work_item_ready")
    assert len(ready) == 1 and ready[0]["Actual Rows"] == 64
    keys = _index(nodes, "pk_connector_debounce")
    claimed = subplan(nodes, "CTE claimed")
    if case == "undebounced":
        assert all(n["Actual Loops"] == 0 or n["Actual Rows"] == 0 for n in keys), [
            (n["Actual Loops"], n["Actual Rows"], n.get("Index Cond")) for n in keys
        ]
        assert claimed[0]["Actual Rows"] == 64
        assert not any(n["Actual Loops"] for n in _index(nodes, "ix_connector_work_item_debounce"))
        # (No buffer bound here: the setup's 20,000 updates leave their old versions at the head of
        # the ready index inside this transaction, which the read must step over.)
        return
    assert keys and all(n["Actual Rows"] <= 64 for n in keys)
    assert _index(nodes, "ix_connector_work_item_debounce")
    coalesced = subplan(nodes, "CTE dcoalesced")
    parked = subplan(nodes, "CTE dparked")
    if case == "run":
        # The 64 newest items with the lowest ids (keys d0..d63) run; the 24 parked items of each of
        # their keys are coalesced in the same statement, by primary key.
        assert claimed[0]["Actual Rows"] == 64
        assert any(
            n.get("Index Name") == "pk_connector_work_item" and n["Actual Rows"] == 64 * 24 for n in coalesced
        )
    else:
        assert claimed[0]["Actual Rows"] == 0
        assert any(n.get("Index Name") == "pk_connector_work_item" and n["Actual Rows"] == 64 for n in parked)
    assert _buffers(nodes[0]) < 12_000


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_materializer_handler_stats_and_cancel_statements_probe_by_key(big, mode) -> None:
    db, pack = big
    keys = [*sorted(f"d{i}" for i in range(2000, 2100)), "new1", "new2"]
    arrays = {
        "packs": [pack] * len(keys),
        "work_types": ["w"] * len(keys),
        "keys": keys,
        "windows": [1.0] * len(keys),
        "max_waits": [10.0] * len(keys),
    }
    newest = [
        int(r[0])
        for r in db.execute(
            "SELECT max(work_id) FROM connector_work_item WHERE debounce_key IN"
            " (SELECT 'd' || i FROM generate_series(10000, 10063) i) GROUP BY debounce_key"
        ).fetchall()
    ]
    one = {"pack": pack, "work_type": "w", "key": "d2000"}
    for query, params, bound in (
        (debounce.DEBOUNCE_DECLARE, arrays, 2000),
        (debounce.DEBOUNCE_SCHEDULE, arrays, 5000),  # parks 100 rows (their index entries)
        (debounce.DEBOUNCE_COVERED_BATCH, {"ids": newest}, 6000),
        (debounce.DEBOUNCE_STATS, {"pack": pack, "limit": 50}, 5000),
        (debounce.DEBOUNCE_LOCK, one, 50),
        (
            debounce.DEBOUNCE_RETIRE_LOCK,
            {"after_pack": -1, "after_wt": "", "after_key": "", "limit": 500},
            2500,  # 500 key rows locked
        ),
        (
            debounce.DEBOUNCE_RETIRE,
            {**debounce._page_arrays([(pack, "w", k) for k in keys]), "idle_s": 0.0},
            2000,
        ),
        (debounce.DEBOUNCE_UNPARK_NEWEST, one, 100),
    ):
        nodes = explain_in_rollback(db, query, params, mode)
        assert not _seq_scans(nodes), (query[:60], _seq_scans(nodes))
        assert _buffers(nodes[0]) < bound, (query[:60], _buffers(nodes[0]))
    retire = {**debounce._page_arrays([(pack, "w", k) for k in keys]), "idle_s": 0.0}
    nodes = explain_in_rollback(db, debounce.DEBOUNCE_RETIRE, retire, mode)
    assert _index(nodes, "pk_connector_debounce") and _index(nodes, "ix_connector_work_item_debounce")
    nodes = explain_in_rollback(db, debounce.DEBOUNCE_COVERED_BATCH, {"ids": newest}, mode)
    scans = _index(nodes, "ix_connector_work_item_covered_by")
    assert scans and sum(n["Actual Rows"] * n["Actual Loops"] for n in scans) == 64 * 24
    nodes = explain_in_rollback(db, debounce.DEBOUNCE_SCHEDULE, arrays, mode)
    probes = _index(nodes, "ix_connector_work_item_debounce")
    assert probes and all(n["Actual Loops"] <= len(keys) for n in probes)


def test_control_the_covered_read_without_its_index_scans_the_table(big) -> None:
    db, _ = big
    setup = ("DROP INDEX ix_connector_work_item_covered_by",)
    nodes = explain_in_rollback(
        db, debounce.DEBOUNCE_COVERED_BATCH, {"ids": [1, 2]}, "force_custom_plan", setup
    )
    assert _buffers(nodes[0]) > 20_000 or _seq_scans(nodes)
