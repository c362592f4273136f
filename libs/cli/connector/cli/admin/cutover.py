"""``connector admin cutover quiesce|cutover|rollback|abort|reconcile|resolve`` (docs/cutover.md).

Every transition prints where the generation is now and, for receipts, what the proof bound; a gate
that refuses prints one line per blocker (code, count, what to do) and exits 1 with nothing changed.
``--dry-run`` evaluates the proofs without changing anything (exit 1 when something blocks).
``--wait SECONDS`` retries a blocked gate once a second until it passes or the time is up (in-flight
work finishing is the usual reason to wait).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from connector.cli.admin.client import (
    Client,
    fetch_pages,
    pack_label,
    positive_int,
    print_more_hint,
    resolve_pack_id,
)
from connector.cli.admin.output import emit, enum_name, table, to_json, when, work_item_state
from connector.common.core.grpc_server import error_info
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import types_pb2

BLOCKED = ("CUTOVER_BLOCKED", "ROLLBACK_BLOCKED")


def _path(t: pb.CutoverTransition) -> str:
    return (
        f"{enum_name(types_pb2.ClaimPath.Name(t.claim_path), 'CLAIM_PATH_')}/"
        f"{enum_name(types_pb2.CutoverPhase.Name(t.phase), 'CUTOVER_PHASE_')}"
    )


def _print_blockers(action: str, blockers: list[dict[str, Any]], *, dry_run: bool = False) -> None:
    head = f"{action}: would be blocked" if dry_run else f"{action} blocked (nothing changed)"
    print(f"{head}:")
    for b in blockers:
        print(f"  {b['code']} ({b['count']}): {b['message']}")


def _blockers_of(exc: grpc.RpcError) -> list[dict[str, Any]] | None:
    info = error_info(exc)
    if info is None or info.reason not in BLOCKED:
        return None
    try:
        return list(json.loads(info.metadata.get("blockers", "[]")))
    except ValueError:
        return []


def _render(action: str, t: pb.CutoverTransition) -> None:
    state = "is now" if t.changed else "already is"
    if t.dry_run:
        state = "would become"
    print(
        f"{action}: pack {t.installed_pack_id} generation {t.generation} {state} {_path(t)}"
        f" (authority version {t.authority_version})"
    )
    r = t.receipt
    if r.kind and (r.cutover_receipt_id or t.dry_run) and t.proof_json:
        rid = f"#{r.cutover_receipt_id}" if r.cutover_receipt_id else " (not written: dry run)"
        print(f"receipt {r.kind}{rid}  proof sha256 {r.proof_sha256[:16]}…  {r.actor}".rstrip())
    if not t.proof_json:
        return
    proof = json.loads(t.proof_json)
    if proof.get("kind") == "cutover":
        z, m, o, h = (
            proof["zero_old_claimers"],
            proof["materialization"],
            proof["event_ownership"],
            proof["historical_mirror"],
        )
        lease = "held" if z["scheduler_lease"]["active"] else "free"
        print(
            f"  zero old claimers: {z['legacy_processing_events']} legacy events processing,"
            f" {z['legacy_processes_fresh']} legacy processes, scheduler lease {lease}"
            f" (waited {z['authority_lock_wait_ms']} ms for claim transactions)"
        )
        print(
            f"  materialization: {m['events']} events, backfilled {m['backfilled_events']} events"
            f" ({m['backfilled_work_items']} work items), {m['missing_work_items']} missing"
        )
        print(f"  event ownership: {o['switched_to_work_item']} events switched to work_item")
        print(
            f"  historical mirror: {h['reconciled_legacy_terminal_work_items']} reconciled_legacy_terminal"
            f" work items; rollback fences resolved {proof['rollback_fences']['resolved']}"
        )
        print(f"  claim schema: {proof['claim_schema']['alembic_revision']}")
    elif proof.get("kind") == "rollback":
        z, f = proof["zero_work_item_claimers"], proof["fence"]
        print(
            f"  zero WorkItem claimers: {z['processing']} processing, {z['started_attempts_unfinished']}"
            f" unfinished with a started attempt, {z['claim_capable_processes_for_generation']} claim-capable"
            f" processes of {z['work_item_processes_fresh_any_pack']} live WorkItem executors (waited"
            f" {z['authority_lock_wait_ms']} ms for claim transactions)"
        )
        fence = f"fence #{f['fence_id']}" if f["fence_id"] else "no fence (nothing unfinished)"
        if t.dry_run:
            fence = "fence (dry run, not written)"
        print(
            f"  {fence}: {f['fenced_work_items']} work items awaiting_legacy_outcome"
            f" (set sha256 {str(f['fenced_set_sha256'])[:16]}…), {f['events_to_legacy']} events to the"
            " legacy path"
        )
        if t.changed:
            print("  next: start `connector executor --claim-path event --pack <pack>` for this generation")


def _transition(
    client: Client,
    args: argparse.Namespace,
    action: str,
    method: str,
    request: Any,
    *,
    wait_s: float = 0.0,
) -> tuple[int, pb.CutoverTransition | None]:
    """Call a transition (retrying while blocked for ``wait_s``); print it; (exit code, transition)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            response = client.call(method, request)
        except grpc.RpcError as exc:
            blockers = _blockers_of(exc)
            if blockers is None:
                raise
            if time.monotonic() < deadline:
                time.sleep(1.0)
                continue
            if args.json:
                print(json.dumps({"blocked": action, "blockers": blockers}, indent=2))
            else:
                _print_blockers(action, blockers)
            return 1, None
        t = response.transition
        if args.json:
            print(to_json(response))
        elif t.blockers:
            _print_blockers(
                action,
                [{"code": b.code, "count": b.count, "message": b.message} for b in t.blockers],
                dry_run=True,
            )
        else:
            _render(action, t)
        return (1 if t.blockers else 0), t


