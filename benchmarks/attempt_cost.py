"""What the attempt history (issue #25, ``connector_work_attempt``) costs the failure path: the fail
statement of this build (``WORK_ITEM_FAIL_BATCH``: the update, the old owner's primary-key probe and
the attempt upsert in one statement) against the statement before it (the update alone, kept here
verbatim as ``BEFORE``), alternating batch by batch on one table: each step claims the same 64 items
and fails them as retries due at once. Each execution runs under ``EXPLAIN (ANALYZE, BUFFERS, WAL)``:
shared buffers touched and WAL bytes are the statement's own (they do not swing with the machine's
load, unlike its time); the tables are vacuumed after every execution. The "after" rows are split by
whether the attempt upsert inserted (a slot never used) or overwrote a slot (the ring full: every
item with 20 kept attempts). Then the reclaim of expired leases, before and after, likewise (the
ring full by then: its attempt writes overwrite). The success path's statement
(``WORK_ITEM_COMPLETE_BATCH``) is unchanged (tests/data/statement_digests.json); docs/benchmarks.md,
"Attempt history".

    .venv/bin/python -m benchmarks.attempt_cost [--steps 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

import psycopg

from benchmarks.common import fresh_migrated_database
from connector.common.store import work_items
from connector.common.store.work_items.claim import AUTHORITY_ROWS
from tests.executor import seed

BATCH = 64

# WORK_ITEM_FAIL_BATCH before the attempt history (main at 320e7b7).
BEFORE = """
WITH f AS (
  SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(ops)s::text[], %(delays)s::float8[],
                       %(unstarted)s::int[], %(classes)s::text[], %(summaries)s::text[])
    AS f(id, token, op, delay, unstarted, fclass, summary)
)
UPDATE connector_work_item w
SET state = CASE
      WHEN f.op = 'd' OR (f.op = 'r' AND w.attempts >= w.max_attempts) THEN 'dead'
      WHEN f.op = 'r' THEN 'retry'
      WHEN w.attempts - f.unstarted > 0 THEN 'retry'
      ELSE 'pending' END,
    attempts = w.attempts - f.unstarted,
    run_after = CASE WHEN f.op = 'r' AND w.attempts < w.max_attempts
      THEN now() + make_interval(secs => f.delay) ELSE w.run_after END,
    outcome = CASE WHEN f.op = 'd' OR (f.op = 'r' AND w.attempts >= w.max_attempts)
      THEN 'failed' ELSE NULL END,
    failure_class = CASE WHEN f.op = 'l' THEN w.failure_class ELSE f.fclass END,
    failure_summary = CASE
      WHEN f.op = 'l' THEN w.failure_summary
      WHEN f.op = 'r' AND w.attempts >= w.max_attempts
        THEN left('gave up after ' || w.attempts || ' attempts: ' || f.summary, 512)
      ELSE f.summary END,
    finished_at = CASE WHEN f.op = 'd' OR (f.op = 'r' AND w.attempts >= w.max_attempts)
      THEN clock_timestamp() ELSE NULL END,
    lease_owner = NULL, lease_until = NULL, updated_at = clock_timestamp()
FROM f
WHERE w.work_id = ANY(%(ids)s::bigint[]) AND w.work_id = f.id AND w.lease_token = f.token
  AND w.state = 'processing'
RETURNING w.work_id, w.state
"""

# WORK_ITEM_RECLAIM_EXPIRED before the attempt history (main at 320e7b7).
RECLAIM_BEFORE = f"""
WITH auth AS MATERIALIZED ({AUTHORITY_ROWS}
)
UPDATE connector_work_item w
SET state = CASE WHEN w.attempts >= w.max_attempts THEN 'dead' ELSE 'retry' END,
    run_after = now(),
    outcome = CASE WHEN w.attempts >= w.max_attempts THEN 'failed' ELSE NULL END,
    failure_class = 'lease_expired',
    failure_summary = 'the lease expired before its holder finished (holder presumed dead or paused)',
    finished_at = CASE WHEN w.attempts >= w.max_attempts THEN clock_timestamp() ELSE NULL END,
    lease_owner = NULL, lease_until = NULL, updated_at = clock_timestamp()
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE w.work_id = ANY(%(ids)s::bigint[]) AND w.work_id = f.id AND w.lease_token = f.token
  AND w.state = 'processing' AND w.lease_until < clock_timestamp()
  AND w.generation = ANY (ARRAY(SELECT a.generation FROM auth a
                               WHERE a.installed_pack_id = w.installed_pack_id))
