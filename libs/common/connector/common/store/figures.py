"""Every statement on ``connector_figures`` (docs/metrics.md "Figures without Prometheus"): the
per-period rollups of the cluster's throughput and latency.

* ``figures_flush`` — every ingress and executor process, once per flush interval: its counts and
  histograms since the last flush, added to the rows of their periods (60 s and 300 s) and packs
  (0: the cluster). One statement, rows in key order (concurrent flushes lock rows in one order).
  Additive, so the processes' flushes commute; a histogram adds up element-wise (arrays of any
  length). A flush clears the row's ``quantiles`` (a late flush into a sealed period unseals it).
* ``figures_sample`` — the executor whose stats sampler leads (the figures lock): the sampled
  gauges into the current 60 s row (the newest sample) and 300 s row (the largest sample; active
  executors and ingress replicas the smallest).
* ``figures_unsealed`` / ``figures_seal`` — the leader, once a period closed: its quantiles from
  its histograms, written only if no flush came in between (``flushes`` unchanged).
* ``figures_retire`` — the leader: rows older than the retention.
* ``figures_read`` — the admin API (GetFigures): one statement for every series of a window, a
  LATERAL descent of the primary key per pack; histograms only of rows not sealed and of the last
  two minutes (what ``current`` merges).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.schema import FIGURES_COUNTS

Conn = AsyncConnection[Any]

#: The periods (seconds) rows are kept for: minutes (the hour view) and five minutes (the day view).
MINUTE = 60
FIVE_MINUTES = 300
STEPS = (MINUTE, FIVE_MINUTES)

COUNTS = FIGURES_COUNTS
HISTOGRAMS = ("ack_hist", "delivery_hist", "delay_hist")
GAUGES = (
    "backlog", "in_flight", "oldest_ready_s", "open_circuits", "pauses", "executors",
    "ingress_processes", "unrouted", "oldest_unrouted_s",
)  # fmt: skip
#: Gauges whose 300 s value is the smallest sample (a dip in capacity), not the largest.
_SMALLEST = ("executors", "ingress_processes")


def _added(column: str) -> str:
    """``column`` of the stored row plus the flushed one, element-wise (missing elements are 0)."""
    return (
        f"ARRAY(SELECT coalesce(u.a, 0) + coalesce(u.b, 0) FROM unnest(t.{column}, excluded.{column})"
        " WITH ORDINALITY AS u(a, b, i) ORDER BY u.i)"
    )


_FLUSH_INPUT = (
    ("step_s", "int2"), ("pack", "int8"), ("start_s", "float8"),
    *((c, "int8") for c in COUNTS), *((h, "text") for h in HISTOGRAMS),
)  # fmt: skip
FIGURES_FLUSH = f"""
WITH w AS (
  INSERT INTO connector_figures AS t (step_s, installed_pack_id, start, {", ".join(COUNTS)},
                                      {", ".join(HISTOGRAMS)}, flushes, flushed_at)
  SELECT x.step_s, x.pack, to_timestamp(x.start_s), {", ".join("x." + c for c in COUNTS)},
         {", ".join(f"x.{h}::int8[]" for h in HISTOGRAMS)}, 1, clock_timestamp()
  FROM unnest({", ".join(f"%({c})s::{t}[]" for c, t in _FLUSH_INPUT)})
    AS x({", ".join(c for c, _ in _FLUSH_INPUT)})
  ORDER BY 1, 2, 3
  ON CONFLICT (step_s, installed_pack_id, start) DO UPDATE SET
    {", ".join(f"{c} = t.{c} + excluded.{c}" for c in COUNTS)},
    {", ".join(f"{h} = {_added(h)}" for h in HISTOGRAMS)},
    flushes = t.flushes + 1, quantiles = NULL, flushed_at = greatest(t.flushed_at, excluded.flushed_at)
  RETURNING 1
)
SELECT count(*), extract(epoch FROM clock_timestamp())::float8 FROM w
"""


@dataclass(frozen=True, slots=True)
class FlushRow:
    """One process's figures of one pack (0: the cluster) over part of a period."""

    step_s: int
    installed_pack_id: int
    start_s: float  # the period's start, Unix seconds, a multiple of ``step_s``
    counts: tuple[int, ...]  # ``COUNTS`` order
    histograms: tuple[Sequence[int], ...]  # ``HISTOGRAMS`` order, trailing zeros trimmed


