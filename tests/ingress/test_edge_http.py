"""The HTTP edge against hostile clients, over a real port (docs/ingress.md, "Defences").

Every case talks to a real ``IngressService`` through a raw socket (no client-side validation) and
checks the answer, that nothing was written, and — where the answer comes before the whole body —
that the connection is closed instead of read on. Timeouts are set short here and waited for by
their signal (the server closing the socket, a 408), with generous upper bounds, never by sleeps.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import time
import zlib
from typing import Any

import pytest

from connector.ingress import http as edge
from connector.ingress.admission import BODY_TOO_LARGE
from connector.ingress.metrics import REGISTRY
from connector.ingress.service import IngressService

from .conftest import NAMESPACE, StartIngress, github_headers, receipt_count, receipts

GITHUB = f"/v1/webhooks/{NAMESPACE}/github"
WAIT = 20.0  # upper bound for anything the server must do by itself (a timeout, a close)


def metric(outcome: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "connector_ingress_deliveries_total", {"transport": "http", "outcome": outcome, "reason": reason}
    )
    return value or 0.0


class Conn:
    """One raw client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """One response: status, headers (lower-case names), body."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), WAIT)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await asyncio.wait_for(self.reader.readexactly(int(headers.get("content-length", "0"))), WAIT)
        return int(lines[0][9:12]), headers, body

    async def closed_by_server(self) -> bool:
        """True once the server closed the connection (EOF or reset), waiting for it."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), WAIT):
                pass
        except (ConnectionError, OSError):
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.writer.close()


def request(
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    method: str = "POST",
    content_length: int | None = None,
    extra: bytes = b"",
) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: ingress.test\r\n".encode()
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n".encode()
    length = len(body) if content_length is None else content_length
    return head + extra + b"Content-Length: %d\r\n\r\n" % length + body


def signed(body: bytes, delivery: str = "edge-1", **extra: str) -> dict[str, str]:
    return {**github_headers(body, delivery=delivery), "Content-Type": "application/json", **extra}


