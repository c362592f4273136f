"""Bulk actions as jobs: started from a confirmed estimate, run in the background, watched and
cancelled from their page.

A replay job is one ``ReplayDeadLetters`` stream (the API replays in batches, in lane order, at a
bounded rate, each batch its own transaction, and logs one audit line); cancelling the job cancels
the stream, and the API stops between batches: what was replayed stays replayed, the rest stays dead.
A cancel job is one ``CancelDeadLetters`` stream likewise (each item cancelled as CancelWorkItem
does, one audit line each; what was cancelled stays cancelled). The job id is minted when the
estimate is shown and is the API's request id (``<job id>:<receipt id>`` per replayed receipt):
submitting the same confirmation twice shows the
one job, and a retry after a console restart gets the API's stored answers instead of a second run.
Jobs live in the console's memory (the last ``keep`` of them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from connector.console.client import AdminClient, ApiError, stream_items
from connector.v1 import admin_service_pb2 as pb

log = logging.getLogger("connector.console")

#: Receipts a failed-receipt replay job handles at most (its worklist is read up front).
RECEIPT_JOB_LIMIT = 10_000
#: The admin RPC each kind of job runs (its role is the job's: to start it, to stop it).
JOB_RPCS = {"replay": "ReplayDeadLetters", "cancel": "CancelDeadLetters", "replay-receipts": "ReplayReceipt"}


@dataclass(slots=True)
class Job:
    id: str
    kind: str  # replay | cancel
    actor: str  # key:<key id>
    what: str  # one line: what the job does, with the count confirmed
    confirmed: int
    total: int = 0
    done: int = 0
    refused_by_reason: Counter[str] = field(default_factory=Counter)
    state: str = "running"  # running | finished | cancelled | failed
    error: str = ""
    started: float = field(default_factory=time.time)
    finished: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def refused(self) -> int:
        return sum(self.refused_by_reason.values())

    @property
    def percent(self) -> int:
        if self.state == "finished":
            return 100
        return int(100 * (self.done + self.refused) / self.total) if self.total else 0

    @property
    def running(self) -> bool:
        return self.state == "running"


class JobStore:
    """The console's jobs (in memory, the last ``keep``)."""

    def __init__(self, *, keep: int = 100) -> None:
        self.keep = keep
        self._jobs: dict[str, Job] = {}

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def recent(self) -> list[Job]:
        return sorted(self._jobs.values(), key=lambda j: j.started, reverse=True)

    def start(self, job: Job, work: Callable[[Job], Awaitable[None]]) -> Job:
        """Run ``work(job)`` in the background; the same id again answers the job already there."""
        existing = self._jobs.get(job.id)
        if existing is not None:
            return existing
        for old in self.recent()[self.keep - 1 :]:
            if not old.running:
                del self._jobs[old.id]
        self._jobs[job.id] = job
        log.info(
            "console job started",
            extra={"event": "console_job", "job": job.id, "kind": job.kind, "actor": job.actor,
                   "note": job.what, "confirmed": job.confirmed},
        )  # fmt: skip
        job.task = asyncio.create_task(self._run(job, work), name=f"console-job-{job.id}")
        return job

    async def _run(self, job: Job, work: Callable[[Job], Awaitable[None]]) -> None:
        try:
            await work(job)
            job.state = "finished"
        except asyncio.CancelledError:
            job.state = "cancelled"
        except ApiError as exc:
            job.state, job.error = "failed", str(exc)
        except Exception:  # never lost silently: the page says failed, the log has the traceback
            log.exception("console job failed", extra={"job": job.id})
            job.state, job.error = "failed", "internal error (logged on the console server)"
        finally:
            job.finished = time.time()
            log.info(
                f"console job {job.state}",
                extra={"event": "console_job", "job": job.id, "kind": job.kind, "actor": job.actor,
                       "total": job.total, "done": job.done, "refused": job.refused},
            )  # fmt: skip

    def cancel(self, job_id: str) -> Job | None:
        job = self._jobs.get(job_id)
        if job is not None and job.running and job.task is not None:
            job.task.cancel()
        return job

    async def close(self) -> None:
        for job in self._jobs.values():
            if job.task is not None and not job.task.done():
                job.task.cancel()
        await asyncio.gather(*(j.task for j in self._jobs.values() if j.task), return_exceptions=True)


def replay_work(client: AdminClient, token: str, request: pb.ReplayDeadLettersRequest) -> Any:
    async def work(job: Job) -> None:
        async for progress in stream_items(client.stream("ReplayDeadLetters", request, token)):
            job.total = int(progress.total)
            job.done = int(progress.replayed)
            job.refused_by_reason = Counter({k: int(v) for k, v in progress.refused_by_reason.items()})

    return work


def cancel_work(client: AdminClient, token: str, request: pb.CancelDeadLettersRequest) -> Any:
    async def work(job: Job) -> None:
        async for progress in stream_items(client.stream("CancelDeadLetters", request, token)):
            job.total = int(progress.total)
            job.done = int(progress.cancelled)
            job.refused_by_reason = Counter({k: int(v) for k, v in progress.refused_by_reason.items()})

    return work


JOBS_KEY = web.AppKey("jobs", JobStore)
