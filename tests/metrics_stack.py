"""The three services as real processes on ephemeral ports, with a small signed load through the
ingress: the fixture of the metrics-endpoint and live-Prometheus tests.

Reuses the end-to-end benchmark's pack (Standard Webhooks signature, one python ``noop`` work type),
its process spawning and its signed request. Everything waits on state (readiness, rows, samples),
never on time.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import e2e_bench  # noqa: E402
from connector.executor.handlers import HandlerContext, Outcome, work_handler  # noqa: E402

SERVICES = ("ingress", "materializer", "executor")
#: A second pack whose work never succeeds: one WorkItem waits an hour to retry (queue depth), one
#: goes dead at once (dead letters, failure classes).
PROBE_NAMESPACE = "probe"
PROBE_PACK = "metrics-probe"


@work_handler(needs_event=False)
async def retry_later(ctx: HandlerContext) -> Outcome:
    return Outcome.retry(3600.0, "probe_retry", "retry in an hour")


@work_handler(needs_event=False)
async def fail_now(ctx: HandlerContext) -> Outcome:
    return Outcome.fail("probe_invalid", "permanently refused")


def _probe_manifest() -> dict:
    doc = e2e_bench._manifest()
    doc["name"] = PROBE_PACK
    doc["namespace"] = PROBE_NAMESPACE
    doc["work_types"] = {
        "later": {
            "handler": {"kind": "python", "target": "tests.metrics_stack:retry_later"},
            "retry": {"max_attempts": 5, "backoff_base_s": 3600, "backoff_cap_s": 3600, "jitter": 0},
        },
        "fail": {"handler": {"kind": "python", "target": "tests.metrics_stack:fail_now"}},
    }
    doc["routes"][0]["fan_out"] = [{"work_type": "later"}, {"work_type": "fail"}]
    return doc


async def _install_probe(url: str) -> None:
    import psycopg

    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await install.pack_apply(conn, parse_manifest(_probe_manifest()), activate=True, actor="metrics-test")


INSTALL_SCRIPT = ROOT / "scripts" / "install-prometheus.sh"


def require_prometheus_tools() -> dict[str, str]:
    """Paths of ``promtool`` and ``prometheus``, installing Debian's package if they are missing
    (scripts/install-prometheus.sh). Fails (never skips) when they cannot be had."""
    if not (shutil.which("promtool") and shutil.which("prometheus")):
        res = subprocess.run([str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise AssertionError(
                "promtool/prometheus are required and could not be installed by "
                f"scripts/install-prometheus.sh (exit {res.returncode}): {res.stderr.strip()[-2000:]}"
            )
    tools = {name: shutil.which(name) for name in ("promtool", "prometheus")}
    missing = [k for k, v in tools.items() if not v]
    assert not missing, f"{missing} not on PATH after scripts/install-prometheus.sh"
    return {k: str(v) for k, v in tools.items()}


def wait_for(
    predicate: Callable[[], object], what: str, timeout: float = 90.0, check: Callable[[], None] | None = None
):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


@dataclass
class Stack:
    url: str
    secret: str
    http_port: int
    metrics: dict[str, int]
    grpc: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: Path = Path()

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                log = (self.logs / f"e2e-{name}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{name} exited with code {p.returncode}:\n{log}")

    def post(self, msg_id: str, *, bad_signature: bool = False, namespace: str = e2e_bench.NAMESPACE) -> int:
        """One signed delivery (or one whose signature is wrong); the HTTP status."""
        secret = self.secret
        if bad_signature:
            secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        key = base64.b64decode(secret.removeprefix("whsec_"))
        ts = int(time.time())
        body = json.dumps({"type": "metrics.probe", "id": msg_id}).encode()
        sig = base64.b64encode(hmac.digest(key, f"{msg_id}.{ts}.".encode() + body, "sha256")).decode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/webhooks/{namespace}/{e2e_bench.ROUTE_KEY}",
            data=body,
            method="POST",
            headers={
                "content-type": "application/json",
                "webhook-id": msg_id,
                "webhook-timestamp": str(ts),
                "webhook-signature": f"v1,{sig}",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def post_path(self, path: str) -> int:
        """A delivery to ``/v1/webhooks/<path>`` (e.g. no installed route); the HTTP status."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/webhooks/{path}", data=b"{}", method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def health_checks(self) -> None:
        """One gRPC health Check per service (through the servers' interceptors: gRPC metrics)."""
        for port in self.grpc.values():
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)

    def load(self, conn, n: int = 20, refused: int = 3) -> None:
        """``n`` signed deliveries (all executed) and ``refused`` with a wrong signature."""
        ids = [f"metrics_{os.urandom(4).hex()}_{i}" for i in range(n)]
        for msg_id in ids:
            status = self.post(msg_id)
            assert status == 200, status
        for i in range(refused):
            assert self.post(f"bad_{i}", bad_signature=True) == 401
        probe = f"probe_{os.urandom(4).hex()}"
        assert self.post(probe, namespace=PROBE_NAMESPACE) == 200
        wait_for(
            lambda: (
                sorted(
                    r[0]
                    for r in conn.execute(
                        "SELECT w.state FROM connector_work_item w JOIN connector_event e USING (event_id)"
                        " JOIN connector_ingress_receipt r USING (receipt_id)"
                        " WHERE r.provider_delivery_id = %s",
                        (probe,),
                    ).fetchall()
                )
                == ["dead", "retry"]
            ),
            "the probe's WorkItems to be dead and waiting to retry",
            check=self.check_alive,
        )
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM connector_work_item w JOIN connector_event e USING (event_id)"
                    " JOIN connector_ingress_receipt r USING (receipt_id)"
                    " WHERE w.state = 'succeeded' AND r.provider_delivery_id = ANY(%s)",
                    (ids,),
                ).fetchone()[0]
                == n
            ),
            "the load's WorkItems to succeed",
            check=self.check_alive,
        )


