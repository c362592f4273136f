"""The cluster's figures through real processes (docs/metrics.md "Figures without Prometheus"):
``connector ingress``, ``connector materializer`` and two ``connector executor`` processes (one
serving the admin API) over one database, signed deliveries over HTTP, a flush every 0.5 s.

Proved: GetFigures' counts equal the database's truth and the ingress' own answers — accepted,
duplicates, rejected (a bad signature: the pack's; a path that is no route: the cluster's only),
succeeded, failed and dead letters — with both executors' executions in them (each process's own
outcome counters are > 0 and add up to the figures: the figures are the sum over processes, not one
process's view), latency counts per observation (ack: every success answer; delivery: every
success), and gauges sampled; exactly one executor leads (``connector_figures_leader``) and, killed
with SIGKILL, the other takes over and the samples go on; ``connector admin top --once`` (text and
``--json``) shows the pack and the total from the same API.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import e2e_bench  # noqa: E402
from connector.v1 import admin_service_pb2 as pb  # noqa: E402
from connector.v1 import admin_service_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.slow

NAMESPACE = "figs"
TOKEN = "figures-view-token-0123456789"
GOOD, FAILING, BAD_SIGNATURE, DUPLICATES, UNROUTED = 40, 5, 3, 2, 2
COUNTS = ("accepted", "duplicates", "rejected", "unavailable", "succeeded", "failed", "dead_lettered")


def _manifest() -> dict[str, Any]:
    verification = {"preset": "standard-webhooks", "secrets": [{"env": e2e_bench.SECRET_ENV}]}
    return {
        "name": "figures-pack",
        "namespace": NAMESPACE,
        "work_types": {
            "slow": {"handler": {"kind": "python", "target": "tests.figures_handlers:slow"}},
            "fail": {"handler": {"kind": "python", "target": "tests.figures_handlers:fail"}},
        },
        "routes": [
            {"key": key, "verification": verification, "idempotency_header": "webhook-id",
             "fan_out": [{"work_type": work_type}]}
            for key, work_type in (("events", "slow"), ("fails", "fail"))
        ],
    }  # fmt: skip


def _post(port: int, secret: str, route: str, msg_id: str, *, forge: bool = False) -> int:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    ts = int(time.time())
    body = json.dumps({"type": "thing.updated", "id": msg_id}).encode()
    sig = base64.b64encode(hmac.digest(key, f"{msg_id}.{ts}.".encode() + body, "sha256")).decode()
    if forge:
        sig = base64.b64encode(b"x" * 32).decode()
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": f"v1,{sig}",
    }
    url = f"http://127.0.0.1:{port}/v1/webhooks/{NAMESPACE}/{route}"
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


async def _install(url: str) -> None:
    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await install.pack_apply(conn, parse_manifest(_manifest()), activate=True, actor="figures-test")


def _metric(port: int, name: str, labels: str = "") -> float:
    """The sum of a metric's samples on one process's endpoint (optionally whose labels match)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m and labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def _until(check: Any, what: str, procs: dict[str, Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        e2e_bench._check_alive(procs)
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _totals(response: pb.GetFiguresResponse, pack: int) -> dict[str, int]:
    series = next(s for s in response.series if s.installed_pack_id == pack)
    out: dict[str, int] = {}
    for p in series.points:
        for name in COUNTS:
            out[name] = out.get(name, 0) + getattr(p, name)
        for name in ("ack_latency", "delivery_latency", "scheduling_delay"):
            out[name] = out.get(name, 0) + getattr(p, name).count
    return out


def test_figures_from_real_processes(db_url: str, tmp_path: Path) -> None:
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    os.environ[e2e_bench.SECRET_ENV] = secret
    asyncio.run(_install(db_url))
    port = e2e_bench._free_port
    http_port, admin_port, metrics_a, metrics_b = port(), port(), port(), port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "CONNECTOR_DATABASE_URL": db_url,
            "CONNECTOR_LOG_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            "CONNECTOR_ADMIN_TOKENS": f"{TOKEN}=ViewConnectorEvents",
            "CONNECTOR_INGRESS_FIGURES_FLUSH_S": "0.5",
            "CONNECTOR_EXECUTOR_FIGURES_FLUSH_S": "0.5",
            "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "0.5",
            "CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.1",
            "CONNECTOR_EXECUTOR_PREFETCH": "0",
            "CONNECTOR_MATERIALIZER_GRPC_PORT": str(port()),
            "CONNECTOR_MATERIALIZER_METRICS_PORT": str(port()),
        }
    )
    executor = ["executor", "--workers", "2", "--claim-batch", "2"]
    args = {
        "ingress": ["ingress", "--http-port", str(http_port), "--grpc-port", str(port()),
                    "--metrics-port", str(port())],
        "materializer": ["materializer"],
        "executor-a": [*executor, "--grpc-port", str(admin_port), "--metrics-port", str(metrics_a)],
        "executor-b": [*executor, "--no-admin", "--grpc-port", str(port()), "--metrics-port", str(metrics_b)],
    }  # fmt: skip
    metrics = {"executor-a": metrics_a, "executor-b": metrics_b}
    procs = {name: e2e_bench._spawn(name, a, env, tmp_path) for name, a in args.items()}
    channel = grpc.insecure_channel(f"127.0.0.1:{admin_port}")
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)
    md = (("authorization", f"Bearer {TOKEN}"),)
    try:
        e2e_bench._wait_ready(http_port, procs, timeout=90)
        with psycopg.connect(db_url, autocommit=True) as conn:
            pack = int(conn.execute("SELECT installed_pack_id FROM connector_installed_pack").fetchone()[0])  # type: ignore[index]
            ids = [f"ok-{secrets.token_hex(4)}-{i}" for i in range(GOOD)]
            answers = [_post(http_port, secret, "events", i) for i in ids]
            answers += [_post(http_port, secret, "fails", f"bad-{i}") for i in range(FAILING)]
            answers += [_post(http_port, secret, "events", ids[i]) for i in range(DUPLICATES)]
            answers += [
                _post(http_port, secret, "events", f"forged-{i}", forge=True) for i in range(BAD_SIGNATURE)
            ]
            answers += [_post(http_port, secret, "nowhere", f"lost-{i}") for i in range(UNROUTED)]
            assert answers.count(200) == GOOD + FAILING + DUPLICATES
            assert answers.count(401) == BAD_SIGNATURE and answers.count(404) == UNROUTED

            def done() -> bool:
                states = dict(
                    conn.execute("SELECT state, count(*) FROM connector_work_item GROUP BY 1").fetchall()
                )
                return states == {"succeeded": GOOD, "dead": FAILING}

            _until(done, "every delivery executed", procs)
            want_pack = {
                "accepted": GOOD + FAILING, "duplicates": DUPLICATES, "rejected": BAD_SIGNATURE,
                "unavailable": 0, "succeeded": GOOD, "failed": FAILING, "dead_lettered": FAILING,
                "ack_latency": GOOD + FAILING + DUPLICATES, "delivery_latency": GOOD,
                "scheduling_delay": GOOD + FAILING,
            }  # fmt: skip
            want_cluster = {**want_pack, "rejected": BAD_SIGNATURE + UNROUTED}

            def figures() -> pb.GetFiguresResponse | None:
                r = stub.GetFigures(pb.GetFiguresRequest(), metadata=md, timeout=10)
                ok = _totals(r, pack) == want_pack and _totals(r, 0) == want_cluster
                return r if ok else None

            response = _until(figures, "the figures to add up", procs, timeout=60)
            # Both executors executed some, and their own counters add up to the figures.
            executed = {
                name: _metric(p, "connector_executor_outcomes_total", 'state="succeeded"')
                + _metric(p, "connector_executor_outcomes_total", 'state="dead"')
                for name, p in metrics.items()
            }
            assert all(n > 0 for n in executed.values()), executed
            assert sum(executed.values()) == GOOD + FAILING
            # Latencies: ack within a second, delivery (receipt accepted -> succeeded) positive.
            points = [p for s in response.series if s.installed_pack_id == pack for p in s.points]
            delivered = [p.delivery_latency for p in points if p.delivery_latency.count]
            assert delivered and all(q.p50.seconds + q.p50.nanos > 0 for q in delivered)

            def sampled() -> bool:
                r = stub.GetFigures(pb.GetFiguresRequest(current_only=True), metadata=md, timeout=10)
                g = r.series[0].current.gauges
                return (
                    r.series[0].current.HasField("gauges")
                    and g.active_executors == 2
                    and g.ingress_processes == 1
                )

            _until(sampled, "a gauge sample with both executors and the ingress", procs)

            # connector admin top: the same figures for people and scripts.
            cli_env = {**env, "CONNECTOR_ADMIN_TOKEN": TOKEN}
            cli = [str(Path(sys.executable).with_name("connector")), "admin", "top", "--once",
                   "--address", f"127.0.0.1:{admin_port}"]  # fmt: skip
            text = subprocess.run(
                cli, env=cli_env, capture_output=True, text=True, timeout=60, check=True
            ).stdout
            assert "TOTAL" in text and f"figures-pack ({pack})" in text and "ACC/S" in text
            doc = json.loads(
                subprocess.run([*cli, "--json"], env=cli_env, capture_output=True, text=True, timeout=60,
                               check=True).stdout
            )  # fmt: skip
            assert [s.get("pack_name", "") for s in doc["series"]] == ["", "figures-pack"]
            assert "current" in doc["series"][0] and "points" not in doc["series"][0]

            # One leader; killed, the other executor takes over and the samples go on.
            leaders = {
                name: _metric(p, "connector_figures_leader", 'service="executor"')
                for name, p in metrics.items()
            }
            assert sorted(leaders.values()) == [0.0, 1.0], leaders
            leader = next(name for name, v in leaders.items() if v == 1.0)
            other = next(name for name in metrics if name != leader)
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait(10)
            del procs[leader]
            killed_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            _until(lambda: _metric(metrics[other], "connector_figures_leader", 'service="executor"') == 1.0,
                   "the other executor to lead", procs, timeout=30)  # fmt: skip

            def sampled_since() -> bool:
                row = conn.execute("SELECT max(sampled_at) FROM connector_figures").fetchone()
                return row is not None and row[0] is not None and row[0] > killed_at

            _until(sampled_since, "a sample by the new leader", procs, timeout=30)
    finally:
        channel.close()
        e2e_bench._stop(list(procs.values()))
