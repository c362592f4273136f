"""Every refusal writes one INFO line (namespace, route, reason, request id, peer) and nothing from
the request beyond those; a flood is bounded by the per-reason bucket; accepted deliveries write
nothing. Against the real service (in-process, and a real process's stderr)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from connector.common.core import eventlog, logs
from connector.common.core.eventlog import EventLog
from connector.ingress.service import IngressService
from connector.v1 import ingress_service_pb2 as ipb
from connector.v1 import ingress_service_pb2_grpc as ipb_grpc
from tests.ingress.processes import wait_ready

from .conftest import NAMESPACE, SECRETS, github_headers, install_routes, post, receipt_count
from .test_process import _free_port

PAYLOAD = b'{"card":"PLANTED-PAYLOAD-4242","n":1}'
SECRET = SECRETS["INGRESS_T_GITHUB"]
LOGGER = "connector.t.refusals"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logs.JsonFormatter("ingress"))
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record))

    def parsed(self, msg: str = "delivery refused") -> list[dict[str, object]]:
        return [x for x in map(json.loads, self.text) if x["msg"] == msg]


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


def _limit(svc: IngressService, **kw: float) -> EventLog:
    assert svc.admission is not None
    ev = svc.admission.events = EventLog("ingress", logger=LOGGER, summary_s=0, **kw)  # type: ignore[arg-type]
    return ev


def _rid(headers: Mapping[str, str]) -> str:
    return {k.lower(): v for k, v in headers.items()}["x-request-id"]


def _forged(body: bytes) -> dict[str, str]:
    """GitHub headers signed with a wrong key; the signature value must never be logged."""
    return github_headers(body, secret="not the secret", delivery="forged-1")


async def test_one_line_per_refusal_with_the_fields_and_nothing_else(
    ingress: IngressService, http: aiohttp.ClientSession, lines: Lines, db_url: str
) -> None:
    _limit(ingress)
    forged = _forged(PAYLOAD)
    ok = await post(http, ingress, "github", PAYLOAD, github_headers(PAYLOAD, delivery="good-1"))
    assert ok.status == 200 and _rid(ok.headers)
    assert lines.text == []  # accepted: no line
    answers = [
        await post(http, ingress, "github", PAYLOAD, {**forged, "X-Request-Id": "rid-bad-sig"}),
        await post(http, ingress, "github", PAYLOAD, {**forged, "X-Request-Id": "bad id <" + "x" * 80 + ">"}),
        await post(http, ingress, "nope", PAYLOAD, {"X-Request-Id": "rid-unknown"}),
        await post(http, ingress, "open", b"", {"X-Request-Id": "rid-empty"}),
        await post(http, ingress, "open", b"{not json", {"X-Request-Id": "rid-json"}),
        await post(http, ingress, "github", PAYLOAD, {"X-Request-Id": "rid-put"}, method="PUT"),
        await post(http, ingress, "open", PAYLOAD, {"X-Request-Id": "rid-gz", "Content-Encoding": "br"}),
    ]
    assert [a.status for a in answers] == [401, 401, 404, 400, 400, 405, 415]
    got = lines.parsed()
    assert len(got) == 7
    # The request id answered is the one logged; an unsafe one was replaced, never echoed.
    assert [_rid(a.headers) for a in answers] == [x["request_id"] for x in got]
    assert got[0]["request_id"] == "rid-bad-sig" and got[1]["request_id"] not in ("", None)
    assert "bad id" not in "".join(lines.text)
    assert [(x["namespace"], x["route"]) for x in got] == [
        (NAMESPACE, "github"), (NAMESPACE, "github"), ("_unknown", "_unknown"),
        (NAMESPACE, "open"), (NAMESPACE, "open"), (NAMESPACE, "github"), (NAMESPACE, "open"),
    ]  # fmt: skip
    assert [x["reason"] for x in got][2:] == [
        "route_not_found", "body_empty", "invalid_json", "method_not_allowed",
        "unsupported_content_encoding",
    ]  # fmt: skip
    for x in got:
        assert x["level"] == "info" and x["peer"] == "127.0.0.1" and x["transport"] == "http"
        assert set(x) == {
            "ts", "level", "service", "logger", "msg", "event", "reason", "namespace", "route",
            "outcome", "status", "transport", "request_id", "peer",
        }  # fmt: skip
    text = "\n".join(lines.text)
    for planted in (SECRET, forged["X-Hub-Signature-256"], "PLANTED-PAYLOAD", "forged-1", "not json"):
        assert planted not in text
    assert receipt_count(db_url) == 1


async def test_forwarded_for_is_the_peer_only_when_trusted(
    start_ingress, http: aiohttp.ClientSession, lines: Lines
) -> None:
    plain = await start_ingress()
    trusting = await start_ingress(http_trust_forwarded_for=True)
    for svc in (plain, trusting):
        _limit(svc)
        await post(http, svc, "open", b"", {"X-Forwarded-For": "203.0.113.9, 10.0.0.1"})
        await post(http, svc, "open", b"", {"X-Forwarded-For": "evil\u2028{}, 1.1.1.1"})
    assert [x["peer"] for x in lines.parsed()] == ["127.0.0.1", "127.0.0.1", "203.0.113.9", "invalid"]


@pytest.mark.parametrize("limited", [True, False])
async def test_a_refusal_flood_is_bounded_and_counted(
    ingress: IngressService, http: aiohttp.ClientSession, lines: Lines, limited: bool
) -> None:
    n = 200
    ev = _limit(ingress, burst=10, rate_per_s=0.0) if limited else _limit(ingress, burst=10**9)
    forged = _forged(PAYLOAD)
    for _ in range(n):
        assert (await post(http, ingress, "github", PAYLOAD, forged)).status == 401
    got = lines.parsed()
    if limited:
        assert len(got) == 10 and ev.suppressed == n - 10
        ev.flush()
        summary = lines.parsed("log lines suppressed")
        assert len(summary) == 1 and summary[0]["suppressed"] == n - 10
    else:  # control: without the limit every refusal is a line
        assert len(got) == n and ev.suppressed == 0


async def test_grpc_refusal_logged_with_its_request_id(ingress: IngressService, lines: Lines) -> None:
    _limit(ingress)
    forged = _forged(PAYLOAD)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ingress.grpc_port}") as channel:
        stub = ipb_grpc.IngressServiceStub(channel)
        request = ipb.SubmitDeliveryRequest(
            namespace=NAMESPACE, route_key="github", method="POST", body=PAYLOAD,
            headers={**forged, "Content-Type": "application/json"},
        )  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitDelivery(request, metadata=(("x-request-id", "grpc-rid-1"),))
        good = ipb.SubmitDeliveryRequest(
            namespace=NAMESPACE, route_key="github", method="POST", body=PAYLOAD,
            headers={**github_headers(PAYLOAD, delivery="grpc-ok"), "Content-Type": "application/json"},
        )  # fmt: skip
        call = stub.SubmitDelivery(good, metadata=(("x-request-id", "grpc-ok-rid"),))
        assert (await call).receipt_id > 0
        assert ("x-request-id", "grpc-ok-rid") in tuple(await call.trailing_metadata() or ())
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    status = status_pb2.Status()
    for key, value in err.value.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status.ParseFromString(value)
    info = error_details_pb2.ErrorInfo()
    assert status.details and status.details[0].Unpack(info)
    assert info.metadata["request_id"] == "grpc-rid-1"
    [line] = lines.parsed()
    assert line["request_id"] == "grpc-rid-1" and line["transport"] == "grpc"
    assert line["peer"] == "127.0.0.1" and line["route"] == "github"
    text = "\n".join(lines.text)
    assert SECRET not in text and forged["X-Hub-Signature-256"] not in text and "PLANTED" not in text


def test_real_process_stderr_has_one_line_per_refusal(db_url: str) -> None:
    install_routes(db_url)
    http_port = _free_port()
    env = {
        **os.environ,
        **SECRETS,
        "CONNECTOR_DATABASE_URL": db_url,
        "CONNECTOR_INGRESS_GRPC_PORT": str(_free_port()),
        "CONNECTOR_INGRESS_METRICS_PORT": str(_free_port()),
        "CONNECTOR_LOG_LEVEL": "INFO",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(http_port)],
        env=env,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{http_port}/v1/webhooks/{NAMESPACE}/"
    forged = _forged(PAYLOAD)

    def send(route: str, body: bytes, headers: dict[str, str]) -> int:
        req = urllib.request.Request(base + route, data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    try:
        wait_ready(proc, http_port)
        ctype = {"Content-Type": "application/json"}
        statuses = [send("github", PAYLOAD, {**github_headers(PAYLOAD, delivery="ok-1"), **ctype})]
        statuses += [send("github", PAYLOAD, {**forged, **ctype, "X-Request-Id": f"p-{i}"}) for i in range(7)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        err = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert statuses == [200] + [401] * 7
    refused = [json.loads(x) for x in err.splitlines() if '"msg":"delivery refused"' in x]
    assert [x["request_id"] for x in refused] == [f"p-{i}" for i in range(7)]
    assert all(
        x["namespace"] == NAMESPACE and x["route"] == "github" and x["peer"] == "127.0.0.1" for x in refused
    )
    for planted in (SECRET, forged["X-Hub-Signature-256"], "PLANTED-PAYLOAD", "ok-1"):
        assert planted not in err


async def test_refusals_before_a_request_are_logged_with_the_socket_peer(
    start_ingress, lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = EventLog("ingress", logger=LOGGER, summary_s=0)
    monkeypatch.setitem(eventlog._EVENTS, "ingress", ev)  # the guard takes it at start
    svc = await start_ingress(http_header_timeout_s=0.3)
    # A connection that never completes its headers, and a request line the parser refuses.
    idle_r, idle_w = await asyncio.open_connection("127.0.0.1", svc.http_port)
    idle_w.write(b"POST /v1/webhooks/shop/open HTTP/1.1\r\nX-Hub-Signature-256: " + SECRET.encode())
    bad_r, bad_w = await asyncio.open_connection("127.0.0.1", svc.http_port)
    bad_w.write(b"POST /\x01" + SECRET.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b" 400 " in await asyncio.wait_for(bad_r.readline(), 10)
    assert await asyncio.wait_for(idle_r.read(), 10) == b""  # closed by the header timeout
    for w in (idle_w, bad_w):
        w.close()
    got = {x["reason"]: x for x in lines.parsed()}
    assert set(got) == {"header_timeout", "malformed_http"}
    for x in got.values():
        assert x["peer"] == "127.0.0.1" and x["route"] == "_unknown" and x["transport"] == "http"
    assert SECRET not in "\n".join(lines.text)
