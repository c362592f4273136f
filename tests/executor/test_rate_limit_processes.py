"""Rate limits across real executor processes (docs/adr/011-rate-limits.md): two ``connector
executor`` processes x 16 workers claim from random keys of a limited pack and of an unlimited
control pack at the same time.

Every claim is recorded by a test trigger on ``connector_work_item`` (each move to ``processing``:
its work id, token and ``started_at``, the claim's database time), so attempts a killed process
claimed but never started count too; each execution records ``start``/``end`` effects
(``tests.executor.effects``) showing the handlers ran. The bound checked
is the GCRA's: in any window of ``W`` seconds a key gets at most ``burst + W * limit / period``
claims; with ``W = period`` that is ``burst + limit`` (the stated tolerance is ``burst``). The same
check over the control pack's items (grouped by the same random keys) must fail, so it can fail.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

from tests.executor import effects, seed
from tests.executor.helpers import kill_holder, states, wait_for
from tests.executor.test_rate_limits import max_in_window

pytestmark = pytest.mark.slow

LIMIT, PERIOD, BURST = 4, 1.0, 2
KEYS = 12


CLAIM_LOG = """
CREATE TABLE test_claim_log (work_id bigint, token bigint, at timestamptz);
CREATE FUNCTION test_claim_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO test_claim_log VALUES (NEW.work_id, NEW.lease_token, NEW.started_at);
  RETURN NULL;
END $$;
CREATE TRIGGER test_claim_log AFTER UPDATE OF state ON connector_work_item FOR EACH ROW
  WHEN (NEW.state = 'processing' AND OLD.state <> 'processing') EXECUTE FUNCTION test_claim_log();
"""


def _packs(db: psycopg.Connection) -> tuple[int, int]:
    db.execute(effects.EFFECT_TABLE)
    db.execute(CLAIM_LOG)
    wt = seed.python_work_type("tests.executor.effects:record", max_attempts=10)
    limited = seed.seed_pack(
        db,
        "limited",
        {"w": {**wt, "rate_limit": {"limit": LIMIT, "period_s": PERIOD, "burst": BURST, "key": "{/k}"}}},
    )
    control = seed.seed_pack(db, "control", {"w": wt})
    return limited, control


def _seed(db: psycopg.Connection, limited: int, control: int, n: int, rnd: random.Random) -> dict[str, Any]:
    keys = [f"k{rnd.randrange(KEYS)}" for _ in range(n)]
    ids = seed.seed_items(db, limited, n, rate_keys=keys, rate_limit=(LIMIT, PERIOD, BURST))
    ctl_keys = [f"k{rnd.randrange(KEYS)}" for _ in range(n)]
    ctl = seed.seed_items(db, control, n, labels=ctl_keys)
    return {
        "ids": ids,
        "keys": dict(zip(ids, keys, strict=True)),
        "ctl": ctl,
        "ctl_keys": dict(zip(ctl, ctl_keys, strict=True)),
    }


def _claims(db: psycopg.Connection, keys: dict[int, str]) -> list[tuple[str, float]]:
    """(key, claim time) of every claim of the items of ``keys``."""
    rows = db.execute(
        "SELECT work_id, extract(epoch FROM at)::float8 FROM test_claim_log WHERE work_id = ANY(%s)",
        (list(keys),),
    ).fetchall()
    return [(keys[r[0]], float(r[1])) for r in rows]


def _bound() -> int:
    return BURST + LIMIT  # W = PERIOD


def test_two_processes_never_exceed_a_key_rate(db, spawn) -> None:
    limited, control = _packs(db)
    env = {"EXECUTOR_TEST_SLEEP_JITTER_S": "0.004"}
    a = spawn(admin=True, extra_env=env)
    b = spawn(extra_env=env)
    a.wait_registered(db)
    b.wait_registered(db)
    s = _seed(db, limited, control, 240, random.Random(11))
    db.execute("NOTIFY connector_work")
    # 240 items over 12 keys at 4/s each: ~4 s of budget once the bursts are spent.
    wait_for(lambda: states(db).get("succeeded", 0) == 480, 90, "480 succeeded")
    claims = _claims(db, s["keys"])
    assert len(claims) == 240  # one attempt each (no failures injected)
    started = db.execute(
        "SELECT count(DISTINCT work_id) FROM executor_test_effect WHERE phase = 'end' AND accepted"
    ).fetchone()[0]
    assert started == 480
    worst = max_in_window(claims, PERIOD)
    assert worst <= _bound(), f"a key got {worst} claims within {PERIOD}s (bound {_bound()})"
    # The limit binds (each key's claims are spread over time) and both processes shared it.
    assert worst >= LIMIT
    pids = {
        r[0]
        for r in db.execute(
            "SELECT DISTINCT pid FROM executor_test_effect WHERE work_id = ANY(%s)", (s["ids"],)
        ).fetchall()
    }
    assert pids == {a.pid, b.pid}
    # No attempt was burnt waiting for budget.
    assert (
        db.execute(
            "SELECT max(attempts) FROM connector_work_item WHERE work_id = ANY(%s)", (s["ids"],)
        ).fetchone()[0]
        == 1
    )
    held = a.metric("connector_executor_rate_limited_total") + b.metric(
        "connector_executor_rate_limited_total"
    )
    assert held > 0
    # Control: the unlimited pack, same key spread, same check: far above the bound.
    assert max_in_window(_claims(db, s["ctl_keys"]), PERIOD) > 2 * _bound()
    assert a.stop() == 0 and b.stop() == 0


def test_kill_9_and_lease_expiry_spend_budget_again_never_give_it_back(db, spawn) -> None:
    """A holds the limited items it claims after its first 20 executions and is killed; B reclaims
    them once their leases expire. Every attempt — the orphans' first ones included — is a claim
    that spent budget: over all attempts the per-key bound still holds (a reclaim gives no budget
    back, so no key gets more), and every item finishes (no budget or item is lost)."""
    limited, control = _packs(db)
    env = {"CONNECTOR_EXECUTOR_LEASE_S": "2"}
    a = spawn(extra_env={**env, "EXECUTOR_TEST_HOLD_AFTER": "20"})
    a_id = a.wait_registered(db)
    s = _seed(db, limited, control, 120, random.Random(5))
    db.execute("NOTIFY connector_work")
    b, held = kill_holder(db, spawn, a, a_id, "rate_key", 5, env)
    orphans = set(held)
    assert orphans
    wait_for(lambda: states(db).get("succeeded", 0) == 240, 90, "240 succeeded")
    claims = _claims(db, s["keys"])
    attempts = db.execute(
        "SELECT sum(attempts) FROM connector_work_item WHERE work_id = ANY(%s)", (s["ids"],)
    ).fetchone()[0]
    assert len(claims) == attempts > 120  # the orphans ran twice: two claims each
    worst = max_in_window(claims, PERIOD)
    assert worst <= _bound(), f"a key got {worst} claims within {PERIOD}s (bound {_bound()})"
    reclaimed = db.execute(
        "SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%s) AND attempts = 2", (list(orphans),)
    ).fetchone()[0]
    assert reclaimed == len(orphans)
    assert b.metric("connector_executor_lease_reclaims_total") >= len(orphans)
    # Control: the unlimited pack's claims in the same run break the bound.
    assert max_in_window(_claims(db, s["ctl_keys"]), PERIOD) > _bound()
