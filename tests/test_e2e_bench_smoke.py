"""Smoke test of benchmarks/e2e_bench.py: a tiny run of the real pipeline (three service processes
and the load generator process) produces contract rows and passes its exactly-once check.

It measures nothing: the load is 2 connections for about a second, and no figure is asserted
except that it was computed from the deliveries that were actually made.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common, e2e_bench  # noqa: E402


def _args(**kw: object) -> argparse.Namespace:
    base = {"concurrency": 2, "duration": 1.0, "warmup": 0.3, "body_bytes": 256, "rate": 0.0,
            "drain_limit": 30.0, "vacuum_every": 0.0, "upkeep": "auto"}  # fmt: skip
    base.update(kw)
    return argparse.Namespace(**base)


def test_percentile_nearest_rank() -> None:
    assert e2e_bench._pct([], 0.99) == 0.0
    values = [float(i) for i in range(1, 101)]
    assert e2e_bench._pct(values, 0.50) == 51.0
    assert e2e_bench._pct(values, 0.99) == 100.0
    assert e2e_bench._pct(values, 1.0) == 100.0
    assert math.isinf(e2e_bench._pct([1.0, math.inf], 0.99))


@pytest.mark.parametrize(("rate", "vacuum_every", "upkeep"), [(0.0, 0.0, "auto"), (40.0, 0.3, "off")])
def test_tiny_run_produces_contract_rows(db_url: str, rate: float, vacuum_every: float, upkeep: str) -> None:
    args = _args(rate=rate, vacuum_every=vacuum_every, upkeep=upkeep)
    res = e2e_bench.run_once(args, db_url)

    counts = res["counts"]
    accepted = res["load"]["accepted_total"]
    assert accepted > 0
    # one receipt (plus the priming delivery), one event and one succeeded WorkItem per 200 answer
    assert counts["receipts"] == accepted + 1
    assert counts["events"] == counts["work_items"] == counts["succeeded"] == accepted + 1
    assert res["drained"] is True

    f = res["figures"]
    assert f["deliveries_in_window"] > 0
    assert f["unexecuted_after_drain"] == 0
    lat = f["latency_received"]
    assert lat["p50_ms"] is not None and lat["p99_ms"] is not None
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    # executed in the window can never exceed what was accepted in total
    assert 0 < f["executed_per_s"] * f["window_s"] <= accepted + 1
    if rate:
        # open loop: at most rate x (warm-up + window) deliveries were due
        assert accepted <= rate * (args.warmup + args.duration) + 1
        assert res["mode"].startswith("open loop")
    else:
        assert res["mode"] == "closed loop"

    rows = common.validate_rows({"rows": e2e_bench._rows(args, res)})
    keys = {r["key"] for r in rows}
    prefix = "e2e" if not rate else "e2e.open40.vacuum0.3s.upkeep-off"
    expected = {f"{prefix}.deliveries_per_s", f"{prefix}.delivery_p50_ms", f"{prefix}.delivery_p99_ms",
                f"{prefix}.backlog_at_end"}  # fmt: skip
    assert keys == expected
    if not rate:  # the closed-loop rows are the ones the harness expects from this module
        wanted = {e.key for e in common.EXPECTED if e.module == "e2e"}
        assert wanted <= keys
    assert all(r["value"] is not None for r in rows)


def test_backends_are_labelled_by_the_service_that_opened_them(db_url: str) -> None:
    import psycopg

    sampler = e2e_bench.CpuSampler({}, "unused", url=db_url)
    try:
        with (
            psycopg.connect(db_url, application_name="connector-executor-upkeep") as upkeep,
            psycopg.connect(db_url, application_name="connector-ingress") as ingress,
            psycopg.connect(db_url, application_name="psql") as other,
        ):
            pids = [c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (upkeep, ingress, other)]  # type: ignore[index]
            assert [sampler._backend_service(pid) for pid in pids] == ["executor", "ingress", "bench"]
        # control: a pid that is no backend of the database is not attributed to a service
        assert sampler._backend_service(2**22 + 7) == "?"
    finally:
        sampler.stop()
