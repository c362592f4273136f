"""Handlers of the cutover tests (``tests.cutover.handlers:handle``), importable by child processes.

Each execution records an *effect* row: which event and work type ran, in which process (and, in
child processes, which path it runs: ``CUTOVER_TEST_PATH``) under which token, and which
claim path held the work at that moment — ``wi_held`` (the WorkItem row was ``processing`` under the
token the handler got) and ``legacy_held`` (the Event was legacy ``processing`` under it). The proofs
count effects per (event, work type) and path. Behaviour comes from the event body's ``data.mode``:
``ok``, ``fail`` (permanent), ``retry`` (always), ``retry_once``, ``unknown`` (``outcome_unknown``),
``slow`` (sleeps ``CUTOVER_TEST_SLOW_S`` seconds, default 2, or until the file
``CUTOVER_TEST_RELEASE_FILE`` names exists, then succeeds), ``fail_once`` (fails
permanently the first time the work runs, succeeds afterwards, e.g. after a replay).
``CUTOVER_TEST_JITTER_S`` adds a random sleep of up to that long before the effect (work in flight).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

import psycopg

from connector.executor.handlers import HandlerContext, Outcome

EFFECT_TABLE = """
CREATE TABLE IF NOT EXISTS cutover_test_effect (
  seq bigserial PRIMARY KEY,
  event_id bigint NOT NULL,
  work_type text NOT NULL,
  attempt int NOT NULL,
  pid int NOT NULL,
  wi_held boolean NOT NULL,
  legacy_held boolean NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  token bigint,
  path text
)
"""

_EFFECT = """
INSERT INTO cutover_test_effect (event_id, work_type, attempt, pid, token, path, wi_held, legacy_held)
SELECT %(event)s, %(wt)s, %(attempt)s, %(pid)s, %(token)s, %(path)s,
  EXISTS (SELECT 1 FROM connector_work_item WHERE work_id = %(work)s AND lease_token = %(token)s
          AND state = 'processing'),
  EXISTS (SELECT 1 FROM connector_event WHERE event_id = %(event)s AND legacy_lease_token = %(token)s
          AND legacy_state = 'processing')
"""

_conn: psycopg.AsyncConnection[Any] | None = None
_conn_url = ""
_lock: asyncio.Lock | None = None


async def _record(ctx: HandlerContext) -> int:
    """Record the effect; how many effects this (event, work type) has now."""
    global _conn, _conn_url, _lock
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        url = os.environ["CONNECTOR_DATABASE_URL"]
        if _conn is None or _conn.closed or _conn.broken or _conn_url != url:
            # One connection per test database (in-process tests use one database after another).
            if _conn is not None and not _conn.closed:
                await _conn.close()
            _conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            _conn_url = url
        await _conn.execute(
            _EFFECT,
            {
                "event": ctx.event_id,
                "wt": ctx.work_type,
                "attempt": ctx.attempt,
                "pid": os.getpid(),
                "work": ctx.work_id,
                "token": ctx.lease_token,
                "path": os.environ.get("CUTOVER_TEST_PATH"),
            },
        )
        cur = await _conn.execute(
            "SELECT count(*) FROM cutover_test_effect WHERE event_id = %s AND work_type = %s",
            (ctx.event_id, ctx.work_type),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def handle(ctx: HandlerContext) -> Outcome | None:
    doc = json.loads(ctx.payload or b"{}")
    mode = str(doc.get("data", {}).get("mode", "ok"))
    if mode == "slow":
        release = os.environ.get("CUTOVER_TEST_RELEASE_FILE")
        if release:  # held until the test says so (a state, not a time): at most 10 minutes
            for _ in range(30_000):
                if os.path.exists(release):
                    break
                await asyncio.sleep(0.02)
        else:
            await asyncio.sleep(float(os.environ.get("CUTOVER_TEST_SLOW_S", "2")))
    jitter = float(os.environ.get("CUTOVER_TEST_JITTER_S", "0"))
    if jitter:
        await asyncio.sleep(random.uniform(0, jitter))
    runs = await _record(ctx)
    if mode == "fail" or (mode == "fail_once" and runs == 1):
        return Outcome.fail("permanent_test", "the test handler failed permanently")
    if mode == "retry":
        return Outcome.retry(0.05, "retry_test", "the test handler asked for a retry")
    if mode == "retry_once" and ctx.attempt == 1:
        return Outcome.retry(0.05, "retry_test", "first attempt retries")
    if mode == "unknown":
        return Outcome.fail("outcome_unknown", "the remote call timed out after sending")
    return None
