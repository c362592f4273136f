"""Operator actions against real executor processes (``connector executor``) on a real PostgreSQL,
through the real admin API and CLI of one of them:

* a pause: once ``connector admin pause`` has returned (the pause committed), no item of the paused
  pack is ever claimed again by either process — although both keep claiming other work — until
  ``connector admin resume``; then every item runs exactly once;
* a cancel racing the claims of two processes: for every item exactly one of the cancel and a claim
  wins, never both.

Each has a control running the same proof against an injected bug (``tests/executor/controls``):
the claim without its pause filter, the cancel without its fence; the proof must catch it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
from pathlib import Path

import grpc
import psycopg
import pytest

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc
from tests.executor import effects, seed
from tests.executor.helpers import CONNECTOR, ROOT, free_port, wait_for

pytestmark = pytest.mark.slow

CONTROLS = Path(__file__).resolve().parent / "controls"
TOKEN = "operator-token-0123456789abcdef"


def _pack(db: psycopg.Connection, name: str) -> int:
    db.execute(effects.EFFECT_TABLE)
    return seed.seed_pack(db, name, {"w": seed.python_work_type("tests.executor.effects:record")})


def _env(admin_port: int | None = None, *, control: str | None = None, sleep: str = "0.05") -> dict[str, str]:
    env = {"EXECUTOR_TEST_SLEEP_S": sleep, "CONNECTOR_ADMIN_TOKENS": f"{TOKEN}=ConnectorOperator"}
    if admin_port is not None:
        env["CONNECTOR_EXECUTOR_GRPC_PORT"] = str(admin_port)
    if control is not None:
        env[control] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(CONTROLS), str(ROOT)])
    return env


def _cli(port: int, *args: str) -> str:
    done = subprocess.run(
        [str(CONNECTOR), "admin", *args, "--address", f"127.0.0.1:{port}"],
        env={**os.environ, "CONNECTOR_ADMIN_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _admin_ready(port: int) -> None:
    """Until the executor's admin API answers (it binds after the process registers)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)

    def answers() -> bool:
        try:
            stub.GetQueueStats(
                pb.GetQueueStatsRequest(), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=5
            )
        except grpc.RpcError:
            return False
        return True

    try:
        wait_for(answers, 30, "the admin API answering")
    finally:
        channel.close()


def _claimed(db: psycopg.Connection, pack: int) -> set[int]:
    """Items of ``pack`` ever claimed (the lease token counts claims; a record run never retries)."""
    rows = db.execute(
        "SELECT work_id FROM connector_work_item WHERE installed_pack_id = %s AND lease_token > 0", (pack,)
    ).fetchall()
    return {int(r[0]) for r in rows}


