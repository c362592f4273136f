"""Verification specs: presets as named configs, and the checks applied when a manifest is applied.

The ingress service's verifier (connector.ingress.verify) interprets a resolved spec; this module
stays pure (no I/O besides reading referenced secrets) so the materializer and admin API can
validate manifests with the same rules.
"""

from __future__ import annotations

from typing import Any

from connector.common.packs import VerificationSpec

# Each preset is an ordinary generic config; explicit fields in a route override it.
PRESETS: dict[str, dict[str, Any]] = {
    "standard-webhooks": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "webhook-signature", "signature_format": "list", "kv_signature_key": "v1",
        "signed_content": "{id}.{timestamp}.{body}", "id_header": "webhook-id",
        "timestamp_header": "webhook-timestamp", "timestamp_unit": "s", "tolerance_s": 300,
    },
    "stripe": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "Stripe-Signature", "signature_format": "kv", "kv_signature_key": "v1",
        "kv_timestamp_key": "t", "signed_content": "{timestamp}.{body}", "timestamp_unit": "s",
        "tolerance_s": 300,
    },
    "github": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "X-Hub-Signature-256", "signature_prefix": "sha256=",
        "signature_format": "plain", "signed_content": "{body}",
    },
    "slack": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "hex",
        "signature_header": "X-Slack-Signature", "signature_prefix": "v0=", "signature_format": "plain",
        "signed_content": "v0:{timestamp}:{body}", "timestamp_header": "X-Slack-Request-Timestamp",
        "timestamp_unit": "s", "tolerance_s": 300,
    },
    "shopify": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "X-Shopify-Hmac-Sha256", "signature_format": "plain", "signed_content": "{body}",
    },
    "hubspot-v3": {
        "scheme": "hmac", "algorithm": "sha256", "encoding": "base64",
        "signature_header": "X-HubSpot-Signature-v3", "signature_format": "plain",
        "signed_content": "{method}{uri}{body}{timestamp}", "timestamp_header": "X-HubSpot-Request-Timestamp",
        "timestamp_unit": "ms", "tolerance_s": 300,
    },
}  # fmt: skip

PLACEHOLDERS = ("{body}", "{timestamp}", "{id}", "{method}", "{uri}")


def resolve(spec: VerificationSpec) -> dict[str, Any]:
    """The effective config: preset defaults overridden by every field the route sets."""
    base: dict[str, Any] = dict(PRESETS.get(spec.preset or "", {}))
    for key, value in spec.model_dump(exclude={"preset"}, exclude_none=True).items():
        if key == "secrets" and not value:
            continue
        base[key] = value
    base.setdefault("secrets", [s.model_dump() for s in spec.secrets])
    return base


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
        return errors
    for required in ("algorithm", "encoding", "signature_header", "signed_content"):
        if not cfg.get(required):
            errors.append(f"{required} is required for scheme hmac")
    if not spec.secrets:
        errors.append("at least one secret reference is required")
    content = cfg.get("signed_content") or ""
    if "{body}" not in content:
        errors.append("signed_content must include {body}")
    if "{timestamp}" in content and not (cfg.get("timestamp_header") or cfg.get("kv_timestamp_key")):
        errors.append("signed_content uses {timestamp} but no timestamp_header or kv_timestamp_key is set")
    if "{id}" in content and not cfg.get("id_header"):
        errors.append("signed_content uses {id} but no id_header is set")
    if cfg.get("algorithm") == "sha1" and spec.preset is None:
        errors.append("sha1 is accepted only through a preset that needs it")
    return errors
