"""Idle flow key rows are deleted (``flow.flow_keys_retire``, run by the reclaimer's check): a key row
no WorkItem needs any more (all its items succeeded or deleted), with its budget full or no slot
taken, and at least ``idle_s`` old. Every other key row stays — a dead or cancelled item may be
replayed and a blocked one promoted, and a WorkItem without its key row is never claimed.

The race proof: a writer inserts keyed WorkItems in transactions that declare their keys (as the
materializer does) while a retirer deletes idle keys as fast as it can; after every commit the new
item's key row exists. Control: without the keys lock (the retirement's exclusive lock and the
declarations' shared one) the same run leaves items whose key row was deleted under them."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import psycopg
import pytest

from connector.common.store import flow
from tests.executor import seed

WT = {"w": seed.python_work_type("tests.executor.effects:noop")}


def _keys(db: psycopg.Connection) -> tuple[set[str], set[str]]:
    rate = {r[0] for r in db.execute("SELECT rate_key FROM connector_rate_limit")}
    slots = {r[0] for r in db.execute("SELECT concurrency_key FROM connector_concurrency_limit")}
    return rate, slots


async def test_only_keys_no_work_item_needs_are_deleted(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    states = ["succeeded", "pending", "retry", "processing", "blocked", "dead", "cancelled"]
    for st in states:
        ids = seed.seed_items(db, pack, 1, rate_keys=[f"r-{st}"], concurrency_keys=[f"c-{st}"])
        db.execute(
            "UPDATE connector_work_item SET state = %s, lease_owner = 'x',"
            " lease_until = now() + interval '1 h' WHERE work_id = ANY(%s)",
            (st, ids),
        )
    # A key whose items are gone (retention deleted them) and one whose budget is spent.
    seed.seed_items(db, pack, 1, rate_keys=["r-gone"], concurrency_keys=["c-gone"])
    db.execute("DELETE FROM connector_work_item WHERE rate_key = 'r-gone'")
    seed.seed_items(db, pack, 1, rate_keys=["r-spent"], rate_limit=(1, 3600.0, 1))
    db.execute("UPDATE connector_work_item SET state = 'succeeded' WHERE rate_key = 'r-spent'")
    db.execute("UPDATE connector_rate_limit SET tat = now() + interval '1 hour' WHERE rate_key = 'r-spent'")
    # A slot still counted as taken (the check would recount it first).
    seed.seed_items(db, pack, 1, concurrency_keys=["c-taken"])
    db.execute("UPDATE connector_work_item SET state = 'succeeded' WHERE concurrency_key = 'c-taken'")
    db.execute("UPDATE connector_concurrency_limit SET in_flight = 1 WHERE concurrency_key = 'c-taken'")

    cursors = (flow.KeyCursor(), flow.KeyCursor())
    # Too young for an idle time of an hour: nothing goes.
    assert await flow.flow_keys_retire(adb, cursors, idle_s=3600.0) == (0, 0)
    deleted = await flow.flow_keys_retire(adb, cursors, idle_s=0.0)
    assert deleted == (2, 2), deleted
    rate, slots = _keys(db)
    assert rate == {f"r-{st}" for st in states if st != "succeeded"} | {"r-spent"}
    assert slots == {f"c-{st}" for st in states if st != "succeeded"} | {"c-taken"}


@pytest.mark.parametrize("control", [False, True], ids=["key-lock", "control-without-key-lock"])
async def test_a_key_a_claim_holds_is_left_for_the_next_round(db, db_url, adb, monkeypatch, control) -> None:
    """A claim holds its rate keys' advisory locks (``flow.RATE_KEY_LOCK``), not their rows: the
    retirement tries each key's lock and leaves a key a claim in flight holds (it goes next round).
    Control: without that try, the retirement deletes the key under the claim."""
    if control:
        lock = (
            f"\n    AND pg_try_advisory_xact_lock({flow.rate_key_lock('k.installed_pack_id', 'k.rate_key')})"
        )
        assert lock in flow.RATE_LIMIT_RETIRE
        monkeypatch.setattr(flow, "RATE_LIMIT_RETIRE", flow.RATE_LIMIT_RETIRE.replace(lock, ""))
    pack = seed.seed_pack(db, "p", WT)
    for key in ("held", "idle"):
        seed.seed_items(db, pack, 1, rate_keys=[key])
    db.execute("UPDATE connector_work_item SET state = 'succeeded'")
    claim = await psycopg.AsyncConnection.connect(db_url)
    try:
        await claim.execute(f"SELECT pg_advisory_xact_lock({flow.rate_key_lock('%s', '%s')})", (pack, "held"))
        cursors = (flow.KeyCursor(), flow.KeyCursor())
        deleted = await flow.flow_keys_retire(adb, cursors, idle_s=0.0)
        rate, _ = _keys(db)
        if control:
            assert deleted[0] == 2 and rate == set(), (deleted, rate)
            return
        assert deleted[0] == 1 and rate == {"held"}, (deleted, rate)
        await claim.rollback()
        assert (await flow.flow_keys_retire(adb, cursors, idle_s=0.0))[0] == 1
        assert _keys(db)[0] == set()
    finally:
        await claim.close()


async def test_the_walk_goes_page_by_page_and_wraps(db, adb) -> None:
    pack = seed.seed_pack(db, "p", WT)
    keys = [f"k{i:03d}" for i in range(25)]
    seed.seed_items(db, pack, 25, rate_keys=keys)
    db.execute("UPDATE connector_work_item SET state = 'succeeded'")
    cursors = (flow.KeyCursor(), flow.KeyCursor())
    # 2 pages of 5 per call: 10 keys, the cursor after the 10th.
    assert await flow.flow_keys_retire(adb, cursors, idle_s=0.0, limit=5, pages=2) == (10, 0)
    assert (cursors[0].pack, cursors[0].key) == (pack, "k009")
    assert await flow.flow_keys_retire(adb, cursors, idle_s=0.0, limit=5, pages=10) == (15, 0)
    assert cursors[0].key == ""  # the end of the table: the next call starts over
    assert _keys(db) == (set(), set())


@pytest.mark.parametrize("control", [False, True], ids=["locked", "control-no-lock"])
async def test_a_declaring_transaction_never_loses_its_key(db, db_url, adb, monkeypatch, control) -> None:
    if control:
        monkeypatch.setattr(flow, "FLOW_KEYS_RETIRE_LOCK", "SELECT 1")
        for name in ("RATE_LIMIT_DECLARE", "CONCURRENCY_DECLARE"):
            q = getattr(flow, name)
            assert flow.KEYS_LOCK_SHARED in q
            monkeypatch.setattr(flow, name, q.replace(flow.KEYS_LOCK_SHARED, "SELECT 1"))
    pack = seed.seed_pack(db, "p", WT)
    stop = threading.Event()
    orphans: list[str] = []
    rounds = 0
    rnd = random.Random(7)

    def writer() -> None:
        nonlocal rounds
        with psycopg.connect(db_url) as conn:  # not autocommit: one transaction per delivery
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline and rounds < 150:
                key = f"k{rnd.randrange(4)}"
                with conn.transaction():
                    # The declaration first, as the materializer does, then the rest of the
                    # transaction (widened a little so a retirement can fall inside it): the
                    # WorkItem with its key.
                    conn.execute(
                        flow.RATE_LIMIT_DECLARE,
                        {"packs": [pack], "keys": [key], "work_types": ["w"], "limits": [100],
                         "periods": [1.0], "bursts": [1]},
                    )  # fmt: skip
                    time.sleep(0.005)
                    (wid,) = seed.seed_items(conn, pack, 1)
                    conn.execute(
                        "UPDATE connector_work_item SET rate_key = %s WHERE work_id = %s", (key, wid)
                    )
                row = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM connector_rate_limit WHERE installed_pack_id = %s"
                    " AND rate_key = %s)",
                    (pack, key),
                ).fetchone()
                conn.commit()
                if not row[0]:
                    orphans.append(key)
                conn.execute("UPDATE connector_work_item SET state = 'succeeded' WHERE work_id = %s", (wid,))
                conn.commit()
                rounds += 1

    async def retirer() -> int:
        cursors = (flow.KeyCursor(), flow.KeyCursor())
        deleted = 0
        while not stop.is_set():
            r, _ = await flow.flow_keys_retire(adb, cursors, idle_s=0.0)
            deleted += r
            await asyncio.sleep(0)
        return deleted

    task = asyncio.create_task(retirer())
    try:
        await asyncio.to_thread(writer)
    finally:
        stop.set()
        deleted = await task
    assert rounds >= 50 and deleted > 0, (rounds, deleted)  # the two met: keys came and went
    if control:
        assert orphans, "the control should lose a key under a declaring transaction"
    else:
        assert orphans == []


async def test_the_executor_retires_the_keys_of_finished_work(db, executor_factory) -> None:
    """An executor runs keyed items to success; its reclaimer's check then deletes their idle key rows
    (and counts them); with ``flow_key_idle_s = 0`` (keep forever) the control keeps them."""
    from tests.executor.helpers import await_for, states

    pack = seed.seed_pack(db, "p", WT)
    seed.seed_items(db, pack, 20, rate_keys=[f"r{i % 5}" for i in range(20)], rate_limit=(1000, 1.0, 1000))
    seed.seed_items(db, pack, 20, concurrency_keys=[f"c{i % 5}" for i in range(20)], concurrency=4)
    keep = await executor_factory(flow_key_idle_s=0.0, reclaim_interval_s=0.05)
    await await_for(lambda: states(db) == {"succeeded": 40}, 30, "all succeeded")
    rounds = keep.engine.reclaimer._rounds
    await await_for(lambda: keep.engine.reclaimer._rounds >= rounds + 12, 30, "two checks passed")
    assert _keys(db) == ({f"r{i}" for i in range(5)}, {f"c{i}" for i in range(5)})  # the control
    await keep.stop()
    svc = await executor_factory(flow_key_idle_s=0.001, reclaim_interval_s=0.05)
    await await_for(lambda: _keys(db) == (set(), set()), 30, "the idle keys deleted")
    assert svc.engine.reclaimer._rounds >= 6
