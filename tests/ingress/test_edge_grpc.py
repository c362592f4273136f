"""Hostile and malformed input to gRPC ``SubmitDelivery`` over a real port: never INTERNAL/UNKNOWN.

Each refusal is INVALID_ARGUMENT with an ErrorInfo reason and ``http_status`` 400 (what a gateway
answers the provider), writes no receipt and echoes no value:

* ``receive_time`` outside the Timestamp range (``INVALID_TIMESTAMP``; INTERNAL before the input
  stage existed), or before 1970 / more than 5 minutes ahead (``INVALID_RECEIVE_TIME``: the end of
  year 9999 was stored as year 10000, which no admin read could decode) — a control keeps times in
  the window accepted and stored as given;
* NUL characters in the namespace, route key, method or URI (``INVALID_STRING``), in a header
  (``BAD_HEADER``, as over HTTP); strings longer than 8192 characters (``STRING_TOO_LONG``);
* bytes that are not a SubmitDeliveryRequest (``MALFORMED_REQUEST``; UNKNOWN with the decoder's
  text before);
* a database connection lost under the call (proxy cut, ``pg_terminate_backend`` of the pool's
  backends): UNAVAILABLE with ``http_status`` 503, and the next deliveries are accepted.

A hypothesis property sends random field values and random bytes: never INTERNAL or UNKNOWN, and
no receipt for any refusal.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from datetime import UTC
from typing import Any

import grpc
import psycopg
import pytest
import pytest_asyncio
from google.protobuf import timestamp_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.common.core.grpc_server import error_info
from connector.ingress.service import IngressService
from connector.v1 import ingress_service_pb2 as pb
from connector.v1 import ingress_service_pb2_grpc as pb_grpc

from .conftest import NAMESPACE, StartIngress, receipt_count
from .proxy import TcpProxy

MARKER = "SeCrEt-MaRkEr"
METHOD = "/connector.v1.IngressService/SubmitDelivery"
_bodies = itertools.count()


@pytest_asyncio.fixture
async def channel(ingress: IngressService) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ingress.grpc_port}") as ch:
        yield ch


def open_delivery(**kw: Any) -> pb.SubmitDeliveryRequest:
    """A delivery the unsigned ``open`` route accepts (a new body each time: not a duplicate)."""
    fields: dict[str, Any] = {
        "namespace": NAMESPACE,
        "route_key": "open",
        "method": "POST",
        "uri": f"/v1/webhooks/{NAMESPACE}/open",
        "headers": {"Content-Type": "application/json"},
        "body": b'{"n": %d}' % next(_bodies),
    }
    fields.update(kw)
    return pb.SubmitDeliveryRequest(**fields)


def ts(seconds: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


async def refused(channel: grpc.aio.Channel, request: pb.SubmitDeliveryRequest) -> grpc.aio.AioRpcError:
    stub = pb_grpc.IngressServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.SubmitDelivery(request, timeout=30)
    return info.value


@pytest.mark.parametrize(
    "stamp",
    [ts(2**40), ts(-(2**40)), ts(253_402_300_800), ts(-62_135_596_801), ts(0, -1), ts(0, 10**9)],
    ids=["2^40", "-2^40", "year-10000", "before-year-1", "nanos-negative", "nanos-10^9"],
)
async def test_receive_time_out_of_range_is_invalid_argument(
    channel: grpc.aio.Channel, db_url: str, stamp: timestamp_pb2.Timestamp
) -> None:
    exc = await refused(channel, open_delivery(receive_time=stamp))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    info = error_info(exc)
    assert info is not None and info.reason == "INVALID_TIMESTAMP"
    assert dict(info.metadata) == {"http_status": "400", "field": "receive_time"}
    assert receipt_count(db_url) == 0


@pytest.mark.parametrize(
    "stamp",
    [ts(-62_135_596_800), ts(253_402_300_799, 999_999_999), ts(-1), ts(int(time.time()) + 3600)],
    ids=["year-1", "year-9999-end", "before-1970", "an-hour-ahead"],
)
async def test_receive_time_far_from_now_is_invalid_receive_time(
    channel: grpc.aio.Channel, db_url: str, stamp: timestamp_pb2.Timestamp
) -> None:
    """Valid Timestamps that do not survive the database round trip (year 9999's last instant is
    stored as year 10000, which Python cannot read back) or cannot be a receive time."""
    exc = await refused(channel, open_delivery(receive_time=stamp))
    info = error_info(exc)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and info is not None
    assert (info.reason, info.metadata["http_status"]) == ("INVALID_RECEIVE_TIME", "400")
    assert receipt_count(db_url) == 0


async def test_receive_times_in_the_window_are_stored(channel: grpc.aio.Channel, db_url: str) -> None:
    """Control for the window: a day ago, just after 1970, a minute ahead — stored to the microsecond."""
    stub = pb_grpc.IngressServiceStub(channel)
    now = int(time.time())
    stamps = [ts(now - 86_400, 123_456_000), ts(0, 1_000), ts(now + 60)]
    for stamp in stamps:
        reply = await stub.SubmitDelivery(open_delivery(receive_time=stamp))
        assert reply.http_status == 202
    with psycopg.connect(db_url) as conn:
        stored = [r[0] for r in conn.execute("SELECT received_at FROM connector_ingress_receipt"
                                             " ORDER BY receipt_id")]  # fmt: skip
    assert stored == [s.ToDatetime(tzinfo=UTC) for s in stamps]


@pytest.mark.parametrize(
    ("fields", "reason", "field"),
    [
        ({"namespace": f"{MARKER}\x00"}, "INVALID_STRING", "namespace"),
        ({"route_key": "open\x00"}, "INVALID_STRING", "route_key"),
        ({"method": "PO\x00ST"}, "INVALID_STRING", "method"),
        ({"uri": f"/v1/webhooks/shop/open?{MARKER}=\x00"}, "INVALID_STRING", "uri"),
        ({"uri": "/" + "u" * 8192}, "STRING_TOO_LONG", "uri"),
        ({"headers": {"X-Long": "v" * 8193}}, "STRING_TOO_LONG", "headers value"),
        ({"headers": {"X-Nul": f"{MARKER}\x00"}}, "BAD_HEADER", None),
        ({"headers": {"X-Nul\x00": "x"}}, "BAD_HEADER", None),
    ],
)
async def test_strings_the_input_stage_refuses(
    channel: grpc.aio.Channel, db_url: str, caplog: Any, fields: dict[str, Any], reason: str,
    field: str | None,
) -> None:  # fmt: skip
    exc = await refused(channel, open_delivery(**fields))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    info = error_info(exc)
    assert info is not None and info.reason == reason
    assert info.metadata["http_status"] == "400"
    if field is not None:
        assert info.metadata["field"] == field
    assert MARKER not in (exc.details() or "") and MARKER not in caplog.text
    assert receipt_count(db_url) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x03\xed\xa0\x80",  # namespace: an encoded lone surrogate
        b"\x22\x02\xff\xfe",  # uri: not UTF-8
        b"\x2a\x06\x0a\x01\xc3\x12\x01x",  # headers: a key that is a truncated UTF-8 sequence
        b"\x32\xff\xff\xff\x0f",  # body: a length past the end
    ],
)
async def test_bytes_that_are_not_a_request_are_malformed_request(
    channel: grpc.aio.Channel, db_url: str, raw: bytes
) -> None:
    submit = channel.unary_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await submit(raw, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    detail = error_info(info.value)
    assert detail is not None and detail.reason == "MALFORMED_REQUEST"
    assert detail.metadata["http_status"] == "400"
    assert receipt_count(db_url) == 0


# --------------------------------------------------------------------------------------------------
# Lost database connections
# --------------------------------------------------------------------------------------------------


async def _submit_until_accepted(stub: pb_grpc.IngressServiceStub, timeout_s: float = 30.0) -> list[str]:
    """Submit fresh deliveries until one is accepted; every refusal on the way must be UNAVAILABLE
    (the documented outcome while the database is away). Returns the codes seen before."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await stub.SubmitDelivery(open_delivery(), timeout=10)
            return seen
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, (exc.code(), exc.details())
            info = error_info(exc)
            assert info is not None and info.metadata["http_status"] == "503"
            seen.append(info.reason)
            assert time.monotonic() < deadline, f"never accepted again: {seen}"


