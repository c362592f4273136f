"""Cutover test rig: a real pack installed through the pack store, receipts materialized by the real
materializer router, WorkItems run by a real (in-process) executor, legacy Events run by the real
legacy executor (in-process, or as ``connector executor --claim-path event`` child processes), and
waits on database conditions (never fixed sleeps as synchronisation)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from connector.common.core.settings import DatabaseSettings, ExecutorSettings  # noqa: E402
from connector.common.packs import install  # noqa: E402
from connector.common.packs.document import parse_manifest  # noqa: E402
from connector.common.packs.routes import RouteCache  # noqa: E402
from connector.executor.legacy import LegacyService  # noqa: E402
from connector.executor.service import ExecutorService  # noqa: E402
from connector.materializer.router import Router, RouterConfig  # noqa: E402
from tests.cutover import handlers  # noqa: E402

ROOT = Path(_ROOT)
CONNECTOR = ROOT / ".venv" / "bin" / "connector"
HANDLER = "tests.cutover.handlers:handle"


def manifest(
    work_types: Sequence[str] = ("sync",), *, max_attempts: int = 5, lanes: dict[str, Any] | None = None
) -> dict[str, Any]:
    extract: dict[str, Any] = {
        "source_object_kind": {"const": "order"},
        "source_object_id": {"pointer": "/data/id"},
    }
    if lanes and lanes.get("target_serialization"):
        extract["target_lane_key"] = {"pointer": "/data/target"}
    return {
        "name": "shop",
        "namespace": "shop",
        "work_types": {
            wt: {
                "handler": {"kind": "python", "target": HANDLER, "timeout_s": 30},
                "retry": {"max_attempts": max_attempts, "backoff_base_s": 0.05, "backoff_cap_s": 0.2},
                **({"lanes": lanes} if lanes else {}),
            }
            for wt in work_types
        },
        "routes": [
            {
                "key": "orders",
                "verification": {"scheme": "none"},
                "extract": extract,
                "required": ["source_object_id"],
                "fan_out": [{"work_type": wt} for wt in work_types],
            }
        ],
    }


async def wait_until(check: Callable[[], Awaitable[Any]], *, timeout: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(0.02)


class Rig:
    """One database, one pack ``shop`` (generation 1, installed WorkItem-owned)."""

    def __init__(self, url: str, conn: psycopg.AsyncConnection[Any]) -> None:
        self.url = url
        self.conn = conn
        self.pack = 0
        self.generation = 1
        self._seq = 0
        self._services: list[Any] = []
        self._procs: list[LegacyProcess] = []

    # ------------------------------------------------------------------ setup and reads

    async def install(
        self,
        work_types: Sequence[str] = ("sync",),
        *,
        max_attempts: int = 5,
        lanes: dict[str, Any] | None = None,
    ) -> int:
        applied = await install.pack_apply(
            self.conn,
            parse_manifest(manifest(work_types, max_attempts=max_attempts, lanes=lanes)),
            activate=True,
            actor="test",
        )
        self.pack = applied.installed_pack_id
        self.generation = applied.generation
        return self.pack

    async def scalar(self, sql: str, params: Any = None) -> Any:
        row = await (await self.conn.execute(sql, params)).fetchone()
        return None if row is None else row[0]

    async def rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return list(await (await self.conn.execute(sql, params)).fetchall())

    async def authority(self) -> tuple[str, str]:
        row = await (
            await self.conn.execute(
                "SELECT claim_path, phase FROM connector_claim_authority"
                " WHERE installed_pack_id = %s AND generation = %s",
                (self.pack, self.generation),
            )
        ).fetchone()
        assert row is not None
        return str(row[0]), str(row[1])

    async def work_items(self, event_ids: Sequence[int]) -> dict[int, tuple[str, int | None, str | None]]:
        """event id → (state, legacy receipt version, legacy digest) of its ``sync`` WorkItem."""
        rows = await self.rows(
            "SELECT event_id, state, legacy_outcome_receipt_version, legacy_outcome_digest"
            " FROM connector_work_item WHERE event_id = ANY(%s) AND work_type = 'sync'",
            (list(event_ids),),
        )
        return {int(r[0]): (str(r[1]), r[2], r[3]) for r in rows}

    async def events(self, event_ids: Sequence[int]) -> dict[int, tuple[str, str | None]]:
        rows = await self.rows(
            "SELECT event_id, execution_owner, legacy_state FROM connector_event WHERE event_id = ANY(%s)",
            (list(event_ids),),
        )
        return {int(r[0]): (str(r[1]), r[2]) for r in rows}

    async def effects(self) -> dict[tuple[int, str], list[tuple[bool, bool]]]:
        out: dict[tuple[int, str], list[tuple[bool, bool]]] = {}
        for event_id, wt, wi, legacy in await self.rows(
            "SELECT event_id, work_type, wi_held, legacy_held FROM cutover_test_effect ORDER BY seq"
        ):
            out.setdefault((int(event_id), str(wt)), []).append((bool(wi), bool(legacy)))
        return out

    # ------------------------------------------------------------------ deliveries

    async def deliver(
        self, *modes: str, object_ids: Sequence[str] | None = None, targets: Sequence[str] | None = None
    ) -> list[int]:
        """Receipts (as the ingress writes them) materialized by the real router; the event ids."""
        bodies = []
        for i, mode in enumerate(modes):
            self._seq += 1
            data: dict[str, Any] = {
                "id": object_ids[i] if object_ids is not None else f"o{self._seq}",
                "mode": mode,
            }
            if targets is not None:
                data["target"] = targets[i]
            # The route has no delivery id: the receipt's key is its body's digest (as the ingress
            # computes it), so every delivery's body is distinct (``delivery``).
            body = {"type": "order.updated", "delivery": self._seq, "data": data}
            bodies.append(json.dumps(body).encode())
        cur = await self.conn.execute(
            """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
                 content_type, received_at, payload_sha256, body, verification)
               SELECT 'shop', 'orders', 'orders:sha256:' || encode(sha256(b), 'hex'), 'POST',
                      'application/json', now(), sha256(b), b, 'none'
               FROM unnest(%(bodies)s::bytea[]) WITH ORDINALITY AS t(b, ord)
               ORDER BY ord RETURNING receipt_id""",
            {"bodies": bodies},
        )
        receipt_ids = sorted(int(r[0]) for r in await cur.fetchall())
        pool = AsyncConnectionPool(self.url, min_size=1, max_size=3, open=False, kwargs={"autocommit": True})
        await pool.open(wait=True)
        try:
            cache = RouteCache()
            async with pool.connection() as conn:
                await cache.refresh(conn)
            router = Router(pool, cache, RouterConfig(owner="test-router", concurrency=1, horizon_wait_s=0.0))
            await router.drain()
        finally:
            await pool.close()
        rows = await self.rows(
            "SELECT event_id FROM connector_event WHERE receipt_id = ANY(%s) ORDER BY receipt_id",
            (receipt_ids,),
        )
        assert len(rows) == len(modes), "every delivery materializes into one event"
        return [int(r[0]) for r in rows]

    # ------------------------------------------------------------------ executors

    async def work_item_executor(self, **overrides: Any) -> ExecutorService:
        values: dict[str, Any] = {
            "workers": 4,
            "claim_batch": 16,
            "lease_s": 5.0,
            "poll_interval_s": 0.1,
            "reclaim_interval_s": 0.3,
            "shutdown_grace_s": 2.0,
            "grpc_port": 0,
            "metrics_port": 0,
            "stats_interval_s": 0,
            **overrides,
        }
        svc = ExecutorService(
            DatabaseSettings(),
            ExecutorSettings(**values),
            url=self.url,
            mount_admin=False,
            serve_metrics=False,
            heartbeat_s=0.5,
        )
        await svc.start()
        self._services.append(svc)
        return svc

    async def legacy_executor(self, **overrides: Any) -> LegacyService:
        values: dict[str, Any] = {
            "workers": 4,
            "claim_batch": 16,
            "lease_s": 3.0,
            "poll_interval_s": 0.1,
            "reclaim_interval_s": 1.0,
            "shutdown_grace_s": 2.0,
            "metrics_port": 0,
            **overrides,
        }
        svc = LegacyService(
            DatabaseSettings(),
            ExecutorSettings(**values),
            pack="shop",
            generation=self.generation,
            url=self.url,
            heartbeat_s=0.5,
            serve_metrics=False,
        )
        await svc.start()
        self._services.append(svc)
        return svc

    async def stop(self, svc: Any) -> None:
        await svc.stop()
        if svc in self._services:
            self._services.remove(svc)

    def legacy_process(self, **env: str) -> LegacyProcess:
        proc = LegacyProcess(self.url, env)
        self._procs.append(proc)
        return proc

    async def close(self) -> None:
        for svc in reversed(self._services):
            with contextlib.suppress(Exception):
                await svc.stop()
        for proc in self._procs:
            proc.stop()


class LegacyProcess:
    """``connector executor --claim-path event --pack shop`` as a child process."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        full = {
            **os.environ,
            "CONNECTOR_DATABASE_URL": url,
            "CONNECTOR_EXECUTOR_WORKERS": "2",
            "CONNECTOR_EXECUTOR_LEASE_S": "2",
            "CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.1",
            "CONNECTOR_EXECUTOR_RECLAIM_INTERVAL_S": "1",
            "CONNECTOR_EXECUTOR_SHUTDOWN_GRACE_S": "2",
            "CONNECTOR_EXECUTOR_METRICS_PORT": "0",
            "CONNECTOR_LOG_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join(
                [_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            ),
            **env,
        }
        self.stderr_path = Path(f"/tmp/cutover-legacy-{os.getpid()}-{time.monotonic_ns()}.log")
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [str(CONNECTOR), "executor", "--claim-path", "event", "--pack", "shop"],
            env=full,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            cwd=_ROOT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        self._stderr.flush()
        try:
            return self.stderr_path.read_text()[-3000:]
        except OSError:
            return ""

    async def wait_exit(self, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"legacy process did not exit: {self.log()}")
            await asyncio.sleep(0.05)
        return int(self.proc.returncode)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()
        with contextlib.suppress(OSError):
            self.stderr_path.unlink()