RETURNING w.work_id, w.state, w.installed_pack_id
"""


def _nodes(node: dict) -> list[dict]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


def _figures(plan: dict) -> tuple[int, int]:
    """(shared buffers hit + read, WAL bytes) of a whole statement: the sum over its write nodes
    (``ModifyTable``: the update, and the attempt insert of a data-modifying CTE, which the top node's
    counters leave out), each inclusive of the scans and subplans below it."""
    writes = [n for n in _nodes(plan["Plan"]) if n["Node Type"] == "ModifyTable"]
    buffers = sum(int(n.get("Shared Hit Blocks", 0)) + int(n.get("Shared Read Blocks", 0)) for n in writes)
    return buffers, sum(int(n.get("WAL Bytes", 0)) for n in writes)


async def _run(url: str, pack: int, steps: int) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {"before": [], "after (insert)": [], "after (overwrite)": []}
    db = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await db.execute("SET jit = off")

    async def count() -> int:
        return int((await (await db.execute("SELECT count(*) FROM connector_work_attempt")).fetchone())[0])  # type: ignore[index]

    for i in range(steps):
        for which in ("before", "after") if i % 2 == 0 else ("after", "before"):
            rows = await work_items.claim.work_item_claim_batch(
                db, [pack], ["default"], [BATCH], owner="bench", lease_s=60.0
            )
            assert len(rows) == BATCH, len(rows)
            rows = sorted(rows)
            params = {
                "ids": [r[0] for r in rows], "tokens": [r[1] for r in rows], "ops": ["r"] * BATCH,
                "delays": [0.0] * BATCH, "unstarted": [0] * BATCH, "classes": ["http_503"] * BATCH,
                "summaries": ["upstream answered 503 Service Unavailable"] * BATCH,
            }  # fmt: skip
            kept = await count()
            query = BEFORE if which == "before" else work_items.finalize.WORK_ITEM_FAIL_BATCH
            cur = await db.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + query, params)
            ((plan,),) = await cur.fetchall()
            plan = plan if isinstance(plan, list) else json.loads(plan)
            grew = await count() - kept
            label = which if which == "before" else ("after (insert)" if grew else "after (overwrite)")
            out[label].append(_figures(plan[0]))
            await db.execute("UPDATE connector_work_item SET run_after = now() - interval '1 s'")
            # Every execution on the same table state: no dead row versions left from the step before.
            await db.execute("VACUUM connector_work_item, connector_work_attempt")
    # The reclaim of expired leases: the same items claimed with a lease already over, reclaimed.
    for i in range(steps):
        for which in (
            ("reclaim before", "reclaim after") if i % 2 == 0 else ("reclaim after", "reclaim before")
        ):
            rows = sorted(
                await work_items.claim.work_item_claim_batch(
                    db, [pack], ["default"], [BATCH], owner="bench", lease_s=60.0
                )
            )
            assert len(rows) == BATCH, len(rows)
            await db.execute("UPDATE connector_work_item SET lease_until = now() - interval '1 s'")
            params = {"ids": [r[0] for r in rows], "tokens": [r[1] for r in rows], "packs": [pack]}
            query = (
                RECLAIM_BEFORE if which == "reclaim before" else work_items.finalize.WORK_ITEM_RECLAIM_EXPIRED
            )
            cur = await db.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + query, params)
            ((plan,),) = await cur.fetchall()
            plan = plan if isinstance(plan, list) else json.loads(plan)
            out.setdefault(which, []).append(_figures(plan[0]))
            await db.execute("UPDATE connector_work_item SET run_after = now() - interval '1 s'")
            await db.execute("VACUUM connector_work_item, connector_work_attempt")
    await db.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    with fresh_migrated_database("attempts") as url:
        with psycopg.connect(url, autocommit=True) as db:
            pack = seed.seed_pack(db, "bench", {"w": seed.python_work_type("benchmarks.executor_bench:noop")})
            seed.seed_items(db, pack, BATCH, max_attempts=100_000)
            db.execute("VACUUM ANALYZE connector_work_item")
        figures = asyncio.run(_run(url, pack, args.steps))
    print(f"{BATCH} items per execution; per item (median over executions):")
    print(f"{'statement':<20} {'executions':>10} {'buffers/item':>13} {'WAL bytes/item':>15}")
    for label, xs in figures.items():
        if not xs:
            continue
        b = statistics.median(x[0] for x in xs) / BATCH
        w = statistics.median(x[1] for x in xs) / BATCH
        print(f"{label:<20} {len(xs):>10} {b:>13.1f} {w:>15.0f}")


if __name__ == "__main__":
    main()
