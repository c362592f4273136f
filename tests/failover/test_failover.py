"""Failover under signed load through the real services (issue #26 item 6; harness: harness.py).

Each scenario: a primary + streaming standby (synchronous unless said), the ingress, the materializer
and two executors as real processes given the multi-host URL through their proxies, signed load at a
steady rate; a fault; then every service must serve again (an ack for a request sent after the fault,
an event materialized after it, an effect by each executor after it) without a restart; the load
stops, everything stored drains, and the ledger is checked:

* **0 acked lost** (with the synchronous standby): every delivery answered 200 is on the new primary;
* **0 unfenced duplicates**: no delivery's effect applied twice under one lease token;
* **0 succeeded without running**: every row that became ``succeeded`` did so under a token whose
  effect — for that very delivery — is in the sink;
* **0 identity collisions**: no idempotency key and no (work id, token) names two deliveries;
* **serving again within 15 s** of the fault (of its end, for a partition), same process ids;
* **no provider request hanging** beyond the commit deadline (plus a margin for a loaded machine).

Figures (acked, lost, re-executed, fenced, seconds to serve again per service, longest request) are
printed — ``-s`` shows them; ``CONNECTOR_FAILOVER_FIGURES=<file>`` appends them as JSON lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from tests.failover.harness import Cluster, Load, load_figure, wait_until

pytestmark = pytest.mark.slow

SERVE_AGAIN_S = 15.0
COMMIT_DEADLINE_S = 5.0
HANG_MARGIN_S = 3.0  # the client's view of a 5 s server-side deadline, on a loaded 2-core machine


def _served_again(c: Cluster, since: float) -> dict[str, float | None]:
    """Seconds from ``since`` to each service's first work *for a delivery sent after it* (an ack, its
    event materialized, its effect by each executor: work in flight at the fault does not count);
    None: not yet."""
    assert c.load is not None
    out: dict[str, float | None] = {}
    ack = c.load.first_ack_after(since)
    out["ingress"] = None if ack is None else ack - since
    fresh = c.load.sent_after(since)
    try:
        with c.db() as db:
            row = db.execute(
                "SELECT extract(epoch FROM min(created_at)) FROM connector_event"
                " WHERE created_at > to_timestamp(%s) AND source_object_id = ANY(%s)",
                (since, list(fresh)),
            ).fetchone()
        out["materializer"] = None if row is None or row[0] is None else float(row[0]) - since
    except Exception:  # no writable server yet
        out["materializer"] = None
    effects = c.effects()
    for name in ("executor-a", "executor-b"):
        pid = c.services[name].proc.pid
        walls = [e["wall"] for e in effects if e["pid"] == pid and e["marker"] in fresh]
        out[name] = min(walls) - since if walls else None
    return out


def run(
    c: Cluster,
    name: str,
    fault: Callable[[Cluster], float],
    *,
    expect_loss: bool = False,
) -> dict[str, Any]:
    """Load, ``fault`` (returns the instant serving-again is measured from), the checks; the figures."""
    pids = {n: s.proc.pid for n, s in c.services.items()}
    c.load = load = Load(c.http_port, c.secret).start()
    wait_until(
        lambda: len(load.acked()) >= 150, 90, lambda: f"load not acked: {load.statuses()}\n{c.tails()}"
    )
    since = fault(c)
    again: dict[str, float | None] = {}

    def all_served() -> bool:
        c.check_alive()
        again.update(_served_again(c, since))
        return all(v is not None for v in again.values())

    wait_until(
        all_served, 90,
        lambda: f"{name}: not every service served again after the fault: {again}"
        " (s after it; None = not yet);"
        f" requests {load.statuses()}\n{c.tails()}",
        every=0.25,
    )  # fmt: skip
    acked_then = len(load.acked())
    wait_until(lambda: len(load.acked()) >= acked_then + 150, 90, lambda: f"load stalled: {load.statuses()}")
    load.stop()
    c.drain(load.acked())
    ledger = c.ledger()
    fence = ledger.fence()
    figures = {
        "scenario": name,
        "acked": len(ledger.acked),
        "lost": len(ledger.lost),
        "unfenced_duplicates": fence["unfenced"],
        "reexecuted": fence["reexecuted"],
        "fenced": fence["fenced"],
        "succeeded_without_running": len(ledger.succeeded_without_running()),
        "collisions": sum(len(v) for v in ledger.collisions().values()),
        "serving_again_s": {k: round(v, 1) for k, v in again.items() if v is not None},
        "longest_request_s": round(load.longest(), 1),
        "statuses": load.statuses(),
        "load": load_figure(),
    }
    print(f"\nfailover[{name}]: {json.dumps(figures)}")
    if path := os.environ.get("CONNECTOR_FAILOVER_FIGURES"):
        with open(path, "a") as f:
            f.write(json.dumps(figures) + "\n")

    # the ledger
    assert not ledger.collisions()["keys"] and not ledger.collisions()["tokens"], ledger.collisions()
    assert fence["unfenced"] == 0, f"{fence['unfenced']} effects applied twice under one token: {fence}"
    assert ledger.succeeded_without_running() == [], (
        "rows succeeded under a token that never ran for their delivery: "
        f"{ledger.succeeded_without_running()[:10]}"
    )
    if not expect_loss:
        assert ledger.lost == set(), f"{len(ledger.lost)} acked deliveries lost: {sorted(ledger.lost)[:10]}"
    unrun = ledger.unrun()
    assert unrun == set(), (
        f"{len(unrun)} acked and stored deliveries never ran or did not succeed: {sorted(unrun)[:10]}"
    )
    # every service served again, by itself, in time
    assert {n: s.proc.pid for n, s in c.services.items()} == pids, "a service was restarted"
    late = {k: v for k, v in again.items() if v is None or v > SERVE_AGAIN_S}
    assert not late, (
        f"{name}: serving again later than {SERVE_AGAIN_S} s after the fault: {again} ({load_figure()})"
    )
    hung = [r for r in load.done() if r.end - r.start > COMMIT_DEADLINE_S + HANG_MARGIN_S]
    assert not hung, (
        f"{len(hung)} provider requests waited longer than the {COMMIT_DEADLINE_S} s commit deadline"
        f" (+{HANG_MARGIN_S} s): longest {load.longest():.1f} s,"
        f" answers {[(r.status, r.error) for r in hung[:5]]}"
    )
    return figures


# -- faults ----------------------------------------------------------------------------------------------


def kill_primary(c: Cluster) -> float:
    """kill -9 of the primary (its sockets reset: loud), then the standby promoted."""
    at = c.fault("kill -9 primary")
    c.pair.kill_primary()
    c.pair.promote()
    return at


@pytest.mark.parametrize("replication", ["sync"])
def test_kill_primary(replication: str) -> None:
    with Cluster(synchronous=replication == "sync") as c:
        run(c, f"kill9-{replication}", kill_primary)
