"""HTTP endpoints (aiohttp): ``POST /v1/webhooks/{namespace}/{route_key}``, ``/healthz``, ``/readyz``.

The webhook handler is deliberately lean — aiohttp's low-level server (no router, no middleware),
no per-request logging; one route lookup, the admission checks, and a small JSON answer:

- accepted / duplicate: the route's success status, ``{"receipt_id": N, "duplicate": false}``;
- refused before any write: 400/401/404/405/413/415/429 with ``{"error": "<reason>"}``;
- not durable (database unavailable, pool saturated, shutting down): the route's failure status
  (503 by default) with ``Retry-After``.

Nothing from the request is echoed into a response header (no header injection through us), and
the reasons come from a fixed vocabulary.

``{uri}`` in a signed-content template is the URL the provider called: ``public_base_url`` (setting)
plus the raw path and query when configured, otherwise scheme and host as received (honouring
``X-Forwarded-Proto``/``X-Forwarded-Host`` from a proxy in front — the signature still decides).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import http_exceptions, web

from connector.ingress import metrics
from connector.ingress.admission import BODY_TOO_LARGE, ROUTE_NOT_FOUND, Admission, Outcome

_JSON = "application/json"
_ERROR = b'{"error":"%s"}'
TRANSPORT = "http"
WEBHOOK_PREFIX = "/v1/webhooks/"


class MalformedRequestFilter(logging.Filter):
    """Counts requests the HTTP parser refused (400 before any handler ran) instead of logging them.

    aiohttp logs each with its traceback, and the exception text quotes the offending request line
    — header values included. A flood of malformed requests must not become a flood of log lines
    that echo attacker-chosen (or signature-bearing) bytes; a counter is what an operator needs.
    """

    def __init__(self) -> None:
        super().__init__("connector.ingress.malformed")
        self._counter = metrics.DELIVERIES.labels(TRANSPORT, "rejected", "malformed_http")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            self._counter.inc()
            return False
        return True


MALFORMED_FILTER = MalformedRequestFilter()


def install_log_filter() -> None:
    """Attach the filter to aiohttp's server logger (idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if MALFORMED_FILTER not in logger.filters:
        logger.addFilter(MALFORMED_FILTER)


def _answer(outcome: Outcome) -> web.Response:
    headers = {"Content-Type": _JSON}
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
) -> web.Server:
    """aiohttp's low-level server (no router, no middleware): the path is dispatched here."""
    base = public_base_url.rstrip("/") if public_base_url else None
    count = admission.count
    ack_seconds = metrics.ACK_SECONDS.labels(TRANSPORT)
    max_body = admission.max_body_bytes

    async def read_body(request: web.BaseRequest) -> bytes | None:
        """The whole body, or ``None`` once it exceeds the limit (chunked bodies included)."""
        content = request.content
        chunks: list[bytes] = []
        size = 0
        while chunk := await content.readany():
            size += len(chunk)
            if size > max_body:
                return None
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def webhook(request: web.BaseRequest, namespace: str, route_key: str) -> web.Response:
        received = time.time()
        route = admission.route_for(namespace, route_key, request.method, request.content_length)
        if isinstance(route, Outcome):
            return _answer(count(TRANSPORT, route))
        if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
            # The low-level server has no router to answer this for us (curl sends it for >1 KiB).
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        body = await read_body(request)
        if body is None:
            return _answer(count(TRANSPORT, admission.reject(BODY_TOO_LARGE)))

        def uri() -> str:
            if base is not None:
                return base + request.raw_path
            headers = request.headers
            scheme = headers.get("X-Forwarded-Proto", request.scheme).split(",")[0].strip()
            host = headers.get("X-Forwarded-Host", request.host).split(",")[0].strip()
            return f"{scheme}://{host}{request.raw_path}"

        outcome = await admission.admit(
            route,
            method=request.method,
            headers=request.headers,
            body=body,
            uri=uri,
            received_at=received,
        )
        count(TRANSPORT, outcome)
        if outcome.ok:
            ack_seconds.observe(time.time() - received)
        return _answer(outcome)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path.startswith(WEBHOOK_PREFIX):
            namespace, sep, route_key = path[len(WEBHOOK_PREFIX) :].partition("/")
            if sep and namespace and route_key and "/" not in route_key:
                return await webhook(request, namespace, route_key)
            return _answer(count(TRANSPORT, admission.reject(ROUTE_NOT_FOUND)))
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

    install_log_filter()
    return web.Server(handle, access_log=None)
