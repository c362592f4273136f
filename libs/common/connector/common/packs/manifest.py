"""Pack manifests: the declarative description of routes, extraction, fan-out and policies.

A manifest (YAML or JSON; see docs/packs.md) is validated in full: ``parse_manifest`` reports field
errors, cross-reference errors and verification errors *together*, every one as ``path: message``,
and nothing is installed when any is found (``connector.common.packs.install`` installs it as a new
generation with versioned routes; activation is a separate, atomic step). Nothing here branches on a
provider: presets are just named verification configs.

Where extracted values come from (docs/packs.md, "Extraction"):

* ``pointer`` / ``const`` / ``template`` over the body are evaluated by the materializer against the
  *active* route when the receipt is routed;
* ``header`` values (and ``{header:Name}`` in templates) exist only while the ingress handles the
  request. The ingress keeps exactly three such facts on the receipt: the event kind, the provider
  delivery id and the correlation ids. Header specs are therefore accepted for ``extract.event_kind``,
  ``extract.delivery_id`` and ``correlation.*`` only, and the materializer reads those values from the
  receipt; anything it routes on (object kind/id, target lane key, lane keys) must come from the body.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from connector.common.packs import verification

# A route's verification spec is the verifier's own model (verification.py); re-exported here with
# the other manifest models.
from connector.common.packs.verification import SecretRef as SecretRef
from connector.common.packs.verification import VerificationSpec as VerificationSpec

NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,62}$"
EXTRACTABLE = (
    "event_kind",
    "delivery_id",
    "source_object_kind",
    "source_object_id",
    "target_lane_key",
    "run_after",
)
#: Extracted fields whose value may come from a request header: the ingress stores these on the
#: receipt (``event_kind``, ``provider_delivery_id``); correlation ids are stored too.
HEADER_FIELDS = ("event_kind", "delivery_id")
#: Default source lane key template (``LanePolicy.source_lane_key``).
DEFAULT_SOURCE_LANE_KEY = "{work_type}:{source_object_kind}:{source_object_id}"
CORRELATION_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$"

_NAME_RE = re.compile(NAME_PATTERN)
_CORRELATION_RE = re.compile(CORRELATION_NAME_PATTERN)
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ValueSpec(_Model):
    """Where a value comes from: exactly one of a JSON pointer into the body (RFC 6901), a request
    header, a constant, or a template over other values (``{event_kind}`` — another extracted
    field —, ``{/json/pointer}``, ``{header:X-Name}``; ``{{`` and ``}}`` are literal braces)."""

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
        if self.template is not None:
            problems = template_syntax_errors(self.template)
            if problems:
                raise ValueError("\n".join(problems))
        return self

    def uses_header(self) -> bool:
        if self.header is not None:
            return True
        return self.template is not None and any(
            ref.startswith("header:") for ref in template_references(self.template)
        )


class RetryPolicy(_Model):
    max_attempts: int = Field(default=10, ge=1, le=1000)
    backoff_base_s: float = Field(default=1.0, gt=0)
    backoff_cap_s: float = Field(default=300.0, gt=0)
    #: Fraction of the delay drawn at random (0 = none, 1 = full jitter).
    jitter: float = Field(default=0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _cap(self) -> RetryPolicy:
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError("backoff_cap_s must be >= backoff_base_s")
        return self


class LanePolicy(_Model):
    #: Source lane: members run one at a time in delivery order.
    source_fifo: bool = False
    #: Source lane key template (default: ``{work_type}:{source_object_kind}:{source_object_id}``).
    source_lane_key: str | None = None
    #: Target mutation lane: at most one in-flight member per target key (``extract.target_lane_key``).
    target_serialization: bool = False
    #: What a dead lane head does: hold its lanes (``block``) or let the next member run.
    dead_head: Literal["block", "continue"] = "block"

    @field_validator("source_lane_key")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            problems = template_syntax_errors(v)
            if problems:
                raise ValueError("\n".join(problems))
        return v


#: The longest delay, and the furthest run-after horizon, a pack may declare (366 days).
MAX_DELAY_S = 366 * 86400


class DelayPolicy(_Model):
    """When a work type's items may run (docs/packs.md, "Delays and schedules"). The clock starts
    when the receipt was accepted (the database's ``accepted_at``), also for a backfill or cutover.

    * ``fixed_s``: every item waits this long after its delivery was accepted.
    * ``run_after_field``: each delivery's own instant, the route's ``extract.run_after`` (RFC 3339
      or Unix seconds), bounded by ``max_s`` after acceptance: a later instant is clamped to that
      bound, a past one runs now, and a missing or unreadable one falls back to ``fixed_s``."""

    fixed_s: float = Field(default=0.0, ge=0, le=MAX_DELAY_S)
    run_after_field: bool = False
    #: The furthest a ``run_after`` may be from acceptance; required with ``run_after_field``.
    max_s: float | None = Field(default=None, gt=0, le=MAX_DELAY_S)

    @model_validator(mode="after")
    def _bounded(self) -> DelayPolicy:
        if self.run_after_field and self.max_s is None:
            raise ValueError("run_after_field needs max_s (the furthest run_after accepted)")
        if self.max_s is not None and not self.run_after_field:
            raise ValueError("max_s bounds run_after_field; set run_after_field: true or drop max_s")
        if self.max_s is not None and self.fixed_s > self.max_s:
            raise ValueError("fixed_s must not exceed max_s")
        return self


#: Default rate-limit key template (``RateLimit.key``): one budget for the whole work type.
DEFAULT_RATE_KEY = "{work_type}"


class _KeyedPolicy(_Model):
    """A flow policy applied per key (rate limit, concurrency, debounce): ``key`` is a template over
    extracted fields and ``{work_type}``, checked here; a constant key is the whole work type."""

    key: str = DEFAULT_RATE_KEY

    @field_validator("key")
    @classmethod
    def _template(cls, v: str) -> str:
        problems = template_syntax_errors(v)
        if problems:
            raise ValueError("\n".join(problems))
        return v


class RateLimit(_KeyedPolicy):
    """At most ``limit`` claims per ``period_s`` seconds per key, across every executor process
    (docs/adr/011-rate-limits.md). The budget is spent when an item is claimed (an attempt that later
    fails, is retried or is fenced off still spent it); an item whose key has no budget is not
    claimed: it waits in the queue without burning an attempt. ``burst`` claims may go at once; in
    any window of ``W`` seconds a key gets at most ``burst + W * limit / period_s`` claims."""

    limit: int = Field(ge=1, le=1_000_000)
    period_s: float = Field(gt=0, le=86_400)
    burst: int = Field(default=1, ge=1, le=1_000_000)
    # ``key`` (_KeyedPolicy): keys are per pack: work types whose keys render equal share one budget.

    @model_validator(mode="after")
    def _burst(self) -> RateLimit:
        if self.burst > self.limit:
            raise ValueError("burst must be <= limit")
        return self


class ConcurrencyLimit(_KeyedPolicy):
    """At most ``limit`` WorkItems of a key in flight at once, across every executor process
    (docs/adr/011-rate-limits.md). A separate mechanism from the target mutation lane (one in flight
    per target, in delivery order): this one promises no order. An item whose key is at its limit
    is not claimed (no attempt) and waits until a member of its key finishes; an expired lease
    gives its slot back when it is reclaimed, exactly once."""

    limit: int = Field(ge=1, le=100_000)


#: The longest debounce window and bound a pack may declare (a day).
MAX_DEBOUNCE_S = 86_400


class DebouncePolicy(_KeyedPolicy):
    """Coalesce bursts (docs/packs.md#debounce): WorkItems of one key (a template over extracted
    fields and ``{work_type}``; keys are per pack and work type) that wait together become one
    execution of the newest; the older ones end ``coalesced`` into it. The newest runs once
    ``window_s`` passed without a newer item of its key, and at the latest ``max_wait_s`` after the
    oldest item it covers was created (default ten windows, at most a day), so a continuous stream
    still executes."""

    window_s: float = Field(gt=0, le=MAX_DEBOUNCE_S)
    max_wait_s: float | None = Field(default=None, gt=0, le=MAX_DEBOUNCE_S)

    @model_validator(mode="after")
    def _bounded(self) -> DebouncePolicy:
        if self.max_wait_s is not None and self.max_wait_s < self.window_s:
            raise ValueError("max_wait_s must be >= window_s")
        return self

    @property
    def max_wait(self) -> float:
        """``max_wait_s``, or ten windows (at most a day)."""
        return self.max_wait_s if self.max_wait_s is not None else min(10 * self.window_s, MAX_DEBOUNCE_S)


class CircuitBreaker(_Model):
    """A circuit breaker on the work type's handler target (docs/adr/013-circuit-breakers.md): one
    circuit per pack and target (``circuit_target``: the HTTP URL's scheme and authority, the gRPC
    target's authority, the python callable), shared by every work type of the pack that calls it.

    It *opens* after ``consecutive_failures`` failures in a row, or when at least ``min_outcomes``
    outcomes within ``window_s`` seconds were failures in a proportion of ``failure_ratio`` or more.
    While open, the target's items are not claimed (no attempt spent); after ``open_s`` it is
    *half-open*: at most ``half_open_probes`` items run at once as probes, across every executor
    process; a probe that succeeds closes it, one that fails opens it again for ``open_s``."""

    #: Failures in a row that open the circuit (0: this trigger is off; then ``failure_ratio`` is needed).
    consecutive_failures: int = Field(default=5, ge=0, le=100_000)
    #: Proportion of failures among the window's outcomes that opens it (none: this trigger is off).
    failure_ratio: float | None = Field(default=None, gt=0, le=1)
    #: The ratio's window (seconds; a window starts with the first outcome after the last one ended).
    window_s: float = Field(default=60.0, gt=0, le=86_400)
    #: Outcomes a window needs before its ratio can open the circuit.
    min_outcomes: int = Field(default=20, ge=1, le=1_000_000)
    #: How long it stays open before letting probes through (seconds).
    open_s: float = Field(default=30.0, gt=0, le=86_400)
    #: Items in flight at once as probes while half-open, across every executor process.
    half_open_probes: int = Field(default=1, ge=1, le=1_000)

    @model_validator(mode="after")
    def _trigger(self) -> CircuitBreaker:
        if self.consecutive_failures == 0 and self.failure_ratio is None:
            raise ValueError("set consecutive_failures (> 0) or failure_ratio: a breaker that can never open")
        return self


#: Default ``QueueClassSpec.priority_step_s``: one priority point is worth one second of waiting
#: (the head start priorities gave before they kept it through retries and delays).
DEFAULT_PRIORITY_STEP_S = 1.0
#: The largest step: 100 points x a day is effectively strict priority (ADR 014).
MAX_PRIORITY_STEP_S = 86_400.0


class QueueClassSpec(_Model):
    """Claim order within one queue class of the pack (docs/adr/014-priorities.md). A due item
    ranks by ``due time - head`` with ``head = (priority - lowest) x priority_step_s`` (``lowest``:
    the queue class's lowest work-type priority when negative, else 0), so an item of priority
    ``p`` is claimed before every item of priority ``q`` that became due less than
    ``(p - q) x priority_step_s`` earlier, and is never claimed after an item of the queue class
    that became due more than ``(highest - p) x priority_step_s`` later: that is its starvation
    bound. ``priority_step_s: 0`` ignores priorities (due order)."""

    priority_step_s: float = Field(default=DEFAULT_PRIORITY_STEP_S, ge=0, le=MAX_PRIORITY_STEP_S)


class HandlerSpec(_Model):
    kind: Literal["python", "grpc", "http"]
    #: python: ``module:function``; grpc: ``host:port``; http: URL.
    target: str
    timeout_s: float = Field(default=30.0, gt=0)


def circuit_target(handler: HandlerSpec) -> str:
    """The circuit key of a handler: what identifies its destination, and nothing more — an HTTP
    URL's scheme, host and port (never its user info, path or query: they may carry secrets), a gRPC
    target's host and port, a python callable's ``module:function``. Safe as a metric label value.
    Never raises (an unparseable HTTP URL keys on ``http://invalid``; the apply refuses one)."""
    if handler.kind == "python":
        return f"python:{handler.target.strip()}"
    if handler.kind == "http":
        host, port, scheme = _http_authority(handler.target)
        return f"{scheme}://{host}:{port}" if host else f"{scheme}://invalid"
    target = handler.target.strip()
    for prefix in ("dns:///", "dns://", "ipv4:", "ipv6:"):
        if target.startswith(prefix):
            target = target[len(prefix) :]
            break
    if "/" in target:  # dns://authority/host:port
        target = target.rsplit("/", 1)[-1]
    target = target.rsplit("@", 1)[-1].split("?", 1)[0]
    return f"grpc://{target.lower()}"


def _http_authority(url: str) -> tuple[str | None, int, str]:
    """(host, port, scheme) of an HTTP URL; host ``None`` when it has none."""
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower() if parts.scheme in ("http", "https", "HTTP", "HTTPS") else "http"
        host = parts.hostname
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        return None, 80, "http"
    if host and ":" in host:
        host = f"[{host}]"  # IPv6
    return host, port, scheme


class WorkTypeSpec(_Model):
    handler: HandlerSpec
    queue_class: str = Field(default="default", pattern=NAME_PATTERN)
    #: Higher is claimed earlier among due items of its queue class, through retries and delays;
    #: how much earlier: the queue class's ``priority_step_s`` per point (docs/adr/014-priorities.md).
    priority: int = Field(default=0, ge=-100, le=100)
    retry: RetryPolicy = RetryPolicy()
    lanes: LanePolicy = LanePolicy()
    #: When its items may run (none: as soon as they are materialized).
    delay: DelayPolicy | None = None
    #: Claims per period per key across all executors (none: unlimited).
    rate_limit: RateLimit | None = None
    #: In-flight items per key across all executors (none: unlimited).
    concurrency: ConcurrencyLimit | None = None
    #: Bursts of a key become one execution of the newest item (none: every item runs).
    debounce: DebouncePolicy | None = None
    #: A circuit breaker on the handler's target (none: no breaker).
    circuit_breaker: CircuitBreaker | None = None


class FanOut(_Model):
    work_type: str
    #: Per-route overrides of the work type's lane policy (replaces it as a whole).
    lanes: LanePolicy | None = None
    #: Per-route override of the work type's delay (replaces it as a whole).
    delay: DelayPolicy | None = None
    #: Per-route override of the work type's rate limit (replaces it as a whole).
    rate_limit: RateLimit | None = None
    #: Per-route override of the work type's concurrency limit (replaces it as a whole).
    concurrency: ConcurrencyLimit | None = None
    #: Per-route override of the work type's debounce (replaces it as a whole).
    debounce: DebouncePolicy | None = None
    #: Per-route override of the work type's circuit breaker policy (replaces it as a whole; the
    #: circuit is still the handler target's).
    circuit_breaker: CircuitBreaker | None = None


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
    #: Per queue class settings (claim order of priorities); a class not listed has the defaults.
    queue_classes: dict[str, QueueClassSpec] = {}

    @model_validator(mode="after")
    def _references(self, info: ValidationInfo) -> Manifest:
        # parse_manifest runs the same checks on the raw document (so they are reported together with
        # field errors) and asks the model not to repeat them.
        if info.context and info.context.get("skip_reference_checks"):
            return self
        problems = reference_errors(self.model_dump(mode="json"))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def priority_heads(self) -> dict[str, float]:
        """Work type → its items' ``priority_head_s`` (``priority_heads``)."""
        return priority_heads(self.model_dump(mode="json"))

    def route(self, key: str) -> RouteSpec | None:
        for r in self.routes:
            if r.key == key:
                return r
        return None


# --------------------------------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------------------------------


def template_references(template: str) -> list[str]:
    """The ``{...}`` references of a template, in order (``{{``/``}}`` escapes excluded)."""
    return _PLACEHOLDER_RE.findall(template.replace("{{", "").replace("}}", ""))


def template_syntax_errors(template: str) -> list[str]:
    problems: list[str] = []
    stripped = _PLACEHOLDER_RE.sub("", template.replace("{{", "").replace("}}", ""))
    if "{" in stripped or "}" in stripped:
        problems.append(f"template {template!r} has an unbalanced brace (write {{{{ or }}}} for a literal)")
    for ref in template_references(template):
        if not ref:
            problems.append(f"template {template!r} has an empty {{}}")
        elif ref.startswith("/") or ref.startswith("header:"):
            if ref.startswith("header:") and not ref[len("header:") :]:
                problems.append(f"template {template!r}: {{header:}} needs a header name")
        elif not _NAME_RE.match(ref):
            problems.append(
                f"template {template!r}: {{{ref}}} is not a field name, a /json/pointer or header:Name"
            )
    return problems


# --------------------------------------------------------------------------------------------------
# Cross-reference checks, on the raw document (tolerant of parts that failed field validation)
# --------------------------------------------------------------------------------------------------


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _route_label(index: int, route: Mapping[str, Any]) -> str:
    key = route.get("key")
    return f"routes[{index}:{key}]" if isinstance(key, str) else f"routes[{index}]"


def _spec_kind(spec: Any) -> tuple[str | None, str | None]:
    """(kind, value) of a raw ValueSpec dict, when it has exactly one recognisable kind."""
    if not isinstance(spec, dict):
        return None, None
    given = [(k, spec[k]) for k in ("pointer", "header", "const", "template") if spec.get(k) is not None]
    if len(given) != 1 or not isinstance(given[0][1], str):
        return None, None
    return given[0][0], given[0][1]


def _spec_uses_header(spec: Any) -> bool:
    kind, value = _spec_kind(spec)
    if kind == "header":
        return True
    return (
        kind == "template"
        and value is not None
        and any(r.startswith("header:") for r in template_references(value))
    )


def priority_heads(data: Mapping[str, Any]) -> dict[str, float]:
    """Work type → head start of its items in the claim order, in seconds (``priority_head_s``,
    docs/adr/014-priorities.md): ``(priority - lowest) x priority_step_s`` of its queue class,
    ``lowest`` the class's lowest priority when negative, else 0 — never negative, and exactly
    ``priority x step`` while no priority of the class is negative. Works on a validated
    manifest's document (defaults filled in or not)."""
    work_types = _as_dict(data.get("work_types"))
    classes = _as_dict(data.get("queue_classes"))
    lowest: dict[str, int] = {}
    for spec in work_types.values():
        qc = str(_as_dict(spec).get("queue_class", "default"))
        lowest[qc] = min(lowest.get(qc, 0), int(_as_dict(spec).get("priority", 0)))
    heads: dict[str, float] = {}
    for name, spec in work_types.items():
        qc = str(_as_dict(spec).get("queue_class", "default"))
        step = float(_as_dict(classes.get(qc)).get("priority_step_s", DEFAULT_PRIORITY_STEP_S))
        heads[name] = (int(_as_dict(spec).get("priority", 0)) - lowest[qc]) * step
    return heads


def reference_errors(data: Mapping[str, Any]) -> list[str]:
    """Every cross-reference problem of a manifest document (work types, fields, templates, lanes).

    Works on the raw document so it can run even when some fields failed validation; a part that is
    malformed is skipped here (its field error is reported by the model)."""
    problems: list[str] = []
    work_types = _as_dict(data.get("work_types"))
    for name in work_types:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            problems.append(f"work_types.{name}: invalid name (lowercase letters, digits, _.- ; 63 max)")
    used = {str(_as_dict(spec).get("queue_class", "default")) for spec in work_types.values()}
    for qc in _as_dict(data.get("queue_classes")):
        if qc not in used:
            problems.append(f"queue_classes.{qc}: no work type has this queue class; used: {sorted(used)}")
    routes = data.get("routes")
    if not isinstance(routes, list | tuple):
        return problems
    seen: dict[str, int] = {}
    for index, route in enumerate(routes):
        if not isinstance(route, dict):
            continue
        label = _route_label(index, route)
        key = route.get("key")
        if isinstance(key, str):
            if key in seen:
                problems.append(f"{label}: duplicate route key (also routes[{seen[key]}])")
            else:
                seen[key] = index
        extract = _as_dict(route.get("extract"))
        problems.extend(_extract_errors(label, extract))
        correlation = _as_dict(route.get("correlation"))
        for cname, spec in correlation.items():
            if not isinstance(cname, str) or not _CORRELATION_RE.match(cname):
                problems.append(f"{label}.correlation.{cname}: invalid name ({CORRELATION_NAME_PATTERN})")
            problems.extend(_template_ref_errors(f"{label}.correlation.{cname}", spec, extract, ()))
        required = route.get("required")
        if isinstance(required, list | tuple):
            for req in required:
                if req not in extract:
                    problems.append(f"{label}.required: {req!r} is not extracted")
        fan_out = route.get("fan_out")
        if not isinstance(fan_out, list | tuple):
            continue
        names = [f.get("work_type") for f in fan_out if isinstance(f, dict)]
        for dup in sorted({n for n in names if isinstance(n, str) and names.count(n) > 1}):
            problems.append(f"{label}.fan_out: work type {dup!r} appears twice")
        for findex, fan in enumerate(fan_out):
            if not isinstance(fan, dict) or not isinstance(fan.get("work_type"), str):
                continue
            wt_name = fan["work_type"]
            flabel = f"{label}.fan_out[{findex}:{wt_name}]"
            if wt_name not in work_types:
                problems.append(f"{flabel}: unknown work type {wt_name!r}; known: {sorted(work_types)}")
                continue
            lanes = fan.get("lanes")
            if lanes is None:
                lanes = _as_dict(work_types[wt_name]).get("lanes")
            problems.extend(_lane_errors(flabel, _as_dict(lanes), extract))
            delay = fan.get("delay")
            if delay is None:
                delay = _as_dict(work_types[wt_name]).get("delay")
            if _as_dict(delay).get("run_after_field") is True and "run_after" not in extract:
                problems.append(f"{flabel}: delay.run_after_field needs extract.run_after")
            rate = fan.get("rate_limit")
            if rate is None:
                rate = _as_dict(work_types[wt_name]).get("rate_limit")
            problems.extend(_key_errors(flabel, "rate_limit", _as_dict(rate), extract))
            conc = fan.get("concurrency")
            if conc is None:
                conc = _as_dict(work_types[wt_name]).get("concurrency")
            problems.extend(_key_errors(flabel, "concurrency", _as_dict(conc), extract))
            deb = fan.get("debounce")
            if deb is None:
                deb = _as_dict(work_types[wt_name]).get("debounce")
            problems.extend(_key_errors(flabel, "debounce", _as_dict(deb), extract))
            problems.extend(_debounce_errors(flabel, _as_dict(deb), _as_dict(lanes), rate, conc))
            breaker = fan.get("circuit_breaker")
            if breaker is None:
                breaker = _as_dict(work_types[wt_name]).get("circuit_breaker")
            if breaker is not None:
                problems.extend(
                    _circuit_errors(flabel, _as_dict(_as_dict(work_types[wt_name]).get("handler")))
                )
                if deb:
                    # The claim's coalescing reads a key's older items beyond the candidates the
                    # circuit let through; the two are not combined yet.
                    problems.append(
                        f"{flabel}: circuit_breaker cannot be combined with debounce (not supported yet)"
                    )
    return problems


def _debounce_errors(
    label: str, deb: Mapping[str, Any], lanes: Mapping[str, Any], rate: Any, conc: Any
) -> list[str]:
    """What a debounce may not be combined with (after the route's overrides). Coalescing runs the
    newest item of a key in place of older ones, so in a lane it would run an older item's event
    after lane members that came between them: refused (per debounce key, executions already run
    in order). Rate limits and concurrency per key are not combined with it yet."""
    if not deb:
        return []
    problems: list[str] = []
    if lanes.get("source_fifo") or lanes.get("target_serialization"):
        problems.append(
            f"{label}: debounce cannot be combined with lanes (source_fifo / target_serialization): "
            "coalescing runs a later event in place of earlier ones, which would reorder the lane; "
            "per debounce key, executions already run in order"
        )
    for what, value in (("rate_limit", rate), ("concurrency", conc)):
        if value is not None:
            problems.append(f"{label}: debounce cannot be combined with {what} (not supported yet)")
    return problems


def _circuit_errors(label: str, handler: Mapping[str, Any]) -> list[str]:
    """A circuit breaker needs a handler target that names its destination."""
    if handler.get("kind") != "http" or not isinstance(handler.get("target"), str):
        return []
    try:
        parts = urlsplit(handler["target"].strip())
        ok = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # raises on a malformed port
    except ValueError:
        ok = False
    if ok:
        return []
    return [f"{label}: circuit_breaker needs an http(s) handler target with a host (the circuit's key)"]


def _extract_errors(label: str, extract: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for field, spec in extract.items():
        if field not in EXTRACTABLE:
            continue  # reported by the field validator
        flabel = f"{label}.extract.{field}"
        if field not in HEADER_FIELDS and _spec_uses_header(spec):
            problems.append(
                f"{flabel}: header values are not kept on the receipt (only {list(HEADER_FIELDS)} and "
                "correlation ids are); take it from the body (pointer or template)"
            )
        problems.extend(_template_ref_errors(flabel, spec, extract, ()))
    # Templates referring to templates: no cycles.
    graph: dict[str, list[str]] = {}
    for field, spec in extract.items():
        kind, value = _spec_kind(spec)
        if kind == "template" and value is not None:
            graph[field] = [r for r in template_references(value) if r in extract]
    for cycle_field in _cyclic(graph):
        problems.append(
            f"{label}.extract.{cycle_field}: template refers to itself (through {graph[cycle_field]})"
        )
    return problems


def _template_ref_errors(
    label: str, spec: Any, extract: Mapping[str, Any], extra_names: Iterable[str]
) -> list[str]:
    kind, value = _spec_kind(spec)
    if kind != "template" or value is None:
        return []
    return _refs_errors(label, value, extract, extra_names)


def _refs_errors(
    label: str, template: str, extract: Mapping[str, Any], extra_names: Iterable[str]
) -> list[str]:
    problems: list[str] = []
    allowed = set(extra_names)
    for ref in template_references(template):
        if not ref or ref.startswith("/") or ref.startswith("header:"):
            continue
        if ref in allowed:
            continue
        if ref not in EXTRACTABLE:
            problems.append(f"{label}: {{{ref}}} is not a known field; known: {list(EXTRACTABLE)}")
        elif ref not in extract:
            problems.append(f"{label}: {{{ref}}} is not extracted by this route")
    return problems


def _lane_errors(label: str, lanes: Mapping[str, Any], extract: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    if lanes.get("target_serialization") and "target_lane_key" not in extract:
        problems.append(f"{label}: target_serialization needs extract.target_lane_key")
    if lanes.get("source_fifo"):
        template = lanes.get("source_lane_key") or DEFAULT_SOURCE_LANE_KEY
        if isinstance(template, str):
            if any(r.startswith("header:") for r in template_references(template)):
                problems.append(f"{label}: source_lane_key cannot use headers (not kept on the receipt)")
            problems.extend(
                f"{p} (source_lane_key {template!r})"
                for p in _refs_errors(label, template, extract, ("work_type",))
            )
    return problems


def _key_errors(label: str, what: str, limit: Mapping[str, Any], extract: Mapping[str, Any]) -> list[str]:
    """The key template of a ``rate_limit`` or ``concurrency`` declaration against the route."""
    if not limit:
        return []
    template = limit.get("key") or DEFAULT_RATE_KEY
    if not isinstance(template, str):
        return []
    problems: list[str] = []
    if any(r.startswith("header:") for r in template_references(template)):
        problems.append(f"{label}: {what}.key cannot use headers (not kept on the receipt)")
    problems.extend(
        f"{p} ({what}.key {template!r})" for p in _refs_errors(label, template, extract, ("work_type",))
    )
    return problems


def _cyclic(graph: Mapping[str, list[str]]) -> list[str]:
    """Nodes on a cycle of ``graph``."""
    out: list[str] = []
    for start in graph:
        stack, seen = list(graph.get(start, ())), set()
        while stack:
            node = stack.pop()
            if node == start:
                out.append(start)
                break
            if node in seen:
                continue
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return out


# --------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------


class ManifestError(ValueError):
    """An invalid manifest; ``errors`` lists every problem as ``path: message``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid pack manifest:\n" + "\n".join(f"  - {e}" for e in errors))
        self.errors = errors


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


#: Limits of a manifest document, checked before its fields are (docs/admin.md, "Input
#: validation"): nesting depth (a manifest needs fewer than ten levels) and values in all, a YAML
#: alias counted at every place it is used (so an alias "bomb" is refused, not validated billions
#: of times).
MAX_DOCUMENT_DEPTH = 32
MAX_DOCUMENT_VALUES = 100_000
MAX_DOCUMENT_ERRORS = 100


def load_document(text: str | bytes) -> Any:
    """Parse YAML or JSON text (duplicate keys are an error)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ManifestError([f"not valid YAML/JSON: {exc}"]) from None
    except UnicodeDecodeError:
        raise ManifestError(["not valid YAML/JSON: the text is not UTF-8"]) from None
    except RecursionError:
        raise ManifestError([f"(manifest): nested deeper than {MAX_DOCUMENT_DEPTH} levels"]) from None


def _text_problem(value: str) -> str | None:
    """What no text of a manifest may hold: PostgreSQL text and JSON columns cannot store a NUL
    character, and a lone surrogate (``"\\ud800"`` in a JSON or YAML escape) is not Unicode text."""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (a lone surrogate)"
    return None


def _label(key: Any) -> str:
    text = str(key)
    return text if _text_problem(text) is None else text.encode("unicode_escape").decode("ascii")


def document_errors(data: Any) -> tuple[list[str], bool]:
    """Problems of the raw document no field check may see: text with a NUL character or a lone
    surrogate (keys included), nesting deeper than ``MAX_DOCUMENT_DEPTH``, more than
    ``MAX_DOCUMENT_VALUES`` values. Iterative (no recursion limit). Returns the errors and whether
    the shape itself is refused (too deep or too large: nothing else is checked then)."""
    errors: list[str] = []
    seen = 0
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack and len(errors) < MAX_DOCUMENT_ERRORS:
        node, path, depth = stack.pop()
        seen += 1
        if seen > MAX_DOCUMENT_VALUES:
            return [
                f"(manifest): more than {MAX_DOCUMENT_VALUES} values (a YAML alias counts at every use)"
            ], True
        if isinstance(node, str):
            problem = _text_problem(node)
            if problem is not None:
                errors.append(f"{path or '(manifest)'}: {problem}")
            continue
        if not isinstance(node, dict | list | tuple):
            continue
        if depth >= MAX_DOCUMENT_DEPTH:
            return [f"{path or '(manifest)'}: nested deeper than {MAX_DOCUMENT_DEPTH} levels"], True
        if isinstance(node, dict):
            children = []
            for key, value in node.items():
                here = f"{path}.{_label(key)}" if path else _label(key)
                if isinstance(key, str) and (problem := _text_problem(key)) is not None:
                    errors.append(f"{here}: the key {problem}")
                children.append((value, here, depth + 1))
        else:
            children = [(value, f"{path}[{index}]", depth + 1) for index, value in enumerate(node)]
        stack.extend(reversed(children))
    return errors, False


def _format_loc(loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    parts: list[str] = []
    node: Any = data
    for part in loc:
        if isinstance(part, int):
            label = f"[{part}]"
            if isinstance(node, list | tuple) and 0 <= part < len(node):
                node = node[part]
                key = node.get("key") if isinstance(node, dict) else None
                key = key or (node.get("work_type") if isinstance(node, dict) else None)
                if isinstance(key, str):
                    label = f"[{part}:{key}]"
            else:
                node = None
            if parts:
                parts[-1] += label
            else:
                parts.append(label)
        else:
            # pydantic tags union/function validators with their names; they are not paths.
            if part.startswith("function-") or part in ("str", "int", "dict[str,...]"):
                continue
            parts.append(str(part))
            node = node.get(part) if isinstance(node, dict) else None
    return ".".join(parts) or "(manifest)"


def _raw_at(data: Any, loc: tuple[int | str, ...]) -> Any:
    node = data
    for part in loc:
        if isinstance(part, int) and isinstance(node, list | tuple) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def parse_manifest(text: str | bytes | Mapping[str, Any]) -> Manifest:
    """Parse and validate a manifest document (YAML or JSON), listing every error: field errors,
    cross-reference errors and verification errors are reported together."""
    data: Any = dict(text) if isinstance(text, Mapping) else load_document(text)
    if not isinstance(data, dict):
        raise ManifestError(["the document must be a mapping with name, namespace, work_types, routes"])
    errors, refused = document_errors(data)
    if refused:
        raise ManifestError(errors)
    manifest: Manifest | None = None
    try:
        manifest = Manifest.model_validate(data, context={"skip_reference_checks": True})
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == "too_short" and _raw_at(data, tuple(err["loc"])):
                continue  # pydantic repeats a failed item's error as the non-empty list being "short"
            loc = _format_loc(tuple(err["loc"]), data)
            msg = err["msg"].removeprefix("Value error, ")
            errors.extend(f"{loc}: {part}" for part in msg.split("\n"))
    errors.extend(reference_errors(data))
    errors.extend(_verification_errors(data))
    if errors:
        raise ManifestError(list(dict.fromkeys(errors)))
    assert manifest is not None
    return manifest


def _verification_errors(data: Mapping[str, Any]) -> list[str]:
    # Verification specs are interpreted by the ingress verifier; check them now so a bad preset or
    # an impossible combination is refused at apply time, not at the first delivery.
    errors: list[str] = []
    routes = data.get("routes")
    if not isinstance(routes, list | tuple):
        return errors
    for index, route in enumerate(routes):
        if not isinstance(route, dict):
            continue
        try:
            spec = VerificationSpec.model_validate(route.get("verification"))
        except ValidationError:
            continue  # reported as field errors
        label = _route_label(index, route)
        errors.extend(f"{label}.verification: {e}" for e in verification.check_spec(spec))
    return errors


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def route_effective_config(manifest: Manifest, route: RouteSpec) -> dict[str, Any]:
    """Everything the materializer uses to turn a receipt of ``route`` into an event and WorkItems:
    the route config plus the specs of the work types it fans out to. Its hash decides the route
    version (docs/adr/004-materializer.md)."""
    return {
        "route": route.model_dump(mode="json"),
        "work_types": {
            f.work_type: manifest.work_types[f.work_type].model_dump(mode="json")
            for f in route.fan_out
            if f.work_type in manifest.work_types
        },
    }
