"""Legacy outcome receipts: versioned, fenced, idempotent to deliver twice and to project twice; a
contradicting receipt never overwrites a reconciled row and blocks re-cutover."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from connector.common.store import authority
from connector.common.store import legacy as legacy_store
from connector.executor import cutover, legacy
from connector.executor.legacy import legacy_outcome_project, outcome_digest

from .conftest import Rig


async def _rollback(rig: Rig) -> cutover.Transition:
    await cutover.rollback_begin(rig.conn, rig.pack, rig.generation, actor="test")
    return await cutover.rollback_complete(rig.conn, rig.pack, rig.generation, actor="test")


async def _claim(rig: Rig, owner: str, limit: int, lease_s: float = 30.0) -> list[tuple[int, int, int]]:
    """Claim like a legacy executor would: scheduler lease first, then the claim statement."""
    params: dict[str, Any] = {
        "pack": rig.pack,
        "generation": rig.generation,
        "owner": owner,
        "lease_s": lease_s,
    }
    row = await (await rig.conn.execute(authority.SCHEDULER_LEASE_ACQUIRE, params)).fetchone()
    assert row is not None, "scheduler lease acquired"
    cur = await rig.conn.execute(
        legacy_store.EVENT_LEGACY_CLAIM_BATCH, {**params, "lease_token": row[0], "limit": limit}
    )
    return [(int(r[0]), int(r[1]), int(r[2])) for r in await cur.fetchall()]


async def _finalize(rig: Rig, event_id: int, token: int, outcome: str = "succeeded") -> tuple[int, list[int]]:
    cls = None if outcome == "succeeded" else "permanent_test"
    row = await (
        await rig.conn.execute(
            legacy_store.EVENT_LEGACY_FINALIZE,
            {
                "event_id": event_id,
                "token": token,
                "state": outcome,
                "delay_s": 0.0,
                "refund": 0,
                "work_types": ["sync"],
                "outcomes": [outcome],
                "classes": [cls],
                "summaries": [None],
                "digests": [outcome_digest(event_id, "sync", outcome, cls)],
                "actor": "legacy:test",
            },
        )
    ).fetchone()
    assert row is not None
    return int(row[0]), list(row[1])


async def test_duplicate_terminal_delivery_and_repeated_projection_change_nothing(rig: Rig) -> None:
    await rig.install()
    events = await rig.deliver("ok", "ok")
    await _rollback(rig)
    claimed = await _claim(rig, "holder-a", 10)
    assert sorted(e for e, _, _ in claimed) == sorted(events)
    tokens = {e: t for e, t, _ in claimed}

    # Event + receipt in one statement; a second delivery of the same outcome writes nothing new.
    matched, receipt_ids = await _finalize(rig, events[0], tokens[events[0]])
    assert (matched, len(receipt_ids)) == (1, 1)
    assert await _finalize(rig, events[0], tokens[events[0]]) == (0, []), (
        "fenced: the event is not processing"
    )
    assert await rig.scalar("SELECT count(*) FROM connector_legacy_outcome_receipt") == 1

    first = await legacy_outcome_project(rig.conn)
    assert (first.projected, first.duplicates, first.conflicts) == (1, 0, 0)
    again = await legacy_outcome_project(rig.conn)
    assert (again.projected, again.duplicates, again.conflicts) == (0, 0, 0), "projection is idempotent"
    reconciled = await rig.rows(
        "SELECT state, legacy_outcome_receipt_version, legacy_outcome_digest, updated_at"
        " FROM connector_work_item WHERE event_id = %s",
        (events[0],),
    )
    assert reconciled[0][:2] == ("reconciled_legacy_terminal", 1)

    # An older binary delivers the same terminal outcome again as a new version: recorded, projected
    # as a duplicate, and the reconciled row keeps its first receipt.
    digest = outcome_digest(events[0], "sync", "succeeded", None)
    await rig.conn.execute(
        """INSERT INTO connector_legacy_outcome_receipt (installed_pack_id, generation, event_id, work_type,
             version, outcome, actor, digest)
           VALUES (%s, %s, %s, 'sync', 2, 'succeeded', 'legacy:old', %s)""",
        (rig.pack, rig.generation, events[0], digest),
    )
    dup = await legacy_outcome_project(rig.conn)
    assert (dup.projected, dup.duplicates, dup.conflicts) == (0, 1, 0)
    assert (
        await rig.rows(
            "SELECT state, legacy_outcome_receipt_version, legacy_outcome_digest, updated_at"
            " FROM connector_work_item WHERE event_id = %s",
            (events[0],),
        )
        == reconciled
    )

    # A stale holder (its lease reclaimed and re-claimed by another) cannot finalize or write receipts.
    await rig.conn.execute(
        "UPDATE connector_event SET legacy_lease_until = clock_timestamp() - interval '1 second'"
        " WHERE event_id = %s",
        (events[1],),
    )
    params = {"pack": rig.pack, "generation": rig.generation, "owner": "holder-a"}
    lease_token = await rig.scalar(
        "SELECT token FROM connector_scheduler_lease WHERE installed_pack_id = %s", (rig.pack,)
    )
    cur = await rig.conn.execute(
        legacy_store.EVENT_LEGACY_RECLAIM_EXPIRED, {**params, "lease_token": lease_token}
    )
    assert [int(r[0]) for r in await cur.fetchall()] == [events[1]]
    reclaimed = await _claim(rig, "holder-a", 10)
    assert [e for e, _, _ in reclaimed] == [events[1]]
    assert await _finalize(rig, events[1], tokens[events[1]]) == (0, []), "the stale token writes nothing"
    assert (
        await rig.scalar(
            "SELECT count(*) FROM connector_legacy_outcome_receipt WHERE event_id = %s", (events[1],)
        )
        == 0
    )
    assert (await _finalize(rig, events[1], reclaimed[0][1]))[0] == 1


async def test_contradicting_receipt_is_never_applied_and_blocks_recutover(rig: Rig) -> None:
    await rig.install()
    events = await rig.deliver("ok")
    await _rollback(rig)
    ((event_id, token, _),) = await _claim(rig, "holder-a", 10)
    await _finalize(rig, event_id, token, "succeeded")
    await legacy_outcome_project(rig.conn)
    before = await rig.rows("SELECT * FROM connector_work_item WHERE event_id = %s", (event_id,))

    # A later receipt saying the opposite: left unprojected, the reconciled row untouched.
    await rig.conn.execute(
        """INSERT INTO connector_legacy_outcome_receipt (installed_pack_id, generation, event_id, work_type,
             version, outcome, failure_class, actor, digest)
           VALUES (%s, %s, %s, 'sync', 2, 'failed', 'permanent_test', 'legacy:old', %s)""",
        (rig.pack, rig.generation, event_id, outcome_digest(event_id, "sync", "failed", "permanent_test")),
    )
    report = await legacy_outcome_project(rig.conn)
    assert (report.projected, report.conflicts) == (0, 1)
    assert await rig.rows("SELECT * FROM connector_work_item WHERE event_id = %s", (event_id,)) == before

    await rig.conn.execute("DELETE FROM connector_scheduler_lease")  # the holder is gone
    await cutover.legacy_quiesce(rig.conn, rig.pack, rig.generation, actor="test")
    with pytest.raises(cutover.CutoverBlocked) as blocked:
        await cutover.cutover_complete(rig.conn, rig.pack, rig.generation, actor="test")
    assert [b.code for b in blocked.value.blockers] == ["legacy_receipt_conflict"]
    assert await rig.authority() == ("none", "quiescing"), "nothing changed"
    assert events


async def test_concurrent_projectors_project_each_receipt_once(rig: Rig) -> None:
    await rig.install()
    events = await rig.deliver(*["ok"] * 24)
    rolled = await _rollback(rig)
    claimed = await _claim(rig, "holder-a", 100)
    assert len(claimed) == 24
    for event_id, token, _ in claimed:  # committed receipts, none projected (a crash after each commit)
        assert (await _finalize(rig, event_id, token, "failed" if event_id % 3 == 0 else "succeeded"))[0] == 1
    assert await rig.scalar("SELECT count(*) FROM connector_legacy_outcome_receipt WHERE NOT projected") == 24

    async def project() -> legacy.ProjectionReport:
        async with await psycopg.AsyncConnection.connect(rig.url, autocommit=True) as conn:
            return await legacy_outcome_project(conn, batch=5)

    reports = await asyncio.gather(*(project() for _ in range(3)))
    assert sum(r.projected for r in reports) == 24
    assert sum(r.duplicates + r.conflicts for r in reports) == 0
    assert sum(len(r.fences_resolved) for r in reports) == 1
    items = await rig.work_items(events)
    assert {s for s, _, _ in items.values()} == {"reconciled_legacy_terminal"}
    assert {v for _, v, _ in items.values()} == {1}
    assert (
        await rig.scalar(
            "SELECT status FROM connector_rollback_fence WHERE fence_id = %s", (rolled.fence_id,)
        )
        == "resolved"
    )
    outcomes = dict(
        await rig.rows(
            "SELECT event_id, outcome FROM connector_work_item WHERE event_id = ANY(%s)", (events,)
        )
    )
    assert outcomes == {e: ("failed" if e % 3 == 0 else "succeeded") for e in events}
