"""The legacy path's service: pool, admission check (fail closed before registering), process
registration (capability ``legacy_event``, scoped to the generation by ``service_scope``), the
legacy executor and its metrics endpoint. ``exited`` is set once the generation stopped admitting the
legacy path and nothing is held (the process then exits 0).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from psycopg import AsyncConnection

from connector.common.core.runtime import cancel_task
from connector.common.core.service import ServiceBootstrap
from connector.common.core.settings import DatabaseSettings, ExecutorSettings, PoolSettings
from connector.common.store import authority
from connector.executor.legacy.executor import LegacyConfig, LegacyExecutor, LegacyNotAdmitted

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


class LegacyService(ServiceBootstrap):
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
        super().__init__(heartbeat_s=heartbeat_s)
        self.db = db
        self.cfg = cfg
        self.pack_spec = pack
        self.generation_spec = generation
        self._url = url
        self._serve_metrics_endpoint = serve_metrics
        self.executor: LegacyExecutor | None = None
        self.exited = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        url = self.db.conninfo(self._url)
        pool = await self._open_pool(
            self.db,
            PoolSettings(pool_min_size=1, pool_max_size=max(4, self.cfg.workers + 3), pool_timeout_s=5.0),
            url=url,
        )
        async with pool.connection() as conn:
            pack_id, generation = await pack_generation_resolve(conn, self.pack_spec, self.generation_spec)
        registration = self._registration(
            capability="legacy_event", service=service_scope(pack_id, generation)
        )
        self.executor = LegacyExecutor(
            pool,
            installed_pack_id=pack_id,
            generation=generation,
            owner=registration.process_id,
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
        async with pool.connection() as conn:
            ok, why = await self.executor.admission(conn)
        if not ok:
            raise LegacyNotAdmitted(why)
        await registration.start()
        await self.executor.start()
        if self._serve_metrics_endpoint and self.cfg.metrics_port:
            self._serve_metrics(self.cfg.metrics_port, self.cfg.metrics_host, registry="executor")
        self._watch = asyncio.create_task(self._watch_drained(), name="legacy-drained")

    def _on_started(self) -> None:
        assert self.executor is not None
        log.info(
            "legacy Event path started",
            extra={
                "installed_pack_id": self.executor.pack,
                "generation": self.executor.generation,
                "process_id": self.process_id,
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

    async def _drain(self) -> None:
        task, self._watch = self._watch, None
        await cancel_task(task)
        if self.executor is not None:
            await self.executor.stop()
            self.executor = None
