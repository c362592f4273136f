"""OpenCircuit / CloseCircuit, circuits in GetQueueStats and CIRCUIT_OPEN in TraceDelivery
(docs/adr/013-circuit-breakers.md): a forced open stops the claims of the target until it is
closed, both are audited (actor, reason, log line), idempotent, with dry runs and request ids; the
role is ConnectorOperator."""

from __future__ import annotations

import logging

import grpc
import psycopg
import pytest

from connector.common.store import work_items
from connector.v1 import admin_service_pb2 as pb
from tests.executor import seed as eseed

from .conftest import OPERATOR, REPLAY, VIEW, Admin, expect_error

TARGET = "https://crm.internal:443"
WT = {"w": eseed.python_work_type("tests.executor.effects:noop")}


async def _claim(conn: psycopg.AsyncConnection, pack: int, n: int = 10) -> list[int]:
    rows = await work_items.claim.work_item_claim_batch(conn, [pack], ["default"], [n], owner="t", lease_s=30)
    return [int(r[0]) for r in rows]


async def _call(admin: Admin, method: str, pack: int, target: str = TARGET, role: str = OPERATOR, **kw):
    kind = pb.OpenCircuitRequest if method == "OpenCircuit" else pb.CloseCircuitRequest
    request = kind(installed_pack_id=pack, target=target, reason=kw.pop("reason", "crm outage"), **kw)
    return await getattr(admin.stub, method)(request, metadata=Admin.md(role))


