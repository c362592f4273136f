"""ListProcesses: the registered service processes (connector_process) with heartbeat age and
staleness from the database clock — seeded rows for filter, pagination and the stale flag, and the
real executor, ingress and materializer services registering themselves."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import grpc
import pytest
from pydantic import SecretStr

from connector.common.core.process_registry import runtime_version
from connector.common.core.settings import (
    AdminSettings,
    DatabaseSettings,
    ExecutorSettings,
    IngressSettings,
    MaterializerSettings,
)
from connector.common.store import processes
from connector.executor.legacy import service_scope
from connector.executor.service import ExecutorService
from connector.ingress.service import IngressService
from connector.materializer.service import MaterializerService
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc

from .conftest import REPLAY, TOKENS, VIEW, Admin, Seed, expect_error, start_admin


async def _list(stub: Any, token: str = VIEW, **kw: Any) -> pb.ListProcessesResponse:
    return await stub.ListProcesses(pb.ListProcessesRequest(**kw), metadata=Admin.md(token))


async def _seed_fleet(seed: Seed) -> None:
    await seed.process("work_item", process_id="e1", service="executor", pid=11)
    await seed.process("work_item", process_id="e2", service="executor", pid=12, age_s=60)
    await seed.process("none", process_id="i1", service="ingress", pid=21)
    await seed.process("none", process_id="i2", service="ingress", pid=22, age_s=3600)
    await seed.process("legacy_event", process_id="l1", service="executor-legacy:1:1", pid=31)
    await seed.process("none", process_id="m1", service="materializer", pid=41, age_s=10)


async def test_lists_processes_with_database_computed_age_and_stale_flag(admin: Admin, seed: Seed) -> None:
    await _seed_fleet(seed)
    response = await _list(admin.stub)
    assert response.next_page_token == ""
    assert response.stale_after.ToTimedelta() == timedelta(seconds=15)  # 3 x the 5 s heartbeat
    rows = {p.process_id: p for p in response.processes}
    assert [p.process_id for p in response.processes] == ["e1", "e2", "i1", "i2", "l1", "m1"]
    assert [(p.service, p.claim_capability, p.pid) for p in response.processes] == [
        ("executor", "work_item", 11),
        ("executor", "work_item", 12),
        ("ingress", "none", 21),
        ("ingress", "none", 22),
        ("executor-legacy:1:1", "legacy_event", 31),
        ("materializer", "none", 41),
    ]
    assert {pid for pid, p in rows.items() if p.stale} == {"e2", "i2"}
    for p in response.processes:
        assert p.hostname == "h" and p.version == "test" and p.revision == ""  # no revision known
        assert p.HasField("start_time") and p.HasField("heartbeat_time") and p.HasField("heartbeat_age")
    ages = {pid: p.heartbeat_age.ToTimedelta().total_seconds() for pid, p in rows.items()}
    assert 60 <= ages["e2"] < 90 and 3600 <= ages["i2"] < 3630 and 10 <= ages["m1"] < 15
    assert 0 <= ages["e1"] < 5
    # One database clock for the whole answer: heartbeat time + age is the same instant on every row.
    instants = {p.heartbeat_time.ToDatetime() + p.heartbeat_age.ToTimedelta() for p in response.processes}
    assert len(instants) == 1


async def test_filter_by_service_and_keyset_pagination(admin: Admin, seed: Seed) -> None:
    await _seed_fleet(seed)
    only = await _list(admin.stub, service="ingress")
    assert [p.process_id for p in only.processes] == ["i1", "i2"] and only.next_page_token == ""
    none = await _list(admin.stub, service="nope")
    assert list(none.processes) == [] and none.next_page_token == ""

    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await _list(admin.stub, page_size=4, page_token=token)
        pages += 1
        assert len(page.processes) <= 4
        seen += [p.process_id for p in page.processes]
        if pages == 1:
            # Rows registered meanwhile never shift a page: one before the keyset, one after it.
            await seed.process("none", process_id="a0", service="ingress")
            await seed.process("none", process_id="z9", service="ingress")
        token = page.next_page_token
        if not token:
            break
    assert pages == 2
    assert seen == ["e1", "e2", "i1", "i2", "l1", "m1", "z9"]

    first = await _list(admin.stub, page_size=1, service="executor")
    assert [p.process_id for p in first.processes] == ["e1"] and first.next_page_token
    second = await _list(admin.stub, page_size=1, service="executor", page_token=first.next_page_token)
    assert [p.process_id for p in second.processes] == ["e2"] and second.next_page_token == ""
    await expect_error(
        _list(admin.stub, page_size=1, service="ingress", page_token=first.next_page_token),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PAGE_TOKEN_FILTER_MISMATCH",
    )
    await expect_error(
        _list(admin.stub, page_token="not-a-token"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN"
    )
    # Signed with the server's key and well-formed, but not a process id.
    wrong_key = admin.servicer.pages.encode("ListProcesses", [42], {"service": None})
    await expect_error(
        _list(admin.stub, page_token=wrong_key), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN"
    )
    await expect_error(_list(admin.stub, page_size=-1), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    await expect_error(_list(admin.stub, REPLAY), grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")


async def test_stale_threshold_follows_the_heartbeat_interval(db_url: str, seed: Seed) -> None:
    await seed.process("none", process_id="m1", service="materializer", age_s=5)
    running = await start_admin(db_url, process_heartbeat_s=1.0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}")
    try:
        response = await _list(admin_service_pb2_grpc.AdminServiceStub(channel))
    finally:
        await channel.close()
        await running.stop()
    assert response.stale_after.ToTimedelta() == timedelta(seconds=3)
    assert [(p.process_id, p.stale) for p in response.processes] == [("m1", True)]


# --- the real services -----------------------------------------------------------------------------


async def test_running_services_register_and_only_executors_count_as_claimers(
    db_url: str, seed: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the build's source revision (set by the image build), as connector_build_info exports it
    monkeypatch.setenv("CONNECTOR_BUILD_REVISION", "0123456789abcdef0123456789abcdef01234567")
    pack = await seed.pack()
    executor = ExecutorService(
        DatabaseSettings(),
        ExecutorSettings(
            workers=1, poll_interval_s=0.5, grpc_port=0, metrics_port=0, stats_interval_s=0,
            shutdown_grace_s=1.0,
        ),
        url=db_url,
        admin_settings=AdminSettings(tokens=SecretStr(TOKENS)),
        serve_metrics=False,
    )  # fmt: skip
    ingress = IngressService(
        DatabaseSettings(),
        IngressSettings(http_port=0, grpc_port=0, metrics_port=0, pool_min_size=1, pool_max_size=4),
        url=db_url,
        serve_metrics=False,
    )
    materializer = MaterializerService(
        DatabaseSettings(),
        MaterializerSettings(grpc_port=0, metrics_port=0, pool_min_size=1, pool_max_size=4),
        url=db_url,
    )
    started: list[Any] = []
    channel: grpc.aio.Channel | None = None
    try:
        for svc in (executor, ingress, materializer):
            await svc.start()
            started.append(svc)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{executor.grpc_port}")
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)

        response = await _list(stub)
        got = {p.process_id: (p.service, p.claim_capability) for p in response.processes}
        assert got == {
            executor.process_id: ("executor", "work_item"),
            ingress.process_id: ("ingress", "none"),
            materializer.process_id: ("materializer", "none"),
        }
        for p in response.processes:
            assert p.pid == os.getpid() and p.version == runtime_version() and not p.stale
            assert p.revision == "0123456789abcdef0123456789abcdef01234567"
            assert p.heartbeat_age.ToTimedelta() < timedelta(seconds=15)
        only = await _list(stub, service="materializer")
        assert [p.process_id for p in only.processes] == [materializer.process_id]

        # Capability `none` never counts as a claimer: not in the stats, not in the gates' proofs.
        stats = await stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW))
        assert stats.active_claimants == 1
        state = await stub.GetCutoverState(
            pb.GetCutoverStateRequest(installed_pack_id=pack), metadata=Admin.md(VIEW)
        )
        (g,) = state.generations
        assert (g.claim_capable_processes, g.work_item_claim_processes, g.legacy_event_claim_processes) == (
            1,
            1,
            0,
        )
        params = {"stale_s": 30.0, "scope": service_scope(pack, 1)}
        assert await seed.one(processes.PROCESS_COUNT_WORK_ITEM_FRESH, params) == 1
        assert await (await seed.conn.execute(processes.PROCESS_LIST_LEGACY_FRESH, params)).fetchall() == []

        # A clean stop deregisters: the row is gone, the others stay.
        await ingress.stop()
        started.remove(ingress)
        after = await _list(stub)
        assert {p.process_id for p in after.processes} == {executor.process_id, materializer.process_id}
        await materializer.stop()
        started.remove(materializer)
        after = await _list(stub)
        assert [p.process_id for p in after.processes] == [executor.process_id]
    finally:
        if channel is not None:
            await channel.close()
        for svc in reversed(started):
            await svc.stop()
    assert await seed.one("SELECT count(*) FROM connector_process") == 0
