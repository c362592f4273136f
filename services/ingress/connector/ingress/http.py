"""HTTP endpoints (aiohttp): ``POST /v1/webhooks/{namespace}/{route_key}``, ``/healthz``, ``/readyz``.

The webhook handler is deliberately lean — aiohttp's low-level server (no router, no middleware),
no per-request logging; one route lookup, the admission checks, and a small JSON answer:

- accepted / duplicate: the route's success status, ``{"receipt_id": N, "duplicate": false}``;
- refused before any write: 400/401/404/405/408/413/415/429 with ``{"error": "<reason>"}``;
- not durable (database unavailable, pool saturated, shutting down, connection shed): the route's
  failure status (503 by default) with ``Retry-After``.

Nothing from the request is echoed into a response header (no header injection through us) except
``X-Request-Id``: every webhook answer carries one — the request's own when it is a bounded token of
a safe charset (``connector.common.core.eventlog.safe_token``), else one made here — and the reasons come
from a fixed vocabulary. Every refusal writes one rate-limited INFO line (``Admission.count``,
docs/ingress.md "Logs") with that request id and the peer: the socket's address, or the first
``X-Forwarded-For`` hop when ``http_trust_forwarded_for`` says a proxy in front sets it (either one
only as a canonical IP address). Accepted deliveries write nothing.

``{uri}`` in a signed-content template is the URL the provider called: ``public_base_url`` (setting)
plus the raw path and query when configured, otherwise scheme and host as received (honouring
``X-Forwarded-Proto``/``X-Forwarded-Host`` from a proxy in front — the signature still decides). A
URL that is not valid UTF-8 (a raw ``\\xff`` in ``Host``) is refused with 400 ``bad_uri``.

The edge (docs/ingress.md, "Defences"): every connection is in one of four states, tracked by
``ConnectionGuard`` in insertion-ordered dicts (O(1) per transition, the sweeper reads only what
expired):

- *fresh* — connected, request headers not complete: closed ``header_timeout_s`` after connecting;
- *idle* — kept alive after an answer: closed unless the next request's headers are complete within
  ``keepalive_timeout_s`` of that answer;
- *reading* — headers complete, body arriving: the body must be complete within ``body_timeout_s``
  of the headers, else 408 and close;
- *busy* — the whole body read (verifying, waiting for its commit): never timed out, never shed.

At most ``max_connections`` are open; one more sheds the connection waiting longest — fresh since
it connected, idle since its last answer, or reading since its headers (that one is answered 503 +
``Retry-After``) — and with none of those (all busy) the new connection is answered 503 and
closed. The cap is derived from the descriptor limit, so accepting never runs out of descriptors
(under uvloop an ``EMFILE`` on accept resets every connection waiting in the backlog — genuine ones
included).

Bodies: aiohttp's own decompression is off. ``Content-Encoding: gzip`` (``x-gzip``) and ``deflate``
are inflated here, incrementally, with the ``max_body_bytes`` limit applied to the inflated bytes as
zlib produces them (``max_length``), so a decompression bomb costs O(limit) CPU; any other or a
stacked encoding is 415 ``unsupported_content_encoding``, a corrupt or truncated stream 400
``invalid_content_encoding``. The route is looked up before any body byte is read, so an unknown
route never costs an inflation. Signatures are verified over the inflated bytes (what the provider's
application signed before its HTTP client compressed them; Stream and QuickNode document exactly
that), and the receipt stores them.

Any answer given before the whole body was read says ``Connection: close`` and the connection is
closed (no lingering read of the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import http_exceptions, web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from connector.common.core.eventlog import events, new_request_id, safe_peer, safe_token
from connector.ingress import metrics
from connector.ingress.admission import (
    BAD_URI,
    BODY_TOO_LARGE,
    DEFAULT_FAILURE_STATUS,
    REJECTED,
    ROUTE_NOT_FOUND,
    UNAVAILABLE,
    Admission,
    InvalidInput,
    Outcome,
)

log = logging.getLogger(__name__)

_JSON = "application/json"
_ERROR = b'{"error":"%s"}'
TRANSPORT = "http"
WEBHOOK_PREFIX = "/v1/webhooks/"

# Refusals made by the HTTP edge itself (the admission's vocabulary covers the rest).
BODY_TIMEOUT: Final = "body_timeout"
HEADER_TIMEOUT: Final = "header_timeout"
CONNECTION_SHED: Final = "connection_shed"
CONNECTION_REFUSED: Final = "connection_refused"
UNSUPPORTED_CONTENT_ENCODING: Final = "unsupported_content_encoding"
INVALID_CONTENT_ENCODING: Final = "invalid_content_encoding"
MALFORMED_BODY: Final = "malformed_body"
EDGE_STATUS: Final[dict[str, int]] = {
    BODY_TIMEOUT: 408,
    UNSUPPORTED_CONTENT_ENCODING: 415,
    INVALID_CONTENT_ENCODING: 400,
    MALFORMED_BODY: 400,
}

#: Descriptors left to everything but HTTP connections (pool, route listener, gRPC, metrics, logs).
RESERVED_DESCRIPTORS: Final = 64
#: The derived connection cap never exceeds this (set ``http_max_connections`` to go higher).
AUTO_MAX_CONNECTIONS: Final = 10_000


class MalformedRequestFilter(logging.Filter):
    """Counts requests the HTTP parser refused (400 before any handler ran) instead of logging them.

    aiohttp logs each with its traceback, and the exception text quotes the offending request line
    — header values included. A flood of malformed requests must not become a flood of log lines
    that echo attacker-chosen (or signature-bearing) bytes; a counter is what an operator needs.
    """

    def __init__(self) -> None:
        super().__init__("connector.ingress.malformed")
        self.counter = metrics.DELIVERIES.labels(TRANSPORT, "rejected", "malformed_http")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            self.counter.inc()
            return False
        return True


MALFORMED_FILTER = MalformedRequestFilter()


def install_log_filter() -> None:
    """Attach the filter to aiohttp's server logger (idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if MALFORMED_FILTER not in logger.filters:
        logger.addFilter(MALFORMED_FILTER)


