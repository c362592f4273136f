"""A closed circuit breaker's claim + finalize at the statement level, alternating batch by batch
(docs/adr/013-circuit-breakers.md, amendment of issue #29 item 2).

Three paths drain the same kind of backlog in one scratch database, one batch each in turn (so a
loaded machine slows all three alike): ``plain`` (a pack without a breaker: the plain claim, the
autocommit complete), ``flow`` (a breaker's items as before the amendment: the flow claim) and
``circuit`` (the circuit claim), both finalized as the executor does a breaker's flush (``BEGIN``,
complete, ``CIRCUIT_RECORD``, ``COMMIT``). Each path has its own claim and finalize
connections, run as the executor runs them (generic plans for the plain and circuit claims), and
the CPU time of their two server backends is read from ``/proc`` (PostgreSQL must run on this
machine): PostgreSQL CPU per item does not swing with the machine's load the way throughput does.
Client wall time per item (round trips included) is printed too.

    .venv/bin/python -m benchmarks.breaker_statements --batches 60 --batch 256 --flush 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import psycopg

from benchmarks.common import bench_lock, fresh_migrated_database
from connector.common.packs.manifest import HandlerSpec, circuit_target
from connector.common.store import circuits, work_items
from tests.executor import seed

HANDLER = "tests.executor.effects:noop"
BREAKER = {"consecutive_failures": 5, "open_s": 30}
PATHS = ("plain", "flow", "circuit")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _conn(url: str) -> tuple[psycopg.AsyncConnection[Any], int]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]  # type: ignore[index]
    return conn, int(pid)


async def _batch(path: str, claim_conn: Any, fin_conn: Any, pack: int, n: int, flush: int, key: str) -> int:
    kw: dict[str, Any] = {"owner": path, "lease_s": 60.0}
    if path == "plain":
        rows = await work_items.claim.work_item_claim_plain_batch(
            claim_conn, [pack], ["default"], [n], keyed={}, **kw
        )
    elif path == "circuit":
        rows = await work_items.claim.work_item_claim_circuit_batch(
            claim_conn, [pack], ["default"], [n], keyed={}, **kw
        )
    else:
        rows = await work_items.claim.work_item_claim_batch(claim_conn, [pack], ["default"], [n], **kw)
    for i in range(0, len(rows), flush):
        part = rows[i : i + flush]
        ids, tokens = [r[0] for r in part], [r[1] for r in part]
        if path == "plain":
            await work_items.finalize.work_item_complete_batch(fin_conn, ids, tokens)
        else:  # a breaker's flush: BEGIN, complete, the feed, COMMIT
            async with fin_conn.transaction():
                done = await work_items.finalize.work_item_complete_batch(fin_conn, ids, tokens)
                await circuits.circuit_record(fin_conn, [(pack, key, w, circuits.SUCCESS) for w in done])
    return len(rows)


async def run(url: str, batches: int, n: int, flush: int) -> dict[str, dict[str, float]]:
    key = circuit_target(HandlerSpec(kind="python", target=HANDLER))
    with psycopg.connect(url, autocommit=True) as db:
        wt = seed.python_work_type(HANDLER)
        packs: dict[str, int] = {}
        for path in PATHS:
            w = dict(wt)
            if path != "plain":
                w["circuit_breaker"] = BREAKER
            packs[path] = seed.seed_pack(db, path, {"w": w})
            total = batches * n
            for start in range(0, total, 50_000):
                m = min(50_000, total - start)
                seed.seed_items(
                    db,
                    packs[path],
                    m,
                    circuit_keys=[key] * m if path != "plain" else None,
                    circuit=BREAKER if path != "plain" else None,
                )
        db.execute("VACUUM ANALYZE")
        db.execute("CHECKPOINT")
    conns = {p: (await _conn(url), await _conn(url)) for p in PATHS}
    for p in ("plain", "circuit"):
        await conns[p][0][0].execute(work_items.claim.CLAIM_PLANS[True])
    cpu = dict.fromkeys(PATHS, 0.0)
    claim_cpu = dict.fromkeys(PATHS, 0.0)
    wall = dict.fromkeys(PATHS, 0.0)
    items = dict.fromkeys(PATHS, 0)
    for b in range(batches):
        order = PATHS[b % len(PATHS) :] + PATHS[: b % len(PATHS)]
        for p in order:
            (cc, cpid), (fc, fpid) = conns[p]
            c0, f0 = _cpu_s(cpid), _cpu_s(fpid)
            t0 = time.perf_counter()
            got = await _batch(p, cc, fc, packs[p], n, flush, key)
            wall[p] += time.perf_counter() - t0
            claim_cpu[p] += _cpu_s(cpid) - c0
            cpu[p] += _cpu_s(cpid) - c0 + _cpu_s(fpid) - f0
            items[p] += got
    for (cc, _), (fc, _) in conns.values():
        await cc.close()
        await fc.close()
    return {
        p: {
            "items": items[p],
            "postgres_cpu_us_per_item": round(cpu[p] / items[p] * 1e6, 2),
            "claim_cpu_us_per_item": round(claim_cpu[p] / items[p] * 1e6, 2),
            "wall_us_per_item": round(wall[p] / items[p] * 1e6, 2),
        }
        for p in PATHS
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--batch", type=int, default=256, help="items per claim")
    ap.add_argument("--flush", type=int, default=64, help="items per finalize flush")
    args = ap.parse_args(argv)
    with bench_lock(), fresh_migrated_database("breaker_statements") as url:
        load = os.getloadavg()
        res = asyncio.run(run(url, args.batches, args.batch, args.flush))
    print(
        f"breaker statements: {args.batches} batches of {args.batch}, flushes of {args.flush}, "
        f"load {load[0]:.1f}"
    )
    base = res["plain"]
    for p, r in res.items():
        cpu_x = r["postgres_cpu_us_per_item"] / base["postgres_cpu_us_per_item"]
        wall_x = r["wall_us_per_item"] / base["wall_us_per_item"]
        print(
            f"  {p:8s} PostgreSQL CPU {r['postgres_cpu_us_per_item']:6.2f} us/item ({cpu_x:.2f}x plain; "
            f"claim {r['claim_cpu_us_per_item']:.2f}), wall {r['wall_us_per_item']:6.2f} us/item "
            f"({wall_x:.2f}x plain)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
