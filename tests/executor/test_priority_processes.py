"""Priorities in the claim order across real executor processes (docs/adr/014-priorities.md): two
``connector executor`` processes x 16 workers, and per pack a continuous stream of high-priority
items (a feeder keeps ``BACKLOG`` of them due and unclaimed, so strict priority would never run a
low one) plus low-priority items arriving steadily; some items of each fail their first attempt
(the retry must keep its priority) and some high ones are delayed (never claimed early, then ranked
by their priority once due).

Every claim is logged by a test trigger (each move to ``processing``: the attempt's due time, the
claim's database time ``started_at``). The stated properties, checked over every attempt with the
ranks of the tested policy (high: head ``HEAD`` s = 100 points x ``STEP`` s; low: 0):

* **due**: no attempt is claimed before its due time;
* **order**: no *inversion*: an attempt ``b`` due at least ``EPS`` before the claim of ``a`` and
  claimed more than ``EPS`` after it, with a rank better than ``a``'s by more than ``EPS``
  (``EPS``: the tolerance for claims in flight at the same instant in two processes and for the
  commit of a row written at its due time);
* **starvation bound**: no low item is overtaken by a high item that became due more than
  ``HEAD + EPS`` after it (the bound ``B = HEAD``), and a low item waits at most ``HEAD + EPS``
  longer than the high items claimed while it waited (it is claimed *despite* the stream: at its
  claim, high items were due and waiting, for nearly every low item).

The three packs run side by side in the same processes: ``aged`` declares the tested policy;
controls ``fifo`` (``priority_step_s: 0``: priorities ignored, due order) must show inversions, and
``strict`` (a step so large that the aging never catches up: strict priority) must break the
starvation bound.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from connector.common.packs.manifest import Manifest
from tests.executor import effects, seed
from tests.executor.helpers import states, wait_for

pytestmark = pytest.mark.slow

STEP = 0.04  # seconds per priority point in the tested policy
HEAD = 100 * STEP  # the high items' head start: the starvation bound B of a low item, 4 s
EPS = 1.0  # tolerance (seconds), see the module docstring
BACKLOG = 1500  # due, unclaimed high items the feeder keeps per pack (~5 s of work: longer than HEAD)
STREAM_S = 14.0  # how long the high stream and the low arrivals last
STEPS = {"aged": STEP, "fifo": 0.0, "strict": 5000.0}

CLAIM_LOG = """
CREATE TABLE test_claim_log (work_id bigint, pack bigint, work_type text, due timestamptz,
                             at timestamptz);
CREATE FUNCTION test_claim_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO test_claim_log VALUES (NEW.work_id, NEW.installed_pack_id, NEW.work_type, OLD.run_after,
                                     NEW.started_at);
  RETURN NULL;
END $$;
CREATE TRIGGER test_claim_log AFTER UPDATE OF state ON connector_work_item FOR EACH ROW
  WHEN (NEW.state = 'processing' AND OLD.state <> 'processing') EXECUTE FUNCTION test_claim_log();
"""

# Per attempt: due and claim time (epoch seconds) and the tested rank.
_ATTEMPTS = f"""
SELECT work_id, work_type, extract(epoch FROM due)::float8 AS due, extract(epoch FROM at)::float8 AS at,
       extract(epoch FROM due)::float8 - CASE WHEN work_type = 'high' THEN {HEAD} ELSE 0 END AS rank
FROM test_claim_log WHERE pack = %(pack)s
"""

INVERSIONS = f"""
WITH x AS ({_ATTEMPTS})
SELECT count(*) FROM x a JOIN x b ON b.due <= a.at - {EPS} AND b.at > a.at + {EPS}
  AND b.rank < a.rank - {EPS}
"""

# Low attempts overtaken by a high attempt that became due more than HEAD + EPS after it.
OVERTAKEN = f"""
WITH x AS ({_ATTEMPTS})
SELECT count(DISTINCT a.work_id) FROM x a JOIN x b ON b.work_type = 'high' AND a.work_type = 'low'
  AND b.due > a.due + {HEAD + EPS} AND b.at < a.at - {EPS}
"""

# Per low attempt: its wait, the longest wait of the high attempts claimed while it waited, and
# whether high attempts were due and unclaimed at its claim.
LOW_WAITS = f"""
WITH x AS ({_ATTEMPTS})
SELECT a.work_id, a.at - a.due,
       (SELECT max(b.at - b.due) FROM x b WHERE b.work_type = 'high' AND b.at BETWEEN a.due AND a.at),
       EXISTS (SELECT 1 FROM x b WHERE b.work_type = 'high' AND b.due <= a.at AND b.at > a.at)
