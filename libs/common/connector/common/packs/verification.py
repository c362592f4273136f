"""Verification specs: presets as named configs, the checks applied when a manifest is applied, and
the loading of referenced secrets.

A route's ``VerificationSpec`` is *resolved* into one flat, generic config (``resolve``): preset
defaults first, every field the route sets on top. Nothing downstream knows a provider: the presets
below are ordinary configs, and the ingress verifier (``connector.ingress.verify``) interprets any
resolved config the same way. A scheme is HMAC over a shared secret, or a public-key signature
(``ed25519``, ``ecdsa``) checked with the sender's public key; keys of either kind are *references*.

This module stays pure (no I/O besides reading referenced secrets) so the materializer and the admin
API validate manifests with the same rules as the ingress.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_der_public_key,
    load_pem_public_key,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # as the manifest's other models


class SecretRef(_SpecModel):
    """A secret *reference*: the value is read from the environment or a file, never stored."""

    env: str | None = None
    file: str | None = None
    #: How the referenced value encodes the key: raw bytes of the text, base64, hex, a Standard
    #: Webhooks ``whsec_`` base64 key, or a Standard Webhooks ``whpk_`` base64 ed25519 public key.
    #: A public key (``ed25519``/``ecdsa`` schemes) may also be PEM text whatever the encoding.
    encoding: Literal["raw", "base64", "hex", "whsec", "whpk"] = "raw"

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env, file")
        return self

    @property
    def name(self) -> str:
        """Safe to log: the reference, not the value."""
        return f"env:{self.env}" if self.env else f"file:{self.file}"


class VerificationSpec(_SpecModel):
    """Signature verification of one route. ``preset`` fills defaults that explicit fields override;
    ``scheme: none`` must be explicit. The ingress service (connector.ingress.verify) interprets it."""

    preset: str | None = None
    #: ``hmac`` (shared secret), ``ed25519`` / ``ecdsa`` (the sender's public key), ``none``.
    scheme: Literal["hmac", "ed25519", "ecdsa", "none"] | None = None
    algorithm: Literal["sha256", "sha1"] | None = None
    encoding: Literal["hex", "base64"] | None = None
    signature_header: str | None = None
    signature_prefix: str | None = None
    #: ``plain`` (whole header, after prefix), ``kv`` (``t=..,v1=..``), ``list``
    #: (space-separated ``v1,<sig>`` entries, Standard Webhooks).
    signature_format: Literal["plain", "kv", "list"] | None = None
    kv_signature_key: str | None = None
    kv_timestamp_key: str | None = None
    #: Separator of the ``kv`` items (default ``,``; Paddle uses ``;``).
    kv_separator: str | None = None
    #: Template of the signed content: ``{body}`` or ``{sorted_form}`` (the form-encoded body's
    #: pairs sorted, each name then value), ``{timestamp}``, ``{id}``, ``{method}``, ``{uri}``.
    signed_content: str | None = None
    #: Percent-escapes (e.g. ``"%3A"``) decoded in ``{uri}`` before signing, as the sender does
    #: (HubSpot v3 signs its URI with twelve escapes decoded). Matched case-insensitively.
    uri_decode: tuple[str, ...] | None = None
    id_header: str | None = None
    timestamp_header: str | None = None
    #: Unix seconds, milliseconds, or an RFC 3339 date-time (signed as sent).
    timestamp_unit: Literal["s", "ms", "rfc3339"] | None = None
    #: Allowed clock difference in both directions, seconds.
    tolerance_s: int | None = Field(default=None, ge=1)
    secrets: tuple[SecretRef, ...] = ()


# Each preset is an ordinary generic config; explicit fields in a route override it.
# ``secret_encoding`` replaces the default ``raw`` encoding of the route's secret references
# (Standard Webhooks keys are ``whsec_``-prefixed base64, never raw text). Each scheme below was
# read from the sender's own documentation; tests/ingress/test_presets.py checks each one against
# the sender's SDK or published example (the doc URL is cited there).
PRESETS: dict[str, dict[str, Any]] = {
    # https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md
    "standard-webhooks": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "webhook-signature", "signature_format": "list", "kv_signature_key": "v1",
        "signed_content": "{id}.{timestamp}.{body}", "id_header": "webhook-id",
        "timestamp_header": "webhook-timestamp", "timestamp_unit": "s", "tolerance_s": 300,
        "secret_encoding": "whsec",
    },
    # Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...] over "<t>.<body>"
    "stripe": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "Stripe-Signature", "signature_format": "kv", "kv_signature_key": "v1",
        "kv_timestamp_key": "t", "signed_content": "{timestamp}.{body}", "timestamp_unit": "s",
        "tolerance_s": 300,
    },
    # X-Hub-Signature-256: sha256=<hex> over the body (no timestamp in the scheme).
    "github": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "X-Hub-Signature-256", "signature_prefix": "sha256=",
        "signature_format": "plain", "signed_content": "{body}",
    },
    # GitHub's legacy header, for senders that only send it: the one place SHA-1 is accepted.
    "github-sha1": {
        "scheme": "hmac", "algorithm": "sha1", "encoding": "hex",
        "signature_header": "X-Hub-Signature", "signature_prefix": "sha1=",
        "signature_format": "plain", "signed_content": "{body}",
    },
    # X-Slack-Signature: v0=<hex> over "v0:<ts>:<body>", X-Slack-Request-Timestamp in seconds.
    "slack": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "X-Slack-Signature", "signature_prefix": "v0=", "signature_format": "plain",
        "signed_content": "v0:{timestamp}:{body}", "timestamp_header": "X-Slack-Request-Timestamp",
        "timestamp_unit": "s", "tolerance_s": 300,
    },
    # X-Shopify-Hmac-Sha256: base64 over the body.
    "shopify": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "X-Shopify-Hmac-Sha256", "signature_format": "plain", "signed_content": "{body}",
    },
    # X-HubSpot-Signature-v3: base64 over method + full URI + body + timestamp (milliseconds); the
    # URI with these twelve escapes decoded (HubSpot's request-validation page).
    "hubspot-v3": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "X-HubSpot-Signature-v3", "signature_format": "plain",
        "signed_content": "{method}{uri}{body}{timestamp}", "timestamp_header": "X-HubSpot-Request-Timestamp",
        "timestamp_unit": "ms", "tolerance_s": 300,
        "uri_decode": ("%3A", "%2F", "%3F", "%40", "%21", "%24", "%27", "%28", "%29", "%2A", "%2C", "%3B"),
    },
    # Standard Webhooks' asymmetric scheme: `v1a,<base64 ed25519 signature>` entries in the same
    # list, over the same content, checked with the sender's `whpk_` public key.
    "standard-webhooks-v1a": {
        "scheme": "ed25519", "encoding": "base64",
        "signature_header": "webhook-signature", "signature_format": "list", "kv_signature_key": "v1a",
        "signed_content": "{id}.{timestamp}.{body}", "id_header": "webhook-id",
        "timestamp_header": "webhook-timestamp", "timestamp_unit": "s", "tolerance_s": 300,
        "secret_encoding": "whpk",
    },
    # Svix (and senders built on it: Clerk, Resend, ...): Standard Webhooks under svix-* headers.
    "svix": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "svix-signature", "signature_format": "list", "kv_signature_key": "v1",
        "signed_content": "{id}.{timestamp}.{body}", "id_header": "svix-id",
        "timestamp_header": "svix-timestamp", "timestamp_unit": "s", "tolerance_s": 300,
        "secret_encoding": "whsec",
    },
    # X-Twilio-Signature: base64 HMAC-SHA1 (auth token) over the URL + every form pair sorted,
    # name then value (form-encoded deliveries; the JSON `bodySHA256` variant does not fit).
    "twilio": {
        "scheme": "hmac", "algorithm": "sha1", "encoding": "base64",
        "signature_header": "X-Twilio-Signature", "signature_format": "plain",
        "signed_content": "{uri}{sorted_form}",
    },
    # x-square-hmacsha256-signature: base64 over the notification URL + body.
    "square": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "x-square-hmacsha256-signature", "signature_format": "plain",
        "signed_content": "{uri}{body}",
    },
    # SendGrid's signed Event Webhook: base64 DER ECDSA (P-256, SHA-256) over timestamp + body,
    # checked with the base64 DER public key from the SendGrid settings.
    "sendgrid": {
        "scheme": "ecdsa", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "X-Twilio-Email-Event-Webhook-Signature", "signature_format": "plain",
        "signed_content": "{timestamp}{body}", "timestamp_header": "X-Twilio-Email-Event-Webhook-Timestamp",
        "timestamp_unit": "s", "tolerance_s": 300, "secret_encoding": "base64",
    },
    # Paddle Billing: Paddle-Signature: ts=<unix>;h1=<hex>[;h1=...] over "<ts>:<body>"; Paddle's
    # SDKs allow five seconds of drift.
    "paddle": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "Paddle-Signature", "signature_format": "kv", "kv_separator": ";",
        "kv_signature_key": "h1", "kv_timestamp_key": "ts", "signed_content": "{timestamp}:{body}",
        "timestamp_unit": "s", "tolerance_s": 5,
    },
    # x-zm-signature: v0=<hex> over "v0:<ts>:<body>", x-zm-request-timestamp in seconds.
    "zoom": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "x-zm-signature", "signature_prefix": "v0=", "signature_format": "plain",
        "signed_content": "v0:{timestamp}:{body}", "timestamp_header": "x-zm-request-timestamp",
        "timestamp_unit": "s", "tolerance_s": 300,
    },
    # Twitch EventSub: sha256=<hex> over message id + RFC 3339 timestamp + body; ten minutes.
    "twitch": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "Twitch-Eventsub-Message-Signature", "signature_prefix": "sha256=",
        "signature_format": "plain", "signed_content": "{id}{timestamp}{body}",
        "id_header": "Twitch-Eventsub-Message-Id", "timestamp_header": "Twitch-Eventsub-Message-Timestamp",
        "timestamp_unit": "rfc3339", "tolerance_s": 600,
    },
    # Discord (interactions and webhook events): hex ed25519 over timestamp + body, hex public key.
    "discord": {
        "scheme": "ed25519", "encoding": "hex",
        "signature_header": "X-Signature-Ed25519", "signature_format": "plain",
        "signed_content": "{timestamp}{body}", "timestamp_header": "X-Signature-Timestamp",
        "timestamp_unit": "s", "tolerance_s": 300, "secret_encoding": "hex",
    },
    # Typeform-Signature: sha256=<base64> over the body.
    "typeform": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "Typeform-Signature", "signature_prefix": "sha256=",
        "signature_format": "plain", "signed_content": "{body}",
    },
    # Calendly-Webhook-Signature: t=<unix>,v1=<hex> over "<t>.<body>"; Calendly suggests 3 minutes.
    "calendly": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "Calendly-Webhook-Signature", "signature_format": "kv", "kv_signature_key": "v1",
        "kv_timestamp_key": "t", "signed_content": "{timestamp}.{body}", "timestamp_unit": "s",
        "tolerance_s": 180,
    },
    # Linear-Signature: <hex> over the body (its timestamp is inside the body, not signed apart).
    "linear": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "Linear-Signature", "signature_format": "plain", "signed_content": "{body}",
    },
    # PagerDuty v3: X-PagerDuty-Signature: v1=<hex>[,v1=<hex>] over the body.
    "pagerduty": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "X-PagerDuty-Signature", "signature_format": "kv", "kv_signature_key": "v1",
        "signed_content": "{body}",
    },
    # Intercom: X-Hub-Signature: sha1=<hex> over the body (client secret).
    "intercom": {
        "scheme": "hmac", "algorithm": "sha1", "encoding": "hex",
        "signature_header": "X-Hub-Signature", "signature_prefix": "sha1=",
        "signature_format": "plain", "signed_content": "{body}",
    },
    # Bitbucket (Cloud and Data Center): X-Hub-Signature: sha256=<hex> over the body.
    "bitbucket": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "X-Hub-Signature", "signature_prefix": "sha256=",
        "signature_format": "plain", "signed_content": "{body}",
    },
    # X-Razorpay-Signature: <hex> over the body (webhook secret).
    "razorpay": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "X-Razorpay-Signature", "signature_format": "plain", "signed_content": "{body}",
    },
}  # fmt: skip

#: Schemes whose keys are the sender's public keys (the other signing scheme is ``hmac``).
PUBLIC_KEY_SCHEMES = ("ed25519", "ecdsa")
#: The placeholders that carry the body; a template has exactly one of them.
BODY_PLACEHOLDERS = ("{body}", "{sorted_form}")
PLACEHOLDERS = ("{body}", "{sorted_form}", "{timestamp}", "{id}", "{method}", "{uri}")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
# RFC 9110 token characters: a header name we can look up (no spaces, colons or controls).
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_ESCAPE_RE = re.compile(r"^%[0-9A-Fa-f]{2}$")
_KV_SEPARATORS = (",", ";", " ")
#: Default tolerance for schemes that sign a timestamp but do not say how much skew to accept.
DEFAULT_TOLERANCE_S = 300


def resolve(spec: VerificationSpec) -> dict[str, Any]:
    """The effective config: preset defaults overridden by every field the route sets.

    ``secrets`` is a list of dicts (``env``/``file``/``encoding``); a reference whose ``encoding`` is
    ``raw`` (the default) takes the preset's ``secret_encoding`` when the preset has one. Under a
    public-key scheme each dict also names the ``key_type`` (``ed25519``/``ecdsa``) so that
    ``load_secret`` refuses a key of the wrong kind when the route loads, not per delivery.
    """
    preset: dict[str, Any] = dict(PRESETS.get(spec.preset or "", {}))
    secret_encoding = preset.pop("secret_encoding", "raw")
    base = preset
    for key, value in spec.model_dump(exclude={"preset", "secrets"}, exclude_none=True).items():
        base[key] = value
    scheme = base.get("scheme")
    key_type = scheme if scheme in PUBLIC_KEY_SCHEMES else None
    base["secrets"] = [_secret_dict(ref, secret_encoding, key_type) for ref in spec.secrets]
    return base


def _secret_dict(ref: SecretRef, preset_encoding: str, key_type: str | None) -> dict[str, Any]:
    # Stored route configs carry every default (``encoding: raw``), so "not set" cannot be told from
    # "raw": under a preset whose keys are never raw text (Standard Webhooks), raw means the preset's.
    out = ref.model_dump()
    if out.get("encoding", "raw") == "raw":
        out["encoding"] = preset_encoding
    if key_type is not None:
        out["key_type"] = key_type
    return out


def check_spec(spec: VerificationSpec) -> list[str]:
    """Every problem with a route's verification spec (empty when usable)."""
    errors: list[str] = []
    if spec.preset is not None and spec.preset not in PRESETS:
        errors.append(f"unknown preset {spec.preset!r}; known: {sorted(PRESETS)}")
        return errors
    cfg = resolve(spec)
    scheme = cfg.get("scheme")
    if scheme is None:
        errors.append("set a preset or a scheme (`scheme: none` must be explicit)")
        return errors
    if scheme == "none":
        if spec.secrets:
            errors.append("scheme none takes no secrets")
        return errors
    required = ["encoding", "signature_header", "signed_content"]
    if scheme != "ed25519":
        required.insert(0, "algorithm")
    for field in required:
        if not cfg.get(field):
            errors.append(f"{field} is required for scheme {scheme}")
    if scheme == "ed25519" and cfg.get("algorithm"):
        errors.append("scheme ed25519 takes no algorithm (ed25519 hashes with SHA-512 itself)")
    if scheme == "ecdsa" and cfg.get("algorithm") not in (None, "sha256"):
        errors.append("scheme ecdsa takes algorithm sha256")
    if not spec.secrets:
        errors.append("at least one secret reference is required")
    for ref in spec.secrets:
        if scheme in PUBLIC_KEY_SCHEMES and ref.encoding == "whsec":
            errors.append(f"{ref.name}: a whsec_ secret is not a public key (scheme {scheme})")
        if scheme == "hmac" and ref.encoding == "whpk":
            errors.append(f"{ref.name}: a whpk_ public key cannot verify an HMAC (scheme hmac)")
    for field in ("signature_header", "timestamp_header", "id_header"):
        value = cfg.get(field)
        if value is not None and not _TOKEN_RE.match(value):
            errors.append(f"{field} {value!r} is not a valid header name")
    content = cfg.get("signed_content") or ""
    unknown = sorted({m for m in _PLACEHOLDER_RE.findall(content)} - {p[1:-1] for p in PLACEHOLDERS})
    if unknown:
        errors.append(f"signed_content has unknown placeholders {unknown}; known: {list(PLACEHOLDERS)}")
    if sum(content.count(p) for p in BODY_PLACEHOLDERS) != 1:
        errors.append("signed_content must include {body} or {sorted_form}, exactly once")
    uri_decode = cfg.get("uri_decode")
    if uri_decode:
        bad = [e for e in uri_decode if not _ESCAPE_RE.match(str(e))]
        if bad:
            errors.append(f"uri_decode entries must be percent-escapes like '%3A', got {bad}")
        if "{uri}" not in content:
            errors.append("uri_decode is set but signed_content has no {uri}")
    fmt = cfg.get("signature_format") or "plain"
    if "{timestamp}" in content and not (
        cfg.get("timestamp_header") or (fmt == "kv" and cfg.get("kv_timestamp_key"))
    ):
        errors.append("signed_content uses {timestamp} but no timestamp_header or kv_timestamp_key is set")
    if "{id}" in content and not cfg.get("id_header"):
        errors.append("signed_content uses {id} but no id_header is set")
    if fmt in ("kv", "list") and not cfg.get("kv_signature_key"):
        errors.append(f"signature_format {fmt} needs kv_signature_key")
    separator = cfg.get("kv_separator")
    if separator is not None:
        if fmt != "kv":
            errors.append("kv_separator is set but signature_format is not kv")
        if separator not in _KV_SEPARATORS:
            errors.append(f"kv_separator must be one of {list(_KV_SEPARATORS)}, got {separator!r}")
    if cfg.get("tolerance_s") is not None and not (
        cfg.get("timestamp_header") or (fmt == "kv" and cfg.get("kv_timestamp_key"))
    ):
        errors.append("tolerance_s is set but the scheme carries no timestamp")
    # SHA-1 only where a preset itself needs it (a route cannot downgrade another preset to SHA-1).
    preset_algorithm = PRESETS.get(spec.preset or "", {}).get("algorithm")
    if cfg.get("algorithm") == "sha1" and preset_algorithm != "sha1":
        errors.append("sha1 is accepted only through a preset that needs it")
    return errors


