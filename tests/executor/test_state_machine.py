"""A hypothesis state machine over the real claim statements: claim, renew, complete, retry, dead,
release, lease expiry and reclaim, by several holders at once, checked against a model.

Invariants after every step: the row's state, token and attempts equal the model's; a write by a
holder whose token is not the row's current one never changes anything; tokens only grow; at most
one holder can make a fenced write for an item.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from connector.common.store import work_items
from tests.executor import seed

ITEMS = 3
HOLDERS = 3
MAX_ATTEMPTS = 3


@dataclass
class Model:
    state: str = "pending"
    token: int = 0
    attempts: int = 0
    expired: bool = False
    due: int = 0  # order of run_after (retry and reclaim move an item behind everything due)


class ClaimMachine(RuleBasedStateMachine):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.db = psycopg.connect(url, autocommit=True)
        self.db.execute(
            "TRUNCATE connector_work_attempt, connector_work_item, connector_event, connector_ingress_receipt"
            " CASCADE"
        )
        row = self.db.execute(
            "SELECT installed_pack_id FROM connector_installed_pack WHERE name = 'sm'"
        ).fetchone()
        self.pack = row[0] if row else seed.seed_pack(self.db, "sm", {"w": seed.python_work_type("x:y")})
        self.ids = seed.seed_items(self.db, self.pack, ITEMS, max_attempts=MAX_ATTEMPTS)
        self.conn = self.run(psycopg.AsyncConnection.connect(url, autocommit=True))
        self.model = {i: Model() for i in self.ids}
        # what each holder believes it holds: work_id -> token
        self.held: list[dict[int, int]] = [{} for _ in range(HOLDERS)]
        self.clock = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.conn.close())
        self.loop.close()
        self.db.close()

    def _valid(self, work_id: int, token: int) -> bool:
        m = self.model[work_id]
        return m.state == "processing" and m.token == token

    def _pick(self, holder: int, k: int) -> tuple[int, int] | None:
        items = sorted(self.held[holder].items())
        return items[k % len(items)] if items else None

    def _later(self) -> int:
        self.clock += 1
        return self.clock

    @rule(holder=st.integers(0, HOLDERS - 1), n=st.integers(1, ITEMS - 1))
    def claim(self, holder: int, n: int) -> None:
        rows = self.run(
            work_items.claim.work_item_claim_batch(
                self.conn, [self.pack], ["default"], [n], owner=f"h{holder}", lease_s=60
            )
        )
        ready = sorted((m.due, i) for i, m in self.model.items() if m.state in ("pending", "retry"))
        assert sorted(r[0] for r in rows) == sorted(i for _, i in ready[:n])
        for r in rows:
            m = self.model[r[0]]
            assert r[1] == m.token + 1  # strictly increasing
            m.state, m.token, m.attempts, m.expired = "processing", r[1], m.attempts + 1, False
            assert r[7] == m.attempts
            self.held[holder][r[0]] = r[1]

    @rule(holder=st.integers(0, HOLDERS - 1), k=st.integers(0, 10))
    def renew(self, holder: int, k: int) -> None:
        pick = self._pick(holder, k)
        if pick is None:
            return
        work_id, token = pick
        renewed = self.run(
            work_items.finalize.work_item_renew_lease_batch(self.conn, [work_id], [token], lease_s=60)
        )
        assert (work_id in renewed) == self._valid(work_id, token)
        if work_id in renewed:
            self.model[work_id].expired = False
        else:
            del self.held[holder][work_id]  # a lost lease is abandoned

    @rule(holder=st.integers(0, HOLDERS - 1), k=st.integers(0, 10), op=st.sampled_from(["ok", "r", "d", "l"]))
    def finalize(self, holder: int, k: int, op: str) -> None:
        pick = self._pick(holder, k)
        if pick is None:
            return
        work_id, token = pick
        del self.held[holder][work_id]
        valid = self._valid(work_id, token)
        m = self.model[work_id]
        if op == "ok":
            done = self.run(work_items.finalize.work_item_complete_batch(self.conn, [work_id], [token]))
            assert bool(done) == valid
            if valid:
                m.state = "succeeded"
            return
        if op == "r":
            got = self.run(
                work_items.finalize.work_item_retry_batch(self.conn, [work_id], [token], [0.0], ["c"], ["s"])
            )
            expect = ("dead" if m.attempts >= MAX_ATTEMPTS else "retry") if valid else None
        elif op == "d":
            got = self.run(
                work_items.finalize.work_item_dead_batch(self.conn, [work_id], [token], ["c"], ["s"])
            )
            expect = "dead" if valid else None
        else:
            got = self.run(work_items.finalize.work_item_release_batch(self.conn, [work_id], [token], [True]))
            expect = ("retry" if m.attempts - 1 > 0 else "pending") if valid else None
            if valid:
                m.attempts -= 1
        assert got == ([(work_id, expect)] if expect else [])
        if expect:
            m.state = expect
            if op == "r":
                m.due = self._later()

    @rule(k=st.integers(0, ITEMS - 1))
    def lease_expires(self, k: int) -> None:
        """Time passes for one item: its lease ends (database time)."""
        work_id = self.ids[k]
        if self.model[work_id].state != "processing":
            return
        self.db.execute(
            "UPDATE connector_work_item SET lease_until = clock_timestamp() - interval '1 ms' "
            "WHERE work_id = %s",
            (work_id,),
        )
        self.model[work_id].expired = True

    @rule(k=st.integers(0, ITEMS - 1), holder=st.integers(0, HOLDERS - 1))
    def takeover(self, k: int, holder: int) -> None:
        """A holder pauses past its lease; the item is reclaimed and claimed by ``holder``."""
        self.lease_expires(k)
        self.reclaim()
        self.claim(holder, ITEMS)

    @rule()
    def reclaim(self) -> None:
        got = {r.work_id: r.state for r in self.run(work_items.finalize.work_item_reclaim_expired(self.conn))}
        expect = {}
        for work_id, m in self.model.items():
            if m.state == "processing" and m.expired:
                expect[work_id] = "dead" if m.attempts >= MAX_ATTEMPTS else "retry"
        assert got == expect
        for work_id, state in sorted(got.items()):
            self.model[work_id].state = state
            self.model[work_id].expired = False
            self.model[work_id].due = self.clock + 1
        if got:
            self.clock += 1

    @invariant()
    def rows_match_model(self) -> None:
        rows = self.db.execute(
            "SELECT work_id, state, lease_token, attempts FROM connector_work_item ORDER BY work_id"
        ).fetchall()
        for work_id, state, token, attempts in rows:
            m = self.model[work_id]
            assert (state, token, attempts) == (m.state, m.token, m.attempts), (work_id, m)

    @invariant()
    def at_most_one_valid_holder(self) -> None:
        for work_id in self.ids:
            valid = [h for h in range(HOLDERS) if self._valid(work_id, self.held[h].get(work_id, -1))]
            assert len(valid) <= 1


def test_claim_state_machine(db_url: str) -> None:
    run_state_machine_as_test(
        lambda: ClaimMachine(db_url),
        settings=settings(
            max_examples=80,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
