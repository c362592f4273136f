"""Handler kinds and outcome classification: python, remote gRPC (a real server), HTTP (a real
server); sanitized summaries; exponential backoff with jitter."""

from __future__ import annotations

import asyncio
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from aiohttp import web

from connector.common.core.grpc_server import GrpcServer
from connector.executor.handlers import (
    EventFact,
    HandlerContext,
    Outcome,
    PermanentError,
    RetryableError,
    backoff_delay,
    classify,
    delivery_key,
    sanitize_summary,
)
from connector.executor.handlers.grpc import GrpcHandler
from connector.executor.handlers.http import HttpHandler, retry_after_s
from connector.executor.handlers.python import HandlerUnavailable, python_handler
from connector.executor.handlers.server import register as register_work_handler

PAYLOAD = b'{"email": "alice@example.com", "customer": "cus_12345", "amount": 42}'


def _ctx(lease_s: float = 30.0) -> HandlerContext:
    row = (7, 3, 1, 1, "default", "sync", 70, 2, 5, "src", None, None)
    ctx = HandlerContext(row, time.monotonic() + lease_s)
    ctx.event = EventFact(
        70, 9, 0, 1, 1, 1, 4, 2, "ns", "customer.updated", "customer", "cus_12345", "dlv-1", 9,
        b"\x01\x02", "ok", {}, {"request_id": "r-1"}, datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    ctx.payload = PAYLOAD
    ctx.content_type = "application/json"
    return ctx


def test_context_basics() -> None:
    ctx = _ctx()
    # From the delivery's identity (namespace, the event's idempotency key, the work type), never the ids.
    assert ctx.idempotency_key == delivery_key("ns", "dlv-1", "sync")
    assert len(ctx.idempotency_key) == 32 and ctx.idempotency_key != delivery_key("ns", "dlv-2", "sync")
    bare = HandlerContext((7, 3, 1, 1, "default", "sync", 70, 2, 5, "src", None, None), time.monotonic())
    with pytest.raises(RuntimeError, match="needs_event=True"):  # a handler that reads no event
        _ = bare.idempotency_key
    assert ctx.work_item.work_id == 7 and ctx.attempt == 2
    assert 29 < ctx.remaining_lease_s() <= 30
    assert "alice" not in repr(ctx)


def test_sanitize_removes_payload_fragments_and_secrets() -> None:
    text = (
        "failed for alice@example.com (customer cus_12345): password=hunter2 "
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig key AKIAABCDEFGHIJKLMNOPQRSTUV"
    )
    out = sanitize_summary(text, PAYLOAD)
    for secret in (
        "alice@example.com",
        "cus_12345",
        "hunter2",
        "eyJhbGciOiJIUzI1NiJ9",
        "AKIAABCDEFGHIJKLMNOPQRSTUV",
    ):
        assert secret not in out
    assert out.startswith("failed for")
    assert len(sanitize_summary("x" * 10_000)) <= 300
    assert "\n" not in sanitize_summary("a\nb\r\nc")


def test_classify() -> None:
    assert classify(PermanentError("nope", failure_class="refused")).kind == "fail"
    out = classify(RetryableError("later", delay_s=3, failure_class="throttled"))
    assert (out.kind, out.delay_s, out.failure_class) == ("retry", 3, "throttled")
    assert classify(TimeoutError()).failure_class == "timeout"
    assert classify(ConnectionResetError()).failure_class == "connection"
    out = classify(ValueError(f"bad {PAYLOAD!r}"), PAYLOAD)
    assert out.kind == "retry" and out.failure_class == "exception"
    assert out.summary.startswith("ValueError: ") and "alice" not in out.summary


def test_backoff_is_exponential_capped_and_jittered() -> None:
    rnd = random.Random(1)
    assert [backoff_delay(a, 1.0, 10.0, 0.0) for a in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 8, 10, 10]
    samples = [backoff_delay(3, 1.0, 100.0, 0.5, rnd) for _ in range(200)]
    assert all(2.0 <= s <= 4.0 for s in samples) and len(set(samples)) > 100


async def test_python_handlers_sync_async_and_unavailable() -> None:
    threads = ThreadPoolExecutor(2)
    try:
        h = python_handler("tests.executor.effects:noop", threads)
        assert h.is_async and not h.needs_event
        assert await h(_ctx()) is None
        hs = python_handler("tests.executor.effects:noop_sync", threads)
        assert not hs.is_async and await hs(_ctx()) is None
        assert python_handler("tests.executor.effects:noop_with_event", threads).needs_event
        for bad in ("no_colon", "tests.executor.nope:fn", "tests.executor.effects:missing"):
            with pytest.raises(HandlerUnavailable):
                python_handler(bad, threads)
    finally:
        threads.shutdown()


async def test_grpc_handler_against_a_real_work_handler_service() -> None:
    seen = []
    covered: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    async def remote(ctx: HandlerContext) -> Outcome | None:
        seen.append(
            (ctx.work_id, ctx.lease_token, ctx.idempotency_key, ctx.payload, ctx.event.source_object_id)
        )
        covered.append((ctx.coalesced_work_ids, ctx.coalesced_event_ids))
        if ctx.work_id == 7:
            return None
        if ctx.work_id == 8:
            return Outcome.retry(2.5, "busy", "come back later")
        if ctx.work_id == 9:
            raise PermanentError("refused")
        await asyncio.sleep(5)  # overruns the deadline
        return None

    server = GrpcServer(port=0)
    register_work_handler(server, remote)
    await server.start()
    client = GrpcHandler(f"127.0.0.1:{server.port}", timeout_s=30)
    try:
        ctx = _ctx()
        ctx.coalesced_work_ids, ctx.coalesced_event_ids = (4, 5), (40, 50)  # a debounced execution
        assert (await client(ctx)).kind == "success"
        assert seen[0] == (7, 3, delivery_key("ns", "dlv-1", "sync"), PAYLOAD, "cus_12345")
        assert covered[0] == ((4, 5), (40, 50))
        ctx.coalesced_work_ids, ctx.coalesced_event_ids = (), ()
        ctx.work_id = 8
        out = await client(ctx)
        assert (out.kind, out.delay_s, out.failure_class) == ("retry", 2.5, "busy")
        ctx.work_id = 9
        out = await client(ctx)
        assert out.kind == "fail" and out.failure_class == "permanent"
        slow = _ctx(lease_s=0.3)  # deadline = the lease time left
        slow.work_id = 10
        t0 = time.monotonic()
        out = await client(slow)
        assert out.kind == "retry" and out.failure_class == "grpc_deadline_exceeded"
        assert time.monotonic() - t0 < 2
        unreachable = GrpcHandler("127.0.0.1:1", timeout_s=1)
        out = await unreachable(_ctx())
        assert out.kind == "retry" and out.failure_class == "grpc_unavailable"
        await unreachable.close()
    finally:
        await client.close()
        await server.stop(0)


async def test_http_handler_statuses_headers_and_retry_after() -> None:
    requests = []

    async def handle(request: web.Request) -> web.Response:
        doc = await request.json()
        requests.append((dict(request.headers), doc))
        status = int(request.query.get("status", "200"))
        headers = {}
        if "retry_after" in request.query:
            headers["Retry-After"] = request.query["retry_after"]
        return web.Response(status=status, text=f"echo {doc['work_item']['work_id']}", headers=headers)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.Response()

    app = web.Application()
    app.router.add_post("/h", handle)
    app.router.add_post("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    clients = []

    async def call(path: str, lease_s: float = 30.0, covered: tuple[int, ...] = ()) -> Outcome:
        h = HttpHandler(base + path, timeout_s=10)
        clients.append(h)
        ctx = _ctx(lease_s)
        ctx.coalesced_work_ids, ctx.coalesced_event_ids = covered, tuple(10 * c for c in covered)
        return await h(ctx)

    try:
        assert (await call("/h")).kind == "success"
        headers, doc = requests[0]
        assert (
            headers["Idempotency-Key"] == delivery_key("ns", "dlv-1", "sync")
            and headers["X-Connector-Lease-Token"] == "3"
        )
        assert doc["work_item"]["work_id"] == 7 and doc["event"]["source_object_id"] == "cus_12345"
        assert json.loads(__import__("base64").b64decode(doc["payload_base64"])) == json.loads(PAYLOAD)
        assert doc["coalesced"] == {"work_ids": [], "event_ids": []}
        assert "X-Connector-Coalesced-Count" not in headers
        assert (await call("/h", covered=(4, 5))).kind == "success"  # a debounced execution
        headers, doc = requests[-1]
        assert doc["coalesced"] == {"work_ids": [4, 5], "event_ids": [40, 50]}
        assert headers["X-Connector-Coalesced-Count"] == "2"
        for status, kind in (
            (500, "retry"),
            (503, "retry"),
            (408, "retry"),
            (429, "retry"),
            (409, "fail"),
            (422, "fail"),
            (404, "fail"),
        ):
            out = await call(f"/h?status={status}")
            assert (out.kind, out.failure_class) == (kind, f"http_{status}"), status
        out = await call("/h?status=429&retry_after=7")
        assert out.delay_s == 7
        t0 = time.monotonic()
        out = await call("/slow", lease_s=0.3)
        assert (out.kind, out.failure_class) == ("retry", "http_timeout") and time.monotonic() - t0 < 2
    finally:
        for h in clients:
            await h.close()
        await runner.cleanup()


def test_retry_after_http_date_uses_the_servers_date_not_ours() -> None:
    headers = {"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT", "Date": "Wed, 21 Oct 2015 07:28:00 GMT"}
    assert retry_after_s(headers) == 30
    assert retry_after_s({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"}) is None
    assert retry_after_s({"Retry-After": "120"}) == 120
    assert retry_after_s({}) is None
