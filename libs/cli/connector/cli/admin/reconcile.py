"""``connector admin reconcile --route NS/ROUTE [--since T] [--dry-run]``: one reconciliation pass now
(docs/reconcile.md), run by the ingress process that leads the reconciler, and what it found."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from connector.cli.admin.client import Client
from connector.cli.admin.output import table, to_json, when
from connector.v1 import admin_service_pb2 as pb

#: What to do about each fault class of a pass (docs/reconcile.md, "Faults").
HINTS = {
    "unauthorized": "the sender refused the API key: check the secret of the route's reconcile headers",
    "rate_limited": "the sender throttles the listing: retry later, or lengthen reconcile.interval",
    "http_5xx": "the sender's API answers errors: retry later",
    "timeout": "the sender's API did not answer in reconcile.timeout: retry later",
    "connect": "the sender's API could not be reached (DNS, network, TLS)",
    "http_4xx": "the sender refused the request: check reconcile.list (url, query) against its API docs",
    "malformed_json": "the sender's answer is not what reconcile.items describes: check the manifest",
    "item_without_id": "an item has nothing at reconcile.item.id: check the pointer",
    "item_without_time": "an item has no time at reconcile.item.occurred_at: check the pointer",
    "cursor_loop": "the sender repeated a page cursor: check reconcile.paging",
    "page_too_large": "a page exceeds reconcile.max_page_bytes: lower the page size in the query",
    "too_many_pages": "the pass reached reconcile.max_pages: narrow it with --since",
    "foreign_url": "the sender's next-page URL points at another host: refused (credentials stay home)",
    "secret_unavailable": "the secret reference of the reconcile headers cannot be read in the ingress",
    "body_missing": "an item has no body where reconcile.item.body / fetch.body points",
    "id_mismatch": "reconcile.item.id is not the delivery id the route extracts from a webhook",
    "db_unavailable": "the ingress could not make receipts durable (database down or overloaded)",
    "not_reconciled": "the leading ingress does not reconcile this route (is its pack active there?)",
}

_STATE = {
    pb.RECONCILE_RUN_STATE_PENDING: "pending",
    pb.RECONCILE_RUN_STATE_RUNNING: "running",
    pb.RECONCILE_RUN_STATE_DONE: "done",
    pb.RECONCILE_RUN_STATE_FAILED: "failed",
}


def _route(text: str) -> tuple[str, str]:
    namespace, sep, route = text.partition("/")
    if not sep or not namespace or not route:
        raise argparse.ArgumentTypeError(f"--route takes NAMESPACE/ROUTE_KEY, got {text!r}")
    return namespace, route


def states(client: Client, args: argparse.Namespace) -> int:
    """Without --route: every reconciled route's state."""
    request = pb.ListReconcileStatesRequest(page_size=500, namespace=args.namespace or "")
    rows: list[pb.ReconcileState] = []
    while True:
        response: pb.ListReconcileStatesResponse = client.call("ListReconcileStates", request)
        rows.extend(response.states)
        if not response.next_page_token:
            break
        request.page_token = response.next_page_token
    if args.json:
        for s in rows:
            print(to_json(s))
        return 0
    if not rows:
        print("no reconciled routes (a route declares reconcile: in its manifest; docs/reconcile.md)")
        return 0
    table(
        ["route", "watermark", "last clean pass", "last pass", "listed", "missing", "admitted", "fault"],
        [
            (
                f"{s.namespace}/{s.route_key}",
                when(s.watermark, s.HasField("watermark")),
                when(s.last_clean_pass_time, s.HasField("last_clean_pass_time")),
                when(s.last_pass_time, s.HasField("last_pass_time"))
                + (" (in progress)" if s.HasField("pass_until") else ""),
                s.last_listed,
                s.last_missing,
                s.last_admitted,
                f"{s.last_error_class}: {s.last_error}" if s.last_error_class else "-",
            )
            for s in rows
        ],
    )
    return 0


