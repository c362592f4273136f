"""``connector admin packs list|apply|activate``: pack generations over the admin API (the direct
install without the API is ``connector pack apply``, connector.cli.pack)."""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

from connector.cli.admin.client import (
    Client,
    CliError,
    fetch_pages,
    resolve_pack_id,
)
from connector.cli.admin.output import (
    emit,
    table,
    to_json,
)
from connector.v1 import admin_service_pb2 as pb

# --------------------------------------------------------------------------------------------------
# packs
# --------------------------------------------------------------------------------------------------


def _generations(p: pb.Pack) -> str:
    return " ".join(f"{g.generation}:{g.status}" for g in p.generations) or "-"


def packs_list(client: Client, args: argparse.Namespace) -> int:
    response = fetch_pages(client, "ListPacks", pb.ListPacksRequest(page_size=500), "packs", True)
    emit(
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
    emit(
        args,
        response,
        lambda: print(
            f"pack {response.pack.name} (id {response.pack.installed_pack_id}): active generation"
            f" {response.pack.active_generation} ({_generations(response.pack)})"
        ),
    )
    return 0
