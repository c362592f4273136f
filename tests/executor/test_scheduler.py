"""The process-local scheduler: weighted shares, refunds, budgets, the starvation bound, and the
greedy control that starves (so the fairness tests can fail)."""

from __future__ import annotations

import math

import pytest

from connector.executor.work.scheduler import Scheduler, parse_budgets, parse_weights


def _run_rounds(s: Scheduler, rounds: int, free: int, backlog: dict[tuple[int, str], int]) -> dict:
    got: dict[tuple[int, str], int] = dict.fromkeys(backlog, 0)
    for _ in range(rounds):
        for g, n in s.allocate(free, {}, now=0.0):
            take = min(n, backlog[g.key])
            backlog[g.key] -= take
            got[g.key] += take
            s.record(g, n, take)
    return got


def test_shares_follow_weights() -> None:
    s = Scheduler(capacity=64, queue_class_weights={"bulk": 0.25}, pack_weights={"1": 2.0})
    s.observe([(1, "default", 0.0), (2, "default", 0.0), (2, "bulk", 0.0)], now=0.0)
    got = _run_rounds(s, 50, 35, {(1, "default"): 10**6, (2, "default"): 10**6, (2, "bulk"): 10**6})
    total = sum(got.values())
    # weights 2 : 1 : 0.25
    assert got[(1, "default")] / total == pytest.approx(2 / 3.25, abs=0.01)
    assert got[(2, "default")] / total == pytest.approx(1 / 3.25, abs=0.01)
    assert got[(2, "bulk")] / total == pytest.approx(0.25 / 3.25, abs=0.01)


def test_unused_slots_are_refunded_and_empty_groups_wait_for_a_hint() -> None:
    s = Scheduler(capacity=64)
    s.observe([(1, "default", 0.0), (2, "default", 0.0)], now=0.0)
    got = _run_rounds(s, 20, 32, {(1, "default"): 5, (2, "default"): 10**6})
    assert got[(1, "default")] == 5  # it had 5 and got them all
    assert not s.groups[(1, "default")].ready
    # pack 1 did not lose its standing by being short: when it comes back it gets its share at once
    s.mark_ready([1])
    alloc = dict((g.key, n) for g, n in s.allocate(32, {}, now=0.0))
    assert alloc[(1, "default")] == 16


def test_budgets_cap_a_pack() -> None:
    s = Scheduler(capacity=100, pack_max_inflight=10, pack_budgets={"big": 3})
    s.set_pack_names({1: "big", 2: "small"})
    s.observe([(1, "default", 0.0), (2, "default", 0.0)], now=0.0)
    alloc = {g.key: n for g, n in s.allocate(100, {1: 1}, now=0.0)}
    assert alloc == {(1, "default"): 2, (2, "default"): 10}


def test_not_due_groups_are_skipped_until_their_time() -> None:
    s = Scheduler(capacity=10)
    s.observe([(1, "default", 5.0)], now=100.0)
    assert s.allocate(10, {}, now=104.0) == []
    assert s.next_due() == pytest.approx(105.0)
    assert [(g.key, n) for g, n in s.allocate(10, {}, now=105.0)] == [((1, "default"), 10)]


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 0.1), (4.0, 0.5)])
def test_starvation_bound(weights: tuple[float, float]) -> None:
    """A group that becomes ready gets a slot before ceil(W/w) slots go to anyone else."""
    big_w, small_w = weights
    s = Scheduler(capacity=10**6, pack_weights={"1": big_w, "2": small_w})
    s.observe([(1, "default", 0.0)], now=0.0)
    for _ in range(1000):  # the big pack runs alone for a long time
        for g, n in s.allocate(7, {}, now=0.0):
            s.record(g, n, n)
    s.observe([(1, "default", 0.0), (2, "default", 0.0)], now=0.0)
    bound = math.ceil((big_w + small_w) / small_w)
    before = 0
    while True:
        (alloc,) = [s.allocate(1, {}, now=0.0)]
        (g, n) = alloc[0]
        s.record(g, n, n)
        if g.pack == 2:
            break
        before += 1
    assert before <= bound


def test_greedy_control_starves_the_second_pack() -> None:
    s = Scheduler(capacity=64, fair=False)
    s.observe([(1, "default", 0.0), (2, "default", 0.0)], now=0.0)
    got = _run_rounds(s, 50, 32, {(1, "default"): 10**6, (2, "default"): 10**6})
    assert got[(2, "default")] == 0


def test_parse() -> None:
    assert parse_weights("a=2, b=0.5;c=1") == {"a": 2.0, "b": 0.5, "c": 1.0}
    assert parse_budgets("x=8") == {"x": 8}
    with pytest.raises(ValueError):
        parse_weights("a=0")
    with pytest.raises(ValueError):
        parse_budgets("a=1.5")
