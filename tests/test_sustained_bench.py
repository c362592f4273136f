"""benchmarks/sustained.py (issue #29 item 5): the verdict over the window series, the harness's
``--long`` selection, and a tiny real run of the pipeline that produces the two series.

Nothing here asserts a speed: the tiny run checks that each window's latencies and sizes were read
from the deliveries that were made, before retention deleted them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common, run, sustained  # noqa: E402


def _series(p99_s: list[float], size: list[int], window: float = 10.0) -> tuple[list[dict[str, Any]], dict]:
    windows = [{"i": i, "t0": i * window, "queue_bytes": b} for i, b in enumerate(size)]
    # 100 deliveries per window: 98 at 10 ms, 2 at the window's p99 (nearest rank: the 99th value)
    lat = {i: sorted([0.010] * 98 + [p, p]) for i, p in enumerate(p99_s)}
    return windows, lat


def test_flat_series_passes() -> None:
    windows, lat = _series([0.2] * 12, [100] * 12)
    v = sustained.verdict(windows, lat, n=3, steady_from=20.0)
    assert v["p99_ratio"] == 1.0 and v["size_ratio"] == 1.0 and v["ok"] is True
    assert v["size_windows"] == (2, 4)  # the first windows starting at or after retention's horizon
    assert "verdict PASS" in sustained.verdict_line(v)


def test_p99_growth_fails() -> None:
    # control for the test above: the same series with the last windows' p99 1.3x the first
    windows, lat = _series([0.2] * 9 + [0.26] * 3, [100] * 12)
    v = sustained.verdict(windows, lat, n=3, steady_from=20.0)
    assert v["p99_ratio"] == 1.3 and v["ok"] is False
    assert "verdict FAIL" in sustained.verdict_line(v) and "NO" in sustained.verdict_line(v)


def test_size_growth_fails_but_growth_before_retention_does_not() -> None:
    growing = [10, 50, 100, 100, 100, 100, 100, 100, 100, 110, 120, 130]
    windows, lat = _series([0.2] * 12, growing)
    v = sustained.verdict(windows, lat, n=3, steady_from=20.0)
    assert v["size_ratio"] == 1.3 and v["ok"] is False
    # the growth of the first windows (nothing deleted yet) is not judged
    flat_after = [10, 50] + [100] * 10
    v = sustained.verdict(*_series([0.2] * 12, flat_after), n=3, steady_from=20.0)
    assert v["size_ratio"] == 1.0 and v["ok"] is True


def test_too_short_is_not_judged() -> None:
    windows, lat = _series([0.2] * 5, [100] * 5)
    v = sustained.verdict(windows, lat, n=3, steady_from=0.0)
    assert v["ok"] is None and v["p99_ratio"] is None and v["size_ratio"] is None
    assert "NOT JUDGED" in sustained.verdict_line(v) and "needs 6" in sustained.verdict_line(v)


def test_long_runs_only_with_long() -> None:
    assert run.BY_NAME["sustained"].long
    assert all(not b.long for b in run.BENCHES if b.name != "sustained")
    assert {e.key for e in common.EXPECTED if e.module == "sustained"} == {
        "sustained.p99_ratio",
        "sustained.size_ratio",
    }


def test_tiny_run_reads_both_series(db_url: str) -> None:
    args = argparse.Namespace(
        duration=14.0, window=2.0, fraction=0.5, max_rate=60.0, probe=0.0, verdict_windows=2,
        retention_s=8.0, concurrency=2, body_bytes=256,
    )  # fmt: skip
    res = sustained.run(args, db_url)

    windows = res["windows"]
    assert [w["i"] for w in windows] == [0, 1, 2, 3, 4, 5, 6]
    assert res["rate"] == 30.0 and res["probe"]["given"]
    received = sum(w["received"] for w in windows)
    # every delivery of the load falls in one window (the last may be answered after the last bound)
    assert 0 < received <= res["load"]["accepted_total"] <= 30.0 * 14.0 + 1
    # retention is on: receipts older than 8 s are deleted by sweeps every 2 s, seen in the series
    deleted = [w["retention_deleted_per_s"] for w in windows]
    assert all(d is not None and d >= 0 for d in deleted) and sum(deleted) > 0
    for w in windows:
        assert w["received"] > 0 and w["late"] == 0
        assert 0 < w["p50_ms"] <= w["p99_ms"]
        assert w["queue_bytes"] == sum(v["table"] + v["index"] for k, v in w["sizes"].items() if k != "other")
        assert w["sizes"]["receipt"]["table"] > 0 and w["sizes"]["work_item"]["index"] > 0
        assert w["cpu_us_per_delivery"]["executor"] is not None
    assert res["dead_work_items"] == 0 and res["failed_receipts"] == 0
    assert res["verdict"]["p99_ratio"] is not None  # 7 windows: two groups of 2
    rows = common.validate_rows({"rows": sustained._rows(args, res)})
    assert {r["key"] for r in rows} == {
        "sustained.p99_ratio",
        "sustained.size_ratio",
        "sustained.deliveries_per_s",
    }
