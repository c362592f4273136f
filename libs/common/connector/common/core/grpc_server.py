"""gRPC server bootstrap shared by the services: health, reflection, interceptors, shutdown order.

Interceptors, outermost first:
  metrics   the conventional (go-grpc-prometheus) families in the registry of the service that runs
            the server (``GrpcServer(service=...)``): ``grpc_server_started_total``,
            ``grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}`` and the
            ``grpc_server_handling_seconds`` histogram (``grpc_type`` unary or server_stream);
  errors    maps domain errors (``ServiceError``) to canonical codes with a google.rpc.ErrorInfo
            reason; a lost or refused database connection (``db.connection_lost``) to UNAVAILABLE
            ``DATABASE_UNAVAILABLE`` (retryable), a saturated pool to RESOURCE_EXHAUSTED
            ``DATABASE_BUSY``; any other unexpected exception to INTERNAL without detail;
  auth      an optional hook: ``authenticate(method, metadata) -> principal`` raising ServiceError;
            the handler reads the principal with ``current_principal()`` (a grpc.aio context takes
            no new attributes, so it travels in a context variable of the RPC's task);
  input     after auth, before the handler: bytes that do not decode as the request message are
            INVALID_ARGUMENT ``MALFORMED_REQUEST`` (grpc's own answer would be UNKNOWN with the
            decoder's text), and ``grpc_input.check`` applies the servicer's ``input_rules`` (NUL
            characters, string lengths, Timestamp ranges) to every request of every RPC.

Shutdown (STYLE.md): health NOT_SERVING → stop accepting (grace) → caller drains work → pools close.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Counter, Histogram
from psycopg_pool import PoolTimeout

from connector.common.core import grpc_input
from connector.common.core.db import connection_lost
from connector.common.core.metrics import LATENCY_BUCKETS, PerService

log = logging.getLogger(__name__)

ERROR_DOMAIN = "connector.v1"
#: Reasons of the database outcomes every service shares (UNAVAILABLE / RESOURCE_EXHAUSTED).
DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
DATABASE_BUSY = "DATABASE_BUSY"


class _GrpcFamilies:
    """The gRPC server families of one service's registry (labels as go-grpc-prometheus)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter(
            "grpc_server_started_total", "RPCs started on the server", labels, registry=registry
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, by code",
            [*labels, "grpc_code"],
            registry=registry,
        )
        self.seconds = Histogram(
            "grpc_server_handling_seconds",
            "RPC handling time on the server (until the last response message)",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )


GRPC_METRICS = PerService(_GrpcFamilies)


class ServiceError(Exception):
    """A domain error with a canonical code and a machine-readable reason (AIP-193).

    ``message`` is shown to the caller: keep it free of payloads, secrets and tokens.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = metadata or {}


def _status_details(err: ServiceError) -> tuple[tuple[str, bytes]]:
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(
        code=getattr(code_pb2, err.code.name, code_pb2.UNKNOWN), message=err.message, details=[detail]
    )
    return (("grpc-status-details-bin", status.SerializeToString()),)


def error_info(exc: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """Client side: the ErrorInfo carried by a failed call, if any."""
    md = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in md or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info
    return None


Authenticator = Callable[[str, Sequence[tuple[str, Any]]], Awaitable[Any]]

_PRINCIPAL: contextvars.ContextVar[Any] = contextvars.ContextVar("connector_grpc_principal", default=None)


def current_principal() -> Any:
    """The principal the auth hook returned for the RPC being handled (None when unauthenticated)."""
    return _PRINCIPAL.get()


def _code_of(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return exc.code if isinstance(exc, ServiceError) else grpc.StatusCode.UNKNOWN


class _Undecodable:
    """What the request deserializer hands the handler when the bytes are not a valid message."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def _safe_deserializer(deserialize: Callable[[bytes], Any] | None, type_name: str) -> Any:
    if deserialize is None:
        return None

    def safe(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception:
            return _Undecodable(type_name)

    return safe


def _request_type_name(deserialize: Any, method: str) -> str:
    owner = getattr(deserialize, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "name", "") or f"{method.rsplit('/', 1)[-1]} request")


def _checked(request: Any, rules: grpc_input.InputRules) -> None:
    """The input stage: INVALID_ARGUMENT for undecodable bytes and for requests breaking a rule."""
    try:
        if isinstance(request, _Undecodable):
            raise grpc_input.malformed(request.type_name, rules)
        if isinstance(request, Message):
            grpc_input.check(request, rules)
    except grpc_input.InputError as exc:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, exc.reason, exc.message, exc.metadata) from None


def _translated(exc: BaseException, method: str) -> BaseException:
    """Database outcomes every service shares, as canonical errors (never INTERNAL)."""
    if isinstance(exc, ServiceError | asyncio.CancelledError):
        return exc
    if connection_lost(exc):
        log.warning(
            "database connection lost or refused", extra={"rpc": method, "exc_type": type(exc).__name__}
        )
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE, DATABASE_UNAVAILABLE, "database unavailable; retry with backoff"
        )
    if isinstance(exc, PoolTimeout):
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, DATABASE_BUSY, "database busy: no connection available"
        )
    return exc


def _split(method: str) -> tuple[str, str]:
    _, service, name = method.split("/", 2) if method.count("/") >= 2 else ("", "unknown", method)
    return service, name


