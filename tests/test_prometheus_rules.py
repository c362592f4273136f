"""The Prometheus rules in deploy/prometheus/: ``promtool check rules`` and ``promtool test rules``
(every alert unit-tested, each with a firing case and a control), and every alert links a section
of docs/runbook.md that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.metrics_stack import ROOT, require_prometheus_tools

RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))


def _alerts() -> list[dict]:
    out = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [r for r in group["rules"] if "alert" in r]
    return out


def _anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the headings."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_promtool_check_rules() -> None:
    promtool = require_prometheus_tools()["promtool"]
    assert RULES
    res = subprocess.run([promtool, "check", "rules", *map(str, RULES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_test_rules() -> None:
    promtool = require_prometheus_tools()["promtool"]
    assert TESTS
    res = subprocess.run(
        [promtool, "test", "rules", *(t.name for t in TESTS)],
        capture_output=True,
        text=True,
        cwd=TESTS[0].parent,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout, res.stdout


def test_every_alert_is_unit_tested_and_has_a_runbook_section() -> None:
    tested = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested |= {t["alertname"] for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    anchors = _anchors((ROOT / "docs" / "runbook.md").read_text())
    alerts = _alerts()
    assert alerts
    for rule in alerts:
        name = rule["alert"]
        assert name in tested, f"{name} has no promtool test case in which it fires"
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/runbook.md", f"{name}: {url} is not in docs/runbook.md"
        assert anchor in anchors, f"{name}: {url} is no section of docs/runbook.md"
