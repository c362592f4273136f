"""Ingress service wiring: pool, route table, receipt writers, HTTP and gRPC servers, metrics.

Use in-process (``connector up``, tests)::

    svc = IngressService(DatabaseSettings(), IngressSettings(), url=None)
    await svc.start()          # raises if the database does not answer
    ... svc.http_port, svc.grpc_port, svc.metrics_port (bound ports; settings may ask for 0) ...
    await svc.stop()

``url`` overrides ``DatabaseSettings.url()`` (e.g. the embedded PostgreSQL of ``connector up``).
Metrics are served on ``settings.metrics_port`` unless ``serve_metrics=False`` (when the host
process serves the shared registry itself).

Start order: pool → process row (``connector_process``, service ``ingress``, claim capability
``none``, heartbeat every ``heartbeat_s`` on this pool) → route table (first load) → writers → gRPC
→ HTTP (ready last).
Stop order: gRPC health NOT_SERVING → HTTP stops accepting, in-flight requests finish (their
batches commit) → gRPC stops → writers drain → route watcher → deregister → pool.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys

from aiohttp import web

from connector.common.core import db, logs, runtime
from connector.common.core.grpc_server import GrpcServer
from connector.common.core.service import ServiceBootstrap
from connector.common.core.settings import DatabaseSettings, IngressSettings, load
from connector.common.maintenance.figures import FiguresConfig, FiguresJob
from connector.ingress import metrics
from connector.ingress.admission import Admission
from connector.ingress.api import ingress_servicer
from connector.ingress.http import HttpLimits, build_server
from connector.ingress.receipts import ReceiptWriter
from connector.ingress.reconcile.reconciler import Reconciler
from connector.ingress.routes import RouteTable

#: ``synchronous_commit`` levels that wait for a synchronous standby.
SYNC_STANDBY_LEVELS = ("remote_write", "on", "remote_apply")
#: The readiness probe's round trip through the pool (``/readyz``, every orchestrator probe).
READY_PROBE = "SELECT 1"
log = logging.getLogger(__name__)

SERVICE = "ingress"

#: The cyclic collector's first threshold while the service runs (CPython's default is 700). A
#: delivery allocates and frees container objects (request, headers, futures, receipt, answer) but
#: makes no reference cycles on its path; at 700 the drift of those short-lived objects across
#: collections set off a young collection every few dozen deliveries (~5 µs of CPU per ack in
#: ``benchmarks.ingress_bench``) and a full one every few seconds (~8 µs per ack: it walks every
#: object of the imported libraries). At this threshold a young collection runs about once a
#: minute at 10,000 deliveries/s (docs/benchmarks.md, "Ingress CPU per ack").
GC_GEN0_THRESHOLD = 20_000


def settle_heap() -> None:
    """Once the service is serving: collect, move everything alive (the imported libraries, the
    route table, the pools) out of the collector's view (``gc.freeze``: full collections then walk
    only what came later), and raise the first threshold to ``GC_GEN0_THRESHOLD``. For the
    ``connector ingress`` process only (``cli``), never for a host process that embeds the service."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


