"""The ingress route table's watch through ``connector.common.core.listener``: loaded at start, reloaded
on a ``connector_packs`` notification, and reloaded after its listening session is killed."""

from __future__ import annotations

import asyncio

import psycopg

from connector.ingress.routes import RouteTable


async def test_route_table_reloads_on_notify_and_after_a_reconnect(db_url: str) -> None:
    table = RouteTable(db_url, refresh_s=60.0, reconnect_s=0.1)
    await table.start()
    try:
        assert table.loaded and table.version == 1
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_notify('connector_packs', '')")
            version = await asyncio.wait_for(table.wait_refreshed(1), 20)
            listener = table._listener
            assert listener.connects == 1
            await admin.execute("SELECT pg_terminate_backend(%s)", (listener.backend_pid,))
            await asyncio.wait_for(table.wait_refreshed(version), 20)
            assert listener.connects == 2 and listener.errors >= 1
    finally:
        await table.stop()
    assert table._listener.connection is None