@contextmanager
def running_stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    """Install the benchmark pack and start the three services (stopped with SIGTERM at the end)."""
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    os.environ[e2e_bench.SECRET_ENV] = secret  # the pack apply checks that the reference resolves
    asyncio.run(e2e_bench._install(db_url))
    asyncio.run(_install_probe(db_url))
    port = e2e_bench._free_port
    stack = Stack(
        url=db_url,
        secret=secret,
        http_port=port(),
        metrics={s: port() for s in SERVICES},
        grpc={s: port() for s in SERVICES},
        logs=tmp_path,
    )
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": db_url,
        "CONNECTOR_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        e2e_bench.SECRET_ENV: secret,
        "CONNECTOR_MATERIALIZER_GRPC_PORT": str(stack.grpc["materializer"]),
        "CONNECTOR_MATERIALIZER_METRICS_PORT": str(stack.metrics["materializer"]),
        "CONNECTOR_EXECUTOR_GRPC_PORT": str(stack.grpc["executor"]),
        "CONNECTOR_EXECUTOR_METRICS_PORT": str(stack.metrics["executor"]),
        "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "0.5",
    }
    ingress_args = ["ingress", "--http-port", str(stack.http_port), "--grpc-port", str(stack.grpc["ingress"]),
                    "--metrics-port", str(stack.metrics["ingress"])]  # fmt: skip
    stack.procs = {
        "ingress": e2e_bench._spawn("ingress", ingress_args, env, tmp_path),
        "materializer": e2e_bench._spawn("materializer", ["materializer"], env, tmp_path),
        "executor": e2e_bench._spawn("executor", ["executor", "--no-admin"], env, tmp_path),
    }
    try:
        e2e_bench._wait_ready(stack.http_port, stack.procs, timeout=90)
        for name in SERVICES:

            def up(name: str = name) -> bool:
                try:
                    return "connector_build_info" in scrape(stack.metrics[name])
                except OSError:
                    return False

            wait_for(up, f"{name}'s metrics endpoint", check=stack.check_alive)
        yield stack
    finally:
        e2e_bench._stop(list(stack.procs.values()))
