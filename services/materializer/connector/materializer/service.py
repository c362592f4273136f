"""The materializer service: wiring of the routing loop, the route cache, wake-ups, metrics, gRPC.

``MaterializerService`` runs in its own process (``connector materializer``) or inside ``connector
up``. Start order: own pool → process row (``connector_process``, service ``materializer``, claim
capability ``none``, heartbeat every ``heartbeat_s`` on this pool) → route cache loaded → LISTEN
connection → routing workers → lag sampler → upkeep → gRPC (health, reflection) → metrics endpoint;
a start that fails stops what it started. Stop order (SIGTERM): health NOT_SERVING and stop
accepting → routing workers finish (or release) the batch in hand → listener → upkeep → deregister →
pool closed.

Wake-ups: a ``connector.common.core.listener.Listener`` (its own connection, not from the pool) on
``connector_receipts`` (new receipts: idle workers claim at once) and ``connector_packs`` (an
activation: reload the route cache, then claim). Polling every ``poll_interval_s`` is the fallback,
and the route cache is also reloaded every ``routes_refresh_s`` and after every reconnect (a
notification may have been missed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import uuid
from typing import Any

import psycopg
from psycopg import Notify

from connector.common.core import db, logs, settings
from connector.common.core.grpc_server import GrpcServer
from connector.common.core.listener import Listener, ListenerConfig
from connector.common.core.runtime import run, run_until_signal
from connector.common.core.service import ServiceBootstrap
from connector.common.core.settings import DatabaseSettings, MaterializerSettings
from connector.common.maintenance.upkeep import Upkeep, UpkeepConfig
from connector.common.packs.routes import RouteCache
from connector.common.store import receipts
from connector.common.store.vocabulary import CHANNEL_PACKS, CHANNEL_RECEIPTS
from connector.materializer import metrics
from connector.materializer.router import Router, RouterConfig

log = logging.getLogger(__name__)

#: How often the routing lag gauge is sampled (one index probe).
LAG_SAMPLE_S = 2.0
#: Tables whose VACUUM/ANALYZE this service does when autovacuum does not (ADR 008).
UPKEEP_TABLES = ("connector_ingress_receipt", "connector_event")


class MaterializerService(ServiceBootstrap):
    name = "materializer"

    def __init__(
        self,
        db: DatabaseSettings,
        cfg: MaterializerSettings,
        url: str | None = None,
        *,
        heartbeat_s: float = 5.0,
    ) -> None:
        super().__init__(heartbeat_s=heartbeat_s)
        self.db = db
        self.cfg = cfg
        self._url = url
        self.cache = RouteCache()
        self.router: Router | None = None
        self.grpc_port = 0
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._grpc: GrpcServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.listener: Listener | None = None
        self._stopping = asyncio.Event()
        self.upkeep: Upkeep | None = None

    @property
    def url(self) -> str:
        return self.db.conninfo(self._url)

    def _on_started(self) -> None:
        log.info(
            "materializer started",
            extra={
                "owner": self.owner,
                "process_id": self.process_id,
                "grpc_port": self.grpc_port,
                "metrics_port": self.metrics_port,
                "packs": len(self.cache.packs),
            },
        )

    async def _start(self) -> None:
        self._stopping.clear()
        pool = await self._open_pool(self.db, self.cfg, url=self.url)
        # Receipt claims carry the registered process id (as executor leases do), so an operator can
        # match a routing claim to its ListProcesses row.
        self.owner = await self._register(capability="none")
        async with pool.connection() as conn:
            await self.cache.refresh(conn)
            await self._check_horizon_visibility(conn)
        self.router = Router(pool, self.cache, RouterConfig.from_settings(self.cfg, self.owner))
        # Listening before the workers' first claim: nothing committed after it goes unnoticed.
        self.listener = Listener(
            db.conninfo_with(
                self.url, application_name="connector-materializer-listen", statement_timeout_ms=0
            ),
            ListenerConfig(
                channels=(CHANNEL_RECEIPTS, CHANNEL_PACKS),
                poll_interval_s=self.cfg.routes_refresh_s,
                backoff_s=0.2,
                backoff_max_s=5.0,
                name="materializer-listen",
            ),
            on_wake=self._on_wake,
            on_connect=self._on_listen_connect,
            on_error=self._on_listen_error,
        )
        await self.listener.start(connect_now=True)
        self.router.start()
        self._tasks.append(asyncio.create_task(self._sample_lag(), name="materializer-lag"))
        self.upkeep = Upkeep(self.url, "materializer", UPKEEP_TABLES, UpkeepConfig.from_settings(self.cfg))
        self.upkeep.start()
        self._grpc = GrpcServer(host=self.cfg.grpc_host, port=self.cfg.grpc_port, service="materializer")
        await self._grpc.start()
        self.grpc_port = self._grpc.port
        self._serve_metrics(self.cfg.metrics_port, self.cfg.metrics_host)

    async def _check_horizon_visibility(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The commit horizon reads other sessions' ``backend_xid`` from pg_stat_activity, which
        PostgreSQL shows only to superusers, members of pg_read_all_stats and the same role."""
        cur = await conn.execute(
            "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')"
            " FROM pg_roles WHERE rolname = current_user"
        )
        row = await cur.fetchone()
        visible = bool(row and row[0])
        metrics.HORIZON_VISIBLE.set(1 if visible else 0)
        if not visible:
            log.warning(
                "commit horizon sees only this role's sessions: grant pg_read_all_stats to the "
                "materializer role, or run ingress and materializer as the same role"
            )

    async def _stop_serving(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
            self._grpc = None

    async def _drain(self) -> None:
        if self.router is not None:
            await self.router.stop()
        self._stopping.set()
        listener, self.listener = self.listener, None
        if listener is not None:
            await listener.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self.upkeep is not None:
            await self.upkeep.stop()
            self.upkeep = None

    def _on_stopped(self) -> None:
        log.info("materializer stopped")

    # ---------------------------------------------------------------------------------- wake-ups

    async def _on_wake(self, notes: list[Notify]) -> None:
        """Wake the workers on ``connector_receipts``; reload routes on ``connector_packs`` and
        every ``routes_refresh_s`` without a notification (the reload wakes the workers too)."""
        if any(n.channel == CHANNEL_PACKS for n in notes):
            await self._refresh("notify")
        elif notes:
            if self.router is not None:
                self.router.wake()
        else:
            await self._refresh("periodic")

    async def _on_listen_connect(self, conn: psycopg.AsyncConnection[Any], reconnect: bool) -> None:
        if reconnect:
            await self._refresh("reconnect")  # notifications may have been missed

    def _on_listen_error(self, exc: BaseException) -> None:
        if self._stopping.is_set():
            return
        metrics.LOOP_ERRORS.labels("listen").inc()
        log.warning("materializer listener reconnecting", extra={"error_class": type(exc).__name__})

    async def _refresh(self, trigger: str) -> None:
        if self.router is None:
            return
        try:
            await self.router.refresh_routes(trigger)
        except (psycopg.Error, OSError) as exc:
            metrics.LOOP_ERRORS.labels("route_reload").inc()
            log.warning("route reload failed", extra={"error_class": type(exc).__name__})
            return
        self.router.wake()

    async def _sample_lag(self) -> None:
        while not self._stopping.is_set():
            try:
                assert self.pool is not None  # the sampler ends before the pool closes
                async with self.pool.connection() as conn:
                    metrics.ROUTING_LAG.set(await receipts.routing.receipt_routing_lag(conn))
            except Exception as exc:
                log.debug("lag sample failed", extra={"error_class": type(exc).__name__})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), LAG_SAMPLE_S)


# -------------------------------------------------------------------------------------------------
# CLI: ``connector materializer``
# -------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="routing workers in this process (CONNECTOR_MATERIALIZER_CONCURRENCY)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="receipts claimed per batch (CONNECTOR_MATERIALIZER_BATCH_SIZE)",
    )


def cli(args: argparse.Namespace) -> int:
    logs.setup("materializer")
    db = settings.load(settings.DatabaseSettings)
    cfg = settings.load(settings.MaterializerSettings)
    overrides: dict[str, Any] = {}
    if getattr(args, "concurrency", None):
        overrides["concurrency"] = args.concurrency
    if getattr(args, "batch_size", None):
        overrides["batch_size"] = args.batch_size
    if overrides:
        cfg = cfg.model_copy(update=overrides)
    db.url()  # fail fast with a clear message when unset

    async def main() -> None:
        await run_until_signal([MaterializerService(db, cfg)])

    run(main, traced_as="materializer")
    return 0
