"""Executor test fixtures: in-process executors and real executor processes."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

# Handlers are named ``tests.executor.effects:...`` (also in child processes): import them under
# that one name so in-process tests and the executor see the same module.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from connector.common.core.settings import DatabaseSettings, ExecutorSettings  # noqa: E402
from connector.executor.service import ExecutorService  # noqa: E402
from tests.executor import effects  # noqa: E402
from tests.executor.helpers import ExecutorProcess  # noqa: E402


@pytest.fixture
def effect_table(db: psycopg.Connection) -> None:
    db.execute(effects.EFFECT_TABLE)


@pytest_asyncio.fixture
async def executor_factory(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Start in-process executors (each its own pool and registration); all stopped at teardown."""
    started: list[ExecutorService] = []
    os.environ["CONNECTOR_DATABASE_URL"] = db_url  # for handlers in tests.executor.effects

    async def start(fair: bool = True, **overrides: Any) -> ExecutorService:
        values: dict[str, Any] = {
            "workers": 4,
            "claim_batch": 16,
            "lease_s": 5.0,
            "poll_interval_s": 0.2,
            "reclaim_interval_s": 0.3,
            "shutdown_grace_s": 2.0,
            "grpc_port": 0,
            "metrics_port": 0,
            "stats_interval_s": 0,
        }
        values.update(overrides)
        svc = ExecutorService(
            DatabaseSettings(),
            ExecutorSettings(**values),
            url=db_url,
            mount_admin=False,
            serve_metrics=False,
            heartbeat_s=0.5,
            fair=fair,
        )
        await svc.start()
        started.append(svc)
        return svc

    try:
        yield start
    finally:
        for svc in reversed(started):
            with contextlib.suppress(Exception):
                await svc.stop()
        os.environ.pop("CONNECTOR_DATABASE_URL", None)


@pytest.fixture
def spawn(db_url: str) -> Iterator[Callable[..., ExecutorProcess]]:
    procs: list[ExecutorProcess] = []

    def start(**kwargs: Any) -> ExecutorProcess:
        p = ExecutorProcess(db_url, **kwargs)
        procs.append(p)
        return p

    try:
        yield start
    finally:
        for p in procs:
            p.stop()
