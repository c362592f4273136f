"""Traces across the three services as real processes (docs/tracing.md).

The ingress, the materializer and the executor run as ``connector`` processes with the standard
variables turning tracing on (``OTEL_TRACES_EXPORTER=connector_jsonl``: this package's exporter,
registered through the standard entry-point group, one JSON line per span to a file per process).
One pack fans each signed delivery out to three work types — an HTTP handler, a remote gRPC
``WorkHandlerService`` (``handlers/server.py``) and a python handler — all served by this test.

Proved for each delivery: one trace id across the ingress span, the materializer's routing span and
every handler attempt's span (parent links ingress → route → attempt), the one the receipt and the
WorkItems store, and the ``traceparent`` each handler receives (HTTP header, gRPC metadata,
``ctx.traceparent`` plus the current span for python) is its attempt's span. A delivery carrying a
provider ``traceparent`` keeps the provider's trace id, over HTTP and through a gateway's
``IngressService.SubmitDelivery``; malformed ones start a new trace and are accepted (never a
4xx/5xx). Span attributes hold ids and names, never the payload.

Controls: the same run with propagation disabled (``OTEL_PROPAGATORS=none``) fails the check —
the provider's trace id is not kept and the handlers receive no ``traceparent``; and with the
variables unset (the default) nothing is traced or stored at all.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import e2e_bench  # noqa: E402
from connector.common.core import tracing  # noqa: E402
from connector.common.core.grpc_server import GrpcServer  # noqa: E402
from connector.executor.handlers import HandlerContext  # noqa: E402
from connector.executor.handlers.server import register as register_work_handler  # noqa: E402

NAMESPACE = "traced"
ROUTE_KEY = "events"
WORK_TYPES = ("http", "grpc", "python", "flaky")
PROVIDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PROVIDER_SPAN = "00f067aa0ba902b7"
GATEWAY_TRACE = "0af7651916cd43dd8448eb211c80319c"
#: Each delivery's ``traceparent`` header (None: none sent). ``grpc_*``: through a gateway's
#: ``IngressService.SubmitDelivery`` (the provider's headers in the request), the others over HTTP.
DELIVERIES: dict[str, str | None] = {
    "plain": None,
    "provider": f"00-{PROVIDER_TRACE}-{PROVIDER_SPAN}-01",
    "malformed": "00-not-a-trace-context-at-all",
    "zero_trace": f"00-{'0' * 32}-{PROVIDER_SPAN}-01",  # all-zero trace id: invalid (W3C)
    "overlong": "00-" + "a" * 5000,
    "grpc_provider": f"00-{GATEWAY_TRACE}-{PROVIDER_SPAN}-01",
    "grpc_malformed": "00-zz-zz-zz",
}
#: Deliveries whose trace must be the sender's (trace id, parent span id).
CONTINUED = {"provider": (PROVIDER_TRACE, PROVIDER_SPAN), "grpc_provider": (GATEWAY_TRACE, PROVIDER_SPAN)}


class Handlers:
    """An HTTP receiver and a gRPC WorkHandlerService on real ports, in a thread with its own event
    loop; each records the trace context it was called with."""

    def __init__(self) -> None:
        self.http: list[dict[str, Any]] = []
        self.grpc: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.http_port = 0
        self.grpc_port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._server: GrpcServer | None = None

    async def _start(self) -> None:
        async def work(request: web.Request) -> web.Response:
            doc = await request.json()
            self.http.append(
                {"work_id": doc["work_item"]["work_id"], "traceparent": request.headers.get("traceparent")}
            )
            return web.Response(status=200)

        app = web.Application()
        app.router.add_post("/work", work)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        async def remote(ctx: HandlerContext) -> None:
            self.grpc.append({"work_id": ctx.work_id, "traceparent": ctx.traceparent})

        self._server = GrpcServer(port=0)
        register_work_handler(self._server, remote)
        await self._server.start()
        self.grpc_port = self._server.port

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            await self._server.stop(0)

    def __enter__(self) -> Handlers:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def _manifest(handlers: Handlers) -> dict[str, Any]:
    return {
        "name": "traced-pack",
        "namespace": NAMESPACE,
        "work_types": {
            "http": {"handler": {"kind": "http", "target": f"http://127.0.0.1:{handlers.http_port}/work"}},
            "grpc": {"handler": {"kind": "grpc", "target": f"127.0.0.1:{handlers.grpc_port}"}},
            "python": {"handler": {"kind": "python", "target": "tests.tracing_handlers:record"}},
            "flaky": {"handler": {"kind": "python", "target": "tests.tracing_handlers:flaky"}},
        },
        "routes": [
            {
                "key": ROUTE_KEY,
                "verification": {"preset": "standard-webhooks", "secrets": [{"env": e2e_bench.SECRET_ENV}]},
                "idempotency_header": "webhook-id",
                "extract": {"event_kind": {"pointer": "/type"}},
                "fan_out": [{"work_type": w} for w in WORK_TYPES],
            }
        ],
    }


async def _install(url: str, doc: dict[str, Any]) -> None:
    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await install.pack_apply(conn, parse_manifest(doc), activate=True, actor="tracing-test")


def _signed(secret: str, msg_id: str, marker: str, traceparent: str | None) -> tuple[bytes, dict[str, str]]:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    ts = int(time.time())
    body = json.dumps({"type": "traced.event", "id": msg_id, "secret_field": marker}).encode()
    sig = base64.b64encode(hmac.digest(key, f"{msg_id}.{ts}.".encode() + body, "sha256")).decode()
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": f"v1,{sig}",
    }
    if traceparent is not None:
        headers["traceparent"] = traceparent
        headers["tracestate"] = "vendor=opaque"
    return body, headers


def _submit(grpc_port: int, secret: str, msg_id: str, marker: str, traceparent: str | None) -> int:
    """The delivery through ``IngressService.SubmitDelivery``; the answer's HTTP status."""
    import grpc

    from connector.v1 import ingress_service_pb2 as pb
    from connector.v1 import ingress_service_pb2_grpc as pb_grpc

    body, headers = _signed(secret, msg_id, marker, traceparent)
    request = pb.SubmitDeliveryRequest(
        namespace=NAMESPACE, route_key=ROUTE_KEY, method="POST", uri=f"/v1/webhooks/{NAMESPACE}/{ROUTE_KEY}",
        headers=headers, body=body,
    )  # fmt: skip
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        try:
            return int(pb_grpc.IngressServiceStub(channel).SubmitDelivery(request, timeout=10).http_status)
        except grpc.RpcError as exc:
            return {grpc.StatusCode.INVALID_ARGUMENT: 400}.get(exc.code(), 500)


