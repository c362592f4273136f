"""Materialization planning (pure): templates, header values from the receipt, required fields
failing closed, lane keys, and legacy-owned generations."""

from __future__ import annotations

import json
from typing import Any

import pytest

from connector.common.delivery.materialization import (
    NO_CLAIM_AUTHORITY,
    NO_ROUTE,
    PARSE_ERROR,
    REQUIRED_MISSING,
    EventDraft,
    Failure,
    ReceiptRow,
    compile_route,
    plan_receipt,
)
from connector.common.packs.document import parse_manifest
from connector.common.packs.routes import ActivePack, ActiveRoute

from .conftest import manifest, work_type


def _route(doc: dict[str, Any], *, claim_path: str | None = "work_item", phase: str | None = None) -> tuple:
    m = parse_manifest(doc)
    spec = m.routes[0]
    route = ActiveRoute(7, 3, spec.key, spec, {f.work_type: m.work_types[f.work_type] for f in spec.fan_out})
    phase = phase or "work_item_active"
    pack = ActivePack(1, m.name, m.namespace, 2, 5, claim_path, phase, {spec.key: route})
    return pack, route


def _receipt(payload: Any, **overrides: Any) -> ReceiptRow:
    raw = payload if isinstance(payload, bytes) or payload is None else json.dumps(payload).encode()
    base: dict[str, Any] = {
        "receipt_id": 11, "claim_token": 1, "attempts": 1, "namespace": "shop", "route_key": "orders",
        "idempotency_key": "k", "event_kind": None, "provider_delivery_id": None, "correlation_ids": {},
        "payload_sha256": b"\x00", "body": raw, "has_body_ref": False,
    }  # fmt: skip
    base.update(overrides)
    return ReceiptRow(**base)


def _plan(doc: dict[str, Any], payload: Any, **receipt: Any) -> EventDraft | Failure:
    pack, route = _route(doc)
    return plan_receipt(_receipt(payload, **receipt), pack, route, compile_route(route))


def test_extraction_templates_and_correlation() -> None:
    doc = manifest(
        routes=[
            {
                "key": "orders",
                "verification": {"scheme": "none"},
                "extract": {
                    "event_kind": {"template": "{/type}.v{/v}"},
                    "source_object_kind": {"const": "order"},
                    "source_object_id": {"pointer": "/data/id"},
                    "target_lane_key": {"template": "{{acct}}:{source_object_kind}:{/data/account}"},
                },
                "required": ["source_object_id", "event_kind"],
                "correlation": {"req": {"pointer": "/req"}, "trace": {"header": "X-Trace"}},
                "fan_out": [{"work_type": "sync"}],
            }
        ]
    )
    plan = _plan(
        doc,
        {"type": "order.paid", "v": 2, "data": {"id": 42, "account": "A1"}, "req": "r-1"},
        correlation_ids={"trace": "t-9"},
    )
    assert isinstance(plan, EventDraft)
    extracted = (plan.event_kind, plan.source_object_kind, plan.source_object_id)
    assert extracted == ("order.paid.v2", "order", "42")
    assert plan.companion == {"source_object_id": "42", "event_kind": "order.paid.v2"}
    # header-based correlation comes from what the ingress stored; body-based is re-read.
    assert plan.correlation_ids == {"trace": "t-9", "req": "r-1"}


def test_header_fields_come_from_the_receipt() -> None:
    doc = manifest(
        routes=[
            {
                "key": "orders",
                "verification": {"scheme": "none"},
                "extract": {"event_kind": {"header": "X-Event"}, "source_object_id": {"pointer": "/id"}},
                "fan_out": [{"work_type": "sync"}],
            }
        ]
    )
    plan = _plan(doc, {"id": "x"}, event_kind="from-ingress")
    assert isinstance(plan, EventDraft) and plan.event_kind == "from-ingress"


def test_required_field_missing_fails_closed_without_payload_text() -> None:
    plan = _plan(manifest(), {"type": "t", "data": {"id": {"nested": "SECRET-VALUE"}}})
    assert isinstance(plan, Failure) and plan.error_class == REQUIRED_MISSING and plan.permanent
    assert "source_object_id" in plan.summary and "SECRET" not in plan.summary


def test_invalid_json_is_a_parse_error() -> None:
    plan = _plan(manifest(), b"{not json SECRET")
    assert isinstance(plan, Failure) and plan.error_class == PARSE_ERROR and "SECRET" not in plan.summary


def test_source_lane_key_default_and_missing_parts() -> None:
    doc = manifest(work_types={"sync": work_type(lanes={"source_fifo": True})})
    plan = _plan(doc, {"type": "t", "data": {"id": "7"}})
    assert isinstance(plan, EventDraft)
    assert plan.work[0].source_lane_key == "sync:order:7" and plan.work[0].target_lane_key is None
    doc = manifest(
        work_types={"sync": work_type(lanes={"source_fifo": True, "source_lane_key": "{work_type}:{/acct}"})}
    )
    plan = _plan(doc, {"type": "t", "data": {"id": "7"}})
    assert isinstance(plan, Failure) and plan.error_class == REQUIRED_MISSING


