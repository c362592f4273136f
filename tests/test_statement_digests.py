"""Every named SQL statement of the store keeps its text byte for byte unless the change is meant:
``tests/data/statement_digests.json`` holds the digest of each (``scripts/statement_digests.py``).

The file was written from main before the regrouping of ADR 015 (``f9432a3``), with one rename
recorded (the claim statements' shared authority fragment ``_AUTHORITY`` became ``AUTHORITY_ROWS``
when the finalize module began to share it): the regrouping moved every statement and changed none.
After an intended change to a statement, regenerate the file
(``.venv/bin/python scripts/statement_digests.py --write``) so the diff shows which ones changed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "statement_digests", ROOT / "scripts" / "statement_digests.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _diff(recorded: dict[str, str], found: dict[str, str]) -> dict[str, list[str]]:
    return {
        "gone": sorted(set(recorded) - set(found)),
        "new": sorted(set(found) - set(recorded)),
        "changed": sorted(k for k in recorded.keys() & found.keys() if recorded[k] != found[k]),
    }


def test_every_named_statement_is_unchanged() -> None:
    script = _script()
    recorded = json.loads(script.DIGESTS.read_text())
    found = script.collect()
    assert len(found) > 200, "the collector finds the store's statements"
    diff = _diff(recorded, found)
    assert diff == {"gone": [], "new": [], "changed": []}, (
        f"statements differ from {script.DIGESTS.name}: {diff}; if intended, run "
        "`.venv/bin/python scripts/statement_digests.py --write` and commit the file"
    )


def test_the_digests_see_a_changed_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: one space more in the claim statement, a renamed fragment and a changed statement
    builder are each reported."""
    from connector.common.store import work_items

    script = _script()
    before = script.collect()
    claim = work_items.claim
    monkeypatch.setattr(claim, "WORK_ITEM_CLAIM_BATCH", claim.WORK_ITEM_CLAIM_BATCH + " ")
    fragment = claim.AUTHORITY_ROWS
    for module in (claim, work_items.finalize):  # the fragment under a new name in both modules
        monkeypatch.delattr(module, "AUTHORITY_ROWS")
        monkeypatch.setattr(module, "AUTHORITY_ROWS_RENAMED", fragment, raising=False)
    real = work_items.stats.work_item_stats_depth_sql

    def changed(pack: int | None) -> str:
        return real(pack) + " "

    changed.__module__ = real.__module__
    monkeypatch.setattr(work_items.stats, "work_item_stats_depth_sql", changed)
    diff = _diff(before, script.collect())
    assert "WORK_ITEM_CLAIM_BATCH" in diff["changed"]
    assert "work_item_stats_depth_sql(pack=None)" in diff["changed"]
    assert diff["gone"] == ["AUTHORITY_ROWS"] and diff["new"] == ["AUTHORITY_ROWS_RENAMED"]
