"""OpenTelemetry traces: one trace per delivery across the ingress, the materializer and the
executor (docs/tracing.md).

**Off unless the standard variables turn it on.** ``setup`` reads the OpenTelemetry SDK's own
variables: ``OTEL_SDK_DISABLED=true`` turns it off; otherwise it is on when ``OTEL_TRACES_EXPORTER``
names at least one exporter (unset or ``none``: off — the one deliberate difference from the SDK,
whose default is ``otlp``: the OTLP exporter is an optional extra, ``pip install
connector-runtime[otlp]``). Exporters are found through the standard ``opentelemetry_traces_exporter``
entry points (``otlp`` with ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``, ``otlp_proto_grpc``,
``otlp_proto_http``, ``console``, and this package's ``connector_jsonl``); everything else is the
SDK's: ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` (default ``service.name``:
``connector-<service>``), ``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_BSP_*``, ``OTEL_SPAN_*_LIMIT``,
``OTEL_EXPORTER_OTLP_*``, and ``OTEL_PROPAGATORS`` for the context read from a provider's request
and written to handler calls.

While it is off the hot paths test one module attribute (``ENABLED``) and do nothing else: no
span objects, no context, nothing stored (the receipt's and WorkItem's ``traceparent`` stay NULL).

**The context between the services** travels in the database: the ingress stores its span's W3C
``traceparent`` on the receipt (the same group-commit statement: no extra round trip), the
materializer's span continues it and stores its own on each WorkItem it creates (the same insert),
and each handler attempt's span continues that. Inside the database the format is always W3C
``traceparent`` (``OTEL_PROPAGATORS`` governs only what is read from and written to the outside).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

#: True once ``setup`` configured a tracer provider. Hot paths read ``tracing.ENABLED``.
ENABLED: bool = False

TRACEPARENT: Final = "traceparent"
#: Where the ``connector_jsonl`` exporter appends one JSON line per span (no standard variable
#: exists for a file exporter's path).
JSONL_PATH_ENV: Final = "CONNECTOR_TRACES_JSONL_PATH"

# Span names (docs/tracing.md lists their attributes).
INGRESS_SPAN: Final = "connector.ingress.delivery"
ROUTE_SPAN: Final = "connector.materializer.route"
ATTEMPT_SPAN: Final = "connector.executor.attempt"

_tracer: Tracer | None = None
_provider: Any = None


class TracingError(SystemExit):
    """Tracing was asked for (``OTEL_TRACES_EXPORTER``) but cannot be set up; the message says why."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Do the standard variables ask for traces? (``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER``)"""
    env = os.environ if environ is None else environ
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return False
    names = (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    return bool(names) and names != "none"


def setup(service: str) -> bool:
    """Configure the global tracer provider for ``service`` (``ingress``, ``materializer``,
    ``executor``, ...) when the standard variables ask for it; returns whether tracing is on.
    Raises ``TracingError`` (exit 2 with one line) for an exporter that is not installed."""
    global ENABLED, _tracer, _provider
    if ENABLED or not requested():
        return ENABLED
    from opentelemetry import trace
    from opentelemetry.sdk._configuration import _get_exporter_names, _import_exporters
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    try:
        exporters, _, _ = _import_exporters(_get_exporter_names("traces"), [], [])
    except RuntimeError as exc:
        raise TracingError(
            f"connector {service}: OTEL_TRACES_EXPORTER: {exc} (the OTLP exporters come with "
            "`pip install connector-runtime[otlp]`; `none` or unset turns tracing off)"
        ) from None
    env = os.environ
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {SERVICE_NAME: f"connector-{service}"})
    provider = TracerProvider(resource=resource)  # sampler and span limits: OTEL_* (the SDK reads them)
    for exporter_class in exporters.values():
        provider.add_span_processor(BatchSpanProcessor(exporter_class()))  # OTEL_BSP_*
    trace.set_tracer_provider(provider)
    _bind()
    _provider = provider
    _tracer = trace.get_tracer("connector")
    ENABLED = True
    log.info(
        "tracing on",
        extra={"exporters": ",".join(exporters), "service_name": resource.attributes.get(SERVICE_NAME)},
    )
    return True


def shutdown() -> None:
    """Export what is buffered and stop (end of the process; a no-op while tracing is off)."""
    global ENABLED, _provider, _tracer
    provider, _provider = _provider, None
    ENABLED = False
    _tracer = None
    if provider is not None:
        provider.shutdown()


# --------------------------------------------------------------------------------------------------
# Spans (call only while ENABLED)
# --------------------------------------------------------------------------------------------------


# The API pieces the span helpers use, bound once by ``setup`` (no import statement on a hot path).
_api: Any = None


def _bind() -> None:
    global _api
    from types import SimpleNamespace

    from opentelemetry import context, propagate, trace

    _api = SimpleNamespace(
        attach=context.attach,
        detach=context.detach,
        extract=propagate.extract,
        inject=propagate.inject,
        in_context=trace.set_span_in_context,
        NonRecordingSpan=trace.NonRecordingSpan,
        SpanContext=trace.SpanContext,
        TraceFlags=trace.TraceFlags,
        SERVER=trace.SpanKind.SERVER,
        CONSUMER=trace.SpanKind.CONSUMER,
        Status=trace.Status,
        ERROR=trace.StatusCode.ERROR,
    )


