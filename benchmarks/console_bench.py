"""Console page timings at scale: every page of the operator console, served by the console over a
real admin API over a database with 1M receipts, 1M events and 1M WorkItems (``--quick``: 20,000).

    python -m benchmarks.console_bench [--quick] [--requests N] [--json-out PATH]

The admin API (an in-process ``GrpcServer`` over its own pool) and the console (aiohttp, in-process)
listen on real ports; an HTTP client logged in as an operator fetches each page ``--requests`` times
in turn (after a warm-up) and the rows are the p50 / p95 of the whole request as the client sees it:
the console's rendering, its admin RPCs and their statements. Target: p95 <= 100 ms per page (issue
#25). The data: 30 days of receipts (1 % failed, 0.1 % pending), their events and WorkItems (85 %
succeeded, 5 % pending, 2 % retry, 4 % dead with one of 20 failure summaries, 1 % processing, 3 %
blocked; 40 % in source lanes keyed by event id modulo n / 50: 8,000 lanes at 1M), two packs, and a
day of figures (the cluster and both packs: minutes for 6 h, five minutes for 24 h, closed periods
sealed).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import time
from typing import Any

import aiohttp
import psycopg
from aiohttp import web
from pydantic import SecretStr

from benchmarks.common import bench_lock, fresh_migrated_database, make_row, stage_argparser, write_json_out

TOKEN = "bench-operator-token-0123456789"
N_FULL, N_QUICK = 1_000_000, 20_000


def seed(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("SET synchronous_commit = off")
        db.execute(
            "INSERT INTO connector_installed_pack (name, namespace, active_generation)"
            " VALUES ('shop', 'shop', 1), ('crm', 'crm', 1)"
        )
        db.execute(
            "INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,"
            " manifest_sha256) VALUES (1, 1, 'active', '{}', 'x'), (2, 1, 'active', '{}', 'x')"
        )
        db.execute(
            "INSERT INTO connector_route (installed_pack_id, generation, namespace, route_key, route_version,"
            " config, config_sha256) VALUES (1, 1, 'shop', 'orders', 1, '{}', 'x'),"
            " (2, 1, 'crm', 'contacts', 1, '{}', 'x')"
        )
        db.execute(
            "INSERT INTO connector_cutover_receipt (installed_pack_id, generation, kind, claim_path, proof,"
            " proof_sha256, actor) VALUES (1, 1, 'install', 'work_item', '{}', 'x', 'bench'),"
            " (2, 1, 'install', 'work_item', '{}', 'x', 'bench')"
        )
        db.execute(
            "INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase,"
            " cutover_receipt_id) SELECT installed_pack_id, 1, 'work_item', 'work_item_active',"
            " cutover_receipt_id FROM connector_cutover_receipt"
        )
        db.execute(
            """
            INSERT INTO connector_ingress_receipt (namespace, route_key, provider_delivery_id,
              idempotency_key, method, event_kind, received_at, accepted_at, payload_sha256, body,
              verification, router_status, next_attempt_at, error_class, error_summary)
            SELECT ns, rk, 'd-' || i, rk || ':id:d-' || i, 'POST', 'order.updated', ts, ts, '\\x00', '\\x00',
                   'hmac-sha256:env:S', st, ts,
                   CASE WHEN st = 'failed' THEN 'required_missing' END,
                   CASE WHEN st = 'failed' THEN 'no /data/id in the envelope (' || (i %% 7) || ')' END
            FROM (SELECT i, CASE WHEN i %% 10 = 0 THEN 'crm' ELSE 'shop' END AS ns,
                         CASE WHEN i %% 10 = 0 THEN 'contacts' ELSE 'orders' END AS rk,
                         CASE WHEN i %% 100 = 0 THEN 'failed' WHEN i %% 1000 = 1 THEN 'pending'
                              ELSE 'materialized' END AS st,
                         now() - interval '30 days' + i * (interval '30 days' / %(n)s) AS ts
                  FROM generate_series(1, %(n)s) i) x
            """,
            {"n": n},
        )
        db.execute(
            """
            INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id,
              route_version, namespace, event_kind, source_object_id, idempotency_key, delivery_seq,
              payload_sha256, parse_outcome)
            SELECT r.receipt_id, CASE WHEN r.namespace = 'crm' THEN 2 ELSE 1 END, 1, 1,
                   CASE WHEN r.namespace = 'crm' THEN 2 ELSE 1 END, 1, r.namespace, 'order.updated',
                   'o' || (r.receipt_id % 5000), r.idempotency_key || '#0', r.receipt_id, '\\x00', 'ok'
            FROM connector_ingress_receipt r WHERE r.router_status = 'materialized'
            """
        )
        db.execute(
            """
            INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, state,
              delivery_seq, source_lane_key, lease_owner, lease_until, run_after, finished_at, attempts,
              failure_class, failure_summary, outcome)
            SELECT e.event_id, e.installed_pack_id, 1, 'sync', s, e.delivery_seq,
                   CASE WHEN e.event_id %% 5 IN (0, 3) THEN 'sync:o' || (e.event_id %% %(lanes)s) END,
                   CASE WHEN s = 'processing' THEN 'x' END,
                   CASE WHEN s = 'processing' THEN now() + interval '1 minute' END,
                   now() - interval '1 minute', CASE WHEN s IN ('dead', 'succeeded') THEN e.created_at END,
                   CASE WHEN s = 'dead' THEN 5 ELSE 1 END,
                   CASE WHEN s IN ('dead', 'retry') THEN 'downstream_rejected' END,
                   CASE WHEN s IN ('dead', 'retry')
                        THEN 'crm answered 422 (' || (e.event_id %% 20) || ')' END,
                   CASE WHEN s = 'dead' THEN 'failed' WHEN s = 'succeeded' THEN 'succeeded' END
            FROM (SELECT event_id, installed_pack_id, delivery_seq, created_at, CASE
                    WHEN event_id %% 100 < 85 THEN 'succeeded' WHEN event_id %% 100 < 90 THEN 'pending'
                    WHEN event_id %% 100 < 92 THEN 'retry' WHEN event_id %% 100 < 96 THEN 'dead'
                    WHEN event_id %% 100 < 97 THEN 'processing' ELSE 'blocked' END AS s
                  FROM connector_event) e
            """,
            {"lanes": max(50, n // 50)},
        )
        seed_figures(db)
        for table in (
            "connector_ingress_receipt",
            "connector_event",
            "connector_work_item",
            "connector_figures",
        ):
            db.execute(f"VACUUM ANALYZE {table}")


def seed_figures(db: psycopg.Connection[Any]) -> None:
    """A day of figures for the cluster and both packs, as the processes' flushes and the leader's
    samples leave them (minutes for the last 6 h, five minutes for the last day; every bucket of
    every histogram observed), the closed periods sealed by the leader's own code."""
    from connector.common.core.figures import BUCKETS, sealed
    from connector.common.store import figures as store

    hist = (
        "ARRAY(SELECT 1 + (b * 7 + extract(epoch FROM s.start)::int) %% 50"
        " FROM generate_series(1, %(buckets)s) b)"
    )
    db.execute(
        f"""
        INSERT INTO connector_figures (step_s, installed_pack_id, start, accepted, rejected, succeeded,
          failed, dead_lettered, ack_hist, delivery_hist, delay_hist, flushes, backlog, in_flight,
          oldest_ready_s, open_circuits, pauses, executors, ingress_processes, unrouted, oldest_unrouted_s,
          flushed_at, sampled_at)
        SELECT s.step_s, p.pack, s.start, 400 * s.step_s, s.step_s, 390 * s.step_s, 4 * s.step_s,
               s.step_s / 60,
               {hist}, {hist}, {hist}, 6, 70000, 200, 3.5, 1, 1,
               CASE WHEN p.pack = 0 THEN 2 END, CASE WHEN p.pack = 0 THEN 2 END,
               CASE WHEN p.pack = 0 THEN 12 END, CASE WHEN p.pack = 0 THEN 0.4 END, s.start, s.start
        FROM (VALUES (0), (1), (2)) p(pack)
        CROSS JOIN LATERAL (
          SELECT 60 AS step_s, t AS start FROM generate_series(
            to_timestamp(floor(extract(epoch FROM now()) / 60) * 60) - interval '6 hours',
            now(), interval '1 minute') t
          UNION ALL
          SELECT 300, t FROM generate_series(
            to_timestamp(floor(extract(epoch FROM now()) / 300) * 300) - interval '1 day',
            now(), interval '5 minutes') t) s
        """,
        {"buckets": BUCKETS},
    )

    async def seal() -> None:
        async with await psycopg.AsyncConnection.connect(db.info.dsn, autocommit=True) as conn:
            while rows := await store.figures_unsealed(conn, grace_s=0.0, horizon_s=2 * 86_400.0, limit=2000):
                if not await store.figures_seal(conn, [(r, sealed(r.histograms)) for r in rows]):
                    break

    asyncio.run(seal())


