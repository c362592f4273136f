"""``connector.v1.IngressService``: the same admission as HTTP, for gateways holding the raw request.

Mapping: accepted/duplicate → ``SubmitDeliveryResponse`` (with the HTTP status the route answers);
refusals → canonical codes with an ``ErrorInfo`` reason (the admission reason, upper-cased) and
``http_status`` (plus ``retry_after_s`` when set) in its metadata, so a gateway can answer the
provider exactly as the HTTP endpoint would:

    route_not_found → NOT_FOUND            signature/timestamp/id problems → UNAUTHENTICATED
    namespace_limit → RESOURCE_EXHAUSTED   database unavailable / overloaded → UNAVAILABLE
    every other refusal (method, size, empty, JSON, media type, header) → INVALID_ARGUMENT

Before the handler runs, the server's input stage (``connector.common.core.grpc_input``) refuses, with
INVALID_ARGUMENT and ``http_status`` 400: bytes that are not a SubmitDeliveryRequest
(``MALFORMED_REQUEST``), a string (namespace, route key, method, URI, header names and values)
longer than ``MAX_STRING`` (``STRING_TOO_LONG``) or, outside the headers, holding a NUL character
(``INVALID_STRING``; in a header it is ``BAD_HEADER``, as over HTTP), and a ``receive_time``
outside the Timestamp range (``INVALID_TIMESTAMP``). The handler then refuses a ``receive_time``
before 1970-01-01 or more than ``RECEIVE_TIME_MAX_AHEAD_S`` ahead of this server's clock
(``INVALID_RECEIVE_TIME``): it is stored as the receipt's ``received_at``, and instants near the
Timestamp range's ends do not survive the database and back (9999-12-31T23:59:59.9999999 rounds to
year 10000, which Python cannot read; year 1 reads as year 0 in a time zone west of UTC). Nothing is
written and the value is never echoed or logged.

Request id and logs (docs/ingress.md, "Logs"): the call's ``x-request-id`` metadata when it is a
safe bounded token, else one made here, is answered as ``x-request-id`` trailing metadata and, on a
refusal, as the ``request_id`` of the ``ErrorInfo`` metadata. Every refusal the handler answers
writes one rate-limited INFO line (``Admission.count``) with it and the peer (the gateway's address
from the gRPC peer string; a canonical IP only).
"""

from __future__ import annotations

import re
import time
from datetime import UTC
from typing import Any

import grpc
from multidict import CIMultiDict

from connector.common.core.eventlog import new_request_id, safe_peer, safe_token
from connector.common.core.grpc_input import InputRules
from connector.common.core.grpc_server import ServiceError
from connector.ingress import admission as adm
from connector.ingress import metrics
from connector.ingress.admission import Admission, Outcome
from connector.v1 import ingress_service_pb2 as pb
from connector.v1 import ingress_service_pb2_grpc as pb_grpc

TRANSPORT = "grpc"
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
# Header values may hold visible characters, spaces and tabs (RFC 9110 field-value), nothing else.
_BAD_VALUE_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

#: Longest string field (characters): the HTTP listener's own limit for a request line or header.
MAX_STRING = 8192
#: A gateway's clock may run this far ahead of ours (seconds); a later receive_time is refused.
RECEIVE_TIME_MAX_AHEAD_S = 300.0

