"""The one extraction language (pure): RFC 6901 pointers, scalar rules, templates, header values,
dependency order — and the ingress envelope and the materializer's route compiler agreeing on it."""

from __future__ import annotations

import json
from typing import Any

from connector.common.delivery.materialization import EventDraft, ReceiptRow, compile_route, plan_receipt
from connector.common.packs.document import parse_manifest
from connector.common.packs.extraction import (
    Context,
    compile_template,
    compile_value,
    dependency_order,
    reads_body,
    references,
)
from connector.common.packs.jsonvalues import MAX_VALUE_CHARS, pointer_tokens, resolve_tokens, scalar_text
from connector.common.packs.manifest import ValueSpec
from connector.common.packs.routes import ActivePack, ActiveRoute
from connector.ingress.envelope import Envelope


def test_pointers_follow_rfc6901() -> None:
    doc = {"a/b": {"m~n": [10, {"x": True}]}, "": 1}
    assert resolve_tokens(doc, pointer_tokens("/a~1b/m~0n/0")) == 10
    assert resolve_tokens(doc, pointer_tokens("/a~1b/m~0n/1/x")) is True
    assert resolve_tokens(doc, pointer_tokens("/")) == 1
    assert resolve_tokens(doc, pointer_tokens("/a~1b/m~0n/01")) is None  # no leading zeros
    assert resolve_tokens(doc, pointer_tokens("/a~1b/m~0n/2")) is None
    assert resolve_tokens(doc, pointer_tokens("/missing/x")) is None
    assert resolve_tokens(doc, pointer_tokens("")) is doc


def test_scalars_become_text_and_everything_else_is_no_value() -> None:
    assert [scalar_text(v) for v in ("a", 12, 1.5, True, False)] == ["a", "12", "1.5", "true", "false"]
    assert [scalar_text(v) for v in (None, {}, [], "", "a\nb", "x" * 513)] == [None] * 6


def _spec(**kw: Any) -> ValueSpec:
    return ValueSpec.model_validate(kw)


def test_templates_render_literals_escapes_and_references() -> None:
    ctx = Context({"a": {"b": 7}, "s": "x"}, header={"X-K": "hv"}.get)
    ctx.values["source_object_kind"] = "order"
    render = compile_value(_spec(template="{{lit}}:{source_object_kind}:{/a/b}:{header:X-K}"))
    assert render(ctx) == "{lit}:order:7:hv"
    assert references("{{lit}}:{source_object_kind}:{/a/b}:{header:X-K}") == [
        "source_object_kind", "/a/b", "header:X-K",
    ]  # fmt: skip
    # A reference without a value makes the whole template no value (never a partial key).
    assert compile_value(_spec(template="{/missing}:{/s}"))(ctx) is None
    # Bounded templates are scalar text; lane keys (unbounded) keep their length for their own rule.
    ctx.values["source_object_id"] = "y" * MAX_VALUE_CHARS
    assert compile_value(_spec(template="{source_object_id}z"))(ctx) is None
    assert compile_template("{source_object_id}z", bounded=False)(ctx) == "y" * MAX_VALUE_CHARS + "z"


def test_work_type_and_header_values() -> None:
    ctx = Context(None, header={"X-Event": "e1", "X-Bad": "a\nb"}.get)
    assert compile_template("{work_type}:k", bounded=False)(ctx) is None
    ctx.work_type = "sync"
    assert compile_template("{work_type}:k", bounded=False)(ctx) == "sync:k"
    assert compile_value(_spec(header="X-Event"))(ctx) == "e1"
    assert compile_value(_spec(header="X-Bad"))(ctx) is None  # not printable: no value
    assert compile_value(_spec(header="X-None"))(ctx) is None
    assert compile_value(_spec(const="12"))(ctx) == "12"


def test_stored_values_stand_in_for_headers() -> None:
    ctx = Context({"id": 1})  # no headers (the materializer)
    stored = lambda c: "from-receipt"  # noqa: E731
    assert compile_value(_spec(header="X-Event"), stored)(ctx) == "from-receipt"
    assert compile_value(_spec(template="{header:X-Event}.{/id}"), stored)(ctx) == "from-receipt"
    assert compile_value(_spec(header="X-Event"))(ctx) is None
    assert compile_value(_spec(pointer="/id"), stored)(ctx) == "1"  # stored only replaces headers


