"""Every expected error of the ``connector`` command is one line on stderr that says what to do, with
its exit code, and no traceback (#24, item 4). Each case runs the real console script in its own
process: a port another process holds, the admin API without a token / with a wrong one / with no
server at the address, an unreadable token file, no database URL, ``demo send`` without a running
instance or its secret."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CONNECTOR = str(Path(sys.executable).with_name("connector"))
TOKEN = "t" * 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "GRPC_"))}
    env["CONNECTOR_DATA_DIR"] = str(tmp_path / "data")
    env.update(extra)
    return env


def _run(env: dict[str, str], *args: str, cwd: Path | None = None) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [CONNECTOR, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    return proc.returncode, proc.stderr.splitlines()


def one_line(lines: list[str]) -> str:
    """The single stderr line (a traceback or a second line fails the test)."""
    assert len(lines) == 1, "\n".join(lines)
    assert "Traceback" not in lines[0]
    return lines[0]


@pytest.fixture
def executor(db_url: str, tmp_path: Path) -> Iterator[str]:
    """A real ``connector executor`` with one operator token; yields its admin address."""
    port = _free_port()
    env = _env(
        tmp_path,
        CONNECTOR_DATABASE_URL=db_url,
        CONNECTOR_ADMIN_TOKENS=f"{TOKEN}=ConnectorOperator",
        CONNECTOR_EXECUTOR_GRPC_PORT=str(port),
        CONNECTOR_EXECUTOR_METRICS_PORT="0",
    )
    proc = subprocess.Popen(
        [CONNECTOR, "executor"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait on its start line, not on time
            if '"executor started"' in line:
                break
        else:
            pytest.fail(f"the executor exited ({proc.wait()}) before it started")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_taken_port_names_the_setting(tmp_path: Path) -> None:
    """``connector up`` with the HTTP port held by another process: one line naming the port and
    CONNECTOR_INGRESS_HTTP_PORT, exit 1, before anything starts (no database is touched)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = _env(tmp_path, CONNECTOR_INGRESS_HTTP_PORT=str(port))
        code, lines = _run(env, "up", "--once")
    line = one_line(lines)
    assert code == 1
    assert f"port {port}" in line and "already in use" in line and "CONNECTOR_INGRESS_HTTP_PORT" in line
    assert not (tmp_path / "data" / "embedded").exists()


def test_a_service_whose_grpc_port_is_taken_says_which_setting(
    db_url: str, tmp_path: Path, executor: str
) -> None:
    """A second executor on the first one's admin port: one line naming CONNECTOR_EXECUTOR_GRPC_PORT
    and --grpc-port, before the service starts (so before gRPC's own bind error line)."""
    port = executor.rsplit(":", 1)[1]
    env = _env(
        tmp_path,
        CONNECTOR_DATABASE_URL=db_url,
        CONNECTOR_ADMIN_TOKENS=f"{TOKEN}=ConnectorOperator",
        CONNECTOR_EXECUTOR_GRPC_PORT=port,
        CONNECTOR_EXECUTOR_METRICS_PORT="0",
    )
    code, lines = _run(env, "executor")
    line = one_line(lines)
    assert code == 1 and f"port {port}" in line and "CONNECTOR_EXECUTOR_GRPC_PORT" in line
    assert "--grpc-port" in line


def test_admin_errors_say_what_to_do(tmp_path: Path, executor: str) -> None:
    token_file = tmp_path / "data" / "admin-token"  # where `connector up` writes it
    token_file.parent.mkdir(parents=True)
    token_file.write_text(TOKEN + "\n")
    env = _env(tmp_path, CONNECTOR_ADMIN_ADDRESS=executor)

    code, lines = _run(env, "admin", "stats")  # no token
    line = one_line(lines)
    assert code == 1 and line.startswith("error: UNAUTHENTICATED TOKEN_MISSING")
    assert "CONNECTOR_ADMIN_TOKEN_FILE" in line and str(token_file.resolve()) in line

    code, lines = _run({**env, "CONNECTOR_ADMIN_TOKEN": "not-the-token"}, "admin", "stats")
    line = one_line(lines)
    assert code == 1 and line.startswith("error: UNAUTHENTICATED TOKEN_INVALID")
    assert "CONNECTOR_ADMIN_TOKEN" in line and "CONNECTOR_ADMIN_TOKENS" in line
    assert "not-the-token" not in line

    code, lines = _run({**env, "CONNECTOR_ADMIN_TOKEN_FILE": str(token_file)}, "admin", "stats")
    assert code == 0 and lines == []  # the token file `connector up` writes is enough

    closed = f"127.0.0.1:{_free_port()}"
    code, lines = _run({**env, "CONNECTOR_ADMIN_ADDRESS": closed}, "admin", "stats", "--timeout", "5")
    line = one_line(lines)
    assert code == 1 and line.startswith("error: UNAVAILABLE: ")
    assert closed in line and "is the executor running?" in line and " -:" not in line

    missing = tmp_path / "missing-token"
    code, lines = _run(env, "admin", "stats", "--token-file", str(missing))
    line = one_line(lines)
    assert code == 2 and str(missing) in line and "connector up" in line


def test_no_database_url_says_where_to_get_one(tmp_path: Path) -> None:
    manifest = tmp_path / "pack.yaml"
    manifest.write_text("name: x\n")
    for args in (("db", "upgrade"), ("retention", "sweep", "--dry-run")):
        code, lines = _run(_env(tmp_path), *args)
        line = one_line(lines)
        assert code == 1 and "CONNECTOR_DATABASE_URL is not set" in line and "connector up" in line
    code, lines = _run(_env(tmp_path), "pack", "apply", str(tmp_path / "nope.yaml"))
    line = one_line(lines)
    assert code == 2 and line.startswith("error: cannot read") and "No such file" in line


def test_demo_send_without_an_instance(tmp_path: Path) -> None:
    code, lines = _run(_env(tmp_path), "demo", "send")
    line = one_line(lines)
    assert code == 1 and "demo-webhook-secret" in line and "connector up" in line
    secret = tmp_path / "data" / "demo-webhook-secret"
    secret.parent.mkdir(parents=True)
    secret.write_text("whsec_" + "A" * 44)
    port = _free_port()
    code, lines = _run(_env(tmp_path, CONNECTOR_INGRESS_HTTP_PORT=str(port)), "demo", "send")
    line = one_line(lines)
    assert code == 1 and f"127.0.0.1:{port}" in line and "is `connector up` running?" in line
