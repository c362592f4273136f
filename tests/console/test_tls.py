"""The console over TLS on both legs: HTTPS to the browser (the session cookie is then Secure) and
TLS to the admin API (CONNECTOR_CONSOLE_ADMIN_TLS_CA_FILE), with certificates made by openssl."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import aiohttp
import pytest

from connector.common.core.settings import ConsoleSettings, SettingsError
from connector.console.server import ConsoleService, server_tls
from connector.executor.admin import server_credentials
from tests.admin.conftest import OPERATOR, start_admin
from tests.admin.test_tls import _settings, certs  # noqa: F401  (the module's certificate fixture)


async def test_https_console_over_a_tls_admin_api(db_url: str, certs: Path) -> None:  # noqa: F811
    admin = await start_admin(db_url, credentials=server_credentials(_settings(certs, mtls=False)))
    cfg = ConsoleSettings(
        port=0,
        admin_address=f"127.0.0.1:{admin.server.port}",
        admin_tls_ca_file=str(certs / "ca.pem"),
        tls_cert_file=str(certs / "server.pem"),
        tls_key_file=str(certs / "server.key"),
    )
    console = ConsoleService(cfg)
    await console.start()
    try:
        assert console.url.startswith("https://127.0.0.1:")
        trust = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(console.url + "/login", ssl=trust) as resp:
                form = await resp.text()
                pre = next(
                    c for c in resp.headers.getall("Set-Cookie") if c.startswith("connector_console_login=")
                )
            assert "Secure" in pre
            login_csrf = re.search(r'name="login_csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
            async with http.post(
                console.url + "/login", data={"token": OPERATOR, "login_csrf": login_csrf},
                ssl=trust, allow_redirects=False,
            ) as resp:  # fmt: skip
                assert resp.status == 303, await resp.text()
                cookie = next(
                    c for c in resp.headers.getall("Set-Cookie") if c.startswith("connector_console=")
                )
            assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
            async with http.get(console.url + "/processes", ssl=trust) as resp:
                assert resp.status == 200 and "Processes" in await resp.text()  # GetCaller + a page over TLS
        with pytest.raises(aiohttp.ClientConnectorError):  # plain HTTP is not served on the TLS port
            async with (
                aiohttp.ClientSession() as http,
                http.get(console.url.replace("https", "http") + "/login"),
            ):
                pass
    except aiohttp.ServerDisconnectedError:
        pass
    finally:
        await console.stop()
        await admin.stop()


def test_tls_settings_must_come_in_pairs(certs: Path) -> None:  # noqa: F811
    with pytest.raises(SettingsError, match="go together"):
        server_tls(ConsoleSettings(tls_cert_file=str(certs / "server.pem")))
    assert server_tls(ConsoleSettings()) is None
