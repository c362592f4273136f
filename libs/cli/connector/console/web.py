"""The console's HTTP edge (aiohttp): security headers, sessions, CSRF, role gates, errors.

Every answer carries a strict Content-Security-Policy (no inline script or style, nothing from
another origin), ``no-store`` caching for pages, and no framing. Every state-changing request (any
method but GET/HEAD) needs a live session, the session's CSRF token (form field ``csrf`` or header
``X-CSRF-Token``) and, when the browser sends them, a same-origin ``Origin`` / ``Sec-Fetch-Site``;
each action also needs the admin RPC it calls in the session's allowed methods. A refusal is 403, one
audit line (``console request refused``: key id, path, reason) and no RPC. GET never changes state.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlsplit

from aiohttp import web

from connector.console.client import ApiError
from connector.console.sessions import Session, SessionStore, csrf_ok

log = logging.getLogger("connector.console")

COOKIE = "connector_console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}
SAFE_METHODS = frozenset({"GET", "HEAD"})
PUBLIC_PREFIXES = ("/static/", "/login", "/healthz")

SESSION_KEY = web.AppKey("sessions", SessionStore)
SECURE_KEY = web.AppKey("secure_cookies", bool)
SESSION = web.RequestKey("session", Session)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def session_of(request: web.Request) -> Session | None:
    return request.get(SESSION)


def audit_refusal(request: web.Request, reason: str, **fields: Any) -> None:
    session = session_of(request)
    log.info(
        "console request refused",
        extra={
            "event": "console_refused",
            "reason": reason,
            "path": request.path[:200],
            "method": request.method,
            "actor": f"key:{session.caller.key_id}" if session else "anonymous",
            **fields,
        },
    )


def _same_origin(request: web.Request) -> bool:
    """What the browser says of where a request comes from (a client that says nothing still needs
    the CSRF token)."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.host


@web.middleware
async def headers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _secure(request, exc.headers)
        raise
    _secure(request, response.headers)
    return response


def _secure(request: web.Request, headers: Any) -> None:
    for key, value in HEADERS.items():
        headers.setdefault(key, value)
    if not request.path.startswith("/static/"):
        headers["Cache-Control"] = "no-store"


@web.middleware
async def session_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    store = request.app[SESSION_KEY]
    session = store.get(request.cookies.get(COOKIE))
    if session is not None:
        request[SESSION] = session
    public = request.path.startswith(PUBLIC_PREFIXES)
    if request.method not in SAFE_METHODS:
        if not _same_origin(request):
            audit_refusal(request, "cross_origin")
            raise web.HTTPForbidden(text="refused: cross-origin request")
        if not public:
            if session is None:
                audit_refusal(request, "no_session")
                raise web.HTTPForbidden(text="refused: not logged in (or the session expired): log in again")
            form = await request.post() if request.content_type in FORM_TYPES else {}
            presented = request.headers.get("X-CSRF-Token") or form.get("csrf")
            if not csrf_ok(session, presented if isinstance(presented, str) else None):
                audit_refusal(request, "csrf")
                raise web.HTTPForbidden(
                    text="refused: missing or wrong CSRF token: reload the page and retry"
                )
    elif session is None and not public:
        if request.headers.get("HX-Request"):
            raise web.HTTPUnauthorized(text="session expired: reload the page to log in")
        target = request.path_qs if request.path != "/" else "/"
        raise web.HTTPSeeOther(f"/login?next={quote(target, safe='')}")
    return await handler(request)


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def require(request: web.Request, method: str) -> Session:
    """The session, if its caller may call the admin RPC ``method`` (else 403 + audit line)."""
    session = session_of(request)
    if session is None:
        audit_refusal(request, "no_session", rpc=method)
        raise web.HTTPForbidden(text="refused: not logged in")
    if not session.caller.may(method):
        audit_refusal(request, "role", rpc=method)
        raise web.HTTPForbidden(text=f"refused: your token may not call {method}")
    return session


_STATUS = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "OUT_OF_RANGE": 400,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 503,
}


def api_status(error: ApiError) -> int:
    if error.code == "RESOURCE_EXHAUSTED" and error.reason == "DATABASE_BUSY":
        return 503
    return _STATUS.get(error.code, 502)


def error_middleware(render_error: Callable[[web.Request, int, str], web.Response]) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            status = api_status(exc)
            if exc.code == "UNAUTHENTICATED":  # the token was withdrawn: the session is over
                request.app[SESSION_KEY].delete(request.cookies.get(COOKIE))
            response = render_error(request, status, f"{exc.code} {exc.reason}: {exc.message}")
            if status == 503:
                response.headers["Retry-After"] = "5"
            return response
        except web.HTTPRedirection:
            raise
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return render_error(request, exc.status, exc.text or exc.reason)
        except Exception:
            log.error(
                "console request failed",
                extra={"path": request.path[:200], "error": traceback.format_exc(limit=5)},
            )
            return render_error(request, 500, "internal error (logged on the console server)")

    return middleware