def _post(port: int, secret: str, msg_id: str, marker: str, traceparent: str | None) -> int:
    body, headers = _signed(secret, msg_id, marker, traceparent)
    url = f"http://127.0.0.1:{port}/v1/webhooks/{NAMESPACE}/{ROUTE_KEY}"
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@dataclass
class Run:
    statuses: dict[str, int]
    marker: str
    #: delivery name -> (receipt_id, receipt.traceparent)
    receipts: dict[str, tuple[int, str | None]]
    #: delivery name -> {work_type: (work_id, work_item.traceparent)}
    work: dict[str, dict[str, tuple[int, str | None]]]
    spans: list[dict[str, Any]] = field(default_factory=list)
    http: list[dict[str, Any]] = field(default_factory=list)
    grpc: list[dict[str, Any]] = field(default_factory=list)
    python: list[dict[str, Any]] = field(default_factory=list)
    span_files: list[str] = field(default_factory=list)


def _wait(predicate: Any, what: str, procs: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + 90
    while not predicate():
        for name, p in procs.items():
            if p.poll() is not None:
                log = (logs / f"e2e-{name}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{name} exited with code {p.returncode}:\n{log}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def run_stack(db_url: str, tmp_path: Path, otel_env: dict[str, str]) -> Run:
    """Start the services with ``otel_env`` (plus this test's plumbing), send ``DELIVERIES``, wait
    until every WorkItem succeeded, stop the services (SIGTERM: they flush their spans) and return
    what was recorded."""
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    os.environ[e2e_bench.SECRET_ENV] = secret  # the pack apply checks that the reference resolves
    python_out = tmp_path / "python-handler.jsonl"
    marker = f"payload-marker-{secrets.token_hex(8)}"
    port = e2e_bench._free_port
    http_port, grpc_port = port(), port()
    with Handlers() as handlers, psycopg.connect(db_url, autocommit=True) as conn:
        asyncio.run(_install(db_url, _manifest(handlers)))
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != tracing.JSONL_PATH_ENV
        }
        env.update(
            {
                "CONNECTOR_DATABASE_URL": db_url,
                "CONNECTOR_LOG_LEVEL": "WARNING",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                e2e_bench.SECRET_ENV: secret,
                "TRACING_TEST_PYTHON_OUT": str(python_out),
                "CONNECTOR_MATERIALIZER_GRPC_PORT": str(port()),
                "CONNECTOR_MATERIALIZER_METRICS_PORT": str(port()),
                "CONNECTOR_EXECUTOR_GRPC_PORT": str(port()),
                "CONNECTOR_EXECUTOR_METRICS_PORT": str(port()),
                **otel_env,
            }
        )
        span_files = []

        def env_of(service: str) -> dict[str, str]:
            if "OTEL_TRACES_EXPORTER" not in otel_env:
                return env
            path = tmp_path / f"spans-{service}.jsonl"
            span_files.append(str(path))
            return {**env, tracing.JSONL_PATH_ENV: str(path)}

        ingress_args = ["ingress", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                        "--metrics-port", str(port())]  # fmt: skip
        args = {
            "ingress": ingress_args,
            "materializer": ["materializer"],
            "executor": ["executor", "--no-admin"],
        }
        procs = {name: e2e_bench._spawn(name, a, env_of(name), tmp_path) for name, a in args.items()}
        try:
            e2e_bench._wait_ready(http_port, procs, timeout=90)
            ids = {name: f"{name}-{secrets.token_hex(4)}" for name in DELIVERIES}
            statuses = {
                n: (_submit(grpc_port, secret, ids[n], marker, tp) if n.startswith("grpc_") else
                    _post(http_port, secret, ids[n], marker, tp))
                for n, tp in DELIVERIES.items()
            }  # fmt: skip
            assert all(s == 200 for s in statuses.values()), statuses

            def work_rows() -> list[tuple[Any, ...]]:
                return conn.execute(
                    "SELECT r.provider_delivery_id, r.receipt_id, r.traceparent, w.work_type, w.work_id,"
                    " w.traceparent, w.state FROM connector_ingress_receipt r"
                    " JOIN connector_event e USING (receipt_id) JOIN connector_work_item w USING (event_id)"
                    " WHERE r.provider_delivery_id = ANY(%s)",
                    (list(ids.values()),),
                ).fetchall()

            _wait(
                lambda: (
                    (rows := work_rows())
                    and len(rows) == len(DELIVERIES) * len(WORK_TYPES)
                    and all(r[6] == "succeeded" for r in rows)
                ),
                "every WorkItem to succeed",
                procs,
                tmp_path,
            )
            rows = work_rows()
        finally:
            e2e_bench._stop(list(procs.values()))
        codes = {name: p.returncode for name, p in procs.items()}
        assert codes == dict.fromkeys(procs, 0), codes
        by_id = {v: k for k, v in ids.items()}
        run = Run(statuses=statuses, marker=marker, receipts={}, work={}, span_files=span_files)
        for delivery_id, receipt_id, r_tp, work_type, work_id, w_tp, _state in rows:
            name = by_id[delivery_id]
            run.receipts[name] = (receipt_id, r_tp)
            run.work.setdefault(name, {})[work_type] = (work_id, w_tp)
        run.http, run.grpc = list(handlers.http), list(handlers.grpc)
    run.python = tracing.read_jsonl(python_out.read_text().splitlines()) if python_out.exists() else []
    for path in span_files:
        if Path(path).exists():
            run.spans.extend(tracing.read_jsonl(Path(path).read_text().splitlines()))
    return run


def _one(run: Run, name: str, attribute: str, value: int, what: str) -> dict[str, Any]:
    """The one span called ``name`` whose ``attribute`` is ``value``."""
    spans = [s for s in run.spans if s["name"] == name and s["attributes"].get(attribute) == value]
    assert len(spans) == 1, f"{what}: {len(spans)} spans"
    return spans[0]


def _attempts(run: Run, work_id: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The attempt spans of one WorkItem (with their attributes), in attempt order."""
    spans = [s for s in run.spans if s["name"] == tracing.ATTEMPT_SPAN]
    mine = [(s, s["attributes"]) for s in spans if s["attributes"].get("connector.work_id") == work_id]
    return sorted(mine, key=lambda sa: sa[1]["connector.attempt"])


def _is_traceparent(value: str | None, trace_id: str, span_id: str) -> bool:
    """``value`` is a W3C traceparent naming ``trace_id``/``span_id``, sampled (flag bit 0; the SDK
    also sets bit 1, "random trace id", of Trace Context level 2)."""
    if value is None or not value.startswith(f"00-{trace_id}-{span_id}-") or len(value) != 55:
        return False
    return int(value[-2:], 16) & 1 == 1


def check(run: Run) -> None:
    """Everything the module docstring promises, for every delivery."""
    assert run.statuses == dict.fromkeys(DELIVERIES, 200), run.statuses
    for span in run.spans:  # names and ids only: never the payload
        assert run.marker not in json.dumps(span), f"payload in span {span['name']}"
    seen = {
        "http": {h["work_id"]: h["traceparent"] for h in run.http},
        "grpc": {h["work_id"]: h["traceparent"] for h in run.grpc},
        "python": {h["work_id"]: h for h in run.python},
    }
    trace_ids = set()
    for name, sent in DELIVERIES.items():
        receipt_id, receipt_tp = run.receipts[name]
        ingress = _one(run, tracing.INGRESS_SPAN, "connector.receipt_id", receipt_id, f"{name}: ingress")
        trace_id = ingress["trace_id"]
        assert ingress["service"] == "connector-ingress" and ingress["kind"] == "SERVER"
        assert ingress["attributes"]["connector.outcome"] == "accepted"
        assert ingress["attributes"]["http.response.status_code"] == 200
        if name in CONTINUED:
            assert (trace_id, ingress["parent_span_id"]) == CONTINUED[name], f"{name}: the sender's trace"
        else:
            assert ingress["parent_span_id"] is None, f"{name}: {sent!r} was not ignored"
            assert trace_id != "0" * 32
        trace_ids.add(trace_id)
        assert _is_traceparent(receipt_tp, trace_id, ingress["span_id"]), (name, receipt_tp)

        route = _one(run, tracing.ROUTE_SPAN, "connector.receipt_id", receipt_id, f"{name}: routing")
        assert route["service"] == "connector-materializer"
        assert (route["trace_id"], route["parent_span_id"]) == (trace_id, ingress["span_id"]), name
        assert route["attributes"]["connector.outcome"] == "materialized"
        assert route["attributes"]["connector.work_items"] == len(WORK_TYPES)

        for work_type, (work_id, work_tp) in run.work[name].items():
            assert _is_traceparent(work_tp, trace_id, route["span_id"]), (name, work_type, work_tp)
            attempts = _attempts(run, work_id)
            expected = (
                [(1, "retry", "ERROR"), (2, "success", "UNSET")]
                if work_type == "flaky"
                else [(1, "success", "UNSET")]
            )
            got_attempts = [
                (a["connector.attempt"], a["connector.outcome"], s["status"]) for s, a in attempts
            ]
            assert got_attempts == expected, (name, work_type, got_attempts)
            for attempt, attrs in attempts:  # every attempt is a child of the routing span
                assert attempt["service"] == "connector-executor"
                assert (attempt["trace_id"], attempt["parent_span_id"]) == (trace_id, route["span_id"])
                assert attrs["connector.work_type"] == work_type
            if work_type == "flaky":
                assert attempts[0][1]["connector.failure_class"] == "try_again"
                continue
            attempt = attempts[0][0]
            if work_type == "python":
                got = seen["python"][work_id]
                assert _is_traceparent(got["traceparent"], trace_id, attempt["span_id"]), (name, got)
                assert (got["current_trace_id"], got["current_span_id"]) == (trace_id, attempt["span_id"])
            else:
                header = seen[work_type].get(work_id)
                assert _is_traceparent(header, trace_id, attempt["span_id"]), (name, work_type, header)
    assert len(trace_ids) == len(DELIVERIES), "each delivery has its own trace"


JSONL = {"OTEL_TRACES_EXPORTER": "connector_jsonl", "OTEL_BSP_SCHEDULE_DELAY": "100"}


def test_one_trace_across_the_three_services_and_the_handlers(db_url: str, tmp_path: Path) -> None:
    run = run_stack(db_url, tmp_path, JSONL)
    check(run)


def test_control_propagation_disabled_fails_the_check(db_url: str, tmp_path: Path) -> None:
    """OTEL_PROPAGATORS=none: the services still trace (and keep their own chain through the
    database), but read no context from providers and give none to handlers — ``check`` fails."""
    run = run_stack(db_url, tmp_path, {**JSONL, "OTEL_PROPAGATORS": "none"})
    assert run.spans, "the services traced"
    with pytest.raises(AssertionError):
        check(run)
    for name, (sender_trace, _) in CONTINUED.items():
        ingress = _one(run, tracing.INGRESS_SPAN, "connector.receipt_id", run.receipts[name][0], name)
        assert ingress["trace_id"] != sender_trace and ingress["parent_span_id"] is None, name
    assert run.http and all(h["traceparent"] is None for h in run.http), run.http
    assert run.grpc and all(h["traceparent"] is None for h in run.grpc), run.grpc


def test_tracing_is_off_unless_the_standard_variables_turn_it_on(db_url: str, tmp_path: Path) -> None:
    """No OTEL_* variables: no span, nothing stored on receipts or WorkItems, no ``traceparent`` to
    any handler — not even the provider's (the ingress does not read it)."""
    run = run_stack(db_url, tmp_path, {})
    assert run.statuses == dict.fromkeys(DELIVERIES, 200), run.statuses
    assert not run.span_files and not run.spans
    assert all(tp is None for _, tp in run.receipts.values()), run.receipts
    assert all(tp is None for work in run.work.values() for _, tp in work.values()), run.work
    assert len(run.http) == len(run.grpc) == len(run.python) == len(DELIVERIES)
    assert all(h["traceparent"] is None for h in run.http + run.grpc + run.python)
    assert all(p["current_trace_id"] is None for p in run.python)
    with pytest.raises(AssertionError):
        check(run)


def test_setup_follows_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """``requested``: OTEL_SDK_DISABLED wins; unset or ``none`` exporters mean off. An exporter name
    that is not installed stops the service with one line saying so."""
    assert not tracing.requested({})
    assert not tracing.requested({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.requested({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert tracing.requested({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"})
    assert tracing.requested({"OTEL_TRACES_EXPORTER": "otlp"})
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "no_such_exporter")
    with pytest.raises(tracing.TracingError, match="no_such_exporter"):
        tracing.setup("test")
    assert not tracing.ENABLED


def test_stored_context_round_trip_and_what_handlers_get() -> None:
    """``parent_context`` reads back exactly what ``traceparent_of`` writes and nothing else;
    ``outgoing`` writes it as the W3C header with the default propagators; ``incoming`` reads it
    back and ignores malformed values. Control: a changed character makes each of them refuse."""
    from opentelemetry import trace

    tracing._bind()
    tp = f"00-{PROVIDER_TRACE}-{PROVIDER_SPAN}-01"
    span = trace.get_current_span(tracing.parent_context(tp))
    assert tracing.traceparent_of(span) == tp
    for bad in (
        tp[:-1],  # 54 characters
        "01" + tp[2:],  # another version
        tp.replace("-", "_", 1),
        f"00-{'0' * 32}-{PROVIDER_SPAN}-01",  # all-zero trace id
        f"00-{PROVIDER_TRACE}-{'0' * 16}-01",  # all-zero span id
        f"00-{PROVIDER_TRACE}-{PROVIDER_SPAN[:-1]}g-01",
    ):
        assert tracing.parent_context(bad) is None, bad
        if not bad.startswith("01-"):  # W3C: a later version is read as 00 (incoming: a sender's)
            assert tracing.incoming({"traceparent": bad}) is None, bad
    assert tracing.incoming({"traceparent": "01" + tp[2:]}) == tp
    assert tracing.outgoing(tp) == {"traceparent": tp}
    assert tracing.outgoing(tp[:-1]) == {}
    assert tracing.incoming({"traceparent": tp}) == tp
    assert tracing.incoming({}) is None
