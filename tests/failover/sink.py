"""The failover tests' handler (``tests.failover.sink:effect``), run by real executor processes.

Each execution appends one JSON line to the file ``FAILOVER_SINK`` — a sink outside the database,
which no failover can roll back: the delivery's marker (the event's ``source_object_id``: the
provider's message id), the idempotency key, the work id, the lease token, the attempt, the process
and the wall time. ``O_APPEND`` writes of one short line are atomic, so the file's order is the order
in which the effects happened. ``tests.failover.harness.Ledger`` applies the token fence to it
afterwards (a later effect under a lower token for the same delivery is what a fencing sink refuses).

``FAILOVER_SLEEP_S`` (default 0.05) is slept before the effect, so work is in flight at the fault.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from connector.executor.handlers import HandlerContext, work_handler


@work_handler(needs_event=True)
async def effect(ctx: HandlerContext) -> None:
    assert ctx.event is not None
    await asyncio.sleep(float(os.environ.get("FAILOVER_SLEEP_S", "0.05")))
    line = {
        "marker": ctx.event.source_object_id,
        "key": ctx.idempotency_key,
        "work_id": ctx.work_id,
        "token": ctx.lease_token,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        "wall": time.time(),
    }
    fd = os.open(os.environ["FAILOVER_SINK"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
