"""A hypothesis property over every console route: arbitrary path values, query strings and form
bodies (NUL, lone surrogates, huge numbers, markup), from an anonymous browser, a read-only session
and an operator session with a missing, wrong or foreign CSRF token or another origin:

- never a 5xx (the admin API is up) and never a traceback;
- the input is never reflected unescaped (a ``<q'"`` marker never comes back as markup);
- nothing is written without a session, its role and its CSRF token (a digest of every connector
  table before and after; GET never writes at all).

Control: ``test_the_property_sees_a_reflection`` — a route that echoes a parameter unescaped is
caught by the same check."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import psycopg
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from .conftest import OPERATOR, VIEW, Browserless, Console, Seed, digest
from .stage import stage

MARK = "<q'\"x>"
GET_ROUTES = [
    "/", "/deliveries", "/deliveries/{id}", "/work/{id}", "/failures", "/failures/group", "/jobs",
    "/jobs/{id}", "/lanes", "/cutover", "/processes", "/login", "/login/link/{id}", "/nope/{id}",
    "/failures/receipts", "/overview/live", "/overview/queues", "/static/{id}",
]  # fmt: skip
POST_ROUTES = [
    "/work/{id}/replay", "/work/{id}/cancel", "/failures/estimate", "/jobs", "/jobs/{id}/cancel",
    "/packs/pause", "/packs/resume", "/circuits/{id}", "/cutover/{id}/{id}/{id}", "/login",
    "/failures/receipts/replay",
]  # fmt: skip
NAMES = [
    "pack", "window", "receipt_id", "work_id", "delivery_id", "idempotency_key", "correlation", "namespace",
    "route", "kind", "routing", "state", "since", "until", "page", "size", "payload", "work_type",
    "failure_class", "summary", "scope", "action", "ids", "count", "job_id", "reason", "queue_class",
    "target", "request_id", "next", "token", "login_csrf",
]  # fmt: skip
_text = st.one_of(
    st.just(MARK),
    st.just(f"a{MARK}b"),
    st.sampled_from(
        [
            "",
            "1",
            "2",
            "3",
            "0",
            "-1",
            "shop",
            "sync",
            "1h",
            "7d",
            "dead",
            "failed",
            "all",
            "replay",
            "cancel",
            "selected",
            "day",
            "*",
            "9" * 30,
            "2026-12-01T10:00:00Z",
            MARK,
            f"a{MARK}b",
            "//evil.example",
            "%00",
            "\x00",
            "é",
        ]
    ),
    st.text(max_size=30),
)
# raw query/path bytes a client could send: percent-encoded NUL, a lone surrogate, bad UTF-8
_raw = st.sampled_from(["%00", "%ED%B2%80", "%FF", "%C3", "%25", "%3Cq%27%22x%3E"])


def _enc(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


#: The names each page reads (drawn most of the time, so a page meets values it actually uses).
ROUTE_NAMES = {
    "/": ["pack", "window"],
    "/overview/live": ["pack", "window"],
    "/overview/queues": ["pack"],
    "/deliveries": ["receipt_id", "work_id", "delivery_id", "idempotency_key", "correlation", "namespace",
                    "route", "kind", "routing", "state", "since", "until", "page", "size"],
    "/deliveries/{id}": ["payload"],
    "/failures": ["pack", "scan"],
    "/failures/group": ["pack", "work_type", "failure_class", "summary", "page"],
    "/lanes": ["pack", "page"],
    "/login": ["next", "token", "login_csrf"],
    "/work/{id}/replay": ["request_id"],
    "/work/{id}/cancel": ["request_id", "reason"],
    "/failures/estimate": ["pack", "work_type", "failure_class", "summary", "scope", "action", "ids"],
    "/jobs": ["pack", "work_type", "failure_class", "summary", "scope", "action", "ids", "count", "job_id",
              "reason"],
    "/packs/pause": ["pack", "queue_class", "reason", "request_id"],
    "/failures/receipts": ["namespace", "route", "error_class", "summary"],
    "/failures/receipts/replay": ["namespace", "route", "error_class", "summary", "job_id", "count"],
    "/packs/resume": ["pack", "queue_class", "request_id"],
    "/circuits/{id}": ["pack", "target", "reason", "request_id"],
}  # fmt: skip


@st.composite
def _pairs(draw: Any, route: str) -> list[tuple[str, str]]:
    out = []
    own = (
        ROUTE_NAMES.get(route, NAMES)
        if route != "*"
        else sorted({n for v in ROUTE_NAMES.values() for n in v})
    )
    for _ in range(draw(st.integers(0, 10))):
        name = draw(st.sampled_from(own if draw(st.integers(0, 3)) else NAMES))
        value = _enc(draw(_text)) if draw(st.booleans()) else draw(_raw)
        out.append((name, value))
    return out


@st.composite
def _path(draw: Any, template: str) -> str:
    parts = template.split("{id}")
    out = parts[0]
    for part in parts[1:]:
        known = st.sampled_from(["1", "2", "0", "999999999", "9" * 25, "open", "close", "cutover", "x"])
        choice = draw(st.one_of(known, _raw, st.text(min_size=1, max_size=12).map(_enc)))
        out += choice + part
    return out


@pytest_asyncio.fixture
async def sessions(console: Console, seed: Seed, db: psycopg.Connection) -> dict[str, Browserless]:
    await stage(seed, db)
    anon = await console.anonymous()
    view = await console.login(VIEW)
    op = await console.login(OPERATOR)
    await op.get("/")
    await view.get("/")
    return {"anon": anon, "view": view, "operator": op}


def _check(status: int, body: str, where: str) -> None:
    assert status < 500, (where, status, body[:300])
    assert "Traceback" not in body, where
    assert "<q'" not in body, (where, "input reflected unescaped")


async def _send(
    client: Browserless, method: str, url: URL, form: str, headers: dict[str, str]
) -> tuple[int, str]:
    if method == "GET":
        async with client.http.get(url, allow_redirects=False) as resp:
            return resp.status, await resp.text(errors="replace")
    async with client.http.post(url, data=form.encode(), headers=headers, allow_redirects=False) as resp:
        return resp.status, await resp.text(errors="replace")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_property_console_routes(
    sessions: dict[str, Browserless], adb: psycopg.AsyncConnection, data: st.DataObject
) -> None:
    """Each example: one random query and form, sent with random path values to every route from
    every session (so every page meets every kind of input); then nothing may have been written."""
    query = "&".join(f"{k}={v}" for k, v in data.draw(_pairs("*"), label="query"))
    form = "&".join(f"{k}={v}" for k, v in data.draw(_pairs("*"), label="form"))
    csrf = data.draw(
        st.sampled_from(["none", "wrong", "foreign", "right", "right-cross-origin"]), label="csrf"
    )
    before = await digest(adb)
    sent = 0
    for method, templates in (("GET", GET_ROUTES), ("POST", POST_ROUTES)):
        for template in templates:
            path = data.draw(_path(template), label=f"path {template}")
            url = URL(sessions["anon"].base + path + ("?" + query if query else ""), encoded=True)
            for who, client in sessions.items():
                mode = "none" if template == "/login" else csrf
                if who == "operator" and mode == "right":
                    mode = "wrong"  # an operator with its token may change state: tested by test_pages
                other = sessions["view" if who == "operator" else "operator"].csrf
                token = {"wrong": "not-the-token", "right": client.csrf, "right-cross-origin": client.csrf,
                         "foreign": other}.get(mode)  # fmt: skip
                body = form + (("&" if form else "") + f"csrf={quote(token, safe='')}" if token else "")
                headers = {"Content-Type": "application/x-www-form-urlencoded"}
                if mode == "right-cross-origin":
                    headers["Origin"] = "https://evil.example"
                status, text = await _send(client, method, url, body, headers)
                sent += 1
                where = f"{method} {url} [{who}, csrf {mode}]"
                _check(status, text, where)
                if method == "POST" and template != "/login":
                    assert status in (303, 400, 403, 404, 405, 410), (where, status, text[:300])
    assert sent == 3 * (len(GET_ROUTES) + len(POST_ROUTES))
    assert await digest(adb) == before, "a request without session, role and CSRF token wrote"


async def test_the_property_sees_a_reflection(console: Console) -> None:
    """Control: the check catches an unescaped echo and a 5xx, so the property can fail."""
    for status, body in ((200, f"<p>{MARK}</p>"), (500, "oops"), (200, "Traceback (most recent call last)")):
        try:
            _check(status, body, "control")
        except AssertionError:
            continue
        raise AssertionError(f"the check missed {status} {body!r}")
    _check(200, "<p>&lt;q&#39;&#34;x&gt;</p>", "escaped")
