"""AIP-158 pagination: page sizes and opaque, authenticated page tokens bound to the request.

A token is ``v1.<payload>.<mac>``: base64url of ``{"m": <method>, "k": <last key>, "f": <filter
hash>}`` and the first 16 bytes of its HMAC-SHA256 under the server's page-token key. It only says
where the next page starts (keyset pagination, no offsets). A token the server did not issue — any
changed byte, another key, another RPC's token — is INVALID_ARGUMENT ``INVALID_PAGE_TOKEN`` before
anything in it is used; a genuine token presented with other filters than the ones it was issued
for is INVALID_ARGUMENT ``PAGE_TOKEN_FILTER_MISMATCH``, so a client cannot silently mix two
listings, nor hand the keyset query values it made up.

The key (``PageTokens.from_settings``): ``CONNECTOR_ADMIN_PAGE_TOKEN_KEY`` when set; else derived
from ``CONNECTOR_ADMIN_TOKENS`` (replicas configured alike accept each other's tokens); else a
random key per process (tokens then work only against the replica that issued them, until it
restarts). docs/admin.md, "Page tokens".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from typing import Any

from connector.common.core.grpc_server import ServiceError
from connector.common.core.settings import AdminSettings
from connector.executor.admin.errors import Reason, invalid_argument

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
VERSION = "v1"
MAC_BYTES = 16
#: Longest token this API issues is far below this (a lane key is at most 1 KiB).
MAX_TOKEN_LENGTH = 8192
_DERIVE_LABEL = b"connector admin page tokens v1"


def page_size(requested: int) -> int:
    if requested < 0:
        raise invalid_argument("page_size must not be negative", field="page_size")
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def filter_hash(filters: dict[str, Any]) -> str:
    text = json.dumps(filters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def bad_page_token() -> ServiceError:
    return invalid_argument(
        "page_token is not a token this API issued", Reason.INVALID_PAGE_TOKEN, field="page_token"
    )


class PageTokens:
    """Issues and checks page tokens under one HMAC key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key else secrets.token_bytes(32)
        #: Where the key came from: ``setting``, ``admin_tokens`` or ``per_process`` (docs, logs).
        self.source = "setting" if key else "per_process"

    @classmethod
    def from_settings(cls, settings: AdminSettings) -> PageTokens:
        explicit = settings.page_token_key.get_secret_value()
        if explicit:
            return cls(explicit.encode())
        tokens = settings.tokens.get_secret_value().strip()
        if tokens:
            out = cls(hmac.new(tokens.encode(), _DERIVE_LABEL, hashlib.sha256).digest())
            out.source = "admin_tokens"
            return out
        return cls()

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:MAC_BYTES]

    def encode(self, method: str, key: list[Any], filters: dict[str, Any]) -> str:
        payload = json.dumps(
            {"m": method, "k": key, "f": filter_hash(filters)}, separators=(",", ":"), ensure_ascii=True
        ).encode()
        return f"{VERSION}.{_b64(payload)}.{_b64(self._mac(payload))}"

    def decode(self, method: str, token: str, filters: dict[str, Any], *, arity: int) -> list[Any] | None:
        """The last key of the previous page, or None for the first page (empty token)."""
        if not token:
            return None
        if len(token) > MAX_TOKEN_LENGTH:
            raise bad_page_token()
        try:
            version, payload_text, mac_text = token.split(".")
            if version != VERSION:
                raise ValueError(version)
            payload, mac = _unb64(payload_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            raise bad_page_token() from None
        # Authenticate before parsing: nothing of a forged token is ever looked at.
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise bad_page_token()
        try:
            data = json.loads(payload)
            key, fhash, issued_for = data["k"], data["f"], data["m"]
        except (ValueError, KeyError, TypeError):
            raise bad_page_token() from None
        if issued_for != method or not isinstance(key, list) or len(key) != arity:
            raise bad_page_token()
        if fhash != filter_hash(filters):
            raise invalid_argument(
                "page_token was issued for other filters; repeat the first request's filters",
                Reason.PAGE_TOKEN_FILTER_MISMATCH,
                field="page_token",
            )
        return key
