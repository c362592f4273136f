"""The legacy path's service: pool, admission check (fail closed before registering), process
registration (capability ``legacy_event``, scoped to the generation by ``service_scope``), the
legacy executor and its metrics endpoint. ``exited`` is set once the generation stopped admitting the
legacy path and nothing is held (the process then exits 0).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import start_http_server
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from connector.common.core import db as dbmod
from connector.common.core.metrics import stop_server as stop_metrics_server
from connector.common.core.process_registry import ProcessRegistration
from connector.common.core.runtime import cancel_task
from connector.common.core.settings import DatabaseSettings, ExecutorSettings, PoolSettings
from connector.common.store import authority
from connector.executor.legacy.executor import LegacyConfig, LegacyExecutor, LegacyNotAdmitted
from connector.executor.metrics import REGISTRY

log = logging.getLogger(__name__)

Conn = AsyncConnection[Any]

SERVICE = "executor-legacy"


def service_scope(installed_pack_id: int, generation: int) -> str:
    """The ``connector_process.service`` of a legacy process: names the generation it may claim."""
    return f"{SERVICE}:{installed_pack_id}:{generation}"


async def pack_generation_resolve(conn: Conn, pack: str, generation: int | None) -> tuple[int, int]:
    row = await authority.pack_resolve(conn, pack)
    if row is None:
        raise LegacyNotAdmitted(f"no pack {pack!r}")
    if generation is None:
        if row[1] is None:
            raise LegacyNotAdmitted(f"pack {pack!r} has no active generation; pass --generation")
        generation = row[1]
    return row[0], generation


class LegacyService:
    """Pool, admission check, process registration (capability ``legacy_event``, scoped to the
    generation), the legacy executor, metrics. ``exited`` is set when the generation stopped admitting
    the legacy path and everything held was finished or released (the process then exits 0)."""

    name = SERVICE

    def __init__(
        self,
        db: DatabaseSettings,
        cfg: ExecutorSettings,
        *,
        pack: str,
        generation: int | None,
        url: str | None = None,
        heartbeat_s: float = 5.0,
        serve_metrics: bool = True,
    ) -> None:
        self.db = db
        self.cfg = cfg
        self.pack_spec = pack
        self.generation_spec = generation
        self._url = url
        self._heartbeat_s = heartbeat_s
        self._serve_metrics = serve_metrics
        self.pool: AsyncConnectionPool | None = None
        self.registration: ProcessRegistration | None = None
        self.executor: LegacyExecutor | None = None
        self.exited = asyncio.Event()
        self._metrics_server: Any = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        url = self._url or self.db.url()
        self.pool = await dbmod.open_pool(
            SERVICE,
            self.db,
            PoolSettings(pool_min_size=1, pool_max_size=max(4, self.cfg.workers + 3), pool_timeout_s=5.0),
            url=url,
        )
        try:
            async with self.pool.connection() as conn:
                pack_id, generation = await pack_generation_resolve(
                    conn, self.pack_spec, self.generation_spec
                )
            self.registration = ProcessRegistration(
                self.pool,
                service=service_scope(pack_id, generation),
                capability="legacy_event",
                interval_s=self._heartbeat_s,
            )
            self.executor = LegacyExecutor(
                self.pool,
                installed_pack_id=pack_id,
                generation=generation,
                owner=self.registration.process_id,
                cfg=LegacyConfig(
                    workers=self.cfg.workers,
                    claim_batch=self.cfg.claim_batch,
                    lease_s=self.cfg.lease_s,
                    poll_interval_s=self.cfg.poll_interval_s,
                    reconcile_interval_s=max(1.0, self.cfg.reclaim_interval_s),
                    shutdown_grace_s=self.cfg.shutdown_grace_s,
                ),
            )
            # Fail closed before registering: a refused process never looks like a claimer.
            async with self.pool.connection() as conn:
                ok, why = await self.executor.admission(conn)
            if not ok:
                raise LegacyNotAdmitted(why)
            await self.registration.start()
            await self.executor.start()
            if self._serve_metrics and self.cfg.metrics_port:
                server, _thread = start_http_server(
                    self.cfg.metrics_port, addr=self.cfg.metrics_host, registry=REGISTRY
                )
                self._metrics_server = server
            self._watch = asyncio.create_task(self._watch_drained(), name="legacy-drained")
        except BaseException:
            await self.stop()
            raise
        log.info(
            "legacy Event path started",
            extra={
                "installed_pack_id": pack_id,
                "generation": generation,
                "process_id": self.registration.process_id,
            },
        )

    async def _watch_drained(self) -> None:
        assert self.executor is not None
        await self.executor.drained.wait()
        log.warning(
            "generation no longer admits the legacy Event path and nothing is held: exiting",
            extra={"installed_pack_id": self.executor.pack, "generation": self.executor.generation},
        )
        self.exited.set()

    async def stop(self) -> None:
        task, self._watch = self._watch, None
        await cancel_task(task)
        if self.executor is not None:
            await self.executor.stop()
            self.executor = None
        if self.registration is not None:
            await self.registration.stop()
            self.registration = None
        pool, self.pool = self.pool, None
        await dbmod.close_own_pool(SERVICE, pool)
        if self._metrics_server is not None:
            server, self._metrics_server = self._metrics_server, None
            await stop_metrics_server(server)
