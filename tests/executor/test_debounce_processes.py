"""Debounce across real executor processes (docs/packs.md#debounce): two ``connector executor``
processes x 16 workers, WorkItems arriving through the materializer's own insert
(``materialization.materialize``) in random batches on random keys *while* executions run, every
fifth item failing its first attempt after outliving the window (so newer items of its key are
claimed while it runs, and its retry comes after them), beside a source-lane work type of the same
pack.

A trigger logs every move into ``processing`` (database clock). The checks:

* every item ends executed (``succeeded``) or ``coalesced`` into a newer item of its key whose
  execution started after it was created, and the chain of covers ends at a succeeded item;
* an item that never ran is listed by the execution that covers it (``ctx.coalesced_work_ids``), and
  no item is listed by two succeeded executions (nothing covered twice); the executed item is the
  newest of what it covers;
* per key, the items claimed, in claim order, never go back to an older one (executions see events
  in order) — the control (``CONNECTOR_TEST_DEBOUNCE_NO_LATE``: an overtaken retry runs again)
  breaks exactly this;
* bursts did coalesce, both processes ran debounced items, and the source lane's members were
  claimed in delivery order.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.executor import effects, seed
from tests.executor.helpers import ROOT, kill_holder, wait_for

pytestmark = pytest.mark.slow

CONTROLS = Path(__file__).resolve().parent / "controls"
KEYS = 30
LANES = 8

CLAIM_LOG = """
CREATE TABLE test_claim_log (work_id bigint, token bigint, at timestamptz);
CREATE FUNCTION test_claim_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state = 'processing' AND OLD.state <> 'processing' THEN
    INSERT INTO test_claim_log VALUES (NEW.work_id, NEW.lease_token, clock_timestamp());
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER test_claim_log AFTER UPDATE OF state ON connector_work_item FOR EACH ROW
  EXECUTE FUNCTION test_claim_log();
"""


def _pack(db: psycopg.Connection) -> int:
    db.execute(effects.EFFECT_TABLE)
    db.execute(effects.DEBOUNCE_TABLE)
    db.execute(CLAIM_LOG)
    deb = seed.python_work_type("tests.executor.effects:record_debounce", max_attempts=10)
    lane = seed.python_work_type("tests.executor.effects:record", max_attempts=10)
    return seed.seed_pack(
        db,
        "deb",
        {
            "d": {**deb, "debounce": {"window_s": 0.2, "max_wait_s": 1.0, "key": "{/k}"}},
            "s": {**lane, "lanes": {"source_fifo": True, "source_lane_key": "{/lane}"}},
        },
    )


async def _feed(
    db: psycopg.Connection, adb: Any, pack: int, seconds: float, rnd: random.Random
) -> dict[int, str]:
    """Debounced items in random batches (1..6 items, random keys) every ~40 ms, and source-lane
    items now and then, for ``seconds``. Returns each debounced item's key."""
    keys: dict[int, str] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        batch = [f"k{rnd.randrange(KEYS)}" for _ in range(rnd.randint(1, 6))]
        ids = await seed.seed_debounced(adb, pack, batch, window_s=0.2, max_wait_s=1.0, work_type="d")
        keys.update(zip(ids, batch, strict=True))
        if rnd.random() < 0.3:
            lanes = [f"l{rnd.randrange(LANES)}" for _ in range(rnd.randint(1, 4))]
            seed.seed_items(db, pack, len(lanes), work_type="s", source_lanes=lanes)
        await asyncio.sleep(rnd.uniform(0.01, 0.07))
    return keys


def _open(db: psycopg.Connection) -> int:
    return int(
        db.execute(
            "SELECT count(*) FROM connector_work_item"
            " WHERE state IN ('pending', 'blocked', 'retry', 'processing')"
        ).fetchone()[0]
    )