def _generation(client: Client, args: argparse.Namespace) -> dict[str, int]:
    """The ``--pack`` (id or name) and ``--generation`` (0: the active one) of a request."""
    return {"installed_pack_id": resolve_pack_id(client, args.pack), "generation": args.generation or 0}


def _request_id(args: argparse.Namespace) -> str:
    return str(args.request_id or uuid.uuid4().hex)


def quiesce(client: Client, args: argparse.Namespace) -> int:
    request = pb.QuiesceLegacyRequest(
        **_generation(client, args),
        request_id=_request_id(args),
    )
    code, _ = _transition(client, args, "quiesce", "QuiesceLegacy", request)
    if code == 0 and not args.json:
        print(
            "  legacy executors of this generation stop claiming, drain and exit; run `cutover cutover` next"
        )
    return code


def cutover(client: Client, args: argparse.Namespace) -> int:
    request = pb.CompleteCutoverRequest(
        **_generation(client, args),
        dry_run=args.dry_run,
        request_id="" if args.dry_run else _request_id(args),
    )
    code, _ = _transition(client, args, "cutover", "CompleteCutover", request, wait_s=args.wait)
    return code


def rollback(client: Client, args: argparse.Namespace) -> int:
    pack = resolve_pack_id(client, args.pack)
    if args.dry_run:
        request = pb.CompleteRollbackRequest(
            installed_pack_id=pack, generation=args.generation or 0, dry_run=True
        )
        return _transition(client, args, "rollback", "CompleteRollback", request)[0]
    rid = _request_id(args)
    begin = pb.BeginRollbackRequest(
        installed_pack_id=pack, generation=args.generation or 0, request_id=rid + ":begin"
    )
    began = client.call("BeginRollback", begin).transition
    if not args.json:
        verb = "disabled" if began.changed else "already disabled"
        print(f"rollback: WorkItem claim admission {verb} for pack {pack} generation {began.generation}")
    complete = pb.CompleteRollbackRequest(installed_pack_id=pack, generation=began.generation, request_id=rid)
    code, _ = _transition(client, args, "rollback", "CompleteRollback", complete, wait_s=args.wait)
    if code and not args.json:
        print(
            "WorkItem claim admission stays disabled (rollback_fenced): resolve the blockers and run"
            " `cutover rollback` again, or `cutover abort` to admit WorkItem claims again"
        )
    return code


def abort(client: Client, args: argparse.Namespace) -> int:
    request = pb.AbortTransitionRequest(
        **_generation(client, args),
        request_id=_request_id(args),
    )
    return _transition(client, args, "abort", "AbortTransition", request)[0]


def reconcile(client: Client, args: argparse.Namespace) -> int:
    response = client.call(
        "ReconcileLegacyOutcomes",
        pb.ReconcileLegacyOutcomesRequest(
            **_generation(client, args),
            request_id=_request_id(args),
        ),
    )
    if args.json:
        print(to_json(response))
    else:
        print(
            f"reconcile: {response.projected} receipts projected, {response.duplicates} duplicates,"
            f" {response.conflicts} conflicts; fences resolved {list(response.resolved_fence_ids)}"
        )
        if response.conflicts:
            print(f"  conflicting receipts (block re-cutover): {list(response.conflict_receipt_ids)}")
    return 1 if response.conflicts else 0


