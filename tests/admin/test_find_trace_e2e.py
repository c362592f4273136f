"""Find and trace end to end: real signed deliveries over HTTP into the real ingress, routed by the
real materializer, executed by the real executor, whose own admin API answers FindDeliveries and
TraceDelivery (the same wiring as ``connector ingress|materializer|executor``).

The first delivery's handler asks for a retry in a minute: its WorkItem waits in backoff, holding
its source lane; the second delivery for the same order is blocked behind it. The trace shows the
backoff's until time and, for the second, the lane head's work id. Control: the find by provider
id of a delivery id nobody sent finds nothing, and the blocked item's trace changes its reason once
the head is no longer in the lane (the assertions are against live state, not fixed values).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from pydantic import SecretStr

from connector.common.core.settings import (
    AdminSettings,
    DatabaseSettings,
    ExecutorSettings,
    IngressSettings,
    MaterializerSettings,
)
from connector.common.store.lanes import lane_repair
from connector.executor.service import ExecutorService
from connector.ingress.service import IngressService
from connector.materializer.service import MaterializerService
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc, types_pb2

from . import handlers
from .conftest import OPERATOR, TOKENS, VIEW, Admin, Seed

pytestmark = pytest.mark.slow

SECRET = "find-e2e-secret-0123456789"


def _manifest() -> str:
    return yaml.safe_dump(
        {
            "name": "shop",
            "namespace": "shop",
            "work_types": {
                "sync": {
                    "handler": {"kind": "python", "target": f"{handlers.__name__}:busy"},
                    "retry": {"max_attempts": 5},
                    "lanes": {"source_fifo": True, "source_lane_key": "{work_type}:{source_object_id}"},
                }
            },
            "routes": [
                {
                    "key": "orders",
                    "verification": {"preset": "github", "secrets": [{"env": "FIND_E2E_SECRET"}]},
                    "idempotency_header": "X-GitHub-Delivery",
                    "extract": {
                        "event_kind": {"header": "X-GitHub-Event"},
                        "source_object_kind": {"const": "order"},
                        "source_object_id": {"pointer": "/order"},
                    },
                    "correlation": {"order": {"pointer": "/order"}},
                    "fan_out": [{"work_type": "sync"}],
                }
            ],
        }
    )


async def _until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _post(http: aiohttp.ClientSession, port: int, delivery: str, body: dict[str, Any]) -> int:
    raw = json.dumps(body).encode()
    sig = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": sig,
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "order.updated",
    }
    async with http.post(f"http://127.0.0.1:{port}/v1/webhooks/shop/orders", data=raw, headers=headers) as r:
        return r.status


async def test_a_signed_delivery_is_found_by_its_provider_id_and_traced(
    db_url: str, seed: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIND_E2E_SECRET", SECRET)
    handlers.BUSY_CALLS.clear()
    executor = ExecutorService(
        DatabaseSettings(),
        ExecutorSettings(
            workers=2, claim_batch=8, lease_s=10.0, poll_interval_s=0.1, grpc_port=0, metrics_port=0,
            stats_interval_s=0, shutdown_grace_s=1.0,
        ),
        url=db_url,
        admin_settings=AdminSettings(tokens=SecretStr(TOKENS)),
        serve_metrics=False,
        heartbeat_s=0.5,
    )  # fmt: skip
    ingress = IngressService(
        DatabaseSettings(),
        IngressSettings(http_port=0, grpc_port=0, metrics_port=0, pool_min_size=1, pool_max_size=4),
        url=db_url,
        serve_metrics=False,
    )
    materializer = MaterializerService(
        DatabaseSettings(),
        MaterializerSettings(grpc_port=0, metrics_port=0, pool_min_size=1, pool_max_size=4),
        url=db_url,
    )
    started: list[Any] = []
    channel: grpc.aio.Channel | None = None
    try:
        await executor.start()
        started.append(executor)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{executor.grpc_port}")
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        await stub.ApplyPack(
            pb.ApplyPackRequest(manifest=_manifest(), activate=True, request_id="find-e2e"),
            metadata=Admin.md(OPERATOR),
        )
        for svc in (ingress, materializer):
            await svc.start()
            started.append(svc)

        async def find(**kw: Any) -> pb.FindDeliveriesResponse:
            return await stub.FindDeliveries(pb.FindDeliveriesRequest(**kw), metadata=Admin.md(VIEW))

        async def trace(**kw: Any) -> pb.TraceDeliveryResponse:
            return await stub.TraceDelivery(pb.TraceDeliveryRequest(**kw), metadata=Admin.md(VIEW))

        async with aiohttp.ClientSession() as http:
            assert await _post(http, ingress.http_port, "evt_123", {"order": "o-1", "n": 1}) == 200

            # 1. Found by the provider's delivery id, with its WorkItem, once it ran and asked to retry.
            async def first_in_retry() -> pb.Delivery | None:
                found = await find(provider_delivery_id="evt_123")
                if len(found.deliveries) == 1 and [w.state for w in found.deliveries[0].work_items] == [
                    types_pb2.WORK_ITEM_STATE_RETRY
                ]:
                    return found.deliveries[0]
                return None

            first = await _until(first_in_retry, "the first delivery's item to be in retry")
            assert first.receipt.namespace == "shop" and first.receipt.provider_delivery_id == "evt_123"
            assert first.receipt.status == types_pb2.RECEIPT_STATUS_MATERIALIZED
            assert first.events[0].correlation_ids["order"] == "o-1"
            head = first.work_items[0].work_id
            assert handlers.BUSY_CALLS == [head]
            assert (await find(provider_delivery_id="evt_999")).deliveries == []  # control
            by_correlation = await find(correlation_name="order", correlation_value="o-1")
            assert [d.receipt.receipt_id for d in by_correlation.deliveries] == [first.receipt.receipt_id]

            # 2. The second delivery of the same order waits behind it in the source lane.
            assert await _post(http, ingress.http_port, "evt_124", {"order": "o-1", "n": 2}) == 200

            async def second_blocked() -> pb.Delivery | None:
                found = await find(provider_delivery_id="evt_124")
                if found.deliveries and [w.state for w in found.deliveries[0].work_items] == [
                    types_pb2.WORK_ITEM_STATE_BLOCKED
                ]:
                    return found.deliveries[0]
                return None

            second = await _until(second_blocked, "the second delivery's item to be blocked")
            blocked = second.work_items[0].work_id

        # 3. The trace of the head: verified how, routed, in backoff until its run_after.
        t1 = await trace(provider_delivery_id="evt_123")
        assert t1.routing.verification_scheme == "hmac-sha256"
        assert t1.routing.verification_key_ref == "env:FIND_E2E_SECRET"
        assert SECRET.encode() not in t1.SerializeToString()
        assert "routed at" in t1.routing.detail
        (w1,) = t1.events[0].work_items
        assert w1.work_item.work_id == head and w1.work_item.attempts == 1
        assert w1.work_item.failure_class == "downstream_busy"
        assert w1.wait.reason == pb.WAIT_REASON_BACKOFF
        assert w1.wait.until == w1.work_item.run_after
        until = w1.wait.until.ToDatetime(tzinfo=UTC)
        observed = t1.observe_time.ToDatetime(tzinfo=UTC)
        assert timedelta(seconds=30) < until - observed <= timedelta(seconds=61), (until, observed)
        assert [(x.kind, x.lane_key, x.head_work_id, x.ahead) for x in w1.lanes] == [
            (pb.LANE_KIND_SOURCE, "sync:o-1", head, 0)
        ]
        # 4. The trace of the second: blocked behind the head, by work id.
        t2 = await trace(work_id=blocked)
        (w2,) = t2.events[0].work_items
        assert w2.wait.reason == pb.WAIT_REASON_LANE_BLOCKED
        assert w2.wait.blocking_work_id == head
        assert f"behind work item {head} (retry: in retry backoff until" in w2.wait.detail
        assert [(x.head_work_id, x.head_state, x.ahead) for x in w2.lanes] == [
            (head, types_pb2.WORK_ITEM_STATE_RETRY, 1)
        ]
        assert t2.active_claimants == 1
        # 5. Control: once the head is gone from the lane (here: it succeeded), the second is not
        # blocked behind it any more (it is promoted and runs, or waits for its own backoff).
        await seed.conn.execute(
            "UPDATE connector_work_item SET state = 'succeeded', finished_at = now() WHERE work_id = %s",
            (head,),
        )
        assert (await lane_repair(seed.conn)).promoted == 1  # the upkeep's lane repair, run now
        after = (await trace(work_id=blocked)).events[0].work_items[0].wait
        assert after.blocking_work_id != head and after.reason != pb.WAIT_REASON_LANE_BLOCKED, after
        assert datetime.now(UTC) < until  # all of this happened inside the head's backoff
    finally:
        if channel is not None:
            await channel.close()
        for svc in reversed(started):
            await svc.stop()
