"""JSON values for extraction rules, shared by the ingress (envelope fields at receipt time) and the
materializer (everything else): RFC 6901 pointers and bounded scalar text, so both read a body the
same way."""

from __future__ import annotations

import json
from typing import Any

#: Longest extracted value kept (longer values count as absent: no unbounded keys or ids).
MAX_VALUE_CHARS = 512

_MISSING = object()


def scalar_text(value: Any) -> str | None:
    """A JSON scalar as bounded, printable text; anything else is no value."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = json.dumps(value)
    else:
        return None
    if not text or len(text) > MAX_VALUE_CHARS or not text.isprintable():
        return None
    return text


def pointer_tokens(pointer: str) -> tuple[str, ...]:
    """RFC 6901: ``/a/b~1c/0`` → ``('a', 'b/c', '0')``; ``""`` is the whole document."""
    if pointer == "":
        return ()
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


def resolve_tokens(doc: Any, tokens: tuple[str, ...]) -> Any:
    """The value at ``tokens`` in ``doc``, or None when any step is missing."""
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            node = node.get(token, _MISSING)
            if node is _MISSING:
                return None
        elif isinstance(node, list):
            if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
                return None
            index = int(token)
            if index >= len(node):
                return None
            node = node[index]
        else:
            return None
    return node
