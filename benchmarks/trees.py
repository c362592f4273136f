"""Before and after across checkouts, interleaved in one sitting (docs/benchmarks.md, "Session 6").

    .venv/bin/python -m benchmarks.trees drain TREE [TREE ...] [--only nolanes-1p] [--items 50000]
        [--rounds 3]
    .venv/bin/python -m benchmarks.trees statements TREE [TREE ...] [--claims 300] [--batch 256]

A TREE is a checkout of this repository (``git worktree add --detach /work/wt-x <commit>``) with its
own ``.venv`` (its executor must run its own code). Both modes run on one private PostgreSQL cluster
(``benchmarks/pgcluster.py``, with ``pg_stat_statements``), so no other database's traffic weighs on
either side.

``drain``: ``benchmarks.executor_bench --only ONLY`` of each tree in turn, ``--rounds`` times
(tree order alternating), printing each run's rows and the server time of its claim and finalize
statements (``pg_stat_statements``: calls, mean ms, total ms), reset before every run.

``statements``: one process per tree (its own code, on its own backlog of unlimited items) does one
claim (the statement its executor sends for unkeyed work) and one finalize of ``--batch`` items per
step; the steps alternate between the trees call by call, so whatever else the machine does weighs
on all alike. Printed: the median claim and finalize latency per tree and the ratio of their sum to
the first tree's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The per-tree worker of ``statements``: runs with the tree's interpreter, in the tree.
_WORKER = r"""
import asyncio, os, sys, time
sys.path.insert(0, os.getcwd())
import psycopg
BATCH, ITEMS = int(os.environ["BATCH"]), int(os.environ["ITEMS"])

async def loop(url, pack):
    # A tree's store: one work_items module (before the regrouping, ADR 015) or the package with
    # its claim and finalize modules.
    import connector.common.store.work_items as w
    claim, fin = getattr(w, "claim", w), getattr(w, "finalize", w)
    plain = hasattr(claim, "work_item_claim_plain_batch")
    # As in the executor: the claimer's connection, and the finalizer's.
    c, f = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(2)]
    for conn in (c, f):
        await conn.execute("SET jit = off")
    if hasattr(claim, "CLAIM_PLANS"):  # the plan mode the tree's claimer gives its unkeyed claims
        await c.execute(claim.CLAIM_PLANS[True])
    print("ready", flush=True)
    for _ in sys.stdin:
        t0 = time.perf_counter()
        if plain:
            rows = await claim.work_item_claim_plain_batch(
                c, [pack], ["default"], [BATCH], owner="b", lease_s=60.0, keyed={})
        else:
            rows = await claim.work_item_claim_batch(c, [pack], ["default"], [BATCH], owner="b", lease_s=60.0)
        t1 = time.perf_counter()
        assert len(rows) == BATCH, len(rows)
        await fin.work_item_finalize(f, [r[0] for r in rows], [r[1] for r in rows], fin.FailBatch())
        print(f"{(t1 - t0) * 1000:.3f} {(time.perf_counter() - t1) * 1000:.3f}", flush=True)

from benchmarks.common import fresh_migrated_database
from tests.executor import seed
with fresh_migrated_database("trees") as url:
    with psycopg.connect(url, autocommit=True) as db:
        pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type("benchmarks.executor_bench:noop")})
        seed.seed_items(db, pack, ITEMS)
        db.execute("VACUUM ANALYZE connector_work_item")
    asyncio.run(loop(url, pack))
"""

_TOP = """
SELECT calls, round(mean_exec_time::numeric, 3), round(total_exec_time::numeric, 1),
       left(regexp_replace(query, '\\s+', ' ', 'g'), 70)
FROM pg_stat_statements
WHERE calls >= 20 AND (query LIKE '%%connector_work_item w%%' OR query LIKE 'WITH auth%%')
ORDER BY total_exec_time DESC LIMIT 6
"""


def _python(tree: Path) -> str:
    exe = tree / ".venv" / "bin" / "python"
    if not exe.exists():
        raise SystemExit(f"{tree}: no .venv (python3 -m venv .venv && .venv/bin/pip install -e '.[dev]')")
    return str(exe)


def _cluster():  # type: ignore[no-untyped-def]
    from benchmarks.pgcluster import PrivateCluster

    return PrivateCluster(
        {
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "all",
            "shared_buffers": "256MB",
            "autovacuum": "off",  # as the machine's server in these benchmarks
        }
    )


def drain(trees: list[Path], only: str, items: int, rounds: int) -> None:
    import psycopg

    with _cluster() as cl:
        url = cl.url("postgres", "postgres")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for r in range(rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                with psycopg.connect(url, autocommit=True) as c:
                    c.execute("SELECT pg_stat_statements_reset()")
                out = subprocess.run(
                    [_python(tree), "-m", "benchmarks.executor_bench", "--only", only, "--items", str(items)],
                    cwd=tree,
                    env={**os.environ, "CONNECTOR_TEST_DATABASE_URL": url},
                    capture_output=True,
                    text=True,
                    check=False,
                )
                print(f"== {tree} (round {r + 1})", flush=True)
                for line in out.stdout.splitlines():
                    if line.startswith("  "):
                        print(line)
                if out.returncode:
                    print(out.stderr[-2000:])
                with psycopg.connect(url, autocommit=True) as c:
                    for row in c.execute(_TOP):
                        print("   sql:", *row)


def statements(trees: list[Path], claims: int, batch: int) -> None:
    with _cluster() as cl:
        env = {
            **os.environ,
            "CONNECTOR_TEST_DATABASE_URL": cl.url("postgres", "postgres"),
            "BATCH": str(batch),
            "ITEMS": str(claims * batch + 10 * batch),
        }
        procs = {
            t: subprocess.Popen(
                [_python(t), "-c", _WORKER],
                cwd=t,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for t in trees
        }
        try:
            for t, p in procs.items():
                assert p.stdout is not None
                line = p.stdout.readline()
                if line.strip() != "ready":
                    raise SystemExit(f"{t}: the worker did not start")
            samples: dict[Path, tuple[list[float], list[float]]] = {t: ([], []) for t in trees}
            for i in range(claims):
                for t in trees if i % 2 == 0 else trees[::-1]:
                    p = procs[t]
                    assert p.stdin is not None and p.stdout is not None
                    p.stdin.write("x\n")
                    p.stdin.flush()
                    a, b = map(float, p.stdout.readline().split())
                    samples[t][0].append(a)
                    samples[t][1].append(b)
        finally:
            for p in procs.values():
                if p.stdin:
                    p.stdin.close()
                p.wait(timeout=120)
    sums = {t: statistics.median(c) + statistics.median(f) for t, (c, f) in samples.items()}
    for t, (c, f) in samples.items():
        claim, fin = statistics.median(c), statistics.median(f)
        print(
            f"  {t!s:24} claim p50 {claim:.3f} ms, finalize p50 {fin:.3f} ms,"
            f" sum / first tree {sums[t] / sums[trees[0]]:.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import bench_lock

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["drain", "statements"])
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--only", default="nolanes-1p")
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--claims", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    if args.mode == "drain":  # each executor_bench run takes the benchmark lock itself
        drain(trees, args.only, args.items, args.rounds)
    else:
        with bench_lock():
            statements(trees, args.claims, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
