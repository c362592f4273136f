"""Property: no request built from arbitrary headers and bodies yields a 5xx or a row.

Every route used here verifies signatures, so no generated request can be legitimately accepted;
the properties are that each is refused with a 4xx (never a 5xx, never a hang) and that nothing is
ever written.
"""

from __future__ import annotations

import asyncio
import base64
import time

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.ingress.service import IngressService

from .conftest import NAMESPACE, post, receipt_count

VERIFIED_ROUTES = ["github", "sw", "stripe", "slack", "shopify", "hubspot", "raw"]
HEADER_NAMES = [
    "X-Hub-Signature-256", "X-GitHub-Delivery", "X-GitHub-Event", "webhook-id", "webhook-timestamp",
    "webhook-signature", "Stripe-Signature", "X-Slack-Signature", "X-Slack-Request-Timestamp",
    "X-Shopify-Hmac-Sha256", "X-Shopify-Webhook-Id", "X-HubSpot-Signature-v3",
    "X-HubSpot-Request-Timestamp", "Content-Type", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Other",
]  # fmt: skip

_visible = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_now = int(time.time())
header_value = st.one_of(
    st.text(_visible, max_size=200),
    st.text(st.characters(min_codepoint=0xA0, max_codepoint=0x2FF), max_size=20),
    st.integers(_now - 10**6, _now + 10**6).map(str),
    st.integers(0, 2**64).map(str),
    st.from_regex(r"\A(sha256=|v0=|v1,|t=[0-9]{10},v1=)[0-9a-fA-F+/=]{0,96}\Z"),
    st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
)
_mac = st.binary(min_size=32, max_size=32)
_b64 = _mac.map(lambda b: base64.b64encode(b).decode())
_ts = st.integers(_now - 60, _now + 60)
# Well-formed but unsigned: the right header names, lengths, prefixes and fresh timestamps, so the
# generated requests reach the constant-time comparison instead of failing on syntax.
well_formed = st.one_of(
    st.fixed_dictionaries(
        {
            "X-Hub-Signature-256": _mac.map(lambda b: "sha256=" + b.hex()),
            "X-GitHub-Delivery": st.uuids().map(str),
        }
    ),
    st.fixed_dictionaries(
        {
            "webhook-id": st.text(_visible, min_size=1, max_size=30),
            "webhook-timestamp": _ts.map(str),
            "webhook-signature": st.lists(_b64.map(lambda s: "v1," + s), min_size=1, max_size=3).map(
                " ".join
            ),
        }
    ),
    st.tuples(_ts, _mac).map(lambda t: {"Stripe-Signature": f"t={t[0]},v1={t[1].hex()}"}),
    st.tuples(_ts, _mac).map(
        lambda t: {"X-Slack-Request-Timestamp": str(t[0]), "X-Slack-Signature": "v0=" + t[1].hex()}
    ),
    _b64.map(lambda s: {"X-Shopify-Hmac-Sha256": s}),
    st.tuples(_ts, _b64).map(
        lambda t: {"X-HubSpot-Request-Timestamp": str(t[0] * 1000), "X-HubSpot-Signature-v3": t[1]}
    ),
)
headers = st.one_of(
    st.dictionaries(st.sampled_from(HEADER_NAMES), header_value, max_size=8),
    st.tuples(well_formed, st.dictionaries(st.sampled_from(HEADER_NAMES), header_value, max_size=2)).map(
        lambda t: {**t[1], **t[0]}
    ),
)
bodies = st.one_of(
    st.binary(max_size=1024),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    ).map(lambda v: repr(v).encode()),
    st.sampled_from([b"{}", b'{"type":"x"}', b"[]", b"null"]),
    st.sampled_from([b"{}", b'{"type":"x"}', b"[]", b"null"]),  # valid JSON: weighted up
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from([*VERIFIED_ROUTES, "unknown"]),
    namespace=st.sampled_from([NAMESPACE, NAMESPACE, "other"]),
    method=st.sampled_from(["POST", "POST", "POST", "PUT", "PATCH", "DELETE"]),
    hdrs=headers,
    body=bodies,
)
async def test_no_generated_request_yields_a_5xx_or_a_row(
    ingress: IngressService,
    http: aiohttp.ClientSession,
    db_url: str,
    route: str,
    namespace: str,
    method: str,
    hdrs: dict[str, str],
    body: bytes,
) -> None:
    answer = await post(
        http, ingress, route, body, hdrs, namespace=namespace, method=method, content_type=None
    )
    assert 400 <= answer.status < 500, (answer.status, answer.body)
    assert receipt_count(db_url) == 0


_header_bytes = st.binary(min_size=1, max_size=60).filter(lambda b: b"\r\n" not in b)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from([b"X-GitHub-Delivery", b"X-Hub-Signature-256", b"Content-Type", b"Host"])
    | _header_bytes,
    value=_header_bytes,
    body=st.binary(max_size=64),
)
async def test_raw_header_bytes_never_yield_a_5xx_or_a_row(
    ingress: IngressService, db_url: str, name: bytes, value: bytes, body: bytes
) -> None:
    """Arbitrary bytes in a header line, straight on the socket (no client-side validation)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", ingress.http_port)
    try:
        writer.write(
            b"POST /v1/webhooks/%s/github HTTP/1.1\r\nHost: x\r\n%s: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (NAMESPACE.encode(), name, value, len(body), body)
        )
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status = int(raw[9:12])
    assert 400 <= status < 500, raw[:300]
    assert receipt_count(db_url) == 0
