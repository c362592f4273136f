"""Processes: every registered service incarnation (ListProcesses): service, host, pid, version, build
revision, claim capability, start, heartbeat age (the database's clock) and staleness."""

from __future__ import annotations

from aiohttp import web

from connector.console.ui import call, render
from connector.v1 import admin_service_pb2 as pb

#: Pages read at most (500 processes each).
MAX_PAGES = 4


async def processes(request: web.Request) -> web.Response:
    rows = []
    token = ""
    stale_after = None
    for _ in range(MAX_PAGES):
        page = await call(request, "ListProcesses", pb.ListProcessesRequest(page_size=500, page_token=token))
        rows += list(page.processes)
        stale_after = page.stale_after
        token = page.next_page_token
        if not token:
            break
    rows.sort(key=lambda p: (p.service, p.hostname, p.pid))
    return render(request, "processes.html", rows=rows, stale_after=stale_after, more=bool(token))
