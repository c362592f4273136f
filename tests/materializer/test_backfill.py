"""Backfill creates WorkItems only for eligible non-terminal events that have none, following each
event's own route snapshot and lanes; a second run creates nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from connector.common.delivery.backfill import backfill

from .conftest import apply, body, insert_receipts, manifest, rows, scalar, work_type

CONNECTOR = Path(sys.executable).with_name("connector")


async def test_backfill_is_idempotent_and_respects_eligibility(adb, db_url: str, make_router) -> None:
    doc = manifest(work_types={"sync": work_type(lanes={"source_fifo": True}), "audit": work_type()})
    doc["routes"][0]["fan_out"] = [{"work_type": "sync"}, {"work_type": "audit"}]
    applied = await apply(adb, doc)
    pack_id = applied.installed_pack_id
    # The generation is legacy-owned while these deliveries are materialized: events, no WorkItems.
    await adb.execute(
        "UPDATE connector_claim_authority SET claim_path = 'legacy_event', phase = 'legacy_active',"
        " cutover_receipt_id = NULL WHERE installed_pack_id = %s",
        (pack_id,),
    )
    ids = await insert_receipts(adb, [body("o1"), body("o1"), body("o2"), body("o3"), body("o4")])
    await (await make_router()).drain()
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 0
    legacy = dict(zip(ids, ["pending", "retry", "pending", "succeeded", "processing"], strict=True))
    for receipt_id, state in legacy.items():
        await adb.execute(
            "UPDATE connector_event SET legacy_state = %s WHERE receipt_id = %s", (state, receipt_id)
        )

    # One delivery was traced at the ingress: its backfilled WorkItems carry the receipt's context.
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await adb.execute(
        "UPDATE connector_ingress_receipt SET traceparent = %s WHERE receipt_id = %s", (traced, ids[0])
    )

    # Still legacy_active: nothing is eligible.
    report = await backfill(adb)
    assert (report.events, report.work_items) == (0, 0)
    assert report.ineligible == {"generation_legacy_active": 5}

    # Cutover in progress: Event claims stopped; the backlog gets its WorkItems.
    await adb.execute(
        "UPDATE connector_claim_authority SET claim_path = 'none', phase = 'quiescing'"
        " WHERE installed_pack_id = %s",
        (pack_id,),
    )
    dry = await backfill(adb, dry_run=True)
    assert (dry.events, dry.work_items) == (3, 6)
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 0
    report = await backfill(adb, batch=2)
    assert (report.events, report.work_items) == (3, 6)
    contexts = await rows(
        adb,
        "SELECT e.receipt_id = %s, w.traceparent"
        " FROM connector_work_item w JOIN connector_event e USING (event_id)",
        (ids[0],),
    )
    assert sorted(contexts, key=str) == sorted([(True, traced)] * 2 + [(False, None)] * 4, key=str), contexts
    assert report.ineligible == {"legacy_in_flight": 1, "legacy_terminal": 1}
    items = await rows(
        adb,
        """SELECT e.receipt_id, w.work_type, w.state, w.source_lane_key, w.delivery_seq = e.delivery_seq,
                  w.generation = e.generation
           FROM connector_work_item w JOIN connector_event e USING (event_id) ORDER BY w.work_id""",
    )
    assert items == [
        (ids[0], "sync", "pending", "sync:order:o1", True, True),
        (ids[0], "audit", "pending", None, True, True),
        (ids[1], "sync", "blocked", "sync:order:o1", True, True),  # behind o1's first delivery
        (ids[1], "audit", "pending", None, True, True),
        (ids[2], "sync", "pending", "sync:order:o2", True, True),
        (ids[2], "audit", "pending", None, True, True),
    ]

    # Running it again creates nothing (the console script, as an operator runs it).
    env = {**os.environ, "CONNECTOR_DATABASE_URL": db_url}
    result = subprocess.run(
        [str(CONNECTOR), "materializer", "backfill"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "created 0 work items for 0 events" in result.stdout
    assert "ineligible (legacy_in_flight): 1" in result.stdout
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 6
