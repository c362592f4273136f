"""The demo pack used by ``connector up``: one route signed with Standard Webhooks, one handler."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("connector.demo")

PACK_NAME = "demo"
NAMESPACE = "demo"
ROUTE_KEY = "events"

EXECUTED: list[int] = []


def manifest(secret_file: Path) -> dict[str, Any]:
    """The demo manifest: Standard Webhooks verification with a per-installation secret file."""
    return {
        "name": PACK_NAME,
        "namespace": NAMESPACE,
        "description": "Demo pack installed by `connector up`.",
        "work_types": {
            "record": {
                "handler": {"kind": "python", "target": "connector.cli.demo:record"},
                "queue_class": "default",
                "retry": {"max_attempts": 5, "backoff_base_s": 0.5, "backoff_cap_s": 10},
                "lanes": {"source_fifo": True},
            }
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
                "fan_out": [{"work_type": "record"}],
            }
        ],
    }


async def record(ctx: Any) -> None:
    """Demo handler: records that the work item ran (ids and the W3C trace context it was given,
    never the payload)."""
    work_id = int(getattr(getattr(ctx, "work_item", None), "work_id", 0) or getattr(ctx, "work_id", 0))
    EXECUTED.append(work_id)
    log.info(
        "demo handler executed work item",
        extra={"work_id": work_id, "traceparent": getattr(ctx, "traceparent", None)},
    )
