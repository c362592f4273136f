"""Figures: the cluster's throughput and latency as every ingress and executor process sees it,
recorded in memory and added to shared per-period rows once per flush interval
(docs/metrics.md "Figures without Prometheus"). The statements are ``store.figures``'s; the job
that flushes is ``connector.common.maintenance.figures``.

A ``Recorder`` holds, per installed pack, counters and latency histograms since its last flush.
It touches no database and takes no lock: the ingress calls it once per answer and the executor
once per finished item, from their event loop (a dict lookup, an increment, for a latency a
``bisect``: ~0.2 µs). ``take()`` hands what was recorded to the flush and starts afresh.

Histograms count observations per bucket of ``BOUNDS_S`` (1-1.5-2-3-5-7 per decade from 0.5 ms to
one hour, then one open bucket): fixed bounds, so the histograms of every process and period add
up element-wise. ``quantile`` interpolates log-linearly inside the bucket holding the rank (on
log-normal samples: mean error ~3 %, at most ~12 %).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: The pack id of the cluster-wide rows: each process also adds the sum over its packs there, and
#: what belongs to no pack (a refusal of a path that is no installed route) only there.
CLUSTER = 0


def _bounds() -> tuple[float, ...]:
    out = {0.0005, 0.0007}
    for exp in range(-3, 4):
        for mantissa in (1.0, 1.5, 2.0, 3.0, 5.0, 7.0):
            bound = round(mantissa * 10.0**exp, 6)
            if bound <= 3600:
                out.add(bound)
    out.update((1500.0, 2000.0, 3000.0, 3600.0))
    return tuple(sorted(out))


#: Upper bounds (seconds) of the histogram buckets; one more bucket holds everything above.
BOUNDS_S: tuple[float, ...] = _bounds()
BUCKETS = len(BOUNDS_S) + 1

#: Answers of the ingress (``Recorder.answered``): their index in ``PackFigures.answers`` and the
#: ``store.figures.COUNTS`` they add to.
ACCEPTED, DUPLICATE, REJECTED, UNAVAILABLE = range(4)
#: Executed items' committed states that are executions (a release is not).
EXECUTION_STATES = frozenset({"succeeded", "retry", "dead"})


class PackFigures:
    """What one process saw of one pack since its last flush."""

    __slots__ = ("ack", "answers", "dead_lettered", "delay", "delivery", "failed", "succeeded")

    def __init__(self) -> None:
        self.answers = [0, 0, 0, 0]
        self.succeeded = 0
        self.failed = 0
        self.dead_lettered = 0
        self.ack = [0] * BUCKETS
        self.delivery = [0] * BUCKETS
        self.delay = [0] * BUCKETS

    def add(self, other: PackFigures) -> None:
        for i, n in enumerate(other.answers):
            self.answers[i] += n
        self.succeeded += other.succeeded
        self.failed += other.failed
        self.dead_lettered += other.dead_lettered
        for mine, theirs in (
            (self.ack, other.ack),
            (self.delivery, other.delivery),
            (self.delay, other.delay),
        ):
            for i, n in enumerate(theirs):
                if n:
                    mine[i] += n

    def counts(self) -> tuple[int, ...]:
        """In ``store.figures.COUNTS`` order."""
        return (*self.answers, self.succeeded, self.failed, self.dead_lettered)

    def histograms(self) -> tuple[list[int], list[int], list[int]]:
        """In ``store.figures.HISTOGRAMS`` order, trailing zeros trimmed."""
        return trimmed(self.ack), trimmed(self.delivery), trimmed(self.delay)


class Recorder:
    """Per-pack figures of this process since the last ``take``; written from one event loop.

    ``clock_offset_s`` is the database clock minus this process's monotonic clock
    (``time.monotonic()``), as the figures job last measured it (``synced`` once it did): latencies
    that start at a database timestamp (a receipt's acceptance, a WorkItem's due time) are measured
    against ``time.monotonic() + clock_offset_s`` — the executor never reads the wall clock."""

    __slots__ = ("clock_offset_s", "packs", "synced")

    def __init__(self) -> None:
        self.packs: dict[int, PackFigures] = {}
        self.clock_offset_s = 0.0
        self.synced = False

    def pack(self, pack: int) -> PackFigures:
        f = self.packs.get(pack)
        if f is None:
            f = self.packs[pack] = PackFigures()
        return f

    # -- ingress -------------------------------------------------------------------------------

    def answered(self, pack: int, answer: int) -> None:
        """One ingress answer (``ACCEPTED`` … ``UNAVAILABLE``) for ``pack`` (``CLUSTER``: no route)."""
        (self.packs.get(pack) or self.pack(pack)).answers[answer] += 1

    def acked(self, pack: int, seconds: float) -> None:
        """Request received → success answer (accepted or duplicate), in seconds."""
        (self.packs.get(pack) or self.pack(pack)).ack[bisect_left(BOUNDS_S, seconds)] += 1

    # -- executor ------------------------------------------------------------------------------

    def executed(self, pack: int, state: str, delivery_s: float | None, delay_s: float | None) -> None:
        """One execution's committed outcome (``succeeded``, ``retry`` or ``dead``). ``delivery_s``:
        receipt accepted → succeeded; ``delay_s``: due → handler started (``None``: unknown)."""
        f = self.packs.get(pack) or self.pack(pack)
        if state == "succeeded":
            f.succeeded += 1
            if delivery_s is not None:
                f.delivery[bisect_left(BOUNDS_S, delivery_s)] += 1
        else:
            f.failed += 1
            if state == "dead":
                f.dead_lettered += 1
        if delay_s is not None:
            f.delay[bisect_left(BOUNDS_S, delay_s)] += 1

    def dead_lettered(self, pack: int, n: int = 1) -> None:
        """Items that became dead without an execution outcome (an expired lease out of attempts)."""
        self.pack(pack).dead_lettered += n

    # -- flush ---------------------------------------------------------------------------------

    def take(self) -> dict[int, PackFigures]:
        """Everything recorded since the last call; the recorder starts afresh."""
        packs, self.packs = self.packs, {}
        return packs


def with_cluster(packs: dict[int, PackFigures]) -> dict[int, PackFigures]:
    """``packs`` plus the cluster's figures (key ``CLUSTER``): the sum of every pack and of what
    belongs to none."""
    total = PackFigures()
    for f in packs.values():
        total.add(f)
    out = {p: f for p, f in packs.items() if p != CLUSTER}
    out[CLUSTER] = total
    return out


def trimmed(counts: Sequence[int]) -> list[int]:
    """``counts`` without trailing zeros (what is stored: short for narrow distributions)."""
    end = len(counts)
    while end and not counts[end - 1]:
        end -= 1
    return list(counts[:end])


def merged(histograms: Iterable[Sequence[int] | None]) -> list[int]:
    """The element-wise sum of histograms of any lengths (``None`` counts as empty)."""
    out: list[int] = []
    for h in histograms:
        if not h:
            continue
        if len(h) > len(out):
            out.extend([0] * (len(h) - len(out)))
        for i, n in enumerate(h):
            out[i] += n
    return out


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q``-quantile (0 < q ≤ 1) of a histogram in seconds, ``None`` when it is empty:
    log-linear interpolation inside the bucket holding the rank (linear from 0 in the first bucket;
    the open last bucket answers its lower bound)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(BOUNDS_S):
                return BOUNDS_S[-1]
            hi = BOUNDS_S[i]
            frac = min(1.0, max(0.0, (rank - seen) / n))
            if i == 0:
                return hi * frac
            lo = BOUNDS_S[i - 1]
            return lo * math.exp(math.log(hi / lo) * frac)
        seen += n
    return BOUNDS_S[-1]


@dataclass(frozen=True, slots=True)
class Quantiles:
    """p50, p95 and p99 (seconds) of a histogram, and its number of observations."""

    p50: float
    p95: float
    p99: float
    count: int

    @classmethod
    def of(cls, counts: Sequence[int]) -> Quantiles | None:
        n = sum(counts)
        if n <= 0:
            return None
        p50, p95, p99 = (quantile(counts, q) or 0.0 for q in (0.5, 0.95, 0.99))
        return cls(p50, p95, p99, n)

    @classmethod
    def stored(cls, values: Sequence[float]) -> Quantiles | None:
        """From the 4 floats ``sealed`` wrote (``None`` for an empty histogram)."""
        p50, p95, p99, n = values
        return cls(p50, p95, p99, int(n)) if n > 0 else None


def sealed(histograms: Sequence[Sequence[int]]) -> list[float]:
    """What a closed period stores once (``connector_figures.quantiles``): p50, p95, p99 and the
    count of each histogram in order, zeros for an empty one."""
    out: list[float] = []
    for h in histograms:
        q = Quantiles.of(h)
        out.extend((q.p50, q.p95, q.p99, float(q.count)) if q is not None else (0.0, 0.0, 0.0, 0.0))
    return out
