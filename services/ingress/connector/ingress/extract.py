"""Receipt-envelope values taken at ingress: event kind, provider delivery id, correlation ids.

Headers exist only while the ingress handles the request, so the ingress keeps exactly these three
facts on the receipt (docs/packs.md, "Extraction"); the materializer reads header-derived values
from the receipt and evaluates everything else against the body itself. The rules match the
materializer's (``connector.materializer.extract``): a ``ValueSpec`` is a pointer (RFC 6901), a
header, a constant, or a template of literals, ``{{``/``}}`` escapes and references (``{/pointer}``,
``{header:Name}``, another extracted field); values are scalars rendered as text (numbers as JSON
writes them, ``true``/``false``), printable and at most ``MAX_VALUE_CHARS`` long — anything else is
*no value*. Extraction never raises.

Specs are compiled once per route; only the fields the envelope needs (and those their templates
refer to) are evaluated per delivery, in dependency order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from connector.common.jsonvalues import pointer_tokens, resolve_tokens, scalar_text
from connector.common.packs import ValueSpec

#: Longest envelope value kept (same bound as the materializer's).
#: Extracted fields the ingress stores on the receipt.
ENVELOPE_FIELDS = ("event_kind", "delivery_id")

_PIECE_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")

HeaderGet = Callable[[str], str | None]
Getter = Callable[[HeaderGet, Any, Mapping[str, str | None]], str | None]


def references(template: str) -> list[str]:
    return [m.group(1) for m in _PIECE_RE.finditer(template) if m.group(1) is not None]


def _ref_getter(ref: str) -> Getter:
    if ref.startswith("/"):
        tokens = pointer_tokens(ref)
        return lambda headers, doc, values: scalar_text(resolve_tokens(doc, tokens))
    if ref.startswith("header:"):
        name = ref[len("header:") :]
        return lambda headers, doc, values: scalar_text(headers(name))
    return lambda headers, doc, values: values.get(ref)


def compile_value(spec: ValueSpec) -> Getter:
    if spec.const is not None:
        const = scalar_text(spec.const)
        return lambda headers, doc, values: const
    if spec.header is not None:
        name = spec.header
        return lambda headers, doc, values: scalar_text(headers(name))
    if spec.pointer is not None:
        tokens = pointer_tokens(spec.pointer)
        return lambda headers, doc, values: scalar_text(resolve_tokens(doc, tokens))
    template = spec.template or ""
    pieces: list[str | Getter] = []
    pos = 0
    for m in _PIECE_RE.finditer(template):
        if m.start() > pos:
            pieces.append(template[pos : m.start()])
        token = m.group(0)
        pieces.append(token[0] if token in ("{{", "}}") else _ref_getter(m.group(1)))
        pos = m.end()
    if pos < len(template):
        pieces.append(template[pos:])

    def render(headers: HeaderGet, doc: Any, values: Mapping[str, str | None]) -> str | None:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            value = piece(headers, doc, values)
            if value is None:
                return None
            out.append(value)
        return scalar_text("".join(out))

    return render


def reads_body(spec: ValueSpec) -> bool:
    if spec.pointer is not None:
        return True
    return spec.template is not None and any(r.startswith("/") for r in references(spec.template))


class Envelope:
    """The compiled envelope extraction of one route."""

    __slots__ = ("_correlation", "_fields", "reads_body")

    def __init__(self, extract: Mapping[str, ValueSpec], correlation: Mapping[str, ValueSpec]) -> None:
        # Needed fields: the envelope's own, plus every extracted field their templates refer to.
        needed: list[str] = []
        pending = [f for f in ENVELOPE_FIELDS if f in extract]
        pending += [r for s in correlation.values() if s.template for r in references(s.template)]
        while pending:
            name = pending.pop()
            if name in needed or name not in extract:
                continue
            needed.append(name)
            spec = extract[name]
            if spec.template:
                pending.extend(references(spec.template))
        order: list[str] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if name in order or name in visiting:
                return  # a cycle (refused at apply time) just leaves the later field without value
            visiting.add(name)
            spec = extract[name]
            for dep in references(spec.template) if spec.template else ():
                if dep in needed:
                    visit(dep)
            visiting.discard(name)
            order.append(name)

        for name in sorted(needed):
            visit(name)
        self._fields = tuple((name, compile_value(extract[name])) for name in order)
        self._correlation = tuple((name, compile_value(spec)) for name, spec in sorted(correlation.items()))
        self.reads_body = any(reads_body(extract[n]) for n in order) or any(
            reads_body(s) for s in correlation.values()
        )

    def __call__(self, headers: HeaderGet, doc: Any) -> tuple[str | None, str | None, dict[str, str]]:
        """(event kind, delivery id, correlation ids) of one delivery."""
        values: dict[str, str | None] = {}
        for name, getter in self._fields:
            values[name] = getter(headers, doc, values)
        ids: dict[str, str] = {}
        for name, getter in self._correlation:
            value = getter(headers, doc, values)
            if value is not None:
                ids[name] = value
        return values.get("event_kind"), values.get("delivery_id"), ids

    @property
    def empty(self) -> bool:
        return not self._fields and not self._correlation
