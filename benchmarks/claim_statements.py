"""The claim statements side by side on one backlog (docs/benchmarks.md, "The plain claim", "Session
6"):

    .venv/bin/python -m benchmarks.claim_statements [--items 60000] [--claims 400] [--batch 64]
        [--rate-keys 100]

Without ``--rate-keys``, on unlimited items: ``WORK_ITEM_CLAIM_PLAIN_BATCH`` (what a batch without
flow keys sends) and ``WORK_ITEM_CLAIM_BATCH`` (the flow statement: rate-limit, concurrency,
debounce and circuit CTEs). With ``--rate-keys N``, on items with one of N rate-limit keys whose
limits never bind: ``WORK_ITEM_CLAIM_RATE_BATCH`` (what a batch with rate keys only sends) and the
flow statement. Each claims ``--batch`` items in turn on one connection each, and each batch is
completed at once by the fenced complete. Alternating call by call, whatever else runs on the
machine weighs on both alike: only the ratio counts. Printed: the median and p90 claim latency of
each statement and their ratio, and the buffers one claim touches (EXPLAIN ANALYZE in a rolled-back
transaction). Runs under ``bench_lock()`` on a scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


async def _measure(url: str, pack: int, claims: int, batch: int, rated: bool) -> dict[str, Any]:
    import psycopg

    from connector.common.store import work_items

    statements = {
        "rate" if rated else "plain": (
            work_items.claim.WORK_ITEM_CLAIM_RATE_BATCH
            if rated
            else work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH
        ),
        "flow": work_items.claim.WORK_ITEM_CLAIM_BATCH,
    }
    params = {
        "packs": [pack],
        "queue_classes": ["default"],
        "limits": [batch],
        "owner": "b",
        "lease_s": 60.0,
        "process": None,
    }
    conns = {k: await psycopg.AsyncConnection.connect(url, autocommit=True) for k in statements}
    for name, conn in conns.items():  # as the services' connections (CONNECTOR_DISABLE_JIT)
        await conn.execute("SET jit = off")
        await conn.execute(work_items.claim.CLAIM_PLANS[name != "flow"])  # as the claimer plans each
    samples: dict[str, list[float]] = {k: [] for k in statements}
    buffers: dict[str, int] = {}
    plans: dict[str, Any] = {}
    try:
        for i in range(claims):
            order = list(statements) if i % 2 == 0 else list(reversed(statements))
            for name in order:
                conn = conns[name]
                t0 = time.perf_counter()
                cur = await conn.execute(statements[name], params, prepare=True)
                rows = [r for r in await cur.fetchall() if r[0] is not None]
                samples[name].append(time.perf_counter() - t0)
                assert len(rows) == batch, (name, len(rows))
                ids = sorted(r[0] for r in rows)
                tok = {r[0]: r[1] for r in rows}
                await work_items.finalize.work_item_complete_batch(conn, ids, [tok[x] for x in ids])
        for name, conn in conns.items():
            cur = await conn.execute(
                "SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements"
            )
            plans[name] = await cur.fetchone()
            async with conn.transaction(force_rollback=True):
                explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statements[name]
                cur = await conn.execute(explain, params)
                plan = (await cur.fetchone())[0][0]["Plan"]  # type: ignore[index]
                buffers[name] = int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    finally:
        for conn in conns.values():
            await conn.close()
    out: dict[str, Any] = {}
    for name, xs in samples.items():
        xs.sort()
        out[name] = {
            "p50_ms": round(statistics.median(xs) * 1000, 3),
            "p90_ms": round(xs[int(len(xs) * 0.9)] * 1000, 3),
            "buffers": buffers[name],
            "generic_custom_plans": plans[name],
        }
    base = "rate" if rated else "plain"
    out["base"] = base
    out["flow_over_base_p50"] = round(out["flow"]["p50_ms"] / out[base]["p50_ms"], 3)
    return out


def run(items: int, claims: int, batch: int, rate_keys: int = 0) -> dict[str, Any]:
    import psycopg

    from benchmarks.common import fresh_migrated_database
    from tests.executor import seed

    assert items >= 2 * claims * batch, "the backlog must outlast the claims"
    with fresh_migrated_database("claims") as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type("benchmarks.executor_bench:noop")})
        keys = [f"k{i % rate_keys}" for i in range(items)] if rate_keys else None
        seed.seed_items(db, pack, items, rate_keys=keys, rate_limit=(10**6, 1.0, 10**6))
        db.execute("VACUUM ANALYZE")
        return asyncio.run(_measure(url, pack, claims, batch, bool(rate_keys)))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import bench_lock

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=60_000)
    ap.add_argument("--claims", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rate-keys", type=int, default=0, help="items with one of N loose rate-limit keys")
    args = ap.parse_args(argv)
    with bench_lock():
        res = run(args.items, args.claims, args.batch, args.rate_keys)
    for name in (res["base"], "flow"):
        r = res[name]
        lat = f"p50 {r['p50_ms']} ms, p90 {r['p90_ms']} ms"
        gc = r["generic_custom_plans"]
        plans = f"{gc[0]} generic / {gc[1]} custom plans"
        print(f"  {name:6} claim of {args.batch}: {lat}, {r['buffers']} buffers ({plans})")
    print(f"  flow / {res['base']} (p50): {res['flow_over_base_p50']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
