"""Prometheus helpers: one process-wide registry, an HTTP endpoint per service, pool gauges.

Labels never carry payloads, tokens or secrets: only service names, pack ids, queue classes, states
and outcome reasons drawn from fixed vocabularies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Latency buckets from 0.25 ms to 10 s, dense where the hot paths live.
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _CallbackCollector(Collector):
    def __init__(self, fn: Callable[[], Iterable[GaugeMetricFamily]]) -> None:
        self._fn = fn

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return self._fn()


def register_callback(fn: Callable[[], Iterable[GaugeMetricFamily]]) -> Collector:
    """Register a collector evaluated at scrape time (for gauges read from live objects)."""
    collector = _CallbackCollector(fn)
    REGISTRY.register(collector)
    return collector


def unregister(collector: Collector) -> None:
    try:
        REGISTRY.unregister(collector)
    except KeyError:
        pass


def serve(port: int, host: str = "127.0.0.1") -> Any:
    """Start the metrics endpoint (``/metrics``) on ``port`` (0 picks a free one); returns the
    server (its ``server_address[1]`` is the bound port; ``stop_server`` ends it), or None when
    ``port`` is negative (no endpoint)."""
    if port < 0:
        return None
    server, _thread = start_http_server(port, addr=host)
    return server


async def stop_server(server: Any) -> None:
    """Shut down a metrics HTTP server started with ``start_http_server`` (its thread ends)."""
    await asyncio.to_thread(server.shutdown)
    server.server_close()
