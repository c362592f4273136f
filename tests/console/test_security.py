"""The console's security edge over real ports: strict headers on every answer, server-side
sessions with strict cookies, CSRF + origin + role on every state change (a refusal is 403, one audit
line and nothing written), payloads only for roles that may read them, errors that never leak."""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from connector.console import web as edge
from connector.console.app import build_app
from connector.console.client import AdminClient
from connector.console.sessions import Caller, SessionStore

from .conftest import OPERATOR, REPLAY, VIEW, VIEW_REPLAY, Console, Seed, digest

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECRET = "do-not-leak"  # in every seeded receipt body (tests/admin/conftest.py Seed.receipt)


def _refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "console request refused"]


async def _dead(seed: Seed) -> tuple[int, int]:
    pack = await seed.pack()
    work_id = await seed.item(pack, source_lane="sync:o-1")
    receipt = await seed.one(
        "SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
        " WHERE w.work_id = %s",
        (work_id,),
    )
    return work_id, int(receipt)


async def test_every_answer_carries_the_security_headers(console: Console, seed: Seed) -> None:
    _, receipt = await _dead(seed)
    anon = await console.anonymous()
    op = await console.login(OPERATOR)
    seen = 0
    for client, paths in (
        (
            anon,
            [
                "/login",
                "/",
                "/deliveries",
                "/static/console.js",
                "/static/vendor/htmx-2.0.11.min.js",
                "/nope",
            ],
        ),
        (op, ["/", "/deliveries", f"/deliveries/{receipt}", "/deliveries/999999", "/deliveries/x", "/nope"]),
    ):
        for path in paths:
            _, _, headers = await client.get(path)
            seen += 1
            assert headers["Content-Security-Policy"] == CSP, path
            assert headers["X-Content-Type-Options"] == "nosniff", path
            assert headers["X-Frame-Options"] == "DENY", path
            assert headers["Referrer-Policy"] == "same-origin", path
            if not path.startswith("/static/"):
                assert headers["Cache-Control"] == "no-store", path
    assert seen == 12


