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
from connector.common.core.settings import AdminSettings, DatabaseSettings, load
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
        #: Where the token came from, for error messages (never the token).
        self.token_source = "CONNECTOR_ADMIN_TOKEN" if token else ""
        token_file = args.token_file or settings.token_file
        if token_file:
            option = "--token-file" if args.token_file else "CONNECTOR_ADMIN_TOKEN_FILE"
            try:
                token = Path(token_file).read_text().strip()
            except OSError as exc:
                raise CliError(
                    f"cannot read the token file {token_file} ({option}): {exc.strerror};"
                    f" `connector up` writes one to {_local_token_file()}"
                ) from None
            self.token_source = f"{token_file} ({option})"
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
        self._pack_names: dict[int, str] | None = None

    def pack_names(self) -> dict[int, str]:
        """Installed pack id -> name (one ListPacks walk, kept for the command's life)."""
        if self._pack_names is None:
            names: dict[int, str] = {}
            token = ""
            while True:
                page = self.call("ListPacks", pb.ListPacksRequest(page_size=500, page_token=token))
                names.update({int(p.installed_pack_id): p.name for p in page.packs})
                token = page.next_page_token
                if not token:
                    break
            self._pack_names = names
        return self._pack_names

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


def _local_token_file() -> Path:
    """The operator token ``connector up`` writes (``CONNECTOR_DATA_DIR/admin-token``)."""
    return (Path(load(DatabaseSettings).data_dir) / "admin-token").resolve()


def format_error(exc: grpc.RpcError, client: Client | None = None) -> str:
    """One line: ``error: CODE [REASON]: message`` and, for the conditions a user can fix, what to do."""
    code = exc.code().name if hasattr(exc, "code") and exc.code() is not None else "UNKNOWN"
    info = error_info(exc)
    reason = info.reason if info is not None and info.reason else ""
    details = exc.details() if hasattr(exc, "details") else str(exc)
    head = f"error: {code} {reason}" if reason else f"error: {code}"
    hint = _hint(code, reason, client)
    if code == "UNAVAILABLE" and not reason and client is not None:
        # gRPC's own text ("failed to connect to all addresses; last error: ...") repeats the address.
        return f"{head}: no admin API answers at {client.address}: {hint}"
    return f"{head}: {details}" + (f" ({hint})" if hint else "")


def _hint(code: str, reason: str, client: Client | None) -> str:
    local = _local_token_file()
    made_here = f"; `connector up` wrote one to {local}" if local.exists() else ""
    if reason == "TOKEN_MISSING":
        return (
            "no token given: set CONNECTOR_ADMIN_TOKEN_FILE (or CONNECTOR_ADMIN_TOKEN, or --token-file)"
            + made_here
        )
    if reason == "TOKEN_INVALID":
        source = client.token_source if client is not None and client.token_source else "the token given"
        return f"the token from {source} is not one of the server's CONNECTOR_ADMIN_TOKENS" + made_here
    if code == "PERMISSION_DENIED":
        return "this token's role may not do that: use a token with the role named above"
    if code == "UNAVAILABLE" and reason:
        return "the executor is up but its database is not: check the database, then try again"
    if code == "UNAVAILABLE":
        return (
            "is the executor running? (`connector up`, or `connector executor`; the address comes from"
            " --address or CONNECTOR_ADMIN_ADDRESS)"
        )
    if code == "DEADLINE_EXCEEDED":
        return "the call took longer than --timeout; the server may be overloaded"
    return ""


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


def pack_label(client: Client, pack_id: int) -> str:
    """A pack as every command prints it: ``name (id)`` (names from one ListPacks per command)."""
    names = client.pack_names()
    name = names.get(int(pack_id))
    return f"{name} ({pack_id})" if name else str(pack_id)


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
