"""Executor metrics (Prometheus). Labels: pack *names* (``pack_label``), work types and queue classes of
installed manifests, states, operations and failure classes (bounded: ``failure_class_label``) —
never payloads, tokens or keys. Hot-path counters are incremented once per batch, not per item; the
handler-duration histogram once per execution (its labelled child is cached).

Queue depth, oldest ready age, blocked lanes and active claimants are sampled from the database by
``stats.py`` every ``stats_interval_s`` (diagnostics, never an input of the claim loop); the DB pool
gauges come from ``connector.common.core.db`` (``service="executor"``).
"""

from __future__ import annotations

import re

from prometheus_client import Counter, Gauge, Histogram

from connector.common.core.metrics import (
    BATCH_BUCKETS,
    LATENCY_BUCKETS,
    FastHistogram,
    FastHistogramChild,
    registry,
)

#: This service's own registry: what its ``/metrics`` endpoint serves (connector.common.core.metrics).
REGISTRY = registry("executor")

CLAIM_STATEMENTS = Counter(
    "connector_executor_claim_statements_total",
    "Claim statements executed (claim QPS)",
    ["result"],
    registry=REGISTRY,
)
CLAIM_SECONDS = Histogram(
    "connector_executor_claim_seconds", "Claim statement latency", buckets=LATENCY_BUCKETS, registry=REGISTRY
)
CLAIM_BATCH = Histogram(
    "connector_executor_claim_batch_size",
    "Items per claim statement",
    buckets=BATCH_BUCKETS,
    registry=REGISTRY,
)
CLAIMED = Counter(
    "connector_executor_claimed_total", "Items claimed", ["pack", "queue_class"], registry=REGISTRY
)
RATE_LIMITED = Counter(
    "connector_executor_rate_limited_total",
    "Due candidates a claim left unclaimed because their rate-limit key had no budget (deferred to "
    "their budget's time) or was held by another claim at that instant (docs/adr/011-rate-limits.md)",
    ["pack", "queue_class"],
    registry=REGISTRY,
)
DEBOUNCE_HELD = Counter(
    "connector_executor_debounce_held_total",
    "Due debounced candidates a claim did not run: coalesced into a newer item of their key, parked "
    "behind one, or their key held by another transaction at that instant (docs/packs.md#debounce)",
    ["pack", "queue_class"],
    registry=REGISTRY,
)
COALESCED = Counter(
    "connector_executor_coalesced_total",
    "WorkItems covered by a debounced execution (they ended coalesced without running), counted at "
    "the execution's first attempt (docs/packs.md#debounce)",
    ["pack"],
    registry=REGISTRY,
)
FINALIZE_SECONDS = Histogram(
    "connector_executor_finalize_seconds",
    "Finalize flush latency",
    ["lanes"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
FINALIZE_BATCH = Histogram(
    "connector_executor_finalize_batch_size",
    "Items per finalize flush",
    buckets=BATCH_BUCKETS,
    registry=REGISTRY,
)
OUTCOMES = Counter(
    "connector_executor_outcomes_total",
    "Finalized items by pack, work type and written state (succeeded, retry, dead, pending, released)",
    ["pack", "work_type", "state"],
    registry=REGISTRY,
)
FAILURES = Counter(
    "connector_executor_failures_total",
    "Failed executions by pack, work type and failure class",
    ["pack", "work_type", "failure_class"],
    registry=REGISTRY,
)
# Observed once per execution: the lock-free histogram (connector.common.core.metrics.FastHistogram).
HANDLER_SECONDS = FastHistogram(
    "connector_executor_handler_seconds",
    "Handler execution time (start of the call to its outcome, timeouts and errors included)",
    ("pack", "work_type"),
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
STALE = Counter(
    "connector_executor_stale_token_rejections_total",
    "Fenced writes that matched no row: the lease was lost to another claimer",
    ["op"],
    registry=REGISTRY,
)
ABANDONED = Counter(
    "connector_executor_abandoned_total",
    "Items this process abandoned after losing their lease",
    registry=REGISTRY,
)
#: Why a lease ran out on this process's clock (``work/lease_watch.py``).
LEASE_EXPIRED_WHAT = ("unstarted", "cancelled", "uncancellable")
LEASE_EXPIRED_LOCAL = Counter(
    "connector_executor_lease_expired_local_total",
    "Held items whose lease ran out on this process's clock without a renewal (the database did not"
    " answer): unstarted = dropped before its handler was called, cancelled = async handler call"
    " cancelled, uncancellable = a sync handler still running (its finalize is fenced)",
    ["what"],
    registry=REGISTRY,
)
for _what in LEASE_EXPIRED_WHAT:  # alerting counters start at zero (NOTES: increase() and new series)
    LEASE_EXPIRED_LOCAL.labels(_what)
RECLAIMED = Counter(
    "connector_executor_lease_reclaims_total",
    "Expired leases reclaimed by this process",
    ["state"],
    registry=REGISTRY,
)
RENEWED = Counter("connector_executor_lease_renewals_total", "Leases renewed", registry=REGISTRY)
DEADLOCK_RETRIES = Counter(
    "connector_executor_deadlock_retries_total",
    "Statements retried after a deadlock (should stay ~0)",
    registry=REGISTRY,
)
LANE_PROMOTIONS = Counter(
    "connector_executor_lane_promotions_total",
    "Lane members made runnable by this process's finalizes",
    registry=REGISTRY,
)
LANE_HANDOFFS = Counter(
    "connector_executor_lane_handoffs_total",
    "Lane members this process's finalizes claimed for it in their own transaction (handoffs)",
    registry=REGISTRY,
)
SLOTS_IN_USE = Gauge("connector_executor_slots_in_use", "Executor slots running a handler", registry=REGISTRY)
SLOTS = Gauge("connector_executor_slots", "Executor slots (workers)", registry=REGISTRY)
HELD = Gauge(
    "connector_executor_held_items", "Items claimed by this process (running + prefetched)", registry=REGISTRY
)
ERRORS = Counter(
    "connector_executor_loop_errors_total", "Unexpected errors in executor loops", ["loop"], registry=REGISTRY
)

# Sampled by stats.py
QUEUE_DEPTH = Gauge(
    "connector_executor_queue_depth",
    "WorkItems by pack, queue class and state",
    ["pack", "queue_class", "state"],
    registry=REGISTRY,
)
OLDEST_READY_AGE = Gauge(
    "connector_executor_oldest_ready_age_seconds",
    "Age of the oldest due item",
    ["pack", "queue_class"],
    registry=REGISTRY,
)
SLOT_WAKEUPS = Counter(
    "connector_executor_concurrency_wakeups_total",
    "Parked WorkItems made due again because a member of their concurrency key gave its slot back",
    registry=REGISTRY,
)
CONCURRENCY_KEYS = Gauge(
    "connector_executor_concurrency_keys",
    "Concurrency keys per pack and work type; state: all, full (no free slot now)",
    ["pack", "work_type", "state"],
    registry=REGISTRY,
)
CONCURRENCY_ITEMS = Gauge(
    "connector_executor_concurrency_items",
    "WorkItems with a concurrency key per pack and work type; state: waiting (due), parked (waiting "
    "for a slot), in_flight",
    ["pack", "work_type", "state"],
    registry=REGISTRY,
)
CONCURRENCY_REPAIRS = Counter(
    "connector_executor_concurrency_repairs_total",
    "Concurrency keys whose slot count disagreed with their processing WorkItems and was recounted "
    "(healthy: zero), or whose parked items were woken by the check",
    ["what"],
    registry=REGISTRY,
)
FLOW_KEYS_RETIRED = Counter(
    "connector_executor_flow_keys_retired_total",
    "Idle rate-limit, concurrency and debounce key rows deleted (no WorkItem needed them; "
    "flow_key_idle_s); table: rate_limit, concurrency, debounce",
    ["table"],
    registry=REGISTRY,
)
DEBOUNCE_ITEMS = Gauge(
    "connector_executor_debounce_items",
    "Waiting debounced WorkItems per pack and work type; state: live (the newest of its key: its "
    "window running, or due), parked (a newer item of its key will cover it) (docs/packs.md#debounce)",
    ["pack", "work_type", "state"],
    registry=REGISTRY,
)
RATE_LIMIT_KEYS = Gauge(
    "connector_executor_rate_limit_keys",
    "Rate-limit keys per pack and work type; state: all, exhausted (no budget now)",
    ["pack", "work_type", "state"],
    registry=REGISTRY,
)
RATE_LIMIT_ITEMS = Gauge(
    "connector_executor_rate_limit_items",
    "WorkItems with a rate-limit key per pack and work type; state: waiting (pending/retry: due or "
    "deferred to their budget's time), in_flight",
    ["pack", "work_type", "state"],
    registry=REGISTRY,
)
CIRCUIT_STATE = Gauge(
    "connector_executor_circuit_state",
    "1 for the state each circuit breaker is in (state: closed, open, half_open) per pack and target "
    "(the handler target's scheme and host:port, or python callable; never a path, query or user info)",
    ["pack", "target", "state"],
    registry=REGISTRY,
)
CIRCUIT_STATE_SECONDS = Gauge(
    "connector_executor_circuit_state_seconds",
    "How long each circuit breaker has been in its current state",
    ["pack", "target"],
    registry=REGISTRY,
)
CIRCUIT_TRANSITIONS = Counter(
    "connector_executor_circuit_transitions_total",
    "Circuit state changes made by outcomes (state: open — tripped or a probe failed —, closed — a "
    "probe succeeded); manual ones are audited by the admin API",
    ["pack", "state"],
    registry=REGISTRY,
)
BLOCKED_LANES = Gauge(
    "connector_executor_blocked_lanes",
    "Lanes held by a dead head or a head waiting to retry",
    ["pack", "reason"],
    registry=REGISTRY,
)
PAUSED = Gauge(
    "connector_executor_paused",
    '1 per paused pack (queue_class="*") or paused queue class of a pack (PausePack); '
    "claims skip that work until ResumePack",
    ["pack", "queue_class"],
    registry=REGISTRY,
)
PAUSED_SECONDS = Gauge(
    "connector_executor_paused_seconds",
    "How long each pause (see connector_executor_paused) has been in force",
    ["pack", "queue_class"],
    registry=REGISTRY,
)
#: Services whose processes register (connector_process); anything else is counted as ``other``.
PROCESS_SERVICES = ("ingress", "materializer", "executor")
STALE_PROCESSES = Gauge(
    "connector_executor_stale_processes",
    "Registered processes (connector_process rows) whose heartbeat is older than three heartbeats",
    ["service"],
    registry=REGISTRY,
)
ACTIVE_CLAIMANTS = Gauge(
    "connector_executor_active_claimants",
    "Registered claim-capable processes with a fresh heartbeat",
    registry=REGISTRY,
)


# --------------------------------------------------------------------------------------------------
# Bounded label values
# --------------------------------------------------------------------------------------------------

#: installed_pack_id -> pack name (``connector_installed_pack.name``), filled by the engine when it
#: discovers packs and by the stats sampler.
PACK_NAMES: dict[int, str] = {}
#: The label value of anything over the bounds below (a handler inventing failure classes).
OTHER = "other"
_LABEL_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_FAILURE_CLASSES = 64
MAX_WORK_TYPES = 256
_failure_classes: set[str] = set()
_work_types: set[str] = set()
_handler_children: dict[tuple[int, str], FastHistogramChild] = {}


#: Circuit targets exported (a pack's handler targets: bounded by its manifests; capped anyway).
MAX_CIRCUIT_TARGETS = 1000
_TARGET_RE = re.compile(r"[A-Za-z0-9_.:/\[\]-]{1,200}")


def circuit_target_label(key: str) -> str:
    """A circuit key is already only a scheme and authority (``packs.circuit_target``); anything of
    another shape is exported as ``other``."""
    return key if _TARGET_RE.fullmatch(key) else OTHER


def pack_label(pack: int) -> str:
    """The pack's name (installed names are unique); ``pack-<id>`` until the name is known."""
    return PACK_NAMES.get(pack) or f"pack-{pack}"


def _bounded(value: str, seen: set[str], limit: int) -> str:
    if value in seen:
        return value
    if len(seen) >= limit or not _LABEL_RE.fullmatch(value):
        return OTHER
    seen.add(value)
    return value


def work_type_label(work_type: str) -> str:
    """Work types come from installed manifests; bounded anyway (``other`` past ``MAX_WORK_TYPES``)."""
    return _bounded(work_type, _work_types, MAX_WORK_TYPES)


def failure_class_label(failure_class: str) -> str:
    """Failure classes are chosen by handlers: at most ``MAX_FAILURE_CLASSES`` distinct values of a
    safe shape are exported, anything else is ``other``."""
    return _bounded(failure_class, _failure_classes, MAX_FAILURE_CLASSES)


def handler_seconds(pack: int, work_type: str) -> FastHistogramChild:
    child = _handler_children.get((pack, work_type))
    if child is None:
        child = HANDLER_SECONDS.labels(pack_label(pack), work_type_label(work_type))
        if pack in PACK_NAMES:  # cache only under the final label
            _handler_children[(pack, work_type)] = child
    return child


#: The outcome series every known (pack, work type) exports from the start, at zero: Prometheus'
#: ``increase()`` sees nothing of a counter series whose first sample already holds the count, so
#: without them the first dead letters after an executor start (all within one scrape interval)
#: would never fire ``ConnectorDeadLetters``.
ZERO_OUTCOMES = ("succeeded", "retry", "dead")
_zeroed: set[tuple[str, str]] = set()


def outcomes_known(pack: int, work_type: str) -> None:
    """Start the (pack, work type)'s outcome series at zero (once per label pair)."""
    key = (pack_label(pack), work_type_label(work_type))
    if key not in _zeroed and pack in PACK_NAMES:
        _zeroed.add(key)
        for state in ZERO_OUTCOMES:
            OUTCOMES.labels(*key, state)


def failure(pack: int, work_type: str, failure_class: str) -> None:
    FAILURES.labels(pack_label(pack), work_type_label(work_type), failure_class_label(failure_class)).inc()
