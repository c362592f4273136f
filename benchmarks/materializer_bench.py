"""Materializer benchmark: receipts materialized/s from a pre-loaded backlog.

    .venv/bin/python -m benchmarks.materializer_bench [--quick] [--receipts N] [--body-bytes B]
                                                      [--json-out PATH]

For each scenario (holding ``/tmp/connector-bench.lock`` so two benchmarks never share the machine):

1. a scratch database with our schema; a pack whose route fans out to 1 or 3 work types (optionally
   with source FIFO lanes over 1,000 source objects), installed and activated through the pack store;
2. ``N`` receipts pre-loaded with one statement (JSON bodies of about ``--body-bytes``), then
   ``VACUUM ANALYZE``;
3. ``connector materializer`` started as its own process(es) with default settings (batch 256,
   2 routing workers, its own pool), until every receipt is materialized;
4. the rate is measured on the database clock: receipts / (last ``routed_at`` - first ``routed_at``),
   so process start-up is not counted; exactly-once is checked (events = receipts, WorkItems =
   receipts * fan-out).

Scenarios: fan-out 1; fan-out 3; fan-out 1 with source lanes; fan-out 1 with two processes.
``--quick`` runs the first two on 3,000 receipts. Nothing is asserted about speed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import common

TARGET = ">= 5000"
CONNECTOR = Path(sys.executable).with_name("connector")


@dataclass(frozen=True)
class Scenario:
    key: str
    name: str
    fan_out: int
    lanes: bool = False
    processes: int = 1


SCENARIOS = (
    Scenario("materializer.receipts_per_s", "materializer, pre-loaded backlog, fan-out 1", 1),
    Scenario("materializer.receipts_per_s_fanout3", "materializer, pre-loaded backlog, fan-out 3", 3),
    Scenario(
        "materializer.receipts_per_s_lanes",
        "materializer, pre-loaded backlog, fan-out 1, source lanes (1,000 objects)",
        1,
        lanes=True,
    ),
    Scenario(
        "materializer.receipts_per_s_2proc", "materializer, pre-loaded backlog, fan-out 1, 2 processes", 1,
        processes=2,
    ),
)  # fmt: skip


def _manifest(fan_out: int, lanes: bool) -> dict[str, Any]:
    work_types = {
        f"work-{i}": {
            "handler": {"kind": "python", "target": "benchmarks.noop:handle"},
            "lanes": {"source_fifo": lanes},
        }
        for i in range(fan_out)
    }
    return {
        "name": "bench",
        "namespace": "bench",
        "work_types": work_types,
        "routes": [
            {
                "key": "events",
                "verification": {"scheme": "none"},
                "extract": {
                    "event_kind": {"pointer": "/type"},
                    "delivery_id": {"pointer": "/id"},
                    "source_object_kind": {"pointer": "/data/object"},
                    "source_object_id": {"pointer": "/data/id"},
                },
                "required": ["source_object_id"],
                "correlation": {"request": {"pointer": "/request/id"}},
                "fan_out": [{"work_type": name} for name in work_types],
            }
        ],
    }


PRELOAD = """
INSERT INTO connector_ingress_receipt (namespace, route_key, provider_delivery_id, idempotency_key, method,
  content_type, event_kind, received_at, payload_sha256, body, verification)
SELECT 'bench', 'events', 'evt_' || i, 'evt_' || i, 'POST', 'application/json', 'object.updated', now(),
       sha256(b), b, 'none'
FROM (
  SELECT i, convert_to(json_build_object(
           'id', 'evt_' || i, 'type', 'object.updated', 'request', json_build_object('id', 'req_' || i),
           'data', json_build_object('object', 'ticket', 'id', 'obj_' || (i %% 1000),
                                     'note', repeat('x', %(pad)s)))::text, 'UTF8') AS b
  FROM generate_series(1, %(n)s) i) s
