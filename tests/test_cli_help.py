"""``--help`` of every ``connector`` command, and shell completion (#24, item 6).

The walk goes through the real parser tree (``connector.cli.main.build_parser``) and asks each
command for ``--help`` through ``main()``: it exits 0 and prints a description, every option and
argument has a help text, and no text carries markup (reST double backticks, Markdown backticks).
A planted parser shows the check can fail. Completion: ``connector completion bash`` loaded in a
real bash completes a nested command and its options."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from connector.cli import main as cli_main

CONNECTOR = str(Path(sys.executable).with_name("connector"))


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


def problems(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with one command's help (empty: nothing)."""
    name = " ".join(("connector", *path))
    found: list[str] = []
    if not (parser.description or "").strip():
        found.append(f"{name}: no description")
    if "`" in parser.format_help():
        found.append(f"{name}: markup in the help text")
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if not (action.help or "").strip():
            found.append(f"{name}: {'/'.join(action.option_strings) or action.dest} has no help")
    return found


COMMANDS = [path for path, _ in _walk(cli_main.build_parser())]


def test_the_walk_covers_every_registered_command() -> None:
    assert len(COMMANDS) > 40
    for path in cli_main.COMMANDS:
        assert path in COMMANDS
    assert ("admin", "dlq", "replay") in COMMANDS and ("demo", "send") in COMMANDS


def test_every_command_has_help_without_markup() -> None:
    found = [p for path, parser in _walk(cli_main.build_parser()) for p in problems(path, parser)]
    assert found == []


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "connector")
def test_help_exits_0_and_describes_the_command(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main.main([*path, "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert out.startswith(f"usage: connector {' '.join(path)}".rstrip())
    assert "`" not in out


def test_the_check_catches_a_missing_help_and_markup() -> None:
    """Control: a command without a description, an option without help and a backticked text."""
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--mode", help="as ``connector up`` does")
    assert problems(("x",), parser) == [
        "connector x: no description",
        "connector x: markup in the help text",
        "connector x: --quiet has no help",
    ]


def test_connector_help_in_a_process() -> None:
    proc = subprocess.run([CONNECTOR, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "completion" in proc.stdout and "`" not in proc.stdout


def _complete(script: str, words: list[str]) -> list[str]:
    line = " ".join(words)
    program = (
        f"{script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1};"
        f" COMP_LINE={line!r}; COMP_POINT={len(line)}; _shtab_connector; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    proc = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_bash_completion_completes_commands_and_options() -> None:
    proc = subprocess.run(
        [CONNECTOR, "completion", "bash"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and "complete " in proc.stdout
    script = proc.stdout
    assert _complete(script, ["connector", "adm"]) == ["admin"]
    assert _complete(script, ["connector", "admin", "dl"]) == ["dlq"]
    assert "--dry-run" in _complete(script, ["connector", "admin", "dlq", "replay", "--d"])
    assert set(_complete(script, ["connector", "demo", "send", "--"])) >= {"--fail", "--count"}
    zsh = subprocess.run([CONNECTOR, "completion", "zsh"], capture_output=True, text=True, timeout=60)
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef connector")
