"""Queue diagnostics sampled into gauges every ``stats_interval_s`` (never read by the claim loop).

Depth by (pack, queue class, state) is an exact count over the non-terminal states; oldest ready
age comes from the ready index (one descent per group); blocked lanes counts lane members that
hold their lanes while not runnable: dead heads whose route blocks on dead, and heads waiting for
their retry time. Active claimants: registered ``work_item`` processes with a fresh heartbeat (within
three heartbeats); stale processes: registered rows of any service whose heartbeat is older;
paused packs and queue classes (``connector_pause``, a handful of rows) with how long each has been;
rate-limit and concurrency keys and their items per (pack, work type) (``flow.rate_limit_sample``,
``flow.concurrency_sample``); waiting debounced items per (pack, work type), live and parked
(``debounce.debounce_sample``); every circuit breaker's state per (pack, target)
(``circuits.circuit_sample``). The outcome counters of every active work type start at zero here
(``metrics.outcomes_known``), so a first dead letter is an increase the alerts can see.

The process that leads the figures (``connector.common.maintenance.figures``) also writes each
sample into the cluster's figures rows (``store.figures.figures_sample``: backlog, in flight,
oldest due age, circuits not closed and pauses per pack; executors, ingress replicas and unrouted
receipts for the cluster): one executor, whichever holds the figures lock.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from connector.common.core.process_registry import process_list
from connector.common.store import circuits, debounce, flow, packs, pauses, receipts, work_items
from connector.common.store import figures as figures_store
from connector.executor import figures
from connector.executor import metrics as m


async def sample_once(
    conn: AsyncConnection[Any], heartbeat_s: float, *, figures_leader: bool = False
) -> None:
    """One sample into the gauges; with ``figures_leader`` (this process holds the figures lock,
    ``connector.common.maintenance.figures``) also into the cluster's figures rows."""
    m.PACK_NAMES.update(await packs.pack_names(conn))  # the pack label is the name
    for pack, work_type in await packs.pack_work_types_active(conn):
        m.outcomes_known(pack, work_type)
    depth = await work_items.stats.work_item_queue_depth(conn)
    m.QUEUE_DEPTH.clear()
    for pack, qc, state, n in depth:
        m.QUEUE_DEPTH.labels(m.pack_label(pack), qc, state).set(n)
    groups = await work_items.claim.work_item_ready_groups(conn)
    m.OLDEST_READY_AGE.clear()
    oldest: dict[int, float] = {}
    for g in groups:  # paused groups too: their work keeps ageing (the alerts tell the two apart)
        age = max(0.0, -g.due_in)
        m.OLDEST_READY_AGE.labels(m.pack_label(g.pack), g.queue_class).set(age)
        oldest[g.pack] = max(age, oldest.get(g.pack, 0.0))
    paused: dict[int, int] = {}
    m.PAUSED.clear()
    m.PAUSED_SECONDS.clear()
    for pause in await pauses.pause_list(conn):
        pack_id = int(pause["installed_pack_id"])
        paused[pack_id] = paused.get(pack_id, 0) + 1
        label = m.pack_label(pack_id)
        m.PAUSED.labels(label, pause["queue_class"]).set(1)
        m.PAUSED_SECONDS.labels(label, pause["queue_class"]).set(float(pause["paused_for_s"]))
    m.RATE_LIMIT_KEYS.clear()
    m.RATE_LIMIT_ITEMS.clear()
    for pack, wt, keys, exhausted, waiting, in_flight in await flow.rate_limit_sample(conn):
        label = m.pack_label(pack)
        m.RATE_LIMIT_KEYS.labels(label, wt, "all").set(keys)
        m.RATE_LIMIT_KEYS.labels(label, wt, "exhausted").set(exhausted)
        m.RATE_LIMIT_ITEMS.labels(label, wt, "waiting").set(waiting)
        m.RATE_LIMIT_ITEMS.labels(label, wt, "in_flight").set(in_flight)
    m.CONCURRENCY_KEYS.clear()
    m.CONCURRENCY_ITEMS.clear()
    for pack, wt, keys, full, waiting, parked, in_flight in await flow.concurrency_sample(conn):
        label = m.pack_label(pack)
        m.CONCURRENCY_KEYS.labels(label, wt, "all").set(keys)
        m.CONCURRENCY_KEYS.labels(label, wt, "full").set(full)
        m.CONCURRENCY_ITEMS.labels(label, wt, "waiting").set(waiting)
        m.CONCURRENCY_ITEMS.labels(label, wt, "parked").set(parked)
        m.CONCURRENCY_ITEMS.labels(label, wt, "in_flight").set(in_flight)
    m.DEBOUNCE_ITEMS.clear()
    for pack, wt, live, parked in await debounce.debounce_sample(conn):
        label = m.pack_label(pack)
        m.DEBOUNCE_ITEMS.labels(label, wt, "live").set(live)
        m.DEBOUNCE_ITEMS.labels(label, wt, "parked").set(parked)
    m.CIRCUIT_STATE.clear()
    m.CIRCUIT_STATE_SECONDS.clear()
    circuit_rows = await circuits.circuit_sample(conn)
    not_closed: dict[int, int] = {}
    for pack, _key, state, _for_s in circuit_rows:
        if state != circuits.CLOSED:
            not_closed[pack] = not_closed.get(pack, 0) + 1
    for pack, key, state, for_s in circuit_rows[: m.MAX_CIRCUIT_TARGETS]:
        label, target = m.pack_label(pack), m.circuit_target_label(key)
        for st in circuits.STATES:
            m.CIRCUIT_STATE.labels(label, target, st).set(1 if st == state else 0)
        m.CIRCUIT_STATE_SECONDS.labels(label, target).set(max(0.0, for_s))
    m.BLOCKED_LANES.clear()
    for pack, dead_head, retry_wait in await work_items.stats.work_item_blocked_lanes(conn):
        m.BLOCKED_LANES.labels(m.pack_label(pack), "dead_head").set(dead_head)
        m.BLOCKED_LANES.labels(m.pack_label(pack), "retry_wait").set(retry_wait)
    processes = await process_list(conn)
    fresh = [p for p in processes if p.heartbeat_age_s <= 3 * heartbeat_s]
    m.ACTIVE_CLAIMANTS.set(sum(1 for p in fresh if p.claim_capability == "work_item"))
    stale: dict[str, int] = dict.fromkeys(m.PROCESS_SERVICES, 0)
    for p in processes:
        if p.heartbeat_age_s > 3 * heartbeat_s:
            service = p.service if p.service in stale else "other"
            stale[service] = stale.get(service, 0) + 1
    for service, n in stale.items():
        m.STALE_PROCESSES.labels(service).set(n)
    if figures_leader:
        unrouted = await receipts.admin.receipt_stats(conn, {"stale_s": 3 * heartbeat_s, "pack": None})
        assert unrouted is not None
        age = unrouted["oldest_unrouted_age"]
        rows = figures.gauge_rows(
            depth,
            oldest,
            not_closed,
            paused,
            executors=sum(1 for p in fresh if p.service == "executor"),
            ingress_processes=sum(1 for p in fresh if p.service == "ingress"),
            unrouted=int(unrouted["unrouted"]),
            oldest_unrouted_s=max(0.0, age.total_seconds()) if age is not None else None,
        )
        await figures_store.figures_sample(conn, rows)
