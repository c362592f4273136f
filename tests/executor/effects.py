"""Test handlers, importable by executor processes started from the tests (``tests.executor.effects``).

``record`` (async) and ``record_sync`` write one *effect* per execution into ``executor_test_effect``:
the work id, the lease token the handler was given, the process id, and whether the effect was
*accepted* — i.e. whether, at the moment of the effect, the WorkItem row was still ``processing``
under that very token (a fenced sink: a stale holder's effect is recorded but rejected). The proofs
then check that every item has exactly one accepted effect.

Behaviour per item is driven by the item's event ``source_object_kind`` (``obj`` = plain) and the
environment:

* ``EXECUTOR_TEST_SLEEP_S``: seconds each execution sleeps before its effect (default 0);
* ``EXECUTOR_TEST_SLEEP_JITTER_S``: an extra random sleep in [0, jitter);
* ``EXECUTOR_TEST_FAIL_FIRST_MOD``: items with ``work_id % mod == 0`` fail their first attempt
  (a retry with a short delay) — lanes must hold their order through retries;
* ``EXECUTOR_TEST_HOLD_AFTER``: ``record`` runs this many executions in the process; every later one
  records its start and then never finishes (a process that holds claimed items until it is killed,
  whatever the machine's speed).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from typing import Any

import psycopg

from connector.executor.handlers import HandlerContext, Outcome, PermanentError, work_handler

EFFECT_TABLE = """
CREATE TABLE IF NOT EXISTS executor_test_effect (
  seq bigserial PRIMARY KEY,
  work_id bigint NOT NULL,
  token bigint NOT NULL,
  pid int NOT NULL,
  phase text NOT NULL,
  accepted boolean NOT NULL,
  wall double precision NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_EFFECT = """
INSERT INTO executor_test_effect (work_id, token, pid, phase, wall, accepted)
SELECT %(id)s, %(token)s, %(pid)s, %(phase)s, %(wall)s, EXISTS (
  SELECT 1 FROM connector_work_item
  WHERE work_id = %(id)s AND lease_token = %(token)s AND state = 'processing')
"""

_conn: psycopg.AsyncConnection[Any] | None = None
_lock: asyncio.Lock | None = None
_sync_local: dict[int, psycopg.Connection[Any]] = {}
_started = 0


def _env_f(name: str) -> float:
    return float(os.environ.get(name, "0") or 0)


async def _aconn() -> psycopg.AsyncConnection[Any]:
    global _conn, _lock
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        if _conn is None or _conn.closed:
            url = os.environ["CONNECTOR_DATABASE_URL"]
            _conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return _conn


async def _effect(ctx: HandlerContext, phase: str) -> None:
    conn = await _aconn()
    assert _lock is not None
    async with _lock:  # one connection shared by the workers of this process
        await conn.execute(
            _EFFECT,
            {
                "id": ctx.work_id,
                "token": ctx.lease_token,
                "pid": os.getpid(),
                "phase": phase,
                "wall": time.time(),
            },
        )


def _sync_effect(ctx: HandlerContext, phase: str) -> None:
    import threading

    key = threading.get_ident()
    conn = _sync_local.get(key)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["CONNECTOR_DATABASE_URL"], autocommit=True)
        _sync_local[key] = conn
    conn.execute(
        _EFFECT,
        {
            "id": ctx.work_id,
            "token": ctx.lease_token,
            "pid": os.getpid(),
            "phase": phase,
            "wall": time.time(),
        },
    )


def _fails_first(ctx: HandlerContext) -> bool:
    mod = int(_env_f("EXECUTOR_TEST_FAIL_FIRST_MOD"))
    return mod > 0 and ctx.work_id % mod == 0 and ctx.attempt == 1


@work_handler(needs_event=False)
async def record(ctx: HandlerContext) -> Outcome | None:
    """Start marker, optional sleep, effect; optionally fail the first attempt of some items."""
    global _started
    await _effect(ctx, "start")
    _started += 1
    hold = int(_env_f("EXECUTOR_TEST_HOLD_AFTER"))
    if hold and _started > hold:
        await asyncio.Event().wait()  # held: only the process's death ends this execution
    sleep = _env_f("EXECUTOR_TEST_SLEEP_S") + random.random() * _env_f("EXECUTOR_TEST_SLEEP_JITTER_S")
    if sleep:
        await asyncio.sleep(sleep)
    if _fails_first(ctx):
        await _effect(ctx, "failed")
        return Outcome.retry(0.05, "test_first_attempt")
    await _effect(ctx, "end")
    return None