@pytest_asyncio.fixture
async def rig(db_url: str, adb: psycopg.AsyncConnection[Any]) -> AsyncIterator[Rig]:
    await adb.execute(handlers.EFFECT_TABLE)
    os.environ["CONNECTOR_DATABASE_URL"] = db_url  # the in-process handlers record effects here
    r = Rig(db_url, adb)
    try:
        yield r
    finally:
        await r.close()
        os.environ.pop("CONNECTOR_DATABASE_URL", None)


# --------------------------------------------------------------------------------------------------
# Admin API (the real AdminService on a free port) for CLI tests
# --------------------------------------------------------------------------------------------------

OPERATOR_TOKEN = "cutover-operator-token-0123456789"
VIEW_TOKEN = "cutover-view-token-0123456789abc"


@pytest_asyncio.fixture
async def admin_port(db_url: str) -> AsyncIterator[int]:
    from pydantic import SecretStr

    from connector.common.core import db
    from connector.common.core.grpc_server import GrpcServer
    from connector.common.core.settings import AdminSettings, PoolSettings
    from connector.executor.admin import PROTECTED_PREFIXES, build_admin, register

    name = f"cutover-admin-{time.monotonic_ns()}"
    pool = await db.open_pool(
        name,
        DatabaseSettings(),
        PoolSettings(pool_min_size=1, pool_max_size=4, pool_timeout_s=5.0),
        url=db_url,
    )
    tokens = f"{OPERATOR_TOKEN}=ConnectorOperator;{VIEW_TOKEN}=ViewConnectorEvents"
    api = build_admin(pool, AdminSettings(tokens=SecretStr(tokens)), process_stale_s=5.0)
    server = GrpcServer(port=0, authenticate=api.authenticate, protected_prefixes=PROTECTED_PREFIXES)
    register(server, api.servicer)
    await server.start()
    try:
        yield server.port
    finally:
        await server.stop(0)
        await db.close_pool(name)
