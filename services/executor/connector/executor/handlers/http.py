"""HTTP handlers: ``POST`` of one JSON document per WorkItem.

Request body: ``{"work_item": {...}, "event": {...}, "payload_base64": "...", "content_type": ...,
"lease_token": n, "idempotency_key": "<32 hex digits, handlers.delivery_key>", "attempt": n,
"coalesced": {"work_ids": [...], "event_ids": [...]}}`` (``coalesced``: what a debounced execution
covers, docs/packs.md#debounce; empty lists otherwise); headers ``Idempotency-Key`` and
``X-Connector-Lease-Token`` (plus ``X-Connector-Work-Id``, ``X-Connector-Attempt`` and, for a
debounced execution covering others, ``X-Connector-Coalesced-Count``), and the attempt's trace
context (``traceparent``, docs/tracing.md) when it has one. The timeout is the work type's
``timeout_s`` capped by the lease time left.

Answer mapping: 2xx success; 408 and 429 retry; any other 4xx (409, 422, ...) permanent; 5xx,
timeouts and connection errors retry. ``Retry-After`` (seconds, or an HTTP date measured against
the response's own ``Date`` header — never this process's clock) sets the retry delay.
"""

from __future__ import annotations

import base64
import email.utils
from typing import Any

import aiohttp

from connector.common.core import tracing
from connector.executor.handlers import HandlerContext, Outcome, sanitize_summary

RETRY_STATUSES = frozenset({408, 429})
RETRY_AFTER_MAX_S = 3600.0


def retry_after_s(headers: Any) -> float | None:
    value = headers.get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
        date = headers.get("Date")
        if date is None:
            return None  # an absolute time without the server's clock to compare with: use backoff
        now = email.utils.parsedate_to_datetime(date)
        return max(0.0, min((when - now).total_seconds(), RETRY_AFTER_MAX_S))
    except (TypeError, ValueError):
        return None


def request_document(ctx: HandlerContext) -> dict[str, Any]:
    e = ctx.event
    return {
        "work_item": {
            "work_id": ctx.work_id,
            "event_id": ctx.event_id,
            "installed_pack_id": ctx.installed_pack_id,
            "generation": ctx.generation,
            "work_type": ctx.work_type,
            "queue_class": ctx.queue_class,
            "attempt": ctx.attempt,
            "max_attempts": ctx.max_attempts,
            "source_lane_key": ctx.source_lane_key,
            "target_mutation_lane_key": ctx.target_mutation_lane_key,
        },
        "event": None
        if e is None
        else {
            "event_id": e.event_id,
            "receipt_id": e.receipt_id,
            "event_index": e.event_index,
            "route_id": e.route_id,
            "route_version": e.route_version,
            "namespace": e.namespace,
            "event_kind": e.event_kind,
            "source_object_kind": e.source_object_kind,
            "source_object_id": e.source_object_id,
            "idempotency_key": e.idempotency_key,
            "delivery_seq": e.delivery_seq,
            "payload_sha256": bytes(e.payload_sha256).hex(),
            "parse_outcome": e.parse_outcome,
            "correlation_ids": e.correlation_ids,
            "create_time": e.created_at.isoformat(),
        },
        "payload_base64": base64.b64encode(ctx.payload).decode() if ctx.payload is not None else None,
        "content_type": ctx.content_type,
        "lease_token": ctx.lease_token,
        "idempotency_key": ctx.idempotency_key,
        "attempt": ctx.attempt,
        "coalesced": {"work_ids": list(ctx.coalesced_work_ids), "event_ids": list(ctx.coalesced_event_ids)},
    }


class HttpHandler:
    needs_event = True

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def __call__(self, ctx: HandlerContext) -> Outcome:
        timeout = min(self.timeout_s, ctx.remaining_lease_s())
        if timeout <= 0.05:
            return Outcome.retry(None, "lease_exhausted", "no lease time left to call the HTTP handler")
        headers = {
            "Idempotency-Key": ctx.idempotency_key,
            "X-Connector-Lease-Token": str(ctx.lease_token),
            "X-Connector-Work-Id": str(ctx.work_id),
            "X-Connector-Attempt": str(ctx.attempt),
        }
        if ctx.coalesced_work_ids:
            headers["X-Connector-Coalesced-Count"] = str(len(ctx.coalesced_work_ids))
        if ctx.traceparent is not None:
            headers.update(tracing.outgoing(ctx.traceparent))  # W3C traceparent (OTEL_PROPAGATORS)
        try:
            async with self._get_session().post(
                self.url,
                json=request_document(ctx),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                status = resp.status
                delay = retry_after_s(resp.headers)
                text = "" if 200 <= status < 300 else (await resp.text(errors="replace"))[:500]
        except TimeoutError:
            return Outcome.retry(None, "http_timeout", f"no answer within {timeout:.1f}s")
        except aiohttp.ClientError as exc:
            return Outcome.retry(None, "http_connection", f"{type(exc).__name__}")
        if 200 <= status < 300:
            return Outcome.success()
        summary = f"HTTP {status}: {sanitize_summary(text, ctx.payload)}".rstrip(": ")
        if status in RETRY_STATUSES or status >= 500:
            return Outcome.retry(delay, f"http_{status}", summary)
        return Outcome.fail(f"http_{status}", summary)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
