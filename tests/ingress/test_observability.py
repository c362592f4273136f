"""Metrics and logs: the documented series exist, and no payload, signature or secret leaks."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from prometheus_client import generate_latest

from connector.common.core.logs import JsonFormatter
from connector.common.core.settings import DatabaseSettings
from connector.ingress.metrics import REGISTRY
from connector.ingress.service import IngressService

from .conftest import SECRETS, StartIngress, github_headers, install_routes, post, settings

PAYLOAD_MARKER = "payload-marker-7f3a9c"


async def test_metrics_endpoint_and_series(http: aiohttp.ClientSession, db_url: str) -> None:
    install_routes(db_url)
    svc = IngressService(DatabaseSettings(), settings(), url=db_url)  # serves /metrics on a free port
    await svc.start()
    try:
        body = b'{"a":1}'
        assert (await post(http, svc, "github", body, github_headers(body, delivery="m-1"))).status == 200
        assert (await post(http, svc, "github", body, github_headers(body, delivery="m-1"))).status == 200
        bad = {**github_headers(body, delivery="m-2"), "X-Hub-Signature-256": "sha256=" + "1" * 64}
        assert (await post(http, svc, "github", body, bad)).status == 401
        async with http.get(f"http://127.0.0.1:{svc.metrics_port}/metrics") as r:
            assert r.status == 200
            text = await r.text()
    finally:
        await svc.stop()
    for series in (
        'connector_ingress_deliveries_total{outcome="accepted",reason="none",transport="http"}',
        'connector_ingress_deliveries_total{outcome="duplicate",reason="none",transport="http"}',
        'connector_ingress_deliveries_total{outcome="rejected",reason="signature_mismatch",transport="http"}',
        "connector_ingress_receipt_commit_seconds_bucket",
        "connector_ingress_group_commit_batch_size_bucket",
        "connector_ingress_ack_seconds_bucket",
        "connector_ingress_commit_queue_depth",
        'connector_db_pool_size{service="ingress"}',
        'connector_db_pool_available{service="ingress"}',
        'connector_db_pool_waiting{service="ingress"}',
    ):
        assert series in text, series


async def test_no_payload_signature_or_secret_in_logs_or_metrics(
    start_ingress: StartIngress,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INGRESS_T_SHOPIFY")  # a route whose secret is missing logs a warning
    caplog.set_level(logging.DEBUG)
    ingress = await start_ingress(pool_min_size=1, pool_max_size=1, pool_timeout_s=0.2)
    body = b'{"secret_field":"%s"}' % PAYLOAD_MARKER.encode()
    good = github_headers(body, delivery="log-1")
    bad = {**good, "X-Hub-Signature-256": "sha256=" + "ab" * 32}
    await post(http, ingress, "github", body, good)
    await post(http, ingress, "github", body, bad)
    await post(http, ingress, "shopify", body, {"X-Shopify-Hmac-Sha256": "c2lnbmF0dXJl"})
    assert ingress.pool is not None
    held = await ingress.pool.getconn()  # a failing commit path logs too
    try:
        assert (
            await post(http, ingress, "github", body, github_headers(body, delivery="log-2"))
        ).status == 503
    finally:
        await ingress.pool.putconn(held)
    # Malformed HTTP is counted, not logged with the offending bytes.
    reader, writer = await asyncio.open_connection("127.0.0.1", ingress.http_port)
    malformed = b"X-Hub-Signature-256: sha256=\x01" + b"cd" * 32
    writer.write(b"POST /v1/webhooks/shop/github HTTP/1.1\r\n" + malformed + b"\r\n\r\n")
    await reader.read()
    writer.close()
    await ingress.stop()

    formatter = JsonFormatter("ingress")
    logged = "\n".join(formatter.format(r) + r.getMessage() for r in caplog.records)
    exported = generate_latest(REGISTRY).decode()
    forbidden = [
        PAYLOAD_MARKER,
        good["X-Hub-Signature-256"].removeprefix("sha256="),
        "ab" * 32,
        "cd" * 32,
        "c2lnbmF0dXJl",
        *SECRETS.values(),
    ]
    for value in forbidden:
        assert value not in logged, value
        assert value not in exported, value
    assert "INGRESS_T_SHOPIFY" in logged  # the reference is named, so an operator can act
    assert any("aiohttp" in r.name for r in caplog.records) is False


@pytest.mark.parametrize("on", [False, True], ids=["service-default", "deliveries-on"])
async def test_one_line_per_accepted_delivery_only_when_asked(
    start_ingress: StartIngress,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    on: bool,
) -> None:
    """``CONNECTOR_LOG_DELIVERIES`` (``logs.DELIVERIES``; ``connector up`` turns it on): one INFO
    line per accepted and per duplicate delivery (receipt id, namespace, route; never the body). The
    service's default writes none: the hot path has no per-delivery line."""
    from connector.common.core import logs

    monkeypatch.setattr(logs, "DELIVERIES", on)
    caplog.set_level(logging.INFO)
    svc = await start_ingress()
    body = b'{"a":"' + PAYLOAD_MARKER.encode() + b'"}'
    first = await post(http, svc, "github", body, github_headers(body, delivery="l-1"))
    await post(http, svc, "github", body, github_headers(body, delivery="l-1"))
    lines = [r for r in caplog.records if r.name == "connector.ingress.deliveries"]
    if not on:
        assert lines == []
        return
    assert [r.getMessage() for r in lines] == ["delivery accepted", "delivery duplicate (already accepted)"]
    assert all(r.receipt_id == first.body["receipt_id"] and r.route == "github" for r in lines)
    assert PAYLOAD_MARKER not in caplog.text
