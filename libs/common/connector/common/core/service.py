"""The bootstrap every service process shares: own pool → process row → (its servers and work) →
metrics endpoint, and the one shutdown order (STYLE.md "Services").

A service (``IngressService``, ``MaterializerService``, ``ExecutorService``, ``LegacyService``)
subclasses ``ServiceBootstrap`` and fills in its own steps::

    class MyService(ServiceBootstrap):
        name = "my-service"

        async def _start(self) -> None:
            await self._open_pool(db_settings, pool_settings, url=url)   # self.pool
            await self._register(capability="none")                      # self.registration
            ... its servers, loops, workers ...
            self._serve_metrics(cfg.metrics_port, cfg.metrics_host)      # self.metrics_port

        async def _stop_serving(self) -> None: ...   # health NOT_SERVING, stop accepting
        async def _drain(self) -> None: ...          # in-flight work finished or released

``start`` runs ``_start``; a start that fails (or is cancelled) runs ``stop``, which skips every part
that was not started, then re-raises. ``stop`` always runs the same order:

1. ``_stop_serving``: gRPC health NOT_SERVING, then the servers stop accepting (in-flight requests
   finish within their grace);
2. ``_drain``: the service's work ends (batches in hand committed, leases finished or released,
   loops ended);
3. deregister: the ``connector_process`` row is deleted (its heartbeat stops first);
4. ``_stop_background``: loops that outlive the registration (the executor's retention, upkeep and
   stats sampler);
5. ``_close_pools``: the service's own pools (``connector.common.core.db.close_own_pool``);
6. the metrics endpoint, then pending "log lines suppressed" summaries of this service's event log;
7. ``_on_stopped`` (the service's "stopped" log line).
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from connector.common.core import db, metrics
from connector.common.core.eventlog import events
from connector.common.core.process_registry import ProcessRegistration
from connector.common.core.server_watch import ServerWatch
from connector.common.core.settings import DatabaseSettings, PoolSettings


class ServiceBootstrap:
    """Pool, process registration and metrics endpoint of one service instance, started by the
    subclass's ``_start`` and stopped by ``stop`` in the order above. ``name`` names the pool
    (``connector-<name>``), the process row's service (unless ``_register`` is given a scope), the
    metrics registry (unless ``_serve_metrics`` is given another) and the event log."""

    name: str
    #: The service commits with a ``synchronous_commit`` that waits for a standby: its ServerWatch
    #: also reports whether the server has one (set before ``_open_pool``).
    watch_sync_standby = False

    def __init__(self, *, heartbeat_s: float = 5.0) -> None:
        self._heartbeat_s = heartbeat_s
        self.pool: AsyncConnectionPool | None = None
        #: Which database server the pool reaches; drains and re-LISTENs on a change (ADR 020).
        self.server_watch: ServerWatch | None = None
        self.registration: ProcessRegistration | None = None
        self.metrics_port = 0
        self._metrics_server: Any = None

    @property
    def process_id(self) -> str | None:
        """This instance's ``connector_process`` id while it runs."""
        return self.registration.process_id if self.registration else None

    # ------------------------------------------------------------------------------------- start

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        self._on_started()

    async def _start(self) -> None:
        raise NotImplementedError

    def _on_started(self) -> None:
        """After a complete start: the service's "started" log line."""

    async def _open_pool(
        self, db_settings: DatabaseSettings, pool: PoolSettings, *, url: str | None
    ) -> AsyncConnectionPool:
        """Open this instance's own pool (``self.pool``, named after the service) and start its
        ``ServerWatch`` (unless ``CONNECTOR_SERVER_WATCH_INTERVAL_S`` is 0)."""
        self.pool = await db.open_pool(self.name, db_settings, pool, url=url)
        if db_settings.server_watch_interval_s > 0:
            self.server_watch = ServerWatch(
                self.name,
                self.pool,
                interval_s=db_settings.server_watch_interval_s,
                evict_read_only=db_settings.evict_read_only,
                sync_standby=self.watch_sync_standby,
            )
            self.server_watch.start()
        return self.pool

    def _registration(self, *, capability: str, service: str | None = None) -> ProcessRegistration:
        """The process row of this instance (``self.registration``), not yet registered: its
        ``process_id`` is known before ``start`` (lease owners, claim owners)."""
        assert self.pool is not None, "_open_pool first"
        self.registration = ProcessRegistration(
            self.pool, service=service or self.name, capability=capability, interval_s=self._heartbeat_s
        )
        return self.registration

    async def _register(self, *, capability: str, service: str | None = None) -> str:
        """Register this instance (row, then a heartbeat every ``heartbeat_s`` on its pool)."""
        registration = self._registration(capability=capability, service=service)
        await registration.start()
        return registration.process_id

    def _serve_metrics(self, port: int, host: str, *, registry: str | None = None) -> None:
        """Serve the metrics endpoint of ``registry`` (default: this service's) on ``port`` (0 picks
        a free one; ``self.metrics_port`` is the bound port, -1 when there is no endpoint)."""
        server = metrics.serve(port, host, service=registry or self.name)
        self._metrics_server = server
        self.metrics_port = int(server.server_address[1]) if server else -1

    # -------------------------------------------------------------------------------------- stop

    async def stop(self) -> None:
        await self._stop_serving()
        await self._drain()
        if self.registration is not None:
            await self.registration.stop()
            self.registration = None
        await self._stop_background()
        await self._close_pools()
        if self._metrics_server is not None:
            server, self._metrics_server = self._metrics_server, None
            await metrics.stop_server(server)
        events(self.name).flush()  # pending 'log lines suppressed' summaries
        self._on_stopped()

    async def _stop_serving(self) -> None:
        """Health NOT_SERVING, then stop accepting (servers finish in-flight requests)."""

    async def _drain(self) -> None:
        """Finish or release the work in hand; end the loops that need the registration."""

    async def _stop_background(self) -> None:
        """Loops stopped after deregistering, before the pools close."""

    async def _close_pools(self) -> None:
        watch, self.server_watch = self.server_watch, None
        if watch is not None:
            await watch.stop()
        pool, self.pool = self.pool, None
        await db.close_own_pool(self.name, pool)

    def _on_stopped(self) -> None:
        """After ``stop``: the service's "stopped" log line."""
