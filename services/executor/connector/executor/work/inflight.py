"""The executor's record of one claimed WorkItem while this process holds its lease.

``InFlight`` is the ``HandlerContext`` its handler receives (one object per item: no second
allocation on the claim path) plus the bookkeeping only the executor's actors read and write: the
handler runtime, whether it started and finished, when it started, why it was cancelled and the
worker task running it. Handlers see the ``HandlerContext`` contract only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from connector.common.store.work_items.claim import CLAIM_COLUMNS
from connector.executor.handlers import HandlerContext

_CONCURRENCY_KEY = CLAIM_COLUMNS.index("concurrency_key")
_DEBOUNCE_KEY = CLAIM_COLUMNS.index("debounce_key")
_CIRCUIT_KEY = CLAIM_COLUMNS.index("circuit_key")
_DUE_S = CLAIM_COLUMNS.index("due_s")
_ACCEPTED_S = CLAIM_COLUMNS.index("accepted_s")


class InFlight(HandlerContext):
    __slots__ = (
        "accepted_s",
        "cancel",
        "circuit_key",
        "concurrency_key",
        "debounce_key",
        "done",
        "due_s",
        "runtime",
        "started",
        "t0",
        "task",
    )

    def __init__(self, row: tuple[Any, ...], deadline: float) -> None:
        HandlerContext.__init__(self, row, deadline)
        #: The item's concurrency key (docs/adr/011-rate-limits.md): its finalize gives the slot back.
        self.concurrency_key: str | None = row[_CONCURRENCY_KEY]
        #: The item's debounce key: the claimer reads what its execution covers (docs/packs.md#debounce).
        self.debounce_key: str | None = row[_DEBOUNCE_KEY]
        #: The item's circuit (its handler target, docs/adr/013-circuit-breakers.md): its outcome feeds it.
        self.circuit_key: str | None = row[_CIRCUIT_KEY]
        #: When it was due and when its receipt was accepted (Unix seconds, database clock; the
        #: figures' scheduling delay and receipt -> executed latency).
        self.due_s: float = row[_DUE_S]
        self.accepted_s: float | None = row[_ACCEPTED_S]
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