def resolve(client: Client, args: argparse.Namespace) -> int:
    outcome = pb.LEGACY_OUTCOME_SUCCEEDED if args.outcome == "succeeded" else pb.LEGACY_OUTCOME_FAILED
    response = client.call(
        "ResolveLegacyOutcome",
        pb.ResolveLegacyOutcomeRequest(
            event_id=args.event_id,
            work_type=args.work_type,
            outcome=outcome,
            reason=args.reason,
            request_id=_request_id(args),
        ),
    )
    if args.json:
        print(to_json(response))
    else:
        state = work_item_state(response.work_item_state)
        print(
            f"resolve: event {response.event_id} {response.work_type} confirmed {args.outcome}"
            f" (receipt version {response.version}); event legacy state {response.event_legacy_state};"
            f" work item {state}"
        )
    return 0


def legacy_failures(client: Client, args: argparse.Namespace) -> int:
    request = pb.ListLegacyFailuresRequest(
        **_generation(client, args),
        page_size=args.limit,
        page_token=args.page_token or "",
    )
    response = fetch_pages(client, "ListLegacyFailures", request, "failures", args.all)
    if args.json:
        print(to_json(response))
        return 0
    table(
        [
            "event_id",
            "work_type",
            "outcome",
            "v",
            "failure_class",
            "event_state",
            "work_item",
            "reported",
            "by",
        ],
        [
            (
                f.event.event_id,
                f.work_type,
                enum_name(pb.LegacyOutcome.Name(f.outcome), "LEGACY_OUTCOME_"),
                f.version,
                f.failure_class or "-",
                f.event_legacy_state or "-",
                f"{f.work_id}:{work_item_state(f.work_item_state)}" if f.work_id else "-",
                when(f.create_time, f.HasField("create_time")),
                f.actor,
            )
            for f in response.failures
        ],
    )
    print_more_hint(args, response)
    return 0


def add_dlq_commands(sub: argparse._SubParsersAction, command: Callable[..., Any]) -> None:
    """``connector admin dlq legacy``: the legacy Event path's dead letters."""
    p = command(
        sub,
        "legacy",
        "failed/unknown outcomes of the legacy Event path (legacy generations)",
        legacy_failures,
    )
    p.add_argument("--pack", required=True, help="pack id or name")
    p.add_argument("--generation", type=positive_int, help="generation (default: the active one)")
    p.add_argument("--limit", type=positive_int, default=50, help="page size (default 50, max 500)")
    p.add_argument("--page-token", help="continue a listing")
    p.add_argument("--all", action="store_true", help="follow every page")


def add_commands(sub: argparse._SubParsersAction, command: Callable[..., Any]) -> None:
    """Register the transition commands in the ``cutover`` group of ``connector admin``."""

    def target(p: argparse.ArgumentParser, *, required: bool = True) -> None:
        p.add_argument("--pack", required=required, help="pack id or name")
        p.add_argument("--generation", type=positive_int, help="generation (default: the active one)")

    p = command(
        sub, "quiesce", "gate 1: stop legacy Event claim admission (legacy_active -> quiescing)", quiesce
    )
    target(p)
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    p = command(sub, "cutover", "gates 2-5: prove the drain and write the cutover receipt", cutover)
    target(p)
    p.add_argument("--dry-run", action="store_true", help="report blockers, change nothing")
    p.add_argument("--wait", type=float, default=0.0, help="retry while blocked for up to SECONDS")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    p = command(
        sub, "rollback", "gate 4: disable WorkItem admission, fence, write the rollback receipt", rollback
    )
    target(p)
    p.add_argument("--dry-run", action="store_true", help="report blockers, change nothing")
    p.add_argument("--wait", type=float, default=0.0, help="retry while blocked for up to SECONDS")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    p = command(sub, "abort", "return a quiescing or rollback_fenced generation to its previous path", abort)
    target(p)
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    p = command(sub, "reconcile", "project legacy outcome receipts onto WorkItems, resolve fences", reconcile)
    target(p, required=False)
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")
    p = command(sub, "resolve", "confirm the outcome of an unknown (quarantined) legacy work item", resolve)
    p.add_argument("event_id", type=positive_int, help="the legacy event")
    p.add_argument("work_type", help="the event's work type")
    p.add_argument("outcome", choices=("succeeded", "failed"), help="what the legacy path did")
    p.add_argument("--reason", required=True, help="what was checked in the external system, by whom")
    p.add_argument("--request-id", help="AIP-155 id: a retry with the same id returns the first answer")


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
                    pack_label(client, g.installed_pack_id),
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

    emit(args, response, render)
    return 0
