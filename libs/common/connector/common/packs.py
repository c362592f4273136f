"""Pack manifests: the declarative description of routes, extraction, fan-out and policies.

A manifest (YAML or JSON; see docs/packs.md) is validated in full — every error is listed, nothing
is installed when any is found. ``store`` functions install it as a new generation with versioned
routes, and activation is a separate, atomic step. Nothing here branches on a provider: presets are
just named verification configs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,62}$"
EXTRACTABLE = (
    "event_kind",
    "delivery_id",
    "source_object_kind",
    "source_object_id",
    "target_lane_key",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ValueSpec(_Model):
    """Where a value comes from: exactly one of a JSON pointer into the body, a request header, a
    constant, or a template over other values (``{event_kind}``, ``{/json/pointer}``,
    ``{header:X-Name}``)."""

    pointer: str | None = None
    header: str | None = None
    const: str | None = None
    template: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ValueSpec:
        given = [k for k in ("pointer", "header", "const", "template") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of pointer, header, const, template")
        if self.pointer is not None and self.pointer and not self.pointer.startswith("/"):
            raise ValueError("a JSON pointer starts with '/'")
        return self


class SecretRef(_Model):
    """A secret *reference*: the value is read from the environment or a file, never stored."""

    env: str | None = None
    file: str | None = None
    #: How the referenced value encodes the key: raw bytes of the text, base64, or a Standard
    #: Webhooks ``whsec_`` base64 key.
    encoding: Literal["raw", "base64", "whsec"] = "raw"

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env, file")
        return self

    @property
    def name(self) -> str:
        """Safe to log: the reference, not the value."""
        return f"env:{self.env}" if self.env else f"file:{self.file}"


class VerificationSpec(_Model):
    """Signature verification of one route. ``preset`` fills defaults that explicit fields override;
    ``scheme: none`` must be explicit. The ingress service (connector.ingress.verify) interprets it."""

    preset: str | None = None
    scheme: Literal["hmac", "none"] | None = None
    algorithm: Literal["sha256", "sha1"] | None = None
    encoding: Literal["hex", "base64"] | None = None
    signature_header: str | None = None
    signature_prefix: str | None = None
    #: ``plain`` (whole header, after prefix), ``kv`` (``t=..,v1=..``), ``list``
    #: (space-separated ``v1,<sig>`` entries, Standard Webhooks).
    signature_format: Literal["plain", "kv", "list"] | None = None
    kv_signature_key: str | None = None
    kv_timestamp_key: str | None = None
    #: Template of the signed content: ``{body}``, ``{timestamp}``, ``{id}``, ``{method}``, ``{uri}``.
    signed_content: str | None = None
    id_header: str | None = None
    timestamp_header: str | None = None
    timestamp_unit: Literal["s", "ms"] | None = None
    #: Allowed clock difference in both directions, seconds.
    tolerance_s: int | None = Field(default=None, ge=1)
    secrets: tuple[SecretRef, ...] = ()


class RetryPolicy(_Model):
    max_attempts: int = Field(default=10, ge=1, le=1000)
    backoff_base_s: float = Field(default=1.0, gt=0)
    backoff_cap_s: float = Field(default=300.0, gt=0)
    #: Fraction of the delay drawn at random (0 = none, 1 = full jitter).
    jitter: float = Field(default=0.2, ge=0, le=1)


class LanePolicy(_Model):
    #: Source lane: members run one at a time in delivery order.
    source_fifo: bool = False
    #: Source lane key template (default: ``{work_type}:{source_object_kind}:{source_object_id}``).
    source_lane_key: str | None = None
    #: Target mutation lane: at most one in-flight member per target key (``extract.target_lane_key``).
    target_serialization: bool = False
    #: What a dead lane head does: hold its lanes (``block``) or let the next member run.
    dead_head: Literal["block", "continue"] = "block"


class HandlerSpec(_Model):
    kind: Literal["python", "grpc", "http"]
    #: python: ``module:function``; grpc: ``host:port``; http: URL.
    target: str
    timeout_s: float = Field(default=30.0, gt=0)


class WorkTypeSpec(_Model):
    handler: HandlerSpec
    queue_class: str = Field(default="default", pattern=NAME_PATTERN)
    #: Higher runs earlier among due items of its queue class (bounded head start, see docs/adr).
    priority: int = Field(default=0, ge=-100, le=100)
    retry: RetryPolicy = RetryPolicy()
    lanes: LanePolicy = LanePolicy()


class FanOut(_Model):
    work_type: str
    #: Per-route overrides of the work type's lane policy.
    lanes: LanePolicy | None = None


class ResponseSpec(_Model):
    success_status: int = Field(default=200, ge=200, le=299)
    failure_status: int = Field(default=503, ge=400, le=599)


class RouteSpec(_Model):
    key: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    method: Literal["POST", "PUT"] = "POST"
    verification: VerificationSpec
    #: Body expectation: ``json`` rejects invalid JSON at ingress (400); ``any`` stores bytes as-is.
    content: Literal["json", "any"] = "json"
    #: Provider delivery id (idempotency); absent → hash of namespace + route + body.
    idempotency_header: str | None = None
    extract: dict[str, ValueSpec] = {}
    #: Fields that must be present (fail closed: the receipt ends ``failed`` with the reason).
    required: tuple[str, ...] = ()
    #: Safe correlation ids to keep (never payload fields that may carry personal data by default).
    correlation: dict[str, ValueSpec] = {}
    fan_out: tuple[FanOut, ...] = Field(min_length=1)
    response: ResponseSpec = ResponseSpec()

    @field_validator("extract")
    @classmethod
    def _known_fields(cls, v: dict[str, ValueSpec]) -> dict[str, ValueSpec]:
        unknown = sorted(set(v) - set(EXTRACTABLE))
        if unknown:
            raise ValueError(f"unknown extract fields {unknown}; known: {list(EXTRACTABLE)}")
        return v


class Manifest(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    namespace: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    work_types: dict[str, WorkTypeSpec] = Field(min_length=1)
    routes: tuple[RouteSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Manifest:
        problems: list[str] = []
        seen: set[str] = set()
        for route in self.routes:
            if route.key in seen:
                problems.append(f"routes.{route.key}: duplicate route key")
            seen.add(route.key)
            work_types = [f.work_type for f in route.fan_out]
            if len(set(work_types)) != len(work_types):
                problems.append(f"routes.{route.key}.fan_out: a work type appears twice")
            for fan in route.fan_out:
                spec = self.work_types.get(fan.work_type)
                if spec is None:
                    problems.append(f"routes.{route.key}.fan_out: unknown work type {fan.work_type!r}")
                    continue
                lanes = fan.lanes or spec.lanes
                if lanes.target_serialization and "target_lane_key" not in route.extract:
                    problems.append(
                        f"routes.{route.key}.fan_out.{fan.work_type}: target_serialization needs "
                        "extract.target_lane_key"
                    )
            for req in route.required:
                if req not in route.extract:
                    problems.append(f"routes.{route.key}.required: {req!r} is not extracted")
        for name in self.work_types:
            if not _valid_name(name):
                problems.append(f"work_types.{name}: invalid name (lowercase, digits, _.-)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def route(self, key: str) -> RouteSpec | None:
        for r in self.routes:
            if r.key == key:
                return r
        return None


def _valid_name(name: str) -> bool:
    import re

    return re.match(NAME_PATTERN, name) is not None


class ManifestError(ValueError):
    """An invalid manifest; ``errors`` lists every problem as ``path: message``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid pack manifest:\n" + "\n".join(f"  - {e}" for e in errors))
        self.errors = errors


def parse_manifest(text: str | bytes | Mapping[str, Any]) -> Manifest:
    """Parse and validate a manifest document (YAML or JSON), listing every error."""
    if isinstance(text, Mapping):
        data: Any = dict(text)
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ManifestError([f"not valid YAML/JSON: {exc}"]) from None
    if not isinstance(data, dict):
        raise ManifestError(["the document must be a mapping with name, namespace, work_types, routes"])
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        errors: list[str] = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(manifest)"
            msg = err["msg"].removeprefix("Value error, ")
            errors.extend(f"{loc}: {part}" for part in msg.split("; "))
        raise ManifestError(errors) from None
    # Verification specs are interpreted by the ingress verifier; check them now so a bad preset or
    # an impossible combination is refused at apply time, not at the first delivery.
    from connector.common import verification

    errors = []
    for route in manifest.routes:
        errors.extend(
            f"routes.{route.key}.verification: {e}" for e in verification.check_spec(route.verification)
        )
    if errors:
        raise ManifestError(errors)
    return manifest


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()
