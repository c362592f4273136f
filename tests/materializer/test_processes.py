"""Real ``connector materializer`` processes: kill -9 mid-run and restart, and two processes on one
backlog. Every acknowledged receipt is materialized exactly once: one event per receipt, one WorkItem
per (event, work type), none lost; lanes keep one runnable member each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import apply, bulk_receipts, manifest, scalar, wait_until, work_type

CONNECTOR = Path(sys.executable).with_name("connector")
RECEIPTS = 5000


class Proc:
    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log

    def started(self) -> dict[str, Any] | None:
        for line in self.log.read_text(errors="replace").splitlines():
            if '"materializer started"' in line:
                return json.loads(line)
        return None


@contextmanager
def materializer(db_url: str, tmp_path: Path, name: str) -> Iterator[Proc]:
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": db_url,
        "CONNECTOR_MATERIALIZER_GRPC_PORT": "0",
        "CONNECTOR_MATERIALIZER_METRICS_PORT": "0",
        "CONNECTOR_MATERIALIZER_LEASE_S": "2",
        "CONNECTOR_MATERIALIZER_BATCH_SIZE": "100",
        "CONNECTOR_MATERIALIZER_POLL_INTERVAL_S": "0.2",
    }
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen([str(CONNECTOR), "materializer"], stdout=out, stderr=out, env=env)
    proc = Proc(popen, log)
    try:
        yield proc
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(10)


def _stop(proc: Proc) -> int:
    proc.popen.send_signal(signal.SIGTERM)
    return proc.popen.wait(20)


async def _setup(adb) -> None:
    doc = manifest(work_types={"sync": work_type(lanes={"source_fifo": True}), "audit": work_type()})
    doc["routes"][0]["fan_out"] = [{"work_type": "sync"}, {"work_type": "audit"}]
    await apply(adb, doc)
    await bulk_receipts(adb, RECEIPTS, ids=200)


async def _count(adb, status: str) -> int:
    return int(
        await scalar(
            adb, "SELECT count(*) FROM connector_ingress_receipt WHERE router_status = %s", (status,)
        )
    )


async def _assert_exactly_once(adb) -> None:
    assert await _count(adb, "materialized") == RECEIPTS
    assert await scalar(adb, "SELECT count(*) FROM connector_event") == RECEIPTS
    assert await scalar(adb, "SELECT count(DISTINCT receipt_id) FROM connector_event") == RECEIPTS
    assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 2 * RECEIPTS
    assert (
        await scalar(adb, "SELECT count(DISTINCT (event_id, work_type)) FROM connector_work_item")
        == 2 * RECEIPTS
    )
    # Each receipt records exactly the event made from it.
    mismatched = await scalar(
        adb,
        """SELECT count(*) FROM connector_ingress_receipt r
           LEFT JOIN connector_event e USING (receipt_id)
           WHERE r.enqueued_event_ids IS DISTINCT FROM ARRAY[e.event_id]""",
    )
    assert mismatched == 0
    # Lanes: exactly one runnable member per lane, and it is the earliest delivery.
    bad_lanes = await scalar(
        adb,
        """SELECT count(*) FROM (
             SELECT source_lane_key,
                    count(*) FILTER (WHERE state = 'pending') AS ready,
                    min(delivery_seq) AS first_seq,
                    min(delivery_seq) FILTER (WHERE state = 'pending') AS ready_seq
             FROM connector_work_item WHERE source_lane_key IS NOT NULL GROUP BY 1) l
           WHERE ready <> 1 OR ready_seq <> first_seq""",
    )
    assert bad_lanes == 0


@pytest.mark.slow
async def test_kill_9_mid_batch_then_restart_materializes_every_receipt_exactly_once(
    adb, db_url: str, tmp_path: Path
) -> None:
    await _setup(adb)
    with materializer(db_url, tmp_path, "first") as first:

        async def some_done() -> bool:
            return await _count(adb, "materialized") >= 500

        await wait_until(some_done, timeout=30, what="the first process to materialize some receipts")
        first.popen.send_signal(signal.SIGKILL)
        first.popen.wait(10)
    done_at_kill = await _count(adb, "materialized")
    in_flight_at_kill = await _count(adb, "routing")
    assert done_at_kill < RECEIPTS, "killed too late to prove anything"
    assert in_flight_at_kill > 0, "a claimed batch was in flight when the process died"

    with materializer(db_url, tmp_path, "second") as second:

        async def all_done() -> bool:
            return await _count(adb, "materialized") == RECEIPTS

        await wait_until(all_done, timeout=60, what="the restarted process to finish the backlog")
        assert _stop(second) == 0
    await _assert_exactly_once(adb)
    # The batch that was in flight was claimed again (after its lease expired) and done once.
    assert (
        await scalar(adb, "SELECT count(*) FROM connector_ingress_receipt WHERE attempts >= 2")
        >= in_flight_at_kill
    )


@pytest.mark.slow
async def test_two_processes_on_one_backlog_materialize_each_receipt_once(
    adb, db_url: str, tmp_path: Path
) -> None:
    await _setup(adb)
    with materializer(db_url, tmp_path, "a") as a, materializer(db_url, tmp_path, "b") as b:

        async def all_done() -> bool:
            return await _count(adb, "materialized") == RECEIPTS

        await wait_until(all_done, timeout=60, what="two processes to finish the backlog")
        # The metrics endpoint of a live process reports its work and its own pool.
        started = a.started()
        assert started is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{started['metrics_port']}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for name in (
            'connector_materializer_receipts_total{outcome="materialized"}',
            "connector_materializer_routing_lag_seconds",
            "connector_materializer_batch_size_bucket",
            'connector_db_pool_size{service="materializer"}',
        ):
            assert name in text, name
        assert _stop(a) == 0 and _stop(b) == 0
    await _assert_exactly_once(adb)
    # A receipt claim's owner is the claiming process's registered id (one per process).
    owners = await scalar(adb, "SELECT count(DISTINCT claim_owner) FROM connector_ingress_receipt")
    assert owners == 2, "both processes materialized part of the backlog"


async def test_service_wakes_on_notify_and_reloads_routes(db_url: str, adb) -> None:
    """In-process service (as `connector up` runs it): a NOTIFY from the ingress wakes the loop long
    before its poll interval; an activation is seen without restart."""
    from connector.common.core.settings import DatabaseSettings, MaterializerSettings
    from connector.materializer.service import MaterializerService

    await apply(adb, manifest())
    cfg = MaterializerSettings(grpc_port=0, metrics_port=0, poll_interval_s=30, routes_refresh_s=60)
    service = MaterializerService(DatabaseSettings(), cfg, url=db_url)
    await service.start()
    try:
        assert service.grpc_port > 0 and service.metrics_port > 0
        started = time.monotonic()
        await adb.execute(
            """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
                 received_at, payload_sha256, body, verification)
               VALUES ('shop', 'orders', 'n1', 'POST', now(), '\\x00', '{"data": {"id": "1"}}', 'none');
               SELECT pg_notify('connector_receipts', '')"""
        )

        async def routed() -> bool:
            return await _count(adb, "materialized") == 1

        await wait_until(routed, timeout=10, what="the notified receipt to be materialized")
        assert time.monotonic() - started < 5, "woken by NOTIFY, not by the 30 s poll"

        doc = manifest(work_types={"sync": work_type(), "audit": work_type()})
        doc["routes"][0]["fan_out"] = [{"work_type": "sync"}, {"work_type": "audit"}]
        await apply(adb, doc)  # activates generation 2 and notifies connector_packs

        async def reloaded() -> bool:
            pack = service.cache.pack("shop")
            return pack is not None and pack.generation == 2

        await wait_until(reloaded, timeout=10, what="the route cache to reload on activation")
        await adb.execute(
            """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
                 received_at, payload_sha256, body, verification)
               VALUES ('shop', 'orders', 'n2', 'POST', now(), '\\x00', '{"data": {"id": "2"}}', 'none');
               SELECT pg_notify('connector_receipts', '')"""
        )

        async def two() -> bool:
            return await _count(adb, "materialized") == 2

        await wait_until(two, timeout=10, what="the second receipt")
        assert await scalar(adb, "SELECT generation FROM connector_event WHERE idempotency_key = 'n2#0'") == 2
        assert await scalar(adb, "SELECT count(*) FROM connector_work_item") == 3
    finally:
        await service.stop()


async def test_generation_switch_mid_stream(db_url: str, adb) -> None:
    """Receipts keep arriving while generation 2 (two work types instead of one) is activated: every
    receipt is materialized once, and each event's WorkItems match the generation it recorded."""
    from connector.common.core.settings import DatabaseSettings, MaterializerSettings
    from connector.materializer.service import MaterializerService

    await apply(adb, manifest())
    cfg = MaterializerSettings(grpc_port=0, metrics_port=0, poll_interval_s=0.05, batch_size=50)
    service = MaterializerService(DatabaseSettings(), cfg, url=db_url)
    await service.start()
    try:
        for wave in range(20):
            await bulk_receipts_wave(adb, wave)
            if wave == 10:
                # Generation 1 must have routed something before the switch (on a busy machine the
                # materializer may not have started a batch yet); waves 0-10 may still be in flight.
                async def some_routed() -> bool:
                    return await _count(adb, "materialized") >= 100

                await wait_until(
                    some_routed, timeout=120, what="a first wave materialized under generation 1"
                )
                doc = manifest(work_types={"sync": work_type(), "audit": work_type()})
                doc["routes"][0]["fan_out"] = [{"work_type": "sync"}, {"work_type": "audit"}]
                await apply(adb, doc)

        async def all_done() -> bool:
            return await _count(adb, "materialized") == 20 * 100

        await wait_until(all_done, timeout=120, what="every wave materialized")
    finally:
        await service.stop()
    per_generation = dict(
        await (
            await adb.execute("SELECT generation, count(*) FROM connector_event GROUP BY 1 ORDER BY 1")
        ).fetchall()
    )
    assert set(per_generation) == {1, 2} and sum(per_generation.values()) == 2000
    mismatched = await scalar(
        adb,
        """SELECT count(*) FROM connector_event e
           WHERE (SELECT count(*) FROM connector_work_item w WHERE w.event_id = e.event_id)
                 <> CASE e.generation WHEN 1 THEN 1 ELSE 2 END
              OR e.route_version <> e.generation""",
    )
    assert mismatched == 0


async def bulk_receipts_wave(adb, wave: int) -> None:
    await adb.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
             received_at, payload_sha256, body, verification)
           SELECT 'shop', 'orders', 'w' || %(wave)s || '-' || i, 'POST', now(), '\\x00',
                  convert_to('{"data": {"id": "' || i || '"}}', 'UTF8'), 'none'
           FROM generate_series(1, 100) i""",
        {"wave": wave},
    )
    await adb.execute("SELECT pg_notify('connector_receipts', '')")
