"""Process runtime shared by the services: event loop, signals, ordered shutdown.

A service is an object with ``async start()`` and ``async stop()``; ``run_services`` starts them in
order, waits for SIGTERM/SIGINT, then stops them in reverse order (each service stops its servers,
drains its work and closes its own pool, in that order).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Protocol

from connector.common.core import tracing

log = logging.getLogger(__name__)


class Service(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def run_until_signal(
    services: Sequence[Service],
    *,
    on_started: Callable[[], Awaitable[None] | None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Start ``services`` in order, run ``on_started``, wait for SIGTERM/SIGINT (or ``stop``), then
    stop them in reverse order."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started: list[Service] = []
    try:
        for svc in services:
            await svc.start()
            started.append(svc)
        if on_started is not None:
            result = on_started()
            if asyncio.iscoroutine(result):
                await result
        await stop.wait()
        log.info("shutdown requested")
    finally:
        for svc in reversed(started):
            try:
                await svc.stop()
            except Exception:
                log.exception("error while stopping", extra={"component": svc.name})
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run(main: Callable[[], Coroutine[Any, Any, None]], *, traced_as: str | None = None) -> None:
    """Run ``main`` on uvloop when available (the default event loop otherwise). ``traced_as``: the
    service's name for traces, set up before and flushed after (only when the standard
    ``OTEL_*`` variables turn tracing on; connector.common.core.tracing)."""
    if traced_as is not None:
        tracing.setup(traced_as)
    try:
        try:
            import uvloop

            uvloop.run(main())
        except ImportError:  # pragma: no cover
            asyncio.run(main())
    finally:
        if traced_as is not None:
            tracing.shutdown()


async def cancel_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task and wait until it has ended (no-op for ``None``)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def cancel_tasks(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel several loops at once, then wait for each to end (a loop that ended with an error is
    not re-raised: the service is stopping)."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