@work_handler(needs_event=False)
def record_sync(ctx: HandlerContext) -> Outcome | None:
    """Like ``record`` but synchronous (runs on the handler thread pool; cannot be interrupted)."""
    _sync_effect(ctx, "start")
    sleep = _env_f("EXECUTOR_TEST_SLEEP_S") + random.random() * _env_f("EXECUTOR_TEST_SLEEP_JITTER_S")
    if sleep:
        time.sleep(sleep)
    _sync_effect(ctx, "end")
    return None


@work_handler(needs_event=False)
async def noop(ctx: HandlerContext) -> None:
    return None


@work_handler(needs_event=False)
def noop_sync(ctx: HandlerContext) -> None:
    return None


async def noop_with_event(ctx: HandlerContext) -> None:
    """A no-op that takes the event fact and payload (the executor reads them for it)."""
    assert ctx.event is not None and ctx.payload is not None
    return None


# In-process tests read what handlers saw through this list (work_id, token, attempt, extras).
SEEN: list[tuple[Any, ...]] = []


async def capture(ctx: HandlerContext) -> None:
    SEEN.append(
        (
            ctx.work_id,
            ctx.lease_token,
            ctx.attempt,
            ctx.idempotency_key,
            ctx.event.source_object_id if ctx.event else None,
            ctx.payload,
            ctx.content_type,
        )
    )


@work_handler(needs_event=False)
async def retry_then_succeed(ctx: HandlerContext) -> Outcome | None:
    SEEN.append((ctx.work_id, ctx.attempt))
    if ctx.attempt < 3:
        return Outcome.retry(0.01)
    return None


@work_handler(needs_event=False)
async def always_retry(ctx: HandlerContext) -> Outcome:
    SEEN.append((ctx.work_id, ctx.attempt))
    return Outcome.retry(0.0, "always")


@work_handler(needs_event=False)
async def permanent(ctx: HandlerContext) -> Outcome:
    return Outcome.fail("validation", "field x is not valid")


@work_handler(needs_event=False)
async def raises_permanent(ctx: HandlerContext) -> None:
    raise PermanentError("upstream refused the object", failure_class="refused")


async def raises(ctx: HandlerContext) -> None:
    """Echoes part of the payload and a secret in its message: the summary must keep neither."""
    raise ValueError(f"cannot handle {ctx.payload!r} with password=hunter2 Bearer abc.def.ghi")


@work_handler(needs_event=False)
async def sleeps_forever(ctx: HandlerContext) -> None:
    SEEN.append((ctx.work_id, ctx.attempt))
    await asyncio.sleep(3600)


@work_handler(needs_event=False)
async def sleeps_first_attempt(ctx: HandlerContext) -> None:
    """The first attempt never ends (only its process's death does); any later one succeeds."""
    SEEN.append((ctx.work_id, ctx.attempt))
    if ctx.attempt == 1:
        await asyncio.Event().wait()


#: ``held`` handlers wait for this (set by the test; a fresh one per test: ``held_reset``).
HELD_RELEASE: asyncio.Event | None = None


def held_reset() -> asyncio.Event:
    global HELD_RELEASE
    HELD_RELEASE = asyncio.Event()
    return HELD_RELEASE


@work_handler(needs_event=False)
async def held(ctx: HandlerContext) -> None:
    """Runs until the test releases it (``held_reset().set()``): a slot in use, on the test's word."""
    SEEN.append((ctx.work_id, ctx.attempt))
    assert HELD_RELEASE is not None
    await HELD_RELEASE.wait()


DEBOUNCE_TABLE = """
CREATE TABLE IF NOT EXISTS executor_test_debounce (
  seq bigserial PRIMARY KEY,
  work_id bigint NOT NULL,
  token bigint NOT NULL,
  attempt int NOT NULL,
  covered bigint[] NOT NULL,
  covered_events bigint[] NOT NULL,
  phase text NOT NULL,
  pid int NOT NULL,
  accepted boolean NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_DEBOUNCE_EFFECT = """
