"""``connector console``: the console's HTTP server, alone or inside ``connector up``.

``ConsoleService`` has the runtime's ``start``/``stop`` shape; ``cli`` runs it until SIGTERM/SIGINT.
It holds one gRPC channel to the admin API and the sessions in memory (a restart logs everyone out).
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
from aiohttp import web

from connector.common.core import logs
from connector.common.core.runtime import run, run_until_signal
from connector.common.core.settings import AdminSettings, ConsoleSettings, SettingsError, load
from connector.console.app import build_app
from connector.console.client import AdminClient
from connector.console.sessions import SessionStore

log = logging.getLogger("connector.console")


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SettingsError(f"cannot read {what} {path}: {exc.strerror}") from None


def admin_credentials(cfg: ConsoleSettings) -> grpc.ChannelCredentials | None:
    if not (cfg.admin_tls_ca_file or cfg.admin_tls_cert_file):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(cfg.admin_tls_ca_file, "CONNECTOR_CONSOLE_ADMIN_TLS_CA_FILE"),
        private_key=_read(cfg.admin_tls_key_file, "CONNECTOR_CONSOLE_ADMIN_TLS_KEY_FILE"),
        certificate_chain=_read(cfg.admin_tls_cert_file, "CONNECTOR_CONSOLE_ADMIN_TLS_CERT_FILE"),
    )


def server_tls(cfg: ConsoleSettings) -> ssl.SSLContext | None:
    if not cfg.tls_cert_file and not cfg.tls_key_file:
        return None
    if not cfg.tls_cert_file or not cfg.tls_key_file:
        raise SettingsError("CONNECTOR_CONSOLE_TLS_CERT_FILE and CONNECTOR_CONSOLE_TLS_KEY_FILE go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"cannot load the console's TLS certificate: {exc}") from None
    return context


class ConsoleService:
    name = "console"

    def __init__(
        self,
        cfg: ConsoleSettings,
        *,
        admin_address: str | Callable[[], str] | None = None,
        optional: bool = False,
    ) -> None:
        self.cfg = cfg
        self._admin_address = admin_address or cfg.admin_address or load(AdminSettings).address
        #: ``connector up``: a port in use is reported (``problem``), not fatal for the runtime.
        self.optional = optional
        self.problem = ""
        self.tls = server_tls(cfg)
        self.sessions = SessionStore(idle_s=cfg.session_idle_s, max_age_s=cfg.session_max_age_s)
        self._credentials = admin_credentials(cfg)
        self.client: AdminClient | None = None
        self._runner: web.AppRunner | None = None
        self.port = cfg.port

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        host = "127.0.0.1" if self.cfg.host in ("0.0.0.0", "::", "") else self.cfg.host
        return f"{scheme}://{host}:{self.port}"

    def login_link(self, token: str) -> str:
        """A one-time login URL for ``token`` (valid once, for a few minutes)."""
        return f"{self.url}/login/link/{self.sessions.link(token)}"

    @property
    def admin_address(self) -> str:
        address = self._admin_address
        return address() if callable(address) else address

    async def start(self) -> None:
        try:
            await self._start()
        except OSError as exc:
            if not self.optional:
                raise
            where = f"{self.cfg.host}:{self.cfg.port}"
            self.problem = f"cannot listen on {where}: {exc.strerror} (set CONNECTOR_CONSOLE_PORT)"
            await self.stop()

    async def _start(self) -> None:
        self.client = AdminClient(
            self.admin_address, credentials=self._credentials, timeout_s=self.cfg.admin_timeout_s
        )
        app = build_app(
            self.client,
            self.sessions,
            secure_cookies=self.tls is not None or self.cfg.secure_cookies,
            options={"trace_url_template": self.cfg.trace_url_template},
        )
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, ssl_context=self.tls)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("console listening", extra={"url": self.url, "admin_address": self.admin_address})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.client is not None:
            await self.client.close()
            self.client = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="listen address (CONNECTOR_CONSOLE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (CONNECTOR_CONSOLE_PORT, default 8090)")
    parser.add_argument(
        "--admin-address",
        help="the admin API (CONNECTOR_CONSOLE_ADMIN_ADDRESS, else CONNECTOR_ADMIN_ADDRESS)",
    )


def cli(args: argparse.Namespace) -> int:
    logs.setup("console", os.environ.get("CONNECTOR_LOG_LEVEL", "INFO"))
    cfg = load(ConsoleSettings)
    if args.host:
        cfg.host = args.host
    if args.port is not None:
        cfg.port = args.port
    service = ConsoleService(cfg, admin_address=args.admin_address)

    async def main() -> None:
        async def started() -> None:
            print(
                f"console: {service.url} (admin API {service.admin_address}); log in with an admin token",
                flush=True,
            )

        await run_until_signal([service], on_started=started)

    try:
        run(main)
    except OSError as exc:
        print(
            f"error: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror} (set CONNECTOR_CONSOLE_PORT)",
            file=sys.stderr,
        )
        return 1
    return 0
