"""GetFigures over stored rollups (the rows the figures jobs and the leader's sampler write).

Proved: dense series (60 one-minute / 288 five-minute points, oldest first, the cluster then packs
by id, every installed pack even without rows), counts at their periods, quantiles from the sealed
values of a closed period equal the ones computed from its histogram (control: the same period
unsealed gives the same quantiles), ``current`` merges the previous and the current minute with
the newest gauges, ``current_only`` sends no points, the pack filter, and every bad input answered
INVALID_ARGUMENT / NOT_FOUND / PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from connector.common.core import figures as core
from connector.common.maintenance.figures import FiguresConfig, FiguresJob
from connector.common.store import figures as store
from connector.common.store.figures import FlushRow, GaugeRow
from connector.v1 import admin_service_pb2 as pb

from .conftest import REPLAY, VIEW, Admin, Seed, expect_error


def _hist(values: list[float]) -> list[int]:
    rec = core.Recorder()
    for v in values:
        rec.acked(1, v)
    return core.trimmed(rec.take()[1].ack)


def _row(step: int, pack: int, start: float, accepted: int, succeeded: int, hist: list[int]) -> FlushRow:
    return FlushRow(step, pack, start, (accepted, 1, 2, 3, succeeded, 4, 5), (hist, hist, []))


def _s(d: Any) -> float:
    return float(d.seconds + d.nanos / 1e9)


async def _seed(seed: Seed) -> tuple[int, int, float, list[int]]:
    """Two packs; pack A has figures 5 minutes ago (closed) and now, plus a gauge sample."""
    a = await seed.pack("alpha", routes={"orders": ["sync"]})
    b = await seed.pack("beta", routes={"orders": ["sync"]})
    now = float(await seed.one("SELECT extract(epoch FROM now())::float8"))
    minute = math.floor(now / 60) * 60
    hist = _hist([0.002] * 90 + [0.4] * 10)
    rows = [
        _row(60, a, minute - 300, 100, 90, hist),
        _row(60, 0, minute - 300, 100, 90, hist),
        _row(60, a, minute, 7, 6, hist),
        _row(60, 0, minute, 9, 6, hist),  # 2 refusals of no installed route: the cluster only
        _row(300, a, math.floor(now / 300) * 300, 107, 96, hist),
        _row(300, 0, math.floor(now / 300) * 300, 109, 96, hist),
    ]
    await store.figures_flush(seed.conn, rows)
    await store.figures_sample(
        seed.conn,
        [
            GaugeRow(a, backlog=12, in_flight=3, oldest_ready_s=4.5, open_circuits=1, pauses=0),
            GaugeRow(
                0, 12, 3, 4.5, 1, 0, executors=2, ingress_processes=3, unrouted=5, oldest_unrouted_s=1.0
            ),
        ],
    )
    return a, b, minute, hist


async def test_hour_series(admin: Admin, seed: Seed) -> None:
    a, b, minute, hist = await _seed(seed)
    job = FiguresJob("postgresql://unused", "executor", core.Recorder(), FiguresConfig(flush_s=1, lead=True))
    assert await job.seal(seed.conn) >= 2  # the closed minute of the cluster and of alpha
    r = await admin.stub.GetFigures(pb.GetFiguresRequest(), metadata=Admin.md(VIEW))
    assert r.window == pb.FIGURES_WINDOW_HOUR and _s(r.step) == 60
    assert [(s.installed_pack_id, s.pack_name) for s in r.series] == [(0, ""), (a, "alpha"), (b, "beta")]
    end = r.end_time.seconds + r.end_time.nanos / 1e9
    current_minute = math.floor(end / 60) * 60
    for s in r.series:
        assert len(s.points) == 60
        starts = [p.start_time.seconds for p in s.points]
        assert starts == [current_minute - 60 * (59 - i) for i in range(60)]
        assert all(p.seconds == 60 for p in s.points[:-1]) and 0 <= s.points[-1].seconds <= 60
    alpha = {p.start_time.seconds: p for p in r.series[1].points}
    closed = alpha[minute - 300]
    assert (closed.accepted, closed.duplicates, closed.rejected, closed.unavailable) == (100, 1, 2, 3)
    assert (closed.succeeded, closed.failed, closed.executed, closed.dead_lettered) == (90, 4, 94, 5)
    want = core.Quantiles.of(hist)
    assert want is not None
    for q in (closed.ack_latency, closed.delivery_latency):
        assert q.count == 100
        assert _s(q.p50) == pytest.approx(want.p50, abs=1e-6) and _s(q.p99) == pytest.approx(
            want.p99, abs=1e-6
        )
    assert 0.0015 < _s(closed.ack_latency.p50) <= 0.002 and 0.3 < _s(closed.ack_latency.p99) <= 0.5
    assert not closed.HasField("scheduling_delay") and not closed.HasField("gauges")
    quiet = alpha[minute - 600]
    assert (quiet.accepted, quiet.executed, quiet.HasField("ack_latency")) == (0, 0, False)
    assert all(p.accepted == 0 for p in r.series[2].points)  # beta: installed, no figures
    if current_minute == minute:  # (the minute did not roll over since the seeding)
        current = r.series[1].current
        assert current.start_time.seconds == minute - 60
        assert (current.accepted, current.succeeded) == (7, 6)
        assert current.gauges.backlog == 12 and _s(current.gauges.oldest_ready_age) == 4.5
        assert current.gauges.open_circuits == 1 and current.gauges.active_executors == 0
        cluster = r.series[0].current
        assert cluster.accepted == 9
        g = cluster.gauges
        assert (g.active_executors, g.ingress_processes, g.receipts_unrouted) == (2, 3, 5)


async def test_unsealed_quantiles_equal_the_sealed_ones(admin: Admin, seed: Seed) -> None:
    """Control for the sealed path: the same closed period read from its histogram."""
    minute = (await _seed(seed))[2]
    unsealed = await admin.stub.GetFigures(pb.GetFiguresRequest(), metadata=Admin.md(VIEW))
    job = FiguresJob("postgresql://unused", "executor", core.Recorder(), FiguresConfig(flush_s=1, lead=True))
    assert await job.seal(seed.conn) >= 2
    sealed = await admin.stub.GetFigures(pb.GetFiguresRequest(), metadata=Admin.md(VIEW))

    def closed(r: pb.GetFiguresResponse) -> pb.FiguresPoint:
        return next(p for p in r.series[1].points if p.start_time.seconds == minute - 300)

    assert closed(unsealed).ack_latency == closed(sealed).ack_latency
    assert closed(unsealed).ack_latency.count == 100


async def test_day_window_current_only_and_filter(admin: Admin, seed: Seed) -> None:
    a = (await _seed(seed))[0]
    day = await admin.stub.GetFigures(
        pb.GetFiguresRequest(window=pb.FIGURES_WINDOW_DAY, installed_pack_ids=[a]), metadata=Admin.md(VIEW)
    )
    assert _s(day.step) == 300 and [s.installed_pack_id for s in day.series] == [0, a]
    assert all(len(s.points) == 288 for s in day.series)
    assert day.series[1].points[-1].accepted in (0, 107)  # 0 if the five minutes rolled over
    assert day.series[1].points[-1].accepted + day.series[1].points[-2].accepted == 107
    alone = await admin.stub.GetFigures(pb.GetFiguresRequest(installed_pack_ids=[0]), metadata=Admin.md(VIEW))
    assert [s.installed_pack_id for s in alone.series] == [0] and len(alone.series[0].points) == 60
    # packs_only: the pack alone, its points the same as with the cluster (the console's pack view)
    pack_alone = await admin.stub.GetFigures(
        pb.GetFiguresRequest(window=pb.FIGURES_WINDOW_DAY, installed_pack_ids=[a], packs_only=True),
        metadata=Admin.md(VIEW),
    )
    assert [s.installed_pack_id for s in pack_alone.series] == [a]
    accepted = [sum(p.accepted for p in s.points) for s in (pack_alone.series[0], day.series[1])]
    assert accepted[0] == accepted[1]
    both = await admin.stub.GetFigures(
        pb.GetFiguresRequest(installed_pack_ids=[0, a], packs_only=True), metadata=Admin.md(VIEW)
    )
    assert [s.installed_pack_id for s in both.series] == [0, a]  # 0 named: the cluster stays
    top = await admin.stub.GetFigures(pb.GetFiguresRequest(current_only=True), metadata=Admin.md(VIEW))
    assert all(len(s.points) == 0 for s in top.series) and len(top.series) == 3
    assert top.series[0].current.seconds > 0


async def test_bad_requests(admin: Admin, seed: Seed) -> None:
    await seed.pack("alpha")
    md = Admin.md(VIEW)
    cases: list[tuple[pb.GetFiguresRequest, grpc.StatusCode, str | None]] = [
        (pb.GetFiguresRequest(window=9), grpc.StatusCode.INVALID_ARGUMENT, None),  # type: ignore[arg-type]
        (pb.GetFiguresRequest(installed_pack_ids=[-1]), grpc.StatusCode.INVALID_ARGUMENT, None),
        (
            pb.GetFiguresRequest(installed_pack_ids=list(range(1, 102))),
            grpc.StatusCode.INVALID_ARGUMENT,
            None,
        ),
        (pb.GetFiguresRequest(installed_pack_ids=[999]), grpc.StatusCode.NOT_FOUND, "PACK_NOT_FOUND"),
    ]
    for request, code, reason in cases:
        await expect_error(admin.stub.GetFigures(request, metadata=md), code, reason)
    await expect_error(
        admin.stub.GetFigures(pb.GetFiguresRequest(), metadata=Admin.md(REPLAY)),
        grpc.StatusCode.PERMISSION_DENIED,
        "ROLE_REQUIRED",
    )
    await expect_error(admin.stub.GetFigures(pb.GetFiguresRequest()), grpc.StatusCode.UNAUTHENTICATED)


async def _cli(admin: Admin, *args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "CONNECTOR_ADMIN_TOKEN": VIEW}
    return await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("connector")), "admin", "top", "--address",
        f"127.0.0.1:{admin.port}", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def test_top_refreshes_until_interrupted(admin: Admin, seed: Seed) -> None:
    """Piped (not a terminal), ``top`` prints one frame per refresh until Ctrl-C (SIGINT): no
    traceback, exit 130 like every interrupted admin command; usage errors are one line, exit 2;
    an unknown pack one line, exit 1."""
    await _seed(seed)
    proc = await _cli(admin, "--interval", "0.5")
    assert proc.stdout is not None
    frames = 0
    out: list[str] = []
    while frames < 3:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line, "top ended early"
        out.append(line)
        frames += line.startswith("connector top ")
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 130 and b"Traceback" not in err, err
    text = "".join(out)
    assert "TOTAL" in text and "alpha (" in text and "beta (" in text
    for args, code, says in (
        (("--interval", "0.1", "--once"), 2, "--interval must be at least 0.5 seconds"),
        (("--pack", "999", "--once"), 1, "PACK_NOT_FOUND"),
    ):
        proc = await _cli(admin, *args)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        lines = err.decode().strip().splitlines()
        assert proc.returncode == code and len(lines) == 1 and says in lines[0], (args, err)