FROM x a WHERE a.work_type = 'low'
"""


def _work_types() -> dict[str, dict[str, Any]]:
    wt = seed.python_work_type("tests.executor.effects:record", max_attempts=5, backoff_base_s=0.05)
    return {"high": {**wt, "priority": 100}, "low": {**wt, "priority": 0}}


def _packs(db: psycopg.Connection) -> dict[str, int]:
    db.execute(effects.EFFECT_TABLE)
    db.execute(CLAIM_LOG)
    out = {}
    for name, step in STEPS.items():
        classes = {"default": {"priority_step_s": step}}
        out[name] = seed.seed_pack(db, name, _work_types(), queue_classes=classes)
        # The heads seeded below are the ones the materializer derives from that declaration.
        heads = Manifest.model_validate(seed.manifest(name, _work_types(), classes)).priority_heads()
        assert heads == {"high": 100 * step, "low": 0.0}
    return out


def _due_high(db: psycopg.Connection, pack: int) -> int:
    row = db.execute(
        "SELECT count(*) FROM connector_work_item WHERE installed_pack_id = %s AND work_type = 'high'"
        " AND state IN ('pending', 'retry') AND run_after <= now()",
        (pack,),
    ).fetchone()
    return int(row[0]) if row else 0


def _feed(db: psycopg.Connection, packs: dict[str, int]) -> int:
    """The stream: every 0.1 s top each pack's due high backlog up to BACKLOG; every 0.25 s one low
    item per pack; every second two delayed high items (due 1.5 s later) per pack."""
    start = time.monotonic()
    tick = 0
    n = 0
    while time.monotonic() - start < STREAM_S:
        for name, pack in packs.items():
            head = 100 * STEPS[name]
            short = BACKLOG - _due_high(db, pack)
            if short > 0:
                k = min(short, 500)
                n += len(seed.seed_items(db, pack, k, work_type="high", heads=[head] * k))
            if tick % 10 == 0:
                n += len(seed.seed_items(db, pack, 2, work_type="high", heads=[head] * 2, run_after_s=1.5))
            if tick % 2 == 0:  # two 0.1 s ticks, whatever the feeding took: ~4 low a second at most
                n += len(seed.seed_items(db, pack, 1, work_type="low"))
        db.execute("NOTIFY connector_work")
        tick += 1
        time.sleep(0.1)
    return n


def test_priority_order_and_starvation_bound_across_two_processes(db, spawn) -> None:
    packs = _packs(db)
    env = {"EXECUTOR_TEST_SLEEP_S": "0.1", "EXECUTOR_TEST_FAIL_FIRST_MOD": "9"}
    a = spawn(extra_env=env)
    b = spawn(extra_env=env)
    a.wait_registered(db)
    b.wait_registered(db)
    total = _feed(db, packs)
    wait_for(lambda: states(db).get("succeeded", 0) == total, 180, f"{total} succeeded")
    # Both processes claimed from every pack; retries happened (they must keep their priority).
    pids = db.execute(
        "SELECT w.installed_pack_id, count(DISTINCT e.pid) FROM executor_test_effect e"
        " JOIN connector_work_item w USING (work_id) GROUP BY 1"
    ).fetchall()
    assert sorted(pids) == sorted((p, 2) for p in packs.values())
    retried = db.execute("SELECT count(*) FROM connector_work_item WHERE attempts = 2").fetchone()[0]
    assert retried > 0

    results: dict[str, dict[str, Any]] = {}
    for name, pack in packs.items():
        early = db.execute(
            "SELECT count(*) FROM test_claim_log WHERE pack = %s AND at < due", (pack,)
        ).fetchone()[0]
        inversions = db.execute(INVERSIONS, {"pack": pack}).fetchone()[0]
        overtaken = db.execute(OVERTAKEN, {"pack": pack}).fetchone()[0]
        waits = db.execute(LOW_WAITS, {"pack": pack}).fetchall()
        results[name] = {
            "early": early,
            "inversions": inversions,
            "overtaken": overtaken,
            "lows": len(waits),
            "late": sum(1 for _, w, hw, _ in waits if w > (hw or 0) + HEAD + EPS),
            "despite": sum(1 for *_, busy in waits if busy),
            "max_low_wait": max(w for _, w, _, _ in waits),
        }
    aged, fifo, strict = results["aged"], results["fifo"], results["strict"]
    for r in results.values():
        assert r["early"] == 0, results  # never before due, delays included, whatever the policy
    assert aged["lows"] >= 20, results
    assert aged["inversions"] == 0, results
    assert aged["overtaken"] == 0 and aged["late"] == 0, results
    # The low items ran while high ones were due and waiting (the stream was continuous).
    assert aged["despite"] >= 0.9 * aged["lows"], results
    # Controls: priorities ignored break the order; strict priority breaks the starvation bound.
    assert fifo["inversions"] > 0, results
    assert strict["overtaken"] > 0 and strict["late"] > 0, results
    assert a.stop() == 0 and b.stop() == 0