"""


async def _prepare(url: str, scenario: Scenario, receipts: int, body_bytes: int) -> None:
    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        manifest = parse_manifest(_manifest(scenario.fan_out, scenario.lanes))
        await install.pack_apply(conn, manifest, activate=True, actor="bench")
        await conn.execute(PRELOAD, {"n": receipts, "pad": max(0, body_bytes - 180)})
        await conn.execute("VACUUM ANALYZE connector_ingress_receipt")


def _run(url: str, scenario: Scenario, receipts: int, timeout_s: float, logs: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": url,
        "CONNECTOR_MATERIALIZER_GRPC_PORT": "0",
        "CONNECTOR_MATERIALIZER_METRICS_PORT": "0",
        "CONNECTOR_LOG_LEVEL": "WARNING",
    }
    procs = []
    for i in range(scenario.processes):
        log = (logs / f"{scenario.key}-{i}.log").open("wb")
        procs.append(subprocess.Popen([str(CONNECTOR), "materializer"], stdout=log, stderr=log, env=env))
    try:
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'materialized'"
                ).fetchone()
                done = int(row[0]) if row else 0
                if done >= receipts:
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a materializer process exited during the run")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {done}/{receipts} materialized within {timeout_s:.0f}s")
                time.sleep(0.05)
            (span,) = conn.execute(
                "SELECT extract(epoch FROM max(routed_at) - min(routed_at)) FROM connector_ingress_receipt"
            ).fetchone()
            events = conn.execute("SELECT count(*) FROM connector_event").fetchone()[0]
            items = conn.execute("SELECT count(*) FROM connector_work_item").fetchone()[0]
            failed = conn.execute(
                "SELECT count(*) FROM connector_ingress_receipt WHERE router_status <> 'materialized'"
            ).fetchone()[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    if events != receipts or items != receipts * scenario.fan_out or failed:
        raise RuntimeError(
            f"exactly-once check failed: events={events} items={items} not_materialized={failed}"
        )
    span_s = float(span or 0.0)
    rate = (receipts - 1) / span_s if span_s > 0 else None
    return {"rate": rate, "span_s": span_s, "events": events, "work_items": items}


def main(argv: list[str] | None = None) -> int:
    parser = common.stage_argparser(__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--receipts", type=int, default=None, help="backlog size (default 50,000; quick 3,000)"
    )
    parser.add_argument("--body-bytes", type=int, default=1024, help="approximate body size (default 1024)")
    parser.add_argument("--only", default=None, help="comma-separated scenario keys (default: all)")
    args = parser.parse_args(argv)
    receipts = args.receipts or (3_000 if args.quick else 50_000)
    scenarios = SCENARIOS[:2] if args.quick else SCENARIOS
    if args.only:
        wanted = set(args.only.split(","))
        scenarios = tuple(s for s in scenarios if s.key in wanted or s.key.rsplit(".", 1)[-1] in wanted)
    rows: list[dict[str, Any]] = []
    logs = Path(tempfile.mkdtemp(prefix="materializer-bench-"))
    with common.bench_lock():
        for scenario in scenarios:
            extra = {
                "receipts": receipts,
                "fan_out": scenario.fan_out,
                "source_lanes": 1000 if scenario.lanes else 0,
                "processes": scenario.processes,
                "body_bytes": args.body_bytes,
                "batch_size": 256,
                "workers_per_process": 2,
            }
            try:
                with common.fresh_migrated_database("materializer") as url:
                    asyncio.run(_prepare(url, scenario, receipts, args.body_bytes))
                    result = _run(url, scenario, receipts, timeout_s=600, logs=logs)
            except Exception as exc:
                print(f"{scenario.name}: failed: {exc}", file=sys.stderr)
                rows.append(
                    common.unavailable_row(
                        scenario.key, scenario.name, "receipts/s", f"failed: {exc}", target=TARGET
                    )
                )
                continue
            rate = result["rate"]
            extra.update(span_s=round(result["span_s"], 3), work_items=result["work_items"])
            if rate is None:
                rows.append(
                    common.unavailable_row(
                        scenario.key, scenario.name, "receipts/s", "run too short", target=TARGET
                    )
                )
                continue
            print(
                f"{scenario.name}: {rate:,.0f} receipts/s ({receipts:,} receipts in {result['span_s']:.2f} s,"
                f" {result['work_items']:,} work items)",
                flush=True,
            )
            rows.append(
                common.make_row(scenario.key, scenario.name, rate, "receipts/s", target=TARGET, extra=extra)
            )
    common.write_json_out(args.json_out, rows)
    return 0 if rows and all(r["value"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
