"""The cost of one reconciliation pass over a large sender list (issue #27, docs/reconcile.md):
``pg_stat_statements`` digests of ``connector ingress`` while its reconciler lists N events, per
named statement (the SQL-budget harness' catalog and matcher, ``benchmarks.sql_budget``).

    .venv/bin/python -m benchmarks.reconcile_budget [--events 100000] [--page 100] [--missing 1000]
                                                    [--json-out PATH]

What one run does:

1. a **private PostgreSQL cluster** with ``pg_stat_statements`` (``sql_budget.BudgetCluster``: the
   stage roles, a migrated template; the shared server is never touched);
2. a Stripe-shaped list API on loopback serving ``--events`` events newest first in pages of
   ``--page`` (``created[gte]``/``created[lt]``, ``starting_after``, ``has_more``), generated, not
   stored;
3. the pack: one route verified by the Stripe preset whose ``reconcile`` lists that API
   (``mode: pull``); receipts for every event but ``--missing`` of them, spread evenly, inserted by
   the harness' own role (left out of every figure), and the route's reconciliation state made an
   hour old so the first pass covers every event;
4. ``connector ingress`` as a real process (role ``connector_ingress``), counters reset, then the
   wait until the route's pass ended clean (its watermark set);
5. every ingress digest mapped to its named constant; per statement: calls, rows, calls per page
   and per listed event; WAL bytes of the run; the pass's duration and the ingress CPU.

``tests/test_sql_budget.py::test_reconcile_pass_*`` runs it small and asserts the per-page bounds.
Nothing here asserts anything about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import e2e_bench, sql_budget  # noqa: E402

TOKEN = "rk_bench_" + os.urandom(8).hex()
TOKEN_ENV = "CONNECTOR_BENCH_RECONCILE_TOKEN"
SECRET_ENV = "CONNECTOR_BENCH_STRIPE_SECRET"
NAMESPACE = "bench"
ROUTE = "events"
#: The events' times: one a second, ending a minute before the run starts.
BASE = int(time.time()) - 60


def event_id(n: int) -> str:
    return f"evt_{n:09d}"


def event(n: int) -> dict[str, Any]:
    invoice = {"id": f"in_{n:09d}", "object": "invoice", "amount_paid": n % 10_000}
    return {"id": event_id(n), "object": "event", "created": BASE - n, "type": "invoice.paid",
            "data": {"object": invoice}}  # fmt: skip


class ListServer:
    """The Stripe-shaped list API, in its own thread and event loop (the harness blocks)."""

    def __init__(self, events: int, page: int) -> None:
        self.events, self.page = events, page
        self.port = e2e_bench._free_port()
        self.requests = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ListServer:
        self._thread.start()
        assert self._ready.wait(10), "list server did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _run(self) -> None:
        from aiohttp import web

        async def events(request: web.Request) -> web.Response:
            self.requests += 1
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                return web.json_response({"error": "unauthorized"}, status=401)
            q = request.query
            gte, lt = int(q.get("created[gte]", "0")), int(q.get("created[lt]", str(2**62)))
            # Event n was created at BASE - n: newest first is n ascending.
            first = max(0, BASE - lt + 1)
            last = min(self.events - 1, BASE - gte)
            after = q.get("starting_after")
            start = int(after[4:]) + 1 if after else first
            stop = min(last + 1, start + min(int(q.get("limit", "10")), 100))
            page = [event(n) for n in range(start, stop)]
            return web.json_response({"object": "list", "data": page, "has_more": stop <= last})

        app = web.Application()
        app.router.add_get("/v1/events", events)
        self._loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()


def manifest(url: str, page: int) -> dict[str, Any]:
    return {
        "name": "reconcile-bench",
        "namespace": NAMESPACE,
        "work_types": {"noop": {"handler": {"kind": "python", "target": "benchmarks.e2e_bench:noop"}}},
        "routes": [
            {
                "key": ROUTE,
                "verification": {"preset": "stripe", "secrets": [{"env": SECRET_ENV}]},
                "extract": {"delivery_id": {"pointer": "/id"}, "event_kind": {"pointer": "/type"}},
                "fan_out": [{"work_type": "noop"}],
                "reconcile": {
                    "mode": "pull",
                    "interval": "1h",
                    "window": "30d",
                    "lag": 0,
                    "list": {
                        "url": f"{url}/v1/events",
                        "query": {
                            "created[gte]": "{since}",
                            "created[lt]": "{until}",
                            "limit": str(page),
                            "starting_after": "{cursor}",
                        },
                        "headers": {
                            "Authorization": {"secret": {"env": TOKEN_ENV}, "template": "Bearer {secret}"}
                        },
                    },
                    "items": "/data",
                    "item": {"id": "/id", "occurred_at": "/created", "body": ""},
                    "paging": {"cursor": "/id", "has_more": "/has_more"},
                },
            }
        ],
    }


_SEED = """
INSERT INTO connector_ingress_receipt (namespace, route_key, provider_delivery_id, idempotency_key, method,
  received_at, payload_sha256, body, verification, router_status)
