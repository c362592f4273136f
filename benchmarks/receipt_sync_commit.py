"""The receipt group commit with and without ``CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT`` (ADR 020):

    .venv/bin/python -m benchmarks.receipt_sync_commit [--batches 300] [--batch 20]

Alternating batch by batch on one connection of a scratch database: ``autocommit`` (the default:
the batch is one autocommit statement), ``in_statement`` (what the setting sends:
``RECEIPT_INSERT_BATCH_SYNCHRONOUS``, the same statement with ``set_config('synchronous_commit',
'local', true)`` in it) and ``transaction`` (the alternative not taken: ``BEGIN``, ``set_config``,
the insert, ``COMMIT``). ``local`` so that no standby is needed and only the client's and the round
trips' cost shows. Printed per variant: the
client's CPU per batch and per delivery (``time.process_time``: robust on a loaded machine, whatever
else runs weighs on both alike) and the median wall time per batch. Runs under ``bench_lock()``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _batch(size: int) -> list[Any]:
    from connector.ingress.receipts import PendingReceipt

    out = []
    for _ in range(size):
        body = b'{"id":"' + uuid.uuid4().hex.encode() + b'","kind":"push"}' + b" " * 900
        key = uuid.uuid4().hex
        out.append(
            PendingReceipt(
                namespace="bench",
                route_key="github",
                route_id=1,
                route_version=1,
                provider_delivery_id=key,
                idempotency_key=f"github:id:{key}",
                method="POST",
                content_type="application/json",
                event_kind="push",
                received_at=time.time(),
                correlation_ids="{}",
                payload_sha256=hashlib.sha256(body).digest(),
                body=body,
                verification="hmac",
            )
        )
    return out


async def _measure(url: str, batches: int, size: int) -> dict[str, dict[str, float]]:
    import psycopg

    from connector.common.store import receipts
    from connector.ingress.receipts import receipt_commit_batch

    async def autocommit(conn: Any, batch: list[Any]) -> None:
        await receipt_commit_batch(conn, batch)

    async def in_statement(conn: Any, batch: list[Any]) -> None:
        await receipt_commit_batch(conn, batch, "local")

    async def transaction(conn: Any, batch: list[Any]) -> None:
        async with conn.transaction():
            await conn.execute("SELECT set_config('synchronous_commit', %s, true)", ("local",))
            await receipts.insert.receipt_insert_batch(conn, batch)

    variants = {"autocommit": autocommit, "in_statement": in_statement, "transaction": transaction}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for i in range(batches + 20):
            for name, fn in variants.items():
                batch = _batch(size)
                c0, w0 = time.process_time(), time.perf_counter()
                await fn(conn, batch)
                if i >= 20:  # warm-up: prepared statements, caches
                    cpu[name].append(time.process_time() - c0)
                    wall[name].append(time.perf_counter() - w0)
    return {
        name: {
            "cpu_us_per_batch": statistics.mean(cpu[name]) * 1e6,
            "cpu_us_per_delivery": statistics.mean(cpu[name]) * 1e6 / size,
            "wall_ms_p50": statistics.median(wall[name]) * 1e3,
        }
        for name in variants
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    import os

    from benchmarks.common import bench_lock, fresh_migrated_database

    with bench_lock(), fresh_migrated_database("sync_commit") as url:
        figures = asyncio.run(_measure(url, args.batches, args.batch))
    print(f"receipt group commit, {args.batches} batches of {args.batch} per variant, alternating")
    print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name, f in figures.items():
        print(
            f"  {name:<12} client CPU {f['cpu_us_per_batch']:7.0f} µs/batch"
            f" {f['cpu_us_per_delivery']:6.1f} µs/delivery   wall p50 {f['wall_ms_p50']:.2f} ms/batch"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
