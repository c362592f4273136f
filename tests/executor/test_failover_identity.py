"""Identity across a lossy failover (issue #26, item 4), with real executor processes and a real
primary + standby (``tests/support/pgpair.py``).

The lost tail is made deterministic: the standby is stopped, deliveries are written on the primary
(the tail), executor X claims them (its handlers wait for a release file), the primary is killed
with kill -9 and the standby promoted — an asynchronous standby that had not received the tail.
The new primary reissues the tail's work and event ids (its sequences resume from what was
replicated: asserted, it is what gives the test its teeth) to new deliveries, which executor Y
claims and holds. Then X's handlers finish and X's finalizes reach the new primary late; then Y's.

Effects go to a file (a fencing sink outside the database, which the failover cannot roll back).
A trigger logs the token under which each row became ``succeeded``. Asserted:

* **never succeeded without running**: every row that became ``succeeded`` did so under a token
  whose effect — with that row's delivery marker — was recorded before;
* **never one key for two deliveries**: no idempotency key in the sink carries two markers;
* the tail is lost (measured, as on a real asynchronous failover: physics, not asserted away).

Control (``CONNECTOR_TEST_OLD_IDENTITY=1``, tests/executor/controls: ``lease_token + 1`` and the
``<event_id>:<work_type>`` key): X's late completes mark Y's rows succeeded and the keys collide.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connector.common.store import tokens
from connector.common.store.migrate import upgrade
from connector.common.store.receipts import routing
from connector.common.store.work_items import claim
from tests.executor import effects, seed
from tests.executor.helpers import ExecutorProcess, wait_for
from tests.support.pgpair import PgPair

pytestmark = pytest.mark.slow

CONTROLS_DIR = Path(__file__).resolve().parent / "controls"
N = 40  # the tail: more than a sequence's 32-value WAL prefetch, so its ids are handed out again

_SUCCEEDED_LOG = """
CREATE TABLE test_succeeded_under (work_id bigint, token bigint, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION test_succeeded_under() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO test_succeeded_under (work_id, token) VALUES (NEW.work_id, OLD.lease_token); RETURN NEW;
END $$;
CREATE TRIGGER test_succeeded_under AFTER UPDATE OF state ON connector_work_item FOR EACH ROW
  WHEN (OLD.state = 'processing' AND NEW.state = 'succeeded') EXECUTE FUNCTION test_succeeded_under();
"""


def _executor(url: str, scratch: Path, tag: str, control: bool) -> ExecutorProcess:
    env = {
        "EXECUTOR_TEST_RELEASE": str(scratch / f"release-{tag}"),
        "EXECUTOR_TEST_SINK": str(scratch / "sink"),
        # Exactly the tail's size in flight and no prefetch: X, holding the tail, claims nothing
        # on the new primary; every handler runs at once (a thread each).
        "CONNECTOR_EXECUTOR_WORKERS": str(N),
        "CONNECTOR_EXECUTOR_HANDLER_THREADS": str(N),
        "CONNECTOR_EXECUTOR_PREFETCH": "0",
        "CONNECTOR_EXECUTOR_CLAIM_BATCH": str(N),
        "CONNECTOR_EXECUTOR_LEASE_S": "120",  # no lease expires and no reclaim runs in this test
    }
    if control:
        env["CONNECTOR_TEST_OLD_IDENTITY"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(CONTROLS_DIR), os.environ.get("PYTHONPATH", "")])
    return ExecutorProcess(url, extra_env=env)


def _holding(db: psycopg.Connection, owner: str) -> int:
    row = db.execute(
        "SELECT count(*) FROM connector_work_item WHERE state = 'processing' AND lease_owner = %s", (owner,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def _sink(scratch: Path) -> list[dict[str, Any]]:
    path = scratch / "sink"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _phase(scratch: Path, phase: str) -> int:
    return sum(1 for e in _sink(scratch) if e["phase"] == phase)


def _settled(p: ExecutorProcess) -> float:
    """Completes the process sent that matched a row or were refused as stale."""
    return p.metric("connector_executor_stale_token_rejections_total", {"op": "complete"}) + p.metric(
        "connector_executor_outcomes_total", {"state": "succeeded"}
    )


def lossy_failover(control: bool) -> dict[str, Any]:
    procs: list[ExecutorProcess] = []
    with PgPair() as pair:
        scratch = pair.scratch()
        primary, standby = pair.direct(pair.ports[0]), pair.direct(pair.standby_port)
        try:
            upgrade(primary)
            with psycopg.connect(primary, autocommit=True) as p:
                handler = seed.python_work_type(f"{effects.__name__}:hold_then_sink")
                pack = seed.seed_pack(p, "p", {"w": handler})
                p.execute(_SUCCEEDED_LOG)
                seed.seed_items(p, pack, 3, labels=["before-0", "before-1", "before-2"])
                p.execute("UPDATE connector_work_item SET state = 'succeeded'")
            pair.wait_replayed()
            pair.stop_standby()  # the standby has everything up to here, and none of the tail
            with psycopg.connect(primary, autocommit=True) as p:
                tail = seed.seed_items(p, pack, N, labels=[f"lost-{i}" for i in range(N)])
                x = _executor(pair.url("postgres", "postgres"), scratch, "x", control)
                procs.append(x)
                x_id = x.wait_registered(p)
                # Its handlers run (the claim is committed before the batch's events are read: a kill
                # in between would hand the items back instead of holding them).
                wait_for(lambda: _phase(scratch, "start") == N, 30, "X runs the tail's handlers")
                assert _holding(p, x_id) == N
            pair.kill_primary()
            pair.start_standby()
            pair.promote()
            with psycopg.connect(standby, autocommit=True) as db:
                assert tokens.token_timeline(2**31 + 1) == 2
                timeline = db.execute(tokens.TIMELINE_CURRENT).fetchone()[0]  # type: ignore[index]
                new = seed.seed_items(db, pack, N, labels=[f"new-{i}" for i in range(N)])
                reissued = set(new) & set(tail)
                assert reissued, "the new primary must hand out the tail's work ids again"
                y = _executor(standby, scratch, "y", control)
                procs.append(y)
                y_id = y.wait_registered(db)
                wait_for(lambda: _phase(scratch, "start") == 2 * N, 30, "Y runs the new deliveries")
                assert _holding(db, y_id) == N
                (scratch / "release-x").touch()  # X's handlers finish; their finalizes come late
                wait_for(lambda: _settled(x) >= N, 60, "X's late finalizes answered")
                (scratch / "release-y").touch()
                wait_for(lambda: _settled(y) >= N, 60, "Y's finalizes answered")
                became = db.execute(
                    """SELECT s.work_id, s.token, extract(epoch FROM s.at)::float8, e.source_object_id
                       FROM test_succeeded_under s JOIN connector_work_item w USING (work_id)
                       JOIN connector_event e USING (event_id)"""
                ).fetchall()
                succeeded = db.execute(
                    "SELECT count(*) FROM connector_work_item WHERE state = 'succeeded'"
                ).fetchone()[0]  # type: ignore[index]
                lost = db.execute(
                    "SELECT count(*) FROM connector_event WHERE source_object_id LIKE 'lost-%%'"
                ).fetchone()[0]  # type: ignore[index]
            sink = [e for e in _sink(scratch) if e["phase"] == "effect"]
            return {
                "timeline": timeline,
                "reissued": len(reissued),
                "became": became,
                "sink": sink,
                "succeeded": succeeded,
                "lost_tail_left": lost,
                "x_stale": x.metric("connector_executor_stale_token_rejections_total", {"op": "complete"}),
            }
        finally:
            for proc in procs:
                proc.stop()


def _violations(run: dict[str, Any]) -> tuple[list[Any], dict[str, set[str]]]:
    sink = run["sink"]
    ran_before = [
        (w, t, marker)
        for w, t, at, marker in run["became"]
        if not any(
            e["work_id"] == w and e["token"] == t and e["marker"] == marker and e["wall"] <= at for e in sink
        )
    ]
    markers: dict[str, set[str]] = {}
    for e in sink:
        markers.setdefault(e["key"], set()).add(e["marker"])
    shared = {k: v for k, v in markers.items() if len(v) > 1}
    return ran_before, shared


def test_a_lossy_failover_never_finishes_a_delivery_that_did_not_run() -> None:
    run = lossy_failover(control=False)
    not_run, shared = _violations(run)
    print(
        f"\n  lossy failover: timeline {run['timeline']}, {N} acknowledged deliveries lost with the tail"
        f" ({run['lost_tail_left']} left), {run['reissued']} work ids handed out again,"
        f" {run['x_stale']:.0f} late completes refused"
    )
    assert run["timeline"] == 2
    # Y's claims on the new primary carry its timeline; X's (the old primary's) timeline 1.
    assert {tokens.token_timeline(t) for _, t, _, m in run["became"] if m.startswith("new-")} == {2}
    assert run["lost_tail_left"] == 0  # the tail is gone: what asynchronous replication costs
    assert len(run["sink"]) == 2 * N  # both executors ran every handler they held
    assert not not_run, f"rows succeeded without their delivery's handler having run: {not_run[:5]}"
    assert not shared, f"idempotency keys applied to two deliveries: {list(shared.items())[:5]}"
    assert run["x_stale"] == N  # every late complete from the old primary was refused
    assert run["succeeded"] == 3 + N  # the new deliveries all succeeded (by Y)


def test_control_the_old_identity_scheme_finishes_deliveries_that_did_not_run() -> None:
    run = lossy_failover(control=True)
    not_run, shared = _violations(run)
    assert not_run, "the control must mark rows succeeded without their handler having run"
    assert shared, "the control must apply one idempotency key to two deliveries"


async def _claims_after_promotion(url: str, pack: int) -> dict[str, list[int]]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        kw: dict[str, Any] = {"owner": "o", "lease_s": 60.0}
        got = {
            "plain": await claim.work_item_claim_plain_batch(conn, [pack], ["default"], [2], keyed={}, **kw),
            "rate": await claim.work_item_claim_rate_batch(
                conn, [pack], ["default"], [2], held_back={}, due_in={}, keyed={}, **kw
            ),
            "flow": await claim.work_item_claim_batch(conn, [pack], ["default"], [2], **kw),
        }
        out = {k: [int(r[1]) for r in rows] for k, rows in got.items()}
        receipts = await routing.receipt_claim_routable(
            conn, owner="m", limit=2, lease_s=60.0, horizon_wait_s=0
        )
        out["receipt"] = [r.claim_token for r in receipts]
        return out
    finally:
        await conn.close()


def test_every_claim_statement_salts_its_token_with_the_servers_timeline() -> None:
    """After a promotion each claim statement (plain, rate, flow, the materializer's receipt claim)
    hands out ``(timeline - 1) << 31`` plus the row's next count: a row claimed once on timeline 1
    and once on timeline 2 has tokens 1 and 2**31 + 2."""
    with PgPair() as pair:
        primary = pair.direct(pair.ports[0])
        upgrade(primary)
        with psycopg.connect(primary, autocommit=True) as p:
            pack = seed.seed_pack(p, "p", {"w": seed.python_work_type(f"{effects.__name__}:noop")})
            ids = seed.seed_items(p, pack, 6)
            # Each row claimed once on timeline 1 (token 1), then ready again.
            p.execute("UPDATE connector_work_item SET lease_token = 1")
            p.execute("UPDATE connector_ingress_receipt SET router_status = 'pending', claim_token = 1")
            assert p.execute(tokens.TIMELINE_CURRENT).fetchone()[0] == 1  # type: ignore[index]
        pair.wait_replayed()
        pair.kill_primary()
        pair.promote()
        got = asyncio.run(_claims_after_promotion(pair.direct(pair.standby_port), pack))
    assert got == {k: [2**31 + 2] * 2 for k in ("plain", "rate", "flow", "receipt")}, got
    assert len(ids) == 6 and tokens.token_timeline(2**31 + 2) == 2