async def test_manual_open_and_close(
    admin: Admin, db: psycopg.Connection, adb: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pack = eseed.seed_pack(db, "shop", WT)
    ids = eseed.seed_items(db, pack, 3, circuit_keys=[TARGET] * 3, circuit={"consecutive_failures": 5})
    dry = await _call(admin, "OpenCircuit", pack, dry_run=True)
    assert dry.dry_run and dry.changed and dry.circuit.state == pb.CIRCUIT_STATE_CLOSED
    opened = await _call(admin, "OpenCircuit", pack, request_id="open-1")
    c = opened.circuit
    assert opened.changed and c.state == pb.CIRCUIT_STATE_OPEN and c.forced
    assert c.actor.startswith("key:") and c.note == "crm outage" and c.reason == "manual_open"
    assert c.pack_name == "shop" and c.target == TARGET and c.policy.consecutive_failures == 5
    again = await _call(admin, "OpenCircuit", pack, request_id="open-1")  # AIP-155: the same answer
    assert again == opened
    assert not (await _call(admin, "OpenCircuit", pack)).changed  # idempotent
    assert await _claim(adb, pack) == []
    stats = await admin.stub.GetQueueStats(
        pb.GetQueueStatsRequest(installed_pack_id=pack), metadata=Admin.md(VIEW)
    )
    assert [(s.target, s.state, s.waiting, s.forced) for s in stats.circuits] == [
        (TARGET, pb.CIRCUIT_STATE_OPEN, 3, True)
    ]
    trace = await admin.stub.TraceDelivery(pb.TraceDeliveryRequest(work_id=ids[0]), metadata=Admin.md(VIEW))
    wait = trace.events[0].work_items[0].wait
    assert (
        wait.reason == pb.WAIT_REASON_CIRCUIT_OPEN and TARGET in wait.detail and "crm outage" in wait.detail
    )
    closed = await _call(admin, "CloseCircuit", pack, reason="crm back")
    assert closed.changed and closed.circuit.state == pb.CIRCUIT_STATE_CLOSED and not closed.circuit.forced
    assert closed.circuit.note == "crm back"
    assert not (await _call(admin, "CloseCircuit", pack)).changed
    db.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = ANY(%s)", (ids,))
    assert sorted(await _claim(adb, pack)) == ids
    lines = [r.getMessage() for r in caplog.records if "circuit breaker" in r.getMessage()]
    assert len(lines) == 2, lines  # one audit line per change (not for the repeats or the dry run)


async def test_close_makes_the_held_items_due_at_once(
    admin: Admin, db: psycopg.Connection, adb: psycopg.AsyncConnection
) -> None:
    """#24: the runbook says closing a circuit makes its held items due at once; they waited for
    the old ``open_until``. The items a claim deferred while it was open (and the retries of its
    target) are due at the close; a delayed first run whose due time nothing moved keeps it, and
    items of another circuit keep theirs."""
    pack = eseed.seed_pack(db, "shop", WT)
    policy = {"consecutive_failures": 5, "open_s": 600}
    held = eseed.seed_items(db, pack, 3, circuit_keys=[TARGET] * 3, circuit=policy)
    other = eseed.seed_items(db, pack, 1, circuit_keys=["https://other:443"], circuit=policy)
    delayed = eseed.seed_items(db, pack, 1, circuit_keys=[TARGET], circuit=policy)
    db.execute(
        "UPDATE connector_work_item SET run_after = now() + interval '5 min', updated_at = created_at"
        " WHERE work_id = ANY(%s)",
        (delayed,),
    )
    await _call(admin, "OpenCircuit", pack, target="https://other:443")
    await _call(admin, "OpenCircuit", pack)
    assert await _claim(adb, pack) == []  # both open: the claim defers the due items
    deferred = db.execute(
        "SELECT count(*) FROM connector_work_item"
        " WHERE work_id = ANY(%s) AND run_after > now() + interval '9 min'",
        (held + other,),
    ).fetchone()
    assert deferred == (4,)
    closed = await _call(admin, "CloseCircuit", pack, reason="crm back")
    assert closed.changed and closed.circuit.state == pb.CIRCUIT_STATE_CLOSED
    assert sorted(await _claim(adb, pack)) == held  # at once: no wait for the old open period
    due = db.execute(
        "SELECT work_id, run_after > now() FROM connector_work_item WHERE work_id = ANY(%s) ORDER BY 1",
        (delayed + other,),
    ).fetchall()
    assert sorted(due) == sorted([(delayed[0], True), (other[0], True)])


async def test_trace_names_the_circuit_for_an_item_it_holds(
    admin: Admin, db: psycopg.Connection, adb: psycopg.AsyncConnection
) -> None:
    """#24: an item that failed (retry, http_500) and was then held back by its open circuit read
    "retry backoff after http_500" once the open period had passed (half-open, a probe slot free):
    the trace names the circuit; once the item is due it is a probe candidate, not waiting."""
    pack = eseed.seed_pack(db, "shop", WT)
    (wid,) = eseed.seed_items(
        db, pack, 1, circuit_keys=[TARGET], circuit={"consecutive_failures": 5, "open_s": 30}
    )
    db.execute(
        """UPDATE connector_work_item SET state = 'retry', attempts = 1, failure_class = 'http_500',
             run_after = now() + interval '20 s', updated_at = clock_timestamp() WHERE work_id = %s""",
        (wid,),
    )
    db.execute(
        """UPDATE connector_circuit SET state = 'open', reason = 'consecutive_failures', consecutive = 5,
             open_until = now() - interval '1 s', changed_at = now() - interval '31 s'
           WHERE installed_pack_id = %s""",
        (pack,),
    )

    async def wait() -> pb.WorkItemWait:
        trace = await admin.stub.TraceDelivery(pb.TraceDeliveryRequest(work_id=wid), metadata=Admin.md(VIEW))
        return trace.events[0].work_items[0].wait

    held = await wait()
    assert held.reason == pb.WAIT_REASON_CIRCUIT_OPEN, held
    assert TARGET in held.detail and "half-open" in held.detail and "probe" in held.detail
    db.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (wid,))
    assert (await wait()).reason != pb.WAIT_REASON_CIRCUIT_OPEN  # due: a probe candidate


async def test_refusals(admin: Admin, db: psycopg.Connection) -> None:
    pack = eseed.seed_pack(db, "shop", WT)
    eseed.seed_items(db, pack, 1, circuit_keys=[TARGET], circuit={"consecutive_failures": 5})
    await expect_error(_call(admin, "OpenCircuit", pack, role=REPLAY), grpc.StatusCode.PERMISSION_DENIED)
    await expect_error(_call(admin, "OpenCircuit", pack, reason=""), grpc.StatusCode.INVALID_ARGUMENT)
    await expect_error(_call(admin, "OpenCircuit", pack, target=""), grpc.StatusCode.INVALID_ARGUMENT)
    await expect_error(
        _call(admin, "OpenCircuit", pack, target="https://elsewhere:443"),
        grpc.StatusCode.NOT_FOUND,
        "CIRCUIT_NOT_FOUND",
    )
    await expect_error(_call(admin, "CloseCircuit", 9999), grpc.StatusCode.NOT_FOUND, "PACK_NOT_FOUND")
