"""The claimer's claim levels (``work/claim_levels.py``) on their own, no database, no clock: levels
only rise until the recheck, which forgets them but keeps discovery's keyed heads; what a plain or
rate claim left raises its groups; deferred due times reach the scheduler once their group has no due
rows; the due-time probe asks at most once per interval. The claimer's behaviour over real statements
is tests/executor/test_claim_plain.py and test_rate_limits.py."""

from __future__ import annotations

from connector.executor.work.claim_levels import CIRCUIT, FLOW, PLAIN, RATE, ClaimLevels
from connector.executor.work.scheduler import Scheduler

A, B, C = (1, "default"), (2, "default"), (3, "default")


def _levels(recheck_s: float = 60.0, probe_s: float = 0.005) -> tuple[ClaimLevels, dict[str, int]]:
    stats = {"flow_switches": 0, "due_probes": 0}
    return ClaimLevels(recheck_s=recheck_s, probe_s=probe_s, stats=stats), stats


def test_levels_only_rise_and_a_batch_takes_its_most_demanding_group() -> None:
    lv, stats = _levels()
    assert lv.level([A, B], now=0.0) == PLAIN
    lv.need({A: RATE}, now=1.0)
    assert lv.until == 61.0 and stats["flow_switches"] == 1
    lv.need({A: RATE}, now=2.0)  # not a rise: not a switch
    lv.need({B: FLOW}, now=3.0)
    assert lv.until == 61.0, "the recheck time is set by the first raise only"
    assert stats["flow_switches"] == 2
    assert lv.level([A], now=4.0) == RATE
    assert lv.level([A, B], now=4.0) == FLOW
    assert lv.level([C], now=4.0) == PLAIN
    lv.need({B: RATE}, now=5.0)  # never lowered
    assert lv.levels == {A: RATE, B: FLOW}


def test_the_recheck_forgets_all_but_discoverys_keyed_heads() -> None:
    lv, _ = _levels(recheck_s=10.0)
    lv.discovered({A: RATE}, now=0.0)
    lv.left(PLAIN, {B: 3}, {B: FLOW}, now=1.0)  # a plain claim left B's keyed rows for the flow statement
    assert lv.levels == {A: RATE, B: FLOW}
    assert lv.level([A, B], now=9.9) == FLOW
    assert lv.level([A, B], now=10.0) == RATE  # B forgotten, A kept (its head is keyed)
    assert lv.levels == {A: RATE} and lv.until == 20.0


def test_what_a_claim_left_goes_up_a_level() -> None:
    lv, _ = _levels()
    lv.left(PLAIN, {A: 2, B: 1, C: 4}, {B: FLOW, C: CIRCUIT}, now=0.0)
    assert lv.levels == {A: RATE, B: FLOW, C: CIRCUIT}
    lv.left(RATE, {A: 1}, {}, now=0.0)
    assert lv.levels == {A: FLOW, B: FLOW, C: CIRCUIT}
    lv.left(CIRCUIT, {C: 2}, {C: FLOW}, now=0.0)  # a circuit that is not closed: the flow statement's
    assert lv.levels == {A: FLOW, B: FLOW, C: FLOW}
    lv.left(FLOW, {}, {}, now=0.0)  # nothing left: nothing changes
    assert lv.levels == {A: FLOW, B: FLOW, C: FLOW}


def test_a_batch_of_a_circuit_group_and_a_rate_group_takes_the_flow_statement() -> None:
    """The circuit statement leaves rate keys and the rate statement circuits: together, only the
    flow statement judges both."""
    lv, _ = _levels()
    lv.need({A: CIRCUIT, B: RATE}, now=0.0)
    assert lv.level([A], now=1.0) == CIRCUIT
    assert lv.level([A, C], now=1.0) == CIRCUIT
    assert lv.level([B], now=1.0) == RATE
    assert lv.level([A, B], now=1.0) == FLOW


def test_deferred_due_times_reach_the_scheduler_when_the_group_has_no_due_rows() -> None:
    lv, _ = _levels()
    sched = Scheduler(capacity=10)
    sched.observe([(1, "default", 0.0)], now=0.0)  # A ready
    lv.deferred({A: 2.0}, now=100.0)
    lv.deferred({A: 5.0}, now=100.0)  # the earliest one counts
    lv.tell_due(sched)
    assert sched.groups[A].ready and sched.groups[A].due_at == 0.0, "A still has due rows: kept"
    sched.record(sched.groups[A], 4, 1)  # short: no due rows now
    lv.tell_due(sched)
    assert sched.groups[A].ready and sched.groups[A].due_at == 102.0
    hints = sched.hints
    lv.tell_due(sched)  # handed over once
    assert sched.hints == hints


def test_the_due_probe_asks_for_short_flow_groups_at_most_once_per_interval() -> None:
    lv, stats = _levels(probe_s=1.0)
    lv.need({A: RATE}, now=0.0)
    assert not lv.probe([C], {}, now=0.0), "C has no level"
    assert not lv.probe([A], {A: 0.5}, now=0.0), "this claim deferred some of A: its due time is known"
    assert lv.probe([A], {}, now=5.0)
    assert not lv.probe([A], {}, now=5.5), "within probe_s of the last ask"
    assert lv.probe([A, C], {}, now=6.0)
    assert stats["due_probes"] == 2
