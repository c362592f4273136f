"""The ``connector`` console script: help, command dispatch, ``db upgrade``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from connector.cli import main as cli_main
from connector.common.core import testdb
from connector.common.store import migrate

CONNECTOR = Path(sys.executable).with_name("connector")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    full_env.update(env or {})
    return subprocess.run(
        [str(CONNECTOR), *args], capture_output=True, text=True, env=full_env, timeout=120, check=False
    )


def test_console_script_is_installed() -> None:
    assert CONNECTOR.is_file(), f"console script missing next to {sys.executable}"


def test_help_lists_the_commands() -> None:
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    for word in ("db", "ingress", "materializer", "executor", "up"):
        assert word in result.stdout


def test_no_command_prints_help_and_fails() -> None:
    result = _run()
    assert result.returncode == 2
    assert "usage: connector" in result.stdout


# --- dispatcher, with fake COMMANDS entries --------------------------------------------------------


@pytest.fixture
def fake_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A uniquely named importable package holding fake command modules; yields its name."""
    pkg = f"fake_cli_{uuid.uuid4().hex[:8]}"
    root = tmp_path / pkg
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "built.py").write_text(
        textwrap.dedent(
            """
            def add_arguments(parser):
                parser.add_argument("--answer", type=int, default=0)

            def cli(args):
                return args.answer
            """
        )
    )
    (root / "no_func.py").write_text("X = 1\n")
    (root / "broken.py").write_text("import a_dependency_that_does_not_exist_1f3a  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
        del sys.modules[name]


def _with_commands(monkeypatch: pytest.MonkeyPatch, extra: dict[tuple[str, ...], tuple[str, str]]) -> None:
    monkeypatch.setattr(cli_main, "COMMANDS", {**cli_main.COMMANDS, **extra})


def test_every_registered_command_resolves() -> None:
    """Every command in the table imports and has its function (there is no "not built yet")."""
    for path, (spec, _help) in cli_main.COMMANDS.items():
        func, _add = cli_main._resolve(spec)
        assert callable(func), path


def test_a_command_whose_module_is_missing_is_an_error(
    monkeypatch: pytest.MonkeyPatch, fake_modules: str
) -> None:
    commands = dict(cli_main.COMMANDS)
    monkeypatch.setattr(
        cli_main, "COMMANDS", {**commands, ("ghost",): ("connector.no_such_component_9d2e.service:cli", "-")}
    )
    with pytest.raises(ModuleNotFoundError, match="no_such_component_9d2e"):
        cli_main.main(["ghost"])
    monkeypatch.setattr(cli_main, "COMMANDS", {**commands, ("ghost2",): (f"{fake_modules}.no_func:cli", "-")})
    with pytest.raises(AttributeError, match="cli"):
        cli_main.main(["ghost2"])


def test_missing_dependency_inside_a_built_module_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch, fake_modules: str
) -> None:
    """A real import bug surfaces as itself."""
    _with_commands(monkeypatch, {("broken",): (f"{fake_modules}.broken:cli", "imports a missing package")})
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_does_not_exist_1f3a"):
        cli_main.main(["broken"])


def test_built_command_gets_its_arguments_and_exit_code(
    monkeypatch: pytest.MonkeyPatch, fake_modules: str
) -> None:
    _with_commands(monkeypatch, {("fake", "run"): (f"{fake_modules}.built:cli", "a fake command")})
    assert cli_main.main(["fake", "run", "--answer", "7"]) == 7
    assert cli_main.main(["fake", "run"]) == 0


def test_group_without_subcommand_prints_group_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main.main(["db"]) == 2
    assert "upgrade" in capsys.readouterr().out


# --- connector db upgrade ---------------------------------------------------------------------------


@pytest.fixture
def empty_db_url() -> Iterator[str]:
    """A new database with no schema at all (not a copy of the migrated template)."""
    name = f"connector_cli_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(testdb.server_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = testdb.with_database(testdb.server_url(), name)
    try:
        yield url
    finally:
        testdb.drop_database(url)


def _head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(migrate.alembic_config("")).get_current_head()
    assert head
    return head


def test_db_upgrade_on_an_empty_database_then_idempotent(empty_db_url: str) -> None:
    head = _head()
    assert migrate.current(empty_db_url) is None

    first = _run("db", "upgrade", env={"CONNECTOR_DATABASE_URL": empty_db_url})
    assert first.returncode == 0, first.stderr
    assert f"database schema: empty -> {head}" in first.stdout
    assert migrate.current(empty_db_url) == head
    with psycopg.connect(empty_db_url) as conn:
        tables = {
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
        }
    assert {"connector_ingress_receipt", "connector_event", "connector_work_item"} <= tables

    second = _run("db", "upgrade", env={"CONNECTOR_DATABASE_URL": empty_db_url})
    assert second.returncode == 0, second.stderr
    assert f"database schema: {head} -> {head}" in second.stdout


def test_db_upgrade_on_the_migrated_test_database_is_a_no_op(db_url: str) -> None:
    head = _head()
    result = _run("db", "upgrade", env={"CONNECTOR_DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    assert f"database schema: {head} -> {head}" in result.stdout


def test_db_upgrade_without_database_url_fails_clearly() -> None:
    result = _run("db", "upgrade")
    assert result.returncode != 0
    assert "CONNECTOR_DATABASE_URL is not set" in result.stderr


def test_dlq_show_says_which_timeline_a_token_was_claimed_on() -> None:
    """A token claimed after a failover carries the timeline in its high bits (ADR 018)."""
    from connector.cli.admin.dlq import token_note
    from connector.common.store.tokens import token_timeline

    assert token_note(7) == ""  # a server never promoted: tokens read as before
    assert token_note(2**31 + 3) == " (timeline 2, claim 3)"
    assert token_timeline(2**31 + 3) == 2 and token_timeline(7) == 1
