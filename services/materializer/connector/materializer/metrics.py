"""Materializer metrics. Labels come from fixed vocabularies only (outcomes, failure classes).

Pool gauges (``connector_db_pool_*{service="materializer"}``) come from ``connector.common.core.db``.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from connector.common.core.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, registry

#: This service's own registry: what its ``/metrics`` endpoint serves (connector.common.core.metrics).
REGISTRY = registry("materializer")

HORIZON_VISIBLE = Gauge(
    "connector_materializer_commit_horizon_visible",
    "1 when this role can see every session's transaction ids (commit horizon exact), 0 when it sees "
    "only its own role's sessions (superuser or pg_read_all_stats needed; see docs/materializer.md)",
    registry=REGISTRY,
)
ROUTING_LAG = Gauge(
    "connector_materializer_routing_lag_seconds",
    "Age of the oldest due unrouted receipt, or of the oldest receipt claimed but not finished",
    registry=REGISTRY,
)
RECEIPTS = Counter(
    "connector_materializer_receipts_total",
    "Receipts whose routing attempt ended, by outcome (materialized, failed, retry)",
    ["outcome"],
    registry=REGISTRY,
)
FAILURES = Counter(
    "connector_materializer_failures_total",
    "Receipt routing failures by class; final=true when the receipt ended failed",
    ["failure_class", "final"],
    registry=REGISTRY,
)
EVENTS = Counter("connector_materializer_events_total", "Events inserted", ["owner"], registry=REGISTRY)
WORK_ITEMS = Counter("connector_materializer_work_items_total", "WorkItems inserted", registry=REGISTRY)
SCHEDULED = Counter(
    "connector_materializer_scheduled_total",
    "WorkItems of delayed work types by how their run_after was chosen"
    " (delay, run_after, past, clamped, invalid)",
    ["outcome"],
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "connector_materializer_batch_size",
    "Receipts claimed per batch",
    buckets=BATCH_BUCKETS,
    registry=REGISTRY,
)
BATCH_SECONDS = Histogram(
    "connector_materializer_batch_seconds",
    "Time to route one claimed batch (plan + write transaction(s))",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
CLAIM_SECONDS = Histogram(
    "connector_materializer_claim_seconds",
    "Receipt claim statement latency",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
CLAIMS_LOST = Counter(
    "connector_materializer_claims_lost_total",
    "Claimed receipts whose write back was fenced off (the lease expired and another claim won)",
    registry=REGISTRY,
)
LANE_DEMOTIONS = Counter(
    "connector_materializer_lane_demotions_total",
    "Ready lane members re-blocked because an earlier delivery of their lane materialized late",
    registry=REGISTRY,
)
LANE_INVERSIONS = Counter(
    "connector_materializer_lane_inversions_total",
    "Lanes where a later member had already started when an earlier delivery materialized",
    registry=REGISTRY,
)
ORDER_DEFERRALS = Counter(
    "connector_materializer_order_deferrals_total",
    "Lane receipts held back because an earlier receipt of their namespace was still being routed",
    registry=REGISTRY,
)
ORDER_WAIT_EXPIRED = Counter(
    "connector_materializer_order_wait_expired_total",
    "Lane receipts written although an earlier receipt was still in flight (order_wait_max_s passed)",
    registry=REGISTRY,
)
BATCH_FALLBACKS = Counter(
    "connector_materializer_batch_fallbacks_total",
    "Batches that hit an unexpected database error and were retried one receipt per transaction",
    registry=REGISTRY,
)
TRANSIENT_RETRIES = Counter(
    "connector_materializer_transient_retries_total",
    "Batch transactions retried after a deadlock or serialization failure",
    registry=REGISTRY,
)
SNAPSHOT_CHANGES = Counter(
    "connector_materializer_snapshot_changes_total",
    "Batches re-planned because the pack generation or claim authority changed under them",
    registry=REGISTRY,
)
ROUTE_RELOADS = Counter(
    "connector_materializer_route_reloads_total", "Route table reloads", ["trigger"], registry=REGISTRY
)
LOOP_ERRORS = Counter(
    "connector_materializer_loop_errors_total",
    "Routing loop errors (connection, pool, unexpected)",
    ["kind"],
    registry=REGISTRY,
)
