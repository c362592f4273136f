"""Process-local fairness and admission: which groups to claim from, and how many.

A *group* is ``(installed_pack_id, queue_class)``: the unit the claim statement reads (one range of
the ready index). The scheduler never touches the database; the claim loop asks it for an
allocation of the free admission window and reports back what each group yielded.

Admission: ``free = capacity - held`` where ``capacity = workers + prefetch`` (claimed items waiting
for a worker count as held). Each pack may hold at most its budget (``pack_max_inflight``, per-pack
overrides in ``pack_budgets``; 0 = no limit beyond the capacity).

Fairness: weighted stride scheduling. Each group carries a *pass*; every slot granted to a group
advances its pass by ``1 / weight`` (``weight = pack weight x queue class weight``), and each slot
goes to the eligible group with the smallest pass. A group that becomes ready again starts at the
current virtual time (the smallest pass among eligible groups), so idle groups neither hoard credit
nor are penalized; slots a group was granted but could not use (it had fewer due rows) are refunded.

Bound (tested in tests/executor/test_fairness.py): once a group is known to be ready, at most
``ceil(W / w)`` slots are granted to other groups before it gets one (W: total weight of eligible
groups, w: its weight). In time: a ready item of a small pack waits at most the discovery latency
(a NOTIFY, else ``poll_interval_s``), plus the time for that many slots to free, plus one claim round
trip, plus its own position in its group divided by its share of the slot rate — independent of how
large any other pack's backlog is.

``fair=False`` is the control used by the tests: greedy, groups in id order, first come first served.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

GroupKey = tuple[int, str]


@dataclass(slots=True)
class Group:
    pack: int
    queue_class: str
    weight: float = 1.0
    pass_: float = 0.0
    ready: bool = True
    due_at: float = 0.0  # monotonic time when its first row is due (0: now)
    claimed: int = 0  # total slots used (for diagnostics and tests)

    @property
    def key(self) -> GroupKey:
        return (self.pack, self.queue_class)


def parse_weights(spec: str) -> dict[str, float]:
    """``"a=2,b=0.5"`` → ``{"a": 2.0, "b": 0.5}``."""
    out: dict[str, float] = {}
    for part in spec.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"expected name=value, got {part!r}")
        weight = float(value)
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"weight of {name.strip()!r} must be a positive number")
        out[name.strip()] = weight
    return out


def parse_budgets(spec: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in parse_weights(spec).items():
        if value != int(value):
            raise ValueError(f"budget of {name!r} must be an integer")
        out[name] = int(value)
    return out


@dataclass
class Scheduler:
    capacity: int
    queue_class_weights: dict[str, float] = field(default_factory=dict)
    pack_weights: dict[str, float] = field(default_factory=dict)
    pack_max_inflight: int = 0
    pack_budgets: dict[str, int] = field(default_factory=dict)
    fair: bool = True

    def __post_init__(self) -> None:
        self.groups: dict[GroupKey, Group] = {}
        self.vtime = 0.0
        self.pack_names: dict[int, str] = {}
        self.paused: set[GroupKey] = set()
        #: Hints received (``mark_ready``, ``note_due``): the claimer compares it across a wait to
        #: tell a wake-up that may mean new rows from one that only frees space in the window.
        self.hints = 0

    # -- knowledge of groups ------------------------------------------------------------------------

    def _weight(self, pack: int, queue_class: str) -> float:
        name = self.pack_names.get(pack)
        pw = self.pack_weights.get(str(pack)) or (self.pack_weights.get(name) if name else None) or 1.0
        return pw * self.queue_class_weights.get(queue_class, 1.0)

    def budget(self, pack: int) -> int:
        name = self.pack_names.get(pack)
        b = self.pack_budgets.get(str(pack))
        if b is None and name is not None:
            b = self.pack_budgets.get(name)
        if b is None:
            b = self.pack_max_inflight
        return self.capacity if b <= 0 else b

    def set_paused(self, keys: set[GroupKey]) -> None:
        """Groups paused at the last discovery (PausePack): never allocated until a discovery says
        otherwise (a NOTIFY's ``mark_ready`` does not wake them)."""
        self.paused = keys
        for key in keys:
            g = self.groups.get(key)
            if g is not None:
                g.ready = False

    def set_pack_names(self, names: dict[int, str]) -> None:
        self.pack_names = dict(names)
        for g in self.groups.values():
            g.weight = self._weight(g.pack, g.queue_class)

    def _group(self, pack: int, queue_class: str) -> Group:
        g = self.groups.get((pack, queue_class))
        if g is None:
            g = Group(pack, queue_class, self._weight(pack, queue_class), self.vtime, ready=False)
            self.groups[(pack, queue_class)] = g
        return g

    def observe(self, rows: Iterable[tuple[int, str, float]], now: float) -> None:
        """Discovery result: ``(pack, queue_class, seconds until its first row is due)`` for every
        group with ready rows. Groups not listed have none."""
        seen: set[GroupKey] = set()
        for pack, qc, due_in in rows:
            g = self._group(pack, qc)
            seen.add(g.key)
            if not g.ready:
                g.pass_ = max(g.pass_, self.vtime)
            g.ready = True
            g.due_at = now + due_in if due_in > 0 else 0.0
        for key, g in self.groups.items():
            if key not in seen:
                g.ready = False

    def mark_ready(self, packs: Iterable[int] | None = None) -> None:
        """A hint (NOTIFY, a lane promotion, a retry) that groups may have due rows again."""
        self.hints += 1
        wanted = None if packs is None else set(packs)
        for g in self.groups.values():
            if wanted is None or g.pack in wanted:
                if not g.ready:
                    g.pass_ = max(g.pass_, self.vtime)
                g.ready = True
                g.due_at = 0.0

    def note_due(self, pack: int, queue_class: str, at: float) -> None:
        """A row of this group becomes due at monotonic time ``at`` (a retry with a delay)."""
        self.hints += 1
        g = self._group(pack, queue_class)
        if not g.ready:
            g.pass_ = max(g.pass_, self.vtime)
            g.ready = True
            g.due_at = at
        elif g.due_at:
            g.due_at = min(g.due_at, at)

    def next_due(self) -> float | None:
        dues = [g.due_at for g in self.groups.values() if g.ready and g.due_at > 0]
        return min(dues) if dues else None

    def has_eligible(self, now: float) -> bool:
        return any(g.ready and g.due_at <= now for g in self.groups.values())

    # -- allocation ---------------------------------------------------------------------------------

    def allocate(self, free: int, held_by_pack: dict[int, int], now: float) -> list[tuple[Group, int]]:
        """Split ``free`` slots among eligible groups (ready, due, pack under budget)."""
        if free <= 0:
            return []
        room: dict[int, int] = {}
        eligible: list[Group] = []
        paused = self.paused
        for g in self.groups.values():
            if not g.ready or g.due_at > now or (paused and g.key in paused):
                continue
            if g.pack not in room:
                room[g.pack] = self.budget(g.pack) - held_by_pack.get(g.pack, 0)
            if room[g.pack] > 0:
                eligible.append(g)
        if not eligible:
            return []
        if not self.fair:
            out: list[tuple[Group, int]] = []
            for g in sorted(eligible, key=lambda x: x.key):
                n = min(free, room[g.pack])
                if n > 0:
                    out.append((g, n))
                    room[g.pack] -= n
                    free -= n
                if free == 0:
                    break
            return out
        self.vtime = min(g.pass_ for g in eligible)
        if len(eligible) == 1:
            g = eligible[0]
            n = min(free, room[g.pack])
            g.pass_ += n / g.weight
            self.vtime = g.pass_
            return [(g, n)]
        alloc: dict[GroupKey, int] = {}
        heap = [(g.pass_, i, g) for i, g in enumerate(eligible)]
        heapq.heapify(heap)
        while free > 0 and heap:
            _, i, g = heapq.heappop(heap)
            if room[g.pack] <= 0:
                continue
            alloc[g.key] = alloc.get(g.key, 0) + 1
            room[g.pack] -= 1
            free -= 1
            g.pass_ += 1.0 / g.weight
            heapq.heappush(heap, (g.pass_, i, g))
        # Virtual time: where the eligible groups stand after this round (a group that becomes
        # ready later starts here: no credit hoarded while idle, none lost).
        self.vtime = min(g.pass_ for g in eligible)
        return [(self.groups[k], n) for k, n in alloc.items()]

    def record(self, group: Group, asked: int, got: int) -> None:
        """What a group yielded. Fewer than asked: it has no more due rows now; refund the rest."""
        group.claimed += got
        if got < asked:
            if self.fair:
                group.pass_ -= (asked - got) / group.weight
            group.ready = False
