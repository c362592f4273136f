"""Property over the HTTP path, on a raw socket: for any request, the answer is < 500 (the database
is up) and a row is written only for a 2xx that is not a duplicate — zero rows for every refusal.

The generator mixes what the edge must survive: arbitrary methods and targets (percent-escapes,
raw high bytes), ``Host``/``X-Forwarded-*`` with bytes that are not UTF-8, well-formed signature
headers (so the ``{uri}`` of a HubSpot-style route is actually built), every ``Content-Encoding``
(valid, corrupt, stacked, unknown) over plain, gzip, deflate and corrupted bodies, chunked framing,
and ``Expect``. The ``open`` route (``scheme: none``) accepts, so the row side of the property is
exercised too.

Control (how this test was checked to fail): run against the code before the HTTP edge fixes —
``git archive`` of the parent of the edge commit on ``PYTHONPATH`` — and hypothesis finds the old
500s within its first examples (``Content-Encoding: gzip`` on a body that is not gzip; a non-UTF-8
byte in ``Host`` on the ``hubspot`` route).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import time
import zlib

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from connector.ingress.service import IngressService

from .conftest import NAMESPACE, receipt_count

ROUTES = ["github", "hubspot", "hubspot", "open", "open", "sw", "stripe", "raw", "put", "nope"]
# Header-value bytes: anything but CR/LF (a line break would just be another header line).
_value = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_ascii = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30).map(str.encode)
_high = st.binary(min_size=1, max_size=12).map(lambda b: bytes(0x80 | c for c in b))  # not UTF-8, mostly
_host = st.one_of(
    _ascii,
    _high.map(lambda b: b"h" + b + b".example"),
    st.sampled_from([b"ingress.test", b"h\xffst", b"\xc3\x28", b"", b"a:99999"]),
    _value,
)
_coding = st.sampled_from(
    [None] * 8 + ["gzip", "gzip", "x-gzip", "deflate", "identity", "br", "zstd", "gzip, gzip", "GZIP", "*"]
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
).map(lambda v: json.dumps({"v": v}).encode())
_plain = st.one_of(_json, st.binary(max_size=300), st.sampled_from([b"", b"{}", b"[]", b'{"type":"x"}']))


@st.composite
def _body(draw: st.DrawFn) -> bytes:
    """Plain bytes, or the payload compressed (gzip, zlib, raw deflate), maybe corrupted."""
    plain = draw(_plain)
    kind = draw(st.sampled_from(["plain", "gzip", "zlib", "raw", "gzip-corrupt", "gzip-truncated"]))
    if kind == "plain":
        return plain
    if kind == "zlib":
        return zlib.compress(plain)
    if kind == "raw":
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        return c.compress(plain) + c.flush()
    wire = gzip.compress(plain)
    if kind == "gzip-truncated":
        return wire[: draw(st.integers(0, len(wire)))]
    if kind == "gzip-corrupt":
        at = draw(st.integers(0, len(wire) - 1))
        return wire[:at] + bytes([wire[at] ^ draw(st.integers(1, 255))]) + wire[at + 1 :]
    return wire


@st.composite
def _target(draw: st.DrawFn) -> bytes:
    route = draw(st.sampled_from(ROUTES))
    namespace = draw(st.sampled_from([NAMESPACE] * 12 + ["other", "sh%6Fp", "%FF"]))
    path = f"/v1/webhooks/{namespace}/{route}".encode()
    path = draw(st.sampled_from([path] * 8 + [b"/healthz", b"/v1/webhooks/" + path[13:] + b"/x"]))
    odd = st.sampled_from([b"%", b"%zz", b"%C3%28", b"?q=%FF", b"#frag", b"\x80"])
    junk = draw(st.one_of(st.just(b""), _ascii.map(lambda a: b"?" + a), odd))
    return path + junk


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"POST"] * 24 + [b"PUT", b"GET", b"DELETE", b"PATCH", b"OPTIONS", b"X-Y"]))
    headers: list[bytes] = [b"Host: " + draw(_host)]
    if draw(st.booleans()):
        headers.append(b"X-Forwarded-Host: " + draw(_host))
    if draw(st.integers(0, 3)) == 0:
        headers.append(b"X-Forwarded-Proto: " + draw(st.sampled_from([b"https", b"http, https", b"\xfe"])))
    now = int(time.time())
    if draw(st.booleans()):  # well-formed (unsigned) HubSpot v3 headers: the verifier builds {uri}
        sig = base64.b64encode(draw(st.binary(min_size=32, max_size=32)))
        headers += [b"X-HubSpot-Signature-v3: " + sig, b"X-HubSpot-Request-Timestamp: %d" % (now * 1000)]
    if draw(st.booleans()):
        headers.append(
            b"X-Hub-Signature-256: sha256=" + draw(st.binary(min_size=32, max_size=32)).hex().encode()
        )
    if draw(st.booleans()):
        headers.append(
            b"Content-Type: " + draw(st.sampled_from([b"application/json", b"text/plain"]) | _value)
        )
    coding = draw(_coding)
    if coding is not None:
        headers.append(b"Content-Encoding: " + coding.encode())
    if draw(st.integers(0, 5)) == 0:
        headers.append(b"Expect: 100-continue")
    body = draw(_body())
    if draw(st.integers(0, 4)) == 0:
        split = draw(st.integers(0, len(body)))
        chunks = [c for c in (body[:split], body[split:]) if c]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        headers.append(b"Transfer-Encoding: chunked")
    else:
        framed = body
        headers.append(b"Content-Length: %d" % len(body))
    headers.append(b"Connection: close")
    return method + b" " + draw(_target()) + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + framed


async def _exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        rest = await asyncio.wait_for(reader.read(), 20)
        return head + rest
    finally:
        writer.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(raw=_request())
async def test_any_http_request_is_below_500_and_only_a_fresh_2xx_writes_a_row(
    ingress: IngressService, db_url: str, raw: bytes
) -> None:
    before = receipt_count(db_url)
    answer = await _exchange(ingress.http_port, raw)
    while answer.startswith(b"HTTP/1.1 100 "):  # the interim answer to Expect: 100-continue
        answer = answer.split(b"\r\n\r\n", 1)[1]
    status = int(answer[9:12])
    reason = answer.rsplit(b'"error":"', 1)[-1].split(b'"', 1)[0] if b'"error":"' in answer else b""
    event(f"{status} {reason.decode(errors='replace')}")
    assert 200 <= status < 500, answer[:300]
    written = receipt_count(db_url) - before
    if 200 <= status < 300 and b'"duplicate":false' in answer:
        assert written == 1, answer[:300]
    else:
        assert written == 0, answer[:300]
