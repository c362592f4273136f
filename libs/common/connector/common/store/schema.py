"""The one schema source of truth: every table of the connector runtime as SQLAlchemy Core.

Alembic migrations (``connector/common/store/migrations``) are checked against this ``MetaData`` by a test
that dumps both catalogs and diffs them, partial-index predicates and triggers included.

Ownership (DESIGN §2): ingress inserts receipts; the materializer owns receipt-routing columns,
events and WorkItem creation; the executor owns WorkItem claim/lease/finalize; the admin API owns
replay, packs, cutover receipts and fences. No service defines tables of its own.

The vocabularies the constraints, the statements and the services share (row states, the claim
order, the channels) are ``vocabulary.py``'s: a service reads a state list without SQLAlchemy.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from connector.common.store.vocabulary import (
    AUTHORITY_PHASES,
    CLAIM_PATHS,
    EVENT_FACT_COLUMNS,
    GENERATION_STATES,
    LANE_HOLDING_PREDICATE,
    LEGACY_OUTCOMES,
    LEGACY_STATES,
    PARKED,
    PROCESS_CAPABILITIES,
    RECEIPT_ORIGINS,
    RECEIPT_ROUTABLE,
    RECEIPT_STATES,
    RECONCILE_RUN_STATES,
    WORK_READY,
    WORK_STATES,
    claim_rank,
    sql_in,
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _ts(name: str, *, nullable: bool = True, default_now: bool = False) -> Column:
    return Column(
        name,
        DateTime(timezone=True),
        nullable=nullable,
        server_default=text("now()") if default_now else None,
    )


# --------------------------------------------------------------------------------------------------
# Packs and routes (admin API writes, everyone reads)
# --------------------------------------------------------------------------------------------------

installed_pack = Table(
    "connector_installed_pack",
    metadata,
    Column("installed_pack_id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("namespace", Text, nullable=False, unique=True),
    Column("incarnation", Integer, nullable=False, server_default=text("1")),
    Column("active_generation", Integer, nullable=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
)

pack_generation = Table(
    "connector_pack_generation",
    metadata,
    Column(
        "installed_pack_id",
        BigInteger,
        ForeignKey("connector_installed_pack.installed_pack_id"),
        nullable=False,
    ),
    Column("generation", Integer, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'staged'")),
    Column("manifest", JSONB, nullable=False),
    Column("manifest_sha256", Text, nullable=False),
    _ts("created_at", nullable=False, default_now=True),
    _ts("activated_at"),
    PrimaryKeyConstraint("installed_pack_id", "generation"),
    CheckConstraint(sql_in("status", GENERATION_STATES), name="status"),
)

route = Table(
    "connector_route",
    metadata,
    Column("route_id", BigInteger, Identity(), primary_key=True),
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("route_key", Text, nullable=False),
    # Increments when a route's config differs from the same route key in the previous generation.
    Column("route_version", Integer, nullable=False),
    # verification (secret *references* only), extraction rules, fan-out, response statuses.
    Column("config", JSONB, nullable=False),
    Column("config_sha256", Text, nullable=False),
    _ts("created_at", nullable=False, default_now=True),
    UniqueConstraint("installed_pack_id", "generation", "route_key"),
    ForeignKeyConstraint(
        ["installed_pack_id", "generation"],
        ["connector_pack_generation.installed_pack_id", "connector_pack_generation.generation"],
        name="fk_connector_route_generation",
    ),
    Index("ix_connector_route_namespace_route_key", "namespace", "route_key"),
)


# --------------------------------------------------------------------------------------------------
# Ingress receipt: durable provider admission + receipt-routing state (materializer-owned columns)
# --------------------------------------------------------------------------------------------------

ingress_receipt = Table(
    "connector_ingress_receipt",
    metadata,
    # Identity order is the delivery sequence.
    Column("receipt_id", BigInteger, Identity(), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("route_key", Text, nullable=False),
    Column("route_id", BigInteger, nullable=True),
    Column("route_version", Integer, nullable=True),
    Column("provider_delivery_id", Text, nullable=True),
    Column("idempotency_key", Text, nullable=False),
    Column("method", Text, nullable=False),
    Column("content_type", Text, nullable=True),
    Column("event_kind", Text, nullable=True),
    _ts("received_at", nullable=False),
    _ts("accepted_at", nullable=False, default_now=True),
    Column("correlation_ids", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("payload_sha256", LargeBinary, nullable=False),
    Column("body", LargeBinary, nullable=True),
    Column("body_ref", Text, nullable=True),
    # e.g. "hmac-sha256" / "standard-webhooks" / "none" plus the *name* of the secret ref that matched.
    Column("verification", Text, nullable=False),
    # W3C ``traceparent`` of the ingress span (docs/tracing.md); NULL while tracing is off.
    Column("traceparent", Text, nullable=True),
    # How it came: NULL = a webhook, 'reconciled' = admitted by the reconciler from the sender's list
    # (docs/reconcile.md). NULL costs a webhook's row no byte (the null bitmap).
    Column("origin", Text, nullable=True),
    # --- routing state (materializer) ---
    Column("router_status", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    _ts("next_attempt_at", nullable=False, default_now=True),
    Column("claim_owner", Text, nullable=True),
    Column("claim_token", BigInteger, nullable=False, server_default=text("0")),
    _ts("lease_until"),
    Column("enqueued_event_ids", ARRAY(BigInteger), nullable=True),
    Column("error_class", Text, nullable=True),
    Column("error_summary", Text, nullable=True),
    _ts("routed_at"),
    UniqueConstraint("namespace", "idempotency_key"),
    CheckConstraint(sql_in("router_status", RECEIPT_STATES), name="router_status"),
    CheckConstraint("body IS NOT NULL OR body_ref IS NOT NULL", name="body_present"),
    CheckConstraint(sql_in("origin", RECEIPT_ORIGINS), name="origin"),
    # The routable set: the materializer's candidate read walks this in due order.
    Index(
        "ix_connector_ingress_receipt_routable",
        "next_attempt_at",
        "receipt_id",
        postgresql_where=text(sql_in("router_status", RECEIPT_ROUTABLE)),
    ),
    # Expired routing leases (a small set: at most the in-flight batches).
    Index(
        "ix_connector_ingress_receipt_routing",
        "receipt_id",
        postgresql_where=text("router_status = 'routing'"),
    ),
    Index(
        "ix_connector_ingress_receipt_failed",
        "namespace",
        "receipt_id",
        postgresql_where=text("router_status = 'failed'"),
    ),
)


# --------------------------------------------------------------------------------------------------
# Event: immutable materialized fact (+ bounded legacy-compatibility columns)
# --------------------------------------------------------------------------------------------------


event_table = Table(
    "connector_event",
    metadata,
    Column("event_id", BigInteger, Identity(), primary_key=True),
    Column(
        "receipt_id",
        BigInteger,
        ForeignKey("connector_ingress_receipt.receipt_id"),
        nullable=False,
    ),
    # One receipt may materialize into several events (a batched payload); 0 for the common case.
    Column("event_index", SmallInteger, nullable=False, server_default=text("0")),
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("incarnation", Integer, nullable=False),
    Column("route_id", BigInteger, nullable=False),
    Column("route_version", Integer, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("event_kind", Text, nullable=True),
    Column("source_object_kind", Text, nullable=True),
    Column("source_object_id", Text, nullable=True),
    # Replay identity: the provider delivery id (or body hash) plus event index.
    Column("idempotency_key", Text, nullable=False),
    Column("delivery_seq", BigInteger, nullable=False),
    Column("payload_sha256", LargeBinary, nullable=False),
    Column("parse_outcome", Text, nullable=False),
    # Companion snapshot or fail-closed companion decision (route-declared required fields).
    Column("companion", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("correlation_ids", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _ts("created_at", nullable=False, default_now=True),
    # --- legacy Event claim path compatibility (mutable, bounded; executor --claim-path event only) ---
    Column("execution_owner", Text, nullable=False, server_default=text("'work_item'")),
    Column("legacy_state", Text, nullable=True),
    Column("legacy_attempts", Integer, nullable=False, server_default=text("0")),
    Column("legacy_lease_owner", Text, nullable=True),
    Column("legacy_lease_token", BigInteger, nullable=False, server_default=text("0")),
    _ts("legacy_lease_until"),
    # Earliest next legacy attempt of a ``retry`` event (the legacy path's run-after).
    _ts("legacy_run_after"),
    UniqueConstraint("receipt_id", "event_index"),
    CheckConstraint(sql_in("execution_owner", ("work_item", "legacy_event")), name="execution_owner"),
    CheckConstraint(f"legacy_state IS NULL OR {sql_in('legacy_state', LEGACY_STATES)}", name="legacy_state"),
    Index("ix_connector_event_installed_pack_id_generation", "installed_pack_id", "generation", "event_id"),
    # Deliveries by correlation id (the admin API's FindDeliveries: ``correlation_ids @> {...}``,
    # which always names one id, so never matches ``{}``). Partial: an event without correlation ids
    # (every event of a route that declares none) adds no GIN entry — 170 of 703 WAL bytes of the
    # event insert in the SQL budget (docs/benchmarks.md, "WAL per delivery").
    Index(
        "ix_connector_event_correlation_ids",
        "correlation_ids",
        postgresql_using="gin",
        postgresql_ops={"correlation_ids": "jsonb_path_ops"},
        postgresql_where=text("correlation_ids <> '{}'::jsonb"),
    ),
    Index(
        "ix_connector_event_legacy_active",
        "installed_pack_id",
        "generation",
        "event_id",
        postgresql_where=text("legacy_state IN ('pending', 'processing', 'retry')"),
    ),
    # Source-object FIFO of the legacy Event claim path: an event waits for earlier unfinished
    # events of its source object (one probe per candidate).
    Index(
        "ix_connector_event_legacy_source",
        "installed_pack_id",
        "generation",
        "source_object_id",
        "event_id",
        postgresql_where=text("legacy_state IN ('pending', 'processing', 'retry')"),
    ),
)


# --------------------------------------------------------------------------------------------------
# WorkItem: the executable queue and the sole distributed execution authority
# --------------------------------------------------------------------------------------------------

work_item = Table(
    "connector_work_item",
    metadata,
    Column("work_id", BigInteger, Identity(), primary_key=True),
    Column("event_id", BigInteger, ForeignKey("connector_event.event_id"), nullable=False),
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("work_type", Text, nullable=False),
    Column("queue_class", Text, nullable=False, server_default=text("'default'")),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    _ts("run_after", nullable=False, default_now=True),
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    # Seconds of head start in the claim order (``claim_rank``): ``(priority - the queue class's
    # lowest priority, if negative) x priority_step_s`` of its manifest, so never negative
    # (docs/adr/014-priorities.md). 0 for every item of a queue class that declares no priority.
    Column("priority_head_s", Float, nullable=False, server_default=text("0")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("25")),
    # Receipt order of the event: lanes run their members in (delivery_seq, work_id) order.
    Column("delivery_seq", BigInteger, nullable=False),
    Column("source_lane_key", Text, nullable=True),
    Column("target_mutation_lane_key", Text, nullable=True),
    # Route lane policy snapshot: does a dead member keep holding its lanes?
    Column("dead_blocks_lane", Boolean, nullable=False, server_default=text("true")),
    # Rate-limit key (docs/adr/011-rate-limits.md): the claim spends the budget of
    # ``connector_rate_limit (installed_pack_id, rate_key)``; NULL when the work type has no limit.
    Column("rate_key", Text, nullable=True),
    # Concurrency key: while processing, the item holds one slot of
    # ``connector_concurrency_limit (installed_pack_id, concurrency_key)``; NULL when unlimited. A
    # ready item whose key had no free slot is *parked* (``run_after = PARKED``, a finite far date)
    # until a member of its key gives a slot back (docs/adr/011-rate-limits.md).
    Column("concurrency_key", Text, nullable=True),
    # Debounce key (docs/packs.md#debounce): items of one (pack, work type, key) waiting together
    # become one execution of the newest; the older ones end ``coalesced`` with ``covered_by`` = the
    # executed item. Per-key state: ``connector_debounce``. NULL when the work type has no debounce.
    Column("debounce_key", Text, nullable=True),
    Column("covered_by", BigInteger, nullable=True),
    # Circuit-breaker key (docs/adr/013-circuit-breakers.md): the handler target of a work type that
    # declares ``circuit_breaker`` (``connector_circuit (installed_pack_id, circuit_key)``: the claim
    # admits the item only while that circuit is closed, or as one of its half-open probes); NULL
    # when the work type declares none.
    Column("circuit_key", Text, nullable=True),
    # W3C ``traceparent`` of the materializer span that created it, else the receipt's (the parent
    # of each handler attempt's span, docs/tracing.md); NULL while tracing is off.
    Column("traceparent", Text, nullable=True),
    Column("lease_owner", Text, nullable=True),
    # Fencing token: strictly increasing per row; every renew/finalize is conditioned on it.
    Column("lease_token", BigInteger, nullable=False, server_default=text("0")),
    _ts("lease_until"),
    Column("outcome", Text, nullable=True),
    Column("failure_class", Text, nullable=True),
    Column("failure_summary", Text, nullable=True),
    Column("replay_count", Integer, nullable=False, server_default=text("0")),
    Column("rollback_execution_fence_id", BigInteger, nullable=True),
    Column("legacy_outcome_receipt_version", Integer, nullable=True),
    Column("legacy_outcome_digest", Text, nullable=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    _ts("started_at"),
    _ts("finished_at"),
    # The receipt's durable acceptance (``connector_ingress_receipt.accepted_at``), copied at
    # materialization: the executor measures receipt -> executed from it without a join on the claim
    # path (docs/metrics.md "Figures"). NULL for a WorkItem created otherwise.
    _ts("accepted_at"),
    UniqueConstraint("event_id", "work_type"),
    CheckConstraint(sql_in("state", WORK_STATES), name="state"),
    CheckConstraint(
        "state <> 'processing' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL)",
        name="processing_has_lease",
    ),
    CheckConstraint("state <> 'coalesced' OR covered_by IS NOT NULL", name="coalesced_has_cover"),
    # Ready candidates, in claim order (due time less the priority head start, ``claim_rank``):
    # the claim statement's only read. Partial on the ready states, so blocked lane members,
    # in-flight and terminal rows never enter the candidate window. With no priorities the rank
    # is ``run_after`` itself. ``run_after`` last: the due check ``run_after <= now()`` is then an
    # index condition, so a prioritized row ranked ahead but not yet due is skipped in the index,
    # without a heap visit (docs/adr/014-priorities.md).
    Index(
        "ix_connector_work_item_ready",
        "installed_pack_id",
        "queue_class",
        text(claim_rank()),
        "work_id",
        "run_after",
        postgresql_where=text(sql_in("state", WORK_READY)),
    ),
    # In-flight rows by id: fenced by-id renew/finalize/reclaim and the reclaim candidate read.
    # Small once vacuumed (slots x processes). ``work_id`` leads so a by-id lookup is an exact
    # descent: with a leading ``installed_pack_id`` the planner used it for ``work_id = ANY(ids)``
    # as a full scan of the index, whose dead entries grow with every item finished between two
    # vacuums (executor finalize 3.5 -> 10 ms in end-to-end runs; docs/benchmarks.md).
    Index(
        "ix_connector_work_item_processing",
        "work_id",
        postgresql_where=text("state = 'processing'"),
    ),
    # Lane membership in delivery order (promotion of the next head, blocked-lane listing).
    Index(
        "ix_connector_work_item_source_lane",
        "installed_pack_id",
        "source_lane_key",
        "delivery_seq",
        "work_id",
        postgresql_where=text(f"source_lane_key IS NOT NULL AND {LANE_HOLDING_PREDICATE}"),
    ),
    Index(
        "ix_connector_work_item_target_lane",
        "installed_pack_id",
        "target_mutation_lane_key",
        "delivery_seq",
        "work_id",
        postgresql_where=text(f"target_mutation_lane_key IS NOT NULL AND {LANE_HOLDING_PREDICATE}"),
    ),
    # Rate-limited items per key that still need their key row, but for those in flight (stats per
    # key: waiting; the idle-key retirement: any such item keeps the key; a dead or cancelled item may
    # be replayed, a blocked one promoted). Unlimited items have no entry. Processing rows have none
    # either: the claim would add one per rate-limited item it takes (~12 % of its update, docs/
    # benchmarks.md "Session 6"); stats and retirement read the in-flight ones from the processing
    # rows (``flow.RATE_IN_FLIGHT``, bounded by the executors' capacity).
    Index(
        "ix_connector_work_item_rate_key",
        "installed_pack_id",
        "rate_key",
        "state",
        postgresql_where=text("rate_key IS NOT NULL AND state NOT IN ('succeeded', 'processing')"),
    ),
    # Concurrency-limited items per key, likewise (stats, the slot check, the idle-key retirement).
    Index(
        "ix_connector_work_item_concurrency_key",
        "installed_pack_id",
        "concurrency_key",
        "state",
        postgresql_where=text("concurrency_key IS NOT NULL AND state <> 'succeeded'"),
    ),
    # Parked items per key, oldest first: the ones a released slot wakes.
    Index(
        "ix_connector_work_item_concurrency_parked",
        "installed_pack_id",
        "concurrency_key",
        "work_id",
        postgresql_where=text(
            f"concurrency_key IS NOT NULL AND state IN ('pending', 'retry') AND run_after = {PARKED}"
        ),
    ),
    # Items of a debounce key in creation order: the newest waiting one (the one to run), the older
    # ones the claim coalesces into it and the live one a new arrival parks; with every other state
    # but succeeded and coalesced (a dead or cancelled item may be replayed), so that the idle-key
    # retirement sees whether anything still needs the key. Undebounced items have no entry.
    Index(
        "ix_connector_work_item_debounce",
        "installed_pack_id",
        "work_type",
        "debounce_key",
        "work_id",
        postgresql_where=text("debounce_key IS NOT NULL AND state NOT IN ('succeeded', 'coalesced')"),
    ),
    # Coalesced items by the item that covered them (the handler's covered set, the trace).
    Index(
        "ix_connector_work_item_covered_by",
        "covered_by",
        postgresql_where=text("state = 'coalesced'"),
    ),
    # Items of a circuit per key, waiting or in flight (stats per circuit). Items without a breaker
    # have no entry.
    Index(
        "ix_connector_work_item_circuit_key",
        "installed_pack_id",
        "circuit_key",
        "state",
        postgresql_where=text("circuit_key IS NOT NULL AND state IN ('pending', 'retry', 'processing')"),
    ),
    # Backstops only (DESIGN §8 trap 2): lane scheduling never relies on these raising.
    Index(
        "uq_connector_work_item_target_lane_processing",
        "installed_pack_id",
        "target_mutation_lane_key",
        unique=True,
        postgresql_where=text("state = 'processing' AND target_mutation_lane_key IS NOT NULL"),
    ),
    Index(
        "uq_connector_work_item_source_lane_processing",
        "installed_pack_id",
        "source_lane_key",
        unique=True,
        postgresql_where=text("state = 'processing' AND source_lane_key IS NOT NULL"),
    ),
    # Dead letters, newest first per pack (DLQ listing).
    Index(
        "ix_connector_work_item_dead",
        "installed_pack_id",
        "finished_at",
        "work_id",
        postgresql_where=text("state = 'dead'"),
    ),
    # Rollback fences and legacy reconciliation.
    Index(
        "ix_connector_work_item_awaiting_legacy",
        "installed_pack_id",
        "generation",
        "work_id",
        postgresql_where=text("state = 'awaiting_legacy_outcome'"),
    ),
    # Depth per (pack, generation, state) for stats and cutover proofs. Partial: succeeded rows are
    # history, never counted, and the majority; a finish to succeeded then adds no entry here (one
    # index insertion fewer per item) and the index stays the size of the queue, not of the history.
    # Queries must say ``state <> 'succeeded'`` when their state is not a constant.
    Index(
        "ix_connector_work_item_installed_pack_id_generation_state",
        "installed_pack_id",
        "generation",
        "state",
        postgresql_where=text("state <> 'succeeded'"),
    ),
)


# The ended attempts of a WorkItem that did not succeed (issue #25, docs/console.md "Delivery"): a
# row is written only by the statements that end a claim without success — the fenced fail
# statement (retry, dead, a started release: ``work_items.finalize.WORK_ITEM_FAIL_BATCH``) and the
# reclaim of an expired lease (``WORK_ITEM_RECLAIM_EXPIRED``) — never by the complete statement: a
# first-time success writes nothing here, and the last attempt of any item is its WorkItem row.
# Bounded per item: a ring of ``ATTEMPTS_KEPT`` slots (``slot`` = the claim counter of the lease
# token modulo it, an insert that overwrites the slot of an older claim), so no delete is needed.
# No foreign key (an RI trigger per deleted WorkItem cost 3x the explicit delete in retention's
# chunk): retention deletes an item's attempts with it (``deliveries.WORK_ITEM_DELETE_RETIRED``).
# ``failure_summary`` is the same sanitized text the WorkItem row holds, never a payload.
ATTEMPT_OUTCOMES = ("retry", "dead", "released", "lease_expired")
work_attempt = Table(
    "connector_work_attempt",
    metadata,
    Column("work_id", BigInteger, nullable=False),
    Column("slot", SmallInteger, nullable=False),
    # The claim's fencing token (strictly increasing per WorkItem: the attempts' order).
    Column("lease_token", BigInteger, nullable=False),
    # The WorkItem's attempt count at the claim (restarts at 1 after a replay).
    Column("attempt", Integer, nullable=False),
    Column("lease_owner", Text, nullable=True),
    _ts("started_at"),
    _ts("ended_at", nullable=False),
    Column("outcome", Text, nullable=False),
    Column("failure_class", Text, nullable=True),
    Column("failure_summary", Text, nullable=True),
    PrimaryKeyConstraint("work_id", "slot"),
    CheckConstraint(sql_in("outcome", ATTEMPT_OUTCOMES), name="outcome"),
)


# One row per (pack, rate-limit key): the key's limit, as the latest materialized declaration gave it,
# and its GCRA state (docs/adr/011-rate-limits.md). The materializer creates it (and updates the limit
# when a new declaration differs) in the transaction that inserts the key's WorkItems; the claim
# statement advances ``tat`` (the theoretical arrival time) for the items it admits. A key may claim
# at database time ``t`` while ``t >= tat - (burst - 1) * period_s / limit_n``. Every writer of a
# key row first takes the key's advisory lock (``store.flow.RATE_KEY_LOCK``): the claim only tries
# it, and skips a key another transaction holds, so no claim ever waits on a key row.
rate_limit = Table(
    "connector_rate_limit",
    metadata,
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("rate_key", Text, nullable=False),
    Column("work_type", Text, nullable=False),
    Column("limit_n", Integer, nullable=False),
    Column("period_s", Float, nullable=False),
    Column("burst", Integer, nullable=False),
    _ts("tat", nullable=False, default_now=True),
    # How many candidates the claim that last advanced ``tat`` admitted: that claim's update computes
    # it from the row's newest version and reads it back (``RETURNING``) to admit exactly those.
    Column("admitted", Integer, nullable=False, server_default=text("0")),
    _ts("created_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("installed_pack_id", "rate_key"),
    CheckConstraint("limit_n >= 1 AND period_s > 0 AND burst >= 1 AND burst <= limit_n", name="limit"),
)


# One row per (pack, concurrency key): its limit (the latest materialized declaration's) and how many
# of its WorkItems are processing. The claim statement adds the items it admits (never above
# ``max_in_flight``); every transition out of ``processing`` (complete, retry, dead, release, reclaim)
# subtracts its rows in the same transaction, and wakes that many parked items of the key.
# ``flow.concurrency_check`` recounts it from the processing rows (it should find nothing to fix).
concurrency_limit = Table(
    "connector_concurrency_limit",
    metadata,
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("concurrency_key", Text, nullable=False),
    Column("work_type", Text, nullable=False),
    Column("max_in_flight", Integer, nullable=False),
    Column("in_flight", Integer, nullable=False, server_default=text("0")),
    _ts("created_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("installed_pack_id", "concurrency_key"),
    CheckConstraint("max_in_flight >= 1 AND in_flight >= 0", name="slots"),
)


# One row per (pack, work type, debounce key): the key's window (the latest materialized declaration's)
# and the newest item an execution of the key claimed (docs/packs.md#debounce). The materializer
# creates it and locks it (``FOR UPDATE``, in key order) before inserting the key's WorkItems, so the
# items of a key are created one transaction at a time and their ``work_id`` order is their commit
# order; the claim statement locks it ``FOR UPDATE SKIP LOCKED`` (never waits) and advances
# ``last_claimed_id``. An item older than ``last_claimed_id`` is never run again: it was covered by a
# later execution, which started after it was created.
debounce = Table(
    "connector_debounce",
    metadata,
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("work_type", Text, nullable=False),
    Column("debounce_key", Text, nullable=False),
    Column("window_s", Float, nullable=False),
    Column("max_wait_s", Float, nullable=False),
    Column("last_claimed_id", BigInteger, nullable=False, server_default=text("0")),
    _ts("created_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("installed_pack_id", "work_type", "debounce_key"),
    CheckConstraint("window_s > 0 AND max_wait_s >= window_s", name="window"),
)


# One row per (pack, circuit key): a circuit breaker of a handler target (docs/adr/013-circuit-breakers.md).
# The materializer creates it (and re-declares a changed policy) in the transaction that inserts the
# key's WorkItems. ``state``: ``closed`` (everything passes), ``open`` (nothing passes until
# ``open_until``; a ``forced`` open, from the admin API, until an operator closes it) or
# ``half_open`` (at most ``half_open_probes`` items in flight as probes, their ids in ``probe_ids``).
# The claim statement reads it (``FOR KEY SHARE`` while closed, so a transition — which locks it
# ``FOR UPDATE`` — waits for the claims in flight and every later claim sees it) and admits probes
# (``FOR UPDATE``); the finalize and reclaim transactions feed it the outcomes (``consecutive``
# failures, the ratio window's counts) and make the transitions.
circuit = Table(
    "connector_circuit",
    metadata,
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("circuit_key", Text, nullable=False),
    Column("work_type", Text, nullable=False),
    # The policy, as the latest materialized declaration gave it (0 / NULL: that trigger is off).
    Column("consecutive_failures", Integer, nullable=False),
    Column("failure_ratio", Float, nullable=True),
    Column("window_s", Float, nullable=False),
    Column("min_outcomes", Integer, nullable=False),
    Column("open_s", Float, nullable=False),
    Column("half_open_probes", Integer, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'closed'")),
    Column("forced", Boolean, nullable=False, server_default=text("false")),
    _ts("open_until"),
    Column("probe_ids", ARRAY(BigInteger), nullable=False, server_default=text("'{}'")),
    # Failures in a row (reset by a success) and the ratio window (counts since ``window_start``).
    Column("consecutive", Integer, nullable=False, server_default=text("0")),
    _ts("window_start", nullable=False, default_now=True),
    Column("window_outcomes", Integer, nullable=False, server_default=text("0")),
    Column("window_failures", Integer, nullable=False, server_default=text("0")),
    # Why and when it last changed state, and how often it opened (the trace view and stats).
    Column("reason", Text, nullable=True),
    _ts("changed_at", nullable=False, default_now=True),
    Column("opened_count", BigInteger, nullable=False, server_default=text("0")),
    # The last operator change (OpenCircuit / CloseCircuit): who (key:<id>) and why.
    Column("actor", Text, nullable=True),
    Column("note", Text, nullable=True),
    _ts("created_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("installed_pack_id", "circuit_key"),
    CheckConstraint(sql_in("state", ("closed", "open", "half_open")), name="state"),
    CheckConstraint(
        "consecutive_failures >= 0 AND (failure_ratio IS NULL OR (failure_ratio > 0 AND failure_ratio <= 1))"
        " AND window_s > 0 AND min_outcomes >= 1 AND open_s > 0 AND half_open_probes >= 1",
        name="policy",
    ),
    CheckConstraint("state <> 'open' OR forced OR open_until IS NOT NULL", name="open_until"),
    # Circuits not closed, for the stats (they list those first).
    Index(
        "ix_connector_circuit_not_closed",
        "installed_pack_id",
        "circuit_key",
        postgresql_where=text("state <> 'closed'"),
    ),
)


# --------------------------------------------------------------------------------------------------
# Control plane: claim authority, cutover receipts, rollback fences, legacy outcomes, processes
# --------------------------------------------------------------------------------------------------

claim_authority = Table(
    "connector_claim_authority",
    metadata,
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("claim_path", Text, nullable=False),
    Column("phase", Text, nullable=False),
    Column("cutover_receipt_id", BigInteger, nullable=True),
    Column("rollback_fence_id", BigInteger, nullable=True),
    Column("version", Integer, nullable=False, server_default=text("1")),
    _ts("updated_at", nullable=False, default_now=True),
    # The pack's paused queue classes ('*': the whole pack), a projection of ``connector_pause``
    # kept on the row the claim statement already locks FOR SHARE: a pause updates it, so it waits
    # for the claims in flight, and every claim that commits after the pause sees it (docs/admin.md).
    Column("paused_queue_classes", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    PrimaryKeyConstraint("installed_pack_id", "generation"),
    CheckConstraint(sql_in("claim_path", CLAIM_PATHS), name="claim_path"),
    CheckConstraint(sql_in("phase", AUTHORITY_PHASES), name="phase"),
    # WorkItem claims are admitted only with a cutover receipt bound.
    CheckConstraint(
        "claim_path <> 'work_item' OR (phase = 'work_item_active' AND cutover_receipt_id IS NOT NULL)",
        name="work_item_needs_receipt",
    ),
)

cutover_receipt = Table(
    "connector_cutover_receipt",
    metadata,
    Column("cutover_receipt_id", BigInteger, Identity(), primary_key=True),
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    # 'cutover' (to WorkItem), 'rollback' (owner-generation receipt back to legacy), 'install' (new
    # pack installed WorkItem-owned: nothing to drain).
    Column("kind", Text, nullable=False),
    Column("claim_path", Text, nullable=False),
    Column("proof", JSONB, nullable=False),
    Column("proof_sha256", Text, nullable=False),
    Column("actor", Text, nullable=False),
    _ts("created_at", nullable=False, default_now=True),
    CheckConstraint(sql_in("kind", ("install", "cutover", "rollback")), name="kind"),
    CheckConstraint(sql_in("claim_path", CLAIM_PATHS), name="claim_path"),
    Index("ix_connector_cutover_receipt_installed_pack_id_generation", "installed_pack_id", "generation"),
)

rollback_fence = Table(
    "connector_rollback_fence",
    metadata,
    Column("fence_id", BigInteger, Identity(), primary_key=True),
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'open'")),
    Column("fenced_work_items", Integer, nullable=False),
    _ts("created_at", nullable=False, default_now=True),
    _ts("resolved_at"),
    CheckConstraint(sql_in("status", ("open", "resolved")), name="status"),
    Index(
        "ix_connector_rollback_fence_open",
        "installed_pack_id",
        "generation",
        postgresql_where=text("status = 'open'"),
    ),
)

legacy_outcome_receipt = Table(
    "connector_legacy_outcome_receipt",
    metadata,
    Column("legacy_outcome_receipt_id", BigInteger, Identity(), primary_key=True),
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("event_id", BigInteger, ForeignKey("connector_event.event_id"), nullable=False),
    Column("work_type", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("outcome", Text, nullable=False),
    # Sanitized failure of a failed/unknown outcome (the legacy path's DLQ detail).
    Column("failure_class", Text, nullable=True),
    Column("failure_summary", Text, nullable=True),
    # Who reported it: ``legacy:<process id>`` or an operator resolution ``key:<key id>``.
    Column("actor", Text, nullable=False),
    Column("digest", Text, nullable=False),
    # Set once by the projector; every other column is immutable (trigger below).
    Column("projected", Boolean, nullable=False, server_default=text("false")),
    _ts("created_at", nullable=False, default_now=True),
    UniqueConstraint("event_id", "work_type", "version"),
    CheckConstraint(sql_in("outcome", LEGACY_OUTCOMES), name="outcome"),
    Index(
        "ix_connector_legacy_outcome_receipt_unprojected",
        "legacy_outcome_receipt_id",
        postgresql_where=text("NOT projected"),
    ),
    # The legacy path's dead letters (failed / unknown outcomes), newest first per generation.
    Index(
        "ix_connector_legacy_outcome_receipt_failed",
        "installed_pack_id",
        "generation",
        "legacy_outcome_receipt_id",
        postgresql_where=text("outcome IN ('failed', 'unknown')"),
    ),
)

# Transitional compatibility only: the legacy Event claim path's pack-wide lease. The WorkItem claim
# path never reads or writes it.
scheduler_lease = Table(
    "connector_scheduler_lease",
    metadata,
    Column("installed_pack_id", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("holder", Text, nullable=True),
    Column("token", BigInteger, nullable=False, server_default=text("0")),
    _ts("lease_until"),
    PrimaryKeyConstraint("installed_pack_id", "generation"),
)

process = Table(
    "connector_process",
    metadata,
    Column("process_id", Text, primary_key=True),
    Column("service", Text, nullable=False),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", Text, nullable=False),
    # The source revision of the build (``core.metrics.build_info``: CONNECTOR_BUILD_REVISION at image
    # build); empty when unknown.
    Column("revision", Text, nullable=False, server_default=text("''")),
    Column("claim_capability", Text, nullable=False),
    _ts("started_at", nullable=False, default_now=True),
    _ts("heartbeat_at", nullable=False, default_now=True),
    # The admitting receipts (``connector_claim_authority.cutover_receipt_id`` of generations in
    # ``work_item_active``) this WorkItem executor has observed and claims under: the claim statements
    # admit a generation for the process only while its row names that exact receipt, and rollback
    # (gate 4) counts live processes naming one of the generation's receipts as claim-capable for it.
    # Written only by the process's admission round (``store.processes.PROCESS_ADMIT``). NULL: the
    # process has not declared its admission — an older build (before claim admission, ADR 021) or one
    # still starting —, so rollback counts it as claim-capable for every generation (fail closed).
    Column("admitted_receipt_ids", ARRAY(BigInteger), nullable=True),
    CheckConstraint(sql_in("claim_capability", PROCESS_CAPABILITIES), name="claim_capability"),
)

# Paused packs and queue classes (PausePack / ResumePack): the durable record with its audit. The
# claim statement reads its projection ``connector_claim_authority.paused_queue_classes``.
pause = Table(
    "connector_pause",
    metadata,
    Column(
        "installed_pack_id",
        BigInteger,
        ForeignKey("connector_installed_pack.installed_pack_id"),
        nullable=False,
    ),
    # A queue class of the pack, or '*' for the whole pack.
    Column("queue_class", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("request_id", Text, nullable=True),
    _ts("paused_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("installed_pack_id", "queue_class"),
)


# --------------------------------------------------------------------------------------------------
# Reconciliation (docs/reconcile.md): a route's watermark and pass checkpoint (the ingress'
# reconciler writes them), on-demand runs (the admin API asks, the reconciler answers)
# --------------------------------------------------------------------------------------------------

reconcile_state = Table(
    "connector_reconcile_state",
    metadata,
    Column("namespace", Text, nullable=False),
    Column("route_key", Text, nullable=False),
    # Every item that occurred before it was listed, checked and (pull) admitted or (redeliver) asked for.
    _ts("watermark"),
    # The pass in progress: its bounds and the next page's cursor (or URL); NULL between passes.
    _ts("pass_since"),
    _ts("pass_until"),
    Column("pass_cursor", Text, nullable=True),
    Column("pass_listed", BigInteger, nullable=True),
    Column("pass_missing", BigInteger, nullable=True),
    Column("pass_admitted", BigInteger, nullable=True),
    _ts("last_pass_at"),
    _ts("last_clean_pass_at"),
    # The last pass's fault class (NULL after a clean one) and its sanitized detail.
    Column("last_error_class", Text, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("last_listed", BigInteger, nullable=True),
    Column("last_missing", BigInteger, nullable=True),
    Column("last_admitted", BigInteger, nullable=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("namespace", "route_key"),
)

reconcile_run = Table(
    "connector_reconcile_run",
    metadata,
    Column("run_id", BigInteger, Identity(), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("route_key", Text, nullable=False),
    _ts("since"),
    Column("dry_run", Boolean, nullable=False),
    Column("actor", Text, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    _ts("requested_at", nullable=False, default_now=True),
    _ts("started_at"),
    _ts("finished_at"),
    Column("claim_owner", Text, nullable=True),
    # The result: the pass's bounds and counts, its fault, the first missing delivery ids.
    Column("result", JSONB, nullable=True),
    CheckConstraint(sql_in("state", RECONCILE_RUN_STATES), name="state"),
    Index("ix_connector_reconcile_run_pending", "run_id", postgresql_where=text("state = 'pending'")),
)


# Figures (docs/metrics.md "Figures without Prometheus"): one row per period (``step_s`` 60 or 300
# seconds, ``start`` aligned to it) and installed pack (0: the whole cluster). Every ingress and
# executor process adds its counts and latency histograms (bucket counts of
# ``core.figures.BOUNDS_S``, trailing zeros trimmed) once per flush interval; one executor writes the
# sampled gauges (NULL: not sampled) and, once the period closed, its quantiles (``quantiles``: p50,
# p95, p99 and count of ack, delivery and delay; NULL while open or after a late flush). Rows older
# than the retention are deleted by that executor. Never written per delivery.
FIGURES_COUNTS = ("accepted", "duplicates", "rejected", "unavailable", "succeeded", "failed", "dead_lettered")
figures = Table(
    "connector_figures",
    metadata,
    Column("step_s", SmallInteger, nullable=False),
    Column("installed_pack_id", BigInteger, nullable=False),
    _ts("start", nullable=False),
    *(Column(name, BigInteger, nullable=False, server_default=text("0")) for name in FIGURES_COUNTS),
    *(
        Column(name, ARRAY(BigInteger), nullable=False, server_default=text("'{}'"))
        for name in ("ack_hist", "delivery_hist", "delay_hist")
    ),
    # Flushes added to the row: sealing writes its quantiles only if none came in between.
    Column("flushes", Integer, nullable=False, server_default=text("0")),
    Column("quantiles", ARRAY(Float), nullable=True),
    Column("backlog", BigInteger, nullable=True),
    Column("in_flight", BigInteger, nullable=True),
    Column("oldest_ready_s", Float, nullable=True),
    Column("open_circuits", Integer, nullable=True),
    Column("pauses", Integer, nullable=True),
    Column("executors", Integer, nullable=True),
    Column("ingress_processes", Integer, nullable=True),
    Column("unrouted", BigInteger, nullable=True),
    Column("oldest_unrouted_s", Float, nullable=True),
    _ts("flushed_at"),
    _ts("sampled_at"),
    PrimaryKeyConstraint("step_s", "installed_pack_id", "start"),
    CheckConstraint("step_s IN (60, 300)", name="step_s"),
    # Updated in place several times a minute (additive flushes): room on the page for HOT updates.
    postgresql_with={"fillfactor": 70},
)


# AIP-155 request_id de-duplication for retryable admin mutations.
admin_request = Table(
    "connector_admin_request",
    metadata,
    Column("request_id", Text, primary_key=True),
    Column("method", Text, nullable=False),
    Column("response", LargeBinary, nullable=False),
    _ts("created_at", nullable=False, default_now=True),
)


# --------------------------------------------------------------------------------------------------
# Database-enforced invariants (functions + triggers), shared verbatim with the migrations.
# --------------------------------------------------------------------------------------------------

_EVENT_FACT_CHECK = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in EVENT_FACT_COLUMNS)

DDL_STATEMENTS: tuple[str, ...] = (
    # Event fact columns are immutable; only the bounded legacy-compat columns may change.
    f"""
