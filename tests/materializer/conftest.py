"""Materializer test helpers: manifests, receipts inserted with SQL (as the ingress would), an
in-process router over its own pool, and waits on database conditions (never fixed sleeps)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

# ``tests.plans`` (the plan-test helpers) when these tests run on their own.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from connector.common.packs import install  # noqa: E402
from connector.common.packs.document import parse_manifest  # noqa: E402
from connector.common.packs.routes import RouteCache  # noqa: E402
from connector.materializer.router import Router, RouterConfig  # noqa: E402

NAMESPACE = "shop"


def work_type(**overrides: Any) -> dict[str, Any]:
    return {"handler": {"kind": "python", "target": "tests.noop:handle"}, **overrides}


def manifest(
    *,
    name: str = "shop",
    namespace: str = NAMESPACE,
    work_types: Mapping[str, Any] | None = None,
    routes: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A valid manifest: route ``orders`` extracting kind/id from the body, fanning out to ``sync``."""
    return {
        "name": name,
        "namespace": namespace,
        "work_types": dict(work_types or {"sync": work_type()}),
        "routes": list(
            routes
            or [
                {
                    "key": "orders",
                    "verification": {"scheme": "none"},
                    "extract": {
                        "event_kind": {"pointer": "/type"},
                        "source_object_kind": {"const": "order"},
                        "source_object_id": {"pointer": "/data/id"},
                    },
                    "required": ["source_object_id"],
                    "fan_out": [{"work_type": "sync"}],
                }
            ]
        ),
    }


async def apply(
    conn: psycopg.AsyncConnection[Any], doc: Mapping[str, Any], *, activate: bool = True
) -> install.AppliedPack:
    return await install.pack_apply(conn, parse_manifest(doc), activate=activate, actor="test")


def body(object_id: Any, *, kind: str = "order.updated", **extra: Any) -> bytes:
    return json.dumps({"type": kind, "data": {"id": object_id, **extra}}).encode()


async def insert_receipts(
    conn: psycopg.AsyncConnection[Any],
    bodies: Sequence[bytes | None],
    *,
    namespace: str = NAMESPACE,
    route_key: str = "orders",
    key_prefix: str = "d",
    body_ref: str | None = None,
    event_kind: str | None = None,
    provider_delivery_id: str | None = None,
    correlation_ids: Mapping[str, str] | None = None,
) -> list[int]:
    """Insert receipts the way the ingress does (one multi-row statement); ids in order."""
    cur = await conn.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, provider_delivery_id,
             idempotency_key, method, content_type, event_kind, received_at, correlation_ids,
             payload_sha256, body, body_ref, verification)
           SELECT %(ns)s, %(route)s, %(pdid)s, k, 'POST', 'application/json', %(kind)s, now(),
                  %(corr)s::jsonb, sha256(coalesce(b, ''::bytea)), b, %(ref)s, 'none'
           FROM unnest(%(keys)s::text[], %(bodies)s::bytea[]) WITH ORDINALITY AS t(k, b, ord)
           ORDER BY ord
           RETURNING receipt_id""",
        {
            "ns": namespace,
            "route": route_key,
            "pdid": provider_delivery_id,
            "kind": event_kind,
            "corr": json.dumps(dict(correlation_ids or {})),
            "ref": body_ref,
            "keys": [f"{key_prefix}-{time.monotonic_ns()}-{i}" for i in range(len(bodies))],
            "bodies": list(bodies),
        },
    )
    return sorted(int(r[0]) for r in await cur.fetchall())


async def bulk_receipts(
    conn: psycopg.AsyncConnection[Any], n: int, *, ids: int = 100, namespace: str = NAMESPACE
) -> None:
    """``n`` receipts whose source object ids cycle over ``ids`` values (a backlog, one statement)."""
    await conn.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
             received_at, payload_sha256, body, verification)
           SELECT %(ns)s, 'orders', 'bulk-' || i, 'POST', now(), '\\x00',
                  convert_to(json_build_object('type', 'order.updated',
                             'data', json_build_object('id', (i %% %(ids)s)::text))::text, 'UTF8'), 'none'
           FROM generate_series(1, %(n)s) i""",
        {"ns": namespace, "n": n, "ids": ids},
    )


async def scalar(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> Any:
    row = await (await conn.execute(sql, params)).fetchone()
    return None if row is None else row[0]


async def rows(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    return list(await (await conn.execute(sql, params)).fetchall())


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 20.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class RouterFactory:
    """Routers over their own pools (each one behaves like a separate materializer process)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._pools: list[AsyncConnectionPool] = []
        self._routers: list[Router] = []

    async def __call__(self, **cfg: Any) -> Router:
        pool = AsyncConnectionPool(self.url, min_size=1, max_size=6, open=False, kwargs={"autocommit": True})
        await pool.open(wait=True)
        self._pools.append(pool)
        cache = RouteCache()
        async with pool.connection() as conn:
            await cache.refresh(conn)
        config = {"owner": f"test-{len(self._routers)}", "concurrency": 1, "horizon_wait_s": 30.0, **cfg}
        router = Router(pool, cache, RouterConfig(**config))
        self._routers.append(router)
        return router

    async def close(self) -> None:
        for router in self._routers:
            await router.stop()
        for pool in self._pools:
            await pool.close()


@pytest_asyncio.fixture
async def make_router(db_url: str) -> AsyncIterator[RouterFactory]:
    factory = RouterFactory(db_url)
    try:
        yield factory
    finally:
        await factory.close()