@pytest.mark.parametrize(
    ("pack_kw", "error"),
    [({"claim_path": None}, NO_CLAIM_AUTHORITY)],
)
def test_generation_without_claim_authority_is_not_materialized(pack_kw: dict, error: str) -> None:
    pack, route = _route(manifest(), **pack_kw)
    plan = plan_receipt(_receipt({"data": {"id": 1}}), pack, route, compile_route(route))
    assert isinstance(plan, Failure) and plan.error_class == error and not plan.permanent


def test_unknown_route_is_permanent_no_route() -> None:
    plan = plan_receipt(_receipt({}), None, None, None)
    assert isinstance(plan, Failure) and plan.error_class == NO_ROUTE and plan.permanent


def test_legacy_owned_generation_gets_no_work_items() -> None:
    pack, route = _route(manifest(), claim_path="legacy_event", phase="legacy_active")
    plan = plan_receipt(_receipt({"type": "t", "data": {"id": 1}}), pack, route, compile_route(route))
    assert isinstance(plan, EventDraft) and plan.legacy_owned and plan.work == ()


def test_rate_limit_key_default_template_override_and_missing_parts() -> None:
    """The default key is the work type (one budget for it); a template over extracted values
    makes one key per value; a route's fan-out entry replaces the work type's limit; a key that
    cannot be formed fails closed like a lane key (no payload text)."""
    rate = {"limit": 10, "period_s": 1.0}
    plan = _plan(
        manifest(work_types={"sync": work_type(rate_limit=rate)}), {"type": "t", "data": {"id": "7"}}
    )
    assert isinstance(plan, EventDraft)
    assert plan.work[0].rate_key == "sync" and plan.work[0].rate_limit is not None
    assert plan.work[0].rate_limit.limit == 10 and plan.work[0].rate_limit.burst == 1
    keyed = {**rate, "key": "acct:{/acct}"}
    doc = manifest(work_types={"sync": work_type(rate_limit=keyed)})
    plan = _plan(doc, {"type": "t", "data": {"id": "7"}, "acct": "A1"})
    assert isinstance(plan, EventDraft) and plan.work[0].rate_key == "acct:A1"
    plan = _plan(doc, {"type": "t", "data": {"id": "7"}, "nope": "SECRET"})
    assert isinstance(plan, Failure) and plan.error_class == REQUIRED_MISSING
    assert "rate limit key" in plan.summary and "SECRET" not in plan.summary
    doc = manifest(work_types={"sync": work_type(rate_limit=keyed)})
    doc["routes"][0]["fan_out"] = [
        {"work_type": "sync", "rate_limit": {"limit": 3, "period_s": 60, "burst": 2}}
    ]
    plan = _plan(doc, {"type": "t", "data": {"id": "7"}})
    assert isinstance(plan, EventDraft) and plan.work[0].rate_key == "sync"
    assert plan.work[0].rate_limit is not None and plan.work[0].rate_limit.limit == 3
    plan = _plan(manifest(), {"type": "t", "data": {"id": "7"}})
    assert isinstance(plan, EventDraft) and plan.work[0].rate_key is None


def test_circuit_key_is_the_handler_target_without_secrets() -> None:
    """The circuit key is the handler target's scheme and host:port (never user info, path or
    query); work types calling one host share it; a route's override changes the policy, not the
    circuit; no breaker: no key."""
    url = "https://user:s3cret@CRM.internal/hooks/sync?token=abc"
    wt = {"handler": {"kind": "http", "target": url}, "circuit_breaker": {"consecutive_failures": 3}}
    other = {"handler": {"kind": "http", "target": "https://crm.internal:443/notes"}, "circuit_breaker": {}}
    doc = manifest(work_types={"sync": wt, "notes": other, "plain": work_type()})
    doc["routes"][0]["fan_out"] = [
        {"work_type": "sync"},
        {"work_type": "notes", "circuit_breaker": {"consecutive_failures": 9, "open_s": 5}},
        {"work_type": "plain"},
    ]
    plan = _plan(doc, {"type": "t", "data": {"id": "7"}})
    assert isinstance(plan, EventDraft)
    sync, notes, plain = plan.work
    assert sync.circuit_key == notes.circuit_key == "https://crm.internal:443"
    assert sync.circuit is not None and sync.circuit.consecutive_failures == 3
    assert notes.circuit is not None and (notes.circuit.consecutive_failures, notes.circuit.open_s) == (9, 5)
    assert plain.circuit_key is None and plain.circuit is None
    assert "s3cret" not in str(plan.work) and "token" not in str(sync.circuit_key)