async def test_proxy_cut_answers_unavailable_and_deliveries_resume(
    start_ingress: StartIngress, db_url: str
) -> None:
    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()
    ingress = await start_ingress(url=proxy.url(db_url), pool_timeout_s=0.5)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ingress.grpc_port}") as ch:
        stub = pb_grpc.IngressServiceStub(ch)
        assert (await stub.SubmitDelivery(open_delivery())).http_status == 202
        await proxy.cut()
        try:
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.SubmitDelivery(open_delivery(), timeout=10)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
                detail = error_info(info.value)
                assert detail is not None and detail.metadata["http_status"] == "503"
        finally:
            await proxy.restore()
        await _submit_until_accepted(stub)
    assert receipt_count(db_url) == 2  # the first and the one accepted after the restore


async def test_killed_pool_backends_answer_unavailable_never_internal(
    ingress: IngressService, channel: grpc.aio.Channel, db_url: str
) -> None:
    stub = pb_grpc.IngressServiceStub(channel)
    for round_ in range(3):
        await _submit_until_accepted(stub)
        with psycopg.connect(db_url, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'connector-ingress'"
            ).fetchone()
        assert killed is not None and killed[0] >= 1, round_
    await _submit_until_accepted(stub)


# --------------------------------------------------------------------------------------------------
# Property
# --------------------------------------------------------------------------------------------------

