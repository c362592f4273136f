"""Rendering and the per-request admin call: templates, filters, the session's token."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from connector.console import web as edge
from connector.console.client import AdminClient, ApiError
from connector.v1 import types_pb2

HERE = Path(__file__).parent
CLIENT_KEY = web.AppKey("client", AdminClient)
JINJA_KEY = web.AppKey("jinja", jinja2.Environment)
OPTIONS_KEY = web.AppKey("options", dict)

#: Shown for an unset time, duration or value.
NONE = "\u2013"

NAV = (
    ("/", "Overview"),
    ("/deliveries", "Deliveries"),
    ("/failures", "Failures"),
    ("/lanes", "Lanes and keys"),
    ("/cutover", "Cutover"),
    ("/processes", "Processes"),
)


async def call(request: web.Request, method: str, message: Message, **kw: Any) -> Any:
    """An admin RPC with the session's token (the edge guarantees a session on every page)."""
    session = edge.session_of(request)
    if session is None:  # pragma: no cover - the session middleware redirects first
        raise web.HTTPForbidden(text="not logged in")
    return await request.app[CLIENT_KEY].call(method, message, session.token, **kw)


async def act(
    request: web.Request, method: str, message: Message, done: str, refused: str, **kw: Any
) -> bool:
    """An action: the admin RPC ``method`` for the session (403 without its role), its outcome flashed
    for the next page (Post/Redirect/Get). A refusal (FAILED_PRECONDITION, ABORTED, ...) is the
    flashed line; the API or its database unreachable is raised (a 503 page)."""
    session = edge.require(request, method)
    try:
        await call(request, method, message, **kw)
    except ApiError as exc:
        if exc.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED") or exc.reason == "DATABASE_BUSY":
            raise
        session.flash.append(("bad", f"{refused}: {exc}"))
        return False
    session.flash.append(("ok", done))
    return True


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    env = request.app[JINJA_KEY]
    session = edge.session_of(request)
    flashes: list[tuple[str, str]] = []
    if session is not None and not request.headers.get("HX-Request"):
        flashes, session.flash[:] = list(session.flash), []
    text = env.get_template(template).render(
        flashes=flashes,
        request=request,
        session=session,
        caller=session.caller if session else None,
        csrf=session.csrf if session else "",
        nav=NAV,
        path=request.path,
        partial=bool(request.headers.get("HX-Request")),
        **context,
    )
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def render_error(request: web.Request, status: int, message: str) -> web.Response:
    if request.headers.get("HX-Request"):
        return web.Response(text=message, status=status, content_type="text/plain")
    return render(request, "error.html", status=status, status_code=status, message=message)


# Filters ----------------------------------------------------------------------------------------


def _is_set(ts: Any) -> bool:
    return isinstance(ts, Timestamp) and (ts.seconds != 0 or ts.nanos != 0)


def ts(value: Any) -> str:
    if not _is_set(value):
        return NONE
    return value.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def iso(value: Any) -> str:
    return value.ToDatetime(tzinfo=UTC).isoformat() if _is_set(value) else ""


def seconds(delta: float) -> str:
    sign = "-" if delta < 0 else ""
    delta = abs(delta)
    if delta < 1:
        return f"{sign}{delta * 1000:.0f} ms"
    if delta < 60:
        return f"{sign}{delta:.1f} s"
    minutes, secs = divmod(int(delta), 60)
    if minutes < 60:
        return f"{sign}{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours}h {minutes:02d}m"
    return f"{sign}{hours // 24}d {hours % 24}h"


def dur(value: Any) -> str:
    if not isinstance(value, Duration) or (value.seconds == 0 and value.nanos == 0):
        return NONE
    return seconds(value.seconds + value.nanos / 1e9)


def ago(value: Any, now: datetime | None = None) -> str:
    if not _is_set(value):
        return NONE
    now = now or datetime.now(UTC)
    return seconds((now - value.ToDatetime(tzinfo=UTC)).total_seconds()) + " ago"


def enum_name(value: int, enum: Any, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def work_state(value: int) -> str:
    return enum_name(value, types_pb2.WorkItemState, "WORK_ITEM_STATE_")


def receipt_status(value: int) -> str:
    return enum_name(value, types_pb2.ReceiptStatus, "RECEIPT_STATUS_")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ts=ts,
        iso=iso,
        dur=dur,
        ago=ago,
        seconds=seconds,
        work_state=work_state,
        receipt_status=receipt_status,
    )
    return env
