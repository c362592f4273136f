"""``RunReconcile`` / ``connector admin reconcile`` (docs/reconcile.md): the admin API records the run,
the ingress leading the reconciler runs it, the CLI prints what it found. A dry run admits nothing
(the control of the real run that follows), a fault is printed with what to do, refusals name the
route problem."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest
import pytest_asyncio

from connector.cli import main as cli_main
from connector.common.store import reconcile as reconcile_store
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc
from tests.admin.conftest import OPERATOR, VIEW, expect_error, start_admin

from .conftest import NAMESPACE, StartIngress
from .fake_provider import FakeProvider, Faults
from .test_reconcile import by_delivery, start, stripe_route, wait_for


@pytest_asyncio.fixture
async def stub(db_url: str) -> AsyncIterator[admin_service_pb2_grpc.AdminServiceStub]:
    running = await start_admin(db_url)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}")
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)
    stub.port = running.server.port  # type: ignore[attr-defined]
    try:
        yield stub
    finally:
        await channel.close()
        await running.stop()


def md(token: str = OPERATOR) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def cli(
    stub: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setenv("CONNECTOR_ADMIN_ADDRESS", f"127.0.0.1:{stub.port}")
    monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", OPERATOR)
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main.main, ["admin", "reconcile", *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def test_dry_run_then_run_then_nothing_missing(
    start_ingress: StartIngress,
    db_url: str,
    provider: FakeProvider,
    stub: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Sent ten minutes ago, before the route was reconciled: the scheduled passes never see them.
    events = [provider.add_event(f"evt_old_{n}", int(time.time()) - 600 + n) for n in range(4)]
    svc = await start(start_ingress, db_url, [stripe_route(provider.url, interval="1h")], since_s=60)
    assert svc.reconciler is not None
    await wait_for(lambda: svc.reconciler.passes >= 1)
    assert by_delivery(db_url) == {}

    code, out, _ = await cli(
        stub, monkeypatch, capsys, "--route", f"{NAMESPACE}/stripe", "--since", "1h", "--dry-run"
    )
    assert code == 0, out
    assert "(pull, dry run): done" in out and "missing 4:" in out and "nothing admitted" in out
    assert all(e["id"] in out for e in events)
    assert by_delivery(db_url) == {}  # the dry run admitted nothing

    code, out, _ = await cli(stub, monkeypatch, capsys, "--route", f"{NAMESPACE}/stripe", "--since", "1h")
    assert code == 0, out
    assert "admitted: 4" in out
    rows = by_delivery(db_url)
    assert sorted(rows) == sorted(e["id"] for e in events)
    assert all(v[0]["origin"] == "reconciled" for v in rows.values())

    again = await stub.RunReconcile(
        pb.RunReconcileRequest(namespace=NAMESPACE, route_key="stripe", request_id="r-2"), metadata=md()
    )
    assert again.run.state == pb.RECONCILE_RUN_STATE_DONE and again.run.missing == 0 and again.run.listed == 4
    found = await stub.FindDeliveries(pb.FindDeliveriesRequest(origin="reconciled"), metadata=md(VIEW))
    assert sorted(d.receipt.provider_delivery_id for d in found.deliveries) == sorted(e["id"] for e in events)
    assert {d.receipt.origin for d in found.deliveries} == {"reconciled"}
    webhooks = await stub.FindDeliveries(pb.FindDeliveriesRequest(origin="webhook"), metadata=md(VIEW))
    assert list(webhooks.deliveries) == []  # control: the filter selects
    trace = await stub.TraceDelivery(
        pb.TraceDeliveryRequest(receipt_id=found.deliveries[0].receipt.receipt_id), metadata=md(VIEW)
    )
    assert trace.receipt.origin == "reconciled"
    assert (trace.routing.verification_scheme, trace.routing.verification_key_ref) == (
        "fetched from 127.0.0.1",
        "env:RECON_T_PROVIDER_TOKEN",
    )
    monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", OPERATOR)
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main.main, ["admin", "trace", str(trace.receipt.receipt_id)])
    out = capsys.readouterr().out
    assert code == 0 and "reconciled" in out and "fetched from 127.0.0.1" in out, out
    listed = await stub.ListReconcileStates(pb.ListReconcileStatesRequest(), metadata=md(VIEW))
    (st,) = listed.states
    assert (st.namespace, st.route_key) == (NAMESPACE, "stripe") and st.HasField("watermark")
    assert st.HasField("last_clean_pass_time") and not st.last_error_class and not st.HasField("pass_until")
    code, out, _ = await cli(stub, monkeypatch, capsys)
    assert code == 0 and f"{NAMESPACE}/stripe" in out and "LAST CLEAN PASS" in out, out
    other = await stub.ListReconcileStates(pb.ListReconcileStatesRequest(namespace="nope"), metadata=md(VIEW))
    assert list(other.states) == []  # control: the namespace filter selects
    retried = await stub.RunReconcile(
        pb.RunReconcileRequest(namespace=NAMESPACE, route_key="stripe", request_id="r-2"), metadata=md()
    )
    assert retried.run.run_id == again.run.run_id  # AIP-155: the same run


async def test_a_fault_is_printed_with_what_to_do(
    start_ingress: StartIngress,
    db_url: str,
    provider: FakeProvider,
    stub: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    svc = await start(start_ingress, db_url, [stripe_route(provider.url, interval="1h")], since_s=60)
    assert svc.reconciler is not None
    await wait_for(lambda: svc.reconciler.passes >= 1)
    provider.faults = Faults(statuses=[(401, None)] * 5)
    code, out, _ = await cli(stub, monkeypatch, capsys, "--route", f"{NAMESPACE}/stripe", "--dry-run")
    assert code == 1
    assert "failed" in out and "stopped: unauthorized: page 1: HTTP 401" in out
    assert "what to do: the sender refused the API key" in out


async def test_refusals(start_ingress: StartIngress, db_url: str, provider: FakeProvider, stub: Any) -> None:
    no_reconcile = {**stripe_route(provider.url), "key": "plain"}
    del no_reconcile["reconcile"]
    await start(start_ingress, db_url, [stripe_route(provider.url, interval="1h"), no_reconcile])
    await expect_error(
        stub.RunReconcile(pb.RunReconcileRequest(namespace=NAMESPACE, route_key="nope"), metadata=md()),
        grpc.StatusCode.NOT_FOUND,
        "ROUTE_NOT_FOUND",
    )
    await expect_error(
        stub.RunReconcile(pb.RunReconcileRequest(namespace=NAMESPACE, route_key="plain"), metadata=md()),
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_RECONCILED",
    )
    await expect_error(
        stub.RunReconcile(pb.RunReconcileRequest(namespace=NAMESPACE, route_key="stripe"), metadata=md(VIEW)),
        grpc.StatusCode.PERMISSION_DENIED,
        "ROLE_REQUIRED",
    )


async def test_the_leader_deletes_runs_older_than_the_keep(
    start_ingress: StartIngress, db_url: str, provider: FakeProvider
) -> None:
    """The on-demand runs' table stays bounded: the leader deletes the runs asked for more than
    ``RUN_KEEP_S`` ago in every state (a run still ``running`` that old died with its process) and
    keeps the younger ones, one an hour short of the keep among them (the control)."""
    keep = reconcile_store.RUN_KEEP_S
    with psycopg.connect(db_url, autocommit=True) as db:
        for state, age in [("done", keep + 60), ("failed", keep + 60), ("pending", keep + 60),
                           ("running", keep + 60), ("done", keep - 3600), ("failed", 10)]:  # fmt: skip
            db.execute(
                "INSERT INTO connector_reconcile_run"
                " (namespace, route_key, dry_run, actor, state, requested_at)"
                " VALUES (%s, 'stripe', true, 'test', %s, now() - make_interval(secs => %s))",
                (NAMESPACE, state, age),
            )
    svc = await start(start_ingress, db_url, [stripe_route(provider.url, interval="1h")], since_s=60)
    assert svc.reconciler is not None

    def runs() -> list[tuple[str, float]]:
        with psycopg.connect(db_url, autocommit=True) as db:
            return db.execute(
                "SELECT state, extract(epoch FROM now() - requested_at)::float8 FROM connector_reconcile_run"
                " ORDER BY run_id"
            ).fetchall()

    # the leader deletes at its first tick (then once an hour)
    await wait_for(lambda: len(runs()) < 6, timeout=120)
    left = runs()
    assert [state for state, _ in left] == ["done", "failed"], left
    assert all(age < keep for _, age in left)
