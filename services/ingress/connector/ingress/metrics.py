"""Ingress metrics. Labels come from fixed vocabularies (outcome, reason, transport) and from the
installed route table (namespace, route: a path that is no installed route is ``_unknown``): never a
sender-controlled string, payload, signature, secret or token.

Pool usage of the ingress's own pool is exported by ``connector.common.core.db``
(``connector_db_pool_*{service="ingress"}``).
"""

from __future__ import annotations

from typing import Any

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
REDELIVERY_BODY_DIFFERS = Counter(
    "connector_ingress_redelivery_body_differs_total",
    "Duplicates (a delivery id or key already accepted) whose body differs from the first one's; they"
    " are answered as duplicates and their body is dropped",
    ["namespace", "route"],
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
COMMIT_DEADLINE_EXCEEDED = Counter(
    "connector_ingress_commit_deadline_exceeded_total",
    "Deliveries answered unavailable because their receipt was not committed within"
    " CONNECTOR_INGRESS_COMMIT_DEADLINE_S of joining the commit queue",
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

# --------------------------------------------------------------------------------------------------
# Redelivery contracts and reconciliation (docs/reconcile.md). Label values are installed route names
# and fixed vocabularies only.
# --------------------------------------------------------------------------------------------------

ROUTE_REFUSED = Counter(
    "connector_ingress_route_refused_total",
    "Deliveries answered without a durable acceptance that the sender may never send again "
    "(unavailable, namespace_limit, body_timeout), by route and its redelivery contract",
    ["namespace", "route", "redelivery"],
    registry=REGISTRY,
)
ROUTE_CONTRACT = Gauge(
    "connector_ingress_route_contract",
    "1 per active route: its redelivery contract (provider_retries|manual|none) and whether it is reconciled",
    ["namespace", "route", "redelivery", "reconcile"],
    registry=REGISTRY,
)
ROUTE_EXPECTED = Gauge(
    "connector_ingress_route_expected_deliveries",
    "The least deliveries a route declares it expects per window (manifest expect: at_least, per)",
    ["namespace", "route", "per"],
    registry=REGISTRY,
)
RECONCILE_PASSES = Counter(
    "connector_reconcile_passes_total",
    "Reconciliation passes by route and result (clean|failed)",
    ["namespace", "route", "result"],
    registry=REGISTRY,
)
RECONCILE_LISTED = Counter(
    "connector_reconcile_listed_total",
    "Items the sender listed within the passes' bounds",
    ["namespace", "route"],
    registry=REGISTRY,
)
RECONCILE_GAPS = Counter(
    "connector_reconcile_gaps_found_total",
    "Listed deliveries that had no receipt (gaps)",
    ["namespace", "route"],
    registry=REGISTRY,
)
RECONCILE_ADMITTED = Counter(
    "connector_reconcile_admitted_total",
    "Gaps admitted as receipts with origin reconciled (mode pull)",
    ["namespace", "route"],
    registry=REGISTRY,
)
RECONCILE_REDELIVERED = Counter(
    "connector_reconcile_redeliver_requests_total",
    "Gaps the sender was asked to deliver again (mode redeliver)",
    ["namespace", "route"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "connector_reconcile_errors_total",
    "Faults of reconciliation passes by class (a 429 whose Retry-After was honoured counts too)",
    ["namespace", "route", "class"],
    registry=REGISTRY,
)
RECONCILE_PASS_SECONDS = Histogram(
    "connector_reconcile_pass_seconds",
    "Duration of reconciliation passes",
    buckets=(*LATENCY_BUCKETS, 30.0, 60.0, 300.0, 900.0, 3600.0),
    registry=REGISTRY,
)
RECONCILE_LAST_CLEAN = Gauge(
    "connector_reconcile_last_clean_pass_timestamp_seconds",
    "When the route's last clean pass ended (Unix seconds; before any: when it was first reconciled)",
    ["namespace", "route"],
    registry=REGISTRY,
)
RECONCILE_WATERMARK_AGE = Gauge(
    "connector_reconcile_watermark_age_seconds",
    "Age of the route's watermark: everything that occurred before it was verified",
    ["namespace", "route"],
    registry=REGISTRY,
)
RECONCILE_WINDOW = Gauge(
    "connector_reconcile_window_seconds",
    "How far back the route's sender keeps its list (the manifest's reconcile.window)",
    ["namespace", "route"],
    registry=REGISTRY,
)
RECONCILE_LEADER = Gauge(
    "connector_reconcile_leader", "1 while this process holds the reconciler's leader lock", registry=REGISTRY
)

_refused: dict[tuple[str, str, str], Counter] = {}


def route_refused(namespace: str, route: str, redelivery: str) -> None:
    """One losable answer of an installed route (a refusal path: never called for an acceptance)."""
    key = (namespace, route, redelivery)
    child = _refused.get(key)
    if child is None:
        child = _refused[key] = ROUTE_REFUSED.labels(*key)
    child.inc()


def routes_declared(routes: list[Any]) -> None:
    """On every route refresh (``routes``: the ``CompiledRoute``s): each active route's contract and
    expectation, and its alerting counters made at 0 (Prometheus' ``increase()`` sees nothing of a
    series whose first sample already holds a count; ConnectorRouteSilent needs the accepted series
    of a route that has received nothing since the process started)."""
    ROUTE_CONTRACT.clear()
    ROUTE_EXPECTED.clear()
    for r in routes:
        namespace, route = r.namespace, r.route_key
        reconciled = r.reconcile is not None
        ROUTE_CONTRACT.labels(namespace, route, r.redelivery, "true" if reconciled else "false").set(1)
        if r.expect is not None:
            ROUTE_EXPECTED.labels(namespace, route, r.expect[1]).set(r.expect[0])
        ROUTE_DELIVERIES.labels(namespace, route, "accepted")
        key = (namespace, route, r.redelivery)
        if key not in _refused:
            _refused[key] = ROUTE_REFUSED.labels(*key)
        if reconciled:
            for result in ("clean", "failed"):
                RECONCILE_PASSES.labels(namespace, route, result)
            RECONCILE_GAPS.labels(namespace, route)
            RECONCILE_ADMITTED.labels(namespace, route)
            RECONCILE_WINDOW.labels(namespace, route).set(r.reconcile.window)


def reconcile_observe(result: Any, seconds: float, rate_limited: int) -> None:
    """One finished pass (``reconciler.PassResult``)."""
    labels = (result.namespace, result.route_key)
    RECONCILE_PASSES.labels(*labels, "clean" if result.error_class is None else "failed").inc()
    RECONCILE_PASS_SECONDS.observe(seconds)
    if result.listed:
        RECONCILE_LISTED.labels(*labels).inc(result.listed)
    if result.missing:
        RECONCILE_GAPS.labels(*labels).inc(result.missing)
    if result.admitted:
        RECONCILE_ADMITTED.labels(*labels).inc(result.admitted)
    if result.redelivered:
        RECONCILE_REDELIVERED.labels(*labels).inc(result.redelivered)
    if rate_limited:
        RECONCILE_ERRORS.labels(*labels, "rate_limited").inc(rate_limited)
    if result.error_class is not None and not (result.error_class == "rate_limited" and rate_limited):
        RECONCILE_ERRORS.labels(*labels, result.error_class).inc()
