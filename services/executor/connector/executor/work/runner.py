"""The runners: ``workers`` tasks that take ready items and run their handlers (one at a time each),
classify what the handler answered or raised, and hand the outcome to the finalizer. A runner that
is cancelled because its item's lease was lost, or because the handler overran its timeout, carries
on with the next item; one cancelled for shutdown stops.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from connector.common.core import tracing
from connector.executor import metrics as m
from connector.executor.handlers import Outcome, classify, sanitize_summary
from connector.executor.handlers.registry import WorkTypeRuntime
from connector.executor.work.doors import RunnerDoor
from connector.executor.work.inflight import InFlight

monotonic = time.monotonic


def unknown_outcome(rt: WorkTypeRuntime) -> Outcome:
    if rt.unknown:
        return Outcome.fail("unknown_work_type", "the pack generation declares no such work type")
    return Outcome.retry(
        None, "handler_unavailable", sanitize_summary(rt.unavailable or "handler unavailable")
    )


def start_attempt_span(f: InFlight) -> tuple[Any, object]:
    """The attempt's span (parent: the context the WorkItem carries) made current, so a python
    handler's own spans nest under it; ``f.traceparent`` becomes the span's, which is what HTTP and
    gRPC handlers receive. Attributes: ids and names, never the payload (docs/tracing.md); few of
    them, as each costs the SDK ~2 µs (the event id is on the parent routing span)."""
    span = tracing.start_span(
        tracing.ATTEMPT_SPAN,
        f.traceparent,
        {
            "connector.work_id": f.work_id,
            "connector.work_type": f.work_type,
            "connector.attempt": f.attempt,
            "connector.installed_pack_id": f.installed_pack_id,
        },
    )
    f.traceparent = tracing.traceparent_of(span)
    return span, tracing.activate(span)


def end_attempt_span(span: Any, token: object, out: Outcome | None, override: str | None) -> None:
    tracing.deactivate(token)
    kind = override or ("success" if out is None else out.kind)
    span.set_attribute("connector.outcome", kind)
    if out is not None and out.kind != "success":
        span.set_attribute("connector.failure_class", out.failure_class)
        tracing.set_error(span, out.failure_class)
    elif override == "lease_lost":
        tracing.set_error(span, "lease_lost")
    span.end()


class Runner:
    def __init__(self, engine: RunnerDoor) -> None:
        self.engine = engine

    async def run(self) -> None:
        e = self.engine
        loop = asyncio.get_running_loop()
        ready = e.ready
        idle = e.idle
        me = asyncio.current_task()
        finish = e.finalizer.finish
        n = 0
        while True:
            if not ready:
                fut = loop.create_future()
                idle.append(fut)
                await fut
                continue
            f = ready.popleft()
            if f.lease_lost or f.deadline <= monotonic():  # never start a call past its lease
                if f.lease_lost:
                    e.abandon(f)
                else:
                    e.lease_watch.expire(f)
                continue
            rt = f.runtime
            e.running += 1
            f.started = True
            f.task = me
            span = token = None
            if tracing.ENABLED:
                span, token = start_attempt_span(f)
            try:
                handler = rt.handler
                if handler is None:
                    out: Outcome | None = unknown_outcome(rt)
                else:
                    f.t0 = t0 = monotonic()
                    try:
                        out = await handler(f)
                    finally:
                        m.handler_seconds(f.installed_pack_id, f.work_type).observe(monotonic() - t0)
            except asyncio.CancelledError:
                reason = f.cancel
                if reason is None or reason == "shutdown" or me is None:
                    e.running -= 1
                    f.task = None
                    if span is not None:
                        end_attempt_span(span, token, None, "shutdown")
                    raise
                me.uncancel()
                out = (
                    None
                    if reason == "lost"
                    else Outcome.retry(None, "timeout", "the handler overran its timeout")
                )
            except Exception as exc:
                out = classify(exc, f.payload)
            e.running -= 1
            f.task = None
            if span is not None:
                end_attempt_span(span, token, out, "lease_lost" if f.cancel == "lost" else None)
            finish(f, out)
            if e.draining and not e.running:
                e.idle_runners.set()
            n += 1
            if n & 31 == 0:
                await asyncio.sleep(0)  # handlers that never suspend must not starve the other loops