# --------------------------------------------------------------------------------------------------
# Connection limits
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    #: 0: derived from the descriptor limit (``derive``).
    max_connections: int = 0
    backlog: int = 1024

    @classmethod
    def from_settings(cls, s: Any) -> HttpLimits:
        return cls(
            header_timeout_s=s.http_header_timeout_s,
            body_timeout_s=s.http_body_timeout_s,
            keepalive_timeout_s=s.http_keepalive_timeout_s,
            max_connections=s.http_max_connections,
            backlog=s.http_backlog,
        )

    def derive(self, nofile: int | None = None) -> tuple[int, int]:
        """``(max_connections, backlog)`` that fit in the soft descriptor limit.

        The cap is half the limit (at most ``AUTO_MAX_CONNECTIONS``) unless set; an explicit cap is
        lowered to what the limit allows. The backlog is lowered so that one accept burst (a full
        backlog) fits in the descriptors left over the cap and ``RESERVED_DESCRIPTORS``.
        """
        if nofile is None:
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY or nofile <= 0:
            nofile = 1 << 20
        usable = max(16, nofile - RESERVED_DESCRIPTORS)
        if self.max_connections:
            cap = min(self.max_connections, max(8, usable - 8))
        else:
            cap = max(8, min(AUTO_MAX_CONNECTIONS, nofile // 2))
        backlog = max(8, min(self.backlog, usable - cap))
        return cap, backlog


class BodyTimeout(Exception):
    """Set on a request's body stream by the sweeper: the body did not arrive in time."""


class Shed(Exception):
    """Set on a request's body stream when its connection is shed for a new one."""


_CANNED_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: %d\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class ConnectionGuard:
    """Connection states, timeouts and the connection cap (see the module docstring)."""

    def __init__(self, limits: HttpLimits, *, retry_after_s: int, nofile: int | None = None) -> None:
        self.limits = limits
        self.max_connections, self.backlog = limits.derive(nofile)
        self._header_s = limits.header_timeout_s
        self._body_s = limits.body_timeout_s
        self._idle_s = limits.keepalive_timeout_s
        self._tick_s = max(0.05, min(1.0, self._header_s / 4, self._body_s / 4, self._idle_s / 4))
        self._open: set[RequestHandler] = set()
        self._fresh: dict[RequestHandler, float] = {}  # deadline
        self._idle: dict[RequestHandler, float] = {}
        self._reading: dict[RequestHandler, tuple[float, StreamReader]] = {}
        self._task: asyncio.Task[None] | None = None
        body = _ERROR % CONNECTION_REFUSED.encode()
        self._refusal = _CANNED_503 % (retry_after_s, len(body), body)
        counter = metrics.DELIVERIES.labels
        self._header_timeouts = counter(TRANSPORT, REJECTED, HEADER_TIMEOUT)
        self._shed = counter(TRANSPORT, UNAVAILABLE, CONNECTION_SHED)
        self._refused = counter(TRANSPORT, UNAVAILABLE, CONNECTION_REFUSED)
        self.events = events("ingress")

    @property
    def open(self) -> int:
        return len(self._open)

    # -- transitions (called by the server and the request handler) ----------------------------------

    def opened(self, proto: RequestHandler, transport: asyncio.Transport) -> None:
        now = time.monotonic()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweep(), name="http-guard")
        if len(self._open) >= self.max_connections and not self._shed_one():
            self._refused.inc()
            self._log(CONNECTION_REFUSED, UNAVAILABLE, transport)
            with contextlib.suppress(Exception):
                transport.write(self._refusal)
            proto.force_close()
            return
        self._open.add(proto)
        self._fresh[proto] = now + self._header_s

    def closed(self, proto: RequestHandler) -> None:
        self._open.discard(proto)
        self._fresh.pop(proto, None)
        self._idle.pop(proto, None)
        self._reading.pop(proto, None)

    def begin(self, proto: RequestHandler) -> None:
        """Request headers complete: the connection is busy (no longer fresh or idle)."""
        if self._fresh.pop(proto, None) is None:
            self._idle.pop(proto, None)

    def reading(self, proto: RequestHandler, stream: StreamReader) -> None:
        if proto in self._open:
            self._reading[proto] = (time.monotonic() + self._body_s, stream)

    def read_done(self, proto: RequestHandler) -> None:
        self._reading.pop(proto, None)

    def end(self, proto: RequestHandler) -> None:
        """Answered: idle until the next request (closed at once if the answer closes it)."""
        self._reading.pop(proto, None)
        if proto in self._open:
            self._idle[proto] = time.monotonic() + self._idle_s

    def _log(self, reason: str, outcome: str, transport: Any) -> None:
        """A refusal before any request: no route, no request id; the socket's peer only."""
        self.events.emit(
            "delivery_refused",
            reason,
            "delivery refused",
            namespace=metrics.UNKNOWN_ROUTE,
            route=metrics.UNKNOWN_ROUTE,
            outcome=outcome,
            transport=TRANSPORT,
            peer=socket_peer(transport),
        )

    # -- enforcement ------------------------------------------------------------------------------

    def _shed_one(self) -> bool:
        """Close the connection that has been waiting longest — fresh (since it connected), idle
        (since its last answer) or reading (since its headers) — to make room for a new one.

        Busy connections are never candidates. Oldest first means a genuine delivery, which
        connects, sends and is busy within milliseconds, would only be shed after ``max_connections``
        newer connections arrived during its own header phase."""
        heads: list[tuple[float, int]] = []
        if self._fresh:
            heads.append((next(iter(self._fresh.values())) - self._header_s, 0))
        if self._idle:
            heads.append((next(iter(self._idle.values())) - self._idle_s, 1))
        if self._reading:
            heads.append((next(iter(self._reading.values()))[0] - self._body_s, 2))
        if not heads:
            return False
        _, which = min(heads)
        if which == 2:
            victim = next(iter(self._reading))
            _, stream = self._reading.pop(victim)
            self._open.discard(victim)  # it closes after its answer: 503 connection_shed
            stream.set_exception(Shed())
            return True
        waiting = self._fresh if which == 0 else self._idle
        victim = next(iter(waiting))
        del waiting[victim]
        self._open.discard(victim)
        self._log(CONNECTION_SHED, UNAVAILABLE, victim.transport)
        victim.force_close()
        self._shed.inc()
        return True

    def sweep(self, now: float) -> None:
        for waiting, counted in ((self._fresh, True), (self._idle, False)):
            while waiting:
                proto, deadline = next(iter(waiting.items()))
                if deadline > now:
                    break
                del waiting[proto]
                if counted:
                    self._header_timeouts.inc()
                    self._log(HEADER_TIMEOUT, REJECTED, proto.transport)
                proto.force_close()
        while self._reading:
            proto, (deadline, stream) = next(iter(self._reading.items()))
            if deadline > now:
                break
            del self._reading[proto]
            stream.set_exception(BodyTimeout())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s)
            try:
                self.sweep(time.monotonic())
            except Exception:  # never let the guard die; the next tick retries
                log.exception("http connection sweep failed")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class EdgeHandler(RequestHandler):
    """aiohttp's protocol handler, answering what its parser refused in our vocabulary.

    aiohttp's own answer quotes the offending request bytes back (``Invalid char in url path:
    b'POST /…'``); ours is ``{"error":"malformed_http"}`` with the parser's 4xx status and
    ``Connection: close``. Anything else (an exception escaping a handler) keeps aiohttp's
    behaviour."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, http_exceptions.HttpProcessingError) or not 400 <= status < 500:
            return super().handle_error(request, status, exc, message)
        MALFORMED_FILTER.counter.inc()
        events("ingress").emit(
            "delivery_refused",
            "malformed_http",
            "delivery refused",
            namespace=metrics.UNKNOWN_ROUTE,
            route=metrics.UNKNOWN_ROUTE,
            outcome=REJECTED,
            status=status,
            transport=TRANSPORT,
            peer=socket_peer(self.transport),
        )
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        response = web.Response(status=status, body=_ERROR % b"malformed_http", content_type=_JSON)
        response.force_close()
        return response


class EdgeServer(web.Server):
    """aiohttp's low-level server with the ``ConnectionGuard`` on its connection hooks."""

    def __init__(self, handler: Any, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.guard = guard

    def __call__(self) -> RequestHandler:
        return EdgeHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.guard.opened(handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.guard.closed(handler)

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (aiohttp's)
        await super().shutdown(timeout)
        await self.guard.stop()


# --------------------------------------------------------------------------------------------------
# Bodies
# --------------------------------------------------------------------------------------------------


class BodyRefused(Exception):
    """The body cannot be admitted; ``reason`` is from the fixed vocabulary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ClientGone(Exception):
    """The connection ended before the body did (nobody to answer)."""


def content_coding(values: list[str]) -> str | None:
    """The one content coding of a body: ``None`` (identity), ``gzip`` or ``deflate``.

    Raises ``BodyRefused`` for any other coding or a stack of them (``gzip, gzip`` would multiply
    a bomb's ratio)."""
    codings = [c.strip().lower() for v in values for c in v.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return "deflate" if codings[0] == "deflate" else "gzip"
    raise BodyRefused(UNSUPPORTED_CONTENT_ENCODING)


class Inflater:
    """Incremental gzip/deflate inflation that never produces more than ``limit`` + 1 bytes."""

    def __init__(self, coding: str, limit: int) -> None:
        self._coding = coding
        self._limit = limit
        self._zlib: Any = None  # deflate: zlib-wrapped or raw, decided by the first two bytes
        self._head = b""
        self.size = 0

    def feed(self, chunk: bytes, out: list[bytes]) -> None:
        z = self._zlib
        if z is None:
            if self._coding == "gzip":
                z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                self._head += chunk
                if len(self._head) < 2:
                    return
                chunk, self._head = self._head, b""
                wrapped = chunk[0] & 0x0F == 8 and (chunk[0] << 8 | chunk[1]) % 31 == 0
                z = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            self._zlib = z
        if z.eof:
            raise BodyRefused(INVALID_CONTENT_ENCODING)  # bytes after the end of the stream
        try:
            while chunk:
                data = z.decompress(chunk, self._limit - self.size + 1)
                self.size += len(data)
                if self.size > self._limit:
                    raise BodyRefused(BODY_TOO_LARGE)
                if data:
                    out.append(data)
                chunk = z.unconsumed_tail
                if z.eof:
                    if z.unused_data or chunk:
                        raise BodyRefused(INVALID_CONTENT_ENCODING)
                    break
        except zlib.error:
            raise BodyRefused(INVALID_CONTENT_ENCODING) from None

    def finish(self) -> None:
        if self._zlib is None or not self._zlib.eof:
            raise BodyRefused(INVALID_CONTENT_ENCODING)  # truncated (or empty) stream


async def read_body(stream: StreamReader, max_body: int, coding: str | None) -> bytes:
    """The whole (inflated) body; raises ``BodyRefused`` or ``ClientGone``.

    The raw bytes and the inflated bytes are each bounded by ``max_body`` as they arrive."""
    chunks: list[bytes] = []
    inflater = Inflater(coding, max_body) if coding is not None else None
    raw = 0
    try:
        while chunk := await stream.readany():
            raw += len(chunk)
            if raw > max_body:
                raise BodyRefused(BODY_TOO_LARGE)
            if inflater is None:
                chunks.append(chunk)
            else:
                inflater.feed(chunk, chunks)
            if stream.at_eof():  # all of the body was buffered: no second read to learn that it ended
                break
    except (BodyRefused, BodyTimeout, Shed):
        raise
    except http_exceptions.HttpProcessingError:
        raise BodyRefused(MALFORMED_BODY) from None  # e.g. a bad chunk size line
    except (ConnectionError, RuntimeError, web.RequestPayloadError):
        raise ClientGone() from None  # RuntimeError: aiohttp's "Connection closed."
    if inflater is not None:
        inflater.finish()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# --------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------


def request_id_of(request: web.BaseRequest) -> str:
    """The request's ``X-Request-Id`` if it is a safe bounded token, else a new one."""
    return safe_token(request.headers.get("X-Request-Id")) or new_request_id()


def peer_of(request: web.BaseRequest, trust_forwarded_for: bool) -> str:
    """The sender's address for a log line: the socket's, or the first ``X-Forwarded-For`` hop when
    the proxy in front is trusted (``http_trust_forwarded_for``); a canonical IP or a fixed word."""
    if trust_forwarded_for:
        forwarded = request.headers.get("X-Forwarded-For")
        if forwarded:
            return safe_peer(forwarded[:128].split(",", 1)[0])
    return safe_peer(request.remote)


def socket_peer(transport: Any) -> str:
    """The remote IP of a connection (``safe_peer``), for refusals that have no request."""
    peername = transport.get_extra_info("peername") if transport is not None else None
    return safe_peer(peername[0] if isinstance(peername, tuple) and peername else None)


def _answer(outcome: Outcome, request_id: str | None = None) -> web.Response:
    headers = {"Content-Type": _JSON}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    if outcome.retry_after is not None:
        headers["Retry-After"] = str(outcome.retry_after)
    if outcome.allow is not None:
        headers["Allow"] = outcome.allow
    if outcome.ok:
        body = b'{"receipt_id":%d,"duplicate":%s}' % (
            outcome.receipt_id or 0,
            b"true" if outcome.duplicate else b"false",
        )
    else:
        body = _ERROR % outcome.reason.encode()
    return web.Response(status=outcome.status, body=body, headers=headers)


def build_server(
    admission: Admission,
    *,
    ready: Callable[[], Awaitable[bool]],
    public_base_url: str | None = None,
    limits: HttpLimits | None = None,
    nofile: int | None = None,
    trust_forwarded_for: bool = False,
) -> EdgeServer:
    """aiohttp's low-level server (no router, no middleware): the path is dispatched here."""
    base = public_base_url.rstrip("/") if public_base_url else None
    count = admission.count
    ack_seconds = metrics.ACK_SECONDS.labels(TRANSPORT)
    acked = admission.figures.acked
    max_body = admission.max_body_bytes
    limits = limits or HttpLimits()
    guard = ConnectionGuard(limits, retry_after_s=admission.retry_after_s, nofile=nofile)

    def refused(request: web.BaseRequest, outcome: Outcome, request_id: str) -> web.Response:
        """Counts and logs (rate-limited) a refusal, answered with its request id."""
        count(TRANSPORT, outcome, request_id, peer_of(request, trust_forwarded_for))
        return _answer(outcome, request_id)

    def refuse(request: web.BaseRequest, reason: str, route: Any, request_id: str) -> web.Response:
        """A refusal by the edge itself (tagged with the route for the per-route metrics)."""
        if reason in EDGE_STATUS:
            outcome = Outcome(EDGE_STATUS[reason], REJECTED, reason)
        elif reason == CONNECTION_SHED:
            retry = admission.retry_after_s
            outcome = Outcome(DEFAULT_FAILURE_STATUS, UNAVAILABLE, reason, retry_after=retry)
        else:
            outcome = admission.reject(reason)
        outcome.route = route
        return refused(request, outcome, request_id)

    async def webhook(request: web.BaseRequest, namespace: str, route_key: str) -> web.Response:
        received = time.time()
        rid = request_id_of(request)
        route = admission.route_for(namespace, route_key, request.method, request.content_length)
        if isinstance(route, Outcome):
            return refused(request, route, rid)
        try:
            coding = content_coding(request.headers.getall("Content-Encoding", []))
        except BodyRefused as exc:
            return refuse(request, exc.reason, route, rid)
        if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
            # The low-level server has no router to answer this for us (curl sends it for >1 KiB).
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        proto = request.protocol
        stream = request.content
        guard.reading(proto, stream)
        try:
            body = await read_body(stream, max_body, coding)
        except BodyRefused as exc:
            return refuse(request, exc.reason, route, rid)
        except BodyTimeout:
            return refuse(request, BODY_TIMEOUT, route, rid)
        except Shed:
            return refuse(request, CONNECTION_SHED, route, rid)
        except ClientGone:
            return web.Response(status=400)  # nobody reads it; never counted as an answer
        finally:
            guard.read_done(proto)

        def uri() -> str:
            if base is not None:
                text = base + request.raw_path
            else:
                headers = request.headers
                scheme = headers.get("X-Forwarded-Proto", request.scheme).split(",")[0].strip()
                host = headers.get("X-Forwarded-Host", request.host).split(",")[0].strip()
                text = f"{scheme}://{host}{request.raw_path}"
            try:
                text.encode()
            except UnicodeEncodeError:  # bytes that are not UTF-8 (kept by aiohttp as surrogates)
                raise InvalidInput(BAD_URI) from None
            return text

        outcome = await admission.admit(
            route,
            method=request.method,
            headers=request.headers,
            body=body,
            uri=uri,
            received_at=received,
        )
        if outcome.ok:
            count(TRANSPORT, outcome)
            took = time.time() - received
            ack_seconds.observe(took)
            acked(route.installed_pack_id, took)
            return _answer(outcome, rid)
        return refused(request, outcome, rid)

    async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path.startswith(WEBHOOK_PREFIX):
            namespace, sep, route_key = path[len(WEBHOOK_PREFIX) :].partition("/")
            if sep and namespace and route_key and "/" not in route_key:
                return await webhook(request, namespace, route_key)
            return refused(request, admission.reject(ROUTE_NOT_FOUND), request_id_of(request))
        if path in ("/healthz", "/readyz"):
            if request.method not in ("GET", "HEAD"):
                return web.Response(status=405, body=_ERROR % b"method_not_allowed", content_type=_JSON,
                                    headers={"Allow": "GET, HEAD"})  # fmt: skip
            if path == "/healthz":
                return web.Response(body=b'{"status":"ok"}', content_type=_JSON)
            if await ready():
                return web.Response(body=b'{"status":"ready"}', content_type=_JSON)
            return web.Response(status=503, body=b'{"status":"not_ready"}', content_type=_JSON)
        return web.Response(status=404, body=_ERROR % b"not_found", content_type=_JSON)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        proto = request.protocol
        guard.begin(proto)
        try:
            response = await dispatch(request)
            if not request.content.is_eof():
                response.force_close()  # answered before the whole body was read: close, never linger
            return response
        finally:
            guard.end(proto)

    install_log_filter()
    return EdgeServer(
        handle,
        guard=guard,
        access_log=None,
        auto_decompress=False,
        lingering_time=0,
        # aiohttp's own idle timer is only a backstop: the guard closes idle connections first.
        keepalive_timeout=limits.keepalive_timeout_s + limits.header_timeout_s + 1.0,
    )
