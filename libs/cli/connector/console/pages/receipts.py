"""Failed receipts of one failure group (namespace, route, error class, error summary) and their
bulk replay: the group's receipts are listed (FindDeliveries by routing state ``failed``, the group's
error matched on each receipt), the confirmation names the count, and a job replays each one
(ReplayReceipt: the materializer routes it again against the active generation), request id
``<job id>:<receipt id>``."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from connector.console import web as edge
from connector.console.client import AdminClient, ApiError
from connector.console.jobs import JOBS_KEY, RECEIPT_JOB_LIMIT, Job
from connector.console.params import BadInput, Params
from connector.console.ui import CLIENT_KEY, call, render
from connector.v1 import admin_service_pb2 as pb

#: Receipts a replay job handles at most (its worklist is read up front).
RECEIPT_LIMIT = RECEIPT_JOB_LIMIT


class ReceiptGroup:
    def __init__(self, params: Params) -> None:
        self.namespace = params.text("namespace", max_len=200)
        if not self.namespace:
            raise BadInput("namespace", "required: the namespace of the failed receipts")
        self.route = params.text("route", max_len=200)
        self.error_class = params.text("error_class", max_len=200)
        self.summary = params.raw("summary")[:1024]
        Params({"summary": self.summary}).text("summary")

    def fields(self) -> dict[str, str]:
        return {"namespace": self.namespace, "route": self.route, "error_class": self.error_class,
                "summary": self.summary}  # fmt: skip

    def describe(self) -> str:
        parts = [f"{self.namespace}/{self.route}" if self.route else self.namespace]
        parts += [p for p in (self.error_class,) if p]
        if self.summary:
            parts.append(f"“{self.summary[:80]}”")
        return " / ".join(parts)

    def matches(self, receipt: Any) -> bool:
        return (not self.error_class or receipt.error_class == self.error_class) and (
            not self.summary or receipt.error_summary == self.summary
        )


async def group_receipts(request: web.Request, g: ReceiptGroup, limit: int) -> tuple[list[Any], bool]:
    """The group's failed receipts, newest first, at most ``limit`` (and whether more exist)."""
    found: list[Any] = []
    token = ""
    while True:
        page = await call(
            request,
            "FindDeliveries",
            pb.FindDeliveriesRequest(namespace=g.namespace, route_key=g.route, receipt_status="failed",
                                     page_size=500, page_token=token),
        )  # fmt: skip
        found += [d.receipt for d in page.deliveries if g.matches(d.receipt)]
        token = page.next_page_token
        if len(found) > limit:
            return found[:limit], True
        if not token:
            return found, False


def group_query(g: Any) -> str:
    return urlencode({"namespace": g.namespace, "route": g.route_key, "error_class": g.error_class,
                      "summary": g.error_summary})  # fmt: skip


async def receipts_group(request: web.Request) -> web.Response:
    g = ReceiptGroup(Params(request.query))
    found, more = await group_receipts(request, g, RECEIPT_LIMIT)
    return render(
        request, "receipt_group.html", group=g, receipts=found[:200], count=len(found), more=more,
        fields=g.fields(), job_id=uuid.uuid4().hex,
    )  # fmt: skip


def replay_receipts_work(client: AdminClient, token: str, ids: list[int]) -> Any:
    async def work(job: Job) -> None:
        job.total = len(ids)
        for receipt_id in ids:
            try:
                request = pb.ReplayReceiptRequest(receipt_id=receipt_id, request_id=f"{job.id}:{receipt_id}")
                await client.call("ReplayReceipt", request, token)
                job.done += 1
            except ApiError as exc:
                if exc.code in ("UNAVAILABLE", "UNAUTHENTICATED", "PERMISSION_DENIED"):
                    raise
                job.refused_by_reason[exc.reason] += 1

    return work


async def replay_group(request: web.Request) -> web.Response:
    session = edge.require(request, "ReplayReceipt")
    form = Params(await request.post())
    g = ReceiptGroup(form)
    job_id = form.text("job_id", max_len=64)
    if not job_id or not job_id.isalnum():
        raise BadInput("job_id", "missing: start from the group's page")
    confirmed = form.integer("count", minimum=0) or 0
    jobs = request.app[JOBS_KEY]
    if jobs.get(job_id) is None:  # the same confirmation again shows the job already running
        found, more = await group_receipts(request, g, RECEIPT_LIMIT)
        if more:
            raise BadInput("namespace", f"a job replays at most {RECEIPT_LIMIT} receipts: narrow the group")
        ids = sorted(int(r.receipt_id) for r in found)  # oldest first: routed again in arrival order
        noun = "failed receipt" if confirmed == 1 else "failed receipts"
        job = Job(job_id, "replay-receipts", f"key:{session.caller.key_id}",
                  f"replay {confirmed} {noun} ({g.describe()})", confirmed)  # fmt: skip
        jobs.start(job, replay_receipts_work(request.app[CLIENT_KEY], session.token, ids))
    raise web.HTTPSeeOther(f"/jobs/{job_id}")
