"""Admission of one delivery, shared by HTTP and gRPC: every check happens before any write.

Order (cheapest and least trusting first): route known → method → size → non-empty body →
signature (over the raw bytes) → content type and JSON validity → envelope values (delivery id,
event kind, correlation ids) → per-namespace admission limit → durable receipt (group commit). The
answer is the route's success status only once the receipt's batch has committed.

Outcomes carry a reason from a fixed vocabulary (metric label and the ``error`` of a refusal): no
header value, body byte or secret ever appears in an outcome, a log line or a label.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import Counter

from connector.common.core import logs, tracing
from connector.common.core.eventlog import events, safe_token
from connector.common.core.figures import ACCEPTED as FIG_ACCEPTED
from connector.common.core.figures import CLUSTER, Recorder
from connector.common.core.figures import DUPLICATE as FIG_DUPLICATE
from connector.common.core.figures import REJECTED as FIG_REJECTED
from connector.common.core.figures import UNAVAILABLE as FIG_UNAVAILABLE
from connector.common.packs.jsonvalues import MAX_VALUE_CHARS, scalar_text
from connector.ingress import metrics, verify
from connector.ingress.receipts import PendingReceipt, ReceiptWriter, Unavailable
from connector.ingress.routes import CompiledRoute, RouteTable

#: ``CONNECTOR_LOG_DELIVERIES``: one line per accepted / duplicate delivery (off in the service).
DELIVERY_LOG: Final = logging.getLogger("connector.ingress.deliveries")

ACCEPTED: Final = "accepted"
DUPLICATE: Final = "duplicate"
REJECTED: Final = "rejected"
UNAVAILABLE: Final = "unavailable"

# Refusal reasons before any write, and their HTTP statuses.
ROUTE_NOT_FOUND: Final = "route_not_found"
METHOD_NOT_ALLOWED: Final = "method_not_allowed"
BODY_TOO_LARGE: Final = "body_too_large"
BODY_EMPTY: Final = "body_empty"
INVALID_JSON: Final = "invalid_json"
UNSUPPORTED_MEDIA_TYPE: Final = "unsupported_media_type"
BAD_HEADER: Final = "bad_header"
BAD_URI: Final = "bad_uri"
NAMESPACE_LIMIT: Final = "namespace_limit"

REJECT_STATUS: Final[dict[str, int]] = {
    ROUTE_NOT_FOUND: 404,
    METHOD_NOT_ALLOWED: 405,
    BODY_TOO_LARGE: 413,
    BODY_EMPTY: 400,
    INVALID_JSON: 400,
    UNSUPPORTED_MEDIA_TYPE: 415,
    BAD_HEADER: 400,
    BAD_URI: 400,
    NAMESPACE_LIMIT: 429,
}
VERIFY_STATUS: Final = 401
#: An outcome's index in the figures' answer counts (connector.common.core.figures).
FIGURE_OF: Final[dict[str, int]] = {
    ACCEPTED: FIG_ACCEPTED,
    DUPLICATE: FIG_DUPLICATE,
    REJECTED: FIG_REJECTED,
    UNAVAILABLE: FIG_UNAVAILABLE,
}
#: Failure status when no route is known (the route's own ``failure_status`` otherwise).
DEFAULT_FAILURE_STATUS: Final = 503


#: Bodies at least this large are hashed (signature, payload digest) in a worker thread: hashlib
#: and hmac release the GIL over large inputs, so a flood of large refused bodies (each one HMAC'd
#: before its refusal, ~2.5 ms per MiB) does not hold the event loop every other delivery waits on.
OFFLOAD_BYTES: Final = 128 * 1024


def _sha256(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


def receipt_key(route_key: str, delivery_id: str) -> str:
    """The idempotency key of a delivery with a provider delivery id: a webhook and its reconciled
    copy (connector.ingress.reconcile) have the same one, so the unique index makes them one receipt.
    (Without a delivery id the key is the body's digest; such routes cannot be reconciled.) ``_admit``
    spells it inline (no call per delivery); tests/ingress/test_reconcile.py's race test proves both
    give one receipt."""
    return f"{route_key}:id:{delivery_id}"


#: Answers a sender may never send again unless its contract says it retries (docs/reconcile.md):
#: every ``unavailable`` answer, and these refusals of deliveries that may be genuine.
LOSABLE_REFUSALS: Final = frozenset({NAMESPACE_LIMIT, "body_timeout"})


class InvalidInput(Exception):
    """Raised by a lazily computed input (the ``{uri}`` of a signed-content template) that cannot be
    used, e.g. a ``Host`` that is not valid UTF-8: the delivery is refused with ``reason`` (400),
    never an internal error."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Outcome:
    """The answer to one delivery."""

    __slots__ = ("allow", "outcome", "reason", "receipt_id", "retry_after", "route", "status")

    def __init__(
        self,
        status: int,
        outcome: str,
        reason: str,
        *,
        receipt_id: int | None = None,
        retry_after: int | None = None,
        allow: str | None = None,
    ) -> None:
        self.status = status
        self.outcome = outcome
        self.reason = reason
        self.receipt_id = receipt_id
        self.retry_after = retry_after
        self.allow = allow
        #: The installed route it was answered for (the metrics' namespace/route labels), if any.
        self.route: CompiledRoute | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in (ACCEPTED, DUPLICATE)

    @property
    def duplicate(self) -> bool:
        return self.outcome == DUPLICATE


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: One decoder for every body (``json.loads`` with an argument builds a new one per call).
_DECODE = json.JSONDecoder(parse_constant=_reject_constant).decode


def parse_json(body: bytes) -> Any:
    """Strict RFC 8259 JSON: UTF-8, no BOM, no NaN/Infinity. Raises ``ValueError``."""
    try:
        return _DECODE(body.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError("not JSON") from exc


def is_json_media_type(content_type: str | None) -> bool:
    if not content_type:
        return True  # absent: the body decides
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def safe_header_value(value: str | None) -> str | None:
    """A header value fit to store in the envelope (printable, bounded), else ``None``."""
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_VALUE_CHARS or not value.isprintable():
        return None
    return value


class Admission:
    def __init__(
        self,
        routes: RouteTable,
        writer: ReceiptWriter,
        *,
        max_body_bytes: int,
        namespace_max_inflight: int,
        retry_after_s: int,
    ) -> None:
        self.routes = routes
        self.writer = writer
        self.max_body_bytes = max_body_bytes
        self.namespace_max_inflight = namespace_max_inflight
        self.retry_after_s = retry_after_s
        self._inflight: dict[str, int] = {}
        self.inflight_total = 0
        self._counters: dict[tuple[str, str, str], Counter] = {}
        self._route_counters: dict[tuple[str, str, str], Counter] = {}
        #: Refusal lines (docs/ingress.md, "Logs"): rate-limited per reason.
        self.events = events("ingress")
        #: One line per accepted / duplicate delivery too (``CONNECTOR_LOG_DELIVERIES``: ``connector
        #: up`` turns it on; off in the service, where it would be a line per delivery).
        self.log_deliveries = logs.DELIVERIES
        #: Answers and ack latency per pack, flushed to the cluster's figures by the service's
        #: figures job (docs/metrics.md "Figures without Prometheus"); in memory only.
        self.figures = Recorder()

    # -- outcomes ------------------------------------------------------------------------------

    def count(
        self, transport: str, outcome: Outcome, request_id: str | None = None, peer: str | None = None
    ) -> Outcome:
        """Counts an answer; a refusal (rejected or unavailable) also writes one rate-limited INFO
        line: namespace and route (installed names, else ``_unknown``), reason, status, transport,
        the request id and the peer (both already sanitized by the caller). Nothing else."""
        key = (transport, outcome.outcome, outcome.reason)
        child = self._counters.get(key)
        if child is None:
            child = self._counters[key] = metrics.DELIVERIES.labels(*key)
        child.inc()
        # By route: only installed routes are label values; any other path counts as one value.
        route = outcome.route
        rkey = (
            (route.namespace, route.route_key, outcome.outcome)
            if route is not None
            else (metrics.UNKNOWN_ROUTE, metrics.UNKNOWN_ROUTE, outcome.outcome)
        )
        rchild = self._route_counters.get(rkey)
        if rchild is None:
            rchild = self._route_counters[rkey] = metrics.ROUTE_DELIVERIES.labels(*rkey)
        rchild.inc()
        self.figures.answered(
            route.installed_pack_id if route is not None else CLUSTER, FIGURE_OF[outcome.outcome]
        )
        if outcome.outcome != ACCEPTED and outcome.outcome != DUPLICATE:
            if route is not None and (outcome.outcome == UNAVAILABLE or outcome.reason in LOSABLE_REFUSALS):
                metrics.route_refused(route.namespace, route.route_key, route.redelivery)
            self.events.emit(
                "delivery_refused",
                outcome.reason,
                "delivery refused",
                namespace=rkey[0],
                route=rkey[1],
                outcome=outcome.outcome,
                status=outcome.status,
                transport=transport,
                request_id=request_id,
                peer=peer,
            )
        elif self.log_deliveries:
            DELIVERY_LOG.info(
                "delivery duplicate (already accepted)" if outcome.duplicate else "delivery accepted",
                extra={
                    "receipt_id": outcome.receipt_id,
                    "namespace": rkey[0],
                    "route": rkey[1],
                    "transport": transport,
                    "request_id": request_id,
                },
            )
        return outcome

    def _body_differs(self, route: CompiledRoute, receipt_id: int | None, delivery_id: str | None) -> None:
        """A duplicate whose body is not the first one's: counted and logged (never the body)."""
        metrics.REDELIVERY_BODY_DIFFERS.labels(route.namespace, route.route_key).inc()
        self.events.emit(
            "redelivery_body_differs",
            route.route_key,
            "duplicate delivery with a different body: answered as a duplicate, this body is dropped",
            namespace=route.namespace,
            route=route.route_key,
            receipt_id=receipt_id,
            delivery_id=safe_token(delivery_id),
        )

    def reject(self, reason: str, *, allow: str | None = None) -> Outcome:
        return Outcome(REJECT_STATUS.get(reason, VERIFY_STATUS), REJECTED, reason, allow=allow)

    def unavailable(self, route: CompiledRoute | None, reason: str) -> Outcome:
        status = route.failure_status if route is not None else DEFAULT_FAILURE_STATUS
        return Outcome(status, UNAVAILABLE, reason, retry_after=self.retry_after_s)

    # -- the checks ----------------------------------------------------------------------------

    def route_for(
        self, namespace: str, route_key: str, method: str, content_length: int | None
    ) -> CompiledRoute | Outcome:
        """Checks that need no body: known route, method, declared size."""
        route = self.routes.get(namespace, route_key)
        if route is None:
            return self.reject(ROUTE_NOT_FOUND)
        refused: Outcome | None = None
        if method != route.method:
            refused = self.reject(METHOD_NOT_ALLOWED, allow=route.method)
        elif content_length is not None and content_length > self.max_body_bytes:
            refused = self.reject(BODY_TOO_LARGE)
        elif route.unavailable is not None:
            refused = self.unavailable(route, route.unavailable)
        if refused is not None:
            refused.route = route
            return refused
        return route

    async def admit(self, route: CompiledRoute, **kwargs: Any) -> Outcome:
        """``_admit`` (arguments as there), its outcome tagged with the route for the metrics."""
        if tracing.ENABLED:
            return await self._admit_traced(route, **kwargs)
        outcome = await self._admit(route, **kwargs)
        outcome.route = route
        return outcome

    async def _admit_traced(self, route: CompiledRoute, **kwargs: Any) -> Outcome:
        """``admit`` inside the delivery's SERVER span, which continues the sender's trace context
        (``traceparent``; a malformed one is ignored: a new trace) and whose ``traceparent`` the
        receipt stores. Attributes: names and ids only (docs/tracing.md)."""
        span = tracing.start_server_span(
            tracing.INGRESS_SPAN,
            kwargs["headers"],
            {"connector.namespace": route.namespace, "connector.route_key": route.route_key},
        )
        try:
            outcome = await self._admit(route, traceparent=tracing.traceparent_of(span), **kwargs)
            outcome.route = route
            span.set_attribute("connector.outcome", outcome.outcome)
            span.set_attribute("http.response.status_code", outcome.status)
            if outcome.receipt_id is not None:
                span.set_attribute("connector.receipt_id", outcome.receipt_id)
            if not outcome.ok:
                span.set_attribute("connector.reason", outcome.reason)
                if outcome.outcome == UNAVAILABLE:
                    tracing.set_error(span, outcome.reason)
            return outcome
        finally:
            span.end()

    async def _admit(
        self,
        route: CompiledRoute,
        *,
        method: str,
        headers: verify.Headers,
        body: bytes,
        uri: Callable[[], str],
        received_at: float,
        now: float | None = None,
        traceparent: str | None = None,
    ) -> Outcome:
        """Verify, then make the receipt durable. ``route_for`` has been passed already.

        ``now`` is the clock signature timestamps are checked against (default ``received_at``; a
        gateway's own receive time is stored but never widens the replay window)."""
        if len(body) > self.max_body_bytes:
            return self.reject(BODY_TOO_LARGE)
        if not body:
            return self.reject(BODY_EMPTY)
        verifier = route.verifier
        if verifier is None:  # an unavailable route never gets here (route_for answers first)
            return self.unavailable(route, route.unavailable or "route_invalid")
        try:
            clock = received_at if now is None else now
            if len(body) >= OFFLOAD_BYTES:  # HMAC/sha256 release the GIL: off the event loop
                verification = await asyncio.to_thread(verifier.verify, headers, body, method, uri, clock)
            else:
                verification = verifier.verify(headers, body, method, uri, clock)
        except verify.Rejected as exc:
            return Outcome(VERIFY_STATUS, REJECTED, exc.reason)
        except InvalidInput as exc:
            return self.reject(exc.reason)
        raw_content_type = headers.get("Content-Type")
        doc: Any = None
        if route.content_json:
            if not is_json_media_type(raw_content_type):
                return self.reject(UNSUPPORTED_MEDIA_TYPE)
            try:
                doc = parse_json(body)
            except ValueError:
                return self.reject(INVALID_JSON)
        elif route.parse_body:
            try:
                doc = parse_json(body)
            except ValueError:
                doc = None
        delivery_id: str | None = None
        if route.idempotency_header is not None:
            values = headers.getall(route.idempotency_header, ())
            if len(values) > 1:
                return self.reject(BAD_HEADER)
            if values:
                delivery_id = scalar_text(values[0].strip())
                if delivery_id is None:
                    return self.reject(BAD_HEADER)
        event_kind: str | None = None
        correlation = "{}"
        if route.envelope is not None:
            event_kind, extracted_id, ids = route.envelope(headers.get, doc)
            if delivery_id is None:
                delivery_id = extracted_id
            if ids:
                correlation = json.dumps(ids, separators=(",", ":"), sort_keys=True)
        if len(body) >= OFFLOAD_BYTES:
            payload_sha256 = await asyncio.to_thread(_sha256, body)
        else:
            payload_sha256 = hashlib.sha256(body).digest()
        if delivery_id is not None:
            idempotency_key = f"{route.route_key}:id:{delivery_id}"  # receipt_key(), inlined: hot path
        else:
            idempotency_key = f"{route.route_key}:sha256:{payload_sha256.hex()}"

        namespace = route.namespace
        inflight = self._inflight.get(namespace, 0)
        if inflight >= self.namespace_max_inflight:
            return Outcome(
                REJECT_STATUS[NAMESPACE_LIMIT], REJECTED, NAMESPACE_LIMIT, retry_after=self.retry_after_s
            )
        item = PendingReceipt(
            namespace=namespace,
            route_key=route.route_key,
            route_id=route.route_id,
            route_version=route.route_version,
            provider_delivery_id=delivery_id,
            idempotency_key=idempotency_key,
            method=method,
            content_type=safe_header_value(raw_content_type),
            event_kind=event_kind,
            received_at=received_at,
            correlation_ids=correlation,
            payload_sha256=payload_sha256,
            body=body,
            verification=verification,
            traceparent=traceparent,
        )
        try:
            future = self.writer.submit(item)
        except Unavailable as exc:
            return self.unavailable(route, exc.reason)
        self._inflight[namespace] = inflight + 1
        self.inflight_total += 1
        try:
            result = await future
        finally:
            self.inflight_total -= 1
            left = self._inflight[namespace] - 1
            if left:
                self._inflight[namespace] = left
            else:
                del self._inflight[namespace]
        if result.failure is not None:
            return self.unavailable(route, result.failure)
        if result.body_differs:
            self._body_differs(route, result.receipt_id, delivery_id)
        return Outcome(
            route.success_status,
            DUPLICATE if result.duplicate else ACCEPTED,
            "none",
            receipt_id=result.receipt_id,
        )
