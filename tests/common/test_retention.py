"""Retention of retired deliveries (ADR 009) against the real server: what is deleted and what keeps
a whole delivery, retention 0, one sweeper at a time, admin request ids, lanes, the CLI and the plans
of the chunk statements."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connector.cli import main as cli_main
from connector.common.core.settings import ExecutorSettings
from connector.common.maintenance import retention
from connector.common.maintenance.retention import (
    RETENTION_DELETED,
    RETENTION_OLDEST_AGE,
    RETENTION_RUNS,
    Retention,
    RetentionConfig,
)
from connector.common.store import deliveries, receipts
from connector.common.store.lanes import lane_lock_batch, lane_repair, lane_settle_batch
from tests.executor import seed

DAY = 86_400.0
PACK = 1
_SEQ = itertools.count(1)
CONNECTOR = Path(sys.executable).with_name("connector")


@dataclass(frozen=True, slots=True)
class Delivery:
    receipt_id: int
    event_ids: tuple[int, ...]
    work_ids: tuple[int, ...]


def delivery(
    db: psycopg.Connection,
    events: list[list[str]] | None = None,
    *,
    age_s: float = 10 * DAY,
    router_status: str = "materialized",
    owner: str = "work_item",
    legacy_state: str | None = None,
    source_lane: str | None = None,
    target_lane: str | None = None,
    fence_id: int | None = None,
) -> Delivery:
    """One receipt accepted ``age_s`` ago with one event per entry of ``events``, each with one
    WorkItem per state listed (``[]``: an event without WorkItems)."""
    events = [["succeeded"]] if events is None else events
    n = next(_SEQ)
    row = db.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method, received_at,
             accepted_at, payload_sha256, body, verification, router_status)
           VALUES ('ns', 'r', %s, 'POST', now() - make_interval(secs => %s),
                   now() - make_interval(secs => %s), '\\x00', '\\x7b7d', 'none', %s)
           RETURNING receipt_id""",
        (f"k{n}", age_s, age_s, router_status),
    ).fetchone()
    assert row is not None
    receipt_id = int(row[0])
    event_ids: list[int] = []
    work_ids: list[int] = []
    for index, states in enumerate(events):
        ev = db.execute(
            """INSERT INTO connector_event (receipt_id, event_index, installed_pack_id, generation,
                 incarnation, route_id, route_version, namespace, idempotency_key, delivery_seq,
                 payload_sha256, parse_outcome, execution_owner, legacy_state)
               VALUES (%s, %s, %s, 1, 1, 1, 1, 'ns', %s, %s, '\\x00', 'ok', %s, %s) RETURNING event_id""",
            (receipt_id, index, PACK, f"k{n}#{index}", receipt_id, owner, legacy_state),
        ).fetchone()
        assert ev is not None
        event_ids.append(int(ev[0]))
        for j, state in enumerate(states):
            processing = state == "processing"
            w = db.execute(
                """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, state,
                     delivery_seq, source_lane_key, target_mutation_lane_key, lease_owner, lease_until,
                     rollback_execution_fence_id)
                   VALUES (%s, %s, 1, %s, %s, %s, %s, %s, %s,
                           CASE WHEN %s THEN now() + interval '1 min' END, %s)
                   RETURNING work_id""",
                (
                    ev[0], PACK, f"w{j}", state, receipt_id, source_lane, target_lane,
                    "x" if processing else None, processing, fence_id,
                ),
            ).fetchone()  # fmt: skip
            assert w is not None
            work_ids.append(int(w[0]))
    return Delivery(receipt_id, tuple(event_ids), tuple(work_ids))


