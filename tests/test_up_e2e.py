"""Walking skeleton: `connector up --once` over real ports — a signed demo delivery posted to the
ingress HTTP endpoint is materialized and executed by the demo handler."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONNECTOR = str(Path(sys.executable).with_name("connector"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp_path: Path, db_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    env.update(
        CONNECTOR_DATA_DIR=str(tmp_path / "data"),
        CONNECTOR_INGRESS_HTTP_PORT=str(_free_port()),
        CONNECTOR_INGRESS_GRPC_PORT=str(_free_port()),
        CONNECTOR_INGRESS_METRICS_PORT=str(_free_port()),
        CONNECTOR_MATERIALIZER_GRPC_PORT=str(_free_port()),
        CONNECTOR_MATERIALIZER_METRICS_PORT=str(_free_port()),
        CONNECTOR_EXECUTOR_GRPC_PORT=str(_free_port()),
        CONNECTOR_EXECUTOR_METRICS_PORT=str(_free_port()),
        CONNECTOR_CONSOLE_PORT=str(_free_port()),
    )
    if db_url is not None:
        env["CONNECTOR_DATABASE_URL"] = db_url
    return env


def test_connector_up_executes_a_signed_demo_delivery(tmp_path: Path, db_url: str) -> None:
    env = _env(tmp_path, db_url)
    proc = subprocess.run(
        [CONNECTOR, "up", "--once", "--timeout", "60"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "demo delivery executed" in out
    port = env["CONNECTOR_INGRESS_HTTP_PORT"]
    data = tmp_path / "data"
    # The banner (#24): the demo route, its scheme and secret file, how to reach the instance.
    assert f"demo route  POST http://127.0.0.1:{port}/v1/webhooks/demo/events" in proc.stdout
    assert "Standard Webhooks" in proc.stdout and str(data / "demo-webhook-secret") in proc.stdout
    assert "CONNECTOR_DATABASE_URL (yours)" in proc.stdout  # set by the caller: not repeated
    assert ". data/env " in proc.stdout and "connector demo send --fail" in proc.stdout  # cwd: tmp_path
    # Readable log lines by default: text, one per accepted delivery.
    assert "delivery accepted  receipt_id=1 namespace=demo route=events" in proc.stderr
    # the operator console, with a one-time login link (never the token itself: checked below)
    assert f"  console     http://127.0.0.1:{env['CONNECTOR_CONSOLE_PORT']}/login/link/" in proc.stdout
    with psycopg.connect(db_url) as conn:
        states = conn.execute("SELECT work_type, state FROM connector_work_item ORDER BY work_id").fetchall()
        receipts = conn.execute("SELECT router_status FROM connector_ingress_receipt").fetchall()
    assert states == [("record", "succeeded"), ("deliver", "succeeded")]
    assert receipts == [("materialized",)]
    # The secret stays in its file: nothing printed carries it.
    secret = (data / "demo-webhook-secret").read_text().strip()
    token = (data / "admin-token").read_text().strip()
    env_file = (data / "env").read_text()
    for value in (secret.removeprefix("whsec_"), token):
        assert value not in out and value not in env_file
    assert f"CONNECTOR_INGRESS_HTTP_PORT={port}" in env_file
    assert f"CONNECTOR_ADMIN_TOKEN_FILE={data / 'admin-token'}" in env_file
    assert "CONNECTOR_DATABASE_URL" not in env_file  # the caller's URL may hold a password


@pytest.fixture
def outside_pytest_tmp() -> Iterator[Path]:
    """A folder outside pytest's base temp: the embedded server runs as its own system user, which
    must traverse the path, and every pytest session that starts on this machine resets
    /tmp/pytest-of-<user> to mode 0700 (a second session beside this one made initdb fail)."""
    path = Path(tempfile.mkdtemp(prefix="connector-up-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_connector_up_without_database_url_uses_embedded_postgres(outside_pytest_tmp: Path) -> None:
    tmp_path = outside_pytest_tmp
    env = _env(tmp_path, None)
    proc = subprocess.run(
        [CONNECTOR, "up", "--once", "--timeout", "60"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "starting embedded PostgreSQL" in out
    assert "demo delivery executed" in out
    assert (tmp_path / "data" / "embedded" / "pgdata" / "PG_VERSION").exists()
