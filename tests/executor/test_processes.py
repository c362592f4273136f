"""Proofs with real executor processes (``connector executor``) on a real PostgreSQL.

Every test records *effects* through ``tests.executor.effects``: each execution writes a ``start``
and an ``end`` row carrying the lease token it was given, and whether that token still held the row
at that moment (a fenced sink). "Executed once" means: exactly one accepted ``end`` per item.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.executor import effects, seed
from tests.executor.helpers import ExecutorProcess, kill_9, states, wait_for

pytestmark = pytest.mark.slow

SKEW_DIR = Path(__file__).resolve().parent / "skew"


def _pack(db: psycopg.Connection, handler: str = "record", name: str = "p") -> int:
    db.execute(effects.EFFECT_TABLE)
    return seed.seed_pack(
        db, name, {"w": seed.python_work_type(f"tests.executor.effects:{handler}", max_attempts=10)}
    )


def _accepted_ends(db: psycopg.Connection) -> dict[int, int]:
    return dict(
        db.execute(
            "SELECT work_id, count(*) FROM executor_test_effect WHERE phase = 'end' AND accepted GROUP BY 1"
        ).fetchall()
    )


def _assert_each_once(db: psycopg.Connection, ids: list[int]) -> None:
    ends = _accepted_ends(db)
    assert sorted(ends) == sorted(ids), "every item must have an accepted effect"
    twice = {k: v for k, v in ends.items() if v != 1}
    assert not twice, f"items executed twice at the effect: {twice}"


def _kill_and_snapshot(db: psycopg.Connection, proc: ExecutorProcess, process_id: str) -> dict[int, Any]:
    """SIGKILL ``proc``; once every database session it had is gone (a statement it sent just before
    dying still completes on the server), return its orphans: work id -> lease_until (database time)."""
    kill_9(db, proc)
    return dict(
        db.execute(
            "SELECT work_id, lease_until FROM connector_work_item "
            "WHERE state = 'processing' AND lease_owner = %s",
            (process_id,),
        ).fetchall()
    )


def _assert_at_least_once(
    db: psycopg.Connection, ids: list[int], orphans: dict[int, Any], rerun_pid: int
) -> None:
    """Every item ran; only orphans may have run twice (an effect just before the kill whose finalize
    never committed), each accepted effect under a distinct token; and every orphan was re-run only
    after its lease had expired (database time)."""
    ends = _accepted_ends(db)
    assert sorted(ends) == sorted(ids)
    assert {k for k, v in ends.items() if v > 1} <= set(orphans)
    assert max(ends.values()) <= 2
    dup_tokens = db.execute(
        """SELECT count(*) FROM (SELECT work_id, token FROM executor_test_effect
           WHERE phase = 'end' AND accepted GROUP BY 1, 2 HAVING count(*) > 1) x"""
    ).fetchone()[0]
    assert dup_tokens == 0
    reruns = dict(
        db.execute(
            """SELECT work_id, min(at) FROM executor_test_effect
               WHERE work_id = ANY(%s) AND pid = %s AND phase = 'start' GROUP BY 1""",
            (list(orphans), rerun_pid),
        ).fetchall()
    )
    assert set(reruns) == set(orphans)
    early = {w: (reruns[w], lease_until) for w, lease_until in orphans.items() if reruns[w] < lease_until}
    assert not early, f"orphans re-run before their lease expired: {early}"


def _all_succeeded(db: psycopg.Connection, n: int):
    return lambda: states(db).get("succeeded", 0) == n


def test_two_processes_sixteen_workers_every_item_once(db, spawn) -> None:
    pack = _pack(db)
    a = spawn(admin=True, extra_env={"EXECUTOR_TEST_SLEEP_JITTER_S": "0.004"})
    b = spawn(extra_env={"EXECUTOR_TEST_SLEEP_JITTER_S": "0.004"})
    a.wait_registered(db)
    b.wait_registered(db)
    # The work appears once both claim: neither can drain it alone while the other is still starting.
    ids = seed.seed_items(db, pack, 3000)
    db.execute("NOTIFY connector_work")
    wait_for(_all_succeeded(db, 3000), 60, "3000 succeeded")
    _assert_each_once(db, ids)
    pids = dict(
        db.execute("SELECT pid, count(*) FROM executor_test_effect WHERE phase = 'end' GROUP BY 1").fetchall()
    )
    assert set(pids) == {a.pid, b.pid} and min(pids.values()) > 300, pids  # both did real work
    assert db.execute("SELECT count(*) FROM executor_test_effect WHERE NOT accepted").fetchone()[0] == 0
    assert db.execute("SELECT max(lease_token) FROM connector_work_item").fetchone()[0] == 1
    assert a.metric("connector_executor_stale_token_rejections_total") == 0
    assert b.metric("connector_executor_stale_token_rejections_total") == 0
    # SIGTERM: both drain and deregister; exit code 0.
    assert a.stop() == 0 and b.stop() == 0
    assert db.execute("SELECT count(*) FROM connector_process").fetchone()[0] == 0


def test_kill_9_items_are_reclaimed_after_lease_expiry_and_finished_by_the_other(db, spawn) -> None:
    pack = _pack(db)
    ids = seed.seed_items(db, pack, 600)
    env = {"EXECUTOR_TEST_SLEEP_S": "0.05", "CONNECTOR_EXECUTOR_LEASE_S": "2"}
    # A finishes 50 items, then holds what it claims until it is killed: it cannot drain the queue
    # before B is up, however slow B's start is on a busy machine.
    a = spawn(extra_env={**env, "EXECUTOR_TEST_HOLD_AFTER": "50"})
    a_id = a.wait_registered(db)
    wait_for(lambda: states(db).get("succeeded", 0) >= 50, 30, "progress")
    b = spawn(extra_env=env)
    b.wait_registered(db)
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM connector_work_item WHERE state = 'processing' AND lease_owner = %s",
                (a_id,),
            ).fetchone()[0]
            >= 10
        ),
        10,
        "A holds items",
    )
    orphans = _kill_and_snapshot(db, a, a_id)
    assert orphans
    wait_for(_all_succeeded(db, 600), 60, "600 succeeded")
    _assert_at_least_once(db, ids, orphans, b.pid)
    assert b.metric("connector_executor_lease_reclaims_total") >= len(orphans)
    # A's row stays (no clean exit): its heartbeat simply stops.
    assert (
        db.execute("SELECT count(*) FROM connector_process WHERE process_id = %s", (a_id,)).fetchone()[0] == 1
    )


def test_sigstop_past_the_lease_stale_holder_is_fenced(db, spawn) -> None:
    """A GC-pause: A is stopped while holding items, B reclaims and finishes them, A resumes. A's
    renewals and finalizes match no row (counted), and its late effects are rejected."""
    pack = _pack(db, "record_sync")
    ids = seed.seed_items(db, pack, 10)
    a = spawn(
        extra_env={
            "EXECUTOR_TEST_SLEEP_S": "1.5",
            "CONNECTOR_EXECUTOR_WORKERS": "2",
            "CONNECTOR_EXECUTOR_CLAIM_BATCH": "8",
            "CONNECTOR_EXECUTOR_LEASE_S": "2",
        }
    )
    a_id = a.wait_registered(db)
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM connector_work_item WHERE state = 'processing' AND lease_owner = %s",
                (a_id,),
            ).fetchone()[0]
            == 10
        ),
        10,
        "A holds all ten",
    )
    wait_for(
        lambda: db.execute("SELECT count(*) FROM executor_test_effect").fetchone()[0] >= 2, 10, "A started"
    )
    a.signal(signal.SIGSTOP)
    try:
        b = spawn(extra_env={"CONNECTOR_EXECUTOR_LEASE_S": "2"})
        b.wait_registered(db)
        wait_for(_all_succeeded(db, 10), 30, "B finished everything")
        tokens_after_b = dict(db.execute("SELECT work_id, lease_token FROM connector_work_item").fetchall())
    finally:
        a.signal(signal.SIGCONT)

    def a_fenced() -> bool:
        # A learns its leases are gone by a renewal that matches nothing or, when its lease watch
        # runs first after SIGCONT, by its own clock (lease_watch.py: then it renews nothing); the
        # sync handlers' late completes are always sent and fenced.
        knows = a.metric("connector_executor_stale_token_rejections_total", {"op": "renew"}) + a.metric(
            "connector_executor_lease_expired_local_total"
        )
        return (
            knows >= 1
            and a.metric("connector_executor_stale_token_rejections_total", {"op": "complete"}) >= 1
        )

    wait_for(a_fenced, 20, "A's stale renew (or local lease expiry) and finalize counted")
    _assert_each_once(db, ids)
    # Nothing A did after resuming changed a row: every item is still B's success.
    assert states(db) == {"succeeded": 10}
    assert (
        dict(db.execute("SELECT work_id, lease_token FROM connector_work_item").fetchall()) == tokens_after_b
    )
    late = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE accepted) FROM executor_test_effect "
        "WHERE pid = %s AND phase = 'end'",
        (a.pid,),
    ).fetchone()
    assert late[0] >= 1 and late[1] == 0  # A's effects after the pause were all rejected at the sink
    assert a.proc.poll() is None  # A survived and keeps running


def test_skewed_process_clocks_change_nothing(db, spawn) -> None:
    """Two executors whose wall clocks are 3 hours fast and 3 hours slow: leases come from the
    database clock, so long handlers are renewed, never reclaimed by the other, and a dead holder
    is reclaimed exactly when its lease (database time) ends."""
    pack = _pack(db)
    common = {
        # Longer than the lease: only renewals keep it. A lease of 4 s leaves a busy machine room to
        # renew in time (a late renewal is an expiry, which is not what this test is about).
        "EXECUTOR_TEST_SLEEP_S": "5",
        "CONNECTOR_EXECUTOR_LEASE_S": "4",
        "CONNECTOR_EXECUTOR_CLAIM_BATCH": "8",  # window 24: both processes get work
        "PYTHONPATH": os.pathsep.join([str(SKEW_DIR), str(Path(__file__).resolve().parents[2])]),
    }
    fast = spawn(extra_env={**common, "CONNECTOR_TEST_CLOCK_SKEW_S": str(3 * 3600)})
    slow = spawn(extra_env={**common, "CONNECTOR_TEST_CLOCK_SKEW_S": str(-3 * 3600)})
    fast_id = fast.wait_registered(db)
    slow.wait_registered(db)
    # Seeded once both claim, so neither finishes its first window before the other starts.
    ids = seed.seed_items(db, pack, 32)
    db.execute("NOTIFY connector_work")
    wait_for(lambda: states(db).get("processing", 0) == 32, 15, "all 32 running")
    # Leases are database time: between now and now + lease, whatever the holders' clocks say.
    left = db.execute(
        "SELECT min(extract(epoch FROM lease_until - clock_timestamp())), "
        "max(extract(epoch FROM lease_until - clock_timestamp())) FROM connector_work_item"
    ).fetchone()
    assert 0 < float(left[0]) and float(left[1]) <= 4.0
    wait_for(_all_succeeded(db, 32), 30, "32 succeeded")
    _assert_each_once(db, ids)
    for p in (fast, slow):
        assert p.metric("connector_executor_lease_reclaims_total") == 0
        assert p.metric("connector_executor_stale_token_rejections_total") == 0
    # The shim really skewed them (their handlers' wall clocks are off by +-3 h against the database).
    skews = dict(
        db.execute(
            "SELECT pid, avg(wall - extract(epoch FROM at)) FROM executor_test_effect GROUP BY 1"
        ).fetchall()
    )
    assert abs(skews[fast.pid] - 10800) < 60 and abs(skews[slow.pid] + 10800) < 60
    # Kill the fast one while it holds items: the slow one reclaims them only after expiry. Twice
    # a window's worth, so the fast one gets some whoever claims first (with 16 the slow one once
    # took them all on a loaded machine and the fast one never held any).
    more = seed.seed_items(db, pack, 48)
    db.execute("NOTIFY connector_work")
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM connector_work_item WHERE state = 'processing' AND lease_owner = %s",
                (fast_id,),
            ).fetchone()[0]
            > 0
        ),
        60,
        "fast holds items",
    )
    orphans = _kill_and_snapshot(db, fast, fast_id)
    wait_for(_all_succeeded(db, 80), 120, "80 succeeded")
    _assert_at_least_once(db, ids + more, orphans, slow.pid)


def _intervals(db: psycopg.Connection, ids: list[int]) -> dict[int, list[tuple[int, int]]]:
    """Per item: (start seq, end-or-failed seq) of each accepted execution."""
    rows = db.execute(
        """SELECT work_id, token, phase, seq FROM executor_test_effect
           WHERE work_id = ANY(%s) AND accepted ORDER BY seq""",
        (ids,),
    ).fetchall()
    open_: dict[tuple[int, int], int] = {}
    out: dict[int, list[tuple[int, int]]] = {}
    for work_id, token, phase, seq in rows:
        if phase == "start":
            open_[(work_id, token)] = seq
        else:
            out.setdefault(work_id, []).append((open_.pop((work_id, token)), seq))
    return out


def _lane_violations(db: psycopg.Connection, lanes: dict[int, str]) -> int:
    """Within each lane (items in delivery order), an item must not start before its predecessor's
    last execution ended."""
    iv = _intervals(db, list(lanes))
    by_lane: dict[str, list[int]] = {}
    for work_id in sorted(lanes):  # work ids are in delivery order here
        by_lane.setdefault(lanes[work_id], []).append(work_id)
    violations = 0
    for members in by_lane.values():
        for prev, nxt in itertools.pairwise(members):
            if min(s for s, _ in iv[nxt]) < max(e for _, e in iv[prev]):
                violations += 1
    return violations


def _run_lanes(db, spawn, *, n: int, lanes: list[str], kind: str, enforce: bool, env: dict[str, str]) -> dict:
    pack = _pack(db, name=f"lanes{random.randrange(10**9)}")
    keys = lanes if enforce else [None] * n
    ids = seed.seed_items(
        db,
        pack,
        n,
        source_lanes=keys if kind == "s" else None,
        target_lanes=keys if kind == "t" else None,
        labels=lanes,
    )
    procs = [spawn(extra_env=env) for _ in range(2)]
    for p in procs:
        p.wait_registered(db)
    t0 = time.monotonic()
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM connector_work_item "
                "WHERE installed_pack_id = %s AND state = 'succeeded'",
                (pack,),
            ).fetchone()[0]
            == n
        ),
        60,
        f"{n} succeeded",
    )
    print(f"lanes run ({kind}, enforce={enforce}): {n} items in {time.monotonic() - t0:.2f}s")
    _assert_each_once(db, ids)
    for p in procs:
        p.stop()
    return dict(zip(ids, lanes, strict=True))


def test_source_fifo_holds_across_processes_with_retries_and_the_check_can_fail(db, spawn) -> None:
    rnd = random.Random(7)
    lanes = [f"src-{rnd.randrange(20)}" for _ in range(600)]  # random, not round-robin (trap 7)
    env = {"EXECUTOR_TEST_SLEEP_JITTER_S": "0.003", "EXECUTOR_TEST_FAIL_FIRST_MOD": "7"}
    members = _run_lanes(db, spawn, n=600, lanes=lanes, kind="s", enforce=True, env=env)
    retried = db.execute(
        "SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%s) AND attempts > 1", (list(members),)
    ).fetchone()[0]
    assert retried >= 600 // 7 - 2  # retries really happened inside lanes
    assert _lane_violations(db, members) == 0
    # Control: the same workload without lane keys must show violations, or the check proves nothing.
    db.execute("TRUNCATE executor_test_effect")
    control = _run_lanes(db, spawn, n=600, lanes=lanes, kind="s", enforce=False, env=env)
    assert _lane_violations(db, control) > 10


def test_same_target_burst_is_serial_and_multi_target_burst_is_parallel(db, spawn) -> None:
    env: dict[str, str] = {}
    one = _run_lanes(db, spawn, n=1000, lanes=["hot"] * 1000, kind="t", enforce=True, env=env)
    iv = _intervals(db, list(one))
    spans = sorted(x for v in iv.values() for x in v)
    overlaps = sum(1 for p, q in itertools.pairwise(spans) if q[0] < p[1])
    assert overlaps == 0, "two items of one target lane were in flight at once"
    assert [
        w for w, _ in sorted(((w, min(s for s, _ in v)) for w, v in iv.items()), key=lambda x: x[1])
    ] == sorted(one)  # and in delivery order
    db.execute("TRUNCATE executor_test_effect")
    rnd = random.Random(3)
    many = _run_lanes(
        db,
        spawn,
        n=1000,
        lanes=[f"t{rnd.randrange(50)}" for _ in range(1000)],
        kind="t",
        enforce=True,
        env=env,
    )
    assert _lane_violations(db, many) == 0
    iv = _intervals(db, list(many))
    events = sorted(
        [(s, 1) for v in iv.values() for s, _ in v] + [(e, -1) for v in iv.values() for _, e in v]
    )
    running = peak = 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    assert peak >= 8, f"multi-target burst ran with at most {peak} in flight"


def test_sigterm_releases_in_flight_items_for_immediate_reclaim(db, spawn) -> None:
    pack = _pack(db)
    seed.seed_items(db, pack, 8)
    a = spawn(extra_env={"EXECUTOR_TEST_SLEEP_S": "30", "CONNECTOR_EXECUTOR_SHUTDOWN_GRACE_S": "0.5"})
    a_id = a.wait_registered(db)
    wait_for(lambda: states(db).get("processing", 0) == 8, 10, "A holds all")
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.proc.wait(10) == 0
    assert time.monotonic() - t0 < 5
    rows = db.execute("SELECT state, lease_owner FROM connector_work_item").fetchall()
    assert {r[0] for r in rows} == {"retry"} and all(r[1] is None for r in rows)
    assert (
        db.execute("SELECT count(*) FROM connector_process WHERE process_id = %s", (a_id,)).fetchone()[0] == 0
    )
    b = spawn()
    b.wait_registered(db)
    wait_for(_all_succeeded(db, 8), 10, "B finished at once (no lease to wait for)")


def _handoff_kill_run(db: psycopg.Connection, spawn, *, handoff: bool) -> set[int]:
    """A drains 20 source lanes alone and then holds what it runs (and has); B starts; A is killed.
    Returns A's orphans that a lane handoff gave it: claimed in the transaction that finished their
    lane predecessor (the orphan's row version has the predecessor's ``xmin``). Asserts B finishes
    every item at least once, orphans only after their lease expired, and each lane in order."""
    rnd = random.Random(29)
    lanes = [f"h-{rnd.randrange(20)}" for _ in range(400)]
    pack = _pack(db, name=f"handoff{random.randrange(10**9)}")
    ids = seed.seed_items(db, pack, 400, source_lanes=lanes, labels=lanes)
    env = {
        "EXECUTOR_TEST_SLEEP_S": "0.01",
        "CONNECTOR_EXECUTOR_LEASE_S": "2",
        "CONNECTOR_EXECUTOR_LANE_HANDOFF": "1" if handoff else "0",
    }
    a = spawn(extra_env={**env, "EXECUTOR_TEST_HOLD_AFTER": "60"})
    a_id = a.wait_registered(db)
    # A member a handoff gave A shares its predecessor's transaction (``xmin``) until A's first
    # lease renewal rewrites the row: sampled while A's holds pile up, kept if still an orphan.
    seen: set[int] = set()

    def holding() -> bool:
        rows = db.execute(
            """SELECT o.work_id, o.xmin::text = p.xmin::text FROM connector_work_item o
               LEFT JOIN LATERAL (SELECT q.xmin FROM connector_work_item q
                                  WHERE q.installed_pack_id = o.installed_pack_id
                                    AND q.source_lane_key = o.source_lane_key
                                    AND q.delivery_seq < o.delivery_seq
                                  ORDER BY q.delivery_seq DESC LIMIT 1) p ON true
               WHERE o.state = 'processing' AND o.lease_owner = %s""",
            (a_id,),
        ).fetchall()
        seen.update(w for w, same in rows if same)
        return len(rows) >= 15

    done = "SELECT count(*) FROM connector_work_item WHERE installed_pack_id = %s AND state = 'succeeded'"
    wait_for(lambda: holding() and db.execute(done, (pack,)).fetchone()[0] >= 60, 30, "A holds items")
    handoffs = a.metric("connector_executor_lane_handoffs_total")
    assert (handoffs > 0) is handoff, handoffs
    b = spawn(extra_env={**env, "CONNECTOR_EXECUTOR_LANE_HANDOFF": "1"})
    b.wait_registered(db)
    orphans = _kill_and_snapshot(db, a, a_id)
    handed = seen & set(orphans)
    wait_for(lambda: db.execute(done, (pack,)).fetchone()[0] == 400, 90, "400 succeeded")
    _assert_at_least_once(db, ids, orphans, b.pid)
    assert _lane_violations(db, dict(zip(ids, lanes, strict=True))) == 0
    b.stop()
    return handed


def test_kill_9_after_lane_handoffs_the_handed_members_are_reclaimed_in_order(db, spawn) -> None:
    """A lane handoff (docs/adr/022-lane-handoff.md) claims the next member in its predecessor's
    finalize transaction. Killed with such members held, the process leaves them processing under
    its lease; the other process re-runs them only after the lease expired, and every lane stays in
    delivery order. Control: with the handoff off, no orphan shares its predecessor's transaction
    (so the check that finds the handed ones can fail)."""
    db.execute(effects.EFFECT_TABLE)
    handed = _handoff_kill_run(db, spawn, handoff=True)
    assert handed, "A held no member a handoff gave it"
    db.execute("TRUNCATE executor_test_effect")
    assert not _handoff_kill_run(db, spawn, handoff=False)
