"""Pack manifests: the declarative description of routes, extraction, fan-out and policies.

This module is the model: the pydantic classes of a manifest, their limits and defaults, what is
derived from a validated manifest (circuit targets, priority head starts, a route's effective
config) and the canonical JSON its hashes are taken over. A manifest (YAML or JSON; see docs/packs.md)
is validated in full by ``connector.common.packs.document.parse_manifest``, which reports field
errors, cross-reference errors (``connector.common.packs.references``) and verification errors
*together*, every one as ``path: message``; nothing is installed when any is found
(``connector.common.packs.install`` installs it as a new generation with versioned routes;
activation is a separate, atomic step). Nothing here branches on a provider: presets are just named
verification configs.

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
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from connector.common.packs.reconcile import ExpectSpec, ReconcileSpec, RedeliverySpec
from connector.common.packs.references import (
    DEFAULT_RATE_KEY,
    EXTRACTABLE,
    NAME_PATTERN,
    as_dict,
    reference_errors,
    template_references,
    template_syntax_errors,
)
from connector.common.packs.verification import VerificationSpec


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
    #: What the sender does with an answer that is not a durable acceptance (docs/reconcile.md);
    #: none: the redelivery preset named like the verification preset, else ``none``.
    redelivery: RedeliverySpec | None = None
    #: Reconciliation against the sender's own list of what it sent (none: not reconciled).
    reconcile: ReconcileSpec | None = None
    #: The least traffic to expect (none: ``ConnectorRouteSilent`` learns the route's own rate).
    expect: ExpectSpec | None = None

    @model_serializer(mode="wrap")
    def _without_absent_contracts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A route without redelivery / reconcile / expect dumps as it did before they existed, so its
        # config hash (and route version) does not change with this release.
        out: dict[str, Any] = handler(self)
        for name in ("redelivery", "reconcile", "expect"):
            if out.get(name) is None:
                out.pop(name, None)
        return out

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


def priority_heads(data: Mapping[str, Any]) -> dict[str, float]:
    """Work type → head start of its items in the claim order, in seconds (``priority_head_s``,
    docs/adr/014-priorities.md): ``(priority - lowest) x priority_step_s`` of its queue class,
    ``lowest`` the class's lowest priority when negative, else 0 — never negative, and exactly
    ``priority x step`` while no priority of the class is negative. Works on a validated
    manifest's document (defaults filled in or not)."""
    work_types = as_dict(data.get("work_types"))
    classes = as_dict(data.get("queue_classes"))
    lowest: dict[str, int] = {}
    for spec in work_types.values():
        qc = str(as_dict(spec).get("queue_class", "default"))
        lowest[qc] = min(lowest.get(qc, 0), int(as_dict(spec).get("priority", 0)))
    heads: dict[str, float] = {}
    for name, spec in work_types.items():
        qc = str(as_dict(spec).get("queue_class", "default"))
        step = float(as_dict(classes.get(qc)).get("priority_step_s", DEFAULT_PRIORITY_STEP_S))
        heads[name] = (int(as_dict(spec).get("priority", 0)) - lowest[qc]) * step
    return heads


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
