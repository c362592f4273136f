"""The generic signature verifier: one verifier configured per route, compiled once.

A route's ``VerificationSpec`` is resolved (``connector.common.packs.verification.resolve``) into a flat
config and compiled here into a ``SignatureVerifier`` (``HmacVerifier`` is the same class under its
first name; ``NoneVerifier`` when ``scheme: none`` is explicit). Compilation does the work once per
route load: header names, the signed-content template, the decoder and the loaded keys. Verifying a
delivery then builds the signed content from the raw bytes and checks it:

- ``hmac``: one HMAC per active secret and a constant-time comparison against every signature the
  sender put in the header;
- ``ed25519`` / ``ecdsa``: a public-key verification (the ``cryptography`` library) per active key
  and candidate signature, with the sender's public keys.

Nothing here branches on a provider. Every failure raises ``Rejected`` with a reason from a fixed
vocabulary (safe as a metric label); a malformed header is a rejection, never an exception of
another kind.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import load_der_public_key
from multidict import MultiMapping

from connector.common.packs.extraction import rfc3339_seconds
from connector.common.packs.verification import DEFAULT_TOLERANCE_S, SecretKey

# Rejection reasons of the verifier (HTTP 401).
SIGNATURE_MISSING: Final = "signature_missing"
SIGNATURE_MALFORMED: Final = "signature_malformed"
SIGNATURE_MISMATCH: Final = "signature_mismatch"
TIMESTAMP_MISSING: Final = "timestamp_missing"
TIMESTAMP_MALFORMED: Final = "timestamp_malformed"
TIMESTAMP_STALE: Final = "timestamp_stale"
TIMESTAMP_FUTURE: Final = "timestamp_future"
ID_MISSING: Final = "id_missing"
ID_MALFORMED: Final = "id_malformed"

#: Bounds on attacker-controlled header content (a longer header is malformed, not parsed).
MAX_SIGNATURE_HEADER = 4096
MAX_SIGNATURES = 16
#: A public-key check costs ~100x an HMAC compare: fewer candidates (rotation sends two).
MAX_PUBLIC_KEY_SIGNATURES = 4
MAX_ID_LENGTH = 256
MAX_TIMESTAMP_DIGITS = 16
#: A form-encoded body with more fields than this cannot be signed content (``{sorted_form}``):
#: parsing and sorting a megabyte of empty fields would hold the event loop.
MAX_FORM_FIELDS = 1000
#: Bounds of a DER-encoded ECDSA signature (P-521 is the largest curve: 139 bytes).
_ECDSA_DER_BOUNDS = (8, 139)

_DIGITS = re.compile(r"^[0-9]{1,16}$")
# RFC 3339 date-time (section 5.6), at most nanosecond precision.


class Rejected(Exception):
    """The delivery is refused before any write; ``reason`` is a fixed-vocabulary label."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: Case-insensitive headers (aiohttp's ``CIMultiDictProxy``, multidict's ``CIMultiDict``).
Headers = MultiMapping[str]


class Verifier(Protocol):
    #: ``hmac-sha256`` / ``ed25519`` / ``ecdsa-sha256`` / ``none``: stored (with the matching key's
    #: reference name) on the receipt.
    scheme: str

    def verify(self, headers: Headers, body: bytes, method: str, uri: Callable[[], str], now: float) -> str:
        """Return the verification label (``hmac-sha256:env:NAME``) or raise ``Rejected``."""
        ...


class NoneVerifier:
    """``scheme: none``, only when a route sets it explicitly."""

    scheme = "none"

    def verify(self, headers: Headers, body: bytes, method: str, uri: Callable[[], str], now: float) -> str:
        return "none"


def single_header(headers: Headers, name: str) -> str | None:
    """The value of a header that must appear at most once (a repeated one is ambiguous)."""
    values = headers.getall(name, ())
    if not values:
        return None
    if len(values) > 1:
        raise Rejected(SIGNATURE_MALFORMED)
    return str(values[0])


# A compiled template part: literal bytes, or the index of a dynamic value.
_BODY, _TIMESTAMP, _ID, _METHOD, _URI, _SORTED_FORM = range(6)
_SLOTS = {
    "body": _BODY, "timestamp": _TIMESTAMP, "id": _ID, "method": _METHOD, "uri": _URI,
    "sorted_form": _SORTED_FORM,
}  # fmt: skip


def compile_template(template: str) -> tuple[bytes | int, ...]:
    parts: list[bytes | int] = []
    pos = 0
    for match in re.finditer(r"\{(body|timestamp|id|method|uri|sorted_form)\}", template):
        if match.start() > pos:
            parts.append(template[pos : match.start()].encode())
        parts.append(_SLOTS[match.group(1)])
        pos = match.end()
    if pos < len(template):
        parts.append(template[pos:].encode())
    return tuple(parts)


