"""Verification specs: presets as named configs, the checks applied when a manifest is applied, and
the loading of referenced secrets.

A route's ``VerificationSpec`` is *resolved* into one flat, generic HMAC config (``resolve``): preset
defaults first, every field the route sets on top. Nothing downstream knows a provider: the presets
below are ordinary configs, and the ingress verifier (``connector.ingress.verify``) interprets any
resolved config the same way.

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
from typing import Any

from connector.common.packs import SecretRef, VerificationSpec

# Each preset is an ordinary generic config; explicit fields in a route override it.
# ``secret_encoding`` replaces the default ``raw`` encoding of the route's secret references
# (Standard Webhooks keys are ``whsec_``-prefixed base64, never raw text).
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
}  # fmt: skip

PLACEHOLDERS = ("{body}", "{timestamp}", "{id}", "{method}", "{uri}")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
# RFC 9110 token characters: a header name we can look up (no spaces, colons or controls).
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_ESCAPE_RE = re.compile(r"^%[0-9A-Fa-f]{2}$")
#: Default tolerance for schemes that sign a timestamp but do not say how much skew to accept.
DEFAULT_TOLERANCE_S = 300


def resolve(spec: VerificationSpec) -> dict[str, Any]:
    """The effective config: preset defaults overridden by every field the route sets.

    ``secrets`` is a list of dicts (``env``/``file``/``encoding``); a reference whose ``encoding`` is
    ``raw`` (the default) takes the preset's ``secret_encoding`` when the preset has one.
    """
    preset: dict[str, Any] = dict(PRESETS.get(spec.preset or "", {}))
    secret_encoding = preset.pop("secret_encoding", "raw")
    base = preset
    for key, value in spec.model_dump(exclude={"preset", "secrets"}, exclude_none=True).items():
        base[key] = value
    base["secrets"] = [_secret_dict(ref, secret_encoding) for ref in spec.secrets]
    return base


def _secret_dict(ref: SecretRef, preset_encoding: str) -> dict[str, Any]:
    # Stored route configs carry every default (``encoding: raw``), so "not set" cannot be told from
    # "raw": under a preset whose keys are never raw text (Standard Webhooks), raw means the preset's.
    out = ref.model_dump()
    if out.get("encoding", "raw") == "raw":
        out["encoding"] = preset_encoding
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
    for required in ("algorithm", "encoding", "signature_header", "signed_content"):
        if not cfg.get(required):
            errors.append(f"{required} is required for scheme hmac")
    if not spec.secrets:
        errors.append("at least one secret reference is required")
    for field in ("signature_header", "timestamp_header", "id_header"):
        value = cfg.get(field)
        if value is not None and not _TOKEN_RE.match(value):
            errors.append(f"{field} {value!r} is not a valid header name")
    content = cfg.get("signed_content") or ""
    unknown = sorted({m for m in _PLACEHOLDER_RE.findall(content)} - {p[1:-1] for p in PLACEHOLDERS})
    if unknown:
        errors.append(f"signed_content has unknown placeholders {unknown}; known: {list(PLACEHOLDERS)}")
    if content.count("{body}") != 1:
        errors.append("signed_content must include {body} exactly once")
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
    ``base64``, ``whsec`` (Standard Webhooks: optional ``whsec_`` prefix, then base64).
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
    if enc != "raw":
        text_value = raw.decode("ascii", "replace").strip()
        if enc == "whsec":
            text_value = text_value.removeprefix("whsec_")
        try:
            # Standard Webhooks keys are often unpadded; extra padding is ignored by the decoder.
            raw = base64.b64decode(text_value + "==")
        except (binascii.Error, ValueError):
            raise SecretUnavailable(f"{name} is not valid {enc}") from None
    if not raw:
        raise SecretUnavailable(f"{name} is empty")
    return SecretKey(name=name, key=raw)