def _array_text(values: Sequence[int]) -> str:
    return "{" + ",".join(str(int(v)) for v in values) + "}"


async def figures_flush(conn: Conn, rows: Sequence[FlushRow]) -> tuple[int, float]:
    """Add ``rows`` to their periods (one statement, one transaction in autocommit). Returns the
    rows written and the database clock (Unix seconds) at the end of the statement."""
    if not rows:
        cur = await conn.execute(FIGURES_CLOCK)
        row = await cur.fetchone()
        assert row is not None
        return 0, float(row[0])
    params: dict[str, list[Any]] = {c: [] for c, _ in _FLUSH_INPUT}
    for r in sorted(rows, key=lambda r: (r.step_s, r.installed_pack_id, r.start_s)):
        params["step_s"].append(r.step_s)
        params["pack"].append(r.installed_pack_id)
        params["start_s"].append(float(r.start_s))
        for name, n in zip(COUNTS, r.counts, strict=True):
            params[name].append(int(n))
        for name, h in zip(HISTOGRAMS, r.histograms, strict=True):
            params[name].append(_array_text(h))
    cur = await conn.execute(FIGURES_FLUSH, params)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


FIGURES_CLOCK = "SELECT extract(epoch FROM clock_timestamp())::float8"


_SAMPLE_INPUT = (
    ("pack", "int8"), ("backlog", "int8"), ("in_flight", "int8"), ("oldest_ready_s", "float8"),
    ("open_circuits", "int4"), ("pauses", "int4"), ("executors", "int4"), ("ingress_processes", "int4"),
    ("unrouted", "int8"), ("oldest_unrouted_s", "float8"),
)  # fmt: skip


def _sampled(column: str) -> str:
    pick = "least" if column in _SMALLEST else "greatest"
    return (
        f"{column} = CASE WHEN t.step_s = {MINUTE} THEN excluded.{column}"
        f" ELSE {pick}(t.{column}, excluded.{column}) END"
    )


FIGURES_SAMPLE = f"""
INSERT INTO connector_figures AS t (step_s, installed_pack_id, start, {", ".join(GAUGES)}, sampled_at)
SELECT s.step_s, x.pack, to_timestamp(floor(extract(epoch FROM now()) / s.step_s) * s.step_s),
       {", ".join("x." + g for g in GAUGES)}, now()
FROM unnest({", ".join(f"%({c})s::{t}[]" for c, t in _SAMPLE_INPUT)})
  AS x({", ".join(c for c, _ in _SAMPLE_INPUT)})
CROSS JOIN (VALUES ({MINUTE}::int2), ({FIVE_MINUTES}::int2)) AS s(step_s)
ORDER BY 1, 2, 3
ON CONFLICT (step_s, installed_pack_id, start) DO UPDATE SET
  {", ".join(_sampled(g) for g in GAUGES)}, sampled_at = excluded.sampled_at
"""


@dataclass(frozen=True, slots=True)
class GaugeRow:
    """The sampled state of one pack (0: the cluster; the cluster-only gauges are ``None`` on
    packs)."""

    installed_pack_id: int
    backlog: int
    in_flight: int
    oldest_ready_s: float | None
    open_circuits: int
    pauses: int
    executors: int | None = None
    ingress_processes: int | None = None
    unrouted: int | None = None
    oldest_unrouted_s: float | None = None


async def figures_sample(conn: Conn, rows: Sequence[GaugeRow]) -> None:
    """Write one sample of the gauges into the current 60 s and 300 s rows (database clock)."""
    if not rows:
        return
    params: dict[str, list[Any]] = {c: [] for c, _ in _SAMPLE_INPUT}
    for r in sorted(rows, key=lambda r: r.installed_pack_id):
        params["pack"].append(r.installed_pack_id)
        for name in GAUGES:
            params[name].append(getattr(r, name))
    await conn.execute(FIGURES_SAMPLE, params)


