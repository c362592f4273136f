"""The figures' recorder, quantiles and statements (docs/metrics.md "Figures without Prometheus").

Proved: quantiles from the fixed buckets stay within 15 % of the exact ones on skewed samples;
concurrent flushes from several connections add up exactly (counts and element-wise histograms of
different lengths) — control: the same flushes through a statement that overwrites instead of
adding lose counts; a closed period is sealed once with the quantiles of its histograms, a late
flush unseals it and a seal computed before a flush is not written; retention deletes only rows
past it; a failed flush keeps its rows for the next one; the reads the admin API and the leader
run are index scans of the primary key at a realistic size (EXPLAIN).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from bisect import bisect_left
from typing import Any

import psycopg
import pytest

from connector.common.core import figures as core
from connector.common.maintenance.figures import FiguresConfig, FiguresJob
from connector.common.store import figures as store
from connector.common.store.figures import COUNTS, HISTOGRAMS, FlushRow
from tests.plans import plan_nodes


def _hist(values: list[float]) -> list[int]:
    h = [0] * core.BUCKETS
    for v in values:
        h[bisect_left(core.BOUNDS_S, v)] += 1
    return h


def test_quantiles_are_close_to_the_exact_ones() -> None:
    rnd = random.Random(7)
    worst = 0.0
    for mu, sigma in ((-6, 0.5), (-5, 1.0), (-3, 1.5), (0, 1.0), (2, 0.3), (-7, 0.2)):
        values = sorted(rnd.lognormvariate(mu, sigma) for _ in range(20_000))
        h = _hist(values)
        for q in (0.5, 0.95, 0.99):
            exact = values[int(q * len(values))]
            got = core.quantile(h, q)
            assert got is not None
            worst = max(worst, abs(got / exact - 1))
    assert worst < 0.15, worst
    assert core.quantile([0] * core.BUCKETS, 0.5) is None
    assert core.Quantiles.of([]) is None
    # Everything above the last bound answers that bound (the open bucket has no upper end).
    assert core.quantile(_hist([10_000.0] * 3), 0.99) == core.BOUNDS_S[-1]


def test_bounds_and_helpers() -> None:
    b = core.BOUNDS_S
    assert b[0] == 0.0005 and b[-1] == 3600.0 and list(b) == sorted(set(b)) and core.BUCKETS == len(b) + 1
    assert core.trimmed([1, 0, 2, 0, 0]) == [1, 0, 2] and core.trimmed([0, 0]) == []
    assert core.merged([[1, 2], None, [0, 0, 3], []]) == [1, 2, 3]
    rec = core.Recorder()
    rec.answered(3, core.ACCEPTED)
    rec.answered(core.CLUSTER, core.REJECTED)  # a path that is no installed route
    rec.acked(3, 0.002)
    rec.executed(3, "succeeded", 0.5, 0.01)
    rec.executed(4, "dead", None, 0.02)
    rec.dead_lettered(4)
    packs = core.with_cluster(rec.take())
    assert rec.take() == {}
    assert packs[3].counts() == (1, 0, 0, 0, 1, 0, 0)
    assert packs[4].counts() == (0, 0, 0, 0, 0, 1, 2)
    assert packs[core.CLUSTER].counts() == (1, 0, 1, 0, 1, 1, 2)  # the sum, with the unrouted refusal
    assert sum(packs[core.CLUSTER].histograms()[2]) == 2


def _row(step: int, pack: int, start: float, n: int, hist: list[int]) -> FlushRow:
    return FlushRow(step, pack, start, (n, 0, 0, 0, n, 0, 0), (hist, [], hist))


async def _stored(conn: psycopg.AsyncConnection[Any]) -> dict[tuple[int, int], tuple[Any, ...]]:
    cur = await conn.execute(
        "SELECT step_s, installed_pack_id, accepted, succeeded, ack_hist, delay_hist, flushes, quantiles"
        " FROM connector_figures"
    )
    return {(r[0], r[1]): r[2:] for r in await cur.fetchall()}


async def _concurrent_flushes(url: str, start: float) -> dict[tuple[int, int], tuple[Any, ...]]:
    """Four connections, 25 flushes each, of three packs with histograms of different lengths."""

    async def one(k: int) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for i in range(25):
                rows = [
                    _row(
                        step,
                        pack,
                        math.floor(start / step) * step,
                        1 + (i + k) % 3,
                        [1] * (1 + (i + pack) % 5),
                    )
                    for step in store.STEPS
                    for pack in (0, 1, 2)
                ]
                await store.figures_flush(conn, rows)

    await asyncio.gather(*(one(k) for k in range(4)))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await _stored(conn)


def _expected() -> dict[int, tuple[int, list[int]]]:
    out: dict[int, tuple[int, list[int]]] = {}
    for pack in (0, 1, 2):
        n, hist = 0, [0] * 5
        for k in range(4):
            for i in range(25):
                n += 1 + (i + k) % 3
                for j in range(1 + (i + pack) % 5):
                    hist[j] += 1
        out[pack] = (n, hist)
    return out


async def test_concurrent_flushes_add_up(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.time()
    stored = await _concurrent_flushes(db_url, start)
    for (step, pack), (accepted, succeeded, ack, delay, flushes, quantiles) in stored.items():
        n, hist = _expected()[pack]
        assert (accepted, succeeded, flushes, quantiles) == (n, n, 100, None), (step, pack)
        assert list(ack) == hist and list(delay) == hist
    assert len(stored) == 6
    # Control: a flush that overwrites instead of adding keeps only the last flush's figures.
    monkeypatch.setattr(
        store,
        "FIGURES_FLUSH",
        store.FIGURES_FLUSH.replace(
            "accepted = t.accepted + excluded.accepted", "accepted = excluded.accepted"
        ),
    )
    await (await psycopg.AsyncConnection.connect(db_url, autocommit=True)).execute(
        "DELETE FROM connector_figures"
    )
    stored = await _concurrent_flushes(db_url, start)
    assert any(accepted != _expected()[pack][0] for (_, pack), (accepted, *_) in stored.items())


async def test_seal_unseal_and_retire(adb: psycopg.AsyncConnection[Any]) -> None:
    now = time.time()
    old_minute = math.floor(now / 60) * 60 - 600  # closed ten minutes ago
    hist = _hist([0.001] * 50 + [0.2] * 50)
    await store.figures_flush(
        adb, [_row(60, 0, old_minute, 100, hist), _row(60, 0, math.floor(now / 60) * 60, 5, hist)]
    )
    job = FiguresJob(
        "postgresql://unused", "executor", core.Recorder(), FiguresConfig(flush_s=1.0, lead=True)
    )
    assert await job.seal(adb) == 1  # the open minute is not sealed
    cur = await adb.execute(
        "SELECT quantiles FROM connector_figures WHERE start = to_timestamp(%s)", (old_minute,)
    )
    (q,) = await cur.fetchone()  # type: ignore[misc]
    assert q == pytest.approx(core.sealed((hist, [], hist)))
    assert q[3] == 100 and q[7] == 0 and 0.0007 < q[0] <= 0.2  # count of ack; delivery empty; p50
    # A late flush into the sealed period unseals it; the next round seals it again with it.
    await store.figures_flush(adb, [_row(60, 0, old_minute, 1, [0, 0, 1])])
    cur = await adb.execute(
        "SELECT quantiles, flushes FROM connector_figures WHERE start = to_timestamp(%s)", (old_minute,)
    )
    assert await cur.fetchone() == (None, 2)
    unsealed = await store.figures_unsealed(adb, grace_s=5, horizon_s=3600, limit=10)
    assert [r.start_s for r in unsealed] == [old_minute]
    await store.figures_flush(adb, [_row(60, 0, old_minute, 1, [1])])  # between the read and the seal
    assert await store.figures_seal(adb, [(unsealed[0], [1.0] * 12)]) == 0  # stale: not written
    assert await job.seal(adb) == 1
    # Retention: only rows older than what each step keeps.
    await store.figures_flush(adb, [_row(300, 1, math.floor(now / 300) * 300 - 3 * 86400, 1, [])])
    deleted = await store.figures_retire(adb, {60: 300.0, 300: 86400.0})
    assert deleted == 2
    left = await _stored(adb)
    assert set(left) == {(60, 0)} and left[(60, 0)][0] == 5  # the open minute stays


async def test_a_failed_flush_keeps_its_rows(db_url: str) -> None:
    rec = core.Recorder()
    job = FiguresJob(
        "postgresql://127.0.0.1:1/nowhere?connect_timeout=1", "ingress", rec, FiguresConfig(flush_s=1.0)
    )
    rec.answered(7, core.ACCEPTED)
    rec.acked(7, 0.003)
    with pytest.raises(psycopg.OperationalError):
        await job.flush()
    rec.answered(7, core.ACCEPTED)  # recorded after the failure: goes with the next flush
    job.url = db_url
    await job.close()
    assert await job.flush() > 0
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT step_s, installed_pack_id, sum(accepted), sum(cardinality(ack_hist))::int > 0"
            " FROM connector_figures GROUP BY 1, 2 ORDER BY 1, 2"
        )
        rows = await cur.fetchall()
    assert rows == [(60, 0, 2, True), (60, 7, 2, True), (300, 0, 2, True), (300, 7, 2, True)]
    await job.close()


async def test_reads_are_index_scans(adb: psycopg.AsyncConnection[Any]) -> None:
    """20 packs, 6 h of minute rows and 7 days of five-minute rows (what the retention keeps)."""
    await adb.execute(
        "INSERT INTO connector_installed_pack (name, namespace)"
        " SELECT 'p' || g, 'ns' || g FROM generate_series(1, 20) g"
    )
    await adb.execute(
        f"""INSERT INTO connector_figures (step_s, installed_pack_id, start, {", ".join(COUNTS)},
                                            {", ".join(HISTOGRAMS)}, flushes, quantiles)
        SELECT s.step, p.id, to_timestamp(floor(extract(epoch FROM now()) / s.step) * s.step - i * s.step),
               {", ".join("10" for _ in COUNTS)}, {", ".join("'{1,2,3}'" for _ in HISTOGRAMS)}, 1,
               '{{1,1,1,1,1,1,1,1,1,1,1,1}}'
        FROM (VALUES (60, 360), (300, 2016)) s(step, n)
        CROSS JOIN generate_series(0, 20) p(id) CROSS JOIN LATERAL generate_series(1, s.n) i"""
    )
    await adb.execute("ANALYZE connector_figures")
    await adb.execute("ANALYZE connector_installed_pack")
    await adb.execute("SET jit = off")
    reads = {
        "hour": (store.FIGURES_READ, {"step_s": 60, "span_s": 3600.0, "packs": [], "current_only": False}),
        "day": (store.FIGURES_READ, {"step_s": 300, "span_s": 86400.0, "packs": [], "current_only": False}),
        "top": (store.FIGURES_READ, {"step_s": 60, "span_s": 3600.0, "packs": [], "current_only": True}),
        "one pack": (
            store.FIGURES_READ,
            {"step_s": 300, "span_s": 86400.0, "packs": [3], "current_only": False},
        ),
        "unsealed": (store.FIGURES_UNSEALED, {"grace_s": 25.0, "horizon_s": 3600.0, "limit": 2000}),
        "retire": (store.FIGURES_RETIRE, {"step_s": 60, "keep_s": 21600.0}),
    }
    for name, (statement, params) in reads.items():
        cur = await adb.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        (plan,) = await cur.fetchone()  # type: ignore[misc]
        nodes = list(plan_nodes(plan[0]["Plan"]))
        scans = [n for n in nodes if n.get("Relation Name") == "connector_figures"]
        assert scans, name
        kinds = {n["Node Type"] for n in scans} - {"ModifyTable"}
        assert kinds and kinds <= {"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}, (name, kinds)
        assert plan[0]["Plan"]["Total Cost"] < 100_000, name  # far from jit_above_cost
