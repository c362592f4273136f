"""The extraction language of route specs, compiled once per route (docs/packs.md, "Extraction").

One implementation for both places that read it: the ingress envelope (event kind, delivery id and
correlation ids, taken while the request's headers exist) and the materializer's route compiler
(everything else, read from the stored receipt). A ``ValueSpec`` is a pointer (RFC 6901), a header,
a constant, or a template of literals, ``{{``/``}}`` escapes and references (``{/pointer}``,
``{header:Name}``, ``{work_type}`` in lane keys, another extracted field). Values are scalars as
bounded text (``jsonvalues.scalar_text``); anything else is *no value*. Compiled getters never raise.

Where headers are gone (the materializer), a field's header spec, or a template that refers to a
header, takes the value the ingress stored for that field (``stored``) instead.

Instants (``instant_seconds``): the extracted ``run_after`` of a delayed work type and the signature
timestamps of the ingress verifier (``rfc3339_seconds``) are read by the same parser.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from connector.common.packs.jsonvalues import pointer_tokens, resolve_tokens, scalar_text
from connector.common.packs.manifest import ValueSpec

HeaderGet = Callable[[str], str | None]

_PIECE_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


def _no_header(name: str) -> str | None:
    return None


class Context:
    """What getters read while one delivery is evaluated."""

    __slots__ = ("doc", "header", "receipt", "values", "work_type")

    def __init__(self, doc: Any, header: HeaderGet = _no_header, receipt: Any = None) -> None:
        #: The parsed body (``None`` when not parsed or not JSON).
        self.doc = doc
        #: Request headers (ingress); none where they are not kept.
        self.header = header
        #: The stored receipt (materializer): what ``stored`` getters read.
        self.receipt = receipt
        #: Extracted field values so far (templates refer to them).
        self.values: dict[str, str | None] = {}
        #: The fan-out entry being evaluated (lane key templates).
        self.work_type: str | None = None


Getter = Callable[[Context], str | None]


def references(template: str) -> list[str]:
    """The ``{...}`` references of a template, in order (escapes excluded): exactly the pieces the
    compiled template reads."""
    return [m.group(1) for m in _PIECE_RE.finditer(template) if m.group(1) is not None]


def _ref_getter(ref: str) -> Getter:
    if ref.startswith("/"):
        tokens = pointer_tokens(ref)
        return lambda ctx: scalar_text(resolve_tokens(ctx.doc, tokens))
    if ref.startswith("header:"):
        name = ref[len("header:") :]
        return lambda ctx: scalar_text(ctx.header(name))
    if ref == "work_type":
        return lambda ctx: ctx.work_type
    return lambda ctx: ctx.values.get(ref)


def compile_template(template: str, stored: Getter | None = None, *, bounded: bool = True) -> Getter:
    """Literal and reference pieces; with ``stored``, a template that refers to a header is the
    stored value as a whole. ``bounded``: the result is a scalar text value (lane keys are bounded
    by their own rule instead)."""
    if stored is not None and any(r.startswith("header:") for r in references(template)):
        if not bounded:
            return stored
        stored_value = stored
        return lambda ctx: scalar_text(stored_value(ctx))
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

    def render(ctx: Context) -> str | None:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            value = piece(ctx)
            if value is None:
                return None
            out.append(value)
        return scalar_text("".join(out)) if bounded else "".join(out)

    return render


def compile_value(spec: ValueSpec, stored: Getter | None = None) -> Getter:
    """The getter of one spec; ``stored`` replaces header reads (see the module docstring)."""
    if spec.const is not None:
        const = scalar_text(spec.const)
        return lambda ctx: const
    if spec.header is not None:
        if stored is not None:
            return stored
        name = spec.header
        return lambda ctx: scalar_text(ctx.header(name))
    if spec.pointer is not None:
        tokens = pointer_tokens(spec.pointer)
        return lambda ctx: scalar_text(resolve_tokens(ctx.doc, tokens))
    return compile_template(spec.template or "", stored)


def template_reads_body(template: str) -> bool:
    return any(r.startswith("/") for r in references(template))


def reads_body(spec: ValueSpec) -> bool:
    if spec.pointer is not None:
        return True
    return spec.template is not None and template_reads_body(spec.template)


def dependency_order(specs: Mapping[str, ValueSpec], roots: Iterable[str] | None = None) -> list[str]:
    """Field names in an order where every template comes after the fields it refers to: all of
    ``specs``, or only ``roots`` and the fields they refer to (transitively). Cycles are refused at
    apply time; one here just leaves the later field without a value."""
    if roots is None:
        wanted = set(specs)
    else:
        wanted = set()
        pending = [r for r in roots if r in specs]
        while pending:
            name = pending.pop()
            if name in wanted:
                continue
            wanted.add(name)
            template = specs[name].template
            if template:
                pending.extend(r for r in references(template) if r in specs)
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or name in visiting:
            return
        visiting.add(name)
        template = specs[name].template
        for dep in references(template) if template else ():
            if dep in wanted:
                visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in sorted(wanted):
        visit(name)
    return order


# --------------------------------------------------------------------------------------------------
# Instants
# --------------------------------------------------------------------------------------------------

_RFC3339 = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))$"
)


def rfc3339_seconds(value: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 date-time, or ``None`` when it is not one."""
    match = _RFC3339.match(value)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    try:
        # Validates the calendar (no 31 February); a leap second (:60) is refused.
        datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None
    seconds = float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
    if match.group(7):
        seconds += float(match.group(7))
    if match.group(8):
        offset = int(match.group(9)) * 3600 + int(match.group(10)) * 60
        if int(match.group(9)) > 23 or int(match.group(10)) > 59:
            return None
        seconds -= offset if match.group(8) == "+" else -offset
    return seconds


_UNIX_SECONDS = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,9})?$")
#: 9999-12-31T23:59:59Z: an instant after it (a value in milliseconds read as seconds) is no instant.
MAX_INSTANT_S = 253402300799.0


def instant_seconds(value: str | None) -> float | None:
    """Seconds since the epoch of an extracted instant: an RFC 3339 date-time (``2026-12-01T13:00:00Z``,
    ``...+01:00``, fractions) or Unix seconds (``1764594000``, ``1764594000.5``; a JSON number is
    extracted as its text). ``None`` for anything else: no value, other text, a negative number, or
    an instant after year 9999 (Unix *milliseconds* are refused this way rather than read as a time
    fifty thousand years ahead)."""
    if value is None:
        return None
    text = value.strip()
    if _UNIX_SECONDS.match(text):
        seconds = float(text)
    else:
        parsed = rfc3339_seconds(text)
        if parsed is None:
            return None
        seconds = parsed
    if not 0 <= seconds <= MAX_INSTANT_S:
        return None
    return seconds
