"""Never hang on a silent database (issue #26 item 2, docs/deploy.md "Failover").

The settings accept exactly what libpq accepts (multi-host URLs and the key=value form) and refuse
SQLAlchemy's ``?host=h:p&host=h:p`` form with one line; ``DatabaseSettings.conninfo()`` adds the
connect timeout, keepalives and ``tcp_user_timeout`` unless the URL sets them.

The proof: a pooled connection through a TCP proxy (asyncio, in this test) in front of the real
PostgreSQL; the proxy's port is then black-holed (an iptables DROP both ways on loopback: a server
gone silent, no RST; a userland proxy that merely stops forwarding would still have its kernel
acknowledge, tests/support/netfault.py). With the defaults the next statement on that connection
fails within seconds; the control, the same with keepalives and ``tcp_user_timeout`` set to 0, is
still waiting well past the point where the defaults had failed (the kernel retransmits for ~15 min).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
import pytest_asyncio

from connector.common.core import db as dbmod
from connector.common.core.settings import DatabaseSettings, PoolSettings, SettingsError, load
from tests.support.netfault import blackhole_off, blackhole_on

# --------------------------------------------------------------------------------------- URL forms


def _settings(monkeypatch: pytest.MonkeyPatch, url: str, **env: str) -> DatabaseSettings:
    monkeypatch.setenv("CONNECTOR_DATABASE_URL", url)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return load(DatabaseSettings)


def test_multi_host_url_gets_the_network_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings(monkeypatch, "postgresql://u:pw@h1:5433,h2:5434/app?target_session_attrs=read-write")
    params = psycopg.conninfo.conninfo_to_dict(s.conninfo())
    assert params["host"] == "h1,h2" and params["port"] == "5433,5434"
    assert params["target_session_attrs"] == "read-write" and params["dbname"] == "app"
    assert params["connect_timeout"] == "3" and params["keepalives"] == "1"
    assert (params["keepalives_idle"], params["keepalives_interval"], params["keepalives_count"]) == (
        "5",
        "2",
        "3",
    )
    assert params["tcp_user_timeout"] == "6000"


def test_keyword_form_accepted_and_its_own_values_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings(
        monkeypatch,
        "host=h1,h2 port=5433,5434 dbname=app user=u connect_timeout=7",
        CONNECTOR_DB_KEEPALIVES_IDLE_S="9",
    )
    params = psycopg.conninfo.conninfo_to_dict(s.conninfo())
    assert params["host"] == "h1,h2" and params["connect_timeout"] == "7"  # the URL's own wins
    assert params["keepalives_idle"] == "9"  # env override


def test_zero_leaves_libpq_default(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings(
        monkeypatch,
        "postgresql://u@h/db",
        CONNECTOR_DB_TCP_USER_TIMEOUT_MS="0",
        CONNECTOR_DB_KEEPALIVES_IDLE_S="0",
        CONNECTOR_DB_CONNECT_TIMEOUT_S="0",
    )
    params = psycopg.conninfo.conninfo_to_dict(s.conninfo())
    assert "tcp_user_timeout" not in params and "keepalives_idle" not in params
    assert "connect_timeout" not in params


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u:secretpw@/db?host=h1:5432&host=h2:5432", "SQLAlchemy form ?host=h:p&host=h:p"),
        ("postgresql+psycopg://u:secretpw@/db?host=h1:5432", "SQLAlchemy form"),
        ("mysql://u:secretpw@h/db", "must be a postgresql:// URL"),
        ("just-a-host-secretpw", "must be a postgresql:// URL or libpq key=value"),
        ("host=h1 port= = secretpw", "libpq cannot parse it"),
    ],
)
def test_forms_libpq_would_not_take_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, url: str, says: str
) -> None:
    with pytest.raises(SettingsError) as info:
        _settings(monkeypatch, url)
    message = str(info.value)
    assert says in message and "secretpw" not in message
    (line,) = [ln for ln in message.splitlines() if "CONNECTOR_DATABASE_URL" in ln]
    assert "postgresql://user:password@host1:5432,host2:5432/db" in line


# ----------------------------------------------------------------- a silent server, for real


class Proxy:
    """A TCP forwarder on a free loopback port (asyncio, in the test's loop)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)


@pytest_asyncio.fixture
async def proxy(db_url: str) -> AsyncIterator[Proxy]:
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    p = Proxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    await p.start()
    try:
        yield p
    finally:
        blackhole_off(p.port)
        await p.stop()


def _through(db_url: str, port: int) -> str:
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    params.update(host="127.0.0.1", port=str(port))
    return psycopg.conninfo.make_conninfo("", **params)


async def _pooled_statement_after_silence(
    db_url: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], wait_s: float
) -> tuple[BaseException | None, float]:
    """Open a pool through the proxy, black-hole the proxy, run a statement on the pooled
    connection: (its error or None if still waiting after ``wait_s``, seconds it took)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load(DatabaseSettings)
    pool = await dbmod.open_pool(
        "silent-test",
        settings,
        PoolSettings(pool_min_size=1, pool_max_size=1, pool_timeout_s=60),
        url=_through(db_url, proxy.port),
    )
    try:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
            blackhole_on(proxy.port)
            started = time.monotonic()
            task = asyncio.ensure_future(conn.execute("SELECT 1"))
            done, _ = await asyncio.wait({task}, timeout=wait_s)
            took = time.monotonic() - started
            if not done:
                task.cancel()
                blackhole_off(proxy.port)  # let the cancel through
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 10)
                return None, took
            return task.exception(), took
    finally:
        blackhole_off(proxy.port)
        await dbmod.close_pool("silent-test")


async def test_a_pooled_connection_to_a_silent_server_errors_within_seconds(
    db_url: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bound far above the 6 s tcp_user_timeout (a busy machine), far below the kernel's ~15 min.
    err, took = await _pooled_statement_after_silence(db_url, proxy, monkeypatch, {}, wait_s=60)
    print(f"\nsilent server, defaults: {type(err).__name__} after {took:.1f} s")
    assert isinstance(err, psycopg.OperationalError), f"no error within 60 s ({err!r})"
    assert dbmod.connection_lost(err)


async def test_control_without_keepalives_and_user_timeout_it_hangs(
    db_url: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "CONNECTOR_DB_KEEPALIVES_IDLE_S": "0",
        "CONNECTOR_DB_KEEPALIVES_INTERVAL_S": "0",
        "CONNECTOR_DB_KEEPALIVES_COUNT": "0",
        "CONNECTOR_DB_TCP_USER_TIMEOUT_MS": "0",
    }
    # Twice the defaults' tcp_user_timeout and then some: the defaults failed by now.
    err, took = await _pooled_statement_after_silence(db_url, proxy, monkeypatch, env, wait_s=20)
    print(f"\nsilent server, control: {'still waiting' if err is None else repr(err)} after {took:.1f} s")
    assert err is None, f"the control failed by itself ({err!r}): the test could not tell"