SELECT %(ns)s, %(route)s, 'evt_' || lpad(n::text, 9, '0'), %(route)s || ':id:evt_' || lpad(n::text, 9, '0'),
       'POST', now(), '\\x00'::bytea, '{}'::bytea, 'seed', 'materialized'
FROM generate_series(0, %(events)s - 1) AS n
WHERE n %% %(every)s <> %(every)s / 2
"""
_STATE = """
INSERT INTO connector_reconcile_state (namespace, route_key, created_at)
VALUES (%(ns)s, %(route)s, to_timestamp(%(since)s))
"""
_DONE = "SELECT watermark IS NOT NULL, last_error_class FROM connector_reconcile_state WHERE route_key = %s"


def run(events: int, page: int, missing: int, command: list[str] | None = None) -> dict[str, Any]:
    """One pass over ``events`` (``command``: the ingress' argv before ``--http-port``; default
    ``connector ingress``)."""
    import psycopg

    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    every = max(1, events // max(missing, 1))
    server = ListServer(events, page).start()
    os.environ[SECRET_ENV] = "whsec_bench"
    with sql_budget.BudgetCluster() as bc:
        dbname = bc.fresh_database()

        async def apply() -> None:
            url = bc.url("admin", dbname)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await install.pack_apply(
                    conn, parse_manifest(manifest(f"http://127.0.0.1:{server.port}", page)), activate=True,
                    actor="reconcile-budget",
                )  # fmt: skip

        asyncio.run(apply())
        with psycopg.connect(bc.url(sql_budget.HARNESS_ROLE, dbname), autocommit=True) as conn:
            conn.execute(_SEED, {"ns": NAMESPACE, "route": ROUTE, "events": events, "every": every})
            seeded = conn.execute("SELECT count(*) FROM connector_ingress_receipt").fetchone()[0]  # type: ignore[index]
            conn.execute(_STATE, {"ns": NAMESPACE, "route": ROUTE, "since": BASE - events - 10})
            conn.execute("VACUUM ANALYZE connector_ingress_receipt")
            conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("SELECT pg_stat_reset_shared('wal')")
            wal0 = conn.execute(sql_budget._WAL).fetchone()
            env = {
                **os.environ,
                "CONNECTOR_DATABASE_URL": bc.url("ingress", dbname),
                "CONNECTOR_LOG_LEVEL": "WARNING",
                "CONNECTOR_INGRESS_RECONCILE_TICK_S": "0.5",
                "CONNECTOR_INGRESS_METRICS_PORT": str(e2e_bench._free_port()),
                "CONNECTOR_INGRESS_GRPC_PORT": str(e2e_bench._free_port()),
                TOKEN_ENV: TOKEN,
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            }
            argv = command or [str(Path(sys.executable).with_name("connector")), "ingress"]
            http_port = e2e_bench._free_port()
            proc = subprocess.Popen(
                [*argv, "--http-port", str(http_port)], env=env, stderr=subprocess.PIPE, cwd=ROOT
            )
            try:
                started = time.monotonic()
                while True:
                    if proc.poll() is not None:
                        err = proc.stderr.read().decode() if proc.stderr else ""
                        raise RuntimeError(f"ingress exited: {err[-2000:]}")
                    row = conn.execute(_DONE, (ROUTE,)).fetchone()
                    if row is not None and row[1] is not None:
                        raise RuntimeError(f"the pass failed: {row[1]}")
                    if row is not None and row[0]:
                        break
                    if time.monotonic() - started > 1800:
                        raise RuntimeError("the pass did not end within 30 minutes")
                    time.sleep(0.2)
                pass_s = time.monotonic() - started
                cpu = e2e_bench._cpu_seconds(proc.pid)  # since start: the pass is nearly all of it
                raw = [
                    dict(zip(sql_budget._SNAPSHOT_COLUMNS, r, strict=True))
                    for r in conn.execute(sql_budget._SNAPSHOT).fetchall()
                ]
                wal1 = conn.execute(sql_budget._WAL).fetchone()
                admitted = conn.execute(
                    "SELECT count(*) FROM connector_ingress_receipt WHERE origin = 'reconciled'"
                ).fetchone()[0]  # type: ignore[index]
            finally:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    server.stop()
    assert wal0 is not None and wal1 is not None
    named = sql_budget.catalog()[0]
    matcher = sql_budget.Matcher(named)
    pages = -(-events // page)
    per: dict[str, dict[str, float]] = {}
    unknown: list[str] = []
    for r in raw:
        if r["role"] != sql_budget.ROLES["ingress"] or not r["toplevel"]:
            continue
        hit = matcher.match(r["query"])
        name = hit.name if hit is not None else "unknown"
        if hit is None:
            unknown.append(" ".join(r["query"].split())[:160])
        agg = per.setdefault(name, {"calls": 0, "rows": 0, "blks_hit": 0, "blks_read": 0, "wal_bytes": 0.0})
        for k in agg:
            agg[k] += r[k]
    for agg in per.values():
        agg["calls_per_page"] = round(agg["calls"] / pages, 3)
        agg["calls_per_event"] = round(agg["calls"] / events, 5)
    return {
        "events": events,
        "page": page,
        "pages": pages,
        "missing": events - int(seeded),
        "admitted": int(admitted),
        "list_requests": server.requests,
        "pass_s": round(pass_s, 2),
        "ingress_cpu_s": round(cpu, 2),
        "wal_bytes": float(wal1[2]) - float(wal0[2]),
        "statements": dict(sorted(per.items(), key=lambda kv: -kv[1]["calls"])),
        "statements_total": int(sum(a["calls"] for a in per.values())),
        "unknown": unknown,
    }


#: Statements a pass may send per page of the sender's list, each with its reason: the budget
#: ``tests/test_sql_budget_reconcile.py`` holds a pass to.
PER_PAGE = {
    # one batched lookup of the page's delivery keys (the unique index)
    "connector.common.store.receipts.insert.RECEIPT_KEYS_PRESENT": 1.0,
    # the checkpoint after the page
    "connector.common.store.reconcile.RECONCILE_STATE_CHECKPOINT": 1.0,
    # the page's missing deliveries go through the group commit: one batch per page, two when the
    # writers split it (never one per delivery)
    "connector.common.store.receipts.insert.RECEIPT_INSERT_BATCH": 2.0,
}
#: Everything else a pass and its process send, in all (ticks, registration, route refresh, the
#: lock, the state reads, the finish): a constant, not a function of the list's length.
OTHER_MAX = 40


def check(rep: dict[str, Any]) -> list[str]:
    """The budget's violations (empty: within it)."""
    problems = [f"unknown statement: {u}" for u in rep["unknown"]]
    if rep["admitted"] != rep["missing"]:
        problems.append(f"admitted {rep['admitted']} of {rep['missing']} missing")
    other = 0
    for name, agg in rep["statements"].items():
        limit = PER_PAGE.get(name)
        if limit is None:
            other += int(agg["calls"])
        elif agg["calls"] > limit * rep["pages"]:
            problems.append(
                f"{name}: {int(agg['calls'])} calls for {rep['pages']} pages (budget {limit:g} per page)"
            )
    if other > OTHER_MAX:
        problems.append(f"{other} other statements (budget {OTHER_MAX})")
    return problems