INSERT INTO executor_test_debounce (work_id, token, attempt, covered, covered_events, phase, pid, accepted)
SELECT %(id)s, %(token)s, %(attempt)s, %(covered)s, %(events)s, %(phase)s, %(pid)s, EXISTS (
  SELECT 1 FROM connector_work_item
  WHERE work_id = %(id)s AND lease_token = %(token)s AND state = 'processing')
"""


@work_handler(needs_event=False)
async def record_debounce(ctx: HandlerContext) -> Outcome | None:
    """Rows per execution of a debounced item: ``start`` when called, then what it covers
    (``ctx.coalesced_*``, in both rows) and whether it succeeded (``ok``) or failed its first
    attempt (``fail``: items with ``work_id % mod == 0`` under ``EXECUTOR_TEST_FAIL_FIRST_MOD``,
    after ``EXECUTOR_TEST_FAIL_SLEEP_S``; the others sleep ``EXECUTOR_TEST_SLEEP_S`` + jitter).
    ``EXECUTOR_TEST_HOLD_AFTER`` holds executions as ``record`` does."""
    global _started
    await _debounce_effect(ctx, "start")
    _started += 1
    hold = int(_env_f("EXECUTOR_TEST_HOLD_AFTER"))
    if hold and _started > hold:
        await asyncio.Event().wait()  # held: only the process's death ends this execution
    failing = _fails_first(ctx)
    sleep = (
        _env_f("EXECUTOR_TEST_FAIL_SLEEP_S")
        if failing
        else _env_f("EXECUTOR_TEST_SLEEP_S") + random.random() * _env_f("EXECUTOR_TEST_SLEEP_JITTER_S")
    )
    if sleep:
        await asyncio.sleep(sleep)
    await _debounce_effect(ctx, "fail" if failing else "ok")
    return Outcome.retry(0.05, "test_first_attempt") if failing else None


async def _debounce_effect(ctx: HandlerContext, phase: str) -> None:
    conn = await _aconn()
    assert _lock is not None
    async with _lock:
        await conn.execute(
            _DEBOUNCE_EFFECT,
            {
                "id": ctx.work_id,
                "token": ctx.lease_token,
                "attempt": ctx.attempt,
                "covered": list(ctx.coalesced_work_ids),
                "events": list(ctx.coalesced_event_ids),
                "phase": phase,
                "pid": os.getpid(),
            },
        )


def hold_then_sink(ctx: HandlerContext) -> None:
    """Sync (a thread: the executor cannot cancel it, so its finalize is always sent, however late):
    appends ``start`` to the file ``EXECUTOR_TEST_SINK`` — outside the database, so a failover
    cannot lose it —, waits until the file ``EXECUTOR_TEST_RELEASE`` exists, then appends its
    ``effect``: JSON lines with the pid, work id, token, idempotency key, the delivery's marker (the
    event's ``source_object_id``), the phase and the wall time
    (tests/executor/test_failover_identity.py)."""
    assert ctx.event is not None

    def note(phase: str) -> None:
        assert ctx.event is not None
        line = {
            "pid": os.getpid(),
            "work_id": ctx.work_id,
            "token": ctx.lease_token,
            "key": ctx.idempotency_key,
            "marker": ctx.event.source_object_id,
            "phase": phase,
            "wall": time.time(),
        }
        with open(os.environ["EXECUTOR_TEST_SINK"], "a") as f:
            f.write(json.dumps(line) + "\n")

    note("start")
    release = os.environ["EXECUTOR_TEST_RELEASE"]
    while not os.path.exists(release):
        time.sleep(0.02)
    note("effect")


@work_handler(needs_event=False)
async def sleep_and_sink(ctx: HandlerContext) -> None:
    """Async: appends ``start`` to the file ``EXECUTOR_TEST_SINK``, sleeps ``EXECUTOR_TEST_SLEEP_S``,
    appends ``end`` — or ``cancelled`` when the executor cancels the call — with the pid, work id and
    wall time (a sink outside the database: tests/executor/test_lease_partition.py)."""

    def note(phase: str) -> None:
        line = {"pid": os.getpid(), "work_id": ctx.work_id, "phase": phase, "wall": time.time()}
        with open(os.environ["EXECUTOR_TEST_SINK"], "a") as f:
            f.write(json.dumps(line) + "\n")

    note("start")
    try:
        await asyncio.sleep(_env_f("EXECUTOR_TEST_SLEEP_S"))
    except asyncio.CancelledError:
        note("cancelled")
        raise
    note("end")
