"""Admin API fixtures: a real GrpcServer with the AdminService on a free port over a fresh database,
tokens per role, and SQL seeding of packs, generations, routes, claim authority, receipts, events
and work items (the way the materializer and executor leave them)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import psycopg
import pytest_asyncio
from pydantic import SecretStr

from connector.common.core import db
from connector.common.core.grpc_server import GrpcServer, error_info
from connector.common.core.settings import AdminSettings, DatabaseSettings, PoolSettings
from connector.executor.admin import PROTECTED_PREFIXES, build_admin, register
from connector.v1 import admin_service_pb2_grpc

VIEW = "view-token-0123456789abcdef"
REPLAY = "replay-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"
VIEW_REPLAY = "view-replay-token-0123456789abcdef"
TOKENS = (
    f"{VIEW}=ViewConnectorEvents;{REPLAY}=ReplayConnectorEvents;{OPERATOR}=ConnectorOperator;"
    f"{VIEW_REPLAY}=ViewConnectorEvents,ReplayConnectorEvents"
)
ALL_TOKENS = (VIEW, REPLAY, OPERATOR, VIEW_REPLAY)


def manifest(
    name: str = "shop",
    namespace: str = "shop",
    routes: dict[str, list[str]] | None = None,
    *,
    queue_class: str = "default",
    max_attempts: int = 5,
    dead_head: str = "block",
    route_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``route_extra`` is merged into every route (a ``None`` value removes the key)."""
    routes = routes if routes is not None else {"orders": ["sync"]}
    work_types = sorted({wt for wts in routes.values() for wt in wts}) or ["sync"]
    return {
        "name": name,
        "namespace": namespace,
        "work_types": {
            wt: {
                "handler": {"kind": "python", "target": f"{__package__}.handlers:ok"},
                "queue_class": queue_class,
                "retry": {"max_attempts": max_attempts},
                "lanes": {"dead_head": dead_head},
            }
            for wt in work_types
        },
        "routes": [
            {
                k: v
                for k, v in {
                    "key": key,
                    "verification": {"scheme": "none"},
                    "idempotency_header": "X-Delivery-Id",
                    "fan_out": [{"work_type": wt} for wt in wts],
                    **(route_extra or {}),
                }.items()
                if v is not None
            }
            for key, wts in routes.items()
        ],
    }


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