async def measure(url: str, requests: int) -> list[dict[str, Any]]:
    from connector.common.core import db as common_db
    from connector.common.core.grpc_server import GrpcServer
    from connector.common.core.settings import AdminSettings, DatabaseSettings, PoolSettings
    from connector.console.app import build_app
    from connector.console.client import AdminClient
    from connector.console.sessions import SessionStore
    from connector.executor.admin import PROTECTED_PREFIXES, build_admin, register

    pool = await common_db.open_pool(
        "console-bench", DatabaseSettings(), PoolSettings(pool_min_size=2, pool_max_size=4), url=url
    )
    api = build_admin(pool, AdminSettings(tokens=SecretStr(f"{TOKEN}=ConnectorOperator")))
    server = GrpcServer(port=0, authenticate=api.authenticate, protected_prefixes=PROTECTED_PREFIXES)
    register(server, api.servicer)
    await server.start()
    client = AdminClient(f"127.0.0.1:{server.port}")
    runner = web.AppRunner(build_app(client, SessionStore()), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    with psycopg.connect(url) as db:
        receipt = db.execute(
            "SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
            " WHERE w.state = 'blocked' AND w.source_lane_key IS NOT NULL ORDER BY w.work_id DESC LIMIT 1"
        ).fetchone()
        delivery = db.execute(
            "SELECT provider_delivery_id FROM connector_ingress_receipt ORDER BY receipt_id DESC LIMIT 1"
        ).fetchone()
    assert receipt is not None and delivery is not None
    pages = {
        "overview": "/",
        "overview live refresh": "/overview/live?pack=0&window=hour",
        "overview (day)": "/?window=day",
        "overview live refresh (pack, day)": "/overview/live?pack=1&window=day",
        "overview queue table": "/overview/queues?pack=0",
        "deliveries (scan, namespace)": "/deliveries?namespace=shop",
        "deliveries (provider id)": f"/deliveries?delivery_id={delivery[0]}",
        "deliveries (dead, last day)": "/deliveries?state=dead&since=1d",
        "delivery (trace, lane member)": f"/deliveries/{receipt[0]}",
        "failures (groups)": "/failures",
        "failure group (dead letters)": "/failures/group?pack=1&work_type=sync"
        "&failure_class=downstream_rejected&summary=crm+answered+422+%283%29",
        "lanes and keys": "/lanes",
        "cutover": "/cutover",
        "processes": "/processes",
    }
    rows = []
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(base + "/login") as resp:
                form = await resp.text()
            login_csrf = re.search(r'name="login_csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
            async with http.post(base + "/login", data={"token": TOKEN, "login_csrf": login_csrf}) as resp:
                assert resp.status == 200, resp.status
            for name, path in pages.items():
                times = []
                for i in range(requests + 3):
                    start = time.perf_counter()
                    async with http.get(base + path) as resp:
                        body = await resp.text()
                        assert resp.status == 200, (name, resp.status, body[:300])
                    if i >= 3:  # warm-up
                        times.append((time.perf_counter() - start) * 1000)
                times.sort()
                p50, p95 = statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]
                slug = re.sub(r"[^a-z]+", "_", name).strip("_")
                print(f"{name:40s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms", flush=True)
                extra = {"p50_ms": round(p50, 1), "requests": requests, "path": path}
                rows.append(
                    make_row(f"console.{slug}.p95_ms", f"console page {name}, p95", p95, "ms",
                             target="<= 100", scenario="console-pages", extra=extra)
                )  # fmt: skip
    finally:
        await runner.cleanup()
        await client.close()
        await server.stop(0)
        await common_db.close_pool("console-bench")
    return rows


def main() -> int:
    parser = stage_argparser(__doc__)
    parser.add_argument("--requests", type=int, default=40, help="requests per page (after 3 warm-up ones)")
    args = parser.parse_args()
    n = N_QUICK if args.quick else N_FULL
    with bench_lock(), fresh_migrated_database("console") as url:
        started = time.monotonic()
        seed(url, n)
        print(f"seeded {n} receipts / events / WorkItems in {time.monotonic() - started:.0f} s", flush=True)
        rows = asyncio.run(measure(url, 10 if args.quick else args.requests))
        for row in rows:
            row["extra"]["rows"] = n
    write_json_out(args.json_out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
