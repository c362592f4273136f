"""Delays through real processes: the ``connector ingress``, ``materializer`` and ``executor``
processes, signed deliveries over HTTP, a pack with a fixed delay, a per-delivery ``run_after``
field and its bound (docs/packs.md, "Delays and schedules").

Proved, by the database clock (``accepted_at`` is the ingress insert's ``now()``, ``started_at`` the
claim's ``clock_timestamp()``): a fixed-delay item's handler starts no earlier than ``fixed_s``
after acceptance; a ``run_after`` item no earlier than its instant; a ``run_after`` a day ahead is
clamped to ``max_s`` (so it runs within the test, not tomorrow); an unreadable ``run_after`` falls
back to the fixed delay and no delivery fails. Control: an undelayed work type of the same
deliveries is due at insert (``run_after <= created_at``) — with the delay ignored by the
materializer (tried: the insert without ``not_before``), every ``started_at >= …`` bound fails.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import secrets
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import e2e_bench  # noqa: E402

pytestmark = pytest.mark.slow

NAMESPACE = "delayed"
FIXED_S = 2.0
MAX_S = 3.0


def _manifest() -> dict[str, Any]:
    handler = {"kind": "python", "target": e2e_bench.HANDLER}
    return {
        "name": "delayed-pack",
        "namespace": NAMESPACE,
        "work_types": {
            "later": {"handler": handler, "delay": {"fixed_s": FIXED_S}},
            "at": {"handler": handler, "delay": {"fixed_s": 1.0, "run_after_field": True, "max_s": MAX_S}},
            "now": {"handler": handler},
        },
        "routes": [
            {
                "key": "events",
                "verification": {"preset": "standard-webhooks", "secrets": [{"env": e2e_bench.SECRET_ENV}]},
                "idempotency_header": "webhook-id",
                "extract": {"event_kind": {"pointer": "/type"}, "run_after": {"pointer": "/at"}},
                "fan_out": [{"work_type": "later"}, {"work_type": "at"}, {"work_type": "now"}],
            }
        ],
    }


def _post(port: int, secret: str, msg_id: str, at: Any) -> int:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    ts = int(time.time())
    doc: dict[str, Any] = {"type": "reminder", "id": msg_id}
    if at is not None:
        doc["at"] = at
    body = json.dumps(doc).encode()
    sig = base64.b64encode(hmac.digest(key, f"{msg_id}.{ts}.".encode() + body, "sha256")).decode()
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": f"v1,{sig}",
    }
    url = f"http://127.0.0.1:{port}/v1/webhooks/{NAMESPACE}/events"
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(r.status)


async def _install(url: str) -> None:
    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await install.pack_apply(conn, parse_manifest(_manifest()), activate=True, actor="delay-test")


def test_delayed_handlers_run_no_earlier_than_their_delay(db_url: str, tmp_path: Path) -> None:
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    os.environ[e2e_bench.SECRET_ENV] = secret  # the pack apply checks that the reference resolves
    asyncio.run(_install(db_url))
    port = e2e_bench._free_port
    http_port = port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "CONNECTOR_DATABASE_URL": db_url,
            "CONNECTOR_LOG_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            "CONNECTOR_MATERIALIZER_GRPC_PORT": str(port()),
            "CONNECTOR_MATERIALIZER_METRICS_PORT": str(port()),
            "CONNECTOR_EXECUTOR_GRPC_PORT": str(port()),
            "CONNECTOR_EXECUTOR_METRICS_PORT": str(port()),
            "CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.2",
        }
    )
    args = {
        "ingress": [
            "ingress",
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(port()),
            "--metrics-port",
            str(port()),
        ],
        "materializer": ["materializer"],
        "executor": ["executor", "--no-admin"],
    }
    with psycopg.connect(db_url, autocommit=True) as conn:
        procs = {name: e2e_bench._spawn(name, a, env, tmp_path) for name, a in args.items()}
        try:
            e2e_bench._wait_ready(http_port, procs, timeout=90)
            db_now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            deliveries = {
                "instant": (db_now + timedelta(seconds=2.5)).isoformat(),  # within max_s
                "tomorrow": (db_now + timedelta(days=1)).isoformat(),  # clamped to max_s
                "garbage": "whenever",  # unreadable: the fixed delay (1 s)
                "absent": None,
            }
            ids = {name: f"{name}-{secrets.token_hex(4)}" for name in deliveries}
            statuses = {name: _post(http_port, secret, ids[name], at) for name, at in deliveries.items()}
            assert statuses == dict.fromkeys(deliveries, 200)

            def work_rows() -> list[tuple[Any, ...]]:
                return conn.execute(
                    """SELECT r.provider_delivery_id, w.work_type, w.state,
                              extract(epoch FROM w.run_after - r.accepted_at)::float8,
                              extract(epoch FROM w.started_at - r.accepted_at)::float8,
                              extract(epoch FROM w.started_at - w.run_after)::float8,
                              w.run_after <= w.created_at,
                              extract(epoch FROM w.created_at - r.accepted_at)::float8
                       FROM connector_ingress_receipt r JOIN connector_event e USING (receipt_id)
                       JOIN connector_work_item w USING (event_id)
                       WHERE r.provider_delivery_id = ANY(%s)""",
                    (list(ids.values()),),
                ).fetchall()

            deadline = time.monotonic() + 90
            while True:
                e2e_bench._check_alive(procs)
                rows = work_rows()
                if len(rows) == 12 and all(r[2] == "succeeded" for r in rows):
                    break
                assert time.monotonic() < deadline, f"timed out: {rows}"
                time.sleep(0.1)
            failed = conn.execute(
                "SELECT count(*) FROM connector_ingress_receipt WHERE router_status <> 'materialized'"
            ).fetchone()
            assert failed == (0,)
        finally:
            e2e_bench._stop(list(procs.values()))
    by_id = {v: k for k, v in ids.items()}
    got = {(by_id[r[0]], r[1]): r[3:] for r in rows}
    # The materializer inserts run_after = greatest(insert time, accepted + delay): on a busy machine
    # it may route a receipt after its delay has passed, and the item is then due at once (rightly).
    delay = {"later": FIXED_S, "now": 0.0}
    expected_at = {"instant": None, "tomorrow": MAX_S, "garbage": 1.0, "absent": 1.0}
    for (name, work_type), (after, _started, late, due_at_insert, lag) in got.items():
        assert late >= 0, f"{name}/{work_type} started {late:.3f} s before its run_after"
        if work_type == "now":
            assert due_at_insert, f"control {name}: an undelayed item is due at once"
            continue
        want = delay.get(work_type, expected_at[name])
        if want is None:  # its own instant: accepted after db_now, so within (1.5, 2.5] s
            assert 1.5 < after <= 2.5 or (after == lag and lag > 1.5), (name, work_type, after, lag)
            continue
        assert abs(after - max(want, lag)) < 0.002, (name, work_type, after, want, lag)
        if lag < want:  # inserted before its instant: it was not due at insert
            assert not due_at_insert, f"{name}/{work_type} was due at insert"
    assert all(got[(n, "later")][1] >= FIXED_S for n in deliveries)  # fixed delay, by the db clock
    instant = got[("instant", "at")]
    assert instant[1] >= instant[0]  # started no earlier than its own instant
    assert got[("tomorrow", "at")][1] >= MAX_S  # clamped to max_s, and not run before it
