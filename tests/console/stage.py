"""The scene the console tests look at: a pack with dead letters in lanes (one failure group), a
blocked lane, a circuit breaker forced open, a paused pack, a cutover in progress and registered
processes — seeded the way the services leave them (tests/admin/conftest.py Seed, the admin API for
the operator actions)."""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from tests.admin.conftest import Seed
from tests.executor import seed as eseed

SUMMARY = "crm refused the change: 422"
CIRCUIT_TARGET = "https://crm.internal:443"


@dataclass
class Scene:
    shop: int
    crm: int
    legacy: int
    dead: list[int] = field(default_factory=list)
    lanes: dict[str, list[int]] = field(default_factory=dict)
    blocked_head: int = 0
    blocked_member: int = 0
    receipt_of_dead: int = 0


async def dead_letters(seed: Seed, pack: int, n: int, lanes: int) -> dict[str, list[int]]:
    """``n`` dead letters of one failure group spread over ``lanes`` source lanes, in lane order."""
    out: dict[str, list[int]] = {}
    for i in range(n):
        key = f"sync:order-{i % lanes}"
        work_id = await seed.item(pack, source_lane=key, finished_ago_s=600 - i, dead_blocks=False)
        out.setdefault(key, []).append(work_id)
    await seed.conn.execute(
        "UPDATE connector_work_item SET failure_class = 'downstream_rejected', failure_summary = %s"
        " WHERE installed_pack_id = %s AND state = 'dead'",
        (SUMMARY, pack),
    )
    return out


async def attempts_of(seed: Seed, work_id: int) -> None:
    """The attempt rows the fail statement leaves for a dead letter of three attempts (issue #25):
    two timeouts by one executor, then the refusal that made it dead, by another."""
    await seed.conn.execute("UPDATE connector_work_item SET lease_token = 3 WHERE work_id = %s", (work_id,))
    await seed.conn.execute(
        "INSERT INTO connector_work_attempt (work_id, slot, lease_token, attempt, lease_owner, started_at,"
        " ended_at, outcome, failure_class, failure_summary)"
        " SELECT %(w)s, n, n, n, CASE WHEN n < 3 THEN 'executor-7f3a' ELSE 'executor-91c2' END,"
        "  now() + make_interval(secs => 0.2 * (n - 1)),"
        "  now() + make_interval(secs => 0.2 * (n - 1) + 0.05 * n),"
        "  CASE WHEN n < 3 THEN 'retry' ELSE 'dead' END,"
        "  CASE WHEN n < 3 THEN 'timeout' ELSE 'downstream_rejected' END,"
        "  CASE WHEN n < 3 THEN 'the handler ran past timeout_s (10 s)' ELSE %(s)s END"
        " FROM generate_series(1, 3) n",
        {"w": work_id, "s": SUMMARY},
    )


async def stage(seed: Seed, db: psycopg.Connection, *, dead: int = 8, lanes: int = 3) -> Scene:
    shop = await seed.pack("shop", dead_head="continue")
    crm = eseed.seed_pack(db, "crm", {"w": eseed.python_work_type("tests.executor.effects:noop")})
    eseed.seed_items(db, crm, 2, circuit_keys=[CIRCUIT_TARGET] * 2, circuit={"consecutive_failures": 5})
    legacy = await seed.pack("legacy", claim_path="none")  # quiescing: a cutover in progress
    scene = Scene(shop, crm, legacy)
    scene.lanes = await dead_letters(seed, shop, dead, lanes)
    scene.dead = sorted(w for ids in scene.lanes.values() for w in ids)
    scene.receipt_of_dead = int(
        await seed.one(
            "SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
            " WHERE w.work_id = %s",
            (scene.dead[0],),
        )
    )
    await attempts_of(seed, scene.dead[0])
    billing = await seed.pack("billing", routes={"invoices": ["post"]})
    scene.blocked_head = await seed.item(
        billing, route_key="invoices", work_type="post", source_lane="post:inv-7", failure_class="timeout"
    )
    scene.blocked_member = await seed.item(
        billing, route_key="invoices", work_type="post", state="blocked", source_lane="post:inv-7"
    )
    for _ in range(3):  # receipts whose routing failed: an incident of their own
        await seed.receipt(
            "shop", "orders", status="failed", error_class="required_missing",
            error_summary="the envelope has no /data/id (route orders)",
        )  # fmt: skip
    await seed.process("work_item", service="executor", pid=4242)
    await seed.process("none", service="ingress", pid=4243, age_s=120.0)
    return scene
