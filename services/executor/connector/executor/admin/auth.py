"""Admin API access: bearer tokens from configuration mapped to roles, and optional (m)TLS.

``CONNECTOR_ADMIN_TOKENS="tokenA=ViewConnectorEvents;tokenB=ViewConnectorEvents,ReplayConnectorEvents"``.
Roles: ``ViewConnectorEvents`` (reads), ``ReplayConnectorEvents`` (replays and cancels of single
WorkItems; also allows payloads in GetWorkItem), ``ConnectorOperator`` (packs, pause/resume and
cutover; implies every other role).

A presented token is hashed and compared with ``hmac.compare_digest`` against the hash of *every*
configured token (no early exit), so timing says nothing about which or how much of a token matched.
Tokens are never logged: a principal is identified by a key id (the first 12 hex digits of the
token's SHA-256), which is what audit log lines carry.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import Counter

from connector.common.core.settings import AdminSettings, SettingsError
from connector.executor.admin.errors import Reason, permission_denied, unauthenticated
from connector.executor.metrics import REGISTRY

log = logging.getLogger(__name__)

SERVICE = "connector.v1.AdminService"
PROTECTED_PREFIXES = (f"/{SERVICE}/",)
MIN_TOKEN_LENGTH = 16

AUTH_FAILURES = Counter(
    "connector_admin_auth_failures_total",
    "Admin API calls refused by authentication or authorization",
    ["reason"],
    registry=REGISTRY,
)


class Role(StrEnum):
    VIEW = "ViewConnectorEvents"
    REPLAY = "ReplayConnectorEvents"
    OPERATOR = "ConnectorOperator"


#: The role each RPC needs (None: any valid token, no role). An RPC missing here is refused (fail
#: closed).
METHOD_ROLES: dict[str, Role | None] = {
    "GetCaller": None,
    "ListDeadLetters": Role.VIEW,
    "GetWorkItem": Role.VIEW,
    "ListReceiptFailures": Role.VIEW,
    "GetQueueStats": Role.VIEW,
    "GetFigures": Role.VIEW,
    "ListBlockedLanes": Role.VIEW,
    "ListPacks": Role.VIEW,
    "GetCutoverState": Role.VIEW,
    "ListLegacyFailures": Role.VIEW,
    "ListProcesses": Role.VIEW,
    "FindDeliveries": Role.VIEW,
    "ListReconcileStates": Role.VIEW,
    "ListFailureGroups": Role.VIEW,
    "TraceDelivery": Role.VIEW,
    "ReplayWorkItem": Role.REPLAY,
    "ReplayDeadLetters": Role.REPLAY,
    "ReplayReceipt": Role.REPLAY,
    "CancelWorkItem": Role.REPLAY,
    "CancelDeadLetters": Role.REPLAY,
    "PausePack": Role.OPERATOR,
    "ResumePack": Role.OPERATOR,
    "OpenCircuit": Role.OPERATOR,
    "CloseCircuit": Role.OPERATOR,
    "RunReconcile": Role.OPERATOR,
    "ApplyPack": Role.OPERATOR,
    "ActivateGeneration": Role.OPERATOR,
    "QuiesceLegacy": Role.OPERATOR,
    "CompleteCutover": Role.OPERATOR,
    "BeginRollback": Role.OPERATOR,
    "CompleteRollback": Role.OPERATOR,
    "AbortTransition": Role.OPERATOR,
    "ReconcileLegacyOutcomes": Role.OPERATOR,
    "ResolveLegacyOutcome": Role.OPERATOR,
}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who called: a key id (safe to log) and the roles of the token."""

    key_id: str
    roles: frozenset[Role]

    def has(self, role: Role) -> bool:
        return Role.OPERATOR in self.roles or role in self.roles

    @property
    def may_see_payload(self) -> bool:
        return self.has(Role.REPLAY)

    def allowed_methods(self) -> list[str]:
        """The RPCs this principal may call, sorted (GetCaller: what the console gates actions by)."""
        return sorted(m for m, role in METHOD_ROLES.items() if role is None or self.has(role))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def key_id(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def parse_tokens(spec: str) -> list[tuple[bytes, Principal]]:
    """Parse ``token=Role[,Role];token2=Role``. Errors name the entry's position, never the token."""
    table: list[tuple[bytes, Principal]] = []
    problems: list[str] = []
    seen: set[bytes] = set()
    entries = [e.strip() for e in spec.split(";")]
    for index, entry in enumerate(entries, start=1):
        if not entry:
            continue
        token, sep, roles_text = entry.rpartition("=")  # tokens may end in base64 '=' padding
        token = token.strip()
        if not sep or not token:
            problems.append(f"entry {index}: expected token=Role[,Role]")
            continue
        if len(token) < MIN_TOKEN_LENGTH:
            problems.append(f"entry {index}: token shorter than {MIN_TOKEN_LENGTH} characters")
        roles: set[Role] = set()
        for name in (r.strip() for r in roles_text.split(",")):
            try:
                roles.add(Role(name))
            except ValueError:
                problems.append(f"entry {index}: unknown role {name!r} (known: {', '.join(Role)})")
        digest = _digest(token)
        if digest in seen:
            problems.append(f"entry {index}: duplicate token")
        seen.add(digest)
        table.append((digest, Principal(key_id(token), frozenset(roles))))
    if problems:
        raise SettingsError("invalid CONNECTOR_ADMIN_TOKENS:\n" + "\n".join(f"  {p}" for p in problems))
    return table


def _bearer(metadata: Sequence[tuple[str, Any]]) -> str | None:
    for key, value in metadata:
        if key.lower() != "authorization":
            continue
        text = value.decode() if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return None
    return None


class TokenAuthenticator:
    """The ``authenticate(method, metadata)`` hook of ``GrpcServer`` for the admin service."""

    def __init__(self, tokens: str) -> None:
        self._table = parse_tokens(tokens)
        if not self._table:
            log.warning("admin API has no tokens configured (CONNECTOR_ADMIN_TOKENS): every call is refused")

    async def __call__(self, method: str, metadata: Sequence[tuple[str, Any]]) -> Principal:
        token = _bearer(metadata)
        if token is None:
            AUTH_FAILURES.labels(Reason.TOKEN_MISSING).inc()
            raise unauthenticated(Reason.TOKEN_MISSING, "missing 'authorization: Bearer <token>' metadata")
        presented = _digest(token)
        match: Principal | None = None
        for digest, principal in self._table:  # every entry, no early exit
            if hmac.compare_digest(digest, presented):
                match = principal
        if match is None:
            AUTH_FAILURES.labels(Reason.TOKEN_INVALID).inc()
            raise unauthenticated(Reason.TOKEN_INVALID, "invalid token")
        name = method.rsplit("/", 1)[-1]
        if name in METHOD_ROLES and METHOD_ROLES[name] is None:
            return match  # any valid token (GetCaller)
        required = METHOD_ROLES.get(name)
        if required is None or not match.has(required):
            AUTH_FAILURES.labels(Reason.ROLE_REQUIRED).inc()
            role = required.value if required else "none"
            raise permission_denied(Reason.ROLE_REQUIRED, f"{name} needs role {role}", role=role)
        return match


def server_credentials(settings: AdminSettings) -> grpc.ServerCredentials | None:
    """TLS (and mTLS when a client CA is configured) from settings; None for plaintext."""
    cert, key, client_ca = settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
    if not cert and not key:
        if client_ca:
            raise SettingsError("CONNECTOR_ADMIN_TLS_CLIENT_CA_FILE needs TLS_CERT_FILE and TLS_KEY_FILE")
        return None
    if not cert or not key:
        raise SettingsError("CONNECTOR_ADMIN_TLS_CERT_FILE and CONNECTOR_ADMIN_TLS_KEY_FILE go together")
    try:
        pair = (Path(key).read_bytes(), Path(cert).read_bytes())
        roots = Path(client_ca).read_bytes() if client_ca else None
    except OSError as exc:
        raise SettingsError(f"cannot read admin TLS file {exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=roots is not None)
