"""What a pack manifest may refer to, and the rules its references obey.

* The vocabulary: names (``NAME_PATTERN``), the fields a route may extract (``EXTRACTABLE``), the
  ones a request header may give (``HEADER_FIELDS``), correlation names, the default key templates.
* The template language (``{field}``, ``{/json/pointer}``, ``{header:Name}``; ``{{`` and ``}}`` are
  literal braces): ``template_references`` and ``template_syntax_errors``.
* The cross-reference rules, on the raw document (tolerant of parts that failed field validation):
  ``reference_errors`` (work types, extracted fields, templates, lanes, flow policies).

The manifest model (``connector.common.packs.manifest``) validates with these; the document parser
(``connector.common.packs.document``) reports them together with field errors. Nothing here imports
the model: the model depends on these rules, not the other way round.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

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

#: Default rate-limit key template (``RateLimit.key``): one budget for the whole work type.
DEFAULT_RATE_KEY = "{work_type}"

_NAME_RE = re.compile(NAME_PATTERN)
_CORRELATION_RE = re.compile(CORRELATION_NAME_PATTERN)
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")


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


def as_dict(value: Any) -> dict[str, Any]:
    """A part of the raw document when it is a mapping, else ``{}`` (a malformed part is skipped:
    its field error is reported by the model)."""
    return value if isinstance(value, dict) else {}


def route_label(index: int, route: Mapping[str, Any]) -> str:
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


def reference_errors(data: Mapping[str, Any]) -> list[str]:
    """Every cross-reference problem of a manifest document (work types, fields, templates, lanes).

    Works on the raw document so it can run even when some fields failed validation; a part that is
    malformed is skipped here (its field error is reported by the model)."""
    problems: list[str] = []
    work_types = as_dict(data.get("work_types"))
    for name in work_types:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            problems.append(f"work_types.{name}: invalid name (lowercase letters, digits, _.- ; 63 max)")
    used = {str(as_dict(spec).get("queue_class", "default")) for spec in work_types.values()}
    for qc in as_dict(data.get("queue_classes")):
        if qc not in used:
            problems.append(f"queue_classes.{qc}: no work type has this queue class; used: {sorted(used)}")
    routes = data.get("routes")
    if not isinstance(routes, list | tuple):
        return problems
    seen: dict[str, int] = {}
    for index, route in enumerate(routes):
        if not isinstance(route, dict):
            continue
        label = route_label(index, route)
        key = route.get("key")
        if isinstance(key, str):
            if key in seen:
                problems.append(f"{label}: duplicate route key (also routes[{seen[key]}])")
            else:
                seen[key] = index
        extract = as_dict(route.get("extract"))
        problems.extend(_extract_errors(label, extract))
        correlation = as_dict(route.get("correlation"))
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
                lanes = as_dict(work_types[wt_name]).get("lanes")
            problems.extend(_lane_errors(flabel, as_dict(lanes), extract))
            delay = fan.get("delay")
            if delay is None:
                delay = as_dict(work_types[wt_name]).get("delay")
            if as_dict(delay).get("run_after_field") is True and "run_after" not in extract:
                problems.append(f"{flabel}: delay.run_after_field needs extract.run_after")
            rate = fan.get("rate_limit")
            if rate is None:
                rate = as_dict(work_types[wt_name]).get("rate_limit")
            problems.extend(_key_errors(flabel, "rate_limit", as_dict(rate), extract))
            conc = fan.get("concurrency")
            if conc is None:
                conc = as_dict(work_types[wt_name]).get("concurrency")
            problems.extend(_key_errors(flabel, "concurrency", as_dict(conc), extract))
            deb = fan.get("debounce")
            if deb is None:
                deb = as_dict(work_types[wt_name]).get("debounce")
            problems.extend(_key_errors(flabel, "debounce", as_dict(deb), extract))
            problems.extend(_debounce_errors(flabel, as_dict(deb), as_dict(lanes), rate, conc))
            breaker = fan.get("circuit_breaker")
            if breaker is None:
                breaker = as_dict(work_types[wt_name]).get("circuit_breaker")
            if breaker is not None:
                problems.extend(_circuit_errors(flabel, as_dict(as_dict(work_types[wt_name]).get("handler"))))
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
