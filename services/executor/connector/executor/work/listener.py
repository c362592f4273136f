"""The engine's wake-ups: a ``connector.common.core.listener.Listener`` on ``connector_work``. Every
notification marks the scheduler's groups ready and wakes the claimer; one that is not a lane
promotion (``lanes``: those stay within known groups) also makes it look for new groups. After a
(re)connect anything may have happened, so the groups are marked ready too.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, Notify

from connector.common.core.listener import Listener, ListenerConfig
from connector.common.store.vocabulary import CHANNEL_WORK
from connector.executor.work.doors import ListenerDoor


def work_listener(engine: ListenerDoor) -> Listener:
    def on_notify(notes: list[Notify]) -> None:
        engine.scheduler.mark_ready()
        if any(note.payload != "lanes" for note in notes):  # lane promotions stay within known groups
            engine.rediscover = True
        engine.wake.set()

    def on_listen(conn: AsyncConnection[Any], reconnect: bool) -> None:
        # Anything may have happened while we were not listening.
        engine.scheduler.mark_ready()
        engine.wake.set()

    return Listener(
        str(engine.pool.conninfo),
        ListenerConfig(channels=(CHANNEL_WORK,), name="executor-listener"),
        on_wake=on_notify,
        on_connect=on_listen,
        on_error=lambda exc: engine.error("listen", exc),
    )
