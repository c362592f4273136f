"""``connector admin stats``, ``lanes blocked`` and ``processes``: queue depth, ready age, in-flight,
rates and receipts; lanes held by their head; registered service processes."""

from __future__ import annotations

import argparse

from connector.cli.admin import actions
from connector.cli.admin.client import (
    Client,
    fetch_pages,
    pack_label,
    print_more_hint,
    resolve_pack_id,
)
from connector.cli.admin.output import (
    age,
    ago,
    emit,
    enum_name,
    process_table,
    table,
    when,
    work_item_state,
)
from connector.v1 import admin_service_pb2 as pb

QUEUE_STATES = ("pending", "blocked", "processing", "retry", "dead", "awaiting_legacy_outcome")


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
            actions.circuit_table(response.circuits)
            if response.circuits_truncated:
                print(f"(first {len(response.circuits)} circuits shown)")

    emit(args, response, render)
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
                    pack_label(client, b.installed_pack_id),
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

    emit(args, response, render)
    return 0


# --------------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------------


def processes_list(client: Client, args: argparse.Namespace) -> int:
    request = pb.ListProcessesRequest(page_size=500, service=args.service or "")
    response = fetch_pages(client, "ListProcesses", request, "processes", True)
    emit(args, response, lambda: process_table(response))
    return 0
