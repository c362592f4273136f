"""A fake sender API on loopback (a real aiohttp server) in two shapes taken from the senders' public
API documentation, for the reconciliation tests:

* **Stripe-like** ``GET /v1/events``: ``created[gte]``, ``created[lt]``, ``limit``, ``starting_after``
  (the id of the last item of the previous page), newest first, ``{"object": "list", "data": [...],
  "has_more": bool}``; bearer token.
* **GitHub-like** ``GET /repos/o/r/hooks/1/deliveries``: ``per_page``, ``cursor``; an array of
  ``{"id": int, "guid": str, "delivered_at": RFC 3339, "event": str, "status_code": int}`` newest
  first, the next page in the ``Link`` header (``rel="next"``); ``GET .../deliveries/{id}`` gives
  ``{"request": {"headers": {...}, "payload": {...}}}``; ``POST .../deliveries/{id}/attempts`` asks
  for a redelivery (202).

Faults are switched on per test (``faults``): a status for the next N list requests, ``Retry-After``,
a stall (timeout), malformed JSON, an item without its id, a repeating cursor, an oversized page.
Every request is recorded (``requests``) so tests assert on what was asked, and ``gate`` lets a test
hold a page until it releases it (kill -9 mid-pass).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "sk_test_fake_provider_token"


@dataclass
class Faults:
    #: (status, retry_after or None) answered to the next list requests, consumed one per request.
    statuses: list[tuple[int, str | None]] = field(default_factory=list)
    stall_s: float = 0.0
    malformed: bool = False
    item_without_id: bool = False
    repeat_cursor: bool = False
    oversized: int = 0
    #: The Link header's next page points at another host (a sender that would take our credentials).
    foreign_link: bool = False


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    authorized: bool


class FakeProvider:
    def __init__(self, *, page_size: int = 3) -> None:
        self.page_size = page_size
        #: Stripe-like events, newest first by ``created`` then id.
        self.events: list[dict[str, Any]] = []
        #: GitHub-like deliveries (one per attempt), newest first.
        self.deliveries: list[dict[str, Any]] = []
        self.redelivered: list[str] = []
        self.requests: list[Recorded] = []
        self.faults = Faults()
        #: list request number (1-based, per path) → held until the test sets the event.
        self.gate: dict[int, asyncio.Event] = {}
        self.gate_reached: dict[int, asyncio.Event] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None

    # -- data ------------------------------------------------------------------------------------

    def add_event(self, event_id: str, created: int, kind: str = "invoice.paid") -> dict[str, Any]:
        event = {
            "id": event_id,
            "object": "event",
            "created": created,
            "type": kind,
            "data": {"object": {"id": f"in_{event_id}", "object": "invoice"}},
        }
        self.events.append(event)
        self.events.sort(key=lambda e: (e["created"], e["id"]), reverse=True)
        return event

    def add_delivery(self, ident: int, guid: str, at: float, event: str = "push") -> dict[str, Any]:
        delivery = {
            "id": ident,
            "guid": guid,
            "event": event,
            "status_code": 503,
            "redelivery": False,
            "delivered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
            "payload": {"ref": "refs/heads/main", "after": guid},
        }
        self.deliveries.append(delivery)
        self.deliveries.sort(key=lambda d: (d["delivered_at"], d["id"]), reverse=True)
        return delivery

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- server ----------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/events", self._events)
        app.router.add_get("/repos/o/r/hooks/1/deliveries", self._deliveries)
        app.router.add_get("/repos/o/r/hooks/1/deliveries/{id}", self._delivery)
        app.router.add_post("/repos/o/r/hooks/1/deliveries/{id}/attempts", self._redeliver)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _record(self, request: web.Request) -> bool:
        authorized = request.headers.get("Authorization") == f"Bearer {TOKEN}"
        self.requests.append(Recorded(request.method, request.path, dict(request.query), authorized))
        return authorized

    async def _fault(self, page: int) -> web.Response | None:
        reached = self.gate_reached.get(page)
        if reached is not None:
            reached.set()
        gate = self.gate.get(page)
        if gate is not None:
            await gate.wait()
        f = self.faults
        if f.statuses:
            status, retry_after = f.statuses.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.json_response({"error": {"message": "fault"}}, status=status, headers=headers)
        if f.stall_s:
            await asyncio.sleep(f.stall_s)
        if f.malformed:
            return web.Response(body=b'{"object": "list", "data": [', content_type="application/json")
        if f.oversized:
            return web.Response(
                body=b'{"pad":"' + b"x" * f.oversized + b'"}', content_type="application/json"
            )
        return None

    def _list_requests(self, request: web.Request) -> int:
        """How many list requests this path has had, this one included (the gates' numbering)."""
        return sum(1 for r in self.requests if r.path == request.path)

    async def _events(self, request: web.Request) -> web.Response:
        if not self._record(request):
            return web.json_response({"error": {"type": "invalid_request_error"}}, status=401)
        q = request.query
        fault = await self._fault(self._list_requests(request))
        if fault is not None:
            return fault
        gte = int(q.get("created[gte]", "0"))
        lt = int(q.get("created[lt]", str(2**62)))
        limit = min(int(q.get("limit", "10")), 100)
        rows = [e for e in self.events if gte <= e["created"] < lt]
        after = q.get("starting_after")
        if after is not None:
            ids = [e["id"] for e in rows]
            rows = rows[ids.index(after) + 1 :] if after in ids else []
        page = rows[:limit]
        has_more = len(rows) > limit
        if self.faults.item_without_id and page:
            page = [dict(page[0], id=None), *page[1:]]
        if self.faults.repeat_cursor and after is not None:
            page, has_more = [e for e in self.events if e["id"] == after] or page, True
        return web.json_response({"object": "list", "url": "/v1/events", "data": page, "has_more": has_more})

    async def _deliveries(self, request: web.Request) -> web.Response:
        if not self._record(request):
            return web.json_response({"message": "Bad credentials"}, status=401)
        q = request.query
        per_page = min(int(q.get("per_page", "30")), 100)
        start = int(q.get("cursor", "0"))
        fault = await self._fault(self._list_requests(request))
        if fault is not None:
            return fault
        rows = [{k: v for k, v in d.items() if k != "payload"} for d in self.deliveries]
        page = rows[start : start + per_page]
        headers = {}
        if start + per_page < len(rows):
            nxt = start + per_page
            base = f"http://127.0.0.2:{self.port}" if self.faults.foreign_link else self.url
            headers["Link"] = (
                f'<{base}{request.path}?per_page={per_page}&cursor={nxt}>; rel="next", '
                f'<{self.url}{request.path}?per_page={per_page}&cursor=0>; rel="first"'
            )
        return web.json_response(page, headers=headers)

    async def _delivery(self, request: web.Request) -> web.Response:
        if not self._record(request):
            return web.json_response({"message": "Bad credentials"}, status=401)
        ident = int(request.match_info["id"])
        for d in self.deliveries:
            if d["id"] == ident:
                headers = {"X-GitHub-Event": d["event"], "X-GitHub-Delivery": d["guid"]}
                return web.json_response(
                    {"id": ident, "guid": d["guid"], "request": {"headers": headers, "payload": d["payload"]}}
                )
        return web.json_response({"message": "Not Found"}, status=404)

    async def _redeliver(self, request: web.Request) -> web.Response:
        if not self._record(request):
            return web.json_response({"message": "Bad credentials"}, status=401)
        self.redelivered.append(request.match_info["id"])
        return web.json_response({}, status=202)


def stripe_body(event: dict[str, Any]) -> bytes:
    return json.dumps(event, indent=2).encode()