class Seed:
    """SQL seeding on an autocommit async connection."""

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn
        self._seq = 0

    async def one(self, query: str, params: Any = None) -> Any:
        cur = await self.conn.execute(query, params)
        row = await cur.fetchone()
        return row[0] if row is not None and len(row) == 1 else row

    async def pack(
        self,
        name: str = "shop",
        namespace: str | None = None,
        *,
        routes: dict[str, list[str]] | None = None,
        claim_path: str = "work_item",
        incarnation: int = 1,
        **manifest_kw: Any,
    ) -> int:
        namespace = namespace or name
        pack_id = await self.one(
            "INSERT INTO connector_installed_pack (name, namespace, incarnation) VALUES (%s, %s, %s)"
            " RETURNING installed_pack_id",
            (name, namespace, incarnation),
        )
        await self.generation(pack_id, 1, routes=routes, claim_path=claim_path, name=name, **manifest_kw)
        return int(pack_id)

    async def generation(
        self,
        pack_id: int,
        generation: int,
        *,
        routes: dict[str, list[str]] | None = None,
        claim_path: str = "work_item",
        activate: bool = True,
        name: str | None = None,
        **manifest_kw: Any,
    ) -> None:
        row = await self.one(
            "SELECT name, namespace FROM connector_installed_pack WHERE installed_pack_id = %s", (pack_id,)
        )
        doc = manifest(name or row[0], row[1], routes, **manifest_kw)
        if activate:
            await self.conn.execute(
                "UPDATE connector_pack_generation SET status = 'retired' WHERE installed_pack_id = %s"
                " AND status = 'active'",
                (pack_id,),
            )
        await self.conn.execute(
            "INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,"
            " manifest_sha256, activated_at) VALUES (%s, %s, %s, %s, %s, now())",
            (pack_id, generation, "active" if activate else "staged", json.dumps(doc), _sha(doc)),
        )
        for route in doc["routes"]:
            await self.conn.execute(
                "INSERT INTO connector_route (installed_pack_id, generation, namespace, route_key,"
                " route_version, config, config_sha256) VALUES (%s, %s, %s, %s, 1, %s, %s)",
                (pack_id, generation, row[1], route["key"], json.dumps(route), _sha(route)),
            )
        await self.authority(pack_id, generation, claim_path)
        if activate:
            await self.conn.execute(
                "UPDATE connector_installed_pack SET active_generation = %s WHERE installed_pack_id = %s",
                (generation, pack_id),
            )

    async def authority(self, pack_id: int, generation: int, claim_path: str) -> None:
        receipt_id = None
        phase = {"work_item": "work_item_active", "legacy_event": "legacy_active", "none": "quiescing"}[
            claim_path
        ]
        if claim_path == "work_item":
            receipt_id = await self.one(
                "INSERT INTO connector_cutover_receipt (installed_pack_id, generation, kind, claim_path,"
                " proof, proof_sha256, actor) VALUES (%s, %s, 'install', 'work_item', '{}', %s, 'test')"
                " RETURNING cutover_receipt_id",
                (pack_id, generation, _sha({})),
            )
        await self.conn.execute(
            "INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase,"
            " cutover_receipt_id) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (installed_pack_id, generation) DO UPDATE SET claim_path = EXCLUDED.claim_path,"
            " phase = EXCLUDED.phase, cutover_receipt_id = EXCLUDED.cutover_receipt_id",
            (pack_id, generation, claim_path, phase, receipt_id),
        )

    async def receipt(
        self,
        namespace: str = "shop",
        route_key: str = "orders",
        *,
        status: str = "materialized",
        body: bytes | None = b'{"id": 1, "secret_field": "do-not-leak"}',
        body_ref: str | None = None,
        error_class: str | None = None,
        error_summary: str | None = None,
    ) -> int:
        self._seq += 1
        return int(
            await self.one(
                "INSERT INTO connector_ingress_receipt (namespace, route_key, provider_delivery_id,"
                " idempotency_key, method, content_type, event_kind, received_at, correlation_ids,"
                " payload_sha256, body, body_ref, verification, router_status, error_class, error_summary)"
                " VALUES (%s, %s, %s, %s, 'POST', 'application/json', 'order.updated', now(),"
                " '{\"trace\": \"t-1\"}', %s, %s, %s, 'hmac-sha256 env:SHOP_SECRET', %s, %s, %s)"
                " RETURNING receipt_id",
                (
                    namespace,
                    route_key,
                    f"d-{self._seq}",
                    f"{route_key}:id:d-{self._seq}",  # the ingress's key (admission.receipt_key)
                    hashlib.sha256(body or b"").digest(),
                    body,
                    body_ref,
                    status,
                    error_class,
                    error_summary,
                ),
            )
        )

    async def item(
        self,
        pack_id: int,
        *,
        generation: int = 1,
        route_key: str = "orders",
        work_type: str = "sync",
        state: str = "dead",
        source_lane: str | None = None,
        target_lane: str | None = None,
        failure_class: str | None = "handler_error",
        finished_ago_s: float | None = 10.0,
        incarnation: int = 1,
        dead_blocks: bool = True,
        body: bytes | None = b'{"id": 1, "secret_field": "do-not-leak"}',
        body_ref: str | None = None,
        queue_class: str = "default",
        execution_owner: str = "work_item",
        receipt_id: int | None = None,
        companion: dict[str, str] | None = None,
    ) -> int:
        namespace = await self.one(
            "SELECT namespace FROM connector_installed_pack WHERE installed_pack_id = %s", (pack_id,)
        )
        if receipt_id is None:
            receipt_id = await self.receipt(namespace, route_key, body=body, body_ref=body_ref)
        route_id = await self.one(
            "SELECT route_id FROM connector_route WHERE installed_pack_id = %s AND generation = %s"
            " AND route_key = %s",
            (pack_id, generation, route_key),
        )
        self._seq += 1
        event_id = await self.one(
            "INSERT INTO connector_event (receipt_id, event_index, installed_pack_id, generation,"
            " incarnation, route_id, route_version, namespace, event_kind, source_object_kind,"
            " source_object_id, idempotency_key, delivery_seq, payload_sha256, parse_outcome,"
            " execution_owner, companion)"
            " VALUES (%s, (SELECT count(*) FROM connector_event WHERE receipt_id = %s), %s, %s, %s, %s, 1,"
            " %s, 'order.updated', 'order', %s,"
            " (SELECT idempotency_key FROM connector_ingress_receipt WHERE receipt_id = %s)"
            " || '#' || (SELECT count(*) FROM connector_event WHERE receipt_id = %s),"
            " %s, '\\x00', 'ok', %s, %s) RETURNING event_id",
            (
                receipt_id,
                receipt_id,
                pack_id,
                generation,
                incarnation,
                route_id or 0,
                namespace,
                str(self._seq),
                receipt_id,
                receipt_id,
                receipt_id,
                execution_owner,
                json.dumps(companion or {}),
            ),
        )
        lease = state == "processing"
        return int(
            await self.one(
                "INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type,"
                " queue_class, state, delivery_seq, source_lane_key, target_mutation_lane_key,"
                " dead_blocks_lane, attempts, failure_class, failure_summary, outcome, finished_at,"
                " lease_owner, lease_until, lease_token, run_after)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 3, %s, %s, %s,"
                " CASE WHEN %s::float8 IS NULL THEN NULL ELSE now() - make_interval(secs => %s::float8) END,"
                " %s, CASE WHEN %s THEN now() + interval '30 seconds' END, %s, now() - interval '1 second')"
                " RETURNING work_id",
                (
                    event_id,
                    pack_id,
                    generation,
                    work_type,
                    queue_class,
                    state,
                    self._seq,
                    source_lane,
                    target_lane,
                    dead_blocks,
                    failure_class if state in ("dead", "retry") else None,
                    "handler raised ValueError" if state in ("dead", "retry") else None,
                    "failed" if state == "dead" else None,
                    finished_ago_s if state in ("dead", "succeeded") else None,
                    finished_ago_s,
                    "executor-1" if lease else None,
                    lease,
                    7 if lease else 2,
                ),
            )
        )

    async def state(self, work_id: int) -> str:
        return str(await self.one("SELECT state FROM connector_work_item WHERE work_id = %s", (work_id,)))

    async def row(self, work_id: int) -> dict[str, Any]:
        cur = self.conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute("SELECT * FROM connector_work_item WHERE work_id = %s", (work_id,))
        row = await cur.fetchone()
        assert row is not None
        return row

    async def process(
        self,
        capability: str,
        *,
        age_s: float = 0.0,
        process_id: str | None = None,
        service: str = "executor",
        pid: int = 1,
        admitted: list[int] | None = None,
    ) -> str:
        """A registered process; ``admitted``: the receipt ids its claim admission names (None: it
        declares none, as a build without claim admission)."""
        self._seq += 1
        process_id = process_id or f"p-{self._seq}"
        await self.conn.execute(
            "INSERT INTO connector_process (process_id, service, hostname, pid, version, claim_capability,"
            " heartbeat_at, admitted_receipt_ids)"
            " VALUES (%s, %s, 'h', %s, 'test', %s, now() - make_interval(secs => %s), %s)",
            (process_id, service, pid, capability, age_s, admitted),
        )
        return process_id