def present(db: psycopg.Connection, d: Delivery) -> tuple[int, int, int]:
    """(receipts, events, WorkItems) of the delivery still in the database."""
    row = db.execute(
        """SELECT (SELECT count(*) FROM connector_ingress_receipt WHERE receipt_id = %(r)s),
                  (SELECT count(*) FROM connector_event WHERE event_id = ANY(%(e)s::bigint[])),
                  (SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%(w)s::bigint[]))""",
        {"r": d.receipt_id, "e": list(d.event_ids), "w": list(d.work_ids)},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def whole(d: Delivery) -> tuple[int, int, int]:
    return 1, len(d.event_ids), len(d.work_ids)


def totals(db: psycopg.Connection) -> tuple[int, ...]:
    row = db.execute(
        """SELECT (SELECT count(*) FROM connector_ingress_receipt),
                  (SELECT count(*) FROM connector_event),
                  (SELECT count(*) FROM connector_work_item),
                  (SELECT count(*) FROM connector_admin_request)"""
    ).fetchone()
    assert row is not None
    return tuple(int(x) for x in row)


async def sweep_now(
    db_url: str, *, delivered_s: float = DAY, admin_s: float = 0.0, batch: int = 1_000
) -> retention.SweepResult:
    conn = await retention.connect(db_url)
    try:
        return await retention.run_locked(
            conn, delivered_s=delivered_s, admin_requests_s=admin_s, batch=batch
        )
    finally:
        await conn.close()


def _deleted(table: str) -> float:
    return RETENTION_DELETED.labels(table)._value.get()


def _runs(result: str) -> float:
    return RETENTION_RUNS.labels(result)._value.get()


# --------------------------------------------------------------------------------------------------
# What is deleted
# --------------------------------------------------------------------------------------------------


async def test_a_retired_delivery_is_deleted_with_its_events_and_work_items(db, db_url) -> None:
    retired = delivery(db, [["succeeded", "succeeded"], ["succeeded"]], age_s=3 * DAY)
    young = delivery(db, [["succeeded"]], age_s=3_600)
    before = {t: _deleted(t) for t in retention.TABLES}
    done = _runs("done")
    res = await sweep_now(db_url, delivered_s=DAY, batch=1)
    assert res.result == "done"
    assert present(db, retired) == (0, 0, 0)
    assert present(db, young) == whole(young)
    assert res.deliveries == 1
    assert res.deleted == {
        "connector_work_item": 3,
        "connector_event": 2,
        "connector_ingress_receipt": 1,
        "connector_admin_request": 0,
    }
    # batch 1: the retired receipt's chunk, then the young one's (all young: the walk stops there).
    assert (res.chunks, res.receipts_scanned, res.receipts_old, sum(res.kept.values())) == (2, 2, 1, 0)
    assert {t: _deleted(t) - before[t] for t in retention.TABLES} == res.deleted
    assert _runs("done") == done + 1
    # The oldest receipt left is the young one (an hour old).
    assert 3_500 < res.oldest_receipt_age_s < 3_700
    assert RETENTION_OLDEST_AGE._value.get() == res.oldest_receipt_age_s


async def test_the_walk_stops_at_the_first_chunk_that_is_all_young(db, db_url) -> None:
    """A retired delivery *after* a wholly young chunk is left for a later sweep (ids follow
    acceptance, so in practice there is none): the walk does not read past that chunk."""
    first = delivery(db, age_s=3 * DAY)
    young = [delivery(db, age_s=60) for _ in range(3)]
    late_old = delivery(db, age_s=3 * DAY)  # out of order on purpose
    res = await sweep_now(db_url, batch=3)
    assert present(db, first) == (0, 0, 0)
    # chunk 1 = first + 2 young (mixed: continue), chunk 2 = young + late_old (mixed: continue),
    # chunk 3 = empty.
    assert present(db, late_old) == (0, 0, 0)
    assert res.chunks == 2 and res.receipts_scanned == 5
    for d in young:
        assert present(db, d) == whole(d)
    more = [delivery(db, age_s=60) for _ in range(3)]
    after_young = delivery(db, age_s=3 * DAY)
    res = await sweep_now(db_url, batch=3)
    # chunk 1 = 3 young: stop. The old receipt behind it is not reached.
    assert (res.chunks, res.receipts_scanned, res.deliveries) == (1, 3, 0)
    assert present(db, after_young) == whole(after_young)
    assert all(present(db, d) == whole(d) for d in more)


KEEP_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("young receipt", {"age_s": 3_600}, None),
    *[
        (f"one {s} WorkItem among several", {"events": [["succeeded", s, "succeeded"], ["succeeded"]]},
         "dead_letter" if s == "dead" else "unfinished")
        for s in ("pending", "blocked", "processing", "retry", "dead", "awaiting_legacy_outcome",
                  "reconciled_legacy_terminal")
    ],
    *[
        (f"{s} receipt", {"router_status": s, "events": []}, "not_materialized")
        for s in ("failed", "pending", "retry", "routing")
    ],
    ("failed receipt that has an event", {"router_status": "failed"}, "not_materialized"),
    ("legacy_event owner", {"owner": "legacy_event", "legacy_state": "succeeded"}, "legacy_owned"),
    ("legacy_event owner, no legacy state", {"owner": "legacy_event"}, "legacy_owned"),
    ("legacy history after cutover", {"legacy_state": "succeeded"}, "legacy_history"),
    ("an event without WorkItems", {"events": [["succeeded"], []]}, "no_work_item"),
    ("a rollback-fenced succeeded WorkItem", {"fence_id": 7}, "rollback_fenced"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "kw", "reason"), KEEP_CASES, ids=[c[0] for c in KEEP_CASES])