def traceparent_of(span: Span) -> str:
    """The W3C ``traceparent`` of ``span`` (what the database stores)."""
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def parent_context(traceparent: str) -> Any:
    """The context of a stored W3C ``traceparent`` (written by this module: version 00, 55
    characters), or ``None`` when it is not one. A direct parse: the propagator's regular
    expression costs several times more per attempt."""
    if len(traceparent) != 55 or not traceparent.startswith("00-") or traceparent[35] != "-":
        return None
    try:
        trace_id = int(traceparent[3:35], 16)
        span_id = int(traceparent[36:52], 16)
        flags = int(traceparent[53:55], 16)
    except ValueError:
        return None
    if not trace_id or not span_id or traceparent[52] != "-":
        return None
    api = _api
    return api.in_context(
        api.NonRecordingSpan(api.SpanContext(trace_id, span_id, True, api.TraceFlags(flags)))
    )


def start_server_span(name: str, headers: Any, attributes: Mapping[str, Any]) -> Span:
    """A SERVER span continuing the context a sender put in ``headers`` (``OTEL_PROPAGATORS``:
    W3C ``traceparent`` by default); a missing or malformed one starts a new trace."""
    assert _tracer is not None
    try:
        parent = _api.extract(headers)
    except Exception:  # a sender's header must never fail the request
        parent = None
    return _tracer.start_span(name, context=parent, kind=_api.SERVER, attributes=attributes)


def start_span(name: str, traceparent: str | None, attributes: Mapping[str, Any]) -> Span:
    """A CONSUMER span whose parent is the stored W3C ``traceparent`` (a new trace when ``None``)."""
    assert _tracer is not None
    parent = parent_context(traceparent) if traceparent else None
    return _tracer.start_span(name, context=parent, kind=_api.CONSUMER, attributes=attributes)


def activate(span: Span) -> object:
    """Make ``span`` the current span (a python handler's own spans nest under it); returns the
    token for ``deactivate``."""
    return _api.attach(_api.in_context(span))


def deactivate(token: object) -> None:
    _api.detach(token)


def set_error(span: Span, failure_class: str) -> None:
    span.set_status(_api.Status(_api.ERROR, failure_class))


# --------------------------------------------------------------------------------------------------
# What handlers receive (any time: a stored context is passed on even while this process does not
# trace)
# --------------------------------------------------------------------------------------------------

_outgoing_cache: tuple[str, dict[str, str]] | None = None


def outgoing(traceparent: str) -> dict[str, str]:
    """The headers (HTTP) or metadata (gRPC) that carry ``traceparent`` to a handler, written by the
    configured propagators (``OTEL_PROPAGATORS``; default W3C ``traceparent``)."""
    global _outgoing_cache
    cached = _outgoing_cache
    if cached is not None and cached[0] == traceparent:
        return cached[1]
    if _api is None:
        _bind()
    carrier: dict[str, str] = {}
    parent = parent_context(traceparent)
    if parent is not None:
        _api.inject(carrier, context=parent)
    _outgoing_cache = (traceparent, carrier)
    return carrier


def incoming(carrier: Any) -> str | None:
    """The W3C ``traceparent`` of the context in ``carrier`` (headers or gRPC metadata as a
    mapping), read by the configured propagators; ``None`` when there is none or it is malformed."""
    from opentelemetry import propagate, trace

    try:
        span = trace.get_current_span(propagate.extract(carrier))
    except Exception:
        return None
    c = span.get_span_context()
    if not c.is_valid:
        return None
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


# --------------------------------------------------------------------------------------------------
# A file exporter: one JSON line per span (tests, local debugging). OTEL_TRACES_EXPORTER=connector_jsonl
# and CONNECTOR_TRACES_JSONL_PATH=/path/spans.jsonl.
# --------------------------------------------------------------------------------------------------

try:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLinesSpanExporter(SpanExporter):
        """Appends one JSON object per finished span to ``CONNECTOR_TRACES_JSONL_PATH``: name, kind,
        ids (hex), parent span id, start/end (ns), attributes, status and the resource's
        ``service.name``. One ``write`` per exported batch, the file opened in append mode, so
        several processes can share one file."""

        def __init__(self, path: str | None = None) -> None:
            path = path or os.environ.get(JSONL_PATH_ENV)
            if not path:
                raise TracingError(f"the connector_jsonl trace exporter needs {JSONL_PATH_ENV}")
            self._path = path
            self._lock = threading.Lock()

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            lines = "".join(json.dumps(span_record(s), separators=(",", ":")) + "\n" for s in spans)
            with self._lock, open(self._path, "a", encoding="utf-8") as f:
                f.write(lines)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

except ImportError:  # pragma: no cover - the SDK is a dependency
    pass


def span_record(span: Any) -> dict[str, Any]:
    c = span.context
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{c.trace_id:032x}",
        "span_id": f"{c.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "service": (span.resource.attributes or {}).get("service.name"),
    }


def read_jsonl(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The span records of a ``connector_jsonl`` file (tests)."""
    return [json.loads(line) for line in lines if line.strip()]
