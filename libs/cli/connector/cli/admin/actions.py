"""``connector admin cancel|pause|resume``: operator actions on the queue (docs/admin.md "Cancel",
"Pause and resume").

    connector admin cancel WORK_ID... --reason TEXT [--dry-run]    discard pending/blocked/retry/dead items
    connector admin pause PACK [--queue-class QC] --reason TEXT    stop claiming a pack's (or a class's) work
    connector admin resume PACK [--queue-class QC]                 end that pause
    connector admin circuit list [PACK]                            circuit breakers and their state
    connector admin circuit open PACK TARGET --reason TEXT         force a target's circuit open
    connector admin circuit close PACK TARGET --reason TEXT        close it (counts start again)

Each takes ``--request-id`` (AIP-155: a retry with the same id returns the first answer; one is made
up when not given) and ``--dry-run`` (the checks and the answer, nothing changed). Cancel needs role
ReplayConnectorEvents, pause/resume and circuit open/close ConnectorOperator.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from connector.cli.admin.client import Client, format_error, pack_label, positive_int, resolve_pack_id
from connector.cli.admin.output import table, to_json, when, work_item_state
from connector.v1 import admin_service_pb2 as pb


def _request_id(args: argparse.Namespace, suffix: str = "") -> str:
    if args.dry_run:
        return ""
    base = args.request_id or uuid.uuid4().hex
    return f"{base}-{suffix}" if suffix else base


def cancel(client: Client, args: argparse.Namespace) -> int:
    results: list[pb.CancelWorkItemResponse] = []
    failed = 0
    for work_id in args.work_ids:
        suffix = "" if len(args.work_ids) == 1 else str(work_id)
        request = pb.CancelWorkItemRequest(
            work_id=work_id, reason=args.reason, dry_run=args.dry_run, request_id=_request_id(args, suffix)
        )
        try:
            results.append(client.call("CancelWorkItem", request))
        except grpc.RpcError as exc:
            failed += 1
            print(f"{format_error(exc, client)} (work item {work_id})", file=sys.stderr)
    if args.json:
        for r in results:
            print(to_json(r))
    else:
        if args.dry_run and results:
            print("dry run: these would be cancelled (nothing changed)")
        table(
            ["work_id", "state", "pack", "work_type", "attempts", "lane_members_promoted"],
            [
                (
                    r.work_item.work_id,
                    work_item_state(r.work_item.state),
                    pack_label(client, r.work_item.installed_pack_id),
                    r.work_item.work_type,
                    r.work_item.attempts,
                    r.lane_members_promoted,
                )
                for r in results
            ],
        )
    return 1 if failed else 0


def _pause_line(p: pb.Pause) -> str:
    scope = "whole pack" if p.queue_class == "*" else f"queue class {p.queue_class}"
    since = when(p.pause_time) if p.HasField("pause_time") else "-"
    return f"{p.pack_name} ({p.installed_pack_id}) {scope}: paused by {p.actor} at {since}: {p.reason}"


def pause(client: Client, args: argparse.Namespace) -> int:
    request = pb.PausePackRequest(
        installed_pack_id=resolve_pack_id(client, args.pack),
        queue_class=args.queue_class or "",
        reason=args.reason,
        dry_run=args.dry_run,
        request_id=_request_id(args),
    )
    response: pb.PausePackResponse = client.call("PausePack", request)
    if args.json:
        print(to_json(response))
    elif not response.changed:
        print(f"already paused (unchanged): {_pause_line(response.pause)}")
    else:
        verb = "would pause" if response.dry_run else "paused"
        print(f"{verb}: {_pause_line(response.pause)}")
        if not response.dry_run:
            print(
                f"resume with: connector admin resume {args.pack}"
                + (f" --queue-class {args.queue_class}" if args.queue_class else "")
            )
    return 0


def resume(client: Client, args: argparse.Namespace) -> int:
    request = pb.ResumePackRequest(
        installed_pack_id=resolve_pack_id(client, args.pack),
        queue_class=args.queue_class or "",
        dry_run=args.dry_run,
        request_id=_request_id(args),
    )
    response: pb.ResumePackResponse = client.call("ResumePack", request)
    if args.json:
        print(to_json(response))
    elif not response.changed:
        print("not paused (unchanged)")
    else:
        verb = "would resume" if response.dry_run else "resumed"
        print(f"{verb}: {_pause_line(response.pause)}")
    return 0


_CIRCUIT_STATE = {
    pb.CIRCUIT_STATE_CLOSED: "closed",
    pb.CIRCUIT_STATE_OPEN: "open",
    pb.CIRCUIT_STATE_HALF_OPEN: "half_open",
}


def _circuit_state(c: pb.Circuit) -> str:
    name = _CIRCUIT_STATE.get(c.state, "unknown")
    return f"{name} (forced)" if c.forced else name


def circuit_table(circuits: Any) -> None:
    """The circuits of ``connector admin stats`` / ``circuit list``."""
    table(
        [
            "pack",
            "target",
            "state",
            "reason",
            "since",
            "open_until",
            "failures",
            "probes",
            "waiting",
            "in_flight",
        ],
        [
            (
                f"{c.pack_name} ({c.installed_pack_id})",
                c.target,
                _circuit_state(c),
                c.reason or "-",
                when(c.change_time, c.HasField("change_time")),
                when(c.open_until, c.HasField("open_until")),
                f"{c.consecutive_failures} in a row, {c.window_failures}/{c.window_outcomes} in window",
                f"{c.probes_in_flight}/{c.policy.half_open_probes}",
                c.waiting,
                c.in_flight,
            )
            for c in circuits
        ],
    )


def circuit_list(client: Client, args: argparse.Namespace) -> int:
    pack = resolve_pack_id(client, args.pack) if args.pack else 0
    response: pb.GetQueueStatsResponse = client.call(
        "GetQueueStats", pb.GetQueueStatsRequest(installed_pack_id=pack)
    )
    if args.json:
        for c in response.circuits:
            print(to_json(c))
        return 0
    if not response.circuits:
        print("no circuit breakers")
        return 0
    circuit_table(response.circuits)
    if response.circuits_truncated:
        print(f"(first {len(response.circuits)} circuits shown)")
    return 0


def _circuit_change(client: Client, args: argparse.Namespace, *, open_: bool) -> int:
    kind = pb.OpenCircuitRequest if open_ else pb.CloseCircuitRequest
    request = kind(
        installed_pack_id=resolve_pack_id(client, args.pack),
        target=args.target,
        reason=args.reason,
        dry_run=args.dry_run,
        request_id=_request_id(args),
    )
    response = client.call("OpenCircuit" if open_ else "CloseCircuit", request)
    c = response.circuit
    line = f"{c.pack_name} ({c.installed_pack_id}) {c.target}: {_circuit_state(c)}"
    if args.json:
        print(to_json(response))
    elif not response.changed:
        print(f"already {'open' if open_ else 'closed'} (unchanged): {line}")
    else:
        verb = (
            ("would open" if open_ else "would close")
            if response.dry_run
            else ("opened" if open_ else "closed")
        )
        print(f"{verb}: {line}")
        if open_ and not response.dry_run:
            print(f"close with: connector admin circuit close {args.pack} {args.target} --reason ...")
    return 0


def circuit_open(client: Client, args: argparse.Namespace) -> int:
    return _circuit_change(client, args, open_=True)


def circuit_close(client: Client, args: argparse.Namespace) -> int:
    return _circuit_change(client, args, open_=False)


def add_commands(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    def command(name: str, help_text: str, run: Callable[..., int]) -> Any:
        p = groups.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(admin_run=run)
        p.add_argument("--dry-run", action="store_true", help="check and answer, change nothing")
        p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
        return p

    p = command(
        "cancel",
        "discard pending, blocked, retrying or dead work items (role ReplayConnectorEvents); "
        "a claimed item is refused",
        cancel,
    )
    p.add_argument("work_ids", nargs="+", type=positive_int, metavar="WORK_ID", help="work items to cancel")
    p.add_argument("--reason", required=True, help="why (stored on the item and in the audit log)")
    p = command(
        "pause", "stop claiming a pack's work, or one queue class of it (role ConnectorOperator)", pause
    )
    p.add_argument("pack", help="pack id or name")
    p.add_argument("--queue-class", help="only this queue class (default: the whole pack)")
    p.add_argument("--reason", required=True, help="why (stored on the pause and in the audit log)")
    p = command("resume", "end a pause (role ConnectorOperator)", resume)
    p.add_argument("pack", help="pack id or name")
    p.add_argument("--queue-class", help="the queue class pause to end (default: the whole-pack pause)")
    circuit_help = "circuit breakers per handler target (docs/adr/013-circuit-breakers.md)"
    circuit = groups.add_parser("circuit", help=circuit_help, description=circuit_help).add_subparsers(
        dest="circuit_command", required=True, metavar="COMMAND"
    )
    list_help = "circuit breakers and their state (role ViewConnectorEvents)"
    p = circuit.add_parser("list", parents=[common], help=list_help, description=list_help)
    p.set_defaults(admin_run=circuit_list)
    p.add_argument("pack", nargs="?", help="pack id or name (default: every pack)")
    for name, run, text in (
        ("open", circuit_open, "force a handler target's circuit open until closed (role ConnectorOperator)"),
        ("close", circuit_close, "close a handler target's circuit (role ConnectorOperator)"),
    ):
        p = circuit.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(admin_run=run)
        p.add_argument("--dry-run", action="store_true", help="check and answer, change nothing")
        p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
        p.add_argument("pack", help="pack id or name")
        p.add_argument("target", help="the circuit's target, as connector admin circuit list shows it")
        p.add_argument("--reason", required=True, help="why (kept on the circuit and in the audit log)")
