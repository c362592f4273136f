"""Login and logout: an admin token becomes a server-side session.

The token is checked by the admin API itself (GetCaller): its answer — key id, roles, the RPCs the
token may call, payload access — is what the console shows and gates actions by. The login form
carries its own CSRF token, bound to a short-lived pre-session cookie (double submit), so another
site cannot log a browser in with its token.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from urllib.parse import urlsplit

from aiohttp import web

from connector.console import web as edge
from connector.console.client import AdminClient, ApiError
from connector.console.params import Params
from connector.console.sessions import Caller
from connector.console.ui import CLIENT_KEY, render
from connector.v1 import admin_service_pb2 as pb

log = logging.getLogger("connector.console")
LOGIN_COOKIE = "connector_console_login"


async def resolve_caller(client: AdminClient, token: str) -> Caller:
    """Who a token is, as the admin API says (GetCaller)."""
    me = await client.call("GetCaller", pb.GetCallerRequest(), token)
    return Caller(me.key_id, frozenset(me.roles), frozenset(me.allowed_methods), me.may_see_payload)


def local_target(target: str | None) -> str:
    """A post-login target: only a path on this site (no scheme, host, ``//`` or backslash)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    parts = urlsplit(target)
    return "/" if parts.scheme or parts.netloc or any(ord(c) < 32 for c in target) else target


def _form(
    request: web.Request, status: int = 200, *, next_: str = "/", error: str | None = None
) -> web.Response:
    nonce = secrets.token_urlsafe(24)
    response = render(request, "login.html", status=status, next=next_, error=error, login_csrf=nonce)
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        httponly=True,
        samesite="Strict",
        secure=request.app[edge.SECURE_KEY],
        path="/login",
        max_age=900,
    )
    return response


async def login_page(request: web.Request) -> web.Response:
    if edge.session_of(request) is not None:
        raise web.HTTPSeeOther("/")
    return _form(request, next_=local_target(Params(request.query).text("next", max_len=2000)))


def _start(request: web.Request, token: str, caller: Caller, target: str) -> web.Response:
    session_id, _ = request.app[edge.SESSION_KEY].create(token, caller)
    response = web.HTTPSeeOther(local_target(target))
    response.set_cookie(
        edge.COOKIE,
        session_id,
        httponly=True,
        samesite="Strict",
        secure=request.app[edge.SECURE_KEY],
        path="/",
    )
    response.del_cookie(LOGIN_COOKIE, path="/login")
    log.info("console login", extra={"event": "console_login", "actor": f"key:{caller.key_id}"})
    raise response


async def login_submit(request: web.Request) -> web.Response:
    form = Params(await request.post())
    target = local_target(form.text("next", max_len=2000))
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(expected.encode(), form.raw("login_csrf").encode()):
        edge.audit_refusal(request, "login_csrf")
        return _form(request, 403, next_=target, error="the login form expired: log in again")
    token = form.raw("token").strip()
    if not token or len(token) > 1024:
        return _form(request, 400, next_=target, error="enter an admin token")
    try:
        caller = await resolve_caller(request.app[CLIENT_KEY], token)
    except ApiError as exc:
        if exc.code in ("UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT"):
            edge.audit_refusal(request, "login_refused")
            return _form(request, 401, next_=target, error="the admin API did not accept this token")
        raise
    return _start(request, token, caller, target)


async def login_link(request: web.Request) -> web.Response:
    token = request.app[edge.SESSION_KEY].redeem(request.match_info["nonce"])
    if token is None:
        return _form(request, 410, error="this login link was used or has expired: log in with a token")
    caller = await resolve_caller(request.app[CLIENT_KEY], token)
    return _start(request, token, caller, "/")


async def logout(request: web.Request) -> web.Response:
    request.app[edge.SESSION_KEY].delete(request.cookies.get(edge.COOKIE))
    response = web.HTTPSeeOther("/login")
    response.del_cookie(edge.COOKIE, path="/")
    raise response
