"""The runtime's vocabularies, shared by the schema's constraints, the store's statements and the
services: the states of each table's rows, the claim order (``claim_rank``), the parked due time, the
event fact columns, the claim paths and authority phases, and the LISTEN/NOTIFY channels. Statements
inline these as literals (DESIGN §8 trap 5: a parameterised state list gives a generic plan that
ignores the partial index); ``schema.py`` builds its check constraints, partial indexes and triggers
from them. Nothing here needs SQLAlchemy."""

from __future__ import annotations


def sql_in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


# --------------------------------------------------------------------------------------------------
# State vocabularies. Claim statements inline these as literals (DESIGN §8 trap 5: a parameterised
# state list gives a generic plan that ignores the partial index).
# --------------------------------------------------------------------------------------------------

RECEIPT_STATES = ("pending", "routing", "retry", "materialized", "failed")
RECEIPT_ROUTABLE = ("pending", "retry")
#: ``connector_ingress_receipt.origin`` besides NULL (a webhook; docs/reconcile.md).
RECEIPT_ORIGINS = ("reconciled",)
#: ``connector_reconcile_run.state``: asked by the admin API, taken and answered by the ingress.
RECONCILE_RUN_STATES = ("pending", "running", "done", "failed")

WORK_STATES = (
    "pending",  # ready once run_after has come
    "blocked",  # waiting behind an earlier member of its source or target lane (not in the ready index)
    "processing",  # claimed: lease_owner/lease_token/lease_until are set
    "retry",  # ready again once run_after has come
    "succeeded",
    "dead",
    "awaiting_legacy_outcome",  # rollback-fenced, non-executable on the WorkItem path
    "reconciled_legacy_terminal",  # immutable, never reopened
    "cancelled",  # discarded by an operator (CancelWorkItem) before it ran again; replayable
    "coalesced",  # debounced: covered by the execution of a later item of its key (``covered_by``)
)
WORK_READY = ("pending", "retry")
#: ``run_after`` of a WorkItem parked for a concurrency slot (docs/adr/011-rate-limits.md): a finite
#: date (not ``'infinity'``, whose differences with ``now()`` are errors in due-time and age reads).
PARKED = "'9999-01-01 00:00:00+00'"


def claim_rank(alias: str = "") -> str:
    """The claim order of a ready WorkItem (docs/adr/014-priorities.md): its due time less its
    priority head start, in seconds since the epoch — ``run_after - priority_head_s``. The ready
    index is built on this expression and the claim orders by it; every statement that wants that
    index spells it with this function (the planner matches the expression, not a name). Written
    with immutable functions only (``timestamptz - interval`` is merely stable), so it can be
    indexed: ``timestamptz - timestamptz`` and ``date_part(text, interval)`` are immutable."""
    col = f"{alias}." if alias else ""
    return f"(date_part('epoch', {col}run_after - {EPOCH}) - {col}priority_head_s)"


#: The epoch as a timestamptz literal (a constant after parsing, so ``claim_rank`` stays immutable).
EPOCH = "'1970-01-01 00:00:00+00'::timestamptz"
#: ``now()`` on the ``claim_rank`` scale: a ready item with rank at most this may be due.
NOW_RANK = f"date_part('epoch', now() - {EPOCH})"
WORK_TERMINAL = ("succeeded", "dead", "reconciled_legacy_terminal", "cancelled", "coalesced")
# What CancelWorkItem may discard: not claimed (no lease), not rollback-fenced, not already final.
WORK_CANCELLABLE = ("pending", "blocked", "retry", "dead")
# Members that hold their lane (a later member of the same lane waits while one of these exists).
WORK_LANE_HOLDING = ("pending", "blocked", "processing", "retry", "awaiting_legacy_outcome")
LANE_HOLDING_PREDICATE = f"({sql_in('state', WORK_LANE_HOLDING)} OR (state = 'dead' AND dead_blocks_lane))"

CLAIM_PATHS = ("work_item", "legacy_event", "none")
AUTHORITY_PHASES = (
    "legacy_active",  # legacy Event path owns claims
    "quiescing",  # Event claim admission stopped, draining leases; nobody may start new claims
    "work_item_active",  # a cutover receipt admits WorkItem claims
    "rollback_fenced",  # WorkItem admission disabled, unstarted items fenced awaiting legacy outcomes
)
# Event states on the legacy Event claim path (executor --claim-path event; docs/cutover.md).
LEGACY_STATES = ("pending", "processing", "retry", "succeeded", "failed", "unknown")
LEGACY_OUTCOMES = ("succeeded", "failed", "unknown")
GENERATION_STATES = ("staged", "active", "retired")
PROCESS_CAPABILITIES = ("work_item", "legacy_event", "none")


EVENT_FACT_COLUMNS = (
    "event_id",
    "receipt_id",
    "event_index",
    "installed_pack_id",
    "generation",
    "incarnation",
    "route_id",
    "route_version",
    "namespace",
    "event_kind",
    "source_object_kind",
    "source_object_id",
    "idempotency_key",
    "delivery_seq",
    "payload_sha256",
    "parse_outcome",
    "companion",
    "correlation_ids",
    "created_at",
)

# Paused packs and queue classes: the whole pack's queue class in ``connector_pause``.
PAUSE_WHOLE_PACK = "*"

# Wake-up channels (LISTEN/NOTIFY); the payload is never data, only a hint.
CHANNEL_RECEIPTS = "connector_receipts"
CHANNEL_WORK = "connector_work"
CHANNEL_PACKS = "connector_packs"
