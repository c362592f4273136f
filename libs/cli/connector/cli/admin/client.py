"""The admin CLI's connection and the argument helpers its command modules share (``admin.py``,
``admin_cutover.py``): the gRPC client with the bearer token and TLS, error formatting, pack names
resolved to ids, and paging."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from connector.common.core.grpc_server import error_info
from connector.common.core.settings import AdminSettings, load
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc


class CliError(Exception):
    """A usage or local problem (exit 2)."""


# --------------------------------------------------------------------------------------------------
# Connection
# --------------------------------------------------------------------------------------------------


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        settings = load(AdminSettings)
        self.address = args.address or settings.address
        token = settings.token.get_secret_value()
        if args.token_file:
            try:
                token = Path(args.token_file).read_text().strip()
            except OSError as exc:
                raise CliError(f"cannot read token file {args.token_file}: {exc.strerror}") from None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout = args.timeout
        if args.tls_ca_file or args.tls_cert_file:
            try:
                creds = grpc.ssl_channel_credentials(
                    root_certificates=_read(args.tls_ca_file),
                    private_key=_read(args.tls_key_file),
                    certificate_chain=_read(args.tls_cert_file),
                )
            except OSError as exc:
                raise CliError(f"cannot read TLS file {exc.filename}: {exc.strerror}") from None
            self.channel = grpc.secure_channel(self.address, creds)
        else:
            self.channel = grpc.insecure_channel(self.address)
        self.stub = admin_service_pb2_grpc.AdminServiceStub(self.channel)

    def call(self, method: str, request: Message) -> Any:
        return getattr(self.stub, method)(request, metadata=self._metadata, timeout=self.timeout)

    def stream(self, method: str, request: Message) -> Any:
        return getattr(self.stub, method)(request, metadata=self._metadata)

    def close(self) -> None:
        self.channel.close()


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[Client]:
    client = Client(args)
    try:
        yield client
    finally:
        client.close()


def format_error(exc: grpc.RpcError) -> str:
    code = exc.code().name if hasattr(exc, "code") and exc.code() is not None else "UNKNOWN"
    info = error_info(exc)
    reason = info.reason if info is not None and info.reason else "-"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"error: {code} {reason}: {details}"


# --------------------------------------------------------------------------------------------------
# Arguments and pages
# --------------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def resolve_pack_id(client: Client, pack: str | None) -> int:
    """A pack given by id or by name (names are resolved with ListPacks)."""
    if not pack:
        return 0
    if pack.isdigit():
        return int(pack)
    token = ""
    while True:
        page = client.call("ListPacks", pb.ListPacksRequest(page_size=500, page_token=token))
        for p in page.packs:
            if p.name == pack:
                return int(p.installed_pack_id)
        token = page.next_page_token
        if not token:
            raise CliError(f"no pack named {pack!r}")


def fetch_pages(client: Client, method: str, request: Any, field: str, follow: bool) -> Any:
    """One page, or with ``follow`` every page merged into one response."""
    response = client.call(method, request)
    if not follow:
        return response
    while response.next_page_token:
        request.page_token = response.next_page_token
        nxt = client.call(method, request)
        getattr(response, field).extend(getattr(nxt, field))
        response.next_page_token = nxt.next_page_token
    return response


def print_more_hint(args: argparse.Namespace, response: Any) -> None:
    if response.next_page_token and not args.json:
        print(f"(more: --page-token {response.next_page_token}, or --all)", file=sys.stderr)


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str) -> datetime:
    """ISO 8601 (UTC when no offset) or a relative age such as ``90s``, ``15m``, ``2h``, ``7d``."""
    match = _RELATIVE.match(text.strip())
    if match:
        return datetime.now(UTC) - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (ISO 8601 or e.g. 15m, 2h, 7d)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