def _count(db: psycopg.Connection, pack: int, states: tuple[str, ...]) -> int:
    row = db.execute(
        "SELECT count(*) FROM connector_work_item WHERE installed_pack_id = %s AND state = ANY(%s)",
        (pack, list(states)),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("control", [False, True], ids=["pause", "control-claim-ignores-pause"])
def test_no_claim_of_paused_work_after_the_pause_commits(db, spawn, control: bool) -> None:
    paused, other = _pack(db, "paused"), _pack(db, "other")
    port = free_port()
    flag = "CONNECTOR_TEST_IGNORE_PAUSE" if control else None
    a = spawn(admin=True, extra_env=_env(port, control=flag))
    b = spawn(extra_env=_env(control=flag))
    a.wait_registered(db)
    b.wait_registered(db)
    _admin_ready(port)
    ids = seed.seed_items(db, paused, 4000)
    db.execute("NOTIFY connector_work")
    wait_for(lambda: _count(db, paused, ("succeeded",)) >= 200, 60, "the paused pack's work under way")

    out = _cli(port, "pause", "paused", "--reason", "provider outage", "--request-id", "pause-test")
    assert "paused:" in out and "resume with: connector admin resume paused" in out
    before = _claimed(db, paused)  # the pause has committed: this set must never grow
    assert len(before) < len(ids), "the queue drained before the pause: nothing left to prove"

    # Both processes keep claiming: new work of another pack, seeded after the pause, runs on both.
    others = seed.seed_items(db, other, 600)
    db.execute("NOTIFY connector_work")
    if control:
        wait_for(lambda: len(_claimed(db, paused)) > len(before), 30, "the control claims paused work")
        return
    wait_for(lambda: _count(db, other, ("succeeded",)) == len(others), 60, "the other pack drained")
    ran_on = db.execute(
        "SELECT DISTINCT pid FROM executor_test_effect WHERE phase = 'end' AND work_id = ANY(%s)", (others,)
    ).fetchall()
    assert {r[0] for r in ran_on} == {a.pid, b.pid}, "both processes claimed after the pause"
    wait_for(lambda: _count(db, paused, ("processing",)) == 0, 30, "in-flight items of the paused pack done")
    assert _claimed(db, paused) == before, "an item of the paused pack was claimed after the pause"
    assert _count(db, paused, ("pending",)) == len(ids) - len(before)

    stats = json.loads(_cli(port, "stats", "--json"))
    [pause] = stats["pauses"]
    assert pause["pack_name"] == "paused" and pause["queue_class"] == "*"
    assert pause["request_id"] == "pause-test" and pause["reason"] == "provider outage"

    _cli(port, "resume", "paused")
    wait_for(
        lambda: _count(db, paused, ("succeeded",)) == len(ids), 90, "the paused pack drained after resume"
    )
    ends = dict(
        db.execute(
            "SELECT work_id, count(*) FROM executor_test_effect WHERE phase = 'end' AND accepted"
            " AND work_id = ANY(%s) GROUP BY 1",
            (ids,),
        ).fetchall()
    )
    assert sorted(ends) == sorted(ids) and set(ends.values()) == {1}


@pytest.mark.parametrize("control", [False, True], ids=["cancel", "control-unfenced-cancel"])
def test_cancel_racing_claims_exactly_one_wins(db, spawn, control: bool) -> None:
    pack = _pack(db, "race")
    port = free_port()
    flag = "CONNECTOR_TEST_UNFENCED_CANCEL" if control else None
    a = spawn(admin=True, extra_env=_env(port, control=flag, sleep="0.1"))
    b = spawn(extra_env=_env(control=flag, sleep="0.1"))
    a.wait_registered(db)
    b.wait_registered(db)
    _admin_ready(port)
    ids = seed.seed_items(db, pack, 1500)
    db.execute("NOTIFY connector_work")

    won: dict[int, int] = {}  # work id -> successful cancels
    refused: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def canceller(seed_: int) -> None:
        rng = random.Random(seed_)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        md = (("authorization", f"Bearer {TOKEN}"),)
        with psycopg.connect(db.info.dsn, autocommit=True) as conn:
            while not stop.is_set():
                # Around the claim front, where the claims are: just-claimed and next pending items.
                front = [
                    int(r[0])
                    for r in conn.execute(
                        "SELECT work_id FROM connector_work_item WHERE installed_pack_id = %s"
                        " AND state IN ('pending', 'processing') ORDER BY work_id LIMIT 150",
                        (pack,),
                    ).fetchall()
                ]
                if not front:
                    return
                front = rng.sample(front, min(8, len(front)))
                for work_id in front:
                    try:
                        stub.CancelWorkItem(
                            pb.CancelWorkItemRequest(work_id=work_id, reason="race"), metadata=md, timeout=30
                        )
                        with lock:
                            won[work_id] = won.get(work_id, 0) + 1
                    except grpc.RpcError as exc:
                        key = f"{exc.code().name}"
                        with lock:
                            refused[key] = refused.get(key, 0) + 1
        channel.close()

    threads = [threading.Thread(target=canceller, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: _count(db, pack, ("pending", "processing", "retry")) == 0, 120, "every item final")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    started = {
        int(r[0])
        for r in db.execute(
            "SELECT DISTINCT work_id FROM executor_test_effect WHERE work_id = ANY(%s)", (ids,)
        ).fetchall()
    }
    cancelled = {
        int(r[0])
        for r in db.execute(
            "SELECT work_id FROM connector_work_item WHERE installed_pack_id = %s AND state = 'cancelled'",
            (pack,),
        ).fetchall()
    }
    both = (cancelled | set(won)) & started
    if control:
        assert both, "the control: an unfenced cancel overwrote a claimed item"
        return
    assert not both, f"items both claimed (their handler ran) and cancelled: {sorted(both)[:10]}"
    print(f"cancel race: {len(won)} cancelled, {len(started)} ran, refused {refused}")
    assert cancelled == set(won) and set(won.values()) == {1}
    assert started and cancelled, f"no race happened: {len(started)} ran, {len(cancelled)} cancelled"
    assert cancelled | started == set(ids)
    assert refused.get("FAILED_PRECONDITION", 0) > 0, refused  # cancels that met a claim (or a finish)
    assert set(refused) <= {"FAILED_PRECONDITION", "ABORTED"}, refused
    ends = dict(
        db.execute(
            "SELECT work_id, count(*) FROM executor_test_effect WHERE phase = 'end' AND accepted GROUP BY 1"
        ).fetchall()
    )
    assert set(ends) == started and set(ends.values()) == {1}
