"""``connector admin dlq`` and ``connector admin receipts``: dead letters and failed receipts, listed,
inspected and replayed (one, many, or every one matching a filter)."""

from __future__ import annotations

import argparse
import base64
import sys
import uuid
from typing import Any

import grpc

from connector.cli.admin.client import (
    Client,
    CliError,
    fetch_pages,
    format_error,
    pack_label,
    print_more_hint,
    resolve_pack_id,
)
from connector.cli.admin.output import (
    Progress,
    ago,
    emit,
    enum_name,
    table,
    to_json,
    when,
    work_item_state,
)
from connector.cli.admin.output import (
    timestamp as _ts,
)
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

# --------------------------------------------------------------------------------------------------
# dlq
# --------------------------------------------------------------------------------------------------


def token_note(token: int) -> str:
    """A fencing token claimed after a failover carries the server's timeline in its high bits
    (docs/adr/018-identity-across-failover.md): say which, and the row's claim count."""
    if token < 2**31:
        return ""
    return f" (timeline {(token >> 31) + 1}, claim {token & (2**31 - 1)})"


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

    def row(d: pb.DeadLetter) -> tuple[object, ...]:
        if d.claim_path == "legacy_event":  # the generation's failures are on the legacy path
            f = d.legacy_failure
            return (
                f.work_id or "-",
                pack_label(client, d.event.installed_pack_id),
                d.event.generation,
                f.work_type,
                f.failure_class,
                f.failure_summary,
                "-",
                "-",
                ago(f.create_time, f.HasField("create_time")),
                d.event.event_id,
                d.receipt.provider_delivery_id,
                "legacy_event",
            )
        w = d.work_item
        return (
            w.work_id,
            pack_label(client, w.installed_pack_id),
            w.generation,
            w.work_type,
            w.failure_class,
            w.failure_summary,
            w.attempts,
            w.replay_count,
            ago(w.finish_time, w.HasField("finish_time")),
            d.event.event_id,
            d.receipt.provider_delivery_id,
            d.claim_path or "work_item",
        )

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
                "path",
            ],
            [row(d) for d in response.dead_letters],
        )
        print_more_hint(args, response)

    emit(args, response, render)
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
            ("pack / generation", f"{pack_label(client, w.installed_pack_id)} / {w.generation}"),
            ("work type / queue", f"{w.work_type} / {w.queue_class}"),
            ("attempts", f"{w.attempts} of {w.max_attempts} (replayed {w.replay_count}x)"),
            ("failure", f"{w.failure_class or '-'}: {w.failure_summary or '-'}"),
            ("outcome", w.outcome or "-"),
            ("lanes", f"source={w.source_lane_key or '-'} target={w.target_mutation_lane_key or '-'}"),
            ("lease", f"{w.lease_owner or '-'} token={w.lease_token}{token_note(w.lease_token)}"),
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

    emit(args, response, render)
    return 0


def dlq_replay(client: Client, args: argparse.Namespace) -> int:
    filters = (args.pack, args.generation, args.work_type, args.failure_class, args.since, args.until)
    if args.work_ids:
        if any(f for f in filters):
            raise CliError("give work ids or a filter (--pack ...), not both")
        return _replay_ids(client, args)
    if not args.pack:
        raise CliError("bulk replay needs --pack (and optional filters), or give work ids")
    return _replay_bulk(client, args)


def _replay_ids(client: Client, args: argparse.Namespace) -> int:
    base = args.request_id or uuid.uuid4().hex
    results: list[pb.ReplayWorkItemResponse] = []
    failed = 0
    for work_id in args.work_ids:
        request_id = "" if args.dry_run else (base if len(args.work_ids) == 1 else f"{base}-{work_id}")
        try:
            results.append(
                client.call(
                    "ReplayWorkItem",
                    pb.ReplayWorkItemRequest(work_id=work_id, request_id=request_id, dry_run=args.dry_run),
                )
            )
        except grpc.RpcError as exc:
            failed += 1
            print(f"{format_error(exc, client)} (work item {work_id})", file=sys.stderr)
    if args.json:
        for r in results:
            print(to_json(r))
    else:
        if args.dry_run and results:
            print("dry run: these would be replayed (nothing changed)")
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

    emit(args, response, render)
    return 0


def receipts_replay(client: Client, args: argparse.Namespace) -> int:
    response = client.call(
        "ReplayReceipt",
        pb.ReplayReceiptRequest(receipt_id=args.receipt_id, request_id=args.request_id or uuid.uuid4().hex),
    )
    emit(
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
