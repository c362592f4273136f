"""Digests of every named SQL statement of the store, so a change to a statement's text is always a
decision seen in review (tests/test_statement_digests.py compares them with the committed file).

A named statement is an upper-case module constant of ``connector.common.store`` (its packages
included, the migrations excluded) whose text holds SQL, and every ``*_sql`` statement builder,
called with each combination of its arguments (``pack``: None or a pack id; flags: False, True).
Keys are the constant's name (``WORK_ITEM_CLAIM_BATCH``) or the builder call
(``work_item_stats_depth_sql(pack=None)``): a statement keeps its digest when it moves between
modules, and a name is unique across the store.

    .venv/bin/python scripts/statement_digests.py --write   # after an intended statement change
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import pkgutil
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

DIGESTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "statement_digests.json"
_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WITH|SET|RESET|LOCK|VACUUM|ANALYZE|NOTIFY)\b")


def _modules() -> Iterator[ModuleType]:
    store = importlib.import_module("connector.common.store")
    for info in pkgutil.walk_packages(store.__path__, store.__name__ + "."):
        if ".migrations" not in info.name:
            yield importlib.import_module(info.name)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def collect() -> dict[str, str]:
    """``{statement name: sha256 of its text}``; raises if one name holds two different texts."""
    out: dict[str, str] = {}
    where: dict[str, str] = {}

    def add(name: str, text: str, module: str) -> None:
        digest = _digest(text)
        if name in out and out[name] != digest:
            raise ValueError(f"{name} names two statements: {where[name]} and {module}")
        out[name], where[name] = digest, module

    for mod in _modules():
        for name, value in vars(mod).items():
            if name.isupper() and isinstance(value, str) and _SQL.search(value):
                add(name, value, mod.__name__)
            elif name.endswith("_sql") and inspect.isfunction(value) and value.__module__ == mod.__name__:
                combos: list[dict[str, object]] = [{}]
                for param in inspect.signature(value).parameters:
                    options: tuple[object, ...] = (None, 7) if param == "pack" else (False, True)
                    combos = [{**c, param: v} for c in combos for v in options]
                for args in combos:
                    call = name + "(" + ",".join(f"{k}={v}" for k, v in args.items()) + ")"
                    add(call, value(**args), mod.__name__)
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    found = collect()
    if argv[1:] == ["--write"]:
        DIGESTS.write_text(json.dumps(found, indent=1) + "\n")
        print(f"wrote {len(found)} statement digests to {DIGESTS}")
        return 0
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
