"""A route's redelivery contract, reconciliation and expected traffic in the manifest
(docs/reconcile.md): the documented Stripe- and GitHub-shaped examples parse, every refusal names its
path, presets resolve as data, and a route without the new fields dumps (and hashes) as before."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from connector.common.packs.document import ManifestError, parse_manifest
from connector.common.packs.manifest import sha256_hex
from connector.common.packs.reconcile import REDELIVERY_PRESETS, parse_duration

DOC = Path(__file__).resolve().parents[2] / "docs" / "reconcile.md"


def _doc_routes() -> list[dict[str, Any]]:
    """The YAML blocks of docs/reconcile.md that declare routes."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    routes = []
    for block in blocks:
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and "routes" in doc:
            routes.extend(doc["routes"])
    return routes


def _manifest(*routes: dict[str, Any]) -> dict[str, Any]:
    work_types = {
        wt: {"handler": {"kind": "python", "target": "m:f"}}
        for r in routes
        for wt in [f["work_type"] for f in r.get("fan_out", [{"work_type": "sync"}])]
    }
    return {
        "name": "p",
        "namespace": "ns",
        "work_types": work_types or {"sync": {"handler": {"kind": "python", "target": "m:f"}}},
        "routes": [{"fan_out": [{"work_type": "sync"}], **r} for r in routes],
    }


def _errors(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_manifest(doc)
    return info.value.errors


STRIPE: dict[str, Any] = {
    "key": "events",
    "verification": {"preset": "stripe", "secrets": [{"env": "S"}]},
    "extract": {"delivery_id": {"pointer": "/id"}},
    "reconcile": {
        "mode": "pull",
        "window": "30d",
        "list": {
            "url": "https://api.stripe.com/v1/events",
            "query": {"starting_after": "{cursor}"},
            "headers": {"Authorization": {"secret": {"env": "K"}, "template": "Bearer {secret}"}},
        },
        "items": "/data",
        "item": {"id": "/id", "occurred_at": "/created", "body": ""},
        "paging": {"cursor": "/id", "has_more": "/has_more"},
    },
}


def test_the_documented_examples_parse() -> None:
    routes = _doc_routes()
    assert {r["key"] for r in routes} >= {"events", "push"}
    manifest = parse_manifest(_manifest(*routes))
    by_key = {r.key: r for r in manifest.routes}
    stripe, github = by_key["events"].reconcile, by_key["push"].reconcile
    assert (
        stripe is not None
        and stripe.mode == "pull"
        and stripe.window == 30 * 86400
        and stripe.interval == 300
    )
    assert github is not None and github.mode == "redeliver" and github.paging.link == "next"


def test_every_refusal_names_its_path() -> None:
    bad = {
        **STRIPE,
        "extract": {},
        "redelivery": {"mode": "provider_retries"},
        "reconcile": {
            **STRIPE["reconcile"],
            "interval": "20d",
            "list": {
                "url": "http://api.stripe.com/v1/events",
                "query": {"x": "{nope}"},
                "headers": {"Authorization": "Bearer sk_live_inline"},
            },
            "item": {"id": "id", "occurred_at": "/created"},
        },
    }
    errors = _errors(_manifest(bad))
    expected = [
        "routes[0:events].redelivery: provider_retries needs `for`",
        "routes[0:events].reconcile: the route needs a delivery id",
        "routes[0:events].reconcile.list.url: http is accepted for loopback hosts only",
        "routes[0:events].reconcile.list.query.x: {nope} is not known here",
        "routes[0:events].reconcile.list.headers.Authorization: a credential header takes a secret reference",
        "routes[0:events].reconcile.paging.cursor: needs {cursor}",
        "routes[0:events].reconcile.item.id: a JSON pointer starts with '/'",
        "routes[0:events].reconcile: mode pull needs exactly one of item.body",
        "routes[0:events].reconcile: interval (1728000 s) must be shorter than half the window",
    ]
    for prefix in expected:
        assert any(e.startswith(prefix) for e in errors), (prefix, errors)
    assert len(errors) == len(expected), errors
    assert not any("sk_live_inline" in e for e in errors)  # a value is never echoed
    # Control: the valid route gives none of them.
    parse_manifest(_manifest(STRIPE))


def test_redeliver_mode_needs_its_request_and_unknown_presets_are_named() -> None:
    route = {
        **STRIPE,
        "redelivery": {"preset": "nope"},
        "reconcile": {**STRIPE["reconcile"], "mode": "redeliver"},
    }
    errors = _errors(_manifest(route))
    assert any("redelivery: unknown preset 'nope'" in e for e in errors), errors
    assert any("mode redeliver needs redeliver" in e for e in errors), errors


def test_redelivery_shorthand_presets_and_durations() -> None:
    manifest = parse_manifest(
        _manifest({**STRIPE, "redelivery": "none", "expect": {"at_least": 3, "per": "6h"}})
    )
    route = manifest.routes[0]
    assert route.redelivery is not None and route.redelivery.mode == "none"
    assert route.expect is not None and (route.expect.at_least, route.expect.per) == (3, "6h")
    assert [parse_duration(v) for v in ("90", "90s", "30m", "4h", "3d", 7)] == [
        90,
        90,
        1800,
        14400,
        259200,
        7,
    ]
    with pytest.raises(ValueError):
        parse_duration("three days")
    assert REDELIVERY_PRESETS["shopify"] == {"mode": "provider_retries", "for_s": 4 * 3600.0}


def test_a_route_without_the_new_fields_dumps_and_hashes_as_before() -> None:
    plain = {"key": "orders", "verification": {"scheme": "none"}, "fan_out": [{"work_type": "sync"}]}
    route = parse_manifest(_manifest(plain)).routes[0]
    dumped = route.model_dump(mode="json")
    # Exactly the fields a route had before these existed, so its config hash (route version) is kept.
    assert set(dumped) == {
        "key", "method", "verification", "content", "idempotency_header", "extract", "required",
        "correlation", "fan_out", "response",
    }  # fmt: skip
    # Control: a route that declares one dumps it, and hashes differently.
    with_contract = (
        parse_manifest(_manifest({**plain, "redelivery": "none"})).routes[0].model_dump(mode="json")
    )
    assert with_contract["redelivery"] == {"preset": None, "mode": "none", "for_s": None}
    assert sha256_hex(with_contract) != sha256_hex(dumped)
