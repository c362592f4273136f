"""Helpers of the executor tests: polling for observable states, real executor processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
CONNECTOR = ROOT / ".venv" / "bin" / "connector"


def wait_for(
    predicate: Callable[[], Any], timeout: float = 20.0, what: str = "", interval: float = 0.05
) -> Any:
    """Poll an observable condition (a database state, a counter) until true."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


async def await_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(0.01)


def states(db: psycopg.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT state, count(*) FROM connector_work_item GROUP BY 1").fetchall())


def kill_9(
    db: psycopg.Connection, proc: ExecutorProcess, what: str = "the killed process's sessions gone"
) -> None:
    """SIGKILL ``proc`` and wait until every database session it had is gone (a statement it sent
    just before dying still completes on the server, so only then is its state final)."""
    import psutil

    ports = {
        c.laddr.port
        for c in psutil.Process(proc.pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == db.info.port
    }
    proc.signal(signal.SIGKILL)
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(%s)", (list(ports),)
            ).fetchone()[0]
            == 0
        ),
        10,
        what,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_holder(
    db: psycopg.Connection,
    spawn: Callable[..., ExecutorProcess],
    holder: ExecutorProcess,
    holder_id: str,
    key_column: str,
    at_least: int,
    env: dict[str, str],
) -> tuple[ExecutorProcess, list[int]]:
    """The kill -9 hand-over of the flow proofs: wait until ``holder`` (started with
    ``EXECUTOR_TEST_HOLD_AFTER``) holds at least ``at_least`` processing items whose ``key_column``
    is set, start a second executor with ``env``, kill the holder (its sessions gone) and return the
    second executor and the holder's orphans (its processing items with a key), in work id order."""
    held = (
        f"SELECT work_id FROM connector_work_item WHERE state = 'processing' AND lease_owner = %s"
        f" AND {key_column} IS NOT NULL ORDER BY work_id"
    )
    wait_for(
        lambda: len(db.execute(held, (holder_id,)).fetchall()) >= at_least,
        30,
        f"the holder holds items with a {key_column}",
    )
    taker = spawn(extra_env=env)
    taker.wait_registered(db)
    kill_9(db, holder, "the holder's sessions gone")
    return taker, [int(r[0]) for r in db.execute(held, (holder_id,)).fetchall()]


class ExecutorProcess:
    """A ``connector executor`` child process with its own metrics port."""

    def __init__(self, db_url: str, *, extra_env: dict[str, str] | None = None, admin: bool = False) -> None:
        self.db_url = db_url
        self.metrics_port = free_port()
        env = {
            **os.environ,
            "CONNECTOR_DATABASE_URL": db_url,
            "CONNECTOR_EXECUTOR_WORKERS": "16",
            "CONNECTOR_EXECUTOR_CLAIM_BATCH": "32",
            "CONNECTOR_EXECUTOR_LEASE_S": "3",
            "CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.2",
            "CONNECTOR_EXECUTOR_RECLAIM_INTERVAL_S": "0.5",
            "CONNECTOR_EXECUTOR_SHUTDOWN_GRACE_S": "2",
            "CONNECTOR_EXECUTOR_GRPC_PORT": "0",
            "CONNECTOR_EXECUTOR_METRICS_PORT": str(self.metrics_port),
            "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "0",
            "CONNECTOR_LOG_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
            ),
        }
        env.update(extra_env or {})
        args = [str(CONNECTOR), "executor"]
        if not admin:
            args.append("--no-admin")
        self.stderr_path = Path(f"/tmp/executor-test-{os.getpid()}-{self.metrics_port}.log")
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=self._stderr, cwd=ROOT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_registered(self, db: psycopg.Connection, timeout: float = 30.0) -> str:
        def registered() -> Any:
            if self.proc.poll() is not None:
                raise AssertionError(f"executor exited early ({self.proc.returncode}): {self.log_tail()}")
            row = db.execute(
                "SELECT process_id FROM connector_process WHERE pid = %s AND service = 'executor'",
                (self.pid,),
            ).fetchone()
            return row[0] if row else None

        return str(wait_for(registered, timeout, "executor registration"))

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of a metric's samples (matching ``labels``) from the process's /metrics endpoint."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric_name, _, label_text = head.partition("{")
            if metric_name != name:
                continue
            if labels and not all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                continue
            total += float(value)
        return total

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def log_tail(self) -> str:
        self._stderr.flush()
        try:
            return self.stderr_path.read_text()[-2000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()
        with contextlib.suppress(OSError):
            self.stderr_path.unlink()
        return int(self.proc.returncode)
