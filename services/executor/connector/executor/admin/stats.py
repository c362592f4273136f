"""Queue, lane and cutover statistics from indexed reads only (tests assert the plans with EXPLAIN),
assembled from the store's statements: ``store.work_items.stats.work_item_stats_*`` and
``work_item_lanes_walk``, ``store.receipts.admin.receipt_stats``, ``store.authority.cutover_state_list``
and ``cutover_receipt_list``, ``store.packs.pack_exists``.

Every count is driven from the small control tables (packs, generations) into equality ranges of
WorkItem indexes, never a scan of ``connector_work_item``:

* depth by state: ``ix_connector_work_item_installed_pack_id_generation_state`` with
  (pack, generation, state) all equal, per generation of ``connector_pack_generation`` and per
  *queue* state (``QUEUE_STATES``: succeeded and reconciled rows are history, not depth, and are not
  counted: their number only grows);
* per queue class: the partial ready index (pack, queue_class, run_after) — a loose index scan finds
  the classes, then ready / due counts and the oldest due ``run_after``; in-flight per class from the
  partial processing index;
* dead rate: dead rows whose ``finished_at`` is in the window (partial dead index); retry rate: rows
  in ``retry`` whose ``updated_at`` is in the window (state index). Both are per second over
  ``RATE_WINDOW_S``; the retry rate is a lower bound (an item that retried and was claimed again
  within the window is not in ``retry`` any more). Exact rates are the executor's counters.
* receipts: the partial routable / routing / failed receipt indexes;
* pauses: ``connector_pause`` (a handful of rows, by primary key order).

These are scoped diagnostics for operators (seed: "exact full queue stats remain scoped diagnostics,
not a hot-loop scheduler or admission dependency"): nothing in the runtime polls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection

from connector.common.store import authority, circuits, flow, pauses, receipts, work_items
from connector.common.store import debounce as debounce_store
from connector.common.store.packs import pack_exists
from connector.common.store.vocabulary import PAUSE_WHOLE_PACK
from connector.common.store.work_items.stats import QUEUE_STATES

__all__ = [
    "CutoverState",
    "QueueRow",
    "QueueStats",
    "cutover_state_get",
    "pack_exists",
    "queue_stats",
]

RATE_WINDOW_S = 300


@dataclass(slots=True)
class QueueRow:
    installed_pack_id: int
    pack_name: str
    queue_class: str  # "" = the whole pack
    depth_by_state: dict[str, int] = field(default_factory=dict)
    oldest_ready_age: timedelta | None = None
    due: int = 0
    in_flight: int = 0
    retry_rate: float = 0.0
    dead_rate: float = 0.0
    paused: bool = False


@dataclass(slots=True)
class QueueStats:
    queues: list[QueueRow]
    receipts_unrouted: int
    oldest_unrouted_age: timedelta | None
    receipts_routing: int
    receipts_failed: int
    active_claimants: int
    pauses: list[dict[str, Any]] = field(default_factory=list)
    #: ``store.flow.rate_limit_stats`` rows (at most ``RATE_KEYS_SHOWN``) and whether more exist.
    rate_limits: list[dict[str, Any]] = field(default_factory=list)
    rate_limits_truncated: bool = False
    #: ``store.flow.concurrency_stats`` rows (at most ``RATE_KEYS_SHOWN``) and whether more exist.
    concurrency: list[dict[str, Any]] = field(default_factory=list)
    concurrency_truncated: bool = False
    #: ``store.debounce.debounce_stats`` rows (at most ``RATE_KEYS_SHOWN``) and whether more exist.
    debounce: list[dict[str, Any]] = field(default_factory=list)
    debounce_truncated: bool = False
    #: ``store.circuits.circuit_stats`` rows (at most ``RATE_KEYS_SHOWN``) and whether more exist.
    circuits: list[dict[str, Any]] = field(default_factory=list)
    circuits_truncated: bool = False


#: Rate-limit (and concurrency) keys GetQueueStats lists (the per-key counts are index reads of
#: each key's items).
RATE_KEYS_SHOWN = 200


async def queue_stats(
    conn: AsyncConnection[Any], pack: int | None, *, stale_s: float, counts: bool = True
) -> QueueStats:
    """The queue rows and receipt counts (with ``counts``: they count index ranges, so their cost
    grows with the queue), pauses, keys and circuits (a bounded number of rows each)."""
    params: dict[str, Any] = {"pack": pack, "window": RATE_WINDOW_S, "stale_s": stale_s}
    packs: dict[int, Any] = {}
    depth: list[dict[str, Any]] = []
    classes: list[dict[str, Any]] = []
    processing: list[dict[str, Any]] = []
    receipt_counts: dict[str, Any] | None = dict.fromkeys(
        ("unrouted", "routing", "failed", "active_claimants"), 0
    ) | {"oldest_unrouted_age": None}
    if counts:
        packs = {
            int(r["installed_pack_id"]): r for r in await work_items.stats.work_item_stats_rates(conn, params)
        }
        depth = await work_items.stats.work_item_stats_depth(conn, params)
        classes = await work_items.stats.work_item_stats_classes(conn, params)
        processing = await work_items.stats.work_item_stats_processing(conn, params)
        receipt_counts = await receipts.admin.receipt_stats(conn, params)
    assert receipt_counts is not None
    paused = await pauses.pause_list(conn, pack)
    rate_rows = await flow.rate_limit_stats(conn, pack, RATE_KEYS_SHOWN + 1)
    slot_rows = await flow.concurrency_stats(conn, pack, RATE_KEYS_SHOWN + 1)
    debounce_rows = await debounce_store.debounce_stats(conn, pack, RATE_KEYS_SHOWN + 1)
    circuit_rows = await circuits.circuit_stats(conn, pack, RATE_KEYS_SHOWN + 1)
    paused_keys = {(int(p["installed_pack_id"]), str(p["queue_class"])) for p in paused}
    totals: dict[int, QueueRow] = {}
    for pack_id, row in packs.items():
        totals[pack_id] = QueueRow(
            installed_pack_id=pack_id,
            pack_name=row["name"],
            queue_class="",
            depth_by_state=dict.fromkeys(QUEUE_STATES, 0),
            retry_rate=int(row["retry_recent"]) / RATE_WINDOW_S,
            dead_rate=int(row["dead_recent"]) / RATE_WINDOW_S,
        )
    for row in depth:
        total = totals.get(int(row["installed_pack_id"]))
        if total is not None:
            total.depth_by_state[row["state"]] = int(row["n"] or 0)
    by_class: dict[tuple[int, str], QueueRow] = {}

    def class_row(pack_id: int, queue_class: str) -> QueueRow:
        key = (pack_id, queue_class)
        if key not in by_class:
            by_class[key] = QueueRow(
                installed_pack_id=pack_id,
                pack_name=totals[pack_id].pack_name if pack_id in totals else "",
                queue_class=queue_class,
                depth_by_state={"ready": 0, "processing": 0},
            )
        return by_class[key]

    for row in classes:
        q = class_row(int(row["installed_pack_id"]), row["queue_class"])
        q.depth_by_state["ready"] = int(row["ready"])
        q.due = int(row["due"])
        q.oldest_ready_age = row["oldest_due_age"]
    for row in processing:
        q = class_row(int(row["installed_pack_id"]), row["queue_class"])
        q.depth_by_state["processing"] = int(row["n"])
        q.in_flight = int(row["n"])
    for total in totals.values():
        total.in_flight = total.depth_by_state.get("processing", 0)
        mine = [q for (p, _), q in by_class.items() if p == total.installed_pack_id]
        total.due = sum(q.due for q in mine)
        ages = [q.oldest_ready_age for q in mine if q.oldest_ready_age is not None]
        total.oldest_ready_age = max(ages) if ages else None
    for q in [*totals.values(), *by_class.values()]:
        whole = (q.installed_pack_id, PAUSE_WHOLE_PACK) in paused_keys
        q.paused = whole or (bool(q.queue_class) and (q.installed_pack_id, q.queue_class) in paused_keys)
    queues: list[QueueRow] = []
    for pack_id in sorted(totals):
        queues.append(totals[pack_id])
        queues.extend(by_class[k] for k in sorted(by_class) if k[0] == pack_id)
    queues.extend(by_class[k] for k in sorted(by_class) if k[0] not in totals)
    return QueueStats(
        queues=queues,
        receipts_unrouted=int(receipt_counts["unrouted"]),
        oldest_unrouted_age=receipt_counts["oldest_unrouted_age"],
        receipts_routing=int(receipt_counts["routing"]),
        receipts_failed=int(receipt_counts["failed"]),
        active_claimants=int(receipt_counts["active_claimants"]),
        pauses=paused,
        rate_limits=rate_rows[:RATE_KEYS_SHOWN],
        rate_limits_truncated=len(rate_rows) > RATE_KEYS_SHOWN,
        concurrency=slot_rows[:RATE_KEYS_SHOWN],
        concurrency_truncated=len(slot_rows) > RATE_KEYS_SHOWN,
        debounce=debounce_rows[:RATE_KEYS_SHOWN],
        debounce_truncated=len(debounce_rows) > RATE_KEYS_SHOWN,
        circuits=circuit_rows[:RATE_KEYS_SHOWN],
        circuits_truncated=len(circuit_rows) > RATE_KEYS_SHOWN,
    )


# ------------------------------------------------------------------------------------------------
# Cutover state
# ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class CutoverState:
    #: one row per generation, its live claim-capable processes counted by the gates' rules
    #: (``work_item_claim_processes``, ``legacy_event_claim_processes``)
    generations: list[dict[str, Any]]
    receipts: dict[tuple[int, int], list[dict[str, Any]]]


async def cutover_state_get(conn: AsyncConnection[Any], pack: int | None, *, stale_s: float) -> CutoverState:
    params: dict[str, Any] = {"pack": pack, "stale_s": stale_s}
    generations = await authority.cutover_state_list(conn, params)
    by_generation: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in await authority.cutover_receipt_list(conn, params):
        by_generation.setdefault((int(row["installed_pack_id"]), int(row["generation"])), []).append(row)
    return CutoverState(generations=generations, receipts=by_generation)
