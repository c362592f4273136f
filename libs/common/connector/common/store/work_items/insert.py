"""WorkItem creation: the materializer's multi-row insert (the routing loop, the backfill and the
cutover's backfill through ``connector.common.delivery.materialization``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.circuits import CircuitKey
from connector.common.store.debounce import DebounceKey
from connector.common.store.events import unnest_columns
from connector.common.store.flow import RateKey, SlotKey
from connector.common.store.lanes import (
    Lane,
    lanes_of,
)

Conn = AsyncConnection[Any]

# ------------------------------------------------------------------------------------------------
# Creation (the materializer is the sole writer: the routing loop, the backfill and the cutover's
# backfill through connector.common.delivery.materialization)
# ------------------------------------------------------------------------------------------------

WORK_ITEM_INSERT_COLUMNS = (
    ("event_id", "int8"), ("installed_pack_id", "int8"), ("generation", "int4"), ("work_type", "text"),
    ("queue_class", "text"), ("state", "text"), ("priority", "int2"), ("priority_head_s", "float8"),
    ("max_attempts", "int4"), ("delivery_seq", "int8"), ("source_lane_key", "text"),
    ("target_mutation_lane_key", "text"), ("dead_blocks_lane", "bool"), ("traceparent", "text"),
    ("rate_key", "text"), ("concurrency_key", "text"), ("debounce_key", "text"), ("circuit_key", "text"),
)  # fmt: skip

# Rows go in (delivery_seq, fan-out order), so work_id order agrees with lane order. ``run_after``
# is the due time: now, or a delay's instant (``not_before``, NULL without one; ``greatest`` ignores
# NULL; a past one is due now). Priority is not in it: the claim orders by ``vocabulary.claim_rank``
# (due time less ``priority_head_s``, docs/adr/014-priorities.md), so it survives retries and delays.
# ``accepted_s``: the receipt's ``accepted_at`` as Unix seconds (what the receipt claim returns),
# NULL when unknown (the figures' receipt -> executed latency, docs/metrics.md).
_INSERT_INPUT = (*WORK_ITEM_INSERT_COLUMNS, ("not_before", "timestamptz"), ("accepted_s", "float8"))
WORK_ITEM_INSERT_BATCH = f"""
INSERT INTO connector_work_item ({", ".join(c for c, _ in WORK_ITEM_INSERT_COLUMNS)}, run_after, accepted_at)
SELECT {", ".join(c for c, _ in WORK_ITEM_INSERT_COLUMNS)}, greatest(now(), not_before),
       to_timestamp(accepted_s)
FROM unnest({", ".join(f"%({c})b::{t}[]" for c, t in _INSERT_INPUT)})
  WITH ORDINALITY AS w({", ".join(c for c, _ in _INSERT_INPUT)}, ord)
ORDER BY ord
ON CONFLICT (event_id, work_type) DO NOTHING
"""


@dataclass(frozen=True, slots=True)
class WorkRow:
    """A WorkItem to create."""

    event_id: int
    installed_pack_id: int
    generation: int
    work_type: str
    queue_class: str
    priority: int
    max_attempts: int
    delivery_seq: int
    source_lane_key: str | None
    target_lane_key: str | None
    dead_blocks_lane: bool
    #: Head start in the claim order, seconds (``packs.priority_heads``; docs/adr/014-priorities.md).
    priority_head_s: float = 0.0
    #: W3C traceparent the attempts' spans continue (docs/tracing.md).
    traceparent: str | None = None
    #: Not runnable before this instant (a work type's delay, docs/packs.md); None: at once.
    run_after: datetime | None = None
    #: Rate-limit key and limit (docs/adr/011-rate-limits.md); its row is declared in the same
    #: transaction (``flow.rate_limit_declare``).
    rate: RateKey | None = None
    #: Concurrency key and limit; its row is declared in the same transaction
    #: (``flow.concurrency_declare``).
    slot: SlotKey | None = None
    #: Debounce key and window; its row is declared and locked in the same transaction, before the
    #: insert (``debounce.debounce_declare``), which also gives ``run_after`` (docs/packs.md#debounce).
    debounce: DebounceKey | None = None
    #: Circuit (the handler target) and breaker policy (docs/adr/013-circuit-breakers.md); its row
    #: is declared in the same transaction (``circuits.circuit_declare``).
    circuit: CircuitKey | None = None
    #: The receipt's durable acceptance (Unix seconds, database clock); None: unknown.
    accepted_at: float | None = None

    @property
    def lanes(self) -> list[Lane]:
        return lanes_of(self.installed_pack_id, self.source_lane_key, self.target_lane_key)


async def work_item_insert_batch(conn: Conn, rows: Sequence[WorkRow]) -> int:
    """Insert WorkItems in ``rows`` order (conflicts on ``(event_id, work_type)`` ignored); lane
    members go in ``blocked`` — the lane settle that follows promotes the runnable ones."""
    if not rows:
        return 0
    values = [
        (
            w.event_id,
            w.installed_pack_id,
            w.generation,
            w.work_type,
            w.queue_class,
            "blocked" if w.source_lane_key is not None or w.target_lane_key is not None else "pending",
            w.priority,
            float(w.priority_head_s),
            w.max_attempts,
            w.delivery_seq,
            w.source_lane_key,
            w.target_lane_key,
            w.dead_blocks_lane,
            w.traceparent,
            w.rate.rate_key if w.rate is not None else None,
            w.slot.concurrency_key if w.slot is not None else None,
            w.debounce.debounce_key if w.debounce is not None else None,
            w.circuit.circuit_key if w.circuit is not None else None,
            w.run_after,
            w.accepted_at,
        )
        for w in rows
    ]
    cols = unnest_columns(_INSERT_INPUT, values)
    cur = await conn.execute(WORK_ITEM_INSERT_BATCH, cols, prepare=True)
    return cur.rowcount