CREATE FUNCTION connector_event_facts_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF {_EVENT_FACT_CHECK} THEN
    RAISE EXCEPTION 'connector_event fact columns are immutable (event_id %)', OLD.event_id
      USING ERRCODE = 'restrict_violation';
  END IF;
  RETURN NEW;
END $$
""",
    """
CREATE TRIGGER connector_event_facts_immutable BEFORE UPDATE ON connector_event
FOR EACH ROW EXECUTE FUNCTION connector_event_facts_immutable()
""",
    # Cutover receipts are immutable proofs.
    """
CREATE FUNCTION connector_receipt_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END $$
""",
    """
CREATE TRIGGER connector_cutover_receipt_immutable BEFORE UPDATE OR DELETE ON connector_cutover_receipt
FOR EACH ROW EXECUTE FUNCTION connector_receipt_immutable()
""",
    # A reconciled legacy terminal WorkItem is never reopened, reset or reused.
    """
CREATE FUNCTION connector_work_item_reconciled_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.state = 'reconciled_legacy_terminal' THEN
    RAISE EXCEPTION 'reconciled_legacy_terminal work item % is immutable', OLD.work_id
      USING ERRCODE = 'restrict_violation';
  END IF;
  RETURN NEW;
END $$
""",
    """
CREATE TRIGGER connector_work_item_reconciled_final BEFORE UPDATE OR DELETE ON connector_work_item
FOR EACH ROW WHEN (OLD.state = 'reconciled_legacy_terminal')
EXECUTE FUNCTION connector_work_item_reconciled_final()
""",
    # Legacy outcome receipts are versioned facts: never deleted, content never changed; only the
    # projector's ``projected`` flag may go from false to true.
    """