def render(rep: dict[str, Any]) -> str:
    lines = [
        f"reconcile pass over {rep['events']:,} events in {rep['pages']:,} pages of {rep['page']}: "
        f"{rep['missing']:,} missing, {rep['admitted']:,} admitted, {rep['list_requests']:,} list requests",
        f"  pass {rep['pass_s']} s, ingress CPU {rep['ingress_cpu_s']} s, "
        f"WAL {rep['wal_bytes'] / 1e6:.1f} MB, "
        f"{rep['statements_total']:,} statements ({rep['statements_total'] / rep['pages']:.2f} per page, "
        f"{rep['statements_total'] / rep['events']:.4f} per event)",
        f"  {'statement':60} {'calls':>8} {'/page':>7} {'rows':>9}",
    ]
    for name, agg in rep["statements"].items():
        lines.append(
            f"  {name[-60:]:60} {int(agg['calls']):>8} {agg['calls_per_page']:>7} {int(agg['rows']):>9}"
        )
    if rep["unknown"]:
        lines.append(f"  unknown statements: {rep['unknown']}")
    problems = check(rep)
    lines.append("  budget: " + ("within" if not problems else "; ".join(problems)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=100)
    parser.add_argument("--missing", type=int, default=1_000)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    rep = run(args.events, args.page, args.missing)
    print(render(rep))
    print(json.dumps({k: v for k, v in rep.items() if k != "statements"}))
    if args.json_out:
        args.json_out.write_text(json.dumps(rep, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
