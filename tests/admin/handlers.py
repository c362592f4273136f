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
