"""The receipt envelope taken at ingress: event kind, provider delivery id, correlation ids.

Headers exist only while the ingress handles the request, so the ingress keeps exactly these facts
on the receipt (docs/packs.md, "Extraction"); the materializer evaluates everything else from the
stored receipt. Both use one extraction language (``connector.common.packs.extraction``). Only the fields
the envelope needs (and those their templates refer to) are evaluated per delivery, in dependency
order. Extraction never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from connector.common.packs.extraction import (
    Context,
    HeaderGet,
    compile_value,
    dependency_order,
    reads_body,
    references,
)
from connector.common.packs.manifest import ValueSpec
from connector.common.packs.references import HEADER_FIELDS

#: Extracted fields the ingress stores on the receipt.
ENVELOPE_FIELDS = HEADER_FIELDS


class Envelope:
    """The compiled envelope extraction of one route."""

    __slots__ = ("_correlation", "_fields", "reads_body")

    def __init__(self, extract: Mapping[str, ValueSpec], correlation: Mapping[str, ValueSpec]) -> None:
        # Needed fields: the envelope's own, plus every extracted field their templates refer to.
        roots = [f for f in ENVELOPE_FIELDS if f in extract]
        roots += [r for s in correlation.values() if s.template for r in references(s.template)]
        order = dependency_order(extract, roots)
        self._fields = tuple((name, compile_value(extract[name])) for name in order)
        self._correlation = tuple((name, compile_value(spec)) for name, spec in sorted(correlation.items()))
        self.reads_body = any(reads_body(extract[n]) for n in order) or any(
            reads_body(s) for s in correlation.values()
        )

    def __call__(self, headers: HeaderGet, doc: Any) -> tuple[str | None, str | None, dict[str, str]]:
        """(event kind, delivery id, correlation ids) of one delivery."""
        ctx = Context(doc, headers)
        values = ctx.values
        for name, getter in self._fields:
            values[name] = getter(ctx)
        ids: dict[str, str] = {}
        for name, getter in self._correlation:
            value = getter(ctx)
            if value is not None:
                ids[name] = value
        return values.get("event_kind"), values.get("delivery_id"), ids

    @property
    def empty(self) -> bool:
        return not self._fields and not self._correlation
