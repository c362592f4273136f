"""``ServerWatch``: which database server does this service's pool reach, and did it change?

Every ``interval_s`` (``CONNECTOR_SERVER_WATCH_INTERVAL_S``, 2 s) one pooled connection answers
``SERVER_IDENTITY``: the cluster's system identifier (NULL where ``pg_control_system()`` is not
granted), the WAL timeline (a promotion starts a new one), the server's address and port, and
whether it is in recovery. When the answer differs from the last one (a failover through a
multi-host URL or a service address that follows the primary, a promotion in place) the watch:

* counts it (``connector_db_failovers_seen_total{service}``) and writes one WARNING line with the
  old and new server (address, port, timeline; never credentials);
* drains the idle pool: connections still open to the old server (a silent one would hang a
  statement until ``tcp_user_timeout``) are closed and new ones opened;
* re-establishes every LISTEN session of the process (``Listener.reconnect_all``): a session still
  attached to the old server would otherwise wait for its keepalives to fail; the listeners poll
  while they are away.

A service that commits with a ``synchronous_commit`` level that waits for a standby (the ingress
with ``CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT``) also asks ``SYNC_STANDBY_READY`` each round:
``connector_db_synchronous_standby_ready{service}`` and the ingress's ``/readyz`` follow it.

A server that answers "in recovery" (the pool reached a standby) also drains the pool, unless
``CONNECTOR_EVICT_READ_ONLY`` is false. Errors (the server unreachable) are the pool's to recover
from: the watch asks again next round. Nothing here is on a hot path: one statement per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from connector.common.core import db
from connector.common.core.listener import Listener
from connector.common.core.runtime import cancel_task

log = logging.getLogger(__name__)

#: The identity of the server a connection reaches. The timeline: the first 8 hex digits of the
#: current WAL file's name on a primary (as ``connector_server_timeline()``), the last checkpoint's on
#: a standby (``pg_current_wal_lsn()`` raises there).
SERVER_IDENTITY = """
SELECT {system_identifier},
       CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())::bigint
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END,
       coalesce(host(inet_server_addr()), 'local'),
       coalesce(inet_server_port(), 0),
       pg_is_in_recovery()
"""
_WITH_SYSTEM_ID = SERVER_IDENTITY.format(
    system_identifier="(SELECT system_identifier FROM pg_control_system())::text"
)
_WITHOUT_SYSTEM_ID = SERVER_IDENTITY.format(system_identifier="NULL::text")


#: Whether the server can honour a ``synchronous_commit`` that waits for a standby: it names
#: synchronous standbys and one of them is connected as ``sync`` or ``quorum``. (The connector's role
#: needs ``pg_monitor`` or ``pg_read_all_stats`` to see ``sync_state``; without it this says false.)
SYNC_STANDBY_READY = """
SELECT current_setting('synchronous_standby_names') <> ''
       AND EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))
"""


@dataclass(frozen=True, slots=True)
class Server:
    system_identifier: str | None
    timeline: int
    address: str
    port: int
    in_recovery: bool

    def describe(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "port": self.port,
            "timeline": self.timeline,
            "in_recovery": self.in_recovery,
        }


class ServerWatch:
    """See the module docstring. ``service`` is the pool's name (metrics label)."""

    def __init__(
        self,
        service: str,
        pool: Any,
        *,
        interval_s: float = 2.0,
        evict_read_only: bool = True,
        sync_standby: bool = False,
    ) -> None:
        self.service = service
        #: Also ask ``SYNC_STANDBY_READY`` each round (a service that commits with a
        #: ``synchronous_commit`` level that waits for a standby).
        self.sync_standby = sync_standby
        #: Its last answer (``None`` before the first; ``connector_db_synchronous_standby_ready``).
        self.sync_standby_ready: bool | None = None
        self.pool = pool
        self.interval_s = interval_s
        self.evict_read_only = evict_read_only
        #: The server last seen (``None`` before the first answer).
        self.server: Server | None = None
        #: Changes seen, and answers received (tests wait on them).
        self.changes = 0
        self.checks = 0
        self._statement = _WITH_SYSTEM_ID
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()

    def start(self) -> None:
        db.FAILOVERS_SEEN.setdefault(self.service, 0)
        self._task = asyncio.create_task(self._loop(), name=f"{self.service}-server-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_task(task)

    async def check_once(self) -> Server:
        async with self.pool.connection(timeout=max(self.interval_s, 1.0)) as conn:
            try:
                row = await (await conn.execute(self._statement)).fetchone()
            except psycopg.errors.InsufficientPrivilege:
                self._statement = _WITHOUT_SYSTEM_ID
                row = await (await conn.execute(self._statement)).fetchone()
            if self.sync_standby:
                ready = await (await conn.execute(SYNC_STANDBY_READY)).fetchone()
                self.sync_standby_ready = bool(ready and ready[0])
                db.SYNC_STANDBY_READY[self.service] = int(self.sync_standby_ready)
        assert row is not None
        server = Server(row[0], int(row[1]), str(row[2]), int(row[3]), bool(row[4]))
        self.checks += 1
        before, self.server = self.server, server
        if before is not None and server != before:
            await self._changed(before, server)
        elif server.in_recovery and self.evict_read_only and hasattr(self.pool, "drain_for"):
            await self.pool.drain_for("in_recovery")
        return server

    async def _changed(self, before: Server, after: Server) -> None:
        self.changes += 1
        db.FAILOVERS_SEEN[self.service] = db.FAILOVERS_SEEN.get(self.service, 0) + 1
        log.warning(
            "database server changed",
            extra={
                "service": self.service,
                "before": before.describe(),
                "after": after.describe(),
                "same_cluster": before.system_identifier == after.system_identifier,
            },
        )
        if hasattr(self.pool, "drain_for"):
            await self.pool.drain_for("server_changed")
        Listener.reconnect_all()
        self.changed.set()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # unreachable: the pool recovers; ask again
                await self.check_once()
            await asyncio.sleep(self.interval_s)


__all__ = ["SERVER_IDENTITY", "SYNC_STANDBY_READY", "Server", "ServerWatch"]
