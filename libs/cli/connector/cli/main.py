"""The ``connector`` command: one console script for services, database, packs and operators."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

# subcommand path -> "module:function" taking the parsed args and returning an exit code. Each
# owning package registers its arguments through ``add_arguments(parser)`` in the same module.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("db", "upgrade"): ("connector.cli.db:upgrade", "apply database migrations"),
    ("ingress",): ("connector.ingress.service:cli", "run the ingress service"),
    ("materializer",): ("connector.materializer.service:cli", "run the materializer service"),
    ("materializer", "backfill"): (
        "connector.materializer.backfill:cli",
        "create missing WorkItems for eligible non-terminal events (idempotent)",
    ),
    ("executor",): ("connector.executor.service:cli", "run the executor service (+ admin API)"),
    ("up",): ("connector.cli.up:cli", "run all three services locally (embedded PostgreSQL by default)"),
    ("pack", "apply"): ("connector.cli.pack:apply", "install a pack manifest"),
    ("admin",): ("connector.cli.admin.commands:cli", "operator commands over the admin API"),
    ("retention", "sweep"): (
        "connector.cli.retention:sweep",
        "delete retired deliveries and expired admin request ids now (--dry-run counts them)",
    ),
}


def _resolve(spec: str) -> tuple[Callable[[argparse.Namespace], int], Callable | None]:
    module_name, func_name = spec.split(":")
    module = importlib.import_module(module_name)
    func = getattr(module, func_name)
    add = getattr(module, f"add_{func_name}_arguments", None) or getattr(module, "add_arguments", None)
    return func, add


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="connector", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): subparsers}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for path, (spec, help_text) in sorted(COMMANDS.items(), key=lambda kv: len(kv[0])):
        parent = groups.get(path[:-1])
        if parent is None:
            parent_parser = parsers.get(path[:-1])
            if parent_parser is None:  # a pure group such as "db"
                grand = groups[path[:-2]]
                parent_parser = grand.add_parser(path[-2], help=f"{path[-2]} commands")
                parent_parser.set_defaults(_path=path[:-1], _group=parent_parser)
                parsers[path[:-1]] = parent_parser
            parent = parent_parser.add_subparsers(dest="_".join(path[:-1]) + "_sub", metavar="SUBCOMMAND")
            groups[path[:-1]] = parent
        sub = parent.add_parser(path[-1], help=help_text, description=help_text)
        parsers[path] = sub
        func, add = _resolve(spec)
        if add is not None:
            add(sub)
        sub.set_defaults(_func=func, _path=path)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    path = getattr(args, "_path", None)
    if path is None:
        parser.print_help()
        return 2
    # A pure group (such as ``db``) chosen without one of its subcommands: its help.
    func = getattr(args, "_func", None)
    if func is None:
        args._group.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
