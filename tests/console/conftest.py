"""Console fixtures: the admin API (a real GrpcServer over a fresh database, tokens per role) and the
console app on real ports; a logged-in HTTP client per role; a digest of every connector table to
prove a refused request wrote nothing."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psycopg
import pytest_asyncio
from aiohttp.test_utils import TestServer

from connector.common.store import schema
from connector.console.app import build_app
from connector.console.client import AdminClient
from connector.console.sessions import SessionStore
from tests.admin.conftest import OPERATOR, REPLAY, VIEW, VIEW_REPLAY, Running, Seed, start_admin

__all__ = ["OPERATOR", "REPLAY", "VIEW", "VIEW_REPLAY", "Console", "Seed", "digest"]

_CSRF = re.compile(r'<meta name="csrf-token" content="([^"]+)"')
_LOGIN_CSRF = re.compile(r'name="login_csrf" value="([^"]+)"')
#: Written by running services on their own clock, never by a request: the figures rollups (flushes
#: every 10 s, the leader's samples) and the process registry's heartbeats.
BACKGROUND_TABLES = ("connector_figures", "connector_process")
DIGEST = " UNION ALL ".join(
    f"SELECT '{t}', md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM {t} x"
    for t in sorted(schema.metadata.tables)
    if t not in BACKGROUND_TABLES
)


async def digest(conn: psycopg.AsyncConnection) -> dict[str, str]:
    """Every connector table's rows, hashed: equal before and after means nothing was written."""
    cur = await conn.execute(DIGEST)
    return {str(name): str(value) for name, value in await cur.fetchall()}


class Browserless:
    """A logged-in console session over HTTP (aiohttp client, its own cookie jar)."""

    def __init__(self, base: str, http: aiohttp.ClientSession) -> None:
        self.base = base
        self.http = http
        self.csrf = ""

    async def get(self, path: str, **kw: Any) -> tuple[int, str, Any]:
        async with self.http.get(self.base + path, allow_redirects=False, **kw) as resp:
            text = await resp.text()
            found = _CSRF.search(text)
            if found:
                self.csrf = html.unescape(found.group(1))
            return resp.status, text, resp.headers

    async def post(self, path: str, data: Any = None, **kw: Any) -> tuple[int, str, Any]:
        async with self.http.post(self.base + path, data=data, allow_redirects=False, **kw) as resp:
            return resp.status, await resp.text(), resp.headers

    async def close(self) -> None:
        await self.http.close()


@dataclass
class Console:
    base: str
    sessions: SessionStore
    admin: Running
    server: TestServer
    clients: list[Browserless] = field(default_factory=list)

    async def anonymous(self) -> Browserless:
        jar = aiohttp.CookieJar(unsafe=True)
        client = Browserless(self.base, aiohttp.ClientSession(cookie_jar=jar))
        self.clients.append(client)
        return client

    async def login(self, token: str) -> Browserless:
        client = await self.anonymous()
        status, text, _ = await client.get("/login")
        assert status == 200, text
        found = _LOGIN_CSRF.search(text)
        assert found, "login form without its CSRF field"
        status, text, _ = await client.post(
            "/login", {"token": token, "login_csrf": html.unescape(found.group(1)), "next": "/"}
        )
        assert status == 303, (status, text)
        status, text, _ = await client.get("/")
        assert status in (200, 403), (status, text[:500])  # 403: a token without ViewConnectorEvents
        assert client.csrf, "a logged-in page carries the session's CSRF token"
        return client


@pytest_asyncio.fixture
async def console(db_url: str) -> AsyncIterator[Console]:
    admin = await start_admin(db_url)
    client = AdminClient(f"127.0.0.1:{admin.server.port}")
    sessions = SessionStore()
    server = TestServer(
        build_app(client, sessions, options={"trace_url_template": "https://traces.example/t/{trace_id}"}),
        host="127.0.0.1",
    )
    await server.start_server()
    c = Console(str(server.make_url("")).rstrip("/"), sessions, admin, server)
    try:
        yield c
    finally:
        for b in c.clients:
            await b.close()
        await server.close()
        await client.close()
        await admin.stop()


@pytest_asyncio.fixture
async def seed(adb: psycopg.AsyncConnection) -> Seed:
    return Seed(adb)