CREATE FUNCTION connector_legacy_outcome_receipt_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' OR (to_jsonb(NEW) - 'projected') IS DISTINCT FROM (to_jsonb(OLD) - 'projected')
     OR (OLD.projected AND NOT NEW.projected) THEN
    RAISE EXCEPTION 'legacy outcome receipt % is immutable', OLD.legacy_outcome_receipt_id
      USING ERRCODE = 'restrict_violation';
  END IF;
  IF TG_OP = 'DELETE' THEN
    RETURN OLD;
  END IF;
  RETURN NEW;
END $$
""",
    """
CREATE TRIGGER connector_legacy_outcome_receipt_final BEFORE UPDATE OR DELETE
ON connector_legacy_outcome_receipt
FOR EACH ROW EXECUTE FUNCTION connector_legacy_outcome_receipt_final()
""",
    # The server's WAL timeline (1 until a promotion), the high bits of every fencing token
    # (store/tokens.py, docs/adr/018-identity-across-failover.md). A server without WAL functions
    # (Aurora: its storage replicates, a failover loses no commit) answers 1. It raises on a standby,
    # where a claim could not write anyway.
    """
CREATE FUNCTION connector_server_timeline() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint;
EXCEPTION WHEN feature_not_supported OR undefined_function THEN
  RETURN 1;
END $$
""",
    # Queue tables churn: vacuum them early (DESIGN §8 trap 6).
    """
ALTER TABLE connector_work_item SET (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0, fillfactor = 80)
""",
    """
ALTER TABLE connector_ingress_receipt SET (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0, fillfactor = 85)
""",
)


@event.listens_for(metadata, "after_create")
def _create_invariants(target: MetaData, connection, **kw) -> None:
    for statement in DDL_STATEMENTS:
        connection.exec_driver_sql(statement.replace("%", "%%"))
