"""AIP-158 pagination: page sizes and opaque page tokens bound to the request's filters.

A token is base64url of ``{"k": <last key>, "f": <filter hash>}``. It only says where the next page
starts (keyset pagination, no offsets); a token presented with other filters than the ones it was
issued for is refused with INVALID_ARGUMENT, so a client cannot silently mix two listings.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from connector.common.grpc_server import ServiceError
from connector.executor.admin.errors import Reason, invalid_argument

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def page_size(requested: int) -> int:
    if requested < 0:
        raise invalid_argument("page_size must not be negative", field="page_size")
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def filter_hash(filters: dict[str, Any]) -> str:
    text = json.dumps(filters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode(key: list[Any], filters: dict[str, Any]) -> str:
    raw = json.dumps({"k": key, "f": filter_hash(filters)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def bad_page_token() -> ServiceError:
    return invalid_argument("page_token is not a token this API issued", Reason.INVALID_PAGE_TOKEN)


def decode(token: str, filters: dict[str, Any], *, arity: int) -> list[Any] | None:
    """The last key of the previous page, or None for the first page."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        key, fhash = data["k"], data["f"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise bad_page_token() from None
    if not isinstance(key, list) or len(key) != arity:
        raise bad_page_token()
    if fhash != filter_hash(filters):
        raise invalid_argument(
            "page_token was issued for other filters; repeat the first request's filters",
            Reason.PAGE_TOKEN_FILTER_MISMATCH,
        )
    return key
