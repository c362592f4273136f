"""Reconciliation against a sender's list (docs/reconcile.md), in process: the ingress service on
real ports with its reconciler, a fake sender API on loopback (``fake_provider``: a Stripe-like and a
GitHub-like shape), PostgreSQL through a proxy a test can cut.

Each test has a control that shows it can fail: the same scenario without the mechanism."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import psycopg
import pytest
import pytest_asyncio
import stripe

from connector.ingress.metrics import REGISTRY
from connector.ingress.service import IngressService

from .conftest import (
    NAMESPACE,
    PROVIDER_TOKEN_ENV,
    SECRETS,
    StartIngress,
    github_headers,
    install_routes,
    post,
    receipts,
)
from .fake_provider import TOKEN, FakeProvider, Faults
from .proxy import TcpProxy

TOKEN_ENV = PROVIDER_TOKEN_ENV


async def wait_for(condition: Callable[[], Awaitable[bool] | bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def bearer() -> dict[str, Any]:
    return {"secret": {"env": TOKEN_ENV}, "template": "Bearer {secret}"}


def stripe_route(url: str, **reconcile: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": "pull",
        "interval": "1s",
        "window": "30d",
        "lag": 0,
        "list": {
            "url": f"{url}/v1/events",
            "query": {
                "created[gte]": "{since}",
                "created[lt]": "{until}",
                "limit": "3",
                "starting_after": "{cursor}",
            },
            "headers": {"Authorization": bearer()},
        },
        "items": "/data",
        "item": {"id": "/id", "occurred_at": "/created", "body": ""},
        "paging": {"cursor": "/id", "has_more": "/has_more"},
    }
    spec.update(reconcile)
    return {
        "key": "stripe",
        "verification": {"preset": "stripe", "secrets": [{"env": "INGRESS_T_STRIPE"}]},
        "extract": {"delivery_id": {"pointer": "/id"}, "event_kind": {"pointer": "/type"}},
        "reconcile": spec,
    }


def github_route(url: str, mode: str = "redeliver") -> dict[str, Any]:
    hook = f"{url}/repos/o/r/hooks/1/deliveries"
    spec: dict[str, Any] = {
        "mode": mode,
        "interval": "1s",
        "window": "3d",
        "lag": 0,
        "list": {
            "url": hook,
            "query": {"per_page": "2"},
            "headers": {"Authorization": bearer(), "Accept": "application/vnd.github+json"},
        },
        "item": {"id": "/guid", "occurred_at": "/delivered_at", "headers": {"X-GitHub-Event": "/event"}},
        "paging": {"link": "next"},
    }
    if mode == "redeliver":
        spec["redeliver"] = {
            "method": "POST",
            "url": hook + "/{/id}/attempts",
            "headers": {"Authorization": bearer()},
        }
    else:
        spec["item"]["fetch"] = {
            "url": hook + "/{/id}",
            "body": "/request/payload",
            "headers": {"Authorization": bearer()},
        }
    return {
        "key": "github",
        "verification": {"preset": "github", "secrets": [{"env": "INGRESS_T_GITHUB"}]},
        "idempotency_header": "X-GitHub-Delivery",
        "extract": {"event_kind": {"header": "X-GitHub-Event"}},
        "reconcile": spec,
    }


@pytest_asyncio.fixture
async def proxy(db_url: str) -> AsyncIterator[TcpProxy]:
    from urllib.parse import urlsplit

    parts = urlsplit(db_url)
    p = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await p.start()
    yield p
    await p.cut()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def stripe_post(http: aiohttp.ClientSession, svc: IngressService, event: dict[str, Any]) -> Awaitable[Any]:
    body = json.dumps(event, indent=2).encode()
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRETS["INGRESS_T_STRIPE"])
    return post(http, svc, "stripe", body, {"Stripe-Signature": header})


def by_delivery(db_url: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in receipts(db_url):
        out.setdefault(row["provider_delivery_id"], []).append(row)
    return out


def state(db_url: str, route: str) -> dict[str, Any] | None:
    with psycopg.connect(db_url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute("SELECT * FROM connector_reconcile_state WHERE route_key = %s", (route,))
        return cur.fetchone()


async def start(
    start_ingress: StartIngress, db_url: str, routes: list[dict[str, Any]], *, since_s: float = 0, **kw: Any
) -> IngressService:
    """Install ``routes`` and start the ingress; ``since_s``: the routes were first reconciled that
    long ago (a first pass starts there)."""
    install_routes(db_url, routes)
    if since_s:
        with psycopg.connect(db_url, autocommit=True) as conn:
            for route in routes:
                conn.execute(
                    "INSERT INTO connector_reconcile_state (namespace, route_key, created_at)"
                    " VALUES (%s, %s, now() - make_interval(secs => %s))",
                    (NAMESPACE, route["key"], since_s),
                )
    return await start_ingress(install=False, reconcile_tick_s=0.1, **kw)


# --------------------------------------------------------------------------------------------------


async def test_refused_while_the_database_was_down_are_recovered_once_each(
    start_ingress: StartIngress,
    db_url: str,
    provider: FakeProvider,
    proxy: TcpProxy,
    http: aiohttp.ClientSession,
) -> None:
    svc = await start(start_ingress, db_url, [stripe_route(provider.url)], url=proxy.url(db_url))
    assert svc.reconciler is not None
    await wait_for(lambda: svc.reconciler.passes >= 1)
    delivered = provider.add_event("evt_before", int(time.time()))
    assert (await stripe_post(http, svc, delivered)).status == 200
    await proxy.cut()
    refused = [provider.add_event(f"evt_down_{i}", int(time.time())) for i in range(7)]
    for event in refused:
        answer = await stripe_post(http, svc, event)
        assert answer.status == 503, answer
    await proxy.restore()
    wanted = {"evt_before", *(e["id"] for e in refused)}
    await wait_for(lambda: set(by_delivery(db_url)) == wanted)
    await wait_for(lambda: (state(db_url, "stripe") or {}).get("last_error_class") is None)
    rows = by_delivery(db_url)
    assert all(len(v) == 1 for v in rows.values()), rows
    assert rows["evt_before"][0]["origin"] is None
    for event in refused:
        (row,) = rows[event["id"]]
        assert row["origin"] == "reconciled"
        assert row["event_kind"] == "invoice.paid"
        assert row["verification"] == f"fetched from 127.0.0.1 with key reference env:{TOKEN_ENV}"
        assert json.loads(row["body"]) == event
    # Later passes find nothing more to admit.
    done = svc.reconciler.passes
    await wait_for(lambda: svc.reconciler.passes >= done + 2)
    assert sum(len(v) for v in by_delivery(db_url).values()) == len(wanted)


async def test_control_without_reconcile_the_refused_stay_missing(
    start_ingress: StartIngress,
    db_url: str,
    provider: FakeProvider,
    proxy: TcpProxy,
    http: aiohttp.ClientSession,
) -> None:
    svc = await start(
        start_ingress, db_url, [stripe_route(provider.url)], url=proxy.url(db_url), reconcile_enabled=False
    )
    await proxy.cut()
    event = provider.add_event("evt_lost", int(time.time()))
    assert (await stripe_post(http, svc, event)).status == 503
    await proxy.restore()
    marker = provider.add_event("evt_after", int(time.time()))
    # The pool reconnects on its own time after the restore: post the marker (idempotent, as a
    # sender's retry would be) until the ingress accepts it, then look at what is stored.
    answers: list[int] = []

    async def accepted() -> bool:
        answers.append((await stripe_post(http, svc, marker)).status)
        return answers[-1] == 200

    for _ in range(60):
        if await accepted():
            break
        await asyncio.sleep(0.5)
    assert answers[-1] == 200 and set(answers) <= {200, 503}, answers
    assert set(by_delivery(db_url)) == {"evt_after"}


async def test_a_webhook_racing_the_pass_makes_one_receipt(
    start_ingress: StartIngress, db_url: str, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    now = int(time.time())
    events = [provider.add_event(f"evt_race_{i}", now) for i in range(5)]
    # Hold the pass's first list request until the webhooks are in (they happen "during the pass").
    provider.gate[1] = asyncio.Event()
    provider.gate_reached[1] = asyncio.Event()
    svc = await start(start_ingress, db_url, [stripe_route(provider.url)], since_s=3600)
    await asyncio.wait_for(provider.gate_reached[1].wait(), 20)
    for event in events[:3]:
        assert (await stripe_post(http, svc, event)).status == 200
    provider.gate[1].set()
    await wait_for(lambda: len(by_delivery(db_url)) == 5)
    assert svc.reconciler is not None
    await wait_for(lambda: svc.reconciler.passes >= 2)
    rows = by_delivery(db_url)
    assert all(len(v) == 1 for v in rows.values()), rows
    assert sorted(r[0]["origin"] or "webhook" for r in rows.values()) == ["reconciled"] * 2 + ["webhook"] * 3


async def test_redeliver_mode_asks_once_per_missing_id(
    start_ingress: StartIngress, db_url: str, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    svc = await start(start_ingress, db_url, [github_route(provider.url)])
    assert svc.reconciler is not None
    await wait_for(lambda: svc.reconciler.passes >= 1)
    for i in range(3):  # delivered: their receipts exist, they are never asked for
        body = b'{"n":%d}' % i
        answer = await post(http, svc, "github", body, github_headers(body, delivery=f"guid-ok-{i}"))
        assert answer.status == 200
        provider.add_delivery(200 + i, f"guid-ok-{i}", time.time())
    for i in range(4):
        provider.add_delivery(100 + i, f"guid-lost-{i}", time.time())
    # A failed delivery listed twice (its own retry attempt, same guid) is asked for once.
    provider.add_delivery(150, "guid-lost-0", time.time())
    await wait_for(lambda: len(provider.redelivered) >= 4)
    done = svc.reconciler.passes
    await wait_for(lambda: svc.reconciler.passes >= done + 2)  # later passes ask for nothing more
    guid_of = {str(d["id"]): d["guid"] for d in provider.deliveries}
    asked = sorted(guid_of[i] for i in provider.redelivered)
    assert asked == [f"guid-lost-{i}" for i in range(4)], asked
    # Control: the passes did list the delivered ones (so "never asked for" is a decision).
    assert sum(r.listed for r in svc.reconciler.results) >= 7


@pytest.mark.parametrize(
    ("faults", "error_class"),
    [
        (Faults(statuses=[(500, None)] * 100), "http_5xx"),
        (Faults(statuses=[(429, "600")] * 100), "rate_limited"),
        (Faults(statuses=[(401, None)] * 100), "unauthorized"),
        (Faults(malformed=True), "malformed_json"),
        (Faults(item_without_id=True), "item_without_id"),
        (Faults(repeat_cursor=True), "cursor_loop"),
        (Faults(oversized=2 * 1024 * 1024), "page_too_large"),
        (Faults(stall_s=2.0), "timeout"),
    ],
)
async def test_provider_faults_fail_the_pass_without_moving_the_watermark(
    start_ingress: StartIngress,
    db_url: str,
    provider: FakeProvider,
    faults: Faults,
    error_class: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for i in range(7):
        provider.add_event(f"evt_f_{i}", int(time.time()) - 5)
    provider.faults = faults
    before = errors(error_class)
    svc = await start(
        start_ingress,
        db_url,
        [stripe_route(provider.url, max_page_bytes=1024 * 1024, timeout="0.5s")],
        since_s=3600,
    )
    assert svc.reconciler is not None
    await wait_for(lambda: any(r.error_class for r in svc.reconciler.results))
    failed = next(r for r in svc.reconciler.results if r.error_class)
    assert failed.error_class == error_class
    row = state(db_url, "stripe")
    assert row is not None and row["last_error_class"] == error_class and row["watermark"] is None
    assert TOKEN not in caplog.text
    assert errors(error_class) >= before + 1
    # Only pages verified before the fault were admitted (and checkpointed); none after it.
    assert (
        len(by_delivery(db_url))
        == failed.admitted
        == 3 * (failed.pages if error_class == "cursor_loop" else 0)
    )
    assert (row["pass_cursor"] is not None) == (failed.admitted > 0)


def errors(error_class: str) -> float:
    value = REGISTRY.get_sample_value(
        "connector_reconcile_errors_total", {"namespace": NAMESPACE, "route": "stripe", "class": error_class}
    )
    return value or 0.0


async def test_a_429_retry_after_is_honoured_and_counted(
    start_ingress: StartIngress, db_url: str, provider: FakeProvider
) -> None:
    events = [provider.add_event(f"evt_429_{i}", int(time.time()) - 5) for i in range(4)]
    provider.faults = Faults(statuses=[(429, "1")])
    before = errors("rate_limited")
    svc = await start(start_ingress, db_url, [stripe_route(provider.url)], since_s=3600)
    assert svc.reconciler is not None
    await wait_for(lambda: svc.reconciler.passes >= 1)  # its receipts commit before the pass ends
    first = svc.reconciler.results[0]
    assert first.error_class is None and first.admitted == len(events)
    assert errors("rate_limited") == before + 1
    listed = [r for r in provider.requests if r.path == "/v1/events"]
    assert listed[0].query == listed[1].query  # the same page asked again after the wait


async def test_a_next_page_on_another_host_is_refused(
    start_ingress: StartIngress, db_url: str, provider: FakeProvider
) -> None:
    for i in range(5):  # per_page 2: a second page exists
        provider.add_delivery(300 + i, f"guid-f-{i}", time.time() - 5)
    provider.faults = Faults(foreign_link=True)
    svc = await start(start_ingress, db_url, [github_route(provider.url)], since_s=3600)
    assert svc.reconciler is not None
    await wait_for(lambda: any(r.error_class for r in svc.reconciler.results))
    failed = next(r for r in svc.reconciler.results if r.error_class)
    # Refused before the page counted: nothing asked for, no checkpoint holding the foreign URL.
    assert failed.error_class == "foreign_url" and failed.pages == 0 and failed.redelivered == 0
    assert (state(db_url, "github") or {}).get("pass_cursor") is None
    assert not provider.redelivered
    # Control: the same list with the next page on the sender's own host passes.
    provider.faults = Faults()
    await wait_for(lambda: svc.reconciler.results[-1].error_class is None, timeout=30)
    assert sorted(provider.redelivered) == [str(300 + i) for i in range(5)]


async def test_one_leader_across_ingress_processes_and_a_successor(
    start_ingress: StartIngress, db_url: str, provider: FakeProvider
) -> None:
    first = await start(start_ingress, db_url, [stripe_route(provider.url)], since_s=3600)
    second = await start_ingress(install=False, reconcile_tick_s=0.1)
    a, b = first.reconciler, second.reconciler
    assert a is not None and b is not None
    await wait_for(lambda: a.passes >= 2 or b.passes >= 2)
    leaders = [r for r in (a, b) if r.leader]
    assert len(leaders) == 1, [r.leader for r in (a, b)]  # both try every tick; one holds the lock
    leader, other = (a, b) if a.leader else (b, a)
    assert other.passes == 0
    # The leader's process stops: the other takes over at its next tick and the passes go on.
    await (first if leader is a else second).stop()
    await wait_for(lambda: other.leader and other.passes >= 1)
    provider.add_event("evt_after_failover", int(time.time()) + 1)  # after the watermark (lag 0)
    await wait_for(lambda: "evt_after_failover" in by_delivery(db_url))


async def test_github_shape_pull_mode_fetches_each_missing_body(
    start_ingress: StartIngress, db_url: str, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    svc = await start(start_ingress, db_url, [github_route(provider.url, mode="pull")])
    assert svc.reconciler is not None
    await wait_for(lambda: svc.reconciler.passes >= 1)
    body = b'{"n":1}'
    assert (await post(http, svc, "github", body, github_headers(body, delivery="guid-here"))).status == 200
    provider.add_delivery(500, "guid-here", time.time())
    provider.add_delivery(501, "guid-gone", time.time(), event="pull_request")
    await wait_for(lambda: "guid-gone" in by_delivery(db_url))
    (row,) = by_delivery(db_url)["guid-gone"]
    # The route's own extraction read the mapped header (event kind) and the idempotency header.
    assert row["origin"] == "reconciled" and row["event_kind"] == "pull_request"
    assert row["idempotency_key"] == "github:id:guid-gone"
    assert json.loads(row["body"]) == {"ref": "refs/heads/main", "after": "guid-gone"}
    fetched = [r.path for r in provider.requests if r.path.startswith("/repos/o/r/hooks/1/deliveries/")]
    assert fetched == ["/repos/o/r/hooks/1/deliveries/501"]  # only the missing one was fetched
    assert len(by_delivery(db_url)["guid-here"]) == 1


def test_when_a_route_is_due() -> None:
    from connector.common.store.reconcile import ReconcileState
    from connector.ingress.reconcile.reconciler import RETRY_FAILED_S, Reconciler

    def st(last: float | None, *, cursor: bool = False, error: str | None = None) -> ReconcileState:
        until = 90.0 if cursor else None
        return ReconcileState(
            "ns", "r", None, until and 0.0, until, "c" if cursor else None, last, None, error, 0.0
        )

    due, interval = Reconciler._due, 300.0
    assert due(interval, None, 1000) and due(interval, st(None), 1000)  # never passed
    assert not due(interval, st(900), 1000) and due(interval, st(700), 1000)  # the interval
    assert due(interval, st(990, cursor=True), 1000)  # interrupted: resume at once
    # Failed: again after RETRY_FAILED_S, checkpoint or not (no hammering a failing sender every tick).
    assert not due(interval, st(990, cursor=True, error="http_5xx"), 1000)
    assert due(interval, st(1000 - RETRY_FAILED_S, error="http_5xx"), 1000)
    assert due(10.0, st(989, error="http_5xx"), 1000)  # a shorter interval wins