# Closed periods not sealed yet, younger than ``horizon_s``: a period is closed ``grace_s`` after
# its end (every process has flushed it by then, unless its flush failed: a late one unseals the row
# again). Per step and pack (0 and the installed packs) a range of the primary key.
FIGURES_UNSEALED = f"""
SELECT f.step_s, f.installed_pack_id, extract(epoch FROM f.start)::float8, f.flushes,
       {", ".join("f." + h for h in HISTOGRAMS)}
FROM (SELECT 0::int8 AS installed_pack_id UNION ALL SELECT installed_pack_id FROM connector_installed_pack) p
CROSS JOIN (VALUES ({MINUTE}::int2), ({FIVE_MINUTES}::int2)) AS s(step_s)
JOIN LATERAL (
  SELECT * FROM connector_figures f
  WHERE f.step_s = s.step_s AND f.installed_pack_id = p.installed_pack_id
    AND f.start >= now() - make_interval(secs => %(horizon_s)s::float8)
    AND f.start < now() - make_interval(secs => s.step_s + %(grace_s)s::float8)
    AND f.quantiles IS NULL AND f.flushes > 0
) f ON true
ORDER BY 1, 2, 3
LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class UnsealedRow:
    step_s: int
    installed_pack_id: int
    start_s: float
    flushes: int
    histograms: tuple[list[int], ...]


async def figures_unsealed(conn: Conn, *, grace_s: float, horizon_s: float, limit: int) -> list[UnsealedRow]:
    """Closed periods without quantiles (at most ``limit``, younger than ``horizon_s``)."""
    cur = await conn.execute(FIGURES_UNSEALED, {"grace_s": grace_s, "horizon_s": horizon_s, "limit": limit})
    return [
        UnsealedRow(int(r[0]), int(r[1]), float(r[2]), int(r[3]), (list(r[4]), list(r[5]), list(r[6])))
        for r in await cur.fetchall()
    ]


FIGURES_SEAL = """
UPDATE connector_figures t SET quantiles = x.q::float8[]
FROM unnest(%(step_s)s::int2[], %(pack)s::int8[], %(start_s)s::float8[], %(flushes)s::int4[],
            %(quantiles)s::text[]) AS x(step_s, pack, start_s, flushes, q)
WHERE t.step_s = x.step_s AND t.installed_pack_id = x.pack AND t.start = to_timestamp(x.start_s)
  AND t.flushes = x.flushes
