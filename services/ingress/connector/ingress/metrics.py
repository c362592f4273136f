"""Ingress metrics. Labels come from fixed vocabularies only (outcome, reason, transport): never a
namespace-controlled string, payload, signature, secret or token.

Pool usage of the ingress's own pool is exported by ``connector.common.db``
(``connector_db_pool_*{service="ingress"}``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from connector.common.metrics import BATCH_BUCKETS, LATENCY_BUCKETS

DELIVERIES = Counter(
    "connector_ingress_deliveries_total",
    "Deliveries answered, by transport, outcome (accepted|duplicate|rejected|unavailable) and reason",
    ["transport", "outcome", "reason"],
)
ACK_SECONDS = Histogram(
    "connector_ingress_ack_seconds",
    "Time from request to answer for accepted and duplicate deliveries",
    ["transport"],
    buckets=LATENCY_BUCKETS,
)
COMMIT_SECONDS = Histogram(
    "connector_ingress_receipt_commit_seconds",
    "Receipt batch insert + commit latency (one group commit)",
    buckets=LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "connector_ingress_group_commit_batch_size",
    "Deliveries per group commit",
    buckets=BATCH_BUCKETS,
)
BATCH_FAILURES = Counter(
    "connector_ingress_group_commit_failures_total",
    "Group commits that did not commit, by reason (their deliveries were answered unavailable)",
    ["reason"],
)
DEADLOCK_RETRIES = Counter(
    "connector_ingress_group_commit_deadlock_retries_total",
    "Group commits retried after a deadlock between concurrent duplicate deliveries",
)
QUEUE_DEPTH = Gauge("connector_ingress_commit_queue_depth", "Deliveries waiting for a group commit")
INFLIGHT = Gauge("connector_ingress_inflight", "Deliveries admitted and not yet answered")
ROUTES = Gauge("connector_ingress_routes", "Active routes loaded")
ROUTE_REFRESH = Counter("connector_ingress_route_refresh_total", "Route table refreshes", ["result"])
