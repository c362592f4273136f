"""The materializer's wake-ups through ``connector.common.core.listener``: a receipt notification wakes
the workers, and a listening session that is killed reconnects and reloads the route cache (a
notification may have been missed while away)."""

from __future__ import annotations

from typing import Any

import psycopg

from connector.common.core.settings import DatabaseSettings, MaterializerSettings
from connector.materializer import metrics
from connector.materializer.service import MaterializerService

from .conftest import apply, body, insert_receipts, manifest, scalar, wait_until


def _reloads(trigger: str) -> float:
    return metrics.ROUTE_RELOADS.labels(trigger)._value.get()


async def test_killed_listen_session_reconnects_reloads_and_keeps_waking(db_url: str, adb: Any) -> None:
    await apply(adb, manifest())
    cfg = MaterializerSettings(
        grpc_port=0, metrics_port=0, pool_min_size=1, pool_max_size=4, poll_interval_s=60.0
    )
    service = MaterializerService(DatabaseSettings(), cfg, url=db_url)
    await service.start()
    try:
        listener = service.listener
        assert listener is not None and listener.connects == 1
        reloads = _reloads("reconnect")
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (listener.backend_pid,))

        async def reconnected() -> bool:
            return listener.connects >= 2 and listener.connected.is_set() and _reloads("reconnect") > reloads

        await wait_until(reconnected, what="a reconnect and a route reload")
        # Polling is a minute away: only a notification (as the ingress' insert sends) wakes the workers.
        await insert_receipts(adb, [body(1)])
        await adb.execute("SELECT pg_notify('connector_receipts', '')")

        async def routed() -> bool:
            return bool(await scalar(adb, "SELECT count(*) = 1 FROM connector_event"))

        await wait_until(routed, what="the receipt routed")
    finally:
        await service.stop()
