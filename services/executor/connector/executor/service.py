"""Executor service wiring: pool, process registration, the claim engine, gRPC (+ admin API), metrics.

Use in-process (``connector up``, tests)::

    svc = ExecutorService(DatabaseSettings(), ExecutorSettings(), url=None)
    await svc.start()      # svc.grpc_port, svc.metrics_port are the bound ports
    ...
    await svc.stop()       # drains: stop claiming, finish or release in-flight items, deregister

Start order: pool → process row (claim capability ``work_item``) → gRPC server (admin API mounted
unless ``mount_admin=False``; more servicers through ``add_servicer`` before ``start``) → engine.
Stop order (STYLE.md): gRPC health NOT_SERVING and stop accepting → engine drain (stop claiming,
prefetched items released at once, running handlers get ``shutdown_grace_s``, the rest released,
every finalize flushed) → deregister → stats → pools → metrics endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from connector.common.core import db, logs, runtime
from connector.common.core.grpc_server import Authenticator, GrpcServer
from connector.common.core.runtime import cancel_task
from connector.common.core.service import ServiceBootstrap
from connector.common.core.settings import (
    AdminSettings,
    DatabaseSettings,
    ExecutorSettings,
    PoolSettings,
    load,
)
from connector.common.maintenance.figures import FiguresConfig, FiguresJob
from connector.common.maintenance.retention import Retention, RetentionConfig
from connector.common.maintenance.upkeep import Upkeep, UpkeepConfig
from connector.executor.work import Engine, engine_config_from_settings, stats_sampler
from connector.executor.work.admission import Admission

#: Read once at start: a warning when autovacuum is off (the claim path depends on vacuumed tables).
AUTOVACUUM_SETTING = "SELECT current_setting('autovacuum')"
log = logging.getLogger(__name__)

SERVICE = "executor"
# Tables whose VACUUM/ANALYZE this service does when autovacuum does not (ADR 008).
UPKEEP_TABLES = ("connector_work_item", "connector_process", "connector_scheduler_lease")
CLAIM_PATHS = ("work_item", "event")


class ClaimPathNotSupported(SystemExit):
    pass


class ExecutorService(ServiceBootstrap):
    name = SERVICE

    def __init__(
        self,
        db: DatabaseSettings,
        cfg: ExecutorSettings,
        url: str | None = None,
        *,
        authenticate: Authenticator | None = None,
        protected_prefixes: tuple[str, ...] = (),
        credentials: Any = None,
        mount_admin: bool = True,
        admin_settings: AdminSettings | None = None,
        serve_metrics: bool = True,
        heartbeat_s: float = 5.0,
        fair: bool = True,
    ) -> None:
        if cfg.claim_path not in CLAIM_PATHS:
            raise ClaimPathNotSupported(f"unknown claim path {cfg.claim_path!r} (work_item or event)")
        if cfg.claim_path == "event":
            raise ClaimPathNotSupported(
                "ExecutorService claims WorkItems only; the legacy Event claim path is "
                "connector.executor.legacy.LegacyService (connector executor --claim-path event --pack P)"
            )
        super().__init__(heartbeat_s=heartbeat_s)
        self.db = db
        self.cfg = cfg
        self._url = url
        self._authenticate = authenticate
        self._protected = protected_prefixes
        self._credentials = credentials
        self._mount_admin = mount_admin
        self._admin_settings = admin_settings
        self._serve_metrics_endpoint = serve_metrics
        self._fair = fair
        self._servicers: list[tuple[Callable[[Any, Any], None], Any, str]] = []
        self.admin_pool: AsyncConnectionPool | None = None
        self.upkeep: Upkeep | None = None
        self.retention: Retention | None = None
        self.figures: FiguresJob | None = None
        self.engine: Engine | None = None
        self.admission: Admission | None = None
        self.grpc: GrpcServer | None = None
        self.grpc_port = 0
        self._stats_task: asyncio.Task[None] | None = None
        self._started = False

    def add_servicer(self, register: Callable[[Any, Any], None], servicer: Any, full_name: str) -> None:
        """Mount another gRPC servicer on this process's server (before ``start``)."""
        if self._started:
            raise RuntimeError("add_servicer must be called before start()")
        self._servicers.append((register, servicer, full_name))

    async def _start(self) -> None:
        cfg = self.cfg
        url = self.db.conninfo(self._url)
        pool = await self._open_pool(
            self.db,
            PoolSettings(
                pool_min_size=min(4, cfg.pool_max_size),
                pool_max_size=max(cfg.pool_max_size, 8),
                pool_timeout_s=cfg.pool_timeout_s,
            ),
            url=url,
        )
        owner = await self._register(capability="work_item")
        await self._check_database()
        await self._start_grpc(url)
        # Claim admission before the first claim: the row names the receipts this process may claim
        # under; a generation being rolled back is not among them (docs/cutover.md, gate 4).
        self.admission = Admission(
            pool, owner, interval_s=min(1.0, self._heartbeat_s), on_admit=self._admitted
        )
        await self.admission.start()
        self.engine = Engine(
            pool, engine_config_from_settings(cfg, fair=self._fair), owner=owner, claim_process=owner
        )
        await self.engine.start()
        self.figures = FiguresJob(
            url,
            SERVICE,
            self.engine.figures,
            # Only a process that samples may lead: the leader's sampler writes the gauges.
            FiguresConfig(cfg.figures_flush_s, cfg.stats_interval_s > 0, cfg.figures_retention_s),
        )
        self.figures.start()
        if cfg.stats_interval_s > 0:
            self._stats_task = asyncio.create_task(self._stats_loop(), name="executor-stats")
        self.upkeep = Upkeep(url, SERVICE, UPKEEP_TABLES, UpkeepConfig.from_settings(cfg))
        self.upkeep.start()
        self.retention = Retention(url, RetentionConfig.from_settings(cfg), SERVICE)
        self.retention.start()
        if self._serve_metrics_endpoint:
            self._serve_metrics(cfg.metrics_port, cfg.metrics_host)

    def _on_started(self) -> None:
        self._started = True
        log.info(
            "executor started",
            extra={
                "process_id": self.process_id,
                "workers": self.cfg.workers,
                "grpc_port": self.grpc_port,
                "metrics_port": self.metrics_port,
            },
        )

    def _admitted(self) -> None:
        """A round admitted a generation: let the claimer look for its groups at once."""
        engine = self.engine
        if engine is not None:
            engine.rediscover = True
            engine.wake.set()

    async def _check_database(self) -> None:
        """Warn about server settings the claim path depends on (never fatal)."""
        assert self.pool is not None
        async with self.pool.connection() as conn:
            cur = await conn.execute(AUTOVACUUM_SETTING)
            row = await cur.fetchone()
        if row is not None and row[0] != "on":
            mode = self.cfg.upkeep_mode
            log.warning(
                "autovacuum is off on this server: the queue tables bloat and claims slow down over "
                "time without vacuum (DESIGN §8 trap 6); "
                + (
                    "the services vacuum and analyze their own tables (upkeep, ADR 008)"
                    if mode != "off"
                    else "upkeep mode is off too: turn autovacuum on or vacuum connector_work_item regularly"
                ),
                extra={"upkeep_mode": mode},
            )

    async def _start_grpc(self, url: str) -> None:
        authenticate = self._authenticate
        protected = self._protected
        credentials = self._credentials
        admin_api: Any = None
        if self._mount_admin:
            from connector.executor import admin

            settings = self._admin_settings or load(AdminSettings)
            self.admin_pool = await db.open_pool(
                f"{SERVICE}-admin",
                self.db,
                PoolSettings(pool_min_size=1, pool_max_size=4, pool_timeout_s=self.cfg.pool_timeout_s),
                url=url,
                check=True,  # the first admin call after a database restart gets a live connection
            )
            admin_api = admin.build_admin(self.admin_pool, settings)
            authenticate = authenticate or admin_api.authenticate
            protected = protected or admin.PROTECTED_PREFIXES
            credentials = credentials or admin.server_credentials(settings)
        self.grpc = GrpcServer(
            host=self.cfg.grpc_host,
            port=self.cfg.grpc_port,
            authenticate=authenticate,
            protected_prefixes=protected,
            credentials=credentials,
            service=SERVICE,
        )
        if admin_api is not None:
            from connector.executor import admin

            admin.register(self.grpc, admin_api.servicer)
        for register, servicer, full_name in self._servicers:
            self.grpc.add(register, servicer, full_name)
        await self.grpc.start()
        self.grpc_port = self.grpc.port

    async def _stats_loop(self) -> None:
        assert self.pool is not None
        while True:
            try:
                async with self.pool.connection() as conn:
                    leader = self.figures is not None and self.figures.leader
                    await stats_sampler.sample_once(conn, self._heartbeat_s, figures_leader=leader)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("stats sampling failed", extra={"exc_type": type(exc).__name__})
            await asyncio.sleep(self.cfg.stats_interval_s)

    async def _stop_serving(self) -> None:
        grpc = self.grpc
        if grpc is not None:
            await grpc.health.enter_graceful_shutdown()
            await grpc.server.stop(min(5.0, self.cfg.shutdown_grace_s))
            self.grpc = None

    async def _drain(self) -> None:
        if self.engine is not None:
            await self.engine.stop()
            self.engine = None
        if self.admission is not None:
            await self.admission.stop()
            self.admission = None

    async def _stop_background(self) -> None:
        if self.figures is not None:  # after the drain: its final flush counts the last outcomes
            await self.figures.stop()
            self.figures = None
        if self.retention is not None:
            await self.retention.stop()
            self.retention = None
        if self.upkeep is not None:
            await self.upkeep.stop()
            self.upkeep = None
        task, self._stats_task = self._stats_task, None
        await cancel_task(task)

    async def _close_pools(self) -> None:
        admin_pool, self.admin_pool = self.admin_pool, None
        await db.close_own_pool(f"{SERVICE}-admin", admin_pool)
        await super()._close_pools()

    def _on_stopped(self) -> None:
        if self._started:
            log.info("executor stopped")
        self._started = False


