"""Handlers for the admin end-to-end test, importable by an in-process executor."""

from __future__ import annotations

from typing import Any

from connector.executor.handlers import HandlerContext, Outcome

#: Set by the test: while true, every execution fails permanently (the item goes dead at once).
FAIL = {"on": True}
#: One entry per execution: (work_id, generation, attempt, idempotency key, payload).
CALLS: list[tuple[int, int, int, str, Any]] = []


async def flaky(ctx: HandlerContext) -> Outcome | None:
    CALLS.append((ctx.work_id, ctx.generation, ctx.attempt, ctx.idempotency_key, ctx.payload))
    if FAIL["on"]:
        return Outcome.fail("downstream_rejected", "the target refused the change")
    return None


async def ok(ctx: HandlerContext) -> None:
    return None


#: Executions of ``busy`` (work ids), for the find/trace end-to-end test.
BUSY_CALLS: list[int] = []


async def busy(ctx: HandlerContext) -> Outcome | None:
    """The downstream is busy: retry in a minute (the item waits in backoff, holding its lane)."""
    BUSY_CALLS.append(ctx.work_id)
    return Outcome.retry(delay_s=60.0, failure_class="downstream_busy", summary="try again later")
