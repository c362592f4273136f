"""A python work handler for tests/test_tracing.py, run inside a real executor process: it appends
what it sees of the trace context (``ctx.traceparent`` and the current OpenTelemetry span) as one
JSON line to the file named by ``TRACING_TEST_PYTHON_OUT``."""

from __future__ import annotations

import json
import os

from opentelemetry import trace

from connector.executor.handlers import HandlerContext, Outcome, work_handler


@work_handler(needs_event=False)
async def record(ctx: HandlerContext) -> None:
    current = trace.get_current_span().get_span_context()
    line = {
        "work_id": ctx.work_id,
        "traceparent": ctx.traceparent,
        "current_trace_id": f"{current.trace_id:032x}" if current.is_valid else None,
        "current_span_id": f"{current.span_id:016x}" if current.is_valid else None,
    }
    with open(os.environ["TRACING_TEST_PYTHON_OUT"], "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


@work_handler(needs_event=False)
async def flaky(ctx: HandlerContext) -> Outcome | None:
    """Asks for a retry on its first attempt, succeeds on the second (two attempt spans)."""
    if ctx.attempt == 1:
        return Outcome.retry(0.0, "try_again", "first attempt asks for a retry")
    return None
