"""The ``connector ingress`` process settles its heap once serving (``service.settle_heap``): what is
alive then is frozen out of the cyclic collector's view and the first threshold is raised, so the
deliveries' short-lived objects stop setting off collections (docs/benchmarks.md, "Ingress CPU per
ack"). Only the command does it: a host process that embeds the service keeps its own settings."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from connector.ingress import service


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_settle_heap_freezes_what_is_alive_and_raises_the_first_threshold(restored_gc: None) -> None:
    gc.unfreeze()
    alive = [object() for _ in range(10)]  # noqa: F841 (kept alive across the call)
    assert gc.get_freeze_count() == 0
    service.settle_heap()
    assert gc.get_freeze_count() > 1000  # the imported libraries, at least
    assert gc.get_threshold()[0] == service.GC_GEN0_THRESHOLD
    # Later objects are still collected: a cycle made now is found by a collection.
    before = gc.get_count()[0]
    cycle: list[Any] = []
    cycle.append(cycle)
    assert gc.get_count()[0] >= before
    del cycle
    assert gc.collect() >= 1


def test_the_command_settles_the_heap_once_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cli`` runs ``settle_heap`` (then the supervisor's ready report) after the service started;
    the service class itself never touches the collector."""
    calls: list[str] = []
    monkeypatch.setattr(service, "settle_heap", lambda: calls.append("settle"))
    from connector.ingress import supervisor

    monkeypatch.setattr(supervisor, "report_ready", lambda: calls.append("ready"))

    async def fake_run_until_signal(services: Any, *, on_started: Any) -> None:
        assert calls == []  # nothing before the services started
        on_started()

    monkeypatch.setattr(service.runtime, "run_until_signal", fake_run_until_signal)
    monkeypatch.setattr(service.logs, "setup", lambda name: None)
    monkeypatch.setenv("CONNECTOR_DATABASE_URL", "postgresql://127.0.0.1:1/none")
    assert service.cli(argparse.Namespace()) == 0
    assert calls == ["settle", "ready"]
