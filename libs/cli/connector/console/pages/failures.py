"""Failures: dead letters and failed receipts grouped into incidents (ListFailureGroups); a group's
dead letters (ListDeadLetters); bulk replay / cancel of a selection or of everything matching the
group: an estimate first (a dry run: how many, refused by reason, which lanes), then a confirmation
naming the count, then a job (console.jobs) with its own page."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from connector.console import web as edge
from connector.console.client import stream_items
from connector.console.jobs import JOB_RPCS, JOBS_KEY, Job, cancel_work, replay_work
from connector.console.pages import receipts
from connector.console.params import BadInput, Params
from connector.console.ui import CLIENT_KEY, call, render
from connector.v1 import admin_service_pb2 as pb

ACTIONS = {"replay": "ReplayDeadLetters", "cancel": "CancelDeadLetters"}
GROUP_FIELDS = ("pack", "work_type", "failure_class", "summary")
#: Rows grouped per pack (dead letters) and namespace (failed receipts): the newest 2,000 by default
#: (an incident list: what is failing now), the newest 10,000 on request ("group older ones too").
SCAN_DEFAULT, SCAN_DEEP = 2_000, 10_000


async def failures(request: web.Request) -> web.Response:
    params = Params(request.query)
    pack = params.integer("pack", minimum=0) or 0
    scan = params.integer("scan", minimum=1, maximum=SCAN_DEEP) or SCAN_DEFAULT
    groups = await call(
        request, "ListFailureGroups", pb.ListFailureGroupsRequest(installed_pack_id=pack, scan_limit=scan)
    )
    return render(
        request, "failures.html", groups=groups, pack=pack, group_query=group_query,
        receipt_query=receipts.group_query, scan=scan, scan_deep=SCAN_DEEP,
    )  # fmt: skip


def group_query(g: Any) -> str:
    return urlencode(
        {"pack": g.installed_pack_id, "name": g.pack_name, "work_type": g.work_type,
         "failure_class": g.failure_class, "summary": g.failure_summary}
    )  # fmt: skip


class Group:
    """A failure group as a filter: pack, work type, failure class, summary (each may be empty)."""

    def __init__(self, params: Params) -> None:
        self.pack = params.integer("pack", minimum=1)
        if self.pack is None:
            raise BadInput("pack", "required: the pack of the dead letters")
        #: The pack's name, for display only (the filter is the id).
        self.name = params.text("name", max_len=200)
        self.work_type = params.text("work_type", max_len=200)
        self.failure_class = params.text("failure_class", max_len=200)
        self.summary = params.raw("summary")[:1024]
        Params({"summary": self.summary}).text("summary")  # same checks (NUL, surrogates)

    def fields(self) -> dict[str, Any]:
        return {"pack": self.pack, "name": self.name, "work_type": self.work_type,
                "failure_class": self.failure_class, "summary": self.summary}  # fmt: skip

    def list_request(self, page_token: str = "") -> pb.ListDeadLettersRequest:
        return pb.ListDeadLettersRequest(
            installed_pack_id=self.pack or 0, work_type=self.work_type, failure_class=self.failure_class,
            failure_summary=self.summary, page_size=100, page_token=page_token,
        )  # fmt: skip

    def replay_request(self, ids: list[int], **kw: Any) -> pb.ReplayDeadLettersRequest:
        return pb.ReplayDeadLettersRequest(
            installed_pack_id=self.pack or 0, work_type=self.work_type, failure_class=self.failure_class,
            failure_summary=self.summary, work_ids=ids, **kw,
        )  # fmt: skip

    def cancel_request(self, ids: list[int], **kw: Any) -> pb.CancelDeadLettersRequest:
        return pb.CancelDeadLettersRequest(
            installed_pack_id=self.pack or 0, work_type=self.work_type, failure_class=self.failure_class,
            failure_summary=self.summary, work_ids=ids, **kw,
        )  # fmt: skip

    def describe(self) -> str:
        parts = [self.name or f"pack {self.pack}"]
        parts += [p for p in (self.work_type, self.failure_class) if p]
        if self.summary:
            parts.append(f"“{self.summary[:80]}”")
        return " / ".join(parts)


async def group(request: web.Request) -> web.Response:
    params = Params(request.query)
    g = Group(params)
    page = await call(request, "ListDeadLetters", g.list_request(params.text("page", max_len=8192)))
    return render(
        request,
        "failure_group.html",
        group=g,
        page=page,
        fields=g.fields(),
        next_query=urlencode({**g.fields(), "page": page.next_page_token}) if page.next_page_token else "",
    )


def _action(params: Params) -> str:
    action = params.choice("action", tuple(ACTIONS))
    if not action:
        raise BadInput("action", "replay or cancel")
    return action


def _selection(params: Params) -> tuple[str, list[int]]:
    scope = params.choice("scope", ("selected", "all")) or "selected"
    ids = params.ids("ids") if scope == "selected" else []
    if scope == "selected" and not ids:
        raise BadInput("ids", "select at least one dead letter, or choose all matching this group")
    return scope, ids


async def estimate(request: web.Request) -> web.Response:
    """A dry run of the bulk action: nothing changes; the confirmation form names the count."""
    form = Params(await request.post())
    action = _action(form)
    edge.require(request, ACTIONS[action])  # the estimate is the bulk RPC's own dry run
    g = Group(form)
    scope, ids = _selection(form)
    message = (
        g.replay_request(ids, dry_run=True) if action == "replay" else g.cancel_request(ids, dry_run=True)
    )
    dry = None
    async for progress in stream_items(
        request.app[CLIENT_KEY].stream(ACTIONS[action], message, _token(request))
    ):
        dry = progress
    assert dry is not None
    count = int(dry.total)
    return render(
        request,
        "estimate.html",
        action=action,
        group=g,
        fields=g.fields(),
        scope=scope,
        ids=ids,
        dry=dry,
        count=count,
        job_id=uuid.uuid4().hex,
    )


def _token(request: web.Request) -> str:
    session = edge.session_of(request)
    assert session is not None
    return session.token


async def start_job(request: web.Request) -> web.Response:
    form = Params(await request.post())
    action = _action(form)
    session = edge.require(request, ACTIONS[action])
    g = Group(form)
    scope, ids = _selection(form)
    job_id = form.text("job_id", max_len=64)
    if not job_id or not job_id.isalnum():
        raise BadInput("job_id", "missing: start from the estimate page")
    confirmed = form.integer("count", minimum=0) or 0
    client = request.app[CLIENT_KEY]
    noun = "dead letter" if confirmed == 1 else "dead letters"
    if action == "replay":
        work = replay_work(client, session.token, g.replay_request(ids, request_id=job_id))
    else:
        work = cancel_work(
            client, session.token, g.cancel_request(ids, reason=form.reason(), request_id=job_id)
        )
    which = "selected" if scope == "selected" else "all matching"
    what = f"{action} {confirmed} {noun} ({which} {g.describe()})"
    job = request.app[JOBS_KEY].start(
        Job(job_id, action, f"key:{session.caller.key_id}", what, confirmed), work
    )
    raise web.HTTPSeeOther(f"/jobs/{job.id}")


def _job(request: web.Request) -> Job:
    job = request.app[JOBS_KEY].get(Params(request.match_info).text("job_id", max_len=64))
    if job is None:
        raise web.HTTPNotFound(
            text="no such job (jobs are kept in the console's memory; it may have restarted)"
        )
    return job


async def job_page(request: web.Request) -> web.Response:
    job = _job(request)
    return render(request, "job.html", job=job, rpc=JOB_RPCS[job.kind])


async def job_cancel(request: web.Request) -> web.Response:
    job = _job(request)
    edge.require(request, JOB_RPCS[job.kind])
    request.app[JOBS_KEY].cancel(job.id)
    raise web.HTTPSeeOther(f"/jobs/{job.id}")


async def jobs_page(request: web.Request) -> web.Response:
    return render(request, "jobs.html", jobs=request.app[JOBS_KEY].recent())