def bomb(inflated: int = 1 << 30, chunk: int = 1 << 20) -> bytes:
    """gzip of ``inflated`` zero bytes (1 GiB -> ~1 MiB), built incrementally."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(chunk)
    parts = [z.compress(zeros) for _ in range(inflated // chunk)]
    parts.append(z.flush())
    return b"".join(parts)


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    return bomb()


# -- compressed bodies ------------------------------------------------------------------------------------


async def test_signed_compressed_bodies_are_accepted_and_stored_inflated(
    ingress: IngressService, db_url: str
) -> None:
    """The signature covers the inflated bytes (what the provider signed before compressing)."""
    plain = json.dumps({"type": "push", "pad": "x" * 2000}).encode()
    encodings = {
        "gzip": gzip.compress(plain),
        "x-gzip": gzip.compress(plain),
        "deflate": zlib.compress(plain),  # RFC 9110 deflate: the zlib format
        "Deflate ": (lambda c: c.compress(plain) + c.flush())(zlib.compressobj(6, zlib.DEFLATED, -15)),
        "identity": plain,
    }
    for i, (coding, wire) in enumerate(encodings.items()):
        conn = await Conn.open(ingress.http_port)
        try:
            await conn.send(request(GITHUB, wire, signed(plain, f"gz-{i}", **{"Content-Encoding": coding})))
            status, _, answer = await conn.response()
        finally:
            conn.close()
        assert status == 200, (coding, answer)
    rows = receipts(db_url)
    assert [bytes(r["body"]) for r in rows] == [plain] * len(encodings)


async def test_a_signature_over_the_compressed_bytes_does_not_verify(
    ingress: IngressService, db_url: str
) -> None:
    plain = b'{"type":"push"}'
    wire = gzip.compress(plain)
    conn = await Conn.open(ingress.http_port)
    try:
        await conn.send(request(GITHUB, wire, signed(wire, **{"Content-Encoding": "gzip"})))
        status, _, answer = await conn.response()
    finally:
        conn.close()
    assert (status, json.loads(answer)) == (401, {"error": "signature_mismatch"})
    assert receipt_count(db_url) == 0


@pytest.mark.parametrize(
    ("name", "coding", "wire", "status", "reason"),
    [
        ("gzip header on a plain body", "gzip", b'{"type":"push"}', 400, "invalid_content_encoding"),
        ("truncated gzip", "gzip", gzip.compress(b'{"a":1}' * 50)[:-9], 400, "invalid_content_encoding"),
        ("bytes after the gzip stream", "gzip", gzip.compress(b'{"a":1}') + b"junk", 400,
         "invalid_content_encoding"),
        ("two gzip members", "gzip", gzip.compress(b'{"a":') + gzip.compress(b"1}"), 400,
         "invalid_content_encoding"),
        ("deflate header on a plain body", "deflate", b"\x00\x01garbage", 400, "invalid_content_encoding"),
        ("empty gzip body", "gzip", b"", 400, "invalid_content_encoding"),
        ("brotli", "br", b"\x1b\x03\x00", 415, "unsupported_content_encoding"),
        ("zstd", "zstd", b"(\xb5/\xfd", 415, "unsupported_content_encoding"),
        ("stacked gzip", "gzip, gzip", gzip.compress(gzip.compress(b"{}")), 415,
         "unsupported_content_encoding"),
        ("unknown coding", "snappy", b"{}", 415, "unsupported_content_encoding"),
    ],
)  # fmt: skip
async def test_corrupt_or_unsupported_encodings_are_4xx_with_a_reason(
    ingress: IngressService, db_url: str, name: str, coding: str, wire: bytes, status: int, reason: str
) -> None:
    before = metric("rejected", reason)
    conn = await Conn.open(ingress.http_port)
    try:
        await conn.send(request(GITHUB, wire, signed(b"{}", **{"Content-Encoding": coding})))
        got, _, answer = await conn.response()
    finally:
        conn.close()
    assert (got, json.loads(answer)) == (status, {"error": reason}), name
    assert metric("rejected", reason) == before + 1
    assert receipt_count(db_url) == 0


def test_the_inflater_stops_at_the_limit_whatever_the_ratio(gzip_bomb: bytes) -> None:
    """A 1 GiB bomb costs O(limit): zlib never produces more than limit + 1 bytes, and the refusal
    comes within the first few KiB of input (control: the same stream under a 2 GiB limit inflates
    the whole GiB)."""
    limit = 1 << 20
    inflater = edge.Inflater("gzip", limit)
    out: list[bytes] = []
    fed = 0
    with pytest.raises(edge.BodyRefused) as refused:
        for i in range(0, len(gzip_bomb), 4096):
            fed += 4096
            inflater.feed(gzip_bomb[i : i + 4096], out)
    assert refused.value.reason == BODY_TOO_LARGE
    assert inflater.size == limit + 1 and sum(map(len, out)) <= limit + 1
    assert fed <= 8192
    control = edge.Inflater("gzip", 2 << 30)
    produced = 0
    for i in range(0, len(gzip_bomb), 1 << 16):
        sink: list[bytes] = []
        control.feed(gzip_bomb[i : i + (1 << 16)], sink)
        produced += sum(map(len, sink))
    control.finish()
    assert produced == 1 << 30


@pytest.mark.parametrize("path", [GITHUB, f"/v1/webhooks/{NAMESPACE}/nope", "/healthz", "/elsewhere"])
async def test_a_bomb_is_answered_then_the_connection_closed_without_reading_on(
    ingress: IngressService, db_url: str, gzip_bomb: bytes, path: str
) -> None:
    """Known route: 413 after at most limit + 1 inflated bytes. Unknown route, /healthz, any other
    path: answered before a body byte is read. Either way ``Connection: close`` and the socket is
    closed while the client is still sending (it cannot finish writing the ~1 MiB)."""
    conn = await Conn.open(ingress.http_port)
    headers = signed(b"{}", **{"Content-Encoding": "gzip"})
    head = request(path, b"", headers, content_length=len(gzip_bomb))
    try:
        await conn.send(head + gzip_bomb[:65536])
        status, hdrs, _ = await conn.response()
        assert hdrs.get("connection", "").lower() == "close"
        assert 400 <= status < 500, status
        with pytest.raises((ConnectionError, OSError)):
            for i in range(65536, len(gzip_bomb), 65536):
                await conn.send(gzip_bomb[i : i + 65536])
            raise AssertionError("the server read the whole bomb")
    finally:
        conn.close()
    assert receipt_count(db_url) == 0


async def test_healthz_with_a_bomb_attached_still_answers_and_closes(
    ingress: IngressService, gzip_bomb: bytes
) -> None:
    conn = await Conn.open(ingress.http_port)
    try:
        await conn.send(request("/healthz", gzip_bomb[:4096], {"Content-Encoding": "gzip"}, method="GET",
                                content_length=len(gzip_bomb)))  # fmt: skip
        status, hdrs, body = await conn.response()
        assert (status, hdrs["connection"].lower(), body) == (200, "close", b'{"status":"ok"}')
        assert await conn.closed_by_server()
    finally:
        conn.close()


# -- timeouts --------------------------------------------------------------------------------------------


async def trickle(conn: Conn, pieces: list[bytes], until: asyncio.Task[Any], every: float = 0.05) -> int:
    """Send ``pieces`` one per ``every`` seconds until ``until`` is done or the server cuts us off;
    the number of pieces sent."""
    for n, piece in enumerate(pieces):
        if until.done():
            return n
        try:
            await conn.send(piece)
        except (ConnectionError, OSError):
            return n
        await asyncio.wait([until], timeout=every)
    return len(pieces)


async def test_headers_trickled_slower_than_the_header_timeout_are_cut(start_ingress: StartIngress) -> None:
    svc = await start_ingress(http_header_timeout_s=0.5)
    before = metric("rejected", "header_timeout")
    conn = await Conn.open(svc.http_port)
    try:
        await conn.send(b"POST " + GITHUB.encode() + b" HTTP/1.1\r\nHost: x\r\n")
        closed = asyncio.create_task(conn.closed_by_server())
        lines = [b"X-Slow-%d: 1\r\n" % i for i in range(400)]  # 20 s of header lines, never complete
        sent = await trickle(conn, lines, closed)
        assert await closed and sent < len(lines)
    finally:
        conn.close()
    assert metric("rejected", "header_timeout") == before + 1


async def test_an_idle_new_connection_is_closed_after_the_header_timeout(start_ingress: StartIngress) -> None:
    svc = await start_ingress(http_header_timeout_s=0.3)
    conn = await Conn.open(svc.http_port)
    try:
        assert await conn.closed_by_server()
    finally:
        conn.close()


async def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(
    start_ingress: StartIngress, db_url: str
) -> None:
    svc = await start_ingress(http_keepalive_timeout_s=0.3, http_header_timeout_s=60)
    conn = await Conn.open(svc.http_port)
    body = b'{"a":"keep"}'
    try:
        await conn.send(request(GITHUB, body, signed(body, "ka-1")))
        status, hdrs, _ = await conn.response()
        assert status == 200 and hdrs.get("connection", "keep-alive").lower() != "close"
        # A second request on the same connection works (it is kept alive) ...
        await conn.send(request(GITHUB, body, signed(body, "ka-2")))
        assert (await conn.response())[0] == 200
        # ... and then, idle, the server closes it.
        assert await conn.closed_by_server()
    finally:
        conn.close()
    assert receipt_count(db_url) == 2


async def test_a_body_slower_than_the_body_timeout_gets_408_and_nothing_is_written(
    start_ingress: StartIngress, db_url: str
) -> None:
    svc = await start_ingress(http_body_timeout_s=0.5)
    body = b'{"a":"' + b"s" * 400 + b'"}'
    conn = await Conn.open(svc.http_port)
    try:
        await conn.send(request(GITHUB, b"", signed(body, "slow-1"), content_length=len(body)))
        answer = asyncio.create_task(conn.response())
        sent = await trickle(conn, [body[i : i + 1] for i in range(len(body))], answer)  # 20 s of body
        status, hdrs, text = await answer
        assert (status, json.loads(text), hdrs["connection"].lower()) == (
            408,
            {"error": "body_timeout"},
            "close",
        )
        assert sent < len(body)
        assert await conn.closed_by_server()
    finally:
        conn.close()
    assert receipt_count(db_url) == 0


# -- the connection cap ----------------------------------------------------------------------------------


async def test_at_the_cap_idle_connections_are_shed_for_a_genuine_delivery(
    start_ingress: StartIngress, db_url: str
) -> None:
    svc = await start_ingress(http_max_connections=8, http_header_timeout_s=300, http_keepalive_timeout_s=300)
    assert svc.http_max_connections == 8
    idle = [await Conn.open(svc.http_port) for _ in range(8)]
    slow = []
    try:
        body = b'{"a":"cap"}'
        for n in range(12):  # more genuine deliveries than the cap, each on a new connection
            conn = await Conn.open(svc.http_port)
            try:
                await conn.send(request(GITHUB, body, signed(body, f"cap-{n}")))
                assert (await conn.response())[0] == 200
            finally:
                conn.close()
        # The oldest idle connections were the ones closed to make room.
        assert await idle[0].closed_by_server()
        # Now fill the cap with slow bodies: a genuine delivery sheds the longest-reading one (503).
        for c in idle:
            c.close()
        for n in range(8):
            c = await Conn.open(svc.http_port)
            await c.send(request(GITHUB, b"{", signed(b"{}", f"slow-{n}"), content_length=1000))
            slow.append(c)
        # Every slow connection is reading its body once the server has answered a probe after them.
        probe = await Conn.open(svc.http_port)
        await probe.send(request(GITHUB, body, signed(body, "cap-probe")))
        assert (await probe.response())[0] == 200
        probe.close()
        status, hdrs, answer = await slow[0].response()
        assert (status, json.loads(answer), hdrs["retry-after"]) == (503, {"error": "connection_shed"}, "5")
    finally:
        for c in idle + slow:
            c.close()
    assert receipt_count(db_url) == 13


async def test_with_every_connection_busy_a_new_one_is_answered_503_and_closed(
    start_ingress: StartIngress, db_url: str
) -> None:
    """Busy = the body read, waiting for the commit: never shed. The commit is held back by a lock
    on the receipt table; the third connection is refused at once, the two busy ones land."""
    import psycopg

    svc = await start_ingress(http_max_connections=2)
    with psycopg.connect(db_url) as locker:
        locker.execute("LOCK TABLE connector_ingress_receipt IN ACCESS EXCLUSIVE MODE")
        busy = []
        for n in range(2):
            body = b'{"busy":%d}' % n
            c = await Conn.open(svc.http_port)
            await c.send(request(GITHUB, body, signed(body, f"busy-{n}")))
            busy.append(c)
        # Wait (on the database) until both inserts are blocked behind the lock.
        deadline = time.monotonic() + WAIT
        while True:
            waiting = locker.execute(
                "SELECT count(*) FROM pg_locks WHERE relation = 'connector_ingress_receipt'::regclass"
                " AND NOT granted"
            ).fetchone()
            if waiting and waiting[0] >= 1:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        third = await Conn.open(svc.http_port)
        try:
            status, hdrs, answer = await third.response()
            assert (status, json.loads(answer)) == (503, {"error": "connection_refused"})
            assert hdrs["connection"].lower() == "close" and hdrs["retry-after"] == "5"
            assert await third.closed_by_server()
        finally:
            third.close()
        locker.commit()  # releases the lock
    for c in busy:
        assert (await c.response())[0] == 200
        c.close()
    assert receipt_count(db_url) == 2


# -- 5xx for client input ---------------------------------------------------------------------------------


def _hubspot_wellformed() -> dict[str, str]:
    return {
        "X-HubSpot-Signature-v3": base64.b64encode(os.urandom(32)).decode(),
        "X-HubSpot-Request-Timestamp": str(int(time.time() * 1000)),
        "Content-Type": "application/json",
    }


@pytest.mark.parametrize(
    "raw_head",
    [
        b"POST /v1/webhooks/shop/hubspot HTTP/1.1\r\nHost: h\xffst.example\r\n",
        b"POST /v1/webhooks/shop/hubspot HTTP/1.1\r\nHost: x\r\nX-Forwarded-Host: \xc3\x28.example\r\n",
        b"POST /v1/webhooks/shop/hubspot HTTP/1.1\r\nHost: x\r\nX-Forwarded-Proto: \xfe\r\n",
    ],
)
async def test_non_utf8_bytes_in_a_signed_uri_are_400_bad_uri(
    ingress: IngressService, db_url: str, raw_head: bytes
) -> None:
    body = b'{"a":1}'
    head = raw_head + b"".join(f"{k}: {v}\r\n".encode() for k, v in _hubspot_wellformed().items())
    conn = await Conn.open(ingress.http_port)
    try:
        await conn.send(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        status, _, answer = await conn.response()
    finally:
        conn.close()
    assert (status, json.loads(answer)) == (400, {"error": "bad_uri"})
    assert receipt_count(db_url) == 0


def _raw(line: bytes, *headers: bytes, body: bytes = b"") -> bytes:
    return line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


_G = b"POST " + GITHUB.encode()
_SIGNED = [f"{k}: {v}".encode() for k, v in github_headers(b"{}").items() if k != "X-GitHub-Delivery"]
_M = "malformed_http"
_NF = "route_not_found"
_NOSIG = "signature_missing"


def _post(*headers: bytes, body: bytes = b"{}", version: bytes = b"HTTP/1.1", target: bytes = b"") -> bytes:
    line = b"POST " + (target or GITHUB.encode()) + b" " + version
    length = (
        []
        if any(h.lower().startswith((b"content-length", b"transfer-encoding")) for h in headers)
        else [b"Content-Length: %d" % len(body)]
    )
    return _raw(line, b"Host: x", *headers, *length, body=body)


#: name -> (request bytes, status, reason). Parser refusals are ``malformed_http`` (no echo of the
#: request), everything else a reason of the admission's vocabulary.
ODD_REQUESTS: dict[str, tuple[bytes, int, str]] = {
    "unknown method": (request(GITHUB, b"{}", method="FROB"), 400, _M),
    "CONNECT": (_raw(b"CONNECT ingress.test:443 HTTP/1.1", b"Host: ingress.test:443"), 404, "not_found"),
    "OPTIONS *": (_raw(b"OPTIONS * HTTP/1.1", b"Host: x"), 404, "not_found"),
    "absolute-form target": (_post(target=b"http://evil.example" + GITHUB.encode()), 401, _NOSIG),
    "TRACE": (request(GITHUB, method="TRACE"), 405, "method_not_allowed"),
    "HEAD on a webhook": (request(GITHUB, method="HEAD"), 405, ""),
    "HTTP/1.0 without Host": (_raw(_G + b" HTTP/1.0", b"Content-Length: 2", body=b"{}"), 401, _NOSIG),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, _M),
    "HTTP/9.9": (_post(version=b"HTTP/9.9"), 400, _M),
    "negative Content-Length": (_post(b"Content-Length: -1"), 400, _M),
    "Content-Length not a number": (_post(b"Content-Length: 1x"), 400, _M),
    "Content-Length over 2**64": (_post(b"Content-Length: %d" % 2**64), 400, _M),
    "Content-Length list": (_post(b"Content-Length: 2, 2"), 400, _M),
    "Transfer-Encoding gzip": (_post(b"Transfer-Encoding: gzip"), 400, _M),
    "bad chunk size": (
        _post(*_SIGNED, b"Transfer-Encoding: chunked", body=b"2\r\n{}\r\nZZ\r\n\r\n"),
        400,
        _M,
    ),
    "chunk extension garbage": (
        _post(b"Transfer-Encoding: chunked", body=b"2;\x00\x01\r\n{}\r\n0\r\n\r\n"),
        400,
        _M,
    ),
    "bad percent-encoding in the path": (request("/v1/webhooks/sh%ZZop/git%hub", b"{}"), 404, _NF),
    "percent-encoded non-UTF-8 path": (request("/v1/webhooks/%FF%FE/%C3%28", b"{}"), 404, _NF),
    "raw non-UTF-8 path": (_post(target=b"/v1/webhooks/shop/\xff\xfe"), 400, _M),
    "raw non-UTF-8 query": (_post(target=b"/v1/webhooks/shop/hubspot?q=\xff"), 400, _M),
    "percent-encoded slash": (request("/v1/webhooks/shop/git%2Fhub", b"{}"), 404, _NF),
    "dot segments": (request("/v1/webhooks/shop/../shop/github", b"{}"), 404, _NF),
    "NUL in the path": (request("/v1/webhooks/shop/git%00hub", b"{}"), 404, _NF),
    "huge header line": (request(GITHUB, b"{}", {"X-Big": "a" * 70_000}), 400, _M),
    "many headers": (request(GITHUB, b"{}", {f"X-H{i}": "v" for i in range(300)}), 400, _M),
    "huge request line": (_raw(b"POST /" + b"a" * 70_000 + b" HTTP/1.1", b"Host: x"), 400, _M),
    "non-UTF-8 Content-Type": (
        _post(*_SIGNED, b"Content-Type: application/\xffjson"),
        415,
        "unsupported_media_type",
    ),
    "non-UTF-8 delivery id": (_post(*_SIGNED, b"X-GitHub-Delivery: \xff\xfe"), 400, "bad_header"),
    "non-UTF-8 Content-Encoding": (_post(b"Content-Encoding: gz\xffip"), 415, "unsupported_content_encoding"),
    "Expect something else": (_post(b"Expect: 200-ok"), 401, _NOSIG),
    "Upgrade websocket": (_post(b"Upgrade: websocket", b"Connection: Upgrade"), 401, _NOSIG),
    "garbage": (bytes(range(128, 192)) + b"\r\n\r\n", 400, _M),
}


@pytest.mark.parametrize("name", list(ODD_REQUESTS))
async def test_odd_http_requests_are_4xx_with_a_reason_and_no_row(
    ingress: IngressService, db_url: str, name: str
) -> None:
    raw, status, reason = ODD_REQUESTS[name]
    conn = await Conn.open(ingress.http_port)
    try:
        await conn.send(raw)
        if name.startswith("HEAD"):
            head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), WAIT)
            got, body = int(head[9:12]), b""
        else:
            got, _, body = await conn.response()
    finally:
        conn.close()
    assert got == status, (name, got, body[:200])
    if reason:
        assert json.loads(body) == {"error": reason}, name
    assert receipt_count(db_url) == 0


async def test_a_client_that_disconnects_mid_body_writes_nothing_and_logs_no_error(
    ingress: IngressService, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = b'{"a":"gone"}'
    for n in range(5):
        conn = await Conn.open(ingress.http_port)
        await conn.send(request(GITHUB, b"", signed(body, f"gone-{n}"), content_length=len(body)) + body[:5])
        conn.writer.transport.abort()
    # The server is still healthy and answers the next delivery; nothing of the aborted ones landed.
    conn = await Conn.open(ingress.http_port)
    try:
        await conn.send(request(GITHUB, body, signed(body, "after-gone")))
        assert (await conn.response())[0] == 200
    finally:
        conn.close()
    assert receipt_count(db_url) == 1
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_large_bodies_are_verified_off_the_event_loop_with_the_same_outcomes(
    ingress: IngressService, db_url: str
) -> None:
    """Bodies from OFFLOAD_BYTES up are HMAC'd and hashed in a worker thread: same answers, same row."""
    import hashlib

    from connector.ingress.admission import OFFLOAD_BYTES

    body = json.dumps({"type": "big", "pad": "b" * OFFLOAD_BYTES}).encode()
    assert len(body) >= OFFLOAD_BYTES
    wrong = signed(body, "big-0")
    wrong["X-Hub-Signature-256"] = "sha256=" + "0" * 64
    for headers, expected in ((wrong, 401), (signed(body, "big-1"), 200)):
        conn = await Conn.open(ingress.http_port)
        try:
            await conn.send(request(GITHUB, body, headers))
            assert (await conn.response())[0] == expected
        finally:
            conn.close()
    (row,) = receipts(db_url)
    assert bytes(row["body"]) == body and bytes(row["payload_sha256"]) == hashlib.sha256(body).digest()


@pytest.mark.parametrize(
    ("nofile", "setting", "cap", "backlog"),
    [
        (256, 0, 128, 64),  # ulimit -n 256: half for connections, a full backlog fits in the rest
        (1024, 0, 512, 448),
        (1 << 20, 0, edge.AUTO_MAX_CONNECTIONS, 1024),
        (256, 5000, 184, 8),  # an explicit cap above what the limit allows is lowered
        (65536, 300, 300, 1024),
    ],
)
def test_the_connection_cap_and_backlog_fit_the_descriptor_limit(
    nofile: int, setting: int, cap: int, backlog: int
) -> None:
    got = edge.HttpLimits(max_connections=setting).derive(nofile)
    assert got == (cap, backlog)
    assert got[0] + got[1] + edge.RESERVED_DESCRIPTORS <= nofile  # a full accept burst never hits EMFILE