# --------------------------------------------------------------------------------------------------
# CLI: connector executor
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--claim-path",
        choices=CLAIM_PATHS,
        help="work_item (default) or event (legacy Event compatibility mode for one pack generation,"
        " only while its claim authority is legacy_active; docs/cutover.md)",
    )
    parser.add_argument("--pack", help="--claim-path event: the pack (name or id) whose events to claim")
    parser.add_argument(
        "--generation", type=int, help="--claim-path event: the generation (default: the active one)"
    )
    parser.add_argument("--workers", type=int, help="executor slots (CONNECTOR_EXECUTOR_WORKERS)")
    parser.add_argument("--claim-batch", type=int, help="items per claim (CONNECTOR_EXECUTOR_CLAIM_BATCH)")
    parser.add_argument("--lease-s", type=float, help="lease seconds (CONNECTOR_EXECUTOR_LEASE_S)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (CONNECTOR_EXECUTOR_GRPC_PORT)")
    parser.add_argument("--metrics-port", type=int, help="metrics port (CONNECTOR_EXECUTOR_METRICS_PORT)")
    parser.add_argument("--no-admin", action="store_true", help="do not mount the admin API")


def cli(args: argparse.Namespace) -> int:
    """``connector executor``: run until SIGTERM/SIGINT, then drain."""
    logs.setup(SERVICE)
    db = load(DatabaseSettings)
    cfg = load(ExecutorSettings)
    updates = {
        key: getattr(args, key)
        for key in ("claim_path", "workers", "claim_batch", "lease_s", "grpc_port", "metrics_port")
        if getattr(args, key, None) is not None
    }
    if updates:
        cfg = cfg.model_copy(update=updates)
    if cfg.claim_path == "event":
        from connector.executor import legacy

        return legacy.cli(args, db, cfg)
    try:
        service = ExecutorService(db, cfg, mount_admin=not getattr(args, "no_admin", False))
    except ClaimPathNotSupported as exc:
        print(f"connector executor: {exc}", file=sys.stderr)
        return 2
    db.url()  # fail fast without a database URL
    runtime.run(lambda: runtime.run_until_signal([service]), traced_as=SERVICE)
    return 0
