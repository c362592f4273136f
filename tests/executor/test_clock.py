"""The executor never reads the wall clock: every time comparison that matters happens in the
database (``now()`` / ``clock_timestamp()``); the process only measures local intervals with the
monotonic clock. This scan keeps it that way; ``test_processes.py`` proves it with skewed clocks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    *sorted((ROOT / "services/executor/connector/executor").rglob("*.py")),
    ROOT / "libs/common/connector/common/core/process_registry.py",
    ROOT / "libs/common/connector/common/core/listener.py",
    *sorted((ROOT / "libs/common/connector/common/store").glob("*.py")),
]
WALL_CLOCK = {
    ("time", "time"),
    ("time", "time_ns"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
}


def _calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = (
                owner.id
                if isinstance(owner, ast.Name)
                else owner.attr
                if isinstance(owner, ast.Attribute)
                else ""
            )
            if (name, node.func.attr) in WALL_CLOCK:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}.{node.func.attr}()")
    return found


def test_executor_code_never_reads_the_wall_clock() -> None:
    sources = [p for p in SOURCES if "/admin/" not in str(p)]  # the admin API is another component
    assert len(sources) > 10
    offenders = [hit for p in sources for hit in _calls(p)]
    assert offenders == []


def test_the_scan_detects_a_wall_clock_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time, datetime\nx = time.time()\ny = datetime.datetime.now()\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(_calls(bad)) == 2
    finally:
        ROOT = saved