_CODES = {
    adm.ROUTE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    adm.NAMESPACE_LIMIT: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _peer(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """``ipv4:1.2.3.4:5678`` / ``ipv6:[::1]:5678`` → the address (``safe_peer``)."""
    text = context.peer() or ""
    kind, _, rest = text.partition(":")
    if kind == "ipv4":
        rest = rest.rpartition(":")[0]
    elif kind == "ipv6":
        rest = rest.rpartition(":")[0].strip("[]")
    else:
        return "unknown" if not text else "invalid"
    return safe_peer(rest)


def _request_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and isinstance(value, str):
            return safe_token(value) or new_request_id()
    return new_request_id()


def _code(outcome: Outcome) -> grpc.StatusCode:
    if outcome.outcome == adm.UNAVAILABLE:
        return grpc.StatusCode.UNAVAILABLE
    if outcome.status == adm.VERIFY_STATUS:
        return grpc.StatusCode.UNAUTHENTICATED
    return _CODES.get(outcome.reason, grpc.StatusCode.INVALID_ARGUMENT)


class IngressServicer(pb_grpc.IngressServiceServicer):
    #: Read by ``GrpcServer.add``: the input stage's limits, and the HTTP status a gateway answers.
    input_rules = InputRules(
        max_length=MAX_STRING,
        error_metadata={"http_status": "400"},
        nul_checked_by_handler=frozenset({"headers"}),  # BAD_HEADER, as over HTTP
    )

    def __init__(self, admission: Admission, *, public_base_url: str | None = None) -> None:
        self._admission = admission
        self._base = public_base_url.rstrip("/") if public_base_url else None

    def _fail(self, outcome: Outcome, request_id: str) -> ServiceError:
        metadata = {"http_status": str(outcome.status), "request_id": request_id}
        if outcome.retry_after is not None:
            metadata["retry_after_s"] = str(outcome.retry_after)
        return ServiceError(
            _code(outcome), outcome.reason.upper(), f"delivery refused: {outcome.reason}", metadata
        )

    async def SubmitDelivery(
        self, request: pb.SubmitDeliveryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SubmitDeliveryResponse:
        admission = self._admission
        rid = _request_id(context)
        context.set_trailing_metadata((("x-request-id", rid),))
        now = time.time()
        received = (
            request.receive_time.ToDatetime(tzinfo=UTC).timestamp()
            if request.HasField("receive_time")
            else now
        )
        if not 0 <= received <= now + RECEIVE_TIME_MAX_AHEAD_S:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_RECEIVE_TIME",
                f"receive_time must be after 1970-01-01 and at most {RECEIVE_TIME_MAX_AHEAD_S:g} s ahead"
                " of the server's clock",
                {"http_status": "400", "field": "receive_time"},
            )
        method = (request.method or "POST").upper()
        body = bytes(request.body)
        route = admission.route_for(request.namespace, request.route_key, method, len(body))
        if isinstance(route, Outcome):
            raise self._fail(admission.count(TRANSPORT, route, rid, _peer(context)), rid)
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in request.headers.items():
            if not _TOKEN_RE.match(name) or _BAD_VALUE_RE.search(value):
                refusal = admission.reject(adm.BAD_HEADER)
                raise self._fail(admission.count(TRANSPORT, refusal, rid, _peer(context)), rid)
            headers.add(name, value)
        raw_uri = request.uri or "/"

        def uri() -> str:
            if raw_uri.startswith(("https://", "http://")):
                return raw_uri
            if self._base is not None:
                return self._base + raw_uri
            scheme = headers.get("X-Forwarded-Proto", "https").split(",")[0].strip()
            host = headers.get("X-Forwarded-Host", headers.get("Host", "")).split(",")[0].strip()
            return f"{scheme}://{host}{raw_uri}"

        outcome = await admission.admit(
            route, method=method, headers=headers, body=body, uri=uri, received_at=received, now=now
        )
        if not outcome.ok:
            raise self._fail(admission.count(TRANSPORT, outcome, rid, _peer(context)), rid)
        admission.count(TRANSPORT, outcome)
        # ack latency as the HTTP edge records it (request to answer), from this server's own clock:
        # a caller's receive_time is an earlier hop's instant
        took = time.time() - now
        metrics.ACK_SECONDS.labels(TRANSPORT).observe(took)
        admission.figures.acked(route.installed_pack_id, took)
        return pb.SubmitDeliveryResponse(
            receipt_id=outcome.receipt_id or 0, duplicate=outcome.duplicate, http_status=outcome.status
        )


def register(servicer: IngressServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_IngressServiceServicer_to_server(servicer, server)


FULL_NAME = pb.DESCRIPTOR.services_by_name["IngressService"].full_name
