"""``connector pack apply``: every error listed with exit 2 and nothing installed; a valid manifest
installed with a readable summary; --dry-run installs nothing; --activate. The console script runs as
a real process for the invalid case and the final apply; the other steps call the same function."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from connector.cli import pack
from tests.materializer.test_manifest import BROKEN, EXAMPLES

CONNECTOR = Path(sys.executable).with_name("connector")


def _run(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONNECTOR_DATABASE_URL": db_url}
    return subprocess.run(
        [str(CONNECTOR), "pack", "apply", *args], capture_output=True, text=True, env=env, timeout=60
    )


def _count(db: psycopg.Connection, table: str) -> int:
    return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_invalid_manifest_lists_every_error_and_installs_nothing(db_url: str, db, tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    result = _run(db_url, str(path), "--activate")
    assert result.returncode == 2, result.stderr
    listed = [line for line in result.stdout.splitlines() if line.startswith("  - ")]
    assert len(listed) >= 11, result.stdout
    assert "nothing installed" in result.stdout
    assert _count(db, "connector_installed_pack") == 0


def test_apply_dry_run_then_activate(
    db_url: str, db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONNECTOR_DATABASE_URL", db_url)
    example = EXAMPLES / "orders-full.yaml"

    def apply(path: Path, **flags: bool) -> str:
        args = argparse.Namespace(file=str(path), activate=False, dry_run=False, actor="test", **{})
        for k, v in flags.items():
            setattr(args, k, v)
        assert pack.apply(args) == 0
        return capsys.readouterr().out

    dry = apply(example, dry_run=True)
    assert "generation 1 would be installed" in dry and "dry run" in dry
    assert _count(db, "connector_installed_pack") == 0

    staged = apply(example)
    assert "generation 1 installed, status staged" in staged
    assert "route order-events    version 1 (new)" in staged

    doc = yaml.safe_load(example.read_text())
    doc["work_types"]["notify"]["priority"] = 0
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(doc))
    active = _run(db_url, str(changed), "--activate")
    assert active.returncode == 0, active.stderr
    assert "generation 2 installed, status active" in active.stdout
    assert "order-events    version 2 (changed)" in active.stdout
    assert "signed-generic  version 1 (unchanged)" in active.stdout
    assert db.execute("SELECT active_generation FROM connector_installed_pack").fetchone()[0] == 2