def _order_violations(db: psycopg.Connection, keys: dict[int, str]) -> int:
    """Per key, claims (in claim order) of an item older than one claimed before."""
    rows = db.execute(
        "SELECT work_id FROM test_claim_log WHERE work_id = ANY(%s) ORDER BY at, work_id", (list(keys),)
    ).fetchall()
    newest: dict[str, int] = {}
    bad = 0
    for (work_id,) in rows:
        k = keys[work_id]
        if work_id < newest.get(k, 0):
            bad += 1
        newest[k] = max(newest.get(k, 0), work_id)
    return bad


def _env(control: str | None) -> dict[str, str]:
    env = {
        "EXECUTOR_TEST_SLEEP_S": "0.02",
        "EXECUTOR_TEST_SLEEP_JITTER_S": "0.05",
        "EXECUTOR_TEST_FAIL_FIRST_MOD": "5",
        "EXECUTOR_TEST_FAIL_SLEEP_S": "0.5",
    }
    if control is not None:
        env[control] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(CONTROLS), str(ROOT)])
    return env


async def _run(db: psycopg.Connection, adb: Any, spawn: Any, control: str | None) -> dict[int, str]:
    pack = _pack(db)
    a = spawn(extra_env=_env(control))
    b = spawn(extra_env=_env(control))
    a.wait_registered(db)
    b.wait_registered(db)
    keys = await _feed(db, adb, pack, 6.0, random.Random(14))
    wait_for(lambda: _open(db) == 0, 120, "every item finished or coalesced")
    assert a.stop() == 0 and b.stop() == 0
    return keys


def _check(db: psycopg.Connection, keys: dict[int, str], *, processes: int = 2) -> None:
    """Every check of the module docstring (the source lane's too)."""
    ids = sorted(keys)
    rows = {
        int(r[0]): r
        for r in db.execute(
            "SELECT work_id, state, covered_by, attempts, created_at, outcome FROM connector_work_item"
            " WHERE work_id = ANY(%s)",
            (ids,),
        ).fetchall()
    }
    claims: dict[int, list[Any]] = {}
    for work_id, at in db.execute("SELECT work_id, at FROM test_claim_log").fetchall():
        claims.setdefault(int(work_id), []).append(at)
    ok = db.execute(
        "SELECT work_id, covered, pid FROM executor_test_debounce WHERE phase = 'ok' AND accepted"
    ).fetchall()
    executed = {int(r[0]) for r in ok}
    assert len(executed) == len(ok)  # one accepted success per executed item
    states = {r[1] for r in rows.values()}
    assert states <= {"succeeded", "coalesced"}, states
    assert executed == {w for w, r in rows.items() if r[1] == "succeeded"}
    coalesced = [w for w, r in rows.items() if r[1] == "coalesced"]
    # Items of one key inserted in one batch (one transaction: the same created_at) coalesce
    # whatever the machine's speed: all but the newest are parked at insert. Across batches it
    # depends on timing (a loaded machine spreads a burst over more than the window), so that is
    # the bound, not a share of the items.
    (same_batch,) = db.execute(
        "SELECT count(*) - count(DISTINCT (debounce_key, created_at)) FROM connector_work_item"
        " WHERE work_id = ANY(%s)",
        (ids,),
    ).fetchone()
    assert same_batch > 0, "the feed made no burst: the check below would assert nothing"
    assert len(coalesced) >= same_batch, f"bursts should coalesce: {len(coalesced)} < {same_batch}"
    # Every coalesced item: covered by a newer item of its key that started after it was created,
    # and its chain of covers ends at a succeeded execution.
    for w in coalesced:
        cover = int(rows[w][2])
        assert cover > w and keys[cover] == keys[w]
        assert any(at > rows[w][4] for at in claims.get(cover, [])), f"{cover} started before {w} existed"
        root = cover
        while rows[root][1] == "coalesced":
            root = int(rows[root][2])
        assert rows[root][1] == "succeeded"
    # What the executions list: an item that never ran was given to a handler call of an item on its
    # chain of covers (the covering execution's own, or — when the item that covered it failed or
    # died after a newer one had started — that attempt's; ``start`` rows record every call); no item
    # is listed by two succeeded executions; what is listed is older than the executed item, and of
    # its key.
    listed: dict[int, int] = {}
    seen_by: dict[int, set[int]] = {}
    for work_id, covered, _ in ok:
        for c in covered:
            assert c not in listed, f"{c} covered by {listed[c]} and {work_id}"
            listed[c] = work_id
    for work_id, covered in db.execute(
        "SELECT work_id, covered FROM executor_test_debounce WHERE accepted"
    ).fetchall():
        for c in covered:
            assert c < work_id and keys[c] == keys[work_id]
            seen_by.setdefault(c, set()).add(int(work_id))
    # Walk w's chain of covers: a handler call of some cover lists w, unless the chain reaches a
    # cover that was *overtaken* (coalesced into a newer execution that had started already: that
    # handler was not told) before any call of a cover listed it.
    never_ran = [w for w in coalesced if rows[w][3] == 0]
    assert never_ran
    for w in never_ran:
        c = int(rows[w][2])
        while c not in seen_by.get(w, set()):
            assert rows[c][1] == "coalesced", f"{w}: its cover {c} ran, but no call of it listed {w}"
            if rows[c][5] == "overtaken":
                break
            c = int(rows[c][2])
    assert not set(listed) & executed
    # Executions in order per key; both processes took part; the source lane kept its order.
    assert _order_violations(db, keys) == 0
    assert len({r[2] for r in ok}) == processes
    lane_rows = db.execute(
        """SELECT w.source_lane_key, l.work_id FROM test_claim_log l
           JOIN connector_work_item w ON w.work_id = l.work_id
           WHERE w.source_lane_key IS NOT NULL ORDER BY l.at, l.work_id"""
    ).fetchall()
    last: dict[str, int] = {}
    for lane, work_id in lane_rows:
        assert work_id >= last.get(lane, 0), f"lane {lane}: {work_id} after {last[lane]}"
        last[lane] = work_id
    assert lane_rows


