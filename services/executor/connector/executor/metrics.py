"""Executor metrics (Prometheus). Labels: pack ids, queue classes, states, operations and failure
classes from fixed vocabularies — never payloads, tokens or keys. Hot-path counters are incremented
once per batch, not per item.

Queue depth, oldest ready age, blocked lanes and active claimants are sampled from the database by
``stats.py`` every ``stats_interval_s`` (diagnostics, never an input of the claim loop); the DB pool
gauges come from ``connector.common.db`` (``service="executor"``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from connector.common.metrics import BATCH_BUCKETS, LATENCY_BUCKETS

CLAIM_STATEMENTS = Counter(
    "connector_executor_claim_statements_total", "Claim statements executed (claim QPS)", ["result"]
)
CLAIM_SECONDS = Histogram(
    "connector_executor_claim_seconds", "Claim statement latency", buckets=LATENCY_BUCKETS
)
CLAIM_BATCH = Histogram(
    "connector_executor_claim_batch_size", "Items per claim statement", buckets=BATCH_BUCKETS
)
CLAIMED = Counter("connector_executor_claimed_total", "Items claimed", ["pack", "queue_class"])
FINALIZE_SECONDS = Histogram(
    "connector_executor_finalize_seconds", "Finalize flush latency", ["lanes"], buckets=LATENCY_BUCKETS
)
FINALIZE_BATCH = Histogram(
    "connector_executor_finalize_batch_size", "Items per finalize flush", buckets=BATCH_BUCKETS
)
OUTCOMES = Counter(
    "connector_executor_outcomes_total",
    "Finalized items by written state (succeeded, retry, dead, released)",
    ["pack", "state"],
)
FAILURES = Counter(
    "connector_executor_failures_total", "Failed executions by failure class", ["failure_class"]
)
STALE = Counter(
    "connector_executor_stale_token_rejections_total",
    "Fenced writes that matched no row: the lease was lost to another claimer",
    ["op"],
)
ABANDONED = Counter(
    "connector_executor_abandoned_total", "Items this process abandoned after losing their lease"
)
RECLAIMED = Counter(
    "connector_executor_lease_reclaims_total", "Expired leases reclaimed by this process", ["state"]
)
RENEWED = Counter("connector_executor_lease_renewals_total", "Leases renewed")
DEADLOCK_RETRIES = Counter(
    "connector_executor_deadlock_retries_total", "Statements retried after a deadlock (should stay ~0)"
)
LANE_PROMOTIONS = Counter(
    "connector_executor_lane_promotions_total", "Lane members made runnable by this process's finalizes"
)
SLOTS_IN_USE = Gauge("connector_executor_slots_in_use", "Executor slots running a handler")
SLOTS = Gauge("connector_executor_slots", "Executor slots (workers)")
HELD = Gauge("connector_executor_held_items", "Items claimed by this process (running + prefetched)")
ERRORS = Counter("connector_executor_loop_errors_total", "Unexpected errors in executor loops", ["loop"])

# Sampled by stats.py
QUEUE_DEPTH = Gauge(
    "connector_executor_queue_depth",
    "WorkItems by pack, queue class and state",
    ["pack", "queue_class", "state"],
)
OLDEST_READY_AGE = Gauge(
    "connector_executor_oldest_ready_age_seconds", "Age of the oldest due item", ["pack", "queue_class"]
)
BLOCKED_LANES = Gauge(
    "connector_executor_blocked_lanes",
    "Lanes held by a dead head or a head waiting to retry",
    ["pack", "reason"],
)
ACTIVE_CLAIMANTS = Gauge(
    "connector_executor_active_claimants", "Registered claim-capable processes with a fresh heartbeat"
)
