"""Handlers of the figures end-to-end test (tests/test_figures_e2e.py), run by real executor
processes: ``slow`` takes a little while (so that two executors both get work), ``fail`` fails
permanently (a dead letter at once)."""

from __future__ import annotations

import asyncio

from connector.executor.handlers import HandlerContext, Outcome


async def slow(ctx: HandlerContext) -> None:
    await asyncio.sleep(0.05)


async def fail(ctx: HandlerContext) -> Outcome:
    return Outcome.fail("downstream_rejected", "the target refused the change")