_odd = st.sampled_from(["\x00", "a", "/", "?", "é", "\u2028", "\U0001f600", "%", " ", "\t", "\r"])
_text = st.one_of(
    st.text(_odd, max_size=10),
    st.sampled_from(["", NAMESPACE, "open", "github", "POST", "GET", "/v1/webhooks/shop/open"]),
    st.tuples(st.sampled_from(["a", "\x00"]), st.integers(8180, 8200)).map(lambda t: t[0] * t[1]),
)
_stamps = st.builds(
    ts,
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-62_135_596_801, 253_402_300_800)),
    st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-1, 10**9)),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    namespace=_text,
    route_key=st.one_of(_text, st.sampled_from(["open", "github", "raw"])),
    method=_text,
    uri=_text,
    headers=st.dictionaries(_text, _text, max_size=3),
    body=st.binary(max_size=64),
    stamp=st.none() | _stamps,
    raw=st.none() | st.binary(max_size=40),
)
async def test_property_submit_delivery_is_never_internal_and_refusals_write_nothing(
    channel: grpc.aio.Channel, db_url: str, namespace: str, route_key: str, method: str, uri: str,
    headers: dict[str, str], body: bytes, stamp: timestamp_pb2.Timestamp | None, raw: bytes | None,
) -> None:  # fmt: skip
    before = receipt_count(db_url)
    try:
        if raw is not None:
            submit = channel.unary_unary(
                METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            await submit(raw, timeout=30)
        else:
            request = pb.SubmitDeliveryRequest(
                namespace=namespace, route_key=route_key, method=method, uri=uri, headers=headers, body=body
            )
            if stamp is not None:
                request.receive_time.CopyFrom(stamp)
            await pb_grpc.IngressServiceStub(channel).SubmitDelivery(request, timeout=30)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
            exc.code(), exc.details(),
        )  # fmt: skip
        info = error_info(exc)
        assert info is not None and info.reason and "http_status" in info.metadata, exc.details()
        assert receipt_count(db_url) == before
