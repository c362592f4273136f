"""Queue-table upkeep (ADR 008) against the real server: when it vacuums and analyzes, that one
process at a time does it per table, that a table the role does not own is refused and reported,
and that its ANALYZE re-makes a prepared claim plan that was made on an empty table."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from connector.common.maintenance.upkeep import (
    UPKEEP_LOCK_CLASS,
    UPKEEP_RUNS,
    TableStatus,
    Upkeep,
    UpkeepConfig,
    analyze_due,
    is_active,
    vacuum_due,
)
from connector.common.store import work_items
from tests.executor import seed
from tests.plans import positional

WI = "connector_work_item"
SMALL = UpkeepConfig(mode="on", vacuum_dead_rows=500, analyze_rows=500)


def _status(**kw: Any) -> TableStatus:
    base = dict(
        name=WI, oid=1, live=0, dead=0, changed=0, analyzed=True, autovacuum_off=False, may_vacuum=True
    )
    return TableStatus(**{**base, **kw})


def test_decisions() -> None:
    # auto: exactly when autovacuum does not cover the table (server off, or the table opted out)
    assert is_active("auto", server_autovacuum=False, table_autovacuum_off=False)
    assert is_active("auto", server_autovacuum=True, table_autovacuum_off=True)
    assert not is_active("auto", server_autovacuum=True, table_autovacuum_off=False)
    assert is_active("on", server_autovacuum=True, table_autovacuum_off=False)
    assert not is_active("off", server_autovacuum=False, table_autovacuum_off=True)
    cfg = UpkeepConfig(
        vacuum_dead_rows=1000, vacuum_dead_fraction=0.1, analyze_rows=100, analyze_fraction=0.5
    )
    assert not vacuum_due(cfg, _status(live=10_000, dead=2_000))  # threshold 1000 + 1000
    assert vacuum_due(cfg, _status(live=10_000, dead=2_001))
    assert not analyze_due(cfg, _status(live=10_000, changed=5_100))
    assert analyze_due(cfg, _status(live=10_000, changed=5_101))
    assert analyze_due(cfg, _status(live=5_000, analyzed=False))  # never analyzed, not tiny
    assert not analyze_due(cfg, _status(live=10, analyzed=False))
    with pytest.raises(ValueError, match="upkeep mode"):
        UpkeepConfig(mode="sometimes")


def _churn(db: psycopg.Connection, n: int) -> int:
    """n items claimed and finished with no vacuum in between: 2n dead row versions."""
    pack = seed.seed_pack(
        db, f"p{uuid.uuid4().hex[:6]}", {"w": seed.python_work_type("tests.executor.effects:noop")}
    )
    seed.seed_items(db, pack, n)
    db.execute(
        "UPDATE connector_work_item SET state = 'processing', lease_owner = 'x', lease_token = 1,"
        " lease_until = now() + interval '1 min' WHERE installed_pack_id = %s",
        (pack,),
    )
    db.execute(
        "UPDATE connector_work_item SET state = 'succeeded', lease_owner = NULL, lease_until = NULL,"
        " finished_at = now() WHERE installed_pack_id = %s",
        (pack,),
    )
    # This backend's counters reach pg_stat_user_tables at its next transaction end.
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT 1")
    return pack


def _stats(db: psycopg.Connection) -> tuple[int, int, int]:
    row = db.execute(
        "SELECT n_dead_tup, vacuum_count, analyze_count FROM pg_stat_user_tables WHERE relname = %s", (WI,)
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _runs(op: str) -> float:
    return UPKEEP_RUNS.labels("test", WI, op)._value.get()


async def test_vacuums_and_analyzes_a_churned_table(db: psycopg.Connection, db_url: str) -> None:
    _churn(db, 2_000)
    dead, vacuums, analyzes = _stats(db)
    assert dead >= 4_000 and vacuums == 0 and analyzes == 0
    before = (_runs("vacuum"), _runs("analyze"))
    upkeep = Upkeep(db_url, "test", [WI, "connector_event"], SMALL)
    try:
        first = await upkeep.run_once()
        # The events were only inserted: analyzed (2,000 new rows), not vacuumed (none dead).
        assert first.vacuumed == [WI] and sorted(first.analyzed) == ["connector_event", WI], first
        dead, vacuums, analyzes = _stats(db)
        assert dead == 0 and vacuums == 1 and analyzes == 1
        assert (_runs("vacuum"), _runs("analyze")) == (before[0] + 1, before[1] + 1)
        # Nothing is due any more: a second pass does nothing.
        second = await upkeep.run_once()
        assert second.vacuumed == [] and second.analyzed == [], second
        assert _stats(db)[1:] == (1, 1)
    finally:
        await upkeep.stop()


async def test_auto_mode_follows_autovacuum(db: psycopg.Connection, db_url: str) -> None:
    _churn(db, 600)
    server_on = bool(
        db.execute(
            "SELECT current_setting('autovacuum') = 'on' AND current_setting('track_counts') = 'on'"
        ).fetchone()[0]  # type: ignore[index]
    )
    auto = Upkeep(db_url, "test", [WI], UpkeepConfig(mode="auto", vacuum_dead_rows=500, analyze_rows=500))
    try:
        result = await auto.run_once()
        # Whatever the server says: maintained exactly when its autovacuum is off.
        assert (result.vacuumed == [WI]) is (not server_on), (server_on, result)
        assert (result.inactive == [WI]) is server_on, (server_on, result)
        # A table that opts out of autovacuum is maintained even where the server runs it.
        db.execute("ALTER TABLE connector_work_item SET (autovacuum_enabled = false)")
        _churn(db, 600)
        result = await auto.run_once()
        assert result.vacuumed == [WI] and result.inactive == [], result
    finally:
        await auto.stop()
    off = Upkeep(db_url, "test", [WI], UpkeepConfig(mode="off"))
    _churn(db, 600)
    vacuums = _stats(db)[1]
    off.start()  # mode off starts no loop at all
    assert not off.running
    await off.stop()
    assert _stats(db)[1] == vacuums


async def test_one_process_per_table(db: psycopg.Connection, db_url: str) -> None:
    _churn(db, 600)
    oid = db.execute("SELECT %s::regclass::oid::int", (WI,)).fetchone()[0]  # type: ignore[index]
    other = psycopg.connect(db_url, autocommit=True)  # another process, on the same table
    upkeep = Upkeep(db_url, "test", [WI], SMALL)
    try:
        assert other.execute("SELECT pg_try_advisory_lock(%s, %s)", (UPKEEP_LOCK_CLASS, oid)).fetchone()[0]  # type: ignore[index]
        busy = await upkeep.run_once()
        assert busy.busy == [WI] and busy.vacuumed == [], busy
        assert _stats(db)[1] == 0
        other.execute("SELECT pg_advisory_unlock(%s, %s)", (UPKEEP_LOCK_CLASS, oid))
        done = await upkeep.run_once()
        assert done.vacuumed == [WI], done
        # ...and it let go of the lock afterwards.
        assert other.execute("SELECT pg_try_advisory_lock(%s, %s)", (UPKEEP_LOCK_CLASS, oid)).fetchone()[0]  # type: ignore[index]
    finally:
        other.close()
        await upkeep.stop()


async def test_a_table_the_role_does_not_own_is_refused(
    db: psycopg.Connection, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _churn(db, 600)
    role = f"connector_upkeep_t_{uuid.uuid4().hex[:8]}"
    dbname = db.info.dbname
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        db.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(dbname), sql.Identifier(role))
        )
        url = psycopg.conninfo.make_conninfo(db_url, user=role)
        upkeep = Upkeep(url, "test", [WI], SMALL)
        try:
            with caplog.at_level("WARNING", logger="connector.upkeep"):
                first = await upkeep.run_once()
                second = await upkeep.run_once()
        finally:
            await upkeep.stop()
        assert first.refused == [WI] and second.refused == [WI] and first.vacuumed == []
        assert _stats(db)[1] == 0
        warnings = [r for r in caplog.records if "does not own" in r.getMessage()]
        assert len(warnings) == 1  # reported once, not every pass
    finally:
        db.execute(
            sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(
                sql.Identifier(dbname), sql.Identifier(role)
            )
        )
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_analyze_remakes_a_claim_plan_made_on_an_empty_table(
    db: psycopg.Connection, db_url: str
) -> None:
    """A prepared statement keeps the generic plan it made first. Made while the table held a
    handful of rows and had never been analyzed, the claim's by-id update walked the ready index
    (its cost grows with every item claimed since the last vacuum). The upkeep's ANALYZE
    invalidates it: the next execution is planned for the table as it is and looks ids up by the
    primary key."""
    pack = seed.seed_pack(db, "p", {"w": seed.python_work_type("tests.executor.effects:noop")})
    seed.seed_items(db, pack, 64)
    db.execute("SET plan_cache_mode = force_generic_plan")
    body, order = positional(work_items.claim.WORK_ITEM_CLAIM_BATCH)
    db.execute("PREPARE claim AS " + body)
    params = {
        "packs": [pack],
        "queue_classes": ["default"],
        "limits": [64],
        "owner": "o",
        "lease_s": 30.0,
        "process": None,
    }
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE claim({})").format(
        sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
    )

    def outer_scan() -> str:
        with db.transaction(force_rollback=True):
            plan = [r[0] for r in db.execute(explain).fetchall()]
        # The update's own scan is the last scan of connector_work_item in the plan.
        # (The candidate read is ``w``, the claim's update ``w_N`` in the plan.)
        scans = [ln.strip() for ln in plan if re.search(r"Scan.* on connector_work_item w(_\d+)?\b", ln)]
        assert scans, plan
        return scans[-1]

    outer_scan()  # the generic plan is made now, on 64 rows
    seed.seed_items(db, pack, 20_000)
    db.execute(
        "UPDATE connector_work_item SET state = 'processing', lease_owner = 'y', lease_token = 1,"
        " lease_until = now() + interval '1 min' WHERE work_id IN"
        " (SELECT work_id FROM connector_work_item ORDER BY work_id LIMIT 20000)"
    )
    db.execute("UPDATE connector_work_item SET state = 'succeeded', lease_owner = NULL, lease_until = NULL"
               " WHERE state = 'processing'")  # fmt: skip
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT 1")
    stale = outer_scan()
    assert "pk_connector_work_item" not in stale, stale  # the trap is there (control)
    upkeep = Upkeep(db_url, "test", [WI], SMALL)
    try:
        assert WI in (await upkeep.run_once()).analyzed
    finally:
        await upkeep.stop()
    fresh = outer_scan()
    assert "pk_connector_work_item" in fresh, fresh
