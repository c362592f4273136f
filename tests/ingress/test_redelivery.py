"""A route's redelivery contract (docs/reconcile.md): answers that are not a durable acceptance are
counted per route with the contract's mode, so ``ConnectorDeliveriesRefusedWithoutRedelivery`` can
fire for routes whose sender never sends them again; a route whose sender retries is counted under
``provider_retries`` (the control: the same outage, another label)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import pytest_asyncio
import stripe

from connector.common.packs.reconcile import effective_redelivery
from connector.ingress.metrics import REGISTRY

from .conftest import NAMESPACE, SECRETS, StartIngress, github_headers, install_routes, post
from .proxy import TcpProxy

ROUTES = [
    # preset github: manual (GitHub never redelivers by itself)
    {
        "key": "github",
        "verification": {"preset": "github", "secrets": [{"env": "INGRESS_T_GITHUB"}]},
        "idempotency_header": "X-GitHub-Delivery",
    },
    # preset stripe: provider_retries for 3 days
    {
        "key": "stripe",
        "verification": {"preset": "stripe", "secrets": [{"env": "INGRESS_T_STRIPE"}]},
        "extract": {"delivery_id": {"pointer": "/id"}},
    },
    # no preset, nothing declared: none (the runtime never assumes a retry)
    {"key": "open", "verification": {"scheme": "none"}},
    # declared, overriding the preset's
    {
        "key": "stripe-declared",
        "verification": {"preset": "stripe", "secrets": [{"env": "INGRESS_T_STRIPE"}]},
        "redelivery": "none",
    },
]


def refused(route: str, redelivery: str) -> float:
    value = REGISTRY.get_sample_value(
        "connector_ingress_route_refused_total",
        {"namespace": NAMESPACE, "route": route, "redelivery": redelivery},
    )
    assert value is not None, f"{route}/{redelivery} has no series (it must start at 0)"
    return value


@pytest_asyncio.fixture
async def proxy(db_url: str) -> AsyncIterator[TcpProxy]:
    parts = urlsplit(db_url)
    p = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await p.start()
    yield p
    await p.cut()


def test_the_effective_contract_of_a_route() -> None:
    assert effective_redelivery(ROUTES[0]) == {"mode": "manual", "for_s": 3 * 86400.0}
    assert effective_redelivery(ROUTES[1]) == {"mode": "provider_retries", "for_s": 3 * 86400.0}
    assert effective_redelivery(ROUTES[2]) == {"mode": "none", "for_s": None}
    assert effective_redelivery({**ROUTES[1], "redelivery": {"mode": "none"}})["mode"] == "none"
    assert effective_redelivery({**ROUTES[2], "redelivery": {"preset": "shopify"}}) == {
        "mode": "provider_retries",
        "for_s": 4 * 3600.0,
    }


async def test_answers_while_the_database_is_down_are_counted_by_contract(
    start_ingress: StartIngress, db_url: str, proxy: TcpProxy, http: aiohttp.ClientSession
) -> None:
    install_routes(db_url, ROUTES)
    svc = await start_ingress(install=False, url=proxy.url(db_url), reconcile_enabled=False)
    before = {
        "github": refused("github", "manual"),
        "stripe": refused("stripe", "provider_retries"),
        "open": refused("open", "none"),
        "stripe-declared": refused("stripe-declared", "none"),
    }
    # Accepted deliveries count nothing.
    body = b'{"id":"evt_1"}'
    assert (await post(http, svc, "github", body, github_headers(body, delivery="ok-1"))).status == 200
    assert (await post(http, svc, "open", body)).status == 200
    assert refused("github", "manual") == before["github"]
    await proxy.cut()
    for n in range(3):
        body = b'{"id":"evt_down_%d"}' % n
        assert (
            await post(http, svc, "github", body, github_headers(body, delivery=f"down-{n}"))
        ).status == 503
        stripe_sig = stripe.WebhookSignature.generate_signature_header(
            body.decode(), SECRETS["INGRESS_T_STRIPE"]
        )
        for route in ("stripe", "stripe-declared"):
            assert (await post(http, svc, route, body, {"Stripe-Signature": stripe_sig})).status == 503
        assert (await post(http, svc, "open", body)).status == 503
    assert refused("github", "manual") == before["github"] + 3
    assert refused("open", "none") == before["open"] + 3
    assert refused("stripe-declared", "none") == before["stripe-declared"] + 3
    # Control: the sender that retries is counted apart (the alert leaves it out).
    assert refused("stripe", "provider_retries") == before["stripe"] + 3
    contract = REGISTRY.get_sample_value(
        "connector_ingress_route_contract",
        {"namespace": NAMESPACE, "route": "github", "redelivery": "manual", "reconcile": "false"},
    )
    assert contract == 1.0
    # A refusal that is no lost delivery (a bad signature) is not counted.
    await proxy.restore()
    github = refused("github", "manual")
    answer = await post(http, svc, "github", b'{"x":1}', github_headers(b'{"x":2}', delivery="forged"))
    assert answer.status == 401
    assert refused("github", "manual") == github
