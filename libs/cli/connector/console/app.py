"""The console application: routes and middlewares (``build_app``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from connector.console import auth
from connector.console import web as edge
from connector.console.client import AdminClient
from connector.console.jobs import JOBS_KEY, JobStore
from connector.console.pages import (
    actions,
    cutover,
    deliveries,
    failures,
    lanes,
    overview,
    processes,
    receipts,
)
from connector.console.sessions import SessionStore
from connector.console.ui import CLIENT_KEY, HERE, JINJA_KEY, OPTIONS_KEY, environment, render_error


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(
    client: AdminClient,
    sessions: SessionStore,
    *,
    secure_cookies: bool = False,
    options: dict[str, Any] | None = None,
) -> web.Application:
    app = web.Application(
        middlewares=[edge.headers_middleware, edge.error_middleware(render_error), edge.session_middleware],
        client_max_size=256 * 1024,
    )
    app[CLIENT_KEY] = client
    app[edge.SESSION_KEY] = sessions
    app[edge.SECURE_KEY] = secure_cookies
    app[JINJA_KEY] = environment()
    app[OPTIONS_KEY] = dict(options or {})
    app[JOBS_KEY] = JobStore()

    async def close_jobs(app: web.Application) -> None:
        await app[JOBS_KEY].close()

    app.on_cleanup.append(close_jobs)
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/login", auth.login_page)
    r.add_post("/login", auth.login_submit)
    r.add_get("/login/link/{nonce}", auth.login_link)
    r.add_post("/logout", auth.logout)
    r.add_get("/", overview.overview)
    r.add_get("/overview/live", overview.live)
    r.add_get("/overview/queues", overview.queues)
    r.add_get("/deliveries", deliveries.deliveries)
    r.add_get("/deliveries/{receipt_id}", deliveries.delivery)
    r.add_get("/work/{work_id}", actions.work_item)
    r.add_post("/work/{work_id}/replay", actions.replay)
    r.add_post("/work/{work_id}/cancel", actions.cancel)
    r.add_get("/failures", failures.failures)
    r.add_get("/failures/group", failures.group)
    r.add_post("/failures/estimate", failures.estimate)
    r.add_get("/failures/receipts", receipts.receipts_group)
    r.add_post("/failures/receipts/replay", receipts.replay_group)
    r.add_get("/jobs", failures.jobs_page)
    r.add_post("/jobs", failures.start_job)
    r.add_get("/jobs/{job_id}", failures.job_page)
    r.add_post("/jobs/{job_id}/cancel", failures.job_cancel)
    r.add_get("/lanes", lanes.lanes)
    r.add_post("/packs/pause", lanes.pause)
    r.add_post("/packs/resume", lanes.resume)
    r.add_post("/circuits/{change}", lanes.circuit)
    r.add_get("/cutover", cutover.cutover)
    r.add_post("/cutover/{pack}/{generation}/{action}", cutover.gate)
    r.add_get("/processes", processes.processes)
    r.add_static("/static/", HERE / "static", append_version=False)
    return app
