"""The executor's record of one claimed WorkItem while this process holds its lease.

``InFlight`` is the ``HandlerContext`` its handler receives (one object per item: no second
allocation on the claim path) plus the bookkeeping only the executor's actors read and write: the
handler runtime, whether it started and finished, when it started, why it was cancelled and the
worker task running it. Handlers see the ``HandlerContext`` contract only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from connector.executor.handlers import HandlerContext


class InFlight(HandlerContext):
    __slots__ = ("cancel", "done", "runtime", "started", "t0", "task")

    def __init__(self, row: tuple[Any, ...], deadline: float) -> None:
        HandlerContext.__init__(self, row, deadline)
        self.runtime: Any = None  # the work type's runtime (handler, retry policy, timeout)
        self.started = False
        self.done = False  # an outcome (or a release) is recorded; nothing more to write
        self.t0 = 0.0  # monotonic start of the handler call
        self.cancel: str | None = None  # why the task was cancelled: "lost", "timeout", "shutdown"
        self.task: asyncio.Task[Any] | None = None

    @property
    def deadline(self) -> float:
        """Monotonic time by which the lease must have been renewed."""
        return self._deadline

    def renewed(self, deadline: float) -> None:
        self._deadline = deadline
