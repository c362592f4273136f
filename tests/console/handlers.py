"""Handlers for the console's end-to-end tests, run by an executor subprocess: every execution is
recorded (one line ``<work id> <attempt>`` appended to ``$CONSOLE_TEST_DIR/calls``, O_APPEND) and
fails permanently while ``$CONSOLE_TEST_DIR/fail`` exists."""

from __future__ import annotations

import os
from pathlib import Path

from connector.executor.handlers import HandlerContext, Outcome


async def flaky(ctx: HandlerContext) -> Outcome | None:
    folder = Path(os.environ["CONSOLE_TEST_DIR"])
    with (folder / "calls").open("a") as f:
        f.write(f"{ctx.work_id} {ctx.attempt}\n")
    if (folder / "fail").exists():
        return Outcome.fail("downstream_rejected", "crm refused the change: 422")
    return None
