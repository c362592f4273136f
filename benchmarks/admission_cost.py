"""What the per-process claim admission (gate 4, ADR 021) costs a claim: the plain claim statement
of 256 items with ``process=None`` (no admission probe) and with a registered process (one
primary-key probe of ``connector_process`` per authority row), alternating call by call on one
backlog, each claim followed by its finalize, so whatever else the machine does weighs on both.

    .venv/bin/python -m benchmarks.admission_cost [--steps 200]

Prints the median and p10 claim latency of each and their ratio (docs/benchmarks.md, "Session 9").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import psycopg

from benchmarks.common import fresh_migrated_database
from connector.common.store import work_items
from tests.executor import seed

BATCH = 256


async def _alternate(url: str, pack: int, steps: int) -> dict[str | None, list[float]]:
    claim, fin = work_items.claim, work_items.finalize
    c, f = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(2)]
    for conn in (c, f):
        await conn.execute("SET jit = off")
    await c.execute(claim.CLAIM_PLANS[True])  # as the claimer sends unkeyed claims
    times: dict[str | None, list[float]] = {None: [], "proc-1": []}
    for i in range(steps):
        for proc in (None, "proc-1") if i % 2 == 0 else ("proc-1", None):
            t0 = time.perf_counter()
            rows = await claim.work_item_claim_plain_batch(
                c, [pack], ["default"], [BATCH], owner="b", lease_s=60.0, keyed={}, process=proc
            )
            times[proc].append((time.perf_counter() - t0) * 1000)
            assert len(rows) == BATCH, (proc, len(rows))
            await fin.work_item_finalize(f, [r[0] for r in rows], [r[1] for r in rows], fin.FailBatch())
    await c.close()
    await f.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    with fresh_migrated_database("admission") as url:
        with psycopg.connect(url, autocommit=True) as db:
            pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type("benchmarks.executor_bench:noop")})
            seed.seed_items(db, pack, BATCH * 2 * args.steps + BATCH)
            receipts = [r[0] for r in db.execute("SELECT cutover_receipt_id FROM connector_claim_authority")]
            db.execute(
                "INSERT INTO connector_process (process_id, service, hostname, pid, version,"
                " claim_capability, admitted_receipt_ids)"
                " VALUES ('proc-1', 'executor', 'bench', 1, 'bench', 'work_item', %s)",
                (receipts,),
            )
            db.execute("VACUUM ANALYZE connector_work_item")
        times = asyncio.run(_alternate(url, pack, args.steps))
    for proc, ts in times.items():
        label = "admission probe" if proc else "no probe"
        p10 = sorted(ts)[len(ts) // 10]
        print(f"{label:16} claim of {BATCH}: median {statistics.median(ts):.3f} ms, p10 {p10:.3f} ms")
    ratio = statistics.median(times["proc-1"]) / statistics.median(times[None])
    print(f"ratio (probe / no probe): {ratio:.3f}")


if __name__ == "__main__":
    main()
