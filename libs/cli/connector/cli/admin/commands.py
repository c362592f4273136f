"""The ``connector admin`` parser and entry point: every group and command, their options, and the
one place a call's errors become an exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import grpc

from connector.cli.admin import actions, cutover, dlq, find, generations, queues, reconcile, top
from connector.cli.admin.client import (
    Client,
    CliError,
    connect,
    format_error,
    parse_time,
    positive_int,
)

DEFAULT_TIMEOUT_S = 30.0

# --------------------------------------------------------------------------------------------------
# Parser and entry point
# --------------------------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection")
    g.add_argument("--address", help="admin API host:port (CONNECTOR_ADMIN_ADDRESS, default 127.0.0.1:50053)")
    g.add_argument("--token-file", help="file holding the bearer token (default: CONNECTOR_ADMIN_TOKEN)")
    g.add_argument(
        "--tls-ca-file", default=os.environ.get("CONNECTOR_ADMIN_CLI_CA_FILE"), help="CA to verify TLS"
    )
    g.add_argument(
        "--tls-cert-file", default=os.environ.get("CONNECTOR_ADMIN_CLI_CERT_FILE"), help="mTLS client cert"
    )
    g.add_argument(
        "--tls-key-file", default=os.environ.get("CONNECTOR_ADMIN_CLI_KEY_FILE"), help="mTLS client key"
    )
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per call (default 30)")
    common.add_argument("--json", action="store_true", help="print the API response as JSON")
    return common


def _paging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=positive_int, default=50, help="page size (default 50, max 500)")
    p.add_argument("--page-token", help="continue a listing")
    p.add_argument("--all", action="store_true", help="follow every page")


def _dlq_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pack", help="pack id or name")
    p.add_argument("--generation", type=positive_int, help="only items of this pack generation")
    p.add_argument("--work-type", help="only items of this work type")
    p.add_argument(
        "--failure-class", help="only items dead with this failure class (e.g. exception, http_500)"
    )
    p.add_argument("--since", type=parse_time, help="finished at or after (ISO 8601 or e.g. 2h)")
    p.add_argument("--until", type=parse_time, help="finished before (ISO 8601 or e.g. 10m)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = _common()
    groups = parser.add_subparsers(dest="admin_group", metavar="GROUP")

    def group(name: str, help_text: str) -> argparse._SubParsersAction:
        g = groups.add_parser(name, help=help_text, description=help_text)
        g.set_defaults(admin_help=g.print_help)
        return g.add_subparsers(dest=f"admin_{name}_cmd", metavar="COMMAND")

    def command(sub: argparse._SubParsersAction, name: str, help_text: str, run: Callable[..., int]) -> Any:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(admin_run=run)
        return p

    dlq_cmds = group("dlq", "dead letters: terminal WorkItems with their event and receipt")
    p = command(dlq_cmds, "list", "list dead letters, newest first", dlq.dlq_list)
    _dlq_filters(p)
    _paging(p)
    p = command(dlq_cmds, "show", "one work item with event and receipt", dlq.dlq_show)
    p.add_argument("work_id", type=positive_int, help="the work item (WORK_ID of dlq list)")
    p.add_argument(
        "--payload", action="store_true", help="include the receipt body (role ReplayConnectorEvents)"
    )
    p = command(
        dlq_cmds, "replay", "replay dead work items by id, or in bulk by filter (--pack ...)", dlq.dlq_replay
    )
    p.add_argument(
        "work_ids", nargs="*", type=positive_int, metavar="WORK_ID", help="dead work items to replay"
    )
    _dlq_filters(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check what would be replayed (the same refusals), change nothing",
    )
    p.add_argument("--rate", type=positive_int, help="bulk: items per second at most (server default 100)")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    cutover.add_dlq_commands(dlq_cmds, command)

    receipts = group("receipts", "receipts whose routing failed")
    p = command(receipts, "failed", "list failed receipts, newest first", dlq.receipts_failed)
    p.add_argument("--namespace", help="only receipts of this namespace")
    _paging(p)
    p = command(
        receipts, "replay", "route a failed receipt again against the active generation", dlq.receipts_replay
    )
    p.add_argument("receipt_id", type=positive_int, help="the failed receipt (RECEIPT_ID of receipts failed)")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")

    p = groups.add_parser(
        "stats",
        parents=[common],
        help="queue depth, ready age, in-flight, rates",
        description="Per pack and queue class: WorkItems by state, due and not yet due, in flight, the"
        " oldest ready age, retry and dead rates; receipts not yet routed or failed (of the pack's"
        " namespace with --pack); pauses, rate-limit, concurrency and debounce keys, circuits.",
    )
    p.set_defaults(admin_run=queues.stats)
    p.add_argument("--pack", help="pack id or name")

    lanes = group("lanes", "source and target mutation lanes")
    p = command(
        lanes, "blocked", "lanes held by a dead, retrying or rollback-fenced head", queues.lanes_blocked
    )
    p.add_argument("--pack", help="pack id or name")
    _paging(p)

    packs = group("packs", "installed packs and generations (apply/activate need ConnectorOperator)")
    command(packs, "list", "packs and their generations", generations.packs_list)
    p = command(packs, "apply", "install a manifest as a new generation", generations.packs_apply)
    p.add_argument("file", help="manifest file (YAML or JSON), - for stdin")
    p.add_argument("--activate", action="store_true", help="activate the new generation at once")
    p.add_argument("--validate-only", action="store_true", help="check the manifest, install nothing")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    p = command(packs, "activate", "make a generation the active one", generations.packs_activate)
    p.add_argument("pack", help="pack id or name")
    p.add_argument("generation", type=positive_int, help="the generation to activate")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")

    cutover_cmds = group("cutover", "claim path ownership per pack generation")
    p = command(
        cutover_cmds, "status", "claim path, phase, receipts, fences, claimers", cutover.cutover_status
    )
    p.add_argument("--pack", help="pack id or name")
    cutover.add_commands(cutover_cmds, command)

    p = groups.add_parser(
        "processes",
        parents=[common],
        help="registered service processes: heartbeat age, stale",
        description="Registered service processes (executor, ingress, materializer; connector_process)"
        " with their heartbeat age; stale = no heartbeat for 3 intervals.",
    )
    p.set_defaults(admin_run=queues.processes_list)
    p.add_argument("--service", help="only this service (e.g. executor, ingress, materializer)")

    actions.add_commands(groups, common)
    find.add_commands(groups, common, _paging, parse_time)
    reconcile.add_commands(groups, common, parse_time)
    top.add_command(groups, common)


def cli(args: argparse.Namespace) -> int:
    run = getattr(args, "admin_run", None)
    if run is None:
        helper = getattr(args, "admin_help", None)
        if helper is not None:
            helper()
        else:
            print(
                "usage: connector admin"
                " {dlq,receipts,stats,top,lanes,packs,cutover,processes,cancel,pause,resume,find,trace,"
                "reconcile}"
                " ... (see --help)",
                file=sys.stderr,
            )
        return 2
    client: Client | None = None
    try:
        with connect(args) as client:
            return int(run(client, args))
    except grpc.RpcError as exc:
        print(format_error(exc, client), file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
