"""Failure paths: the database dies or stalls mid-request, the pool saturates, a namespace floods.

Never a success answer without a committed row; never a partial row; the failure answer is the
route's failure status (503 + Retry-After by default), and a retry of the same delivery converges
to exactly one receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import psycopg
import pytest_asyncio

from connector.ingress.service import IngressService

from .conftest import StartIngress, github_headers, post, receipt_count, receipts
from .proxy import TcpProxy

INGRESS_WAITING_ON_LOCK = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'connector-ingress' AND wait_event_type = 'Lock'
"""


async def wait_until(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll an observable condition (there is no push signal for "a backend waits on a lock")."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def table_lock(db_url: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """A connection holding ACCESS EXCLUSIVE on the receipt table until it rolls back."""
    conn = await psycopg.AsyncConnection.connect(db_url)
    await conn.execute("LOCK TABLE connector_ingress_receipt IN ACCESS EXCLUSIVE MODE")
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            await conn.rollback()
        await conn.close()


async def ingress_lock_waiters(db_url: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(INGRESS_WAITING_ON_LOCK)
        return [r[0] for r in await cur.fetchall()]


async def _has_waiter(db_url: str) -> bool:
    return bool(await ingress_lock_waiters(db_url))


def delivery(n: int) -> tuple[bytes, dict[str, str]]:
    body = b'{"n":%d}' % n
    return body, github_headers(body, delivery=f"fail-{n}")


async def test_database_backend_killed_mid_request_no_success_no_row(
    ingress: IngressService, http: aiohttp.ClientSession, db_url: str, table_lock: psycopg.AsyncConnection
) -> None:
    body, headers = delivery(1)
    pending = asyncio.create_task(post(http, ingress, "github", body, headers))
    await wait_until(lambda: _has_waiter(db_url))  # the receipt insert is in flight, blocked
    [pid] = await ingress_lock_waiters(db_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    answer = await pending
    await table_lock.rollback()
    assert (answer.status, answer.body["error"], answer.headers.get("Retry-After")) == (
        503,
        "db_unavailable",
        "5",
    )
    assert receipt_count(db_url) == 0
    # The provider retries: the pool replaced the dead connection, the delivery lands exactly once.
    retry = await post(http, ingress, "github", body, headers)
    assert (retry.status, retry.body["duplicate"]) == (200, False)
    assert receipt_count(db_url) == 1


async def test_database_unreachable_answers_503_and_recovers(
    start_ingress: StartIngress, http: aiohttp.ClientSession, db_url: str
) -> None:
    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()
    ingress = await start_ingress(url=proxy.url(db_url), pool_timeout_s=0.5)
    ready = f"http://127.0.0.1:{ingress.http_port}/readyz"
    body, headers = delivery(2)
    assert (await post(http, ingress, "github", body, headers)).status == 200
    await proxy.cut()
    try:
        for n in (3, 4):
            b, h = delivery(n)
            answer = await post(http, ingress, "github", b, h)
            assert answer.status == 503 and answer.headers.get("Retry-After") == "5"
            assert answer.body["error"] in ("db_unavailable", "pool_timeout")
        async with http.get(ready) as r:
            assert r.status == 503
    finally:
        await proxy.restore()

    async def is_ready() -> bool:
        async with http.get(ready) as r:
            return r.status == 200

    await wait_until(is_ready, timeout=20)
    b, h = delivery(3)
    assert (await post(http, ingress, "github", b, h)).status == 200
    assert [r["provider_delivery_id"] for r in receipts(db_url)] == ["fail-2", "fail-3"]


async def test_connection_cut_while_committing_never_answers_success_and_a_retry_converges(
    start_ingress: StartIngress, http: aiohttp.ClientSession, db_url: str, table_lock: psycopg.AsyncConnection
) -> None:
    """Cut between the ingress and the database while the insert is in flight: the outcome of that
    commit is unknown to the ingress, so it must not answer success; the provider's retry is then
    answered from whatever the database holds, and there is exactly one receipt."""
    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()
    ingress = await start_ingress(url=proxy.url(db_url), pool_timeout_s=0.5)
    body, headers = delivery(5)
    pending = asyncio.create_task(post(http, ingress, "github", body, headers))
    await wait_until(lambda: _has_waiter(db_url))
    await proxy.cut()
    answer = await pending
    assert answer.status == 503 and answer.body["error"] == "db_unavailable"
    await table_lock.rollback()  # the orphaned backend may now finish its statement, or not
    await proxy.restore()
    deadline = time.monotonic() + 20
    while True:
        retry = await post(http, ingress, "github", body, headers)
        if retry.status == 200 or time.monotonic() > deadline:
            break
        assert retry.status == 503
        await asyncio.sleep(0.1)
    assert retry.status == 200
    assert receipt_count(db_url) == 1


async def test_pool_saturated_answers_503_without_writing(
    start_ingress: StartIngress, http: aiohttp.ClientSession, db_url: str
) -> None:
    ingress = await start_ingress(pool_min_size=1, pool_max_size=1, pool_timeout_s=0.3)
    assert ingress.pool is not None
    held = await ingress.pool.getconn()  # the ingress pool's only connection is busy elsewhere
    try:
        body, headers = delivery(6)
        answer = await post(http, ingress, "github", body, headers)
        assert (answer.status, answer.body["error"], answer.headers.get("Retry-After")) == (
            503,
            "pool_timeout",
            "5",
        )
        assert receipt_count(db_url) == 0
    finally:
        await ingress.pool.putconn(held)
    assert (await post(http, ingress, "github", body, headers)).status == 200


async def test_full_commit_queue_sheds_load_and_stale_queue_entries_are_not_written(
    start_ingress: StartIngress, http: aiohttp.ClientSession, db_url: str, table_lock: psycopg.AsyncConnection
) -> None:
    ingress = await start_ingress(group_commit_writers=1, group_commit_max_queue=1, pool_timeout_s=0.3)
    assert ingress.writer is not None
    writer = ingress.writer
    first = asyncio.create_task(post(http, ingress, "github", *delivery(7)))
    await wait_until(lambda: _has_waiter(db_url))  # the only writer is blocked in the database

    async def queued() -> bool:
        return writer.depth == 1

    second = asyncio.create_task(post(http, ingress, "github", *delivery(8)))
    await wait_until(queued)
    third = await post(http, ingress, "github", *delivery(9))
    assert (third.status, third.body["error"], third.headers.get("Retry-After")) == (503, "overloaded", "5")
    await asyncio.sleep(0.4)  # the condition under test: the second delivery outwaits queue_timeout_s
    await table_lock.rollback()
    assert (await first).status == 200
    late = await second
    assert (late.status, late.body["error"]) == (503, "overloaded")
    assert [r["provider_delivery_id"] for r in receipts(db_url)] == ["fail-7"]


async def test_namespace_admission_limit_answers_429(
    start_ingress: StartIngress, http: aiohttp.ClientSession, db_url: str, table_lock: psycopg.AsyncConnection
) -> None:
    ingress = await start_ingress(namespace_max_inflight=1)
    first = asyncio.create_task(post(http, ingress, "github", *delivery(10)))
    await wait_until(lambda: _has_waiter(db_url))
    limited = await post(http, ingress, "github", *delivery(11))
    assert (limited.status, limited.body["error"], limited.headers.get("Retry-After")) == (
        429,
        "namespace_limit",
        "5",
    )
    await table_lock.rollback()
    assert (await first).status == 200
    assert [r["provider_delivery_id"] for r in receipts(db_url)] == ["fail-10"]
    assert (await post(http, ingress, "github", *delivery(11))).status == 200


async def test_stop_answers_in_flight_deliveries_after_their_commit(
    start_ingress: StartIngress, http: aiohttp.ClientSession, db_url: str, table_lock: psycopg.AsyncConnection
) -> None:
    ingress = await start_ingress()
    pending = asyncio.create_task(post(http, ingress, "github", *delivery(12)))
    await wait_until(lambda: _has_waiter(db_url))
    stopping = asyncio.create_task(ingress.stop())
    await asyncio.sleep(0.1)  # let stop() reach the drain (it must not finish while a commit is open)
    assert not stopping.done()
    await table_lock.rollback()
    answer = await pending
    await stopping
    assert answer.status == 200
    assert receipt_count(db_url) == 1