class _Interceptor(grpc.aio.ServerInterceptor):
    """Metrics + error mapping + auth for unary and server-streaming handlers."""

    def __init__(
        self,
        authenticate: Authenticator | None,
        protected_prefixes: tuple[str, ...],
        families: _GrpcFamilies | None = None,
    ) -> None:
        self._families = families or GRPC_METRICS("unattributed")
        self._authenticate = authenticate
        self._protected = protected_prefixes
        #: Input rules per gRPC service full name (``GrpcServer.add``); others get the defaults.
        self.rules: dict[str, grpc_input.InputRules] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        service, name = _split(method)
        needs_auth = self._authenticate is not None and method.startswith(self._protected)
        authenticate = self._authenticate
        rules = self.rules.get(service, grpc_input.DEFAULT_RULES)
        families = self._families
        deserializer = _safe_deserializer(
            handler.request_deserializer, _request_type_name(handler.request_deserializer, method)
        )

        async def _auth(context: grpc.aio.ServicerContext) -> None:
            if needs_auth and authenticate is not None:
                principal = await authenticate(method, context.invocation_metadata() or ())
                _PRINCIPAL.set(principal)

        async def _fail(context: grpc.aio.ServicerContext, exc: BaseException) -> grpc.StatusCode:
            if isinstance(exc, asyncio.CancelledError):  # client cancelled or server stopping
                raise exc
            if isinstance(exc, ServiceError):
                context.set_trailing_metadata(_status_details(exc))
                await context.abort(exc.code, exc.message)
            if isinstance(exc, grpc.aio.AbortError | grpc.aio.UsageError):
                raise exc
            log.error("unexpected error", extra={"rpc": method}, exc_info=exc)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
            return grpc.StatusCode.INTERNAL  # pragma: no cover - abort raises

        def _code(context: grpc.aio.ServicerContext, default: grpc.StatusCode) -> str:
            code = context.code() if hasattr(context, "code") else None
            if isinstance(code, grpc.StatusCode):
                return code.name
            return default.name

        if handler.unary_unary:
            inner = handler.unary_unary

            started = families.started.labels("unary", service, name)
            seconds = families.seconds.labels("unary", service, name)

            async def unary(request, context):
                started.inc()
                start = time.perf_counter()
                code = grpc.StatusCode.OK
                try:
                    await _auth(context)
                    _checked(request, rules)
                    return await inner(request, context)
                except BaseException as raised:
                    exc = _translated(raised, method)
                    code = _code_of(exc)
                    await _fail(context, exc)
                finally:
                    seconds.observe(time.perf_counter() - start)
                    families.handled.labels("unary", service, name, _code(context, code)).inc()

            return grpc.unary_unary_rpc_method_handler(unary, deserializer, handler.response_serializer)
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            stream_started = families.started.labels("server_stream", service, name)
            stream_seconds = families.seconds.labels("server_stream", service, name)

            async def stream(request, context):
                stream_started.inc()
                start = time.perf_counter()
                code = grpc.StatusCode.OK
                try:
                    await _auth(context)
                    _checked(request, rules)
                    async for item in inner_stream(request, context):
                        yield item
                except BaseException as raised:
                    exc = _translated(raised, method)
                    code = _code_of(exc)
                    await _fail(context, exc)
                finally:
                    stream_seconds.observe(time.perf_counter() - start)
                    families.handled.labels("server_stream", service, name, _code(context, code)).inc()

            return grpc.unary_stream_rpc_method_handler(stream, deserializer, handler.response_serializer)
        return handler


class GrpcServer:
    """A grpc.aio server with health + reflection. ``add`` registers servicers before ``start``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        authenticate: Authenticator | None = None,
        protected_prefixes: tuple[str, ...] = (),
        credentials: grpc.ServerCredentials | None = None,
        reuse_port: bool = False,
        service: str = "unattributed",
    ) -> None:
        """``service`` names the registry the gRPC server metrics go to (``connector.common.core.metrics``;
        ``unattributed`` is served by no endpoint)."""
        # SO_REUSEPORT only when asked (several worker processes on one port): otherwise a second
        # server on a taken port must fail instead of silently sharing it.
        self._interceptor = _Interceptor(authenticate, protected_prefixes, GRPC_METRICS(service))
        self.server = grpc.aio.server(
            interceptors=[self._interceptor],
            options=[
                ("grpc.so_reuseport", 1 if reuse_port else 0),
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
            ],
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._service_names: list[str] = [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
        address = f"{host}:{port}"
        self.port = (
            self.server.add_secure_port(address, credentials)
            if credentials is not None
            else self.server.add_insecure_port(address)
        )

    def add(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        """Register ``servicer``; its ``input_rules`` attribute (``grpc_input.InputRules``), when it
        has one, sets the limits its requests are checked against."""
        register(servicer, self.server)
        self._service_names.append(full_name)
        rules = getattr(servicer, "input_rules", None)
        if isinstance(rules, grpc_input.InputRules):
            self._interceptor.rules[full_name] = rules

    async def start(self) -> None:
        reflection.enable_server_reflection([*self._service_names, reflection.SERVICE_NAME], self.server)
        await self.server.start()
        for name in [*self._service_names, ""]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        """Health NOT_SERVING first (load balancers drain), then stop accepting with a grace."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
