"""The executor's share of the cluster's figures (docs/metrics.md "Figures without Prometheus"):
what its finalizes and reclaims committed, recorded in the engine's ``Recorder`` (in memory; the
service's figures job flushes it), and the stats sampler's gauges as the rows the figures leader
writes.

Per finished item, from the finalize flush that committed it (a lost lease records nothing):

* an execution: ``succeeded``, or failed (a retry or dead outcome; a release is none);
* receipt → executed (succeeded only): the flush's instant minus the receipt's ``accepted_at``,
  both on the database clock (this host's clock corrected by the offset the figures job measures);
* scheduling delay: the handler's start minus the item's due time (``run_after``) — what the item
  waited once due: claim, prefetch and, for a lane member, its lane.

Reclaimed expired leases count as failed executions (dead ones also as dead letters), without
latencies.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from connector.common.core.figures import BOUNDS_S, Recorder
from connector.common.store.figures import GaugeRow
from connector.common.store.work_items.finalize import FailOp

if TYPE_CHECKING:
    from connector.common.store.work_items.finalize import FailBatch, FinalizeResult, Reclaimed
    from connector.executor.work.inflight import InFlight

monotonic = time.monotonic


def finalized(rec: Recorder, items: Sequence[InFlight], fail: FailBatch, res: FinalizeResult) -> None:
    """Record the executions one committed finalize flush ended (~0.4 µs per item)."""
    # Database-clock instants from the monotonic clock (the executor never reads the wall clock):
    # now, and a handler's start (``offset + f.t0``). Until the figures job measured the offset
    # (its first round), no latency is recorded.
    offset = rec.clock_offset_s
    now_db = monotonic() + offset
    timed = rec.synced
    if len(res.completed) == len(items) and not res.transitions:  # the common flush: all succeeded
        packs = rec.packs
        pack = -1
        f = None
        for it in items:
            if it.installed_pack_id != pack:
                pack = it.installed_pack_id
                f = packs.get(pack) or rec.pack(pack)
            assert f is not None
            f.succeeded += 1
            if not timed:
                continue
            accepted = it.accepted_s
            if accepted is not None:
                f.delivery[bisect_left(BOUNDS_S, now_db - accepted)] += 1  # negative: the first bucket
            if it.started:
                f.delay[bisect_left(BOUNDS_S, offset + it.t0 - it.due_s)] += 1
        return
    done = set(res.completed)
    states = dict(res.transitions)
    ops = dict(zip(fail.ids, fail.ops, strict=True)) if states else {}
    for it in items:
        wid = it.work_id
        if wid in done:
            state = "succeeded"
        else:
            written = states.get(wid)
            op = ops.get(wid)
            if written is None or op is None or op == FailOp.RELEASE:
                continue
            state = "dead" if written == "dead" else "retry"
        delay = max(0.0, offset + it.t0 - it.due_s) if it.started and timed else None
        accepted = it.accepted_s
        delivery = (
            max(0.0, now_db - accepted) if state == "succeeded" and accepted is not None and timed else None
        )
        rec.executed(it.installed_pack_id, state, delivery, delay)


def reclaimed(rec: Recorder, rows: Iterable[Reclaimed]) -> None:
    """Expired leases a reclaim ended (retry or dead): failed executions without latencies."""
    for r in rows:
        if r.state in ("retry", "dead"):
            rec.executed(r.installed_pack_id, r.state, None, None)


def gauge_rows(
    depth: Iterable[tuple[int, str, str, int]],
    oldest_ready_s: dict[int, float],
    circuits_open: dict[int, int],
    pauses: dict[int, int],
    *,
    executors: int,
    ingress_processes: int,
    unrouted: int | None,
    oldest_unrouted_s: float | None,
) -> list[GaugeRow]:
    """The sampler's view as one gauge row per pack plus the cluster's (pack 0): backlog = pending +
    retry + blocked, in flight = processing (``work_item_queue_depth`` rows), the oldest due item's
    age, circuits not closed, pauses in force."""
    backlog: dict[int, int] = {}
    in_flight: dict[int, int] = {}
    for pack, _qc, state, n in depth:
        if state == "processing":
            in_flight[pack] = in_flight.get(pack, 0) + n
        elif state in ("pending", "retry", "blocked"):
            backlog[pack] = backlog.get(pack, 0) + n
    packs = sorted(set(backlog) | set(in_flight) | set(oldest_ready_s) | set(circuits_open) | set(pauses))
    rows = [
        GaugeRow(
            installed_pack_id=p,
            backlog=backlog.get(p, 0),
            in_flight=in_flight.get(p, 0),
            oldest_ready_s=oldest_ready_s.get(p),
            open_circuits=circuits_open.get(p, 0),
            pauses=pauses.get(p, 0),
        )
        for p in packs
    ]
    ages = list(oldest_ready_s.values())
    rows.append(
        GaugeRow(
            installed_pack_id=0,
            backlog=sum(backlog.values()),
            in_flight=sum(in_flight.values()),
            oldest_ready_s=max(ages) if ages else None,
            open_circuits=sum(circuits_open.values()),
            pauses=sum(pauses.values()),
            executors=executors,
            ingress_processes=ingress_processes,
            unrouted=unrouted,
            oldest_unrouted_s=oldest_unrouted_s,
        )
    )
    return rows
