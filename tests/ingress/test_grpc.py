"""gRPC ``IngressService.SubmitDelivery``: the same admission as HTTP over a real gRPC server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import grpc
import pytest
import pytest_asyncio
import stripe
from google.protobuf import timestamp_pb2

from connector.common.core.grpc_server import error_info
from connector.ingress.service import IngressService
from connector.v1 import ingress_service_pb2 as pb
from connector.v1 import ingress_service_pb2_grpc as pb_grpc

from .conftest import NAMESPACE, SECRETS, github_headers, hubspot_headers, receipt_count, receipts

ZERO = {"X-Hub-Signature-256": "sha256=" + "0" * 64}


@pytest_asyncio.fixture
async def stub(ingress: IngressService) -> AsyncIterator[pb_grpc.IngressServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ingress.grpc_port}") as channel:
        yield pb_grpc.IngressServiceStub(channel)


def request(route: str, body: bytes, headers: dict[str, str], **kw: object) -> pb.SubmitDeliveryRequest:
    return pb.SubmitDeliveryRequest(
        namespace=str(kw.pop("namespace", NAMESPACE)),
        route_key=route,
        method=str(kw.pop("method", "POST")),
        uri=str(kw.pop("uri", f"/v1/webhooks/{NAMESPACE}/{route}")),
        headers={"Content-Type": "application/json", **headers},
        body=body,
        **kw,  # type: ignore[arg-type]
    )


async def test_accepted_then_duplicate(stub: pb_grpc.IngressServiceStub, db_url: str) -> None:
    body = b'{"id":"evt_g1","type":"charge.succeeded"}'
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRETS["INGRESS_T_STRIPE"])
    received = timestamp_pb2.Timestamp()
    received.FromDatetime(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    first = await stub.SubmitDelivery(
        request("stripe", body, {"Stripe-Signature": header}, receive_time=received)
    )
    again = await stub.SubmitDelivery(request("stripe", body, {"Stripe-Signature": header}))
    assert (first.duplicate, first.http_status) == (False, 200)
    assert (again.receipt_id, again.duplicate) == (first.receipt_id, True)
    [row] = receipts(db_url)
    assert row["receipt_id"] == first.receipt_id and row["provider_delivery_id"] == "evt_g1"
    assert row["received_at"] == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_hubspot_signature_over_the_uri_the_gateway_reports(stub: pb_grpc.IngressServiceStub) -> None:
    body = b'[{"eventId":7}]'
    uri = "https://crm-hooks.example.com/v1/webhooks/shop/hubspot?portal=1"
    reply = await stub.SubmitDelivery(request("hubspot", body, hubspot_headers("POST", uri, body), uri=uri))
    assert reply.http_status == 200


@pytest.mark.parametrize(
    ("route", "body", "headers", "kw", "code", "reason", "http_status"),
    [
        ("github", b"{}", ZERO, {}, "UNAUTHENTICATED", "SIGNATURE_MISMATCH", 401),
        ("github", b"{}", {}, {}, "UNAUTHENTICATED", "SIGNATURE_MISSING", 401),
        ("nope", b"{}", {}, {}, "NOT_FOUND", "ROUTE_NOT_FOUND", 404),
        ("github", b"{}", {}, {"namespace": "other"}, "NOT_FOUND", "ROUTE_NOT_FOUND", 404),
        ("github", b"{}", {}, {"method": "GET"}, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED", 405),
        ("open", b"", {}, {}, "INVALID_ARGUMENT", "BODY_EMPTY", 400),
        ("open", b"{", {}, {}, "INVALID_ARGUMENT", "INVALID_JSON", 400),
        ("open", b"{}", {"X-Evil": "a\r\nSet-Cookie: x=1"}, {}, "INVALID_ARGUMENT", "BAD_HEADER", 400),
        ("open", b"{}", {"Bad Name": "x"}, {}, "INVALID_ARGUMENT", "BAD_HEADER", 400),
        ("open", b"{}", {"X-Nul": "a\x00b"}, {}, "INVALID_ARGUMENT", "BAD_HEADER", 400),
    ],
)  # fmt: skip
async def test_refusals_map_to_canonical_codes_with_reason_and_http_status(
    stub: pb_grpc.IngressServiceStub,
    db_url: str,
    route: str,
    body: bytes,
    headers: dict[str, str],
    kw: dict[str, str],
    code: str,
    reason: str,
    http_status: int,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.SubmitDelivery(request(route, body, headers, **kw))
    assert info.value.code().name == code
    detail = error_info(info.value)
    assert detail is not None and detail.reason == reason
    assert detail.metadata["http_status"] == str(http_status)
    assert receipt_count(db_url) == 0


async def test_github_delivery_over_grpc_keeps_the_envelope(
    stub: pb_grpc.IngressServiceStub, db_url: str
) -> None:
    body = b'{"repository":{"id":1}}'
    reply = await stub.SubmitDelivery(request("github", body, github_headers(body, delivery="grpc-1")))
    assert reply.http_status == 200
    [row] = receipts(db_url)
    assert (row["provider_delivery_id"], row["event_kind"]) == ("grpc-1", "push")
    assert row["received_at"].timestamp() <= time.time()


async def test_grpc_answers_record_their_ack_latency(
    stub: pb_grpc.IngressServiceStub, ingress: IngressService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accepted and duplicate gRPC answers record their ack latency as HTTP ones do: the
    ``connector_ingress_ack_seconds{transport="grpc"}`` histogram and the cluster's figures (the
    console's "ingress ack p50 / p99"), from this server's clock even with a caller's receive_time;
    a refusal records none (control)."""
    from connector.common.core.figures import Recorder
    from connector.ingress import metrics

    assert ingress.admission is not None
    seen: list[tuple[int, float]] = []
    real = Recorder.acked

    def spy(self: Recorder, pack: int, seconds: float) -> None:
        seen.append((pack, seconds))
        real(self, pack, seconds)

    monkeypatch.setattr(Recorder, "acked", spy)

    def count() -> float:
        return (
            metrics.REGISTRY.get_sample_value("connector_ingress_ack_seconds_count", {"transport": "grpc"})
            or 0
        )

    before = count()
    body = b'{"id":"evt_g9","type":"charge.succeeded"}'
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRETS["INGRESS_T_STRIPE"])
    old = timestamp_pb2.Timestamp()
    old.FromDatetime(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))  # an earlier hop's instant
    await stub.SubmitDelivery(request("stripe", body, {"Stripe-Signature": header}, receive_time=old))
    await stub.SubmitDelivery(request("stripe", body, {"Stripe-Signature": header}))  # a duplicate
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.SubmitDelivery(request("stripe", body, {"Stripe-Signature": "t=1,v1=00"}))
    assert len(seen) == 2 and all(0 <= s < 60 for _, s in seen), seen  # not months since receive_time
    assert count() - before == 2