def test_reads_body() -> None:
    assert reads_body(_spec(pointer="/a"))
    assert reads_body(_spec(template="k:{/a}"))
    assert not reads_body(_spec(template="k:{header:X}"))
    assert not reads_body(_spec(header="X"))
    assert not reads_body(_spec(const="c"))


def test_dependency_order_puts_referenced_fields_first_and_limits_to_roots() -> None:
    specs = {
        "event_kind": _spec(template="{source_object_kind}.{source_object_id}"),
        "source_object_kind": _spec(template="k-{target_lane_key}"),
        "source_object_id": _spec(pointer="/id"),
        "target_lane_key": _spec(const="t"),
        "delivery_id": _spec(pointer="/d"),
    }
    order = dependency_order(specs)
    assert sorted(order) == sorted(specs)
    assert order.index("target_lane_key") < order.index("source_object_kind") < order.index("event_kind")
    assert order.index("source_object_id") < order.index("event_kind")
    only = dependency_order(specs, ["event_kind", "not_a_field"])
    assert set(only) == {"event_kind", "source_object_kind", "source_object_id", "target_lane_key"}
    assert only.index("source_object_kind") < only.index("event_kind")


def test_envelope_evaluates_only_what_it_needs() -> None:
    extract = {
        "event_kind": _spec(template="{source_object_kind}.created"),
        "source_object_kind": _spec(const="order"),
        "source_object_id": _spec(pointer="/data/id"),  # not part of the envelope
    }
    envelope = Envelope(extract, {})
    assert not envelope.reads_body and not envelope.empty
    assert envelope({}.get, None) == ("order.created", None, {})
    assert Envelope({"source_object_id": _spec(pointer="/id")}, {}).empty


def test_ingress_envelope_and_materializer_agree() -> None:
    """One route spec evaluated at ingress (headers at hand) and by the materializer (the receipt the
    ingress stored): the same event kind, delivery id and correlation ids."""
    doc = {
        "name": "shop",
        "namespace": "shop",
        "work_types": {"sync": {"handler": {"kind": "python", "target": "tests.noop:handle"}}},
        "routes": [
            {
                "key": "orders",
                "verification": {"scheme": "none"},
                "extract": {
                    "event_kind": {"template": "{/type}.{header:X-Version}"},
                    "delivery_id": {"header": "X-Delivery"},
                    "source_object_kind": {"const": "order"},
                    "source_object_id": {"template": "{source_object_kind}-{/data/id}"},
                },
                "required": ["source_object_id"],
                "correlation": {
                    "req": {"pointer": "/req"},
                    "trace": {"header": "X-Trace"},
                    "obj": {"template": "{source_object_id}@{/data/acct}"},
                },
                "fan_out": [{"work_type": "sync"}],
            }
        ],
    }
    m = parse_manifest(doc)
    spec = m.routes[0]
    body = {"type": "order.paid", "data": {"id": 42, "acct": "A1"}, "req": "r-1"}
    headers = {"X-Version": "v2", "X-Delivery": "d-7", "X-Trace": "t-9"}
    envelope = Envelope(spec.extract, spec.correlation)
    assert envelope.reads_body
    kind, delivery, ids = envelope(headers.get, body)
    assert (kind, delivery) == ("order.paid.v2", "d-7")
    assert ids == {"req": "r-1", "trace": "t-9", "obj": "order-42@A1"}

    route = ActiveRoute(7, 3, spec.key, spec, {f.work_type: m.work_types[f.work_type] for f in spec.fan_out})
    pack = ActivePack(1, m.name, m.namespace, 2, 5, "work_item", "work_item_active", {spec.key: route})
    receipt = ReceiptRow(
        receipt_id=11, claim_token=1, attempts=1, namespace=m.namespace, route_key="orders",
        idempotency_key="k", event_kind=kind, provider_delivery_id=delivery, correlation_ids=ids,
        payload_sha256=b"\x00", body=json.dumps(body).encode(), has_body_ref=False,
    )  # fmt: skip
    plan = plan_receipt(receipt, pack, route, compile_route(route))
    assert isinstance(plan, EventDraft)
    assert plan.event_kind == kind
    assert plan.correlation_ids == ids
    assert plan.source_object_id == "order-42"
