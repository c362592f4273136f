"""``connector completion bash|zsh``: a shell completion script for every command and option.

Generated from the same argparse tree as ``--help`` (shtab), so it never lists a command that does
not exist. Load it for the current shell with ``. <(connector completion bash)``, or install it:
``connector completion bash > /etc/bash_completion.d/connector`` (zsh: a ``_connector`` file on
``$fpath``).
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in: bash or zsh")


def cli(args: argparse.Namespace) -> int:
    import shtab

    from connector.cli.main import build_parser

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0
