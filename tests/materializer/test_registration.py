"""The materializer registers in ``connector_process`` (service ``materializer``, claim capability
``none``) on its own pool while it runs, heartbeats on the database clock and deregisters on stop —
in-process, after a start that fails halfway, and as a real ``connector materializer`` process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connector.common.core.process_registry import runtime_version
from connector.common.core.settings import DatabaseSettings, MaterializerSettings
from connector.materializer.service import MaterializerService

from .conftest import apply, body, insert_receipts, manifest, rows, scalar, wait_until

CONNECTOR = Path(sys.executable).with_name("connector")


def _cfg(**overrides: Any) -> MaterializerSettings:
    base: dict[str, Any] = {"grpc_port": 0, "metrics_port": 0, "pool_min_size": 1, "pool_max_size": 4}
    return MaterializerSettings(**{**base, **overrides})


async def _row(adb: psycopg.AsyncConnection[Any], process_id: str) -> tuple[Any, ...] | None:
    found = await rows(
        adb,
        "SELECT service, claim_capability, pid, hostname, version, heartbeat_at FROM connector_process"
        " WHERE process_id = %s",
        (process_id,),
    )
    return found[0] if found else None


async def test_materializer_registers_heartbeats_and_deregisters_on_stop(db_url: str, adb) -> None:
    await apply(adb, manifest())
    service = MaterializerService(DatabaseSettings(), _cfg(), url=db_url, heartbeat_s=0.1)
    await service.start()
    try:
        process_id = service.process_id
        assert process_id is not None
        row = await _row(adb, process_id)
        assert row is not None
        service_name, capability, pid, hostname, version, first = row
        assert (service_name, capability) == ("materializer", "none")
        assert pid == os.getpid() and hostname == socket.gethostname() and version == runtime_version()

        async def beaten() -> bool:
            later = await _row(adb, process_id)
            return later is not None and later[5] > first

        await wait_until(beaten, timeout=10, what="a heartbeat")
        assert service.registration is not None and service.registration.heartbeat_failures == 0
        # Its receipt claims carry the registered process id (an operator can match them).
        (receipt,) = await insert_receipts(adb, [body("o-1")])

        async def routed() -> bool:
            status = await scalar(
                adb, "SELECT router_status FROM connector_ingress_receipt WHERE receipt_id = %s", (receipt,)
            )
            return bool(status == "materialized")

        await wait_until(routed, timeout=10, what="the receipt materialized")
        owner = await scalar(
            adb, "SELECT claim_owner FROM connector_ingress_receipt WHERE receipt_id = %s", (receipt,)
        )
        assert owner == process_id
        metrics_port = service.metrics_port
        assert metrics_port > 0
    finally:
        await service.stop()
    assert await _row(adb, process_id) is None
    assert service.process_id is None
    with socket.socket() as s:  # the metrics endpoint was shut down with the service
        s.bind(("127.0.0.1", metrics_port))


async def test_a_start_that_fails_stops_what_it_started_and_leaves_no_row(db_url: str, adb) -> None:
    await apply(adb, manifest())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = MaterializerService(DatabaseSettings(), _cfg(metrics_port=port), url=db_url)
        with pytest.raises(OSError):
            await service.start()  # registers, routes, listens, serves gRPC, then cannot bind metrics
    assert await scalar(adb, "SELECT count(*) FROM connector_process") == 0
    assert service.registration is None and service.pool is None and service.router is not None
    assert service.router._tasks == []  # the routing workers were stopped too


async def test_connector_materializer_process_registers_and_deregisters_on_sigterm(
    db_url: str, adb, tmp_path: Path
) -> None:
    await apply(adb, manifest())
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": db_url,
        "CONNECTOR_MATERIALIZER_GRPC_PORT": "0",
        "CONNECTOR_MATERIALIZER_METRICS_PORT": "0",
    }
    log = tmp_path / "materializer.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(CONNECTOR), "materializer"], stdout=out, stderr=out, env=env)
    try:

        async def registered() -> list[tuple[Any, ...]]:
            assert proc.poll() is None, log.read_text(errors="replace")
            return await rows(
                adb, "SELECT service, claim_capability FROM connector_process WHERE pid = %s", (proc.pid,)
            )

        assert await wait_until_value(registered) == [("materializer", "none")]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert await rows(adb, "SELECT process_id FROM connector_process WHERE pid = %s", (proc.pid,)) == []
    assert '"materializer stopped"' in log.read_text(errors="replace")


async def wait_until_value(check: Any) -> Any:
    found: list[Any] = []

    async def ready() -> bool:
        found[:] = [await check()]
        return bool(found[0])

    await wait_until(ready, timeout=30, what="the process row")
    return found[0]
