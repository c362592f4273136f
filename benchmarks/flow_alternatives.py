"""Rate-limit mechanisms measured against each other (docs/adr/011-rate-limits.md).

    .venv/bin/python -m benchmarks.flow_alternatives [--items 20000] [--conns 4]

A claim loop of ``--conns`` connections (no executor, no handler): each claims a batch of 64 with a
variant of the claim statement and completes what it got at once (the fenced complete batch). It
runs under ``bench_lock()`` on scratch databases. Variants of ``WORK_ITEM_CLAIM_BATCH``:

* ``chosen``: GCRA key rows ``FOR UPDATE SKIP LOCKED``, candidates without budget deferred to their
  budget's time (the shipped statement);
* ``no-defer``: the same without the deferral: a candidate without budget stays where it is;
* ``wait-locks``: the key rows locked ``FOR UPDATE`` (waiting) instead of ``SKIP LOCKED``.

Scenarios: ``loose`` (100 random keys, limits far above capacity; the reference is the same items
without keys, same statement), ``hot`` (one key limited to 10/s holds the first 3,000 items of the
ready order, 3,000 unlimited items behind it: how long until the unlimited ones are done).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _variant(name: str) -> str:
    from connector.common.store import work_items

    q = work_items.claim.WORK_ITEM_CLAIM_BATCH
    if name == "no-defer":
        start = q.index("), deferred AS (")
        end = q.index("), claimed AS (")
        return q[:start] + "), deferred AS (SELECT 1" + q[end:]
    if name == "wait-locks":
        head, tail = q.split("FROM connector_rate_limit k", 1)
        return head + "FROM connector_rate_limit k" + tail.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE", 1)
    return q


async def _loop(
    url: str, pack: int, query: str, stop_when: Any, deadline: float, out: dict[str, int]
) -> None:
    import psycopg

    from connector.common.store import work_items

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    params = {
        "packs": [pack],
        "queue_classes": ["default"],
        "limits": [64],
        "owner": "b",
        "lease_s": 30.0,
        "process": None,
    }
    try:
        while time.monotonic() < deadline and not await stop_when(conn):
            try:
                cur = await conn.execute(query, params, prepare=True)
                rows = [r for r in await cur.fetchall() if r[0] is not None]
            except psycopg.errors.DeadlockDetected:
                out["deadlocks"] += 1
                continue
            out["claims"] += 1
            if rows:
                ids = sorted(r[0] for r in rows)
                tok = {r[0]: r[1] for r in rows}
                await work_items.finalize.work_item_complete_batch(conn, ids, [tok[i] for i in ids])
                out["items"] += len(rows)
            else:
                out["empty"] += 1
                await asyncio.sleep(0.002)
    finally:
        await conn.close()


def run(variant: str, scenario: str, items: int, conns: int) -> dict[str, Any]:
    import psycopg

    from benchmarks.common import fresh_migrated_database
    from tests.executor import seed

    rnd = random.Random(3)
    query = _variant(variant)
    with fresh_migrated_database("flow") as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type("benchmarks.executor_bench:noop")})
        if scenario == "loose":
            keys = [f"k{rnd.randrange(100)}" for _ in range(items)]
            seed.seed_items(db, pack, items, rate_keys=keys, rate_limit=(1_000_000, 1.0, 100_000))
            target = items
        elif scenario == "unlimited":
            seed.seed_items(db, pack, items)
            target = items
        else:  # hot
            seed.seed_items(db, pack, 3000, rate_keys=["hot"] * 3000, rate_limit=(10, 1.0, 1))
            free = seed.seed_items(db, pack, 3000)
            target = len(free)
        db.execute("VACUUM ANALYZE connector_work_item")
        done_sql = (
            "SELECT count(*) FROM connector_work_item WHERE state = 'succeeded' AND rate_key IS NULL"
            if scenario == "hot"
            else "SELECT count(*) FROM connector_work_item WHERE state = 'succeeded'"
        )

        async def stop_when(conn: Any) -> bool:
            return False

        async def main() -> dict[str, int]:
            out = {"claims": 0, "items": 0, "empty": 0, "deadlocks": 0}
            deadline = time.monotonic() + 30

            async def watcher() -> None:
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    if db.execute(done_sql).fetchone()[0] >= target:  # type: ignore[index]
                        break

            watch = asyncio.create_task(watcher())
            loops = [
                asyncio.create_task(_loop(url, pack, query, lambda c: _done(watch), deadline, out))
                for _ in range(conns)
            ]
            await watch
            for t in loops:
                await t
            return out

        async def _done(task: asyncio.Task[None]) -> bool:
            return task.done()

        t0 = time.monotonic()
        out = asyncio.run(main())
        elapsed = time.monotonic() - t0
        done = db.execute(done_sql).fetchone()[0]  # type: ignore[index]
    return {
        "variant": variant,
        "scenario": scenario,
        "seconds": round(elapsed, 2),
        "done": done,
        "of": target,
        "items_per_s": round(done / elapsed),
        **out,
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import bench_lock

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    plan = [
        ("chosen", "unlimited"),
        ("chosen", "loose"),
        ("wait-locks", "loose"),
        ("chosen", "hot"),
        ("no-defer", "hot"),
    ]
    with bench_lock():
        for r in range(args.rounds):
            for variant, scenario in plan:
                res = run(variant, scenario, args.items, args.conns)
                print(f"round {r + 1}: {res}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
