"""Claim levels: which claim statement each (pack, queue class) group's batches go through, and when
the rows a claim deferred become due (the claimer's flow-level state, docs/executor.md#the-claim-path).

A group's *level* is the statement it needs: ``PLAIN`` (0, ``work_item_claim_plain_batch``),
``CIRCUIT`` (circuit breakers' keys only: ``work_item_claim_circuit_batch``, the plain statement with
the closed circuits' ``KEY SHARE`` gate), ``RATE`` (rate-limit keys only: ``work_item_claim_rate_batch``)
or ``FLOW`` (concurrency or debounce keys, a rate key with a circuit, a circuit that is not closed:
``work_item_claim_batch``). A batch goes through the statement its most demanding group needs (a
batch with both a circuit group and a rate group through the flow statement: neither of the two
judges the other's keys); every other batch through the plain one, which costs what the claim cost
before flow limits existed.
Levels are raised by discovery (a group's first ready row is keyed) and by the plain and rate
statements themselves (they claim no candidate they cannot judge and report the groups they left
some in), and forgotten every ``recheck_s`` so that a group whose limits were removed returns to the
plain statement; the groups whose first ready row was keyed at the last discovery keep their level
through a recheck (a plain claim that takes nothing from one of them could not report what it left).

Due times: a rate or flow claim that defers candidates to their budget's time reports when the first
becomes due; the scheduler is told once the group has no due rows left (it then waits for that time
instead of the next discovery). A flow group that yields fewer than asked with nothing deferred by
that claim may still hold rows an earlier claim deferred (not due: the claim cannot see them), so the
claimer asks discovery at once for its next due time, at most once per ``probe_s``.

Nothing here reads the database or the clock: the claimer passes ``now`` (``time.monotonic()``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from connector.common.store.work_items.claim import CIRCUIT, FLOW, PLAIN, RATE
from connector.executor.work.scheduler import GroupKey, Scheduler

__all__ = ["CIRCUIT", "FLOW", "PLAIN", "RATE", "ClaimLevels"]


class ClaimLevels:
    """The level of every group that needs more than the plain statement, and the due times a claim
    deferred. Counts ``flow_switches`` and ``due_probes`` in ``stats`` (the engine's test signals)."""

    def __init__(self, *, recheck_s: float, probe_s: float, stats: dict[str, int]) -> None:
        self.recheck_s = recheck_s
        self.probe_s = probe_s
        self._stats = stats
        #: Groups whose batches need more than the plain statement, and the level they need.
        self.levels: dict[GroupKey, int] = {}
        #: When ``levels`` is forgotten (monotonic; set when the first group is raised).
        self.until = 0.0
        #: Groups whose first ready row was keyed at the last discovery, and the level it needs.
        self._keyed_heads: dict[GroupKey, int] = {}
        #: Groups with deferred candidates: when the first becomes due (monotonic).
        self._due: dict[GroupKey, float] = {}
        self._probed_at = 0.0  # when the last due-time discovery was asked

    # ------------------------------------------------------------------------------------ levels

    def discovered(self, keyed_heads: dict[GroupKey, int], now: float) -> None:
        """Discovery's groups whose first ready row is keyed (and the level that row needs)."""
        self._keyed_heads = keyed_heads
        self.need(keyed_heads, now)

    def need(self, levels: Mapping[GroupKey, int], now: float) -> None:
        """Send these groups' batches through the statement they need (until the next recheck)."""
        flow = self.levels
        raised = {key: level for key, level in levels.items() if flow.get(key, 0) < level}
        if not raised:
            return
        if not flow:
            self.until = now + self.recheck_s
        flow.update(raised)
        self._stats["flow_switches"] += 1

    def level(self, keys: Iterable[GroupKey], now: float) -> int:
        """The level of a batch of these groups (forgetting the levels first if it is time)."""
        flow = self.levels
        if flow and now >= self.until:
            flow.clear()
            self.need(self._keyed_heads, now)
        if not flow:
            return PLAIN
        level = PLAIN
        seen_circuit = seen_rate = False
        for key in keys:
            need = flow.get(key, PLAIN)
            seen_circuit |= need == CIRCUIT
            seen_rate |= need == RATE
            level = max(level, need)
        return FLOW if seen_circuit and seen_rate else level

    def left(
        self, level: int, keyed: Mapping[GroupKey, int], needs: Mapping[GroupKey, int], now: float
    ) -> None:
        """A claim at ``level`` left keyed candidates in these groups for a more demanding statement:
        the plain and circuit claims' go to the level they need (``needs``: the highest their
        candidates reported; the rate statement's when not told), the rate claim's to the flow
        statement."""
        if not keyed:
            return
        if level in (PLAIN, CIRCUIT):
            self.need({key: needs.get(key, RATE) for key in keyed}, now)
        else:
            self.need(dict.fromkeys(keyed, FLOW), now)

    # --------------------------------------------------------------------------------- due times

    def deferred(self, due_in: Mapping[GroupKey, float], now: float) -> None:
        """A claim deferred candidates of these groups: the first becomes due in ``due_in`` seconds."""
        due = self._due
        for key, s in due_in.items():
            at = now + s
            due[key] = min(at, due.get(key, at))

    def probe(self, short: Iterable[GroupKey], due_in: Collection[GroupKey], now: float) -> bool:
        """Whether to ask discovery now for the next due time of a group a rate or flow claim got
        fewer than asked from (``short``): one with a level this claim deferred none of (``due_in``),
        and no such ask within ``probe_s``."""
        flow = self.levels
        if not any(key in flow and key not in due_in for key in short):
            return False
        if now - self._probed_at < self.probe_s:
            return False
        self._probed_at = now
        self._stats["due_probes"] += 1
        return True

    def tell_due(self, scheduler: Scheduler) -> None:
        """Hand the scheduler the due times of the groups with no due rows left."""
        due = self._due
        if due:
            groups = scheduler.groups
            for key in list(due):
                g = groups.get(key)
                if g is None or not g.ready:
                    scheduler.note_due(key[0], key[1], due.pop(key))
