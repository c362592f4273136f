"""Ingress test fixtures: a real PostgreSQL database, the real service on real ports, and signers.

``db_url`` is overridden here: one migrated database per test *module*, emptied (TRUNCATE … RESTART
IDENTITY) before every test — the same isolation as a fresh copy, without paying a CREATE DATABASE
per test on a shared server. ``ingress`` starts an ``IngressService`` (HTTP + gRPC, its own pool)
with the routes of ``ROUTES`` installed; ``post`` sends one delivery over real HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import psycopg
import pytest
import pytest_asyncio
from multidict import CIMultiDict

from connector.common.core import testdb
from connector.common.core.settings import DatabaseSettings, IngressSettings
from connector.ingress.service import IngressService

from . import packs
from .fake_provider import TOKEN as PROVIDER_TOKEN
from .fake_provider import FakeProvider

NAMESPACE = "shop"

# Secret values by environment variable. The Standard Webhooks key is the spec's example format.
SECRETS = {
    "INGRESS_T_GITHUB": "It's a Secret to Everybody",
    "INGRESS_T_GITHUB_OLD": "an older secret, still accepted during rotation",
    "INGRESS_T_SW": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "INGRESS_T_STRIPE": "whsec_test_stripe_endpoint_secret",
    "INGRESS_T_SLACK": "8f742231b10e8888abcd99yyyzzz85a5",
    "INGRESS_T_SHOPIFY": "shpss_test_shopify_secret",
    "INGRESS_T_HUBSPOT": "hubspot-client-secret-0000",
}


def _secret(env: str) -> dict[str, str]:
    return {"env": env}


ROUTES: list[dict[str, Any]] = [
    {
        "key": "github",
        "verification": {
            "preset": "github",
            "secrets": [_secret("INGRESS_T_GITHUB"), _secret("INGRESS_T_GITHUB_OLD")],
        },
        "idempotency_header": "X-GitHub-Delivery",
        "extract": {"event_kind": {"header": "X-GitHub-Event"}},
        "correlation": {"hook_id": {"header": "X-GitHub-Hook-ID"}, "repo": {"pointer": "/repository/id"}},
    },
    {
        "key": "sw",
        "verification": {"preset": "standard-webhooks", "secrets": [_secret("INGRESS_T_SW")]},
        "idempotency_header": "webhook-id",
        "extract": {"event_kind": {"pointer": "/type"}},
    },
    {
        "key": "stripe",
        "verification": {"preset": "stripe", "secrets": [_secret("INGRESS_T_STRIPE")]},
        "extract": {"delivery_id": {"pointer": "/id"}, "event_kind": {"pointer": "/type"}},
    },
    {
        "key": "slack",
        "content": "any",
        "verification": {"preset": "slack", "secrets": [_secret("INGRESS_T_SLACK")]},
    },
    {
        "key": "shopify",
        "verification": {"preset": "shopify", "secrets": [_secret("INGRESS_T_SHOPIFY")]},
        "idempotency_header": "X-Shopify-Webhook-Id",
        "extract": {"event_kind": {"header": "X-Shopify-Topic"}},
    },
    {
        "key": "hubspot",
        "verification": {"preset": "hubspot-v3", "secrets": [_secret("INGRESS_T_HUBSPOT")]},
    },
    {"key": "open", "verification": {"scheme": "none"}, "response": {"success_status": 202}},
    {"key": "put", "method": "PUT", "verification": {"scheme": "none"}},
    {
        "key": "raw",
        "content": "any",
        "verification": {"preset": "github", "secrets": [_secret("INGRESS_T_GITHUB")]},
    },
]


_TABLES = (
    "connector_ingress_receipt, connector_route, connector_pack_generation, connector_installed_pack, "
    "connector_reconcile_state, connector_reconcile_run"
)


@pytest.fixture(scope="module")
def _module_db() -> Iterator[str]:
    with testdb.fresh_database("connector_ingress_t") as url:
        yield url


@pytest.fixture
def db_url(_module_db: str) -> str:
    """The module's database, empty (overrides the suite's fresh-database-per-test fixture)."""
    with psycopg.connect(_module_db, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {_TABLES} RESTART IDENTITY CASCADE")
    return _module_db


#: The environment variable the reconcile specs' API key references (the fake provider's token).
PROVIDER_TOKEN_ENV = "RECON_T_PROVIDER_TOKEN"


@pytest.fixture(autouse=True)
def _secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(PROVIDER_TOKEN_ENV, PROVIDER_TOKEN)


@pytest_asyncio.fixture
async def provider() -> AsyncIterator[FakeProvider]:
    """A fake sender API on loopback (tests/ingress/fake_provider.py); gates released at the end."""
    fake = FakeProvider()
    await fake.start()
    yield fake
    for gate in fake.gate.values():
        gate.set()
    await fake.stop()


def install_routes(db_url: str, routes: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return packs.install(conn, packs.manifest(NAMESPACE, routes or ROUTES), **kw)


def settings(**overrides: Any) -> IngressSettings:
    base: dict[str, Any] = {
        "http_port": 0,
        "grpc_port": 0,
        "metrics_port": 0,
        "pool_min_size": 1,
        "pool_max_size": 4,
        "pool_timeout_s": 1.0,
        "shutdown_grace_s": 2.0,
    }
    base.update(overrides)
    return IngressSettings(**base)


StartIngress = Callable[..., Awaitable[IngressService]]


@pytest_asyncio.fixture
async def start_ingress(db_url: str) -> AsyncIterator[StartIngress]:
    """Start ingress services (``url=`` overrides the database URL, e.g. through a proxy)."""
    started: list[IngressService] = []

    async def start(*, url: str | None = None, install: bool = True, **overrides: Any) -> IngressService:
        if install and not started:
            install_routes(db_url)
        svc = IngressService(
            DatabaseSettings(), settings(**overrides), url=url or db_url, serve_metrics=False
        )
        await svc.start()
        started.append(svc)
        return svc

    yield start
    for svc in reversed(started):
        await svc.stop()


@pytest_asyncio.fixture
async def ingress(start_ingress: StartIngress) -> IngressService:
    return await start_ingress()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str]


async def post(
    http: aiohttp.ClientSession,
    svc: IngressService,
    route: str,
    body: bytes,
    headers: Mapping[str, str] | None = None,
    *,
    namespace: str = NAMESPACE,
    method: str = "POST",
    content_type: str | None = "application/json",
) -> Answer:
    hdrs: CIMultiDict[str] = CIMultiDict(headers or {})
    if content_type is not None and "Content-Type" not in hdrs:
        hdrs["Content-Type"] = content_type
    url = f"http://127.0.0.1:{svc.http_port}/v1/webhooks/{namespace}/{route}"
    async with http.request(method, url, data=body, headers=hdrs, skip_auto_headers=["Content-Type"]) as r:
        text = await r.read()
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {"raw": text.decode(errors="replace")}
        return Answer(r.status, parsed, dict(r.headers))


def receipts(db_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute("SELECT * FROM connector_ingress_receipt ORDER BY receipt_id")
        return cur.fetchall()


def receipt_count(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM connector_ingress_receipt").fetchone()
        assert row is not None
        return int(row[0])


# --------------------------------------------------------------------------------------------------
# Signers for the documented formats without an official library (the real libraries are used for
# Standard Webhooks and Stripe, in the tests themselves).
# --------------------------------------------------------------------------------------------------


def github_headers(body: bytes, *, secret: str | None = None, delivery: str = "d-1") -> dict[str, str]:
    key = (secret or SECRETS["INGRESS_T_GITHUB"]).encode()
    sig = hmac.new(key, body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={sig}", "X-GitHub-Delivery": delivery, "X-GitHub-Event": "push"}


def slack_headers(body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    base = b"v0:" + ts.encode() + b":" + body
    sig = hmac.new(SECRETS["INGRESS_T_SLACK"].encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={sig}"}


def shopify_headers(body: bytes, *, webhook_id: str = "sh-1") -> dict[str, str]:
    digest = hmac.new(SECRETS["INGRESS_T_SHOPIFY"].encode(), body, hashlib.sha256).digest()
    return {
        "X-Shopify-Hmac-Sha256": base64.b64encode(digest).decode(),
        "X-Shopify-Webhook-Id": webhook_id,
        "X-Shopify-Topic": "orders/create",
    }


def hubspot_headers(method: str, uri: str, body: bytes, *, timestamp_ms: int | None = None) -> dict[str, str]:
    ts = str(int(time.time() * 1000) if timestamp_ms is None else timestamp_ms)
    source = method.encode() + uri.encode() + body + ts.encode()
    digest = hmac.new(SECRETS["INGRESS_T_HUBSPOT"].encode(), source, hashlib.sha256).digest()
    return {"X-HubSpot-Signature-v3": base64.b64encode(digest).decode(), "X-HubSpot-Request-Timestamp": ts}
