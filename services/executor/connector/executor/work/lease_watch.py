"""The lease watch: this process stops using a lease the database may no longer grant it, on its own
timer (issue #26, item 5; docs/executor.md, "When renewals fail").

A held item's ``deadline`` is the lease as last confirmed by the database — measured on the monotonic
clock from *before* the claim or renewal statement was sent, so never later than the database's
``lease_until`` — less the margin (``EngineConfig.lease_usable_s``; ``CONNECTOR_EXECUTOR_LEASE_MARGIN_S``,
default one renewal interval). The lease keeper moves it on with every successful renewal; when
renewals fail or hang (a silent, black-holed database connection never answers), nothing moves it,
and at the deadline the watch loses the item as a fenced renewal would (``LeaseKeeper.lose``):

* not started yet: dropped from the ready queue (the runners also refuse to start an item past its
  deadline), nothing written — its lease expires in the database and a reclaim retries it;
* running in an async handler (python async, HTTP, gRPC): the call is cancelled, nothing written;
* running in a sync python handler (a thread, which cannot be interrupted): it finishes, and its
  finalize is fenced by the token like any stale holder's — the database has the last word.

The watch sleeps until the earliest deadline of what is held (at most ``min(lease_s / 3, usable /
2)``, so items claimed meanwhile are seen in time): no work per item while renewals succeed.
"""

from __future__ import annotations

import asyncio
import time

from connector.common.core.eventlog import events
from connector.executor import metrics as m
from connector.executor.work.doors import LeaseWatchDoor
from connector.executor.work.inflight import InFlight

monotonic = time.monotonic

MIN_SLEEP_S = 0.01


class LeaseWatch:
    def __init__(self, engine: LeaseWatchDoor) -> None:
        self.engine = engine
        self._expired = dict.fromkeys(m.LEASE_EXPIRED_WHAT, 0)

    async def run(self) -> None:
        cfg = self.engine.cfg
        longest = max(MIN_SLEEP_S, min(cfg.lease_s / 3.0, cfg.lease_usable_s / 2.0))
        while True:
            now = monotonic()
            earliest = self.sweep(now)
            wait = longest if earliest is None else min(longest, earliest - now)
            await asyncio.sleep(max(MIN_SLEEP_S, wait))

    def sweep(self, now: float) -> float | None:
        """Lose every held item past its deadline; the earliest deadline of the others."""
        earliest: float | None = None
        for f in list(self.engine.held.values()):
            if f.done or f.lease_lost:
                continue
            deadline = f.deadline
            if deadline <= now:
                self.expire(f)
            elif earliest is None or deadline < earliest:
                earliest = deadline
        self._report()
        return earliest

    def expire(self, f: InFlight) -> None:
        """``f``'s lease ran out on this process's clock: stop using it."""
        if not f.started:
            what = "unstarted"
        elif f.task is not None and getattr(f.runtime.handler, "is_async", True):
            what = "cancelled"
        else:
            what = "uncancellable"
        self._expired[what] += 1
        self.engine.lease_keeper.lose(f)

    def _report(self) -> None:
        """One log line and the counters for what expired since the last report."""
        counts = self._expired
        if not any(counts.values()):
            return
        for what, n in counts.items():
            if n:
                m.LEASE_EXPIRED_LOCAL.labels(what).inc(n)
        events("executor").emit(
            "lease_expired_locally",
            "no_renewal",
            "leases ran out with no renewal from the database: stopped running them; any executor"
            " retries them once they expire there. Check this executor's connection to PostgreSQL",
            **counts,
        )
        self._expired = dict.fromkeys(m.LEASE_EXPIRED_WHAT, 0)