class IngressService(ServiceBootstrap):
    name = SERVICE

    def __init__(
        self,
        db: DatabaseSettings,
        settings: IngressSettings,
        url: str | None = None,
        *,
        serve_metrics: bool = True,
        heartbeat_s: float = 5.0,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(heartbeat_s=heartbeat_s)
        self.db = db
        self.settings = settings
        self._url = url
        self._serve_metrics_endpoint = serve_metrics
        self._reuse_port = reuse_port
        self.routes: RouteTable | None = None
        self.writer: ReceiptWriter | None = None
        self.admission: Admission | None = None
        #: The reconciler (docs/reconcile.md): leads passes when this process holds its lock.
        self.reconciler: Reconciler | None = None
        self.figures: FiguresJob | None = None
        self._runner: web.ServerRunner | None = None
        self._grpc: GrpcServer | None = None
        self.http_port = 0
        #: The HTTP connection cap in force (derived from the descriptor limit unless set).
        self.http_max_connections = 0
        self.grpc_port = 0

    async def _start(self) -> None:
        s = self.settings
        url = self.db.conninfo(self._url)
        pool_db = self.db.model_copy(update={"statement_timeout_ms": s.statement_timeout_ms})
        self.watch_sync_standby = s.synchronous_commit in SYNC_STANDBY_LEVELS
        pool = await self._open_pool(pool_db, s, url=url)
        await self._register(capability="none")
        self.routes = RouteTable(
            db.conninfo_with(url, application_name="connector-ingress-routes", statement_timeout_ms=0),
            refresh_s=s.routes_refresh_s,
        )
        await self.routes.start()
        self.writer = ReceiptWriter(
            pool,
            writers=min(s.group_commit_writers, s.pool_max_size),
            max_batch=s.group_commit_max_batch,
            max_wait_s=s.group_commit_max_wait_ms / 1000.0,
            max_queue=s.group_commit_max_queue,
            queue_timeout_s=s.pool_timeout_s,
            pool_timeout_s=s.pool_timeout_s,
            commit_deadline_s=s.commit_deadline_s,
            synchronous_commit=s.synchronous_commit,
        )
        self.writer.start()
        admission = self.admission = Admission(
            self.routes,
            self.writer,
            max_body_bytes=s.max_body_bytes,
            namespace_max_inflight=s.namespace_max_inflight,
            retry_after_s=s.retry_after_s,
        )
        if s.reconcile_enabled:
            self.reconciler = Reconciler(
                db.conninfo_with(
                    url,
                    application_name="connector-ingress-reconciler",
                    statement_timeout_ms=s.statement_timeout_ms,
                ),
                self.routes,
                self.writer,
                owner=str(self.process_id),
                tick_s=s.reconcile_tick_s,
            )
            self.reconciler.start()
        self.figures = FiguresJob(
            url, SERVICE, admission.figures, FiguresConfig(flush_s=s.figures_flush_s), pool=pool
        )
        self.figures.start()
        writer = self.writer
        metrics.QUEUE_DEPTH.set_function(lambda: writer.depth)
        metrics.INFLIGHT.set_function(lambda: admission.inflight_total)

        self._grpc = GrpcServer(
            host=s.grpc_host, port=s.grpc_port, reuse_port=self._reuse_port, service=SERVICE
        )
        self._grpc.add(
            ingress_servicer.register,
            ingress_servicer.IngressServicer(admission, public_base_url=s.public_base_url),
            ingress_servicer.FULL_NAME,
        )
        await self._grpc.start()
        self.grpc_port = self._grpc.port

        server = build_server(
            admission,
            ready=self.ready,
            public_base_url=s.public_base_url,
            limits=HttpLimits.from_settings(s),
            trust_forwarded_for=s.http_trust_forwarded_for,
        )
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=s.shutdown_grace_s)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            s.http_host,
            s.http_port,
            backlog=server.guard.backlog,
            reuse_port=self._reuse_port or None,
        )
        await site.start()
        self.http_port = int(self._runner.addresses[0][1])
        self.http_max_connections = server.guard.max_connections

        if self._serve_metrics_endpoint:
            self._serve_metrics(s.metrics_port, s.metrics_host)

    def _on_started(self) -> None:
        log.info(
            "ingress started",
            extra={
                "http_port": self.http_port,
                "grpc_port": self.grpc_port,
                "metrics_port": self.metrics_port,
                "routes": len(self.routes) if self.routes is not None else 0,
                "process_id": self.process_id,
                "http_max_connections": self.http_max_connections,
            },
        )

    async def ready(self) -> bool:
        """Ready when the route table is loaded, receipts are being committed (no delivery has
        waited a whole commit deadline — 5 s without one — since the last commit: a hung or silent
        database), the server has the synchronous standby ``CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT``
        asks for, and the database answers through our pool."""
        if self.routes is None or not self.routes.loaded or self.pool is None or self.writer is None:
            return False
        stall_limit = self.settings.commit_deadline_s or 5.0
        if self.writer.stalled_s() >= stall_limit:
            return False
        # An ack must be on a synchronous standby (CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT): not ready
        # while the server has none (a commit would then be local only, or wait for ever).
        watch = self.server_watch
        if self.watch_sync_standby and watch is not None and not watch.sync_standby_ready:
            return False
        try:
            async with self.pool.connection(timeout=min(1.0, self.settings.pool_timeout_s)) as conn:
                await conn.execute(READY_PROBE)
        except Exception:
            return False
        return True

    async def _stop_serving(self) -> None:
        if self._grpc is not None:
            await self._grpc.health.enter_graceful_shutdown()
        if self._runner is not None:
            await self._runner.cleanup()  # stop accepting; in-flight handlers finish within the grace
            self._runner = None
        if self._grpc is not None:
            await self._grpc.server.stop(self.settings.shutdown_grace_s)
            self._grpc = None

    async def _drain(self) -> None:
        if self.reconciler is not None:
            await self.reconciler.stop()  # before the writers: a pass in flight is cut, not left waiting
            self.reconciler = None
        if self.writer is not None:
            await self.writer.stop()
            self.writer = None
        if self.figures is not None:  # after the last answer: its final flush counts them
            await self.figures.stop()
            self.figures = None
        if self.routes is not None:
            await self.routes.stop()

    def _on_stopped(self) -> None:
        log.info("ingress stopped")