@dataclass
class Admin:
    port: int
    channel: grpc.aio.Channel
    stub: admin_service_pb2_grpc.AdminServiceStub
    servicer: Any
    pool: Any

    @staticmethod
    def md(token: str | None = OPERATOR) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {token}"),) if token is not None else ()


_servers = itertools.count()


@dataclass
class Running:
    server: GrpcServer
    pool: Any
    api: Any
    pool_name: str

    async def stop(self) -> None:
        await self.server.stop(0)
        await db.close_pool(self.pool_name)


async def start_admin(
    db_url: str,
    *,
    credentials: grpc.ServerCredentials | None = None,
    pool_settings: PoolSettings | None = None,
    db_settings: DatabaseSettings | None = None,
    **options: Any,
) -> Running:
    name = f"admin-test-{next(_servers)}"
    pool = await db.open_pool(
        name,
        db_settings or DatabaseSettings(),
        pool_settings or PoolSettings(pool_min_size=1, pool_max_size=4, pool_timeout_s=2.0),
        url=db_url,
    )
    api = build_admin(pool, AdminSettings(tokens=SecretStr(TOKENS)), **options)
    server = GrpcServer(
        port=0, authenticate=api.authenticate, protected_prefixes=PROTECTED_PREFIXES, credentials=credentials
    )
    register(server, api.servicer)
    await server.start()
    return Running(server, pool, api, name)


@pytest_asyncio.fixture
async def admin(db_url: str) -> AsyncIterator[Admin]:
    running = await start_admin(db_url)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}")
    try:
        yield Admin(
            running.server.port,
            channel,
            admin_service_pb2_grpc.AdminServiceStub(channel),
            running.api.servicer,
            running.pool,
        )
    finally:
        await channel.close()
        await running.stop()


@pytest_asyncio.fixture
async def seed(adb: psycopg.AsyncConnection) -> Seed:
    return Seed(adb)


def reason_of(exc: grpc.aio.AioRpcError) -> str | None:
    info = error_info(exc)
    return info.reason if info is not None else None


async def expect_error(call: Any, code: grpc.StatusCode, reason: str | None = None) -> grpc.aio.AioRpcError:
    """Await a unary call (or drain a stream) and assert it fails with ``code`` (and ``reason``)."""
    try:
        result = call
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == code, f"{exc.code()} {reason_of(exc)}: {exc.details()}"
        if reason is not None:
            assert reason_of(exc) == reason, f"{reason_of(exc)}: {exc.details()}"
        return exc
    raise AssertionError(f"expected {code}, the call succeeded")


def ids(items: Iterable[Any]) -> list[int]:
    return [int(i) for i in items]
