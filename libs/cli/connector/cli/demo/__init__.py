"""The demo pack used by ``connector up``: one route signed with Standard Webhooks, two work types.

Every delivery to ``POST /v1/webhooks/demo/events`` becomes one event and two WorkItems:

- ``record`` (handler ``connector.cli.demo:record``) always succeeds;
- ``deliver`` (handler ``connector.cli.demo:deliver``) stands for a call to a downstream system and
  fails on demand: a body with ``{"demo": {"fail_attempts": N}}`` makes its first ``N`` executions
  of that event fail (``connector demo send --fail`` sends ``N = 3``, the work type's
  ``max_attempts``, so the item ends in the dead-letter queue and a replay succeeds). Five failures
  in a row open its circuit breaker (open 10 s), so ``connector demo send --fail --count 6`` shows
  a circuit too.

The failures are counted per event in the process that runs the executor (``connector up``): a
restart forgets them (an item replayed after a restart then fails ``N`` times again).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

log = logging.getLogger("connector.demo")

PACK_NAME = "demo"
NAMESPACE = "demo"
ROUTE_KEY = "events"
#: ``retry.max_attempts`` of ``deliver``: ``connector demo send --fail`` asks for this many failures.
DELIVER_MAX_ATTEMPTS = 3
SECRET_FILE = "demo-webhook-secret"  # noqa: S105 (a file name)

#: Failures so far per event id (``deliver``), oldest events dropped past ``_FAILURES_MAX``.
_FAILURES: OrderedDict[int, int] = OrderedDict()
_FAILURES_MAX = 100_000


def manifest(secret_file: Path) -> dict[str, Any]:
    """The demo manifest: Standard Webhooks verification with a per-installation secret file."""
    return {
        "name": PACK_NAME,
        "namespace": NAMESPACE,
        "description": "Demo pack installed by `connector up` (docs: README, First hour).",
        "work_types": {
            "record": {
                "handler": {"kind": "python", "target": "connector.cli.demo:record"},
                "queue_class": "default",
                "retry": {"max_attempts": 5, "backoff_base_s": 0.5, "backoff_cap_s": 10},
                "lanes": {"source_fifo": True},
            },
            "deliver": {
                "handler": {"kind": "python", "target": "connector.cli.demo:deliver"},
                "queue_class": "default",
                "retry": {
                    "max_attempts": DELIVER_MAX_ATTEMPTS,
                    "backoff_base_s": 0.2,
                    "backoff_cap_s": 1,
                },
                "circuit_breaker": {"consecutive_failures": 5, "open_s": 10},
            },
        },
        "routes": [
            {
                "key": ROUTE_KEY,
                "verification": {
                    "preset": "standard-webhooks",
                    "secrets": [{"file": str(secret_file), "encoding": "whsec"}],
                },
                "idempotency_header": "webhook-id",
                "extract": {
                    "event_kind": {"pointer": "/type"},
                    "source_object_kind": {"const": "demo_object"},
                    "source_object_id": {"pointer": "/data/id"},
                },
                "required": ["source_object_id"],
                "fan_out": [{"work_type": "record"}, {"work_type": "deliver"}],
            }
        ],
    }


def body(object_id: str, *, fail_attempts: int = 0) -> bytes:
    """A demo delivery's body (``fail_attempts``: how many executions of ``deliver`` fail)."""
    doc: dict[str, Any] = {"type": "demo.created", "data": {"id": object_id}}
    if fail_attempts:
        doc["demo"] = {"fail_attempts": fail_attempts}
    return json.dumps(doc, separators=(",", ":")).encode()


def sign_standard_webhook(key: str, msg_id: str, timestamp: int, payload: bytes) -> str:
    """The ``webhook-signature`` header of Standard Webhooks for a ``whsec_`` key."""
    raw = base64.b64decode(key.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + payload
    return "v1," + base64.b64encode(hmac.new(raw, signed, hashlib.sha256).digest()).decode()


def headers(key: str, msg_id: str, timestamp: int, payload: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_standard_webhook(key, msg_id, timestamp, payload),
    }


def _work_id(ctx: Any) -> int:
    return int(getattr(getattr(ctx, "work_item", None), "work_id", 0) or getattr(ctx, "work_id", 0))


async def record(ctx: Any) -> None:
    """Demo handler: succeeds (logs the work item id, never the payload)."""
    log.debug("demo record executed", extra={"work_id": _work_id(ctx)})


class DemoTargetDown(Exception):
    """The pretend downstream system of ``deliver`` is down (asked for by the delivery's body)."""


def _fail_attempts(payload: bytes | None) -> int:
    if not payload:
        return 0
    try:
        doc = json.loads(payload)
        value = doc.get("demo", {}).get("fail_attempts", 0) if isinstance(doc, dict) else 0
        return max(0, int(value))
    except (ValueError, TypeError, AttributeError):
        return 0


async def deliver(ctx: Any) -> None:
    """Demo handler: a call to a pretend downstream system that fails the first
    ``demo.fail_attempts`` executions of the event (body field), then succeeds."""
    wanted = _fail_attempts(getattr(ctx, "payload", None))
    if not wanted:
        return
    event_id = int(getattr(ctx, "event_id", 0))
    done = _FAILURES.get(event_id, 0)
    if done >= wanted:
        _FAILURES.pop(event_id, None)
        return
    _FAILURES[event_id] = done + 1
    _FAILURES.move_to_end(event_id)
    while len(_FAILURES) > _FAILURES_MAX:
        _FAILURES.popitem(last=False)
    raise DemoTargetDown(
        f"the pretend downstream target is down (failure {done + 1} of {wanted} the body asked for)"
    )