def _workers(value: str) -> int:
    """``--workers``: a count, or ``auto`` for the CPUs this container may use."""
    if value.strip().lower() == "auto":
        from connector.ingress.supervisor import container_cpus

        return min(container_cpus(), 64)
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("give a number of workers or auto") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-host", help="HTTP bind address (CONNECTOR_INGRESS_HTTP_HOST)")
    parser.add_argument("--http-port", type=int, help="HTTP port (CONNECTOR_INGRESS_HTTP_PORT)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (CONNECTOR_INGRESS_GRPC_PORT)")
    parser.add_argument("--metrics-port", type=int, help="metrics port (CONNECTOR_INGRESS_METRICS_PORT)")
    parser.add_argument(
        "--workers",
        "--processes",
        dest="processes",
        type=_workers,
        metavar="N|auto",
        help="worker processes sharing the HTTP and gRPC ports, supervised by this one; auto: the "
        "container's CPU count (CONNECTOR_INGRESS_PROCESSES, default 1; metrics on --metrics-port + "
        "worker index)",
    )
    # Set by the supervisor for its workers: the worker index (bind with SO_REUSEPORT).
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)


def cli(args: argparse.Namespace) -> int:
    """``connector ingress``: run until SIGTERM/SIGINT (``--workers N``: supervise N workers)."""
    logs.setup(SERVICE)
    db = load(DatabaseSettings)
    settings = load(IngressSettings)
    overrides = {
        key: value
        for key in ("http_host", "http_port", "grpc_port", "metrics_port", "processes")
        if (value := getattr(args, key, None)) is not None
    }
    if overrides:
        settings = settings.model_copy(update=overrides)
    db.url()  # fail fast with a clear message when the URL is missing
    worker = getattr(args, "worker", None)
    if worker is None and settings.processes > 1:
        if settings.processes < 1 or settings.processes > 64:
            print("connector ingress: --workers must be between 1 and 64", file=sys.stderr)
            return 2
        if settings.http_port == 0 or settings.grpc_port == 0:
            print(
                "connector ingress: --workers needs fixed HTTP and gRPC ports (0 picks a different "
                "free port in every worker)",
                file=sys.stderr,
            )
            return 2
        from connector.ingress.supervisor import supervise

        forwarded = [
            "--http-host", settings.http_host, "--http-port", str(settings.http_port),
            "--grpc-port", str(settings.grpc_port), "--metrics-port", str(settings.metrics_port),
        ]  # fmt: skip
        return supervise(settings.processes, forwarded, grace_s=settings.shutdown_grace_s)
    if worker is not None and settings.metrics_port:
        settings = settings.model_copy(update={"metrics_port": settings.metrics_port + worker})

    async def main() -> None:
        from connector.ingress.supervisor import report_ready

        def started() -> None:
            settle_heap()
            report_ready()

        await runtime.run_until_signal(
            [IngressService(db, settings, reuse_port=worker is not None)], on_started=started
        )

    runtime.run(main, traced_as=SERVICE)
    return 0