"""


async def figures_seal(conn: Conn, sealed: Sequence[tuple[UnsealedRow, Sequence[float]]]) -> int:
    """Store the quantiles of closed periods (rows a flush changed since they were read are left
    for the next round). Returns the rows sealed."""
    if not sealed:
        return 0
    cur = await conn.execute(
        FIGURES_SEAL,
        {
            "step_s": [r.step_s for r, _ in sealed],
            "pack": [r.installed_pack_id for r, _ in sealed],
            "start_s": [r.start_s for r, _ in sealed],
            "flushes": [r.flushes for r, _ in sealed],
            "quantiles": ["{" + ",".join(repr(float(v)) for v in q) + "}" for _, q in sealed],
        },
    )
    return cur.rowcount


# One step's rows older than the retention: a range of the primary key's leading column (the
# step's rows are bounded by the retention itself: ≤ (packs + 1) x periods kept).
FIGURES_RETIRE = """
DELETE FROM connector_figures
WHERE step_s = %(step_s)s AND start < now() - make_interval(secs => %(keep_s)s::float8)
"""


async def figures_retire(conn: Conn, keep: dict[int, float]) -> int:
    """Delete the rows of each step older than its ``keep`` seconds. Returns the rows deleted."""
    deleted = 0
    for step_s, keep_s in keep.items():
        cur = await conn.execute(FIGURES_RETIRE, {"step_s": step_s, "keep_s": keep_s})
        deleted += cur.rowcount
    return deleted


# The series of a window: per pack (0 = the cluster, then the installed packs, optionally only
# some), the rows of ``step_s`` since ``span_s`` ago, plus the last two minute rows (``current``)
# unless the window's step is the minute anyway. Histograms only where they are needed: rows not
# sealed yet and the last two minutes.
_READ_COLUMNS = (
    "f.step_s, extract(epoch FROM f.start)::float8, "
    + ", ".join(f"f.{c}" for c in COUNTS)
    + ", f.quantiles, "
    + ", ".join(f"CASE WHEN f.quantiles IS NULL OR f.recent THEN f.{h} END" for h in HISTOGRAMS)
    + ", "
    + ", ".join(f"f.{g}" for g in GAUGES)
    + ", extract(epoch FROM f.flushed_at)::float8"
)
FIGURES_READ = f"""
WITH r AS (
  SELECT now() AS now, now() - make_interval(secs => %(span_s)s::float8) AS since,
         to_timestamp(floor(extract(epoch FROM now()) / {MINUTE}) * {MINUTE} - {MINUTE}) AS recent
), p AS (
  SELECT 0::int8 AS installed_pack_id, ''::text AS name
  UNION ALL
  SELECT k.installed_pack_id, k.name FROM connector_installed_pack k
  WHERE cardinality(%(packs)s::int8[]) = 0 OR k.installed_pack_id = ANY(%(packs)s::int8[])
)
SELECT p.installed_pack_id, p.name, extract(epoch FROM r.now)::float8, {_READ_COLUMNS}
FROM p CROSS JOIN r
LEFT JOIN LATERAL (
  SELECT f.*, f.step_s = {MINUTE} AND f.start >= r.recent AS recent FROM connector_figures f
  WHERE f.step_s = %(step_s)s AND f.installed_pack_id = p.installed_pack_id AND f.start >= r.since
    AND NOT %(current_only)s
  UNION ALL
  SELECT f.*, true FROM connector_figures f
  WHERE f.step_s = {MINUTE} AND f.installed_pack_id = p.installed_pack_id AND f.start >= r.recent
    AND (%(step_s)s <> {MINUTE} OR %(current_only)s)
) f ON true
ORDER BY p.installed_pack_id, f.step_s, f.start
"""


@dataclass(frozen=True, slots=True)
class FiguresRow:
    """A stored period of one pack as ``figures_read`` returns it (histograms ``None`` when sealed
    and not among the last two minutes)."""

    step_s: int
    start_s: float
    counts: tuple[int, ...]  # ``COUNTS`` order
    quantiles: list[float] | None  # what the leader sealed (``core.figures.sealed``)
    histograms: tuple[list[int] | None, ...]  # ``HISTOGRAMS`` order
    gauges: tuple[Any, ...]  # ``GAUGES`` order, ``None`` when not sampled
    flushed_s: float | None


@dataclass(slots=True)
class FiguresSeriesRows:
    installed_pack_id: int
    name: str
    rows: list[FiguresRow]


async def figures_read(
    conn: Conn, *, step_s: int, span_s: float, packs: Sequence[int], current_only: bool
) -> tuple[float, list[FiguresSeriesRows]]:
    """The rows of every series (the cluster first, then the packs by id) and the database clock."""
    cur = await conn.execute(
        FIGURES_READ,
        {"step_s": step_s, "span_s": span_s, "packs": list(packs), "current_only": current_only},
    )
    now = 0.0
    series: list[FiguresSeriesRows] = []
    c0, q0 = 5, 5 + len(COUNTS)  # column positions: counts, quantiles, histograms, gauges, flushed
    h0 = q0 + 1
    g0 = h0 + len(HISTOGRAMS)
    f0 = g0 + len(GAUGES)
    last = -1
    rows: list[FiguresRow] = []
    for r in await cur.fetchall():  # a day of 20 packs is ~6,000 rows: no per-value work here
        now = r[2]
        if r[0] != last:
            last = r[0]
            rows = []
            series.append(FiguresSeriesRows(r[0], r[1], rows))
        if r[3] is not None:  # else a pack without rows in the window
            rows.append(FiguresRow(r[3], r[4], r[c0:q0], r[q0], r[h0:g0], r[g0:f0], r[f0]))
    return float(now), series
