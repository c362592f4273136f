"""Reading a pack manifest document: YAML or JSON text → a validated ``Manifest``, or every
problem at once.

``parse_manifest`` is what ``connector pack apply`` and the admin API's ApplyPack call: the text is
loaded (``load_document``: duplicate keys refused), its shape checked before its fields
(``document_errors``: NUL characters, lone surrogates, depth and size limits), then field errors
(pydantic's, with locations written as ``routes[0:orders].extract.event_kind``), cross-reference
errors (``connector.common.packs.references``) and verification errors are reported together in one
``ManifestError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from connector.common.packs import reconcile, verification
from connector.common.packs.manifest import Manifest
from connector.common.packs.reconcile import ReconcileSpec, RedeliverySpec
from connector.common.packs.references import reference_errors, route_label
from connector.common.packs.verification import VerificationSpec


class ManifestError(ValueError):
    """An invalid manifest; ``errors`` lists every problem as ``path: message``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid pack manifest:\n" + "\n".join(f"  - {e}" for e in errors))
        self.errors = errors


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


#: Limits of a manifest document, checked before its fields are (docs/admin.md, "Input
#: validation"): nesting depth (a manifest needs fewer than ten levels) and values in all, a YAML
#: alias counted at every place it is used (so an alias "bomb" is refused, not validated billions
#: of times).
MAX_DOCUMENT_DEPTH = 32
MAX_DOCUMENT_VALUES = 100_000
MAX_DOCUMENT_ERRORS = 100


