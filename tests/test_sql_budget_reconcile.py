"""The SQL budget of a reconciliation pass (issue #27): a pass over a sender list sends a bounded
number of statements per page of the list — one batched receipt lookup, one checkpoint, the group
commit of the page's missing deliveries — and a constant besides, never a statement per listed
event (``benchmarks.reconcile_budget``: a private cluster with ``pg_stat_statements``, ``connector
ingress`` as a real process, a Stripe-shaped list API on loopback).

Control: ``test_per_event_lookup_is_caught`` runs the same pass with a test build of the ingress
(``tests/sqlbudget_amplified_ingress.py``) that looks up each listed delivery on its own, and
asserts the same check reports it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import reconcile_budget  # noqa: E402

pytestmark = pytest.mark.slow

EVENTS, PAGE, MISSING = 3000, 100, 30


def test_a_pass_is_within_its_budget() -> None:
    rep = reconcile_budget.run(EVENTS, PAGE, MISSING)
    assert rep["list_requests"] == rep["pages"] == EVENTS // PAGE
    assert rep["admitted"] == rep["missing"] == MISSING
    name = "connector.common.store.receipts.insert.RECEIPT_KEYS_PRESENT"
    assert rep["statements"][name]["calls"] == rep["pages"]  # one lookup per page, every page
    assert rep["statements"][name]["rows"] == EVENTS - MISSING
    assert reconcile_budget.check(rep) == [], reconcile_budget.render(rep)


def test_per_event_lookup_is_caught() -> None:
    amplified = [sys.executable, "-m", "tests.sqlbudget_amplified_ingress", "ingress"]
    rep = reconcile_budget.run(EVENTS, PAGE, MISSING, command=amplified)
    problems = reconcile_budget.check(rep)
    assert any("RECEIPT_KEYS_PRESENT" in p and f"{EVENTS} calls" in p for p in problems), problems