def reconcile(client: Client, args: argparse.Namespace) -> int:
    if args.route is None:
        return states(client, args)
    namespace, route = args.route
    request = pb.RunReconcileRequest(
        namespace=namespace,
        route_key=route,
        dry_run=args.dry_run,
        wait=duration_pb2.Duration(seconds=int(args.wait)),
        request_id=args.request_id or uuid.uuid4().hex,
    )
    if args.since is not None:
        since = timestamp_pb2.Timestamp()
        since.FromDatetime(args.since)
        request.since.CopyFrom(since)
    client.timeout = max(client.timeout, args.wait + 5)  # the call waits for the run
    response: pb.RunReconcileResponse = client.call("RunReconcile", request)
    run = response.run
    if args.json:
        print(to_json(response))
        return 0 if run.state == pb.RECONCILE_RUN_STATE_DONE else 1
    state = _STATE.get(run.state, "unknown")
    what = f"{run.mode or 'reconcile'}{', dry run' if run.dry_run else ''}"
    print(f"run {run.run_id} {run.namespace}/{run.route_key} ({what}): {state}")
    if run.state in (pb.RECONCILE_RUN_STATE_PENDING, pb.RECONCILE_RUN_STATE_RUNNING):
        print(
            f"  not finished within {args.wait:g} s: it goes on in the ingress. If it stays pending, no "
            "ingress process leads the reconciler (connector admin processes --service ingress; "
            "CONNECTOR_INGRESS_RECONCILE_ENABLED)"
        )
        return 1
    bounds = f"{when(run.since, run.HasField('since'))} .. {when(run.until, run.HasField('until'))} UTC"
    print(f"  listed {run.listed} items that occurred {bounds} ({run.pages} pages)")
    if run.missing:
        more = (
            f" (first {len(run.missing_delivery_ids)})" if run.missing > len(run.missing_delivery_ids) else ""
        )
        print(f"  missing {run.missing}{more}: {', '.join(run.missing_delivery_ids)}")
    elif run.state == pb.RECONCILE_RUN_STATE_DONE:
        print("  missing 0: every listed delivery has a receipt")
    if run.dry_run:
        print("  dry run: nothing admitted or asked for")
    elif run.mode == "redeliver":
        print(f"  asked the sender to deliver again: {run.redelivered}")
    else:
        print(f"  admitted: {run.admitted} (origin reconciled: connector admin find --origin reconciled)")
    if run.state == pb.RECONCILE_RUN_STATE_FAILED:
        print(f"  stopped: {run.error_class}: {run.error}")
        hint = HINTS.get(run.error_class)
        if hint:
            print(f"  what to do: {hint}")
        return 1
    return 0


def add_commands(
    groups: argparse._SubParsersAction,
    common: argparse.ArgumentParser,
    parse_time: Callable[[str], datetime],
) -> Any:
    p = groups.add_parser(
        "reconcile",
        parents=[common],
        help="reconciled routes' state, or (--route) one pass now and what it found",
        description="Without --route: every reconciled route's watermark, last passes and fault (role "
        "ViewConnectorEvents). With --route: run one reconciliation pass of the route now (role "
        "ConnectorOperator; docs/reconcile.md): the ingress leading the reconciler lists the sender's "
        "items and admits (pull) or asks for (redeliver) those without a receipt. The route's watermark "
        "does not move.",
    )
    p.set_defaults(admin_run=reconcile)
    p.add_argument("--route", type=_route, metavar="NAMESPACE/ROUTE_KEY", help="run a pass of this route")
    p.add_argument("--namespace", help="without --route: only this namespace's routes")
    p.add_argument(
        "--since", type=parse_time, help="from when (ISO 8601 or e.g. 2h; default: the route's whole window)"
    )
    p.add_argument("--dry-run", action="store_true", help="list and compare only: admit and ask for nothing")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the result (default 60)")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id answers for the same run")
    return p