async def test_a_reason_to_keep_keeps_the_whole_delivery(db, db_url, case, kw, reason) -> None:
    control = delivery(db, [["succeeded", "succeeded"]])
    kept = delivery(db, **kw)
    tail = delivery(db)
    res = await sweep_now(db_url)
    assert present(db, kept) == whole(kept), case
    # The sweep ran and went past the kept delivery: the retired ones around it are gone.
    assert present(db, control) == (0, 0, 0) and present(db, tail) == (0, 0, 0)
    assert res.deliveries == 2
    assert dict(res.kept) == ({reason: 1} if reason else {}), res.kept


async def test_a_legacy_outcome_receipt_keeps_the_delivery(db, db_url) -> None:
    control = delivery(db)
    kept = delivery(db, [["succeeded"], ["succeeded"]])
    db.execute(
        """INSERT INTO connector_legacy_outcome_receipt (installed_pack_id, generation, event_id, work_type,
             version, outcome, actor, digest) VALUES (%s, 1, %s, 'w0', 1, 'succeeded', 'legacy:x', 'd')""",
        (PACK, kept.event_ids[1]),
    )
    res = await sweep_now(db_url)
    assert present(db, kept) == whole(kept)
    assert present(db, control) == (0, 0, 0)
    assert dict(res.kept) == {"legacy_outcome": 1}


async def test_retention_zero_deletes_no_deliveries(db, db_url) -> None:
    old = [delivery(db, age_s=400 * DAY) for _ in range(5)]
    db.execute(
        "INSERT INTO connector_admin_request (request_id, method, response, created_at)"
        " VALUES ('old', 'm', '\\x00', now() - interval '3 days')"
    )
    res = await sweep_now(db_url, delivered_s=0, admin_s=DAY)
    assert all(present(db, d) == whole(d) for d in old)
    assert res.deliveries == 0 and res.receipts_scanned == 0 and res.cutoff is None
    # ...while the admin request window still applies (so the sweep did run).
    assert res.deleted["connector_admin_request"] == 1
    assert totals(db)[3] == 0
    # The same rows go with a retention.
    res = await sweep_now(db_url, delivered_s=DAY)
    assert res.deliveries == 5 and all(present(db, d) == (0, 0, 0) for d in old)


