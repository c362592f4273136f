"""Overview: the cluster at a glance, live.

The live part (cards and charts, refreshed every 5 s while the tab is visible) is one GetFigures
call: per-minute rollups every process flushes and one executor's sampled gauges (backlog, in flight,
oldest ready age, open circuits, pauses, executors, unrouted receipts), one bounded statement whatever
the number of packs or charts, no Prometheus needed; for the whole cluster it asks for the cluster's
series alone (``installed_pack_ids=[0]``). The per-pack table is one GetFigures call too
(``current_only``, every pack): loaded once with the page (``/overview/queues``), never polled.
Nothing on the overview counts the queue (exact depth by state and queue class: ``connector admin
stats``). An admin API without GetFigures (older executors): the cards and the table come from
GetQueueStats (which counts) and there are no charts.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from connector.console.client import ApiError
from connector.console.params import Params
from connector.console.ui import call, render
from connector.v1 import admin_service_pb2 as pb

WINDOWS = ("hour", "day")


def _secs(d: Any) -> float | None:
    return d.seconds + d.nanos / 1e9 if d is not None and (d.seconds or d.nanos) else None


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def quantile(point: Any, name: str, which: str) -> float | None:
    if not point.HasField(name):
        return None
    return _secs(getattr(getattr(point, name), which))


def series_json(series: Any) -> str:
    """uPlot's columns: time, then one array per line (null where nothing was observed)."""
    pts = list(series.points)
    gauges = [p.gauges if p.HasField("gauges") else None for p in pts]
    cols = {
        "t": [p.start_time.seconds for p in pts],
        "accepted": [rate(p.accepted, p.seconds) for p in pts],
        "refused": [rate(p.rejected + p.unavailable, p.seconds) for p in pts],
        "executed": [rate(p.executed, p.seconds) for p in pts],
        "failed": [rate(p.failed, p.seconds) for p in pts],
        "ack_p99": [quantile(p, "ack_latency", "p99") for p in pts],
        "delivery_p95": [quantile(p, "delivery_latency", "p95") for p in pts],
        "delay_p95": [quantile(p, "scheduling_delay", "p95") for p in pts],
        "backlog": [g.backlog if g is not None else None for g in gauges],
        "oldest_ready": [_secs(g.oldest_ready_age) if g is not None else None for g in gauges],
    }
    return json.dumps(cols, separators=(",", ":"))


def _scope(request: web.Request) -> tuple[str, int]:
    params = Params(request.query)
    return params.choice("window", WINDOWS) or "hour", params.integer("pack", minimum=0) or 0


async def _figures(request: web.Request, window: str, pack: int) -> tuple[Any, str]:
    """(the chosen series of GetFigures, or None; why there are no figures)."""
    request_type = getattr(pb, "GetFiguresRequest", None)
    if request_type is None:
        return None, "this console's admin API has no figures (GetFigures)"
    try:
        figures = await call(
            request,
            "GetFigures",
            request_type(
                window=getattr(pb, "FIGURES_WINDOW_DAY" if window == "day" else "FIGURES_WINDOW_HOUR"),
                installed_pack_ids=[pack],  # [0]: the cluster alone (not every pack's series)
                packs_only=bool(pack),  # a pack alone (not the cluster's series too)
            ),
        )
    except ApiError as exc:
        if exc.code != "UNIMPLEMENTED":
            raise
        return None, "the admin API does not serve figures yet (GetFigures)"
    series = next((s for s in figures.series if s.installed_pack_id == pack), None)
    return series, "" if series is not None else "no figures for this pack yet"


async def _live(request: web.Request) -> dict[str, Any]:
    window, pack = _scope(request)
    series, missing = await _figures(request, window, pack)
    stats = None
    if series is None:  # no figures: the cards from the queue counts
        stats = await call(request, "GetQueueStats", pb.GetQueueStatsRequest(installed_pack_id=pack))
    return {
        "window": window,
        "pack": pack,
        "series": series,
        "cur": series.current if series is not None else None,
        "chart": series_json(series) if series is not None else "",
        "figures_missing": missing,
        "stats": stats,
        "rate": rate,
        "quantile": quantile,
        "secs": _secs,
    }


async def overview(request: web.Request) -> web.Response:
    packs = await call(request, "ListPacks", pb.ListPacksRequest(page_size=500))
    return render(request, "overview.html", packs=packs.packs, **await _live(request))


async def live(request: web.Request) -> web.Response:
    """The live region alone (what the page polls)."""
    return render(request, "overview_live.html", **await _live(request))


async def queues(request: web.Request) -> web.Response:
    """The per-pack table, loaded once with the overview: the current figures of every pack (one
    GetFigures call with ``current_only``: counts of the last minute or so and the sampled gauges;
    nothing is counted). Against an admin API without GetFigures: GetQueueStats (which counts)."""
    _, pack = _scope(request)
    request_type = getattr(pb, "GetFiguresRequest", None)
    figures = None
    if request_type is not None:
        try:
            figures = await call(
                request, "GetFigures",
                request_type(current_only=True, installed_pack_ids=[pack] if pack else []),
            )  # fmt: skip
        except ApiError as exc:
            if exc.code != "UNIMPLEMENTED":
                raise
    if figures is not None:
        return render(
            request, "overview_queues.html", figures=figures, stats=None, pack=pack, rate=rate
        )  # fmt: skip
    stats = await call(request, "GetQueueStats", pb.GetQueueStatsRequest(installed_pack_id=pack))
    return render(request, "overview_queues.html", figures=None, stats=stats, pack=pack, rate=rate)
