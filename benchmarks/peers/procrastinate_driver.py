"""Drain benchmark for Procrastinate, run by the peer's own throwaway venv (not the project's).

    BENCH_CONFIG='<json>' <peer-venv>/bin/python procrastinate_driver.py
    config: {conninfo, items, concurrency, locks, pool_size, cap_s}

Steps: apply Procrastinate's schema to the given, empty database; insert ``items`` no-op jobs through
its own ``procrastinate_defer_jobs_v1`` function (chunks of 10,000, one statement each; with
``locks`` > 0 every job gets ``lock = 'l<random 0..locks-1>'``, assigned in random order so lanes are
interleaved as in production); run one worker (``concurrency`` async jobs at a time, LISTEN/NOTIFY on)
until every job has executed and none is left ``todo`` or ``doing``; print one JSON object. The rate
is measured from the first job's start (worker start-up not counted); a configuration still draining
after ``cap_s`` stops there and reports the rate over the jobs it executed (``capped: true``).

Imports only Procrastinate and psycopg: this file must run under the peer's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import procrastinate
import psycopg

CHUNK = 10_000

DEFER_SQL = """
SELECT cardinality(procrastinate_defer_jobs_v1(ARRAY(
    SELECT ROW('default', 'noop', 0,
               CASE WHEN %(locks)s::int > 0 THEN 'l' || floor(random() * %(locks)s::int)::int END,
               NULL, '{}'::jsonb, NULL)::procrastinate_job_to_defer_v1
    FROM generate_series(1, %(n)s::int))))
"""

REMAINING_SQL = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"


async def main(cfg: dict) -> dict:
    items: int = cfg["items"]
    connector = procrastinate.PsycopgConnector(
        conninfo=cfg["conninfo"], min_size=cfg["pool_size"], max_size=cfg["pool_size"]
    )
    app = procrastinate.App(connector=connector)

    executed = 0
    first_start: float | None = None
    all_executed = asyncio.Event()

    @app.task(name="noop")
    async def noop() -> None:
        nonlocal executed, first_start
        if first_start is None:
            first_start = time.perf_counter()
        executed += 1
        if executed == items:
            all_executed.set()

    async with app.open_async():
        await app.schema_manager.apply_schema_async()

        async with await psycopg.AsyncConnection.connect(cfg["conninfo"], autocommit=True) as conn:
            t0 = time.perf_counter()
            for offset in range(0, items, CHUNK):
                n = min(CHUNK, items - offset)
                await conn.execute(DEFER_SQL, {"n": n, "locks": cfg["locks"]})
            enqueue_s = time.perf_counter() - t0
            queued = (await (await conn.execute(REMAINING_SQL)).fetchone())[0]
            if queued != items:
                raise RuntimeError(f"queued {queued} jobs, expected {items}")

            t_start = time.perf_counter()
            worker = asyncio.create_task(
                app.run_worker_async(
                    concurrency=cfg["concurrency"],
                    wait=True,
                    listen_notify=True,
                    install_signal_handlers=False,
                )
            )
            capped = False
            try:
                done_waiting = asyncio.create_task(all_executed.wait())
                await asyncio.wait(
                    {done_waiting, worker}, timeout=cfg["cap_s"], return_when=asyncio.FIRST_COMPLETED
                )
                if worker.done():  # the worker stopped on its own: surface why
                    worker.result()
                    raise RuntimeError(f"worker stopped after {executed} of {items} jobs")
                if all_executed.is_set():
                    while (await (await conn.execute(REMAINING_SQL)).fetchone())[0] > 0:
                        await asyncio.sleep(0.005)
                    done = items
                else:
                    capped, done = True, executed
                    done_waiting.cancel()
                t_end = time.perf_counter()
            finally:
                worker.cancel()
                try:
                    await worker
                except asyncio.CancelledError:
                    pass

    if first_start is None:
        raise RuntimeError(f"no job ran within {cfg['cap_s']} s")
    drain_s = t_end - first_start
    return {
        "items": items,
        "executed": done,
        "capped": capped,
        "jobs_per_s": done / drain_s,
        "drain_s": drain_s,
        "wall_incl_start_s": t_end - t_start,
        "enqueue_s": enqueue_s,
        "enqueue_per_s": items / enqueue_s,
    }


if __name__ == "__main__":
    # The config comes through the environment, not argv: the URL may hold a password.
    result = asyncio.run(main(json.loads(os.environ["BENCH_CONFIG"])))
    sys.stdout.write(json.dumps(result) + "\n")
