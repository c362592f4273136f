"""Idle debounce key rows are deleted (``debounce.debounce_retire``, run by the reclaimer's check):
a key none of whose WorkItems is in any state but succeeded and coalesced, at least ``idle_s`` old.
Every other key row stays (a waiting, running, dead or cancelled item needs it: without its key row
a debounced item is never claimed).

The race proofs: a retirement forced into an open materializer transaction (the key row locked, its
item inserted) leaves the key, and a writer creating debounced WorkItems through the materializer's
insert while a retirer deletes idle keys as fast as it can never finds its item's key gone. Control:
the retirement without its locking statement (its check then runs on a snapshot taken before the
writer committed) deletes the key under the committed item."""

from __future__ import annotations

import asyncio
import random

import psycopg
import pytest

from connector.common.store import debounce
from connector.common.store.debounce import DebounceKey
from tests.executor import seed

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}


def _keys(db: psycopg.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT debounce_key FROM connector_debounce")}


async def test_only_keys_no_work_item_needs_are_deleted(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    states = ["succeeded", "coalesced", "pending", "retry", "processing", "dead", "cancelled"]
    for st in states:
        ids = await seed.seed_debounced(adb, pack, [f"k-{st}"], window_s=1.0)
        db.execute(
            "UPDATE connector_work_item SET state = %s, lease_owner = 'x',"
            " lease_until = now() + interval '1 h',"
            " covered_by = CASE WHEN %s = 'coalesced' THEN work_id END WHERE work_id = ANY(%s)",
            (st, st, ids),
        )
    # A key whose items are gone (retention deleted them); one whose last execution started just now.
    await seed.seed_debounced(adb, pack, ["k-gone"], window_s=1.0)
    db.execute("DELETE FROM connector_work_item WHERE debounce_key = 'k-gone'")
    (recent,) = await seed.seed_debounced(adb, pack, ["k-recent"], window_s=1.0)
    db.execute(
        "UPDATE connector_work_item SET state = 'succeeded', started_at = now() WHERE work_id = %s", (recent,)
    )
    db.execute(
        "UPDATE connector_debounce SET last_claimed_id = %s WHERE debounce_key = 'k-recent'", (recent,)
    )
    cursor = debounce.DebounceCursor()
    assert await debounce.debounce_retire(adb, cursor, idle_s=3600.0) == 0  # too young
    assert await debounce.debounce_retire(adb, cursor, idle_s=0.0) == 4
    assert _keys(db) == {f"k-{st}" for st in states if st not in ("succeeded", "coalesced")}
    # A new item of a retired key re-creates it and is claimable.
    await seed.seed_debounced(adb, pack, ["k-gone"], window_s=0.01)
    assert "k-gone" in _keys(db)


async def test_the_walk_goes_page_by_page_and_wraps(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    await seed.seed_debounced(adb, pack, [f"k{i:03d}" for i in range(25)], window_s=1.0)
    db.execute("UPDATE connector_work_item SET state = 'succeeded'")
    cursor = debounce.DebounceCursor()
    assert await debounce.debounce_retire(adb, cursor, idle_s=0.0, limit=5, pages=2) == 10
    assert (cursor.pack, cursor.work_type, cursor.key) == (pack, "w", "k009")
    assert await debounce.debounce_retire(adb, cursor, idle_s=0.0, limit=5, pages=10) == 15
    assert cursor.key == "" and _keys(db) == set()


@pytest.mark.parametrize("control", [False, True], ids=["locked", "control-no-lock"])
async def test_a_retirement_during_a_creating_transaction_keeps_the_key(
    db, db_url, adb, monkeypatch, control
) -> None:
    """The interleaving that would lose a key, forced: a materializer transaction has locked the key
    row and inserted its item, not yet committed, when a retirement runs. The retirement skips the
    locked row; the control (no locking statement) takes its check's snapshot now, waits for the
    row, and then deletes it under the committed item."""
    if control:
        assert "FOR UPDATE SKIP LOCKED" in debounce.DEBOUNCE_RETIRE_LOCK
        monkeypatch.setattr(
            debounce,
            "DEBOUNCE_RETIRE_LOCK",
            debounce.DEBOUNCE_RETIRE_LOCK.replace("FOR UPDATE SKIP LOCKED", ""),
        )
    pack = seed.seed_pack(db, "p", WT)
    (old,) = await seed.seed_debounced(adb, pack, ["k"], window_s=0.01)
    db.execute("UPDATE connector_work_item SET state = 'succeeded' WHERE work_id = %s", (old,))  # idle key
    writer = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    retirer = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    try:
        async with writer.transaction():
            await seed.seed_debounced(writer, pack, ["k"], window_s=0.01)  # key row locked, item in
            task = asyncio.create_task(
                debounce.debounce_retire(retirer, debounce.DebounceCursor(), idle_s=0.0)
            )
            for _ in range(500):  # until the retirement finished (skipped) or waits on the key row
                waiting = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = %s",
                    (retirer.info.backend_pid,),
                ).fetchone()[0]
                if task.done() or waiting:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the retirement neither finished nor waited")
        deleted = await task
    finally:
        await writer.close()
        await retirer.close()
    if control:
        assert deleted == 1 and _keys(db) == set()  # the key of a committed pending item is gone
    else:
        assert deleted == 0 and _keys(db) == {"k"}


async def test_a_creating_transaction_never_loses_its_key(db, db_url, adb) -> None:
    """Random interleavings: a writer creating items of 4 keys (each transaction widened a little)
    while a retirer deletes idle keys as fast as it can; after every commit the item's key exists."""
    pack = seed.seed_pack(db, "p", WT)
    rnd = random.Random(7)
    orphans: list[str] = []
    done = asyncio.Event()

    async def writer() -> None:
        conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
        try:
            for _ in range(150):
                key = f"k{rnd.randrange(4)}"
                async with conn.transaction():
                    # The key row locked first, as the materializer does, then the rest of the
                    # transaction (widened a little so a retirement can fall inside it).
                    await debounce.debounce_declare(conn, [DebounceKey(pack, "w", key, 0.01, 0.1)])
                    await asyncio.sleep(0.005)
                    (wid,) = await seed.seed_debounced(conn, pack, [key], window_s=0.01, max_wait_s=0.1)
                cur = await conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM connector_debounce WHERE debounce_key = %s)", (key,)
                )
                if not (await cur.fetchone())[0]:
                    orphans.append(key)
                await conn.execute(
                    "UPDATE connector_work_item SET state = 'succeeded' WHERE work_id = %s", (wid,)
                )
        finally:
            done.set()
            await conn.close()

    async def retirer() -> int:
        conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
        n = 0
        try:
            cursor = debounce.DebounceCursor()
            while not done.is_set():
                n += await debounce.debounce_retire(conn, cursor, idle_s=0.0)
                await asyncio.sleep(0)
        finally:
            await conn.close()
        return n

    _, retired = await asyncio.gather(writer(), retirer())
    assert retired > 0  # the retirer did delete idle keys meanwhile
    assert orphans == []
