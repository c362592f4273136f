"""Prometheus helpers: one registry per service, an HTTP endpoint per service, pool gauges.

Every service (``ingress``, ``materializer``, ``executor``) exports only its own families: its
``/metrics`` endpoint serves ``registry(service)``, never prometheus_client's global ``REGISTRY``
(which stays unserved). A service's registry holds:

* the families its own ``metrics`` module declares (``registry=REGISTRY`` of that module);
* ``connector_build_info{version,revision,python}`` and the standard ``process_*`` / ``python_*``
  collectors;
* families made per service by shared code (``PerService``: the gRPC server metrics);
* its share of the families of shared code kept in ``SHARED`` (pool gauges, upkeep): those carry a
  ``service`` label and a service's registry yields only the samples whose ``service`` is its own
  or one of its own pools' (``executor-admin`` is the executor's admin API pool).

``connector up`` runs the three services in one process and still serves one endpoint per service
(each its own registry), so a scrape configuration written for separate deployments works unchanged.

Labels never carry payloads, tokens or secrets: only service names, pack names, queue classes,
states, work types and outcome reasons drawn from fixed or installed vocabularies (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import os
import platform
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any, Generic, TypeVar

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

# Latency buckets from 0.25 ms to 10 s, dense where the hot paths live.
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

# No ``*_created`` series: they double the counter and histogram series and no rule reads them
# (rate() and increase() handle counter resets; process_start_time_seconds dates a restart).
disable_created_metrics()

#: The services that have a registry (and a metrics endpoint) of their own.
SERVICES = ("ingress", "materializer", "executor")

#: Families recorded by code every service shares; each has a ``service`` label, and a service's
#: registry exports only its own samples of them (never served whole).
SHARED = CollectorRegistry(auto_describe=True)

_REGISTRIES: dict[str, CollectorRegistry] = {}
_LOCK = threading.Lock()


def build_info() -> tuple[str, str, str]:
    """``(version, revision, python)`` of this build: the distribution's version, the source revision
    from ``CONNECTOR_BUILD_REVISION`` (set by the image build; ``unknown`` otherwise), the Python
    version."""
    try:
        version = metadata.version("connector-runtime")
    except metadata.PackageNotFoundError:
        version = "unknown"
    revision = os.environ.get("CONNECTOR_BUILD_REVISION", "").strip()[:40] or "unknown"
    return version, revision, platform.python_version()


class _BuildInfo(Collector):
    def __init__(self) -> None:
        self._labels = list(build_info())

    def collect(self) -> Iterable[Metric]:
        g = GaugeMetricFamily(
            "connector_build_info",
            "Always 1: the version, source revision and Python version of this service's build",
            labels=["version", "revision", "python"],
        )
        g.add_metric(self._labels, 1)
        return [g]


class _SharedView(Collector):
    """The samples of ``SHARED`` families whose ``service`` label is this service or ``<service>-*``
    (a second pool of the same service, e.g. ``executor-admin``)."""

    def __init__(self, service: str) -> None:
        self._service = service
        self._prefix = f"{service}-"

    def _mine(self, value: str | None) -> bool:
        return value is not None and (value == self._service or value.startswith(self._prefix))

    def collect(self) -> Iterable[Metric]:
        out = []
        for family in SHARED.collect():
            mine = [s for s in family.samples if self._mine(s.labels.get("service"))]
            if not mine:
                continue
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = mine
            out.append(copy)
        return out


def registry(service: str) -> CollectorRegistry:
    """The registry of ``service`` (created on first use): what its ``/metrics`` endpoint serves."""
    with _LOCK:
        reg = _REGISTRIES.get(service)
        if reg is None:
            reg = CollectorRegistry(auto_describe=True)
            for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                reg.register(standard)
            reg.register(_BuildInfo())
            reg.register(_SharedView(service))
            _REGISTRIES[service] = reg
        return reg


T = TypeVar("T")


class PerService(Generic[T]):
    """Families that shared code records for whichever service runs it, one set per service
    registry: ``GRPC = PerService(make)``; ``GRPC("executor")`` is ``make(registry("executor"))``,
    made once."""

    def __init__(self, make: Callable[[CollectorRegistry], T]) -> None:
        self._make = make
        self._made: dict[str, T] = {}
        self._lock = threading.Lock()

    def __call__(self, service: str) -> T:
        made = self._made.get(service)
        if made is None:
            with self._lock:
                made = self._made.get(service)
                if made is None:
                    made = self._made[service] = self._make(registry(service))
        return made


class FastHistogramChild:
    """One label set of a ``FastHistogram``: per-bucket counts and the sum, no lock."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.total += value


class FastHistogram(Collector):
    """A histogram for a per-item hot path, observed from one event-loop thread: ~0.3 µs per
    observation instead of prometheus_client's ~3 µs (its lock and per-bucket objects). The scrape
    thread reads the counters without a lock: a scrape racing an observation may see the new
    bucket count and the old sum (within one observation; cumulative counts stay monotonic)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._doc = documentation
        self._labelnames = list(labelnames)
        self._bounds = tuple(float(b) for b in buckets)
        self._children: dict[tuple[str, ...], FastHistogramChild] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: str) -> FastHistogramChild:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.setdefault(values, FastHistogramChild(self._bounds))
        return child

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in list(self._children.items()):
            counts = list(child.counts)
            cumulative, buckets = 0, []
            for bound, n in zip((*self._bounds, float("inf")), counts, strict=True):
                cumulative += n
                buckets.append((_bound_text(bound), cumulative))
            family.add_metric(list(values), buckets, child.total)
        return [family]


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class _CallbackCollector(Collector):
    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self._fn = fn

    def collect(self) -> Iterable[Metric]:
        return self._fn()


def register_callback(fn: Callable[[], Iterable[Metric]]) -> Collector:
    """Register a collector evaluated at scrape time (gauges read from live objects) in ``SHARED``:
    its families must carry a ``service`` label."""
    collector = _CallbackCollector(fn)
    SHARED.register(collector)
    return collector


def unregister(collector: Collector) -> None:
    try:
        SHARED.unregister(collector)
    except KeyError:
        pass


def serve(port: int, host: str = "127.0.0.1", *, service: str) -> Any:
    """Start ``service``'s metrics endpoint (``/metrics``, its own registry) on ``port`` (0 picks a
    free one); returns the server (its ``server_address[1]`` is the bound port; ``stop_server`` ends
    it), or None when ``port`` is negative (no endpoint)."""
    if port < 0:
        return None
    server, _thread = start_http_server(port, addr=host, registry=registry(service))
    return server


async def stop_server(server: Any) -> None:
    """Shut down a metrics HTTP server started with ``start_http_server`` (its thread ends)."""
    await asyncio.to_thread(server.shutdown)
    server.server_close()
