"""What a handler sees and what it may answer.

A handler gets one ``HandlerContext`` per claimed WorkItem: the item's fields, its immutable event
fact (``ctx.event``), the payload (the receipt body, ``ctx.payload``), the lease token and an
idempotency key (``delivery_key``: derived from the provider's delivery identity and the work type,
stable across attempts, replays and database failovers, never shared by two deliveries). It
answers with an ``Outcome`` — or ``None`` for success — or raises:

* ``Outcome.success()`` / ``None``: the item succeeds.
* ``Outcome.retry(delay_s=None)``: try again after ``delay_s`` (else the work type's exponential
  backoff with jitter); after the route's max attempts the item is dead.
* ``Outcome.fail(failure_class, summary)`` or ``raise PermanentError(...)``: dead at once.
* any other exception: classified (``classify``), retried with backoff, dead when attempts run out.

Failure summaries stored on the row are sanitized (``sanitize_summary``): the exception type plus a
bounded message with payload fragments and secret-looking values removed.

Handler kinds: ``python`` (``module:function``, sync or async), ``grpc`` (a remote
``connector.v1.WorkHandlerService``; ``server.py`` serves a python function as one) and ``http``
(POST JSON). See docs/executor.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

__all__ = [
    "EventFact",
    "Handler",
    "HandlerContext",
    "Outcome",
    "PermanentError",
    "RetryableError",
    "backoff_delay",
    "classify",
    "delivery_key",
    "sanitize_summary",
    "work_handler",
]

SUMMARY_MAX = 300


@dataclass(frozen=True, slots=True)
class EventFact:
    """The immutable materialized event (``connector_event`` fact columns)."""

    event_id: int
    receipt_id: int
    event_index: int
    installed_pack_id: int
    generation: int
    incarnation: int
    route_id: int
    route_version: int
    namespace: str
    event_kind: str | None
    source_object_kind: str | None
    source_object_id: str | None
    idempotency_key: str
    delivery_seq: int
    payload_sha256: bytes
    parse_outcome: str
    companion: dict[str, Any]
    correlation_ids: dict[str, Any]
    created_at: datetime


class HandlerContext:
    """One claimed WorkItem, as its handler sees it (the executor's record of the claim,
    ``work.inflight.InFlight``, extends it with its bookkeeping).

    ``attempt`` counts this execution (1 on the first). ``lease_lost`` turns true when the executor
    learns that another claimer fenced this lease (the handler should stop making effects);
    ``remaining_lease_s()`` is measured on the process's monotonic clock from the last renewal.
    ``traceparent`` is the W3C trace context of this attempt (its span's while the executor traces;
    else the one the delivery carried; ``None`` when there is none): docs/tracing.md.
    ``coalesced_work_ids`` / ``coalesced_event_ids``: for a debounced work type, the older WorkItems
    (and their events) this execution covers, oldest first — they ended ``coalesced`` into it
    without running (docs/packs.md#debounce); empty otherwise. ``event`` is the newest event."""

    __slots__ = (
        "_deadline",
        "_idempotency_key",
        "attempt",
        "coalesced_event_ids",
        "coalesced_work_ids",
        "content_type",
        "event",
        "event_id",
        "generation",
        "installed_pack_id",
        "lease_lost",
        "lease_token",
        "max_attempts",
        "payload",
        "queue_class",
        "source_lane_key",
        "target_mutation_lane_key",
        "traceparent",
        "work_id",
        "work_type",
    )

    def __init__(self, row: tuple[Any, ...], deadline: float, idempotency_key: str | None = None) -> None:
        (
            self.work_id,
            self.lease_token,
            self.installed_pack_id,
            self.generation,
            self.queue_class,
            self.work_type,
            self.event_id,
            self.attempt,
            self.max_attempts,
            self.source_lane_key,
            self.target_mutation_lane_key,
            self.traceparent,
            *_,  # the executor's own columns (``work_items.claim.ClaimedRow``: the concurrency key)
        ) = row
        self._deadline = deadline
        self._idempotency_key = idempotency_key
        self.lease_lost = False
        self.event: EventFact | None = None
        self.payload: bytes | None = None
        self.content_type: str | None = None
        self.coalesced_work_ids: tuple[int, ...] = ()
        self.coalesced_event_ids: tuple[int, ...] = ()

    @property
    def idempotency_key(self) -> str:
        """``delivery_key`` of this item's event and work type (computed once, from ``ctx.event``)."""
        key = self._idempotency_key
        if key is None:
            e = self.event
            if e is None:
                raise RuntimeError(
                    "the idempotency key is derived from the event, which this handler does not read:"
                    " declare it with work_handler(needs_event=True)"
                )
            key = self._idempotency_key = delivery_key(e.namespace, e.idempotency_key, self.work_type)
        return key

    @property
    def work_item(self) -> HandlerContext:
        """The claimed WorkItem's fields (``work_id``, ``work_type``, ...): this object itself."""
        return self

    def remaining_lease_s(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def __repr__(self) -> str:  # never the payload
        return f"HandlerContext(work_id={self.work_id}, work_type={self.work_type!r}, attempt={self.attempt})"


def delivery_key(namespace: str, event_key: str, work_type: str) -> str:
    """The idempotency key a handler gets for one work type of one delivery: 32 hex digits (128 bits)
    of SHA-256 over the namespace, the event's idempotency key (the receipt's ``<route>:id:<provider
    delivery id>`` or ``<route>:sha256:<body hash>``, plus ``#<event index>``) and the work type.
    Built from what the provider sent, never from a database sequence: after a failover that lost
    the old primary's last writes the new primary hands out event and work ids again, so
    ``<event_id>:<work_type>`` (the key before issue #26) could name two deliveries; this key cannot,
    and a delivery the provider sends again gets its old key (docs/executor.md, "Idempotency keys")."""
    text = "\x1f".join((namespace, event_key, work_type))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Outcome:
    """A handler's answer. ``kind`` is ``success``, ``retry`` or ``fail`` (permanent: dead)."""

    __slots__ = ("delay_s", "failure_class", "kind", "summary")

    def __init__(
        self, kind: str, delay_s: float | None = None, failure_class: str = "", summary: str = ""
    ) -> None:
        self.kind = kind
        self.delay_s = delay_s
        self.failure_class = failure_class
        self.summary = summary

    @staticmethod
    def success() -> Outcome:
        return _SUCCESS

    @staticmethod
    def retry(
        delay_s: float | None = None, failure_class: str = "retry_requested", summary: str = ""
    ) -> Outcome:
        return Outcome("retry", delay_s, failure_class, summary or "the handler asked for a retry")

    @staticmethod
    def fail(failure_class: str = "permanent", summary: str = "") -> Outcome:
        return Outcome("fail", None, failure_class, summary or "the handler reported a permanent failure")

    def __repr__(self) -> str:
        return f"Outcome({self.kind!r}, delay_s={self.delay_s}, failure_class={self.failure_class!r})"


_SUCCESS = Outcome("success")


class RetryableError(Exception):
    """Raise to ask for a retry (optionally after ``delay_s``) with a named failure class."""

    def __init__(self, message: str = "", *, delay_s: float | None = None, failure_class: str = "retryable"):
        super().__init__(message)
        self.delay_s = delay_s
        self.failure_class = failure_class


class PermanentError(Exception):
    """Raise to dead-letter the item at once (no further attempts)."""

    def __init__(self, message: str = "", *, failure_class: str = "permanent"):
        super().__init__(message)
        self.failure_class = failure_class


class Handler(Protocol):
    #: Does the handler need ``ctx.event`` / ``ctx.payload``? (one batched read per claimed batch)
    needs_event: bool

    async def __call__(self, ctx: HandlerContext) -> Outcome | None: ...


def work_handler(*, needs_event: bool = True) -> Any:
    """Decorate a python handler. ``needs_event=False`` says it reads neither ``ctx.event`` nor
    ``ctx.payload``, so the executor skips the (batched) event and payload read for its items."""

    def mark(fn: Any) -> Any:
        fn.connector_needs_event = needs_event
        return fn

    return mark


# ------------------------------------------------------------------------------------------------
# Exceptions → (outcome, failure class, sanitized summary)
# ------------------------------------------------------------------------------------------------

_SECRETISH = re.compile(
    r"(?i)(bearer\s+[\w\-.~+/=]+|(?:password|passwd|secret|token|api[_-]?key|authorization|signature)"
    r"\s*[=:]\s*(?:(?:bearer|basic|token)\s+)?\S+|[A-Za-z0-9+/_\-]{24,}={0,2})"
)
_WORD = re.compile(r"[\w@.\-+/]{4,}")


def sanitize_summary(text: str, payload: bytes | None = None, *, limit: int = SUMMARY_MAX) -> str:
    """A bounded, single-line message without secret-looking values or fragments of the payload.

    Any word of four or more characters that also occurs in the payload is replaced by ``[…]`` (a
    handler error message that quotes a field value therefore loses that value), as is anything
    shaped like a credential (bearer tokens, ``key=value`` secrets, long opaque strings)."""
    if not text:
        return ""
    text = " ".join(text.split())[: limit * 4]
    text = _SECRETISH.sub("[redacted]", text)
    if payload:
        lowered = payload.lower()

        def scrub(m: re.Match[str]) -> str:
            word = m.group(0)
            return "[…]" if word.lower().encode(errors="ignore") in lowered else word

        text = _WORD.sub(scrub, text)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


_RETRYABLE_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (TimeoutError, "timeout"),
    (asyncio.TimeoutError, "timeout"),
    (ConnectionError, "connection"),
    (OSError, "os_error"),
)


def classify(exc: BaseException, payload: bytes | None = None) -> Outcome:
    """Map an exception raised by a handler to a retry or permanent outcome with a sanitized summary."""
    name = type(exc).__name__
    message = sanitize_summary(str(exc), payload)
    summary = f"{name}: {message}" if message else name
    if isinstance(exc, PermanentError):
        return Outcome("fail", None, exc.failure_class or "permanent", summary)
    if isinstance(exc, RetryableError):
        return Outcome("retry", exc.delay_s, exc.failure_class or "retryable", summary)
    for typ, cls in _RETRYABLE_TYPES:
        if isinstance(exc, typ):
            return Outcome("retry", None, cls, summary)
    return Outcome("retry", None, "exception", summary)


def backoff_delay(
    attempt: int, base_s: float, cap_s: float, jitter: float, rnd: random.Random | None = None
) -> float:
    """Exponential backoff: ``min(cap, base * 2**(attempt-1))``, minus up to ``jitter`` of it at random."""
    raw = min(cap_s, base_s * (2.0 ** max(0, attempt - 1)))
    r = (rnd or random).random()
    return max(0.0, raw * (1.0 - jitter * r))
