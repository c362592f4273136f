"""Manifest validation lists every error at once (field, reference and verification errors), and the
documented examples are valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connector.common.packs.document import ManifestError, parse_manifest
from connector.common.packs.manifest import Manifest

from .conftest import manifest, work_type

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "packs"

BROKEN = """
name: Bad Name
namespace: shop
work_types:
  sync:
    handler: {kind: python, target: "m:f"}
    queue_class: UPPER
    lanes: {source_fifo: true}
routes:
  - key: orders
    verification: {preset: nope}
    extract:
      source_object_id: {header: X-Id}
      event_kind: {template: "{/type}-{source_object_kind}"}
      bogus: {pointer: /x}
    required: [target_lane_key]
    fan_out: [{work_type: sync}, {work_type: missing}, {work_type: sync}]
  - key: orders
    verification: {scheme: none}
    fan_out: []
"""


def _errors(doc: object) -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_manifest(doc)  # type: ignore[arg-type]
    return info.value.errors


def test_field_reference_and_verification_errors_are_reported_together() -> None:
    errors = _errors(BROKEN)
    expected = [
        "name: String should match pattern",  # field error
        "work_types.sync.queue_class: String should match pattern",  # field error, nested
        "routes[0:orders].extract: unknown extract fields ['bogus']",  # field validator
        "routes[1:orders].fan_out: Tuple should have at least 1 item",  # field error, second route
        "routes[0:orders].extract.source_object_id: header values are not kept on the receipt",
        "routes[0:orders].extract.event_kind: {source_object_kind} is not extracted by this route",
        "routes[0:orders].required: 'target_lane_key' is not extracted",
        "routes[0:orders].fan_out: work type 'sync' appears twice",
        "routes[0:orders].fan_out[1:missing]: unknown work type 'missing'",
        "routes[1:orders]: duplicate route key",
        "routes[0:orders].verification: unknown preset 'nope'",
    ]
    for prefix in expected:
        assert any(e.startswith(prefix) for e in errors), (prefix, errors)
    assert len(errors) == len(set(errors)), "no duplicate messages"
    # The spurious "routes: too short" pydantic adds for a non-empty list is filtered out.
    assert not any(e.startswith("routes: ") for e in errors)


def test_valid_model_still_enforces_references_on_plain_validation() -> None:
    doc = manifest(routes=[{"key": "r", "verification": {"scheme": "none"}, "fan_out": [{"work_type": "x"}]}])
    with pytest.raises(ValueError, match="unknown work type 'x'"):
        Manifest.model_validate(doc)


@pytest.mark.parametrize(
    ("extract", "message"),
    [
        ({"target_lane_key": {"template": "{header:X-Target}"}}, "header values are not kept"),
        ({"event_kind": {"template": "{event_kind}-x"}}, "template refers to itself"),
        ({"event_kind": {"template": "{nope}"}}, "{nope} is not a known field"),
        ({"event_kind": {"template": "{/a"}}, "unbalanced brace"),
        ({"event_kind": {"pointer": "a/b"}}, "a JSON pointer starts with '/'"),
        ({"event_kind": {"pointer": "/a", "const": "x"}}, "give exactly one of"),
    ],
)
def test_extraction_rules(extract: dict, message: str) -> None:
    route = {"key": "r", "verification": {"scheme": "none"}, "extract": extract}
    doc = manifest(routes=[{**route, "fan_out": [{"work_type": "sync"}]}])
    assert any(message in e for e in _errors(doc)), _errors(doc)


def test_header_specs_are_accepted_where_the_receipt_keeps_the_value() -> None:
    doc = manifest(
        routes=[
            {
                "key": "r",
                "verification": {"scheme": "none"},
                "extract": {
                    "event_kind": {"header": "X-Event"},
                    "delivery_id": {"template": "{header:X-Delivery}"},
                },
                "correlation": {"trace": {"header": "X-Trace"}},
                "fan_out": [{"work_type": "sync"}],
            }
        ]
    )
    parse_manifest(doc)


def test_lane_policies_need_their_keys() -> None:
    doc = manifest(
        work_types={"sync": work_type(lanes={"source_fifo": True, "target_serialization": True})},
        routes=[
            {
                "key": "r",
                "verification": {"scheme": "none"},
                "extract": {"source_object_id": {"pointer": "/id"}},
                "fan_out": [{"work_type": "sync"}],
            }
        ],
    )
    errors = _errors(doc)
    assert any("target_serialization needs extract.target_lane_key" in e for e in errors)
    assert any("{source_object_kind} is not extracted" in e for e in errors)


def test_duplicate_yaml_keys_are_refused() -> None:
    text = "name: a\nname: b\nnamespace: x\nwork_types: {}\nroutes: []\n"
    assert any("duplicate key 'name'" in e for e in _errors(text))


def test_json_documents_parse() -> None:
    assert parse_manifest(json.dumps(manifest())).name == "shop"


def test_retry_cap_below_base_is_refused() -> None:
    doc = manifest(work_types={"sync": work_type(retry={"backoff_base_s": 10, "backoff_cap_s": 1})})
    assert any("backoff_cap_s must be >= backoff_base_s" in e for e in _errors(doc))


def test_documented_examples_are_valid() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert len(files) >= 2, "examples/packs must hold the full example and the demo pack"
    for path in files:
        parsed = parse_manifest(path.read_text())
        assert parsed.routes, path


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ({"limit": 0, "period_s": 1}, "greater than or equal to 1"),
        ({"limit": 5, "period_s": 0}, "greater than 0"),
        ({"limit": 5, "period_s": 1, "burst": 6}, "burst must be <= limit"),
        ({"limit": 5, "period_s": 1, "key": "{/acct"}, "unbalanced brace"),
        ({"limit": 5, "period_s": 1, "key": "{header:X-Acct}"}, "rate_limit.key cannot use headers"),
        ({"limit": 5, "period_s": 1, "key": "{target_lane_key}"}, "{target_lane_key} is not extracted"),
        ({"limit": 5, "period_s": 1, "key": "{nope}"}, "{nope} is not a known field"),
        ({"per": 5}, "Field required"),
    ],
)
def test_rate_limits_are_validated(rate: dict, message: str) -> None:
    errors = _errors(manifest(work_types={"sync": work_type(rate_limit=rate)}))
    assert any(message in e for e in errors), errors
    # The same rules on a route's override.
    doc = manifest()
    doc["routes"][0]["fan_out"] = [{"work_type": "sync", "rate_limit": rate}]
    assert any(message in e for e in _errors(doc)), _errors(doc)


def test_rate_limit_keys_may_use_extracted_fields_and_the_work_type() -> None:
    doc = manifest(
        work_types={"sync": work_type(rate_limit={"limit": 5, "period_s": 1, "key": "{work_type}:{/acct}"})}
    )
    m = parse_manifest(doc)
    assert m.work_types["sync"].rate_limit is not None
    assert m.work_types["sync"].rate_limit.key == "{work_type}:{/acct}"


@pytest.mark.parametrize(
    ("deb", "message"),
    [
        ({"window_s": 0}, "greater than 0"),
        ({"window_s": 5, "max_wait_s": 2}, "max_wait_s must be >= window_s"),
        ({"window_s": 100_000}, "less than or equal to 86400"),
        ({"window_s": 1, "key": "{/acct"}, "unbalanced brace"),
        ({"window_s": 1, "key": "{header:X-Acct}"}, "debounce.key cannot use headers"),
        ({"window_s": 1, "key": "{target_lane_key}"}, "{target_lane_key} is not extracted"),
        ({"key": "{/acct}"}, "Field required"),
    ],
)
def test_debounce_is_validated(deb: dict, message: str) -> None:
    errors = _errors(manifest(work_types={"sync": work_type(debounce=deb)}))
    assert any(message in e for e in errors), errors
    doc = manifest()
    doc["routes"][0]["fan_out"] = [{"work_type": "sync", "debounce": deb}]
    assert any(message in e for e in _errors(doc)), _errors(doc)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"lanes": {"source_fifo": True, "source_lane_key": "{/obj}"}}, "cannot be combined with lanes"),
        ({"lanes": {"target_serialization": True}}, "cannot be combined with lanes"),
        ({"rate_limit": {"limit": 5, "period_s": 1}}, "cannot be combined with rate_limit"),
        ({"concurrency": {"limit": 2}}, "cannot be combined with concurrency"),
    ],
)
def test_debounce_refuses_lanes_and_limits_after_the_route_override(extra: dict, message: str) -> None:
    """The rule (docs/packs.md#debounce): coalescing runs a later event in place of earlier ones, so
    in a lane it would reorder the lane; refused on the work type and on a route's fan-out entry."""
    deb = {"window_s": 1, "key": "{/acct}"}
    doc = manifest(work_types={"sync": work_type(debounce=deb, **extra)})
    doc["routes"][0]["extract"]["target_lane_key"] = {"pointer": "/t"}
    assert any(message in e for e in _errors(doc)), _errors(doc)
    # A route that adds the debounce to a laned work type, or the lane to a debounced one.
    doc = manifest(work_types={"sync": work_type(**extra)})
    doc["routes"][0]["extract"]["target_lane_key"] = {"pointer": "/t"}
    doc["routes"][0]["fan_out"] = [{"work_type": "sync", "debounce": deb}]
    assert any(message in e for e in _errors(doc)), _errors(doc)
    if "lanes" in extra:
        doc = manifest(work_types={"sync": work_type(debounce=deb)})
        doc["routes"][0]["extract"]["target_lane_key"] = {"pointer": "/t"}
        doc["routes"][0]["fan_out"] = [{"work_type": "sync", "lanes": extra["lanes"]}]
        assert any(message in e for e in _errors(doc)), _errors(doc)
        # ... and a route override without the lane makes it valid again.
        doc = manifest(work_types={"sync": work_type(**extra)})
        doc["routes"][0]["extract"]["target_lane_key"] = {"pointer": "/t"}
        doc["routes"][0]["fan_out"] = [{"work_type": "sync", "lanes": {}, "debounce": deb}]
        parse_manifest(doc)


def test_debounce_defaults() -> None:
    m = parse_manifest(manifest(work_types={"sync": work_type(debounce={"window_s": 2})}))
    deb = m.work_types["sync"].debounce
    assert deb is not None and deb.key == "{work_type}" and deb.max_wait == 20
    m = parse_manifest(manifest(work_types={"sync": work_type(debounce={"window_s": 50_000})}))
    assert m.work_types["sync"].debounce is not None and m.work_types["sync"].debounce.max_wait == 86_400


@pytest.mark.parametrize(
    ("breaker", "handler", "message"),
    [
        ({"consecutive_failures": 0}, None, "a breaker that can never open"),
        ({"failure_ratio": 1.5}, None, "less than or equal to 1"),
        ({"open_s": 0}, None, "greater than 0"),
        ({"half_open_probes": 0}, None, "greater than or equal to 1"),
        ({"nope": 1}, None, "Extra inputs are not permitted"),
        ({}, {"kind": "http", "target": "crm.internal/hooks"}, "needs an http(s) handler target with a host"),
        ({"consecutive_failures": 3}, None, None),
    ],
)
def test_circuit_breakers_are_validated(breaker: dict, handler: dict | None, message: str | None) -> None:
    """docs/packs.md, "Circuit breakers": the policy's bounds, a trigger that can fire, an HTTP target
    with a host (the circuit's key); the same rules on a route's override."""
    wt = work_type(circuit_breaker=breaker, **({"handler": handler} if handler else {}))
    if message is None:
        parsed = parse_manifest(manifest(work_types={"sync": wt}))
        assert parsed.work_types["sync"].circuit_breaker is not None
        return
    errors = _errors(manifest(work_types={"sync": wt}))
    assert any(message in e for e in errors), errors
    doc = manifest(work_types={"sync": work_type(**({"handler": handler} if handler else {}))})
    doc["routes"][0]["fan_out"] = [{"work_type": "sync", "circuit_breaker": breaker}]
    assert any(message in e for e in _errors(doc)), _errors(doc)


def test_circuit_breakers_are_not_combined_with_debounce() -> None:
    doc = manifest(work_types={"sync": work_type(debounce={"window_s": 1}, circuit_breaker={})})
    assert any("circuit_breaker cannot be combined with debounce" in e for e in _errors(doc))
