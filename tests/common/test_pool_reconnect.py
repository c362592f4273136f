"""A pool that lost its server tries again every few seconds, not after a doubling wait (issue #26,
found by `./dev smoke --ha`: after a Patroni promotion of ~18 s the ingress served again only 53 s
later, psycopg_pool's next attempt being 32 s away).

The pool's own reconnect path runs for real against a closed port on loopback (libpq's connect is
refused at once): each failed attempt schedules the next (psycopg_pool's ``AddConnection`` with the
same attempt object), and the test records the delays instead of sleeping them. With
``CONNECTOR_DB_RECONNECT_MAX_DELAY_S`` (default 2) no delay exceeds 2 s; the control (0: psycopg_pool's
own backoff) doubles to 32 s within six attempts. Nothing here depends on speed.
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

import pytest

from connector.common.core import db
from connector.common.core.settings import DatabaseSettings, load


class RecordingPool(db.Pool):
    """The service pool, with the maintenance tasks it schedules recorded instead of run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scheduled: list[tuple[Any, float]] = []

    async def schedule_task(self, task: Any, delay: float) -> None:
        self.scheduled.append((task, delay))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def reconnect_delays(max_delay_s: float, attempts: int = 7) -> list[float]:
    pool = RecordingPool(
        f"host=127.0.0.1 port={closed_port()} user=nobody dbname=nothing connect_timeout=2",
        service="test",
        reconnect_max_delay_s=max_delay_s,
        min_size=1,
        reconnect_timeout=300,
        open=False,
    )
    delays, attempt = [], None
    for _ in range(attempts):
        await pool._add_connection(attempt)  # one real, refused connect
        task, delay = pool.scheduled[-1]
        delays.append(delay)
        attempt = task.attempt
    return delays


async def test_the_wait_between_reconnect_attempts_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONNECTOR_DB_RECONNECT_MAX_DELAY_S", raising=False)
    cap = load(DatabaseSettings).db_reconnect_max_delay_s
    assert cap == 2.0
    delays = await reconnect_delays(cap)
    assert len(delays) == 7 and all(0 < d <= cap for d in delays), delays
    assert delays[-1] == cap  # it keeps trying every 2 s (psycopg_pool's give-up after 300 s stays)


async def test_control_without_the_cap_the_wait_doubles() -> None:
    delays = await reconnect_delays(0.0)
    # psycopg_pool's own schedule: ~1 s (+-10 %), then doubling.
    assert delays[-1] > 30, delays
    assert all(b > a for a, b in itertools.pairwise(delays)), delays


def test_the_setting_reaches_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONNECTOR_DB_RECONNECT_MAX_DELAY_S", "0.5")
    assert load(DatabaseSettings).db_reconnect_max_delay_s == 0.5
    source = db.open_pool.__code__.co_names
    assert "db_reconnect_max_delay_s" in source