async def test_a_delivery_that_changes_during_the_sweep_is_not_deleted_in_part(
    db, db_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WorkItem inserted for a classified event after its classification (a backfill, say): the
    WorkItem delete leaves it (not succeeded), the event's foreign key refuses the event delete, and
    the chunk rolls back; the next sweep sees the new item and keeps the delivery."""
    a = delivery(db, [["succeeded"]])
    b = delivery(db, [["succeeded", "succeeded"]])
    classify = deliveries.receipt_chunk_classify
    inserted: list[int] = []

    async def classify_then_insert(*args: Any) -> list[tuple[Any, ...]]:
        rows = await classify(*args)
        if not inserted:
            w = db.execute(
                """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type,
                     delivery_seq) VALUES (%s, %s, 1, 'late', %s) RETURNING work_id""",
                (b.event_ids[0], PACK, b.receipt_id),
            ).fetchone()
            inserted.append(int(w[0]))  # type: ignore[index]
        return rows

    monkeypatch.setattr(deliveries, "receipt_chunk_classify", classify_then_insert)
    res = await sweep_now(db_url)
    assert present(db, a) == whole(a) and present(db, b) == whole(b)
    assert res.deliveries == 0 and dict(res.kept) == {"changed": 2}
    monkeypatch.setattr(deliveries, "receipt_chunk_classify", classify)
    res = await sweep_now(db_url)
    assert present(db, a) == (0, 0, 0)
    assert present(db, b) == whole(b)
    assert dict(res.kept) == {"unfinished": 1}


# --------------------------------------------------------------------------------------------------
# One sweeper at a time, the service loop, admin request ids, settings
# --------------------------------------------------------------------------------------------------


async def test_a_second_sweeper_skips_while_one_holds_the_lock(db, db_url) -> None:
    d = delivery(db)
    first = await retention.connect(db_url)  # a sweeper in another process, mid-sweep
    loop = Retention(db_url, RetentionConfig(delivered_s=DAY, interval_s=60))
    busy = _runs("busy")
    try:
        assert await retention.try_lock(first)
        res = await loop.run_once()
        assert res.result == "busy" and res.deliveries == 0
        assert _runs("busy") == busy + 1
        assert present(db, d) == whole(d)
        await retention.unlock(first)
        res = await loop.run_once()
        assert res.result == "done" and res.deliveries == 1
        assert present(db, d) == (0, 0, 0)
        # ...and the second sweeper let go of the lock afterwards.
        assert await retention.try_lock(first)
    finally:
        await loop.stop()
        await first.close()


def _info_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "connector.retention" and r.levelno == logging.INFO]


async def test_the_service_loop_sweeps_and_logs_counts_only(
    db, db_url, caplog: pytest.LogCaptureFixture
) -> None:
    ds = [delivery(db, [["succeeded", "succeeded"]]) for _ in range(3)]
    loop = Retention(db_url, RetentionConfig(delivered_s=DAY, interval_s=0.05))
    with caplog.at_level(logging.INFO, logger="connector.retention"):
        loop.start()
        try:
            # Poll the outcome (no signal to wait for): the rows gone *and* the round's line written
            # (the round logs after its commit; stopped in between, under load, it had not yet).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if all(present(db, d) == (0, 0, 0) for d in ds) and _info_lines(caplog):
                    break
                await asyncio.sleep(0.05)
        finally:
            await loop.stop()
    assert all(present(db, d) == (0, 0, 0) for d in ds)
    lines = _info_lines(caplog)
    assert len(lines) == 1, [r.getMessage() for r in lines]  # later rounds deleted nothing: silent
    rec = lines[0].__dict__
    assert (rec["deliveries"], rec["work_items"], rec["events"], rec["receipts"]) == (3, 6, 3, 3)
    # Counts only: no field beyond the fixed set, no id anywhere in the message.
    extra = set(rec) - set(vars(logging.makeLogRecord({}))) - {"message", "asctime", "taskName"}
    assert extra == {
        "deliveries", "work_items", "events", "receipts", "admin_requests", "receipts_kept_old",
        "chunks", "seconds",
    }, extra  # fmt: skip
    assert not re.search(r"\d", lines[0].getMessage())


async def test_the_executor_service_runs_the_sweep(db, db_url) -> None:
    from connector.common.core.settings import DatabaseSettings
    from connector.executor.service import ExecutorService

    d = delivery(db, [["succeeded"], ["succeeded", "succeeded"]])
    young = delivery(db, age_s=60)
    cfg = ExecutorSettings(
        grpc_port=0, metrics_port=0, stats_interval_s=0, retention_interval_s=0.05,
        retention_delivered_s=DAY,
    )  # fmt: skip
    svc = ExecutorService(
        DatabaseSettings(), cfg, url=db_url, mount_admin=False, serve_metrics=False, heartbeat_s=0.5
    )
    await svc.start()
    try:
        assert svc.retention is not None and svc.retention.cfg.delivered_s == DAY
        deadline = time.monotonic() + 120  # poll the outcome
        while time.monotonic() < deadline:
            if present(db, d) == (0, 0, 0):
                break
            await asyncio.sleep(0.05)
    finally:
        await svc.stop()
    assert present(db, d) == (0, 0, 0) and present(db, young) == whole(young)
    assert svc.retention is None


async def test_admin_requests_outlive_only_their_window(db, db_url) -> None:
    db.execute(
        """INSERT INTO connector_admin_request (request_id, method, response, created_at) VALUES
             ('old-1', 'm', '\\x00', now() - interval '25 hours'),
             ('old-2', 'm', '\\x00', now() - interval '30 days'),
             ('young', 'm', '\\x00', now() - interval '23 hours'),
             ('new', 'm', '\\x00', now())"""
    )
    res = await sweep_now(db_url, delivered_s=DAY, admin_s=DAY)
    left = [r[0] for r in db.execute("SELECT request_id FROM connector_admin_request ORDER BY 1")]
    assert left == ["new", "young"]
    assert res.deleted["connector_admin_request"] == 2
    # 0 keeps them forever.
    db.execute(
        "INSERT INTO connector_admin_request (request_id, method, response, created_at)"
        " VALUES ('ancient', 'm', '\\x00', now() - interval '900 days')"
    )
    res = await sweep_now(db_url, delivered_s=DAY, admin_s=0)
    assert res.deleted["connector_admin_request"] == 0 and totals(db)[3] == 3


def test_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = RetentionConfig.from_settings(ExecutorSettings())
    assert cfg == RetentionConfig(delivered_s=604_800, admin_requests_s=86_400, interval_s=60, batch=1_000)
    monkeypatch.setenv("CONNECTOR_EXECUTOR_RETENTION_DELIVERED_S", "0")
    monkeypatch.setenv("CONNECTOR_EXECUTOR_RETENTION_ADMIN_REQUESTS_S", "3600")
    monkeypatch.setenv("CONNECTOR_EXECUTOR_RETENTION_INTERVAL_S", "5")
    monkeypatch.setenv("CONNECTOR_EXECUTOR_RETENTION_BATCH", "250")
    cfg = RetentionConfig.from_settings(ExecutorSettings())
    assert cfg == RetentionConfig(delivered_s=0, admin_requests_s=3_600, interval_s=5, batch=250)
    assert cfg.enabled
    assert not RetentionConfig(delivered_s=0, admin_requests_s=0).enabled
    monkeypatch.setenv("CONNECTOR_EXECUTOR_RETENTION_BATCH", "0")
    with pytest.raises(ValueError, match=r"RETENTION_BATCH|retention_batch"):
        ExecutorSettings()


# --------------------------------------------------------------------------------------------------
# Lanes
# --------------------------------------------------------------------------------------------------


async def _lane_states(adb: psycopg.AsyncConnection) -> dict[int, str]:
    cur = await adb.execute("SELECT work_id, state FROM connector_work_item ORDER BY work_id")
    return {int(r[0]): str(r[1]) for r in await cur.fetchall()}


async def _settle_all(adb: psycopg.AsyncConnection, lanes: list[tuple[int, str, str]]) -> tuple[int, int]:
    async with adb.transaction():
        locked = await lane_lock_batch(adb, lanes)
        r = await lane_settle_batch(adb, locked, demote=True)
    return r.promoted, r.demoted


async def test_deleting_succeeded_members_changes_no_lane(db, adb, db_url) -> None:
    # Source lane S: two old succeeded members, then a young runnable head and a blocked follower.
    s_old = [delivery(db, source_lane="S") for _ in range(2)]
    s_head = delivery(db, [["pending"]], age_s=60, source_lane="S")
    s_next = delivery(db, [["blocked"]], age_s=60, source_lane="S")
    # Target lane T: an old succeeded member, an old in-flight one (kept), a blocked follower.
    t_old = delivery(db, target_lane="T")
    t_busy = delivery(db, [["processing"]], target_lane="T")
    t_next = delivery(db, [["blocked"]], age_s=60, target_lane="T")
    # Source lane D: an old succeeded member, then an old dead head that holds the lane (kept).
    d_old = delivery(db, source_lane="D")
    d_dead = delivery(db, [["dead"]], source_lane="D")
    d_next = delivery(db, [["blocked"]], age_s=60, source_lane="D")
    lanes = [(PACK, "s", "S"), (PACK, "t", "T"), (PACK, "s", "D")]
    assert await _settle_all(adb, lanes) == (0, 0)  # a settled starting point
    before = await _lane_states(adb)

    res = await sweep_now(db_url)
    assert res.deliveries == 4
    for d in (*s_old, t_old, d_old):
        assert present(db, d) == (0, 0, 0)
    after = await _lane_states(adb)
    gone = {w for d in (*s_old, t_old, d_old) for w in d.work_ids}
    assert after == {w: s for w, s in before.items() if w not in gone}
    # The lane facts agree with the rows: nothing to promote or re-block, nothing stuck.
    assert await _settle_all(adb, lanes) == (0, 0)
    assert (await lane_repair(adb)).promoted == 0
    assert await _lane_states(adb) == after
    assert after[s_head.work_ids[0]] == "pending" and after[s_next.work_ids[0]] == "blocked"
    assert after[t_next.work_ids[0]] == "blocked" and after[d_next.work_ids[0]] == "blocked"

    # Control: deleting a *holding* member (the dead head) does change its lane, and the checks
    # above see it.
    await adb.execute("DELETE FROM connector_work_item WHERE work_id = %s", (d_dead.work_ids[0],))
    assert await _settle_all(adb, lanes) == (1, 0)
    assert (await _lane_states(adb))[d_next.work_ids[0]] == "pending"
    assert present(db, t_busy) == whole(t_busy)


# --------------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------------

_SUMMARY = re.compile(
    r"(would delete|deleted) (\d+) deliveries accepted more than \S+ ago \((\d+) receipts, (\d+) events,"
    r" (\d+) work items\)"
)


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], db_url: str, *args: str):
    monkeypatch.setenv("CONNECTOR_DATABASE_URL", db_url)
    monkeypatch.setenv("CONNECTOR_EXECUTOR_RETENTION_ADMIN_REQUESTS_S", "86400")
    code = cli_main.main(["retention", "sweep", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_dry_run_changes_nothing_and_counts_what_the_sweep_deletes(
    db, db_url, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(25):
        delivery(db, [["succeeded"] * (1 + i % 3)] * (1 + i % 2), age_s=(2 + i) * DAY)
    kept = [delivery(db, [["succeeded", "dead"]]), delivery(db, router_status="failed", events=[])]
    young = delivery(db, age_s=3_600)
    db.execute(
        "INSERT INTO connector_admin_request (request_id, method, response, created_at)"
        " VALUES ('old', 'm', '\\x00', now() - interval '2 days')"
    )
    before = totals(db)
    code, out, err = _cli(monkeypatch, capsys, db_url, "--dry-run", "--older-than", "36h", "--batch", "4")
    assert code == 0, err
    assert totals(db) == before
    m = _SUMMARY.search(out)
    assert m is not None and m.group(1) == "would delete", out
    would = tuple(int(x) for x in m.groups()[1:])
    events = sum(1 + i % 2 for i in range(25))
    assert would == (25, 25, events, sum((1 + i % 3) * (1 + i % 2) for i in range(25))), out
    assert "dead_letter 1" in out and "not_materialized 1" in out
    assert "would delete 1 admin request ids" in out
    # Progress per chunk on stderr (28 receipts in chunks of 4).
    assert len(re.findall(r"^retention: chunk \d+:", err, re.M)) == 7, err

    code, out, err = _cli(monkeypatch, capsys, db_url, "--older-than", "36h", "--batch", "4")
    assert code == 0, err
    m = _SUMMARY.search(out)
    assert m is not None and m.group(1) == "deleted", out
    assert tuple(int(x) for x in m.groups()[1:]) == would
    after = totals(db)
    assert (before[0] - after[0], before[1] - after[1], before[2] - after[2]) == (
        would[1], would[2], would[3],
    )  # fmt: skip
    assert after[3] == 0
    assert all(present(db, d) == whole(d) for d in (*kept, young))


def test_cli_bad_input_exits_2_and_changes_nothing(
    db, db_url, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = delivery(db, age_s=30 * DAY)
    before = totals(db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    env["CONNECTOR_DATABASE_URL"] = db_url
    result = subprocess.run(
        [str(CONNECTOR), "retention", "sweep", "--older-than", "5x"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--older-than '5x' is not a duration" in result.stderr
    for args in (["--older-than", "0d"], ["--older-than", "7"], ["--batch", "0"], ["--batch", "ten"]):
        code, _out, err = _cli(monkeypatch, capsys, db_url, *args)
        assert code == 2, (args, err)
        assert "connector retention sweep:" in err
    assert totals(db) == before and present(db, d) == whole(d)


# --------------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------------

BIG = (
    "connector_ingress_receipt",
    "connector_event",
    "connector_work_item",
    "connector_legacy_outcome_receipt",
    "connector_work_attempt",
)
RECEIPTS = 50_000


def _buffers(plan: str) -> int:
    """Shared buffers the whole statement touched (the plan's first Buffers line)."""
    m = re.search(r"Buffers: shared((?: \w+=\d+)+)", plan)
    assert m is not None, plan
    counts = dict(kv.split("=") for kv in m.group(1).split())
    return int(counts.get("hit", 0)) + int(counts.get("read", 0))


@pytest.mark.slow
def test_chunk_statements_use_indexes_on_a_large_table(db) -> None:
    """50k deliveries, 40k of them old (1 in 10 kept as a dead letter), 5k legacy outcome receipts:
    every chunk statement reads by key, never a whole table, and touches a bounded number of
    buffers per receipt of the chunk (so a chunk costs the same at any table size)."""
    pack = seed.seed_pack(db, "p", {"w": seed.python_work_type("tests.executor.effects:noop")})
    seed.seed_items(db, pack, RECEIPTS)
    db.execute(
        """UPDATE connector_ingress_receipt SET accepted_at = now() - interval '10 days'
           WHERE receipt_id <= (SELECT min(receipt_id) + 39999 FROM connector_ingress_receipt)"""
    )
    db.execute(
        "UPDATE connector_work_item SET state = CASE WHEN work_id % 10 = 0 THEN 'dead' ELSE 'succeeded' END"
    )
    # Two kept attempts of every fifth WorkItem (succeeded after failures, or dead): 20k rows.
    db.execute(
        """INSERT INTO connector_work_attempt (work_id, slot, lease_token, attempt, started_at, ended_at,
             outcome)
           SELECT work_id, n, n, n, now(), now(), 'retry'
           FROM connector_work_item, generate_series(1, 2) n WHERE work_id % 5 = 0"""
    )
    db.execute(
        """INSERT INTO connector_legacy_outcome_receipt (installed_pack_id, generation, event_id, work_type,
             version, outcome, actor, digest)
           SELECT installed_pack_id, 1, event_id, 'w', 1, 'succeeded', 'legacy:x', 'd'
           FROM connector_event ORDER BY event_id DESC LIMIT 5000"""
    )
    for t in BIG:
        db.execute(f"VACUUM ANALYZE {t}")
    first = int(db.execute("SELECT min(receipt_id) FROM connector_ingress_receipt").fetchone()[0])  # type: ignore[index]
    cutoff = db.execute("SELECT now() - interval '1 day'").fetchone()[0]  # type: ignore[index]
    old_chunk = {"after": first + 10_000, "batch": 1000, "cutoff": cutoff}
    young_chunk = {"after": first + 45_000, "batch": 1000, "cutoff": cutoff}
    rows = db.execute(deliveries.RECEIPT_CHUNK_CLASSIFY, old_chunk).fetchall()
    retired = [r for r in rows if r[1] and r[2] is None]
    assert len(rows) == 1000 and 850 <= len(retired) <= 950, len(retired)
    assert {r[2] for r in rows if r not in retired} == {"dead_letter"}
    event_ids = [int(e) for r in retired for e in r[3]]
    work_ids = [int(w) for r in retired for w in r[4]]
    receipt_ids = [int(r[0]) for r in retired]
    n = len(retired)
    # (name, statement, parameters, indexes it must use, most buffers it may touch)
    cases: list[tuple[str, str, dict[str, Any], set[str], int]] = [
        ("classify", deliveries.RECEIPT_CHUNK_CLASSIFY, old_chunk,
         {"pk_connector_ingress_receipt", "uq_connector_event_receipt_id_event_index",
          "uq_connector_work_item_event_id_work_type",
          "uq_connector_legacy_outcome_receipt_event_id_work_type_version"}, 15 * 1000),
        ("classify young", deliveries.RECEIPT_CHUNK_CLASSIFY, young_chunk,
         {"pk_connector_ingress_receipt"}, 200),
        ("work items", deliveries.WORK_ITEM_DELETE_RETIRED, {"work_ids": work_ids},
         {"pk_connector_work_item", "pk_connector_work_attempt"}, 8 * n),
        ("events", deliveries.EVENT_DELETE_RETIRED, {"event_ids": event_ids}, {"pk_connector_event"}, 8 * n),
        ("receipts", deliveries.RECEIPT_DELETE_RETIRED, {"receipt_ids": receipt_ids, "cutoff": cutoff},
         {"pk_connector_ingress_receipt"}, 8 * n),
        ("oldest", receipts.admin.RECEIPT_OLDEST_AGE, {}, {"pk_connector_ingress_receipt"}, 20),
    ]  # fmt: skip
    kept = "SELECT count(*) FROM connector_work_attempt WHERE work_id = ANY(%s)"
    assert db.execute(kept, (work_ids,)).fetchone()[0] > 0  # type: ignore[index]
    with db.transaction(force_rollback=True):  # the deletes run in order, as in a chunk, then undone
        for name, query, params, indexes, most in cases:
            if name == "events":  # the WorkItems are gone: their attempts with them
                assert db.execute(kept, (work_ids,)).fetchone()[0] == 0  # type: ignore[index]
            plan = "\n".join(
                r[0] for r in db.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query, params).fetchall()
            )
            seqs = [t for t in BIG if re.search(rf"Seq Scan on {t}\b", plan)]
            assert not seqs, f"{name}: sequential scan of {seqs}\n{plan}"
            used = set(
                re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan) (?:using|on) (\w+)", plan)
            )
            assert indexes <= used, f"{name}: expected {indexes - used}\n{plan}"
            assert _buffers(plan) <= most, f"{name}: {_buffers(plan)} buffers > {most}\n{plan}"
            if name == "classify young":
                # Young receipts are not probed at all (the lateral's one-time filter).
                assert "One-Time Filter" in plan, plan
                assert re.search(
                    r"uq_connector_event_receipt_id_event_index on connector_event e \(never", plan
                )
