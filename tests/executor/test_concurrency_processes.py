"""Concurrency limits across real executor processes (docs/adr/011-rate-limits.md): two ``connector
executor`` processes x 16 workers, items of a limited pack on random keys (at most 2 in flight per
key) beside an unlimited control pack with the same key spread, handlers that take a while.

A test trigger on ``connector_work_item`` logs every move into and out of ``processing`` (database
clock), so each attempt's slot-holding interval is known exactly — a killed process's attempts too
(they end when the reclaim moves them out). Handler start/end effects (``tests.executor.effects``)
show the handlers ran, each interval inside its attempt's. The check: no instant with more than 2
attempts of one key holding a slot; the control pack's keys go above 2, so the check can fail.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

from tests.executor import effects, seed
from tests.executor.helpers import kill_holder, states, wait_for

pytestmark = pytest.mark.slow

N = 2
KEYS = 10

SLOT_LOG = """
CREATE TABLE test_slot_log (work_id bigint, token bigint, phase text, at timestamptz);
CREATE FUNCTION test_slot_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state = 'processing' AND OLD.state <> 'processing' THEN
    INSERT INTO test_slot_log VALUES (NEW.work_id, NEW.lease_token, 'in', clock_timestamp());
  ELSIF OLD.state = 'processing' AND NEW.state <> 'processing' THEN
    INSERT INTO test_slot_log VALUES (NEW.work_id, OLD.lease_token, 'out', clock_timestamp());
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER test_slot_log AFTER UPDATE OF state ON connector_work_item FOR EACH ROW
  EXECUTE FUNCTION test_slot_log();
"""


def _packs(db: psycopg.Connection) -> tuple[int, int]:
    db.execute(effects.EFFECT_TABLE)
    db.execute(SLOT_LOG)
    wt = seed.python_work_type("tests.executor.effects:record", max_attempts=10)
    limited = seed.seed_pack(db, "limited", {"w": {**wt, "concurrency": {"limit": N, "key": "{/k}"}}})
    control = seed.seed_pack(db, "control", {"w": wt})
    return limited, control


def _seed(db: psycopg.Connection, limited: int, control: int, n: int, rnd: random.Random) -> dict[str, Any]:
    keys = [f"k{rnd.randrange(KEYS)}" for _ in range(n)]
    ids = seed.seed_items(db, limited, n, concurrency_keys=keys, concurrency=N)
    ctl_keys = [f"k{rnd.randrange(KEYS)}" for _ in range(n)]
    ctl = seed.seed_items(db, control, n, labels=ctl_keys)
    return {
        "ids": ids,
        "keys": dict(zip(ids, keys, strict=True)),
        "ctl_keys": dict(zip(ctl, ctl_keys, strict=True)),
    }


def max_overlap(db: psycopg.Connection, keys: dict[int, str]) -> int:
    """The most attempts of one key holding a slot at one instant (from the slot log)."""
    rows = db.execute(
        "SELECT work_id, phase, extract(epoch FROM at)::float8 FROM test_slot_log WHERE work_id = ANY(%s)",
        (list(keys),),
    ).fetchall()
    events: dict[str, list[tuple[float, int]]] = {}
    for work_id, phase, at in rows:
        # At equal times an exit sorts before an entry (a slot handed over in one instant).
        events.setdefault(keys[work_id], []).append((float(at), 1 if phase == "in" else -1))
    worst = 0
    for evs in events.values():
        level = 0
        for _, d in sorted(evs):
            level += d
            worst = max(worst, level)
    return worst


def _check(db: psycopg.Connection) -> tuple[int, int]:
    """(keys whose in_flight disagrees with their processing rows, total in_flight)."""
    row = db.execute(
        """SELECT count(*) FILTER (WHERE k.in_flight <> (SELECT count(*) FROM connector_work_item w
                 WHERE w.installed_pack_id = k.installed_pack_id AND w.concurrency_key = k.concurrency_key
                   AND w.state = 'processing')),
                  coalesce(sum(k.in_flight), 0)
           FROM connector_concurrency_limit k"""
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_two_processes_never_exceed_n_in_flight_per_key(db, spawn) -> None:
    limited, control = _packs(db)
    env = {"EXECUTOR_TEST_SLEEP_S": "0.02", "EXECUTOR_TEST_SLEEP_JITTER_S": "0.03"}
    a = spawn(admin=True, extra_env=env)
    b = spawn(extra_env=env)
    a.wait_registered(db)
    b.wait_registered(db)
    s = _seed(db, limited, control, 400, random.Random(21))
    db.execute("NOTIFY connector_work")
    wait_for(lambda: states(db).get("succeeded", 0) == 800, 120, "800 succeeded")
    ends = db.execute(
        "SELECT count(DISTINCT work_id) FROM executor_test_effect WHERE phase = 'end' AND accepted"
    ).fetchone()[0]
    assert ends == 800
    worst = max_overlap(db, s["keys"])
    assert worst <= N, f"a key had {worst} attempts in flight (limit {N})"
    assert worst == N  # the limit binds: slots were used in parallel
    pids = {
        r[0]
        for r in db.execute(
            "SELECT DISTINCT pid FROM executor_test_effect WHERE work_id = ANY(%s)", (s["ids"],)
        ).fetchall()
    }
    assert pids == {a.pid, b.pid}
    assert (
        db.execute(
            "SELECT max(attempts) FROM connector_work_item WHERE work_id = ANY(%s)", (s["ids"],)
        ).fetchone()[0]
        == 1
    )  # parking spends no attempt
    assert _check(db) == (0, 0)  # every slot given back, none twice
    # Control: the unlimited pack's keys, same check: above N.
    assert max_overlap(db, s["ctl_keys"]) > N
    assert a.stop() == 0 and b.stop() == 0


def test_kill_9_and_lease_expiry_give_each_slot_back_once(db, spawn) -> None:
    """A holds the items it claims after its first 20 executions and is killed; their slots stay
    taken until their leases expire and B's reclaim gives each back (once), then B finishes
    everything. Over all attempts — the orphans' held ones included — no key ever had more than N
    holding a slot; at the end every count is zero and agrees with the rows."""
    limited, control = _packs(db)
    env = {"CONNECTOR_EXECUTOR_LEASE_S": "2", "EXECUTOR_TEST_SLEEP_S": "0.01"}
    a = spawn(extra_env={**env, "EXECUTOR_TEST_HOLD_AFTER": "20"})
    a_id = a.wait_registered(db)
    s = _seed(db, limited, control, 160, random.Random(4))
    db.execute("NOTIFY connector_work")
    b, held = kill_holder(db, spawn, a, a_id, "concurrency_key", 4, env)
    orphans = set(held)
    assert orphans
    wait_for(lambda: states(db).get("succeeded", 0) == 320, 120, "320 succeeded")
    worst = max_overlap(db, s["keys"])
    assert worst <= N, f"a key had {worst} attempts in flight (limit {N})"
    assert _check(db) == (0, 0)
    reruns = db.execute(
        "SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%s) AND attempts = 2", (list(orphans),)
    ).fetchone()[0]
    assert reruns == len(orphans)
    assert b.metric("connector_executor_lease_reclaims_total") >= len(orphans)
    assert max_overlap(db, s["ctl_keys"]) > N  # control