def uri_decoder(escapes: Sequence[str]) -> Callable[[str], str]:
    """Decode exactly the given percent-escapes (case-insensitive), leaving every other one as sent."""
    codes = sorted({e[1:].upper() for e in escapes})
    if not codes:
        return lambda u: u
    pattern = re.compile("%(" + "|".join(codes) + ")", re.IGNORECASE)
    return lambda u: pattern.sub(lambda m: chr(int(m.group(1), 16)), u)


def sorted_form(body: bytes) -> bytes:
    """``{sorted_form}``: the body parsed as ``application/x-www-form-urlencoded`` (UTF-8, blank values
    kept), its pairs sorted by name then value, each written as name immediately followed by value.

    This is how senders that sign form posts (Twilio) build their content. A body that is not such a
    form (bad UTF-8 in an escape, more than ``MAX_FORM_FIELDS`` fields) cannot match any signature.
    """
    try:
        text = body.decode("utf-8")
        pairs = parse_qsl(
            text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=MAX_FORM_FIELDS
        )
    except ValueError:  # UnicodeDecodeError included
        raise Rejected(SIGNATURE_MISMATCH) from None
    pairs.sort()
    return "".join(name + value for name, value in pairs).encode()


class SignatureVerifier:
    """A signature over a templated string, carried in a header (plain, ``k=v`` list or spaced list):
    HMAC with shared secrets, or ed25519 / ECDSA with the sender's public keys."""

    def __init__(self, cfg: Mapping[str, Any], keys: Sequence[SecretKey]) -> None:
        if not keys:
            raise ValueError("a signature verifier needs at least one key")
        kind = str(cfg.get("scheme") or "hmac")
        algorithm = str(cfg.get("algorithm") or "sha256")
        self._kind = kind
        self._public: tuple[tuple[Any, str], ...] = ()
        if kind == "hmac":
            if algorithm not in ("sha256", "sha1"):
                raise ValueError(f"unsupported algorithm {algorithm!r}")
            self.scheme = f"hmac-{algorithm}"
            self._digest = getattr(hashlib, algorithm)
            digest_size = int(self._digest().digest_size)
            self._sig_bounds = (digest_size, digest_size)
        elif kind == "ed25519":
            self.scheme = "ed25519"
            self._sig_bounds = (64, 64)
            self._public = tuple(
                (ed25519.Ed25519PublicKey.from_public_bytes(k.key), f"{self.scheme}:{k.name}") for k in keys
            )
        elif kind == "ecdsa":
            if algorithm != "sha256":
                raise ValueError(f"unsupported algorithm {algorithm!r}")
            self.scheme = f"ecdsa-{algorithm}"
            self._sig_bounds = _ECDSA_DER_BOUNDS
            self._ecdsa = ec.ECDSA(hashes.SHA256())
            self._public = tuple((load_der_public_key(k.key), f"{self.scheme}:{k.name}") for k in keys)
        else:
            raise ValueError(f"unsupported scheme {kind!r}")
        self._keys = tuple((k.key, f"{self.scheme}:{k.name}") for k in keys)
        self._max_signatures = MAX_PUBLIC_KEY_SIGNATURES if self._public else MAX_SIGNATURES
        self._base64 = cfg["encoding"] == "base64"
        self._header = str(cfg["signature_header"])
        self._prefix = str(cfg.get("signature_prefix") or "")
        self._format = str(cfg.get("signature_format") or "plain")
        self._sig_key = str(cfg.get("kv_signature_key") or "v1")
        self._kv_sep = str(cfg.get("kv_separator") or ",")
        self._kv_ts_key = cfg.get("kv_timestamp_key") if self._format == "kv" else None
        self._ts_header = cfg.get("timestamp_header")
        unit = cfg.get("timestamp_unit")
        self._rfc3339 = unit == "rfc3339"
        self._ts_divisor = 1000 if unit == "ms" else 1
        self._id_header = cfg.get("id_header")
        template = str(cfg["signed_content"])
        self._parts = compile_template(template)
        self._body_only = self._parts == (_BODY,)
        self._uses = {p for p in self._parts if isinstance(p, int)}
        self._has_timestamp = bool(self._ts_header or self._kv_ts_key)
        self._uri_decode = uri_decoder(cfg.get("uri_decode") or ())
        tolerance = cfg.get("tolerance_s")
        self._tolerance = float(tolerance if tolerance is not None else DEFAULT_TOLERANCE_S)

    # -- header parsing ------------------------------------------------------------------------

    def _decode(self, text: str) -> bytes | None:
        try:
            raw = binascii.a2b_base64(text, strict_mode=True) if self._base64 else bytes.fromhex(text)
        except (binascii.Error, ValueError):
            return None
        low, high = self._sig_bounds
        return raw if low <= len(raw) <= high else None

    def _signatures(self, value: str) -> tuple[list[bytes], str | None]:
        """Decoded candidate signatures and the ``kv`` timestamp (if the format carries one)."""
        if len(value) > MAX_SIGNATURE_HEADER or not value.isascii():
            raise Rejected(SIGNATURE_MALFORMED)
        raw: list[str] = []
        timestamp: str | None = None
        if self._format == "plain":
            value = value.strip()
            if self._prefix:
                if not value.startswith(self._prefix):
                    raise Rejected(SIGNATURE_MALFORMED)
                value = value[len(self._prefix) :]
            raw.append(value)
        elif self._format == "kv":
            for item in value.split(self._kv_sep):
                key, sep, val = item.strip().partition("=")
                if not sep:
                    raise Rejected(SIGNATURE_MALFORMED)
                if key == self._kv_ts_key:
                    if timestamp is not None:
                        raise Rejected(SIGNATURE_MALFORMED)
                    timestamp = val
                elif key == self._sig_key:
                    raw.append(val)
        else:  # list: "v1,<sig> v1a,<sig>" (entries of other versions are skipped)
            for item in value.split():
                version, sep, val = item.partition(",")
                if not sep:
                    raise Rejected(SIGNATURE_MALFORMED)
                if version == self._sig_key:
                    raw.append(val)
        if not raw or len(raw) > self._max_signatures:
            raise Rejected(SIGNATURE_MALFORMED)
        decoded = [d for d in map(self._decode, raw) if d is not None]
        if not decoded:
            raise Rejected(SIGNATURE_MALFORMED)
        return decoded, timestamp

    def _check_timestamp(self, value: str | None, now: float) -> str:
        if value is None:
            raise Rejected(TIMESTAMP_MISSING)
        value = value.strip()
        if self._rfc3339:
            parsed = rfc3339_seconds(value)
            if parsed is None:
                raise Rejected(TIMESTAMP_MALFORMED)
            seconds = parsed
        else:
            if not _DIGITS.match(value):
                raise Rejected(TIMESTAMP_MALFORMED)
            seconds = int(value) / self._ts_divisor
        if now - seconds > self._tolerance:
            raise Rejected(TIMESTAMP_STALE)
        if seconds - now > self._tolerance:
            raise Rejected(TIMESTAMP_FUTURE)
        return value

    # -- verification ----------------------------------------------------------------------------

    def verify(self, headers: Headers, body: bytes, method: str, uri: Callable[[], str], now: float) -> str:
        header = single_header(headers, self._header)
        if header is None:
            raise Rejected(SIGNATURE_MISSING)
        signatures, kv_timestamp = self._signatures(header)
        timestamp = ""
        if self._has_timestamp:
            raw_ts = kv_timestamp if self._kv_ts_key else single_header(headers, str(self._ts_header))
            timestamp = self._check_timestamp(raw_ts, now)
        if self._body_only:
            message = body
        else:
            message = self._message(headers, body, method, uri, timestamp)
        if self._public:
            return self._verify_public(message, signatures)
        digest = self._digest
        for key, label in self._keys:
            expected = hmac.digest(key, message, digest)
            matched = False
            # Compare against every candidate (no early exit on the first mismatch).
            for candidate in signatures:
                matched |= hmac.compare_digest(expected, candidate)
            if matched:
                return label
        raise Rejected(SIGNATURE_MISMATCH)

    def _verify_public(self, message: bytes, signatures: list[bytes]) -> str:
        # Public-key checks reveal nothing secret: the first key and signature that verify win.
        for key, label in self._public:
            for candidate in signatures:
                try:
                    if self._kind == "ed25519":
                        key.verify(candidate, message)
                    else:
                        key.verify(candidate, message, self._ecdsa)
                except InvalidSignature:
                    continue
                return label
        raise Rejected(SIGNATURE_MISMATCH)

    def _message(
        self, headers: Headers, body: bytes, method: str, uri: Callable[[], str], timestamp: str
    ) -> bytes:
        values: dict[int, bytes] = {_BODY: body, _TIMESTAMP: timestamp.encode()}
        if _ID in self._uses:
            ident = single_header(headers, str(self._id_header))
            if ident is None:
                raise Rejected(ID_MISSING)
            if len(ident) > MAX_ID_LENGTH or not ident.isascii() or not ident.isprintable():
                raise Rejected(ID_MALFORMED)
            values[_ID] = ident.encode()
        if _METHOD in self._uses:
            values[_METHOD] = method.encode()
        if _URI in self._uses:
            try:
                values[_URI] = self._uri_decode(uri()).encode()
            except UnicodeEncodeError:  # undecodable bytes in Host: no sender signed this URL
                raise Rejected(SIGNATURE_MISMATCH) from None
        if _SORTED_FORM in self._uses:
            values[_SORTED_FORM] = sorted_form(body)
        return b"".join(p if isinstance(p, bytes) else values[p] for p in self._parts)


#: The verifier's first name (it began as HMAC only); the route table compiles routes through it.
HmacVerifier = SignatureVerifier