async def test_login_makes_a_server_side_session_with_a_strict_cookie(console: Console) -> None:
    anon = await console.anonymous()
    status, text, headers = await anon.get("/deliveries?namespace=shop")
    location = urlsplit(headers["Location"])
    assert status == 303 and location.path == "/login"
    assert parse_qs(location.query) == {"next": ["/deliveries?namespace=shop"]}
    _, form, _ = await anon.get("/login")
    login_csrf = re.search(r'name="login_csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
    # a wrong token: 401, no session
    status, text, headers = await anon.post(
        "/login", {"token": "not-a-token-0123456789", "login_csrf": login_csrf}
    )
    assert (
        status == 401
        and "did not accept" in text
        and "connector_console=" not in headers.get("Set-Cookie", "")
    )
    assert len(console.sessions) == 0
    # the login form's own CSRF token is required (another site cannot log this browser in)
    status, text, _ = await anon.post("/login", {"token": OPERATOR, "login_csrf": "forged"})
    assert status == 403 and len(console.sessions) == 0
    status, form, _ = await anon.get("/login")
    login_csrf = re.search(r'name="login_csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
    status, text, headers = await anon.post(
        "/login", {"token": OPERATOR, "login_csrf": login_csrf, "next": "//evil.example/x"}
    )
    assert status == 303 and headers["Location"] == "/"  # no open redirect
    cookie = next(c for c in headers.getall("Set-Cookie") if c.startswith("connector_console="))
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "path", "samesite"} <= attrs and "secure" not in attrs  # plain HTTP here
    assert "SameSite=Strict" in cookie
    assert OPERATOR not in cookie and len(console.sessions) == 1
    status, text, _ = await anon.get("/")
    assert status == 200 and "Overview" in text and OPERATOR not in text


async def test_secure_cookie_when_served_over_tls(db_url: str) -> None:
    """secure_cookies (TLS, or a TLS proxy in front): the session cookie is Secure."""
    sessions = SessionStore()
    sessions_caller = Caller("k", frozenset(), frozenset(), False)
    app = build_app(AdminClient("127.0.0.1:9"), sessions, secure_cookies=True)

    async def fake_resolve(client: object, token: str) -> Caller:
        return sessions_caller

    import connector.console.auth as auth

    original = auth.resolve_caller
    auth.resolve_caller = fake_resolve  # type: ignore[assignment]
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        import aiohttp

        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            base = str(server.make_url("")).rstrip("/")
            async with http.get(base + "/login") as resp:
                form = await resp.text()
                pre = next(
                    c for c in resp.headers.getall("Set-Cookie") if c.startswith("connector_console_login=")
                )
            assert "Secure" in pre  # the pre-session cookie too: a plain-HTTP client does not send it back
            login_csrf = re.search(r'name="login_csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
            async with http.post(
                base + "/login",
                data={"token": "x" * 20, "login_csrf": login_csrf},
                headers={"Cookie": pre.split(";")[0]},
                allow_redirects=False,
            ) as resp:
                assert resp.status == 303, (resp.status, await resp.text())
                cookie = next(
                    c for c in resp.headers.getall("Set-Cookie") if c.startswith("connector_console=")
                )
        assert "Secure" in cookie and "HttpOnly" in cookie
    finally:
        auth.resolve_caller = original  # type: ignore[assignment]
        await server.close()


async def test_state_changes_need_session_csrf_and_origin(
    console: Console, seed: Seed, adb: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="connector.console")
    work_id, receipt = await _dead(seed)
    op = await console.login(OPERATOR)
    other = await console.login(OPERATOR)
    await op.get(f"/deliveries/{receipt}")
    await other.get(f"/deliveries/{receipt}")
    assert op.csrf and other.csrf and op.csrf != other.csrf
    anon = await console.anonymous()
    before = await digest(adb)
    attempts = [
        (anon, {"request_id": "r1"}, {}, "no_session"),
        (op, {"request_id": "r1"}, {}, "csrf"),
        (op, {"request_id": "r1", "csrf": "wrong"}, {}, "csrf"),
        (op, {"request_id": "r1", "csrf": other.csrf}, {}, "csrf"),  # another session's token
        (op, {"request_id": "r1", "csrf": op.csrf}, {"Origin": "https://evil.example"}, "cross_origin"),
        (op, {"request_id": "r1", "csrf": op.csrf}, {"Sec-Fetch-Site": "cross-site"}, "cross_origin"),
    ]
    for client, form, headers, reason in attempts:
        status, text, _ = await client.post(f"/work/{work_id}/replay", form, headers=headers)
        assert status == 403, (reason, status, text[:300])
        assert "Traceback" not in text
    assert await digest(adb) == before, "a refused request wrote nothing"
    assert [r.reason for r in _refusals(caplog)] == [a[3] for a in attempts]  # type: ignore[attr-defined]
    # control: the same request with the session's token (and its origin) replays the item
    status, _, headers = await op.post(
        f"/work/{work_id}/replay", {"request_id": "r1", "csrf": op.csrf}, headers={"Origin": op.base}
    )
    assert status == 303 and headers["Location"] == f"/deliveries/{receipt}#work-{work_id}"
    assert await seed.state(work_id) == "pending"
    status, text, _ = await op.get(f"/deliveries/{receipt}")
    assert f"work item {work_id} replayed" in text


async def test_read_only_sees_no_action_and_a_forged_post_is_refused(
    console: Console, seed: Seed, adb: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="connector.console")
    work_id, receipt = await _dead(seed)
    view = await console.login(VIEW)
    status, page, _ = await view.get(f"/deliveries/{receipt}")
    assert status == 200 and f"Work item {work_id}" in page and "read-only" in page
    assert 'method="post" action="/work/' not in page and "Replay work item" not in page
    op = await console.login(OPERATOR)
    status, op_page, _ = await op.get(f"/deliveries/{receipt}")
    assert f'action="/work/{work_id}/replay"' in op_page  # control: the operator sees the action
    before = await digest(adb)
    for path, form in (
        (f"/work/{work_id}/replay", {"request_id": "f1", "csrf": view.csrf}),
        (f"/work/{work_id}/cancel", {"request_id": "f2", "csrf": view.csrf, "reason": "forged"}),
    ):
        status, text, _ = await view.post(path, form)
        assert status == 403 and "may not call" in text
    assert await digest(adb) == before
    refused = _refusals(caplog)
    assert [(r.reason, r.rpc) for r in refused] == [("role", "ReplayWorkItem"), ("role", "CancelWorkItem")]  # type: ignore[attr-defined]
    assert all(r.actor.startswith("key:") for r in refused)  # type: ignore[attr-defined]


async def test_payloads_only_for_roles_that_may_read_them(console: Console, seed: Seed) -> None:
    _, receipt = await _dead(seed)
    view = await console.login(VIEW)
    seen = []
    for path in ("/", "/deliveries?namespace=shop", f"/deliveries/{receipt}"):
        status, text, _ = await view.get(path)
        assert status == 200
        seen.append(text)
        assert SECRET not in text and "payload=1" not in text
    status, text, _ = await view.get(f"/deliveries/{receipt}?payload=1")
    assert status == 403 and SECRET not in text
    reader = await console.login(VIEW_REPLAY)
    status, text, _ = await reader.get(f"/deliveries/{receipt}")
    assert status == 200 and "payload=1" in text and SECRET not in text  # only on request
    status, text, _ = await reader.get(f"/deliveries/{receipt}?payload=1")
    assert status == 200 and SECRET in text


async def test_sessions_expire_when_idle_and_links_work_once() -> None:
    now = [1000.0]
    store = SessionStore(idle_s=60, max_age_s=600, link_ttl_s=30, clock=lambda: now[0])
    caller = Caller("k", frozenset(), frozenset(), False)
    sid, _ = store.create("tok", caller)
    now[0] += 59
    assert store.get(sid) is not None  # a request renews the idle time
    now[0] += 59
    assert store.get(sid) is not None
    now[0] += 61
    assert store.get(sid) is None and len(store) == 0
    sid, _ = store.create("tok", caller)
    for _ in range(11):  # active, but the absolute limit ends it
        now[0] += 55
        store.get(sid)
    assert store.get(sid) is None
    nonce = store.link("tok")
    assert store.redeem(nonce) == "tok" and store.redeem(nonce) is None
    late = store.link("tok")
    now[0] += 31
    assert store.redeem(late) is None
    assert store.get("x" * 500) is None and store.redeem("") is None


async def test_a_login_link_logs_in_once(console: Console) -> None:
    nonce = console.sessions.link(OPERATOR)
    client = await console.anonymous()
    status, _, headers = await client.get(f"/login/link/{nonce}")
    assert status == 303 and "connector_console=" in headers["Set-Cookie"]
    status, text, _ = await client.get("/")
    assert status == 200 and "Overview" in text
    again = await console.anonymous()
    status, text, _ = await again.get(f"/login/link/{nonce}")
    assert status == 410 and "used or has expired" in text


async def test_logout_ends_the_session(console: Console) -> None:
    op = await console.login(OPERATOR)
    status, _, _ = await op.post("/logout", {"csrf": op.csrf})
    assert status == 303 and len(console.sessions) == 0
    status, _, headers = await op.get("/")
    assert status == 303 and headers["Location"].startswith("/login")


async def test_admin_api_down_is_503_not_500(console: Console) -> None:
    """The admin API unreachable: 503 with Retry-After and one line, never a 500 or a traceback."""
    op = await console.login(OPERATOR)
    await console.admin.server.stop(0)
    status, text, headers = await op.get("/deliveries?namespace=shop")
    assert status == 503 and headers["Retry-After"] and "UNAVAILABLE" in text and "Traceback" not in text


async def test_a_token_without_view_gets_403_pages_not_errors(console: Console) -> None:
    replay_only = await console.login(REPLAY)
    status, text, _ = await replay_only.get("/deliveries?namespace=shop")
    assert status == 403 and "ROLE_REQUIRED" in text


def test_the_edge_refuses_cross_site_fetch_metadata() -> None:
    from aiohttp.test_utils import make_mocked_request

    def same(headers: dict[str, str]) -> bool:
        return edge._same_origin(make_mocked_request("POST", "/x", headers={"Host": "c:8090", **headers}))

    assert same({}) and same({"Origin": "http://c:8090"}) and same({"Sec-Fetch-Site": "same-origin"})
    assert not same({"Origin": "http://evil:8090"}) and not same({"Origin": "null"})
    assert not same({"Sec-Fetch-Site": "cross-site"}) and not same({"Sec-Fetch-Site": "same-site"})
    assert isinstance(web.HTTPForbidden(), web.HTTPException)