async def test_two_processes_coalesce_bursts_in_order_and_lose_nothing(db, adb, spawn) -> None:
    keys = await _run(db, adb, spawn, None)
    _check(db, keys)


async def test_kill_9_and_lease_expiry_lose_nothing_and_keep_the_order(db, adb, spawn) -> None:
    """A holds every debounced execution after its first 20 and is killed while items keep
    arriving; B reclaims A's orphans after their leases expire. An orphan that newer items of its
    key overtook meanwhile is coalesced into them, one that is still its key's newest runs again:
    the same checks hold over every claim, A's included."""
    pack = _pack(db)
    env = {**_env(None), "CONNECTOR_EXECUTOR_LEASE_S": "2"}
    a = spawn(extra_env={**env, "EXECUTOR_TEST_HOLD_AFTER": "20"})
    a_id = a.wait_registered(db)
    rnd = random.Random(77)
    keys = await _feed(db, adb, pack, 2.0, rnd)
    b, orphans = kill_holder(db, spawn, a, a_id, "debounce_key", 4, env)
    assert orphans
    keys.update(await _feed(db, adb, pack, 3.0, rnd))
    wait_for(lambda: _open(db) == 0, 120, "every item finished or coalesced")
    assert b.stop() == 0
    _check(db, keys)
    # Each orphan was re-run by B (claimed again) or covered by a newer execution of its key.
    rows = dict(
        db.execute(
            "SELECT work_id, state FROM connector_work_item WHERE work_id = ANY(%s)", (orphans,)
        ).fetchall()
    )
    reclaimed = db.execute(
        "SELECT count(DISTINCT work_id) FROM test_claim_log WHERE work_id = ANY(%s) AND token > 1", (orphans,)
    ).fetchone()[0]
    assert set(rows.values()) <= {"succeeded", "coalesced"}
    assert reclaimed + sum(1 for s in rows.values() if s == "coalesced") >= len(orphans)


async def test_control_an_overtaken_retry_run_again_breaks_the_order(db, adb, spawn) -> None:
    keys = await _run(db, adb, spawn, "CONNECTOR_TEST_DEBOUNCE_NO_LATE")
    assert _order_violations(db, keys) > 0
