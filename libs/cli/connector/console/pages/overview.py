"""Overview: the cluster at a glance, live. Figures over the last hour or day come from GetFigures
(per-minute rollups every process flushes; no Prometheus needed); the queue table, pauses, circuits
and processes from GetQueueStats. One GetFigures and one GetQueueStats per refresh, whatever the
number of packs or charts; the page polls every 5 s while the tab is visible (console.js)."""

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


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _q(point: Any, name: str, which: str) -> float | None:
    if not point.HasField(name):
        return None
    return _secs(getattr(getattr(point, name), which))


def series_json(series: Any) -> str:
    """uPlot's columns: time, then one array per line (null where nothing was observed)."""
    pts = list(series.points)
    t = [p.start_time.seconds for p in pts]
    cols = {
        "t": t,
        "accepted": [_rate(p.accepted, p.seconds) for p in pts],
        "refused": [_rate(p.rejected + p.unavailable, p.seconds) for p in pts],
        "executed": [_rate(p.executed, p.seconds) for p in pts],
        "failed": [_rate(p.failed, p.seconds) for p in pts],
        "ack_p99": [_q(p, "ack_latency", "p99") for p in pts],
        "delivery_p95": [_q(p, "delivery_latency", "p95") for p in pts],
        "delay_p95": [_q(p, "scheduling_delay", "p95") for p in pts],
        "backlog": [p.gauges.backlog if p.HasField("gauges") else None for p in pts],
    }
    return json.dumps(cols, separators=(",", ":"))


async def overview(request: web.Request) -> web.Response:
    params = Params(request.query)
    window = params.choice("window", WINDOWS) or "hour"
    pack = params.integer("pack", minimum=0) or 0
    stats = await call(request, "GetQueueStats", pb.GetQueueStatsRequest(installed_pack_id=pack))
    figures, figures_error = None, ""
    if hasattr(pb, "GetFiguresRequest"):
        try:
            req = pb.GetFiguresRequest(
                window=getattr(pb, "FIGURES_WINDOW_DAY" if window == "day" else "FIGURES_WINDOW_HOUR"),
                installed_pack_ids=[pack] if pack else [],
            )
            figures = await call(request, "GetFigures", req)
        except ApiError as exc:
            if exc.code not in ("UNIMPLEMENTED",):
                raise
            figures_error = "this admin API does not serve figures yet (GetFigures)"
    else:
        figures_error = "this console's admin API has no figures (GetFigures)"
    chosen = None
    if figures is not None:
        chosen = next((s for s in figures.series if s.installed_pack_id == pack), None)
    return render(
        request,
        "overview.html",
        stats=stats,
        figures=figures,
        series=chosen,
        chart=series_json(chosen) if chosen is not None else "",
        figures_error=figures_error,
        window=window,
        pack=pack,
        rate=_rate,
        quantile=_q,
    )