# --------------------------------------------------------------------------------------------------
# Secrets: resolved from references at route load; the value never leaves the process.
# --------------------------------------------------------------------------------------------------


class SecretUnavailable(Exception):
    """A referenced secret could not be read or decoded. The message names the reference only."""


@dataclass(frozen=True, slots=True, repr=False)
class SecretKey:
    """A loaded key. ``repr`` shows the reference name, never the key."""

    name: str
    key: bytes

    def __repr__(self) -> str:
        return f"SecretKey({self.name})"


def load_secret(ref: dict[str, Any] | SecretRef, *, encoding: str | None = None) -> SecretKey:
    """Read and decode one secret reference (``env`` or ``file``).

    Encodings: ``raw`` (the UTF-8 bytes of the text; a file's trailing newline is dropped),
    ``base64``, ``hex``, ``whsec`` (Standard Webhooks: optional ``whsec_`` prefix, then base64),
    ``whpk`` (Standard Webhooks public key: optional ``whpk_`` prefix, then base64).

    A reference with a ``key_type`` (``ed25519``/``ecdsa``, set by ``resolve`` under a public-key
    scheme) must hold a public key of that kind: PEM text (whatever the encoding), or the decoded
    bytes as a DER SubjectPublicKeyInfo or, for ed25519, the 32 raw bytes. The key is returned in a
    canonical form: 32 raw bytes (ed25519), DER SubjectPublicKeyInfo (ecdsa).
    """
    data = ref.model_dump() if isinstance(ref, SecretRef) else dict(ref)
    env, file = data.get("env"), data.get("file")
    enc = encoding or data.get("encoding") or "raw"
    name = f"env:{env}" if env else f"file:{file}"
    if env:
        text = os.environ.get(env)
        if text is None:
            raise SecretUnavailable(f"{name} is not set")
        raw = text.encode()
    elif file:
        try:
            raw = Path(file).read_bytes()
        except OSError as exc:
            raise SecretUnavailable(f"{name} cannot be read ({type(exc).__name__})") from None
        if raw.endswith(b"\r\n"):
            raw = raw[:-2]
        elif raw.endswith(b"\n"):
            raw = raw[:-1]
    else:
        raise SecretUnavailable("a secret reference needs env or file")
    key_type = data.get("key_type")
    if key_type is not None and raw.lstrip().startswith(b"-----BEGIN"):
        return SecretKey(name=name, key=_public_key_bytes(name, key_type, pem=raw))
    if enc != "raw":
        text_value = raw.decode("ascii", "replace").strip()
        try:
            if enc == "hex":
                raw = bytes.fromhex(text_value)
            else:
                if enc in ("whsec", "whpk"):
                    text_value = text_value.removeprefix(f"{enc}_")
                # Standard Webhooks keys are often unpadded; extra padding is ignored by the decoder.
                raw = base64.b64decode(text_value + "==")
        except (binascii.Error, ValueError):
            raise SecretUnavailable(f"{name} is not valid {enc}") from None
    if not raw:
        raise SecretUnavailable(f"{name} is empty")
    if key_type is not None:
        raw = _public_key_bytes(name, key_type, der=raw)
    return SecretKey(name=name, key=raw)


def _public_key_bytes(name: str, key_type: str, *, pem: bytes = b"", der: bytes = b"") -> bytes:
    """A public key of ``key_type`` in canonical form, or ``SecretUnavailable`` naming the reference."""
    if key_type == "ed25519" and len(der) == 32:
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(der)
        except ValueError:
            raise SecretUnavailable(f"{name} is not an ed25519 public key") from None
        return der
    try:
        key = load_pem_public_key(pem) if pem else load_der_public_key(der)
    except (ValueError, TypeError):
        raise SecretUnavailable(f"{name} is not a public key") from None
    if key_type == "ed25519" and isinstance(key, ed25519.Ed25519PublicKey):
        return key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    if key_type == "ecdsa" and isinstance(key, ec.EllipticCurvePublicKey):
        return key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    raise SecretUnavailable(f"{name} is not an {key_type} public key")
