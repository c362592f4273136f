"""GetFigures (docs/metrics.md "Figures without Prometheus"): the stored rollups of a window as dense
series of points, one statement (``store.figures.figures_read``), quantiles from the sealed values
of closed periods or from the histograms of open ones, and each series' ``current`` figures (the
previous and the current minute merged).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2
from psycopg import AsyncConnection

from connector.common.core.figures import merged, sealed
from connector.common.store import figures as store
from connector.common.store.figures import COUNTS, FIVE_MINUTES, MINUTE, FiguresRow
from connector.v1 import admin_service_pb2 as pb

#: (step seconds, points) of each window.
WINDOWS: dict[pb.FiguresWindow, tuple[int, int]] = {
    pb.FIGURES_WINDOW_HOUR: (MINUTE, 60),
    pb.FIGURES_WINDOW_DAY: (FIVE_MINUTES, 288),
}
#: Pack ids one request may name.
MAX_PACKS = 100


def _duration(seconds: float | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    out = duration_pb2.Duration()
    _set_duration(out, seconds)
    return out


def _set_duration(d: duration_pb2.Duration, seconds: float) -> None:
    """In place (no message copied): whole seconds and nanoseconds of a non-negative duration."""
    seconds = max(0.0, seconds)
    whole = int(seconds)
    d.seconds = whole
    d.nanos = int((seconds - whole) * 1e9)


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


_LATENCIES = ("ack_latency", "delivery_latency", "scheduling_delay")


def _set_latencies(pt: pb.FiguresPoint, quantiles: Sequence[float]) -> None:
    """``quantiles``: p50, p95, p99 and count per histogram (``core.figures.sealed``)."""
    for i, name in enumerate(_LATENCIES):
        n = quantiles[i * 4 + 3]
        if n > 0:
            q = getattr(pt, name)
            _set_duration(q.p50, quantiles[i * 4])
            _set_duration(q.p95, quantiles[i * 4 + 1])
            _set_duration(q.p99, quantiles[i * 4 + 2])
            q.count = int(n)


def _set_gauges(pt: pb.FiguresPoint, values: Sequence[Any]) -> None:
    if all(v is None for v in values):
        return
    g = pt.gauges
    backlog, in_flight, oldest, circuits, pauses, executors, ingress, unrouted, oldest_unrouted = values
    g.backlog = int(backlog or 0)
    g.in_flight = int(in_flight or 0)
    if oldest is not None:
        _set_duration(g.oldest_ready_age, float(oldest))
    g.open_circuits = int(circuits or 0)
    g.pauses = int(pauses or 0)
    g.active_executors = int(executors or 0)
    g.ingress_processes = int(ingress or 0)
    g.receipts_unrouted = int(unrouted or 0)
    if oldest_unrouted is not None:
        _set_duration(g.oldest_unrouted_age, float(oldest_unrouted))


def _fill(
    pt: pb.FiguresPoint,
    start_s: float,
    seconds: float,
    counts: Sequence[int],
    quantiles: Sequence[float] | None,
    histograms: Sequence[Sequence[int] | None],
    gauges: Sequence[Any] | None,
) -> None:
    """One point, in place: counts, latencies (stored ``quantiles``, else from ``histograms``)."""
    pt.start_time.seconds = int(start_s)
    pt.seconds = seconds
    accepted, duplicates, rejected, unavailable, succeeded, failed, dead = counts
    if accepted or duplicates or rejected or unavailable:
        pt.accepted, pt.duplicates, pt.rejected, pt.unavailable = accepted, duplicates, rejected, unavailable
    if succeeded or failed or dead:
        pt.executed, pt.succeeded, pt.failed, pt.dead_lettered = succeeded + failed, succeeded, failed, dead
    if quantiles is not None:
        _set_latencies(pt, quantiles)
    else:
        _set_latencies(pt, sealed([h or () for h in histograms]))
    if gauges is not None:
        _set_gauges(pt, gauges)


def _covered(start_s: float, step_s: int, now_s: float, flushed_s: float | None) -> float:
    """Seconds of a period its counts cover: the step once it closed, else up to its last flush."""
    end = start_s + step_s
    if now_s >= end:
        return float(step_s)
    return max(0.0, min(float(step_s), (flushed_s if flushed_s is not None else now_s) - start_s))


def _current(pt: pb.FiguresPoint, rows: Sequence[FiguresRow], now_s: float) -> None:
    """The previous and the current minute merged (``rows``: a series' rows), in place."""
    recent_start = math.floor(now_s / MINUTE) * MINUTE - MINUTE
    mine = [r for r in rows if r.step_s == MINUTE and r.start_s >= recent_start]
    flushed = [r.flushed_s for r in mine if r.flushed_s is not None and r.start_s > recent_start]
    end = max(flushed) if flushed else now_s
    seconds = max(0.0, min(2.0 * MINUTE, end - recent_start))
    sampled = [r for r in mine if any(g is not None for g in r.gauges)]
    gauges = max(sampled, key=lambda r: r.start_s).gauges if sampled else None
    counts = [sum(r.counts[i] for r in mine) for i in range(len(COUNTS))]
    hists = [merged(r.histograms[i] for r in mine) for i in range(len(store.HISTOGRAMS))]
    _fill(pt, recent_start, seconds, counts, None, hists, gauges)


async def figures_get(
    conn: AsyncConnection[object],
    window: pb.FiguresWindow,
    packs: Sequence[int],
    *,
    current_only: bool,
    packs_only: bool = False,
) -> pb.GetFiguresResponse:
    """The response of GetFigures (``window`` a known ``FiguresWindow``; ``packs`` validated, ``[0]``:
    the cluster alone; ``packs_only``: without the cluster's series unless ``packs`` names 0)."""
    if window == pb.FIGURES_WINDOW_UNSPECIFIED:
        window = pb.FIGURES_WINDOW_HOUR
    step_s, points = WINDOWS[window]
    now_s, series = await store.figures_read(
        conn, step_s=step_s, span_s=float(step_s * points), packs=packs, current_only=current_only
    )
    last = math.floor(now_s / step_s) * step_s
    first = last - (points - 1) * step_s
    response = pb.GetFiguresResponse(window=window, step=_duration(step_s), end_time=_timestamp(now_s))
    skip_cluster = packs_only and 0 not in packs
    for s in series:
        if skip_cluster and s.installed_pack_id == 0:
            continue
        out = response.series.add(installed_pack_id=s.installed_pack_id, pack_name=s.name)
        if not current_only:
            by_start = {r.start_s: r for r in s.rows if r.step_s == step_s}
            add = out.points.add
            for i in range(points):
                start = first + i * step_s
                row = by_start.get(start)
                pt = add()
                if row is None:
                    pt.start_time.seconds = int(start)
                    pt.seconds = _covered(start, step_s, now_s, None)
                    continue
                covered = _covered(start, step_s, now_s, row.flushed_s)
                _fill(pt, start, covered, row.counts, row.quantiles, row.histograms, row.gauges)
        _current(out.current, s.rows, now_s)
    return response