def load_document(text: str | bytes) -> Any:
    """Parse YAML or JSON text (duplicate keys are an error)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ManifestError([f"not valid YAML/JSON: {exc}"]) from None
    except UnicodeDecodeError:
        raise ManifestError(["not valid YAML/JSON: the text is not UTF-8"]) from None
    except RecursionError:
        raise ManifestError([f"(manifest): nested deeper than {MAX_DOCUMENT_DEPTH} levels"]) from None


def _text_problem(value: str) -> str | None:
    """What no text of a manifest may hold: PostgreSQL text and JSON columns cannot store a NUL
    character, and a lone surrogate (``"\\ud800"`` in a JSON or YAML escape) is not Unicode text."""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (a lone surrogate)"
    return None


def _label(key: Any) -> str:
    text = str(key)
    return text if _text_problem(text) is None else text.encode("unicode_escape").decode("ascii")


def document_errors(data: Any) -> tuple[list[str], bool]:
    """Problems of the raw document no field check may see: text with a NUL character or a lone
    surrogate (keys included), nesting deeper than ``MAX_DOCUMENT_DEPTH``, more than
    ``MAX_DOCUMENT_VALUES`` values. Iterative (no recursion limit). Returns the errors and whether
    the shape itself is refused (too deep or too large: nothing else is checked then)."""
    errors: list[str] = []
    seen = 0
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack and len(errors) < MAX_DOCUMENT_ERRORS:
        node, path, depth = stack.pop()
        seen += 1
        if seen > MAX_DOCUMENT_VALUES:
            return [
                f"(manifest): more than {MAX_DOCUMENT_VALUES} values (a YAML alias counts at every use)"
            ], True
        if isinstance(node, str):
            problem = _text_problem(node)
            if problem is not None:
                errors.append(f"{path or '(manifest)'}: {problem}")
            continue
        if not isinstance(node, dict | list | tuple):
            continue
        if depth >= MAX_DOCUMENT_DEPTH:
            return [f"{path or '(manifest)'}: nested deeper than {MAX_DOCUMENT_DEPTH} levels"], True
        if isinstance(node, dict):
            children = []
            for key, value in node.items():
                here = f"{path}.{_label(key)}" if path else _label(key)
                if isinstance(key, str) and (problem := _text_problem(key)) is not None:
                    errors.append(f"{here}: the key {problem}")
                children.append((value, here, depth + 1))
        else:
            children = [(value, f"{path}[{index}]", depth + 1) for index, value in enumerate(node)]
        stack.extend(reversed(children))
    return errors, False


def _format_loc(loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    parts: list[str] = []
    node: Any = data
    for part in loc:
        if isinstance(part, int):
            label = f"[{part}]"
            if isinstance(node, list | tuple) and 0 <= part < len(node):
                node = node[part]
                key = node.get("key") if isinstance(node, dict) else None
                key = key or (node.get("work_type") if isinstance(node, dict) else None)
                if isinstance(key, str):
                    label = f"[{part}:{key}]"
            else:
                node = None
            if parts:
                parts[-1] += label
            else:
                parts.append(label)
        else:
            # pydantic tags union/function validators with their names; they are not paths.
            if part.startswith("function-") or part in ("str", "int", "dict[str,...]"):
                continue
            parts.append(str(part))
            node = node.get(part) if isinstance(node, dict) else None
    return ".".join(parts) or "(manifest)"


def _raw_at(data: Any, loc: tuple[int | str, ...]) -> Any:
    node = data
    for part in loc:
        if isinstance(part, int) and isinstance(node, list | tuple) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def parse_manifest(text: str | bytes | Mapping[str, Any]) -> Manifest:
    """Parse and validate a manifest document (YAML or JSON), listing every error: field errors,
    cross-reference errors and verification errors are reported together."""
    data: Any = dict(text) if isinstance(text, Mapping) else load_document(text)
    if not isinstance(data, dict):
        raise ManifestError(["the document must be a mapping with name, namespace, work_types, routes"])
    errors, refused = document_errors(data)
    if refused:
        raise ManifestError(errors)
    manifest: Manifest | None = None
    try:
        manifest = Manifest.model_validate(data, context={"skip_reference_checks": True})
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == "too_short" and _raw_at(data, tuple(err["loc"])):
                continue  # pydantic repeats a failed item's error as the non-empty list being "short"
            loc = _format_loc(tuple(err["loc"]), data)
            msg = err["msg"].removeprefix("Value error, ")
            errors.extend(f"{loc}: {part}" for part in msg.split("\n"))
    errors.extend(reference_errors(data))
    errors.extend(_verification_errors(data))
    errors.extend(_contract_errors(data))
    if errors:
        raise ManifestError(list(dict.fromkeys(errors)))
    assert manifest is not None
    return manifest


def _verification_errors(data: Mapping[str, Any]) -> list[str]:
    # Verification specs are interpreted by the ingress verifier; check them now so a bad preset or
    # an impossible combination is refused at apply time, not at the first delivery.
    errors: list[str] = []
    routes = data.get("routes")
    if not isinstance(routes, list | tuple):
        return errors
    for index, route in enumerate(routes):
        if not isinstance(route, dict):
            continue
        try:
            spec = VerificationSpec.model_validate(route.get("verification"))
        except ValidationError:
            continue  # reported as field errors
        label = route_label(index, route)
        errors.extend(f"{label}.verification: {e}" for e in verification.check_spec(spec))
    return errors


def _contract_errors(data: Mapping[str, Any]) -> list[str]:
    """A route's redelivery contract and reconciliation against the rest of the route (presets
    known, the route has a delivery id to reconcile by, requests that can be sent;
    docs/reconcile.md)."""
    errors: list[str] = []
    routes = data.get("routes")
    if not isinstance(routes, list | tuple):
        return errors
    for index, route in enumerate(routes):
        if not isinstance(route, dict):
            continue
        label = route_label(index, route)
        if route.get("redelivery") is not None:
            try:
                redelivery = RedeliverySpec.model_validate(route["redelivery"])
            except ValidationError:
                pass  # reported as field errors
            else:
                errors.extend(f"{label}.redelivery: {e}" for e in reconcile.redelivery_errors(redelivery))
        if route.get("reconcile") is not None:
            try:
                spec = ReconcileSpec.model_validate(route["reconcile"])
            except ValidationError:
                continue  # reported as field errors
            errors.extend(_nested(f"{label}.reconcile", e) for e in reconcile.reconcile_errors(spec, route))
    return errors


_PATH_FIRST = re.compile(r"^[A-Za-z_][\w.\[\]-]*: ")


def _nested(label: str, message: str) -> str:
    """``label.sub.path: message`` for a message that starts with its own path, else ``label: message``."""
    return f"{label}.{message}" if _PATH_FIRST.match(message) else f"{label}: {message}"
