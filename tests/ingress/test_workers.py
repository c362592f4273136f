"""``connector ingress --workers N|auto``: ``auto`` is the CPUs the container may use — the CPUs the
process may run on, lowered to the cgroup's CPU limit rounded up (v2 ``cpu.max``, v1 quota/period)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from connector.ingress import service
from connector.ingress.supervisor import container_cpus


@pytest.fixture(autouse=True)
def four_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process may run on 4 CPUs (whatever this machine has)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})


def test_no_limit_is_the_cpus_the_process_may_run_on(tmp_path: Path) -> None:
    assert container_cpus(str(tmp_path)) == 4  # no cgroup files at all
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert container_cpus(str(tmp_path)) == 4


@pytest.mark.parametrize(
    ("cpu_max", "cpus"),
    [("50000 100000", 1), ("100000 100000", 1), ("150000 100000", 2), ("200000 100000", 2),
     ("800000 100000", 4)],
)  # fmt: skip
def test_a_cgroup_v2_limit_lowers_it_rounded_up(tmp_path: Path, cpu_max: str, cpus: int) -> None:
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    assert container_cpus(str(tmp_path)) == cpus


@pytest.mark.parametrize(("quota", "cpus"), [(-1, 4), (100000, 1), (250000, 3)])
def test_a_cgroup_v1_quota_lowers_it(tmp_path: Path, quota: int, cpus: int) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert container_cpus(str(tmp_path)) == cpus


def test_workers_option_takes_a_count_or_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    service.add_arguments(parser)
    assert parser.parse_args(["--workers", "3"]).processes == 3
    assert parser.parse_args(["--processes", "2"]).processes == 2  # the first name still works
    from connector.ingress import supervisor

    monkeypatch.setattr(supervisor, "container_cpus", lambda: 6)
    assert parser.parse_args(["--workers", "auto"]).processes == 6
    monkeypatch.setattr(supervisor, "container_cpus", lambda: 128)
    assert parser.parse_args(["--workers", "AUTO"]).processes == 64  # the supervisor's cap
    with pytest.raises(SystemExit):
        parser.parse_args(["--workers", "many"])
