"""The ``connector`` command: one console script for services, database, packs and operators."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

#: What ``connector --help`` says (the module docstring is for readers of the code).
DESCRIPTION = (
    "One command for the connector runtime: run the services (ingress, materializer, executor, or"
    " all three with up), migrate the database, install packs, operate it (admin), try it (demo)."
    " Every command has --help; shell completion: . <(connector completion bash)."
)

#: Descriptions of the command groups that are not commands themselves.
GROUPS: dict[tuple[str, ...], str] = {
    ("db",): "database schema: apply the migrations",
    ("pack",): "install pack manifests straight into the database (the admin API has packs apply too)",
    ("demo",): "try a running connector up: signed deliveries to its demo route",
    ("retention",): "delete retired deliveries now (the executor also does it on its own)",
}

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
    ("demo", "send"): (
        "connector.cli.demo.send:cli",
        "send signed deliveries to the demo route of connector up (--fail: one that dead-letters)",
    ),
    ("completion",): (
        "connector.cli.completion:cli",
        "print a bash or zsh completion script (. <(connector completion bash))",
    ),
    ("console",): (
        "connector.console.server:cli",
        "run the operator console: a web UI over the admin API (port 8090, docs/console.md)",
    ),
    ("retention", "sweep"): (
        "connector.cli.retention:sweep",
        "delete retired deliveries and expired admin request ids now (--dry-run counts them)",
    ),
}


#: The settings of each service command's listeners, checked for a taken port before it starts
#: (``connector up`` checks all three itself).
_LISTENERS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("ingress",): ("IngressSettings",),
    ("materializer",): ("MaterializerSettings",),
    ("executor",): ("ExecutorSettings",),
}


def _resolve(spec: str) -> tuple[Callable[[argparse.Namespace], int], Callable | None]:
    module_name, func_name = spec.split(":")
    module = importlib.import_module(module_name)
    func = getattr(module, func_name)
    add = getattr(module, f"add_{func_name}_arguments", None) or getattr(module, "add_arguments", None)
    return func, add


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="connector", description=DESCRIPTION)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): subparsers}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for path, (spec, help_text) in sorted(COMMANDS.items(), key=lambda kv: len(kv[0])):
        parent = groups.get(path[:-1])
        if parent is None:
            parent_parser = parsers.get(path[:-1])
            if parent_parser is None:  # a pure group such as "db"
                grand = groups[path[:-2]]
                text = GROUPS.get(path[:-1], f"{path[-2]} commands")
                parent_parser = grand.add_parser(path[-2], help=text, description=text)
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
    listeners = _LISTENERS.get(path)
    if listeners is not None and getattr(args, "worker", None) is None:
        # A taken port, found before anything starts. Not for an ingress supervising several workers
        # (they share their ports with SO_REUSEPORT; the supervisor reports a worker that cannot bind).
        from connector.common.core import settings
        from connector.common.core.ports import taken_port_line

        classes = tuple(getattr(settings, n) for n in listeners)
        processes = getattr(args, "processes", None) or getattr(settings.load(classes[0]), "processes", 1)
        taken = None if int(processes or 1) > 1 else taken_port_line(classes, vars(args))
        if taken is not None:
            print(taken, file=sys.stderr)
            return 1
    try:
        return int(func(args) or 0)
    except (OSError, RuntimeError) as exc:
        # A listener that cannot bind is an expected condition: one line naming the setting.
        from connector.common.core.ports import bind_error_line

        line = bind_error_line(exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
