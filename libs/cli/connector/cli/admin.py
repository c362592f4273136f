"""``connector admin``: operator commands over the admin gRPC API (docs/admin.md).

    connector admin dlq list|show|replay      dead letters: list, inspect, replay (one, many, by filter)
    connector admin dlq legacy                dead letters of the legacy Event path (legacy generations)
    connector admin receipts failed|replay    receipts whose routing failed
    connector admin stats                     queue depth, ready age, in-flight, rates, receipts
    connector admin lanes blocked             lanes held by a dead, retrying or fenced head
    connector admin packs list|apply|activate pack generations
    connector admin cutover status            claim path, phase, receipts, fences per generation
    connector admin cutover quiesce|cutover|rollback|abort|reconcile|resolve   gates (docs/cutover.md)
    connector admin processes                 registered service processes, heartbeat age, stale
    connector admin cancel|pause|resume       discard a work item; pause/resume a pack or queue class
    connector admin find                      deliveries by provider id, key, correlation id, filter
    connector admin trace                     one delivery's chain and why each WorkItem waits

Target ``CONNECTOR_ADMIN_ADDRESS`` (default 127.0.0.1:50053) or ``--address``; bearer token from
``CONNECTOR_ADMIN_TOKEN`` or ``--token-file``; TLS with ``--tls-ca-file`` (+ ``--tls-cert-file`` /
``--tls-key-file`` for mTLS). Tables by default, ``--json`` for scripts. A failed call prints
``error: <CODE> <reason>: <message>`` on stderr and exits 1 (2 for usage errors, 130 on Ctrl-C).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from connector.cli import admin_actions, admin_cutover, admin_find
from connector.cli.admin_client import (
    Client,
    CliError,
    connect,
    fetch_pages,
    format_error,
    positive_int,
    print_more_hint,
    resolve_pack_id,
)
from connector.cli.admin_output import (
    Progress,
    age,
    ago,
    enum_name,
    process_table,
    table,
    to_json,
    when,
    work_item_state,
)
from connector.cli.admin_output import (
    timestamp as _ts,
)
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

DEFAULT_TIMEOUT_S = 30.0
QUEUE_STATES = ("pending", "blocked", "processing", "retry", "dead", "awaiting_legacy_outcome")


# --------------------------------------------------------------------------------------------------
# Argument helpers
# --------------------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str) -> datetime:
    """ISO 8601 (UTC when no offset) or a relative age such as ``90s``, ``15m``, ``2h``, ``7d``."""
    match = _RELATIVE.match(text.strip())
    if match:
        return datetime.now(UTC) - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (ISO 8601 or e.g. 15m, 2h, 7d)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _emit(args: argparse.Namespace, message: Message, render: Callable[[], None]) -> None:
    if args.json:
        print(to_json(message))
    else:
        render()


# --------------------------------------------------------------------------------------------------
# dlq
# --------------------------------------------------------------------------------------------------


def _dlq_filter(client: Client, args: argparse.Namespace, request: Any) -> None:
    request.installed_pack_id = resolve_pack_id(client, args.pack)
    request.generation = args.generation or 0
    request.work_type = args.work_type or ""
    request.failure_class = args.failure_class or ""
    if args.since:
        request.finish_time_after.CopyFrom(_ts(args.since))
    if args.until:
        request.finish_time_before.CopyFrom(_ts(args.until))


def dlq_list(client: Client, args: argparse.Namespace) -> int:
    request = pb.ListDeadLettersRequest(page_size=args.limit, page_token=args.page_token or "")
    _dlq_filter(client, args, request)
    response = fetch_pages(client, "ListDeadLetters", request, "dead_letters", args.all)

    def render() -> None:
        table(
            [
                "work_id",
                "pack",
                "gen",
                "work_type",
                "failure",
                "summary",
                "attempts",
                "replays",
                "finished",
                "event",
                "delivery",
            ],
            [
                (
                    d.work_item.work_id,
                    d.work_item.installed_pack_id,
                    d.work_item.generation,
                    d.work_item.work_type,
                    d.work_item.failure_class,
                    d.work_item.failure_summary,
                    d.work_item.attempts,
                    d.work_item.replay_count,
                    ago(d.work_item.finish_time, d.work_item.HasField("finish_time")),
                    d.event.event_id,
                    d.receipt.provider_delivery_id,
                )
                for d in response.dead_letters
            ],
        )
        print_more_hint(args, response)

    _emit(args, response, render)
    return 0


def dlq_show(client: Client, args: argparse.Namespace) -> int:
    response = client.call(
        "GetWorkItem", pb.GetWorkItemRequest(work_id=args.work_id, include_payload=args.payload)
    )

    def render() -> None:
        w, e, r = response.work_item, response.event, response.receipt
        rows: list[tuple[str, Any]] = [
            ("work item", w.work_id),
            ("state", work_item_state(w.state)),
            ("pack / generation", f"{w.installed_pack_id} / {w.generation}"),
            ("work type / queue", f"{w.work_type} / {w.queue_class}"),
            ("attempts", f"{w.attempts} of {w.max_attempts} (replayed {w.replay_count}x)"),
            ("failure", f"{w.failure_class or '-'}: {w.failure_summary or '-'}"),
            ("outcome", w.outcome or "-"),
            ("lanes", f"source={w.source_lane_key or '-'} target={w.target_mutation_lane_key or '-'}"),
            ("lease", f"{w.lease_owner or '-'} token={w.lease_token}"),
            ("run after", when(w.run_after, w.HasField("run_after"))),
            ("created / updated", f"{when(w.create_time)} / {when(w.update_time)}"),
            ("finished", when(w.finish_time, w.HasField("finish_time"))),
            (
                "event",
                f"{e.event_id} route {e.route_id} v{e.route_version} gen {e.generation} inc {e.incarnation}",
            ),
            ("source object", f"{e.source_object_kind or '-'}/{e.source_object_id or '-'}"),
            ("idempotency key", e.idempotency_key),
            ("receipt", f"{r.receipt_id} {r.method} /{r.namespace}/{r.route_key} ({r.content_type or '-'})"),
            ("delivery id", r.provider_delivery_id or "-"),
            ("accepted", when(r.accept_time, r.HasField("accept_time"))),
            ("payload sha256", r.payload_sha256),
            ("correlation", ", ".join(f"{k}={v}" for k, v in sorted(r.correlation_ids.items())) or "-"),
        ]
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key.ljust(width)}  {value}")
        if args.payload:
            try:
                text = r.body.decode()
            except UnicodeDecodeError:
                text = "base64:" + base64.b64encode(r.body).decode()
            print(f"{'payload'.ljust(width)}  {text if r.body else '(not stored inline)'}")

    _emit(args, response, render)
    return 0


def dlq_replay(client: Client, args: argparse.Namespace) -> int:
    filters = (args.pack, args.generation, args.work_type, args.failure_class, args.since, args.until)
    if args.work_ids:
        if any(f for f in filters) or args.dry_run:
            raise CliError("give work ids or a filter (--pack ...), not both; --dry-run is for filters")
        return _replay_ids(client, args)
    if not args.pack:
        raise CliError("bulk replay needs --pack (and optional filters), or give work ids")
    return _replay_bulk(client, args)


def _replay_ids(client: Client, args: argparse.Namespace) -> int:
    base = args.request_id or uuid.uuid4().hex
    results: list[pb.ReplayWorkItemResponse] = []
    failed = 0
    for work_id in args.work_ids:
        request_id = base if len(args.work_ids) == 1 else f"{base}-{work_id}"
        try:
            results.append(
                client.call(
                    "ReplayWorkItem", pb.ReplayWorkItemRequest(work_id=work_id, request_id=request_id)
                )
            )
        except grpc.RpcError as exc:
            failed += 1
            print(f"{format_error(exc)} (work item {work_id})", file=sys.stderr)
    if args.json:
        for r in results:
            print(to_json(r))
    else:
        table(
            ["work_id", "state", "generation", "queue", "replays"],
            [
                (
                    r.work_item.work_id,
                    work_item_state(r.work_item.state),
                    r.work_item.generation,
                    r.work_item.queue_class,
                    r.work_item.replay_count,
                )
                for r in results
            ],
        )
    return 1 if failed else 0


def _replay_bulk(client: Client, args: argparse.Namespace) -> int:
    request = pb.ReplayDeadLettersRequest(
        dry_run=args.dry_run,
        rate_limit=args.rate or 0,
        request_id="" if args.dry_run else (args.request_id or uuid.uuid4().hex),
    )
    _dlq_filter(client, args, request)
    progress = Progress()
    final: pb.ReplayDeadLettersResponse | None = None
    call = client.stream("ReplayDeadLetters", request)
    try:
        for message in call:
            final = message
            if not args.dry_run:
                progress.update(message.replayed, message.total, message.refused, final=message.done)
    except KeyboardInterrupt:
        call.cancel()
        progress.close()
        done = final.replayed if final else 0
        print(f"cancelled: {done} replayed before the stop; the rest stay dead", file=sys.stderr)
        return 130
    finally:
        progress.close()
    assert final is not None
    if args.json:
        print(to_json(final))
        return 0
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(final.refused_by_reason.items()))
    if args.dry_run:
        print(
            f"dry run: {final.total} dead letters match, {final.eligible} would be replayed,"
            f" {final.refused} refused"
        )
    else:
        print(f"replayed {final.replayed} of {final.total}, refused {final.refused}")
    if reasons:
        print(f"refused by reason: {reasons}")
    return 0


# --------------------------------------------------------------------------------------------------
# receipts
# --------------------------------------------------------------------------------------------------


def receipts_failed(client: Client, args: argparse.Namespace) -> int:
    request = pb.ListReceiptFailuresRequest(
        page_size=args.limit, page_token=args.page_token or "", namespace=args.namespace or ""
    )
    response = fetch_pages(client, "ListReceiptFailures", request, "receipts", args.all)

    def render() -> None:
        table(
            ["receipt_id", "namespace", "route", "delivery", "error", "summary", "attempts", "accepted"],
            [
                (
                    r.receipt_id,
                    r.namespace,
                    r.route_key,
                    r.provider_delivery_id,
                    r.error_class,
                    r.error_summary,
                    r.attempts,
                    ago(r.accept_time, r.HasField("accept_time")),
                )
                for r in response.receipts
            ],
        )
        print_more_hint(args, response)

    _emit(args, response, render)
    return 0


def receipts_replay(client: Client, args: argparse.Namespace) -> int:
    response = client.call(
        "ReplayReceipt",
        pb.ReplayReceiptRequest(receipt_id=args.receipt_id, request_id=args.request_id or uuid.uuid4().hex),
    )
    _emit(
        args,
        response,
        lambda: print(
            f"receipt {response.receipt.receipt_id} is "
            f"{enum_name(types_pb2.ReceiptStatus.Name(response.receipt.status), 'RECEIPT_STATUS_')} again:"
            " the materializer routes it against the active generation"
        ),
    )
    return 0


# --------------------------------------------------------------------------------------------------
# stats, lanes, cutover
# --------------------------------------------------------------------------------------------------


def stats(client: Client, args: argparse.Namespace) -> int:
    response = client.call(
        "GetQueueStats", pb.GetQueueStatsRequest(installed_pack_id=resolve_pack_id(client, args.pack))
    )

    def render() -> None:
        totals = [q for q in response.queues if not q.queue_class]
        classes = [q for q in response.queues if q.queue_class]
        table(
            ["pack", *QUEUE_STATES, "due", "oldest_ready", "retry/s", "dead/s"],
            [
                (
                    f"{q.pack_name} ({q.installed_pack_id})" + (" PAUSED" if q.paused else ""),
                    *(q.depth_by_state.get(s, 0) for s in QUEUE_STATES),
                    q.due,
                    age(q.oldest_ready_age, q.HasField("oldest_ready_age")),
                    f"{q.retry_rate:.3f}",
                    f"{q.dead_rate:.3f}",
                )
                for q in totals
            ],
        )
        print()
        table(
            # not_due: ready but run_after ahead (a delay or a retry backoff; trace tells which).
            ["pack", "queue_class", "ready", "due", "not_due", "in_flight", "oldest_ready"],
            [
                (
                    f"{q.pack_name} ({q.installed_pack_id})",
                    q.queue_class + (" PAUSED" if q.paused else ""),
                    q.depth_by_state.get("ready", 0),
                    q.due,
                    max(0, q.depth_by_state.get("ready", 0) - q.due),
                    q.in_flight,
                    age(q.oldest_ready_age, q.HasField("oldest_ready_age")),
                )
                for q in classes
            ],
        )
        print()
        oldest = age(response.oldest_unrouted_age, response.HasField("oldest_unrouted_age"))
        print(
            f"receipts: {response.receipts_unrouted} unrouted (oldest due {oldest}), "
            f"{response.receipts_routing} routing, {response.receipts_failed} failed"
        )
        print(f"active claimants: {response.active_claimants}")
        for p in response.pauses:
            scope = "whole pack" if p.queue_class == "*" else f"queue class {p.queue_class}"
            print(
                f"paused: {p.pack_name} ({p.installed_pack_id}) {scope} by {p.actor} since "
                f"{when(p.pause_time, p.HasField('pause_time'))}: {p.reason}"
            )
        if response.rate_limits:
            print()
            table(
                ["pack", "work_type", "rate_key", "limit", "budget", "next_claim_in", "waiting", "in_flight"],
                [
                    (
                        f"{r.pack_name} ({r.installed_pack_id})",
                        r.work_type,
                        r.key,
                        f"{r.limit}/{r.period.ToTimedelta().total_seconds():g}s burst {r.burst}",
                        f"{r.budget:.2f}",
                        f"{r.next_claim_in.ToTimedelta().total_seconds():.3f}s",
                        r.waiting,
                        r.in_flight,
                    )
                    for r in response.rate_limits
                ],
            )
            if response.rate_limits_truncated:
                print(f"(first {len(response.rate_limits)} rate-limit keys shown)")
        if response.concurrency:
            print()
            table(
                [
                    "pack",
                    "work_type",
                    "concurrency_key",
                    "limit",
                    "slots_taken",
                    "waiting",
                    "parked",
                    "in_flight",
                ],
                [
                    (
                        f"{c.pack_name} ({c.installed_pack_id})",
                        c.work_type,
                        c.key,
                        c.limit,
                        c.slots_taken,
                        c.waiting,
                        c.parked,
                        c.in_flight,
                    )
                    for c in response.concurrency
                ],
            )
            if response.concurrency_truncated:
                print(f"(first {len(response.concurrency)} concurrency keys shown)")
        if response.debounce:
            print()
            table(
                [
                    "pack",
                    "work_type",
                    "debounce_key",
                    "window",
                    "max_wait",
                    "waiting",
                    "parked",
                    "next_due_in",
                    "last_executed",
                ],
                [
                    (
                        f"{d.pack_name} ({d.installed_pack_id})",
                        d.work_type,
                        d.key,
                        f"{d.window.ToTimedelta().total_seconds():g}s",
                        f"{d.max_wait.ToTimedelta().total_seconds():g}s",
                        d.waiting,
                        d.parked,
                        f"{d.next_due_in.ToTimedelta().total_seconds():.3f}s"
                        if d.HasField("next_due_in")
                        else "-",
                        d.last_executed_work_id or "-",
                    )
                    for d in response.debounce
                ],
            )
            if response.debounce_truncated:
                print(f"(first {len(response.debounce)} debounce keys shown)")
        if response.circuits:
            print()
            admin_actions.circuit_table(response.circuits)
            if response.circuits_truncated:
                print(f"(first {len(response.circuits)} circuits shown)")

    _emit(args, response, render)
    return 0


def lanes_blocked(client: Client, args: argparse.Namespace) -> int:
    request = pb.ListBlockedLanesRequest(
        page_size=args.limit,
        page_token=args.page_token or "",
        installed_pack_id=resolve_pack_id(client, args.pack),
    )
    response = fetch_pages(client, "ListBlockedLanes", request, "lanes", args.all)

    def render() -> None:
        table(
            ["pack", "kind", "lane", "head", "state", "waiting", "failure", "since"],
            [
                (
                    b.installed_pack_id,
                    enum_name(pb.LaneKind.Name(b.kind), "LANE_KIND_"),
                    b.lane_key,
                    b.head.work_id,
                    work_item_state(b.head.state),
                    b.waiting,
                    b.head.failure_class,
                    ago(b.head.update_time, b.head.HasField("update_time")),
                )
                for b in response.lanes
            ],
        )
        print_more_hint(args, response)

    _emit(args, response, render)
    return 0


def cutover_status(client: Client, args: argparse.Namespace) -> int:
    response = client.call(
        "GetCutoverState", pb.GetCutoverStateRequest(installed_pack_id=resolve_pack_id(client, args.pack))
    )

    def render() -> None:
        table(
            [
                "pack",
                "gen",
                "status",
                "active",
                "claim_path",
                "phase",
                "receipts",
                "open_fences",
                "awaiting(unknown)",
                "processing",
                "legacy(pend/run)",
                "unprojected",
                "claimers(wi/legacy)",
            ],
            [
                (
                    g.installed_pack_id,
                    g.generation,
                    g.generation_status,
                    "yes" if g.active else "",
                    enum_name(types_pb2.ClaimPath.Name(g.claim_path), "CLAIM_PATH_"),
                    enum_name(types_pb2.CutoverPhase.Name(g.phase), "CUTOVER_PHASE_"),
                    ",".join(f"{r.kind}#{r.cutover_receipt_id}" for r in g.receipts) or "-",
                    g.open_rollback_fences,
                    f"{g.awaiting_legacy_outcome}({g.awaiting_legacy_unknown})",
                    g.processing,
                    f"{g.legacy_pending}/{g.legacy_in_flight}",
                    g.unprojected_legacy_receipts,
                    f"{g.work_item_claim_processes}/{g.legacy_event_claim_processes}",
                )
                for g in response.generations
            ],
        )

    _emit(args, response, render)
    return 0


# --------------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------------


def processes_list(client: Client, args: argparse.Namespace) -> int:
    request = pb.ListProcessesRequest(page_size=500, service=args.service or "")
    response = fetch_pages(client, "ListProcesses", request, "processes", True)
    _emit(args, response, lambda: process_table(response))
    return 0


# --------------------------------------------------------------------------------------------------
# packs
# --------------------------------------------------------------------------------------------------


def _generations(p: pb.Pack) -> str:
    return " ".join(f"{g.generation}:{g.status}" for g in p.generations) or "-"


def packs_list(client: Client, args: argparse.Namespace) -> int:
    response = fetch_pages(client, "ListPacks", pb.ListPacksRequest(page_size=500), "packs", True)
    _emit(
        args,
        response,
        lambda: table(
            ["pack_id", "name", "namespace", "incarnation", "active", "generations"],
            [
                (
                    p.installed_pack_id,
                    p.name,
                    p.namespace,
                    p.incarnation,
                    p.active_generation or "-",
                    _generations(p),
                )
                for p in response.packs
            ],
        ),
    )
    return 0


def packs_apply(client: Client, args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CliError(f"cannot read {args.file}: not UTF-8 text") from None
    response = client.call(
        "ApplyPack",
        pb.ApplyPackRequest(
            manifest=text,
            activate=args.activate,
            validate_only=args.validate_only,
            request_id="" if args.validate_only else (args.request_id or uuid.uuid4().hex),
        ),
    )
    if args.json:
        print(to_json(response))
        return 1 if response.errors else 0
    if args.validate_only:
        if response.errors:
            print("invalid pack manifest:")
            for err in response.errors:
                print(f"  - {err}")
            return 1
        print("manifest is valid")
        return 0
    status = next((g.status for g in response.pack.generations if g.generation == response.generation), "?")
    print(
        f"pack {response.pack.name} (id {response.pack.installed_pack_id}): generation {response.generation}"
        f" is {status}; active generation {response.pack.active_generation or '-'}"
    )
    return 0


def packs_activate(client: Client, args: argparse.Namespace) -> int:
    response = client.call(
        "ActivateGeneration",
        pb.ActivateGenerationRequest(
            installed_pack_id=resolve_pack_id(client, args.pack),
            generation=args.generation,
            request_id=args.request_id or uuid.uuid4().hex,
        ),
    )
    _emit(
        args,
        response,
        lambda: print(
            f"pack {response.pack.name} (id {response.pack.installed_pack_id}): active generation"
            f" {response.pack.active_generation} ({_generations(response.pack)})"
        ),
    )
    return 0


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
    p.add_argument("--generation", type=positive_int)
    p.add_argument("--work-type")
    p.add_argument("--failure-class")
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

    dlq = group("dlq", "dead letters: terminal WorkItems with their event and receipt")
    p = command(dlq, "list", "list dead letters, newest first", dlq_list)
    _dlq_filters(p)
    _paging(p)
    p = command(dlq, "show", "one work item with event and receipt", dlq_show)
    p.add_argument("work_id", type=positive_int)
    p.add_argument(
        "--payload", action="store_true", help="include the receipt body (role ReplayConnectorEvents)"
    )
    p = command(dlq, "replay", "replay dead work items by id, or in bulk by filter (--pack ...)", dlq_replay)
    p.add_argument("work_ids", nargs="*", type=positive_int, metavar="WORK_ID")
    _dlq_filters(p)
    p.add_argument(
        "--dry-run", action="store_true", help="bulk: count what would be replayed, change nothing"
    )
    p.add_argument("--rate", type=positive_int, help="bulk: items per second at most (server default 100)")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    admin_cutover.add_dlq_commands(dlq, command)

    receipts = group("receipts", "receipts whose routing failed")
    p = command(receipts, "failed", "list failed receipts, newest first", receipts_failed)
    p.add_argument("--namespace")
    _paging(p)
    p = command(
        receipts, "replay", "route a failed receipt again against the active generation", receipts_replay
    )
    p.add_argument("receipt_id", type=positive_int)
    p.add_argument("--request-id")

    p = groups.add_parser("stats", parents=[common], help="queue depth, ready age, in-flight, rates")
    p.set_defaults(admin_run=stats)
    p.add_argument("--pack", help="pack id or name")

    lanes = group("lanes", "source and target mutation lanes")
    p = command(lanes, "blocked", "lanes held by a dead, retrying or rollback-fenced head", lanes_blocked)
    p.add_argument("--pack", help="pack id or name")
    _paging(p)

    packs = group("packs", "installed packs and generations (apply/activate need ConnectorOperator)")
    command(packs, "list", "packs and their generations", packs_list)
    p = command(packs, "apply", "install a manifest as a new generation", packs_apply)
    p.add_argument("file", help="manifest file (YAML or JSON), - for stdin")
    p.add_argument("--activate", action="store_true", help="activate the new generation at once")
    p.add_argument("--validate-only", action="store_true", help="check the manifest, install nothing")
    p.add_argument("--request-id")
    p = command(packs, "activate", "make a generation the active one", packs_activate)
    p.add_argument("pack", help="pack id or name")
    p.add_argument("generation", type=positive_int)
    p.add_argument("--request-id")

    cutover = group("cutover", "claim path ownership per pack generation")
    p = command(cutover, "status", "claim path, phase, receipts, fences, claimers", cutover_status)
    p.add_argument("--pack", help="pack id or name")
    admin_cutover.add_commands(cutover, command)

    p = groups.add_parser(
        "processes",
        parents=[common],
        help="registered service processes: heartbeat age, stale",
        description="Registered service processes (executor, ingress, materializer; connector_process)"
        " with their heartbeat age; stale = no heartbeat for 3 intervals.",
    )
    p.set_defaults(admin_run=processes_list)
    p.add_argument("--service", help="only this service (e.g. executor, ingress, materializer)")

    admin_actions.add_commands(groups, common)
    admin_find.add_commands(groups, common, _paging, parse_time)


def cli(args: argparse.Namespace) -> int:
    run = getattr(args, "admin_run", None)
    if run is None:
        helper = getattr(args, "admin_help", None)
        if helper is not None:
            helper()
        else:
            print(
                "usage: connector admin"
                " {dlq,receipts,stats,lanes,packs,cutover,processes,cancel,pause,resume,find,trace}"
                " ... (see --help)",
                file=sys.stderr,
            )
        return 2
    try:
        with connect(args) as client:
            return int(run(client, args))
    except grpc.RpcError as exc:
        print(format_error(exc), file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
