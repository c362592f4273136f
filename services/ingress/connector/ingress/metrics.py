"""Ingress metrics. Labels come from fixed vocabularies (outcome, reason, transport) and from the
installed route table (namespace, route: a path that is no installed route is ``_unknown``): never a
sender-controlled string, payload, signature, secret or token.

Pool usage of the ingress's own pool is exported by ``connector.common.core.db``
(``connector_db_pool_*{service="ingress"}``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from connector.common.core.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, registry

#: This service's own registry: what its ``/metrics`` endpoint serves (connector.common.core.metrics).
REGISTRY = registry("ingress")

DELIVERIES = Counter(
    "connector_ingress_deliveries_total",
    "Deliveries answered, by transport, outcome (accepted|duplicate|rejected|unavailable) and reason",
    ["transport", "outcome", "reason"],
    registry=REGISTRY,
)
#: The namespace/route label value of deliveries to a path that is no installed route (and of
#: refusals before the path is read): strangers cannot create label values.
UNKNOWN_ROUTE = "_unknown"
ROUTE_DELIVERIES = Counter(
    "connector_ingress_route_deliveries_total",
    "Deliveries answered, by installed route (namespace, route; any other path is _unknown) and outcome",
    ["namespace", "route", "outcome"],
    registry=REGISTRY,
)
ACK_SECONDS = Histogram(
    "connector_ingress_ack_seconds",
    "Time from request to answer for accepted and duplicate deliveries",
    ["transport"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
COMMIT_SECONDS = Histogram(
    "connector_ingress_receipt_commit_seconds",
    "Receipt batch insert + commit latency (one group commit)",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "connector_ingress_group_commit_batch_size",
    "Deliveries per group commit",
    buckets=BATCH_BUCKETS,
    registry=REGISTRY,
)
BATCH_FAILURES = Counter(
    "connector_ingress_group_commit_failures_total",
    "Group commits that did not commit, by reason (their deliveries were answered unavailable)",
    ["reason"],
    registry=REGISTRY,
)
DEADLOCK_RETRIES = Counter(
    "connector_ingress_group_commit_deadlock_retries_total",
    "Group commits retried after a deadlock between concurrent duplicate deliveries",
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "connector_ingress_commit_queue_depth", "Deliveries waiting for a group commit", registry=REGISTRY
)
INFLIGHT = Gauge("connector_ingress_inflight", "Deliveries admitted and not yet answered", registry=REGISTRY)
ROUTES = Gauge("connector_ingress_routes", "Active routes loaded", registry=REGISTRY)
ROUTE_REFRESH = Counter(
    "connector_ingress_route_refresh_total", "Route table refreshes", ["result"], registry=REGISTRY
)
