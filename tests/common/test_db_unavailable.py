"""A service that cannot reach its database at start says so in one line and exits 1: where it
tried (host, port, database: never the user or password), why (libpq's own reason), and which
settings to look at. No traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from connector.common.core import db
from connector.common.core.settings import DatabaseSettings, PoolSettings

PASSWORD = "s3cret-pw-never-printed"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket is closed


async def test_open_pool_names_the_server_and_the_reason_but_not_the_password() -> None:
    url = f"postgresql://connector:{PASSWORD}@127.0.0.1:{_closed_port()}/queue"
    with pytest.raises(db.DatabaseUnavailable) as info:
        await db.open_pool(
            "t-unavailable",
            DatabaseSettings(connect_timeout_s=0.3),
            PoolSettings(pool_timeout_s=0.3),
            url=url,
        )
    message = info.value.message
    assert message.startswith("connector t-unavailable: the database at 127.0.0.1:")
    assert "/queue accepted no connection within 0.3 s" in message
    assert "Connection refused" in message
    assert PASSWORD not in message and "connector:" not in message
    assert info.value.code == message  # SystemExit: printed by Python, exit status 1
    assert "t-unavailable" not in db._POOLS


@pytest.mark.parametrize("service", ["ingress", "materializer", "executor"])
def test_a_service_started_without_its_database_exits_1_with_one_line(service: str) -> None:
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": f"postgresql://connector:{PASSWORD}@127.0.0.1:{_closed_port()}/queue",
        "CONNECTOR_CONNECT_TIMEOUT_S": "0.5",
        f"CONNECTOR_{service.upper()}_POOL_TIMEOUT_S": "0.5",
    }
    out = subprocess.run(
        [sys.executable, "-m", "connector.cli.main", service, "--grpc-port", "0", "--metrics-port", "0"]
        if service == "ingress"
        else [sys.executable, "-m", "connector.cli.main", service],
        env=env,
        capture_output=True,
        timeout=60,
    )
    stderr = out.stderr.decode()
    assert out.returncode == 1, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"connector {service}: the database at 127.0.0.1:"), last
    assert "Connection refused" in last and "CONNECTOR_DATABASE_URL" in last
    assert "Traceback" not in stderr
    assert PASSWORD not in stderr


@pytest.mark.parametrize("disable", [True, False], ids=["default", "control-server-setting"])
async def test_pooled_connections_run_without_jit(db_url: str, disable: bool) -> None:
    """Every service pool's connections have ``jit = off`` (the flow claim at a large backlog paid
    seconds of JIT compilation per execution with the server's default); ``disable_jit = false``
    leaves the server's setting (``on`` by default: the control)."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as c:
        server = c.execute("SELECT reset_val FROM pg_settings WHERE name = 'jit'").fetchone()[0]
    pool = await db.open_pool(
        f"jit-{disable}", DatabaseSettings(disable_jit=disable), PoolSettings(pool_min_size=1), url=db_url
    )
    try:
        async with pool.connection() as conn:
            got = (await (await conn.execute("SHOW jit")).fetchone())[0]
    finally:
        await pool.close()
    assert got == ("off" if disable else server), (got, server)
    if not disable:
        assert server == "on", "the control needs a server with jit on (PostgreSQL's default)"
