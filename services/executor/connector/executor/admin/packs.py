"""Pack RPCs over ``connector.common.packs.install`` (the one implementation of apply / activate / list).

* ApplyPack parses and validates the manifest (``packs.document.parse_manifest``: every error listed; text
  with a NUL character or a lone surrogate, nesting deeper than 32 levels and more than 100,000
  values are errors too, so nothing the database cannot store gets past it). An
  invalid manifest is INVALID_ARGUMENT ``INVALID_MANIFEST`` (nothing installed); with
  ``validate_only`` the errors come back in the response instead and nothing is installed either.
  A valid one is installed by ``install.pack_apply`` as a new generation (WorkItem-owned, with an
  install receipt), activated in the same transaction when asked.
* ActivateGeneration is ``install.pack_generation_activate``.
* ListPacks pages ``install.pack_list`` by pack name (packs are few).
Pack store refusals map to NOT_FOUND (``not_found``) or FAILED_PRECONDITION (namespace taken or
changed, no claim authority), with the store's reason upper-cased as the ErrorInfo reason.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from connector.common.core.grpc_server import ServiceError
from connector.common.packs import install
from connector.common.packs.document import ManifestError, parse_manifest
from connector.executor.admin import convert, pagination
from connector.executor.admin.errors import Reason, invalid_argument, not_found
from connector.v1 import admin_service_pb2 as pb

log = logging.getLogger(__name__)

MAX_MANIFEST_BYTES = 1_048_576


def store_error(exc: install.PackStoreError) -> ServiceError:
    code = grpc.StatusCode.NOT_FOUND if exc.reason == "not_found" else grpc.StatusCode.FAILED_PRECONDITION
    return ServiceError(code, exc.reason.upper(), exc.message)


def pack_proto(info: install.PackInfo) -> pb.Pack:
    return pb.Pack(
        installed_pack_id=info.installed_pack_id,
        name=info.name,
        namespace=info.namespace,
        incarnation=info.incarnation,
        active_generation=info.active_generation or 0,
        generations=[
            pb.PackGeneration(
                generation=g.generation,
                status=g.status,
                manifest_sha256=g.manifest_sha256,
                create_time=convert.ts(g.created_at),
                activate_time=convert.ts(g.activated_at),
                route_count=g.route_count,
            )
            for g in info.generations
        ],
    )


async def _pack(conn: Any, installed_pack_id: int) -> pb.Pack:
    for info in await install.pack_list(conn):
        if info.installed_pack_id == installed_pack_id:
            return pack_proto(info)
    raise not_found(Reason.PACK_NOT_FOUND, f"pack {installed_pack_id} not found")  # pragma: no cover


async def apply_pack(servicer: Any, request: pb.ApplyPackRequest) -> pb.ApplyPackResponse:
    if len(request.manifest.encode()) > MAX_MANIFEST_BYTES:
        raise invalid_argument(f"manifest larger than {MAX_MANIFEST_BYTES} bytes", field="manifest")
    if request.validate_only and request.activate:
        raise invalid_argument("validate_only and activate exclude each other", field="validate_only")
    try:
        # Parsing a large YAML document takes seconds of CPU (PyYAML's pure-Python loader; the C
        # one recurses without a depth limit): off the event loop that also runs the claim loop.
        manifest = await asyncio.to_thread(parse_manifest, request.manifest)
    except ManifestError as exc:
        if request.validate_only:
            return pb.ApplyPackResponse(errors=exc.errors)
        shown = "; ".join(exc.errors[:20]) + (
            f"; … {len(exc.errors) - 20} more" if len(exc.errors) > 20 else ""
        )
        raise invalid_argument(f"invalid pack manifest: {shown}", Reason.INVALID_MANIFEST) from None
    if request.validate_only:
        return pb.ApplyPackResponse()
    actor = f"admin {servicer.actor}"

    async def body(conn: Any) -> pb.ApplyPackResponse:
        try:
            applied = await install.pack_apply(conn, manifest, activate=request.activate, actor=actor)
        except install.PackStoreError as exc:
            raise store_error(exc) from None
        log.info(
            "pack applied",
            extra={
                "pack": applied.name,
                "generation": applied.generation,
                "created_generation": applied.created_generation,
                "status": applied.status,
                "actor": servicer.actor,
            },
        )
        return pb.ApplyPackResponse(
            pack=await _pack(conn, applied.installed_pack_id), generation=applied.generation
        )

    return await servicer.mutate("ApplyPack", request.request_id, pb.ApplyPackResponse, body)


async def activate_generation(
    servicer: Any, request: pb.ActivateGenerationRequest
) -> pb.ActivateGenerationResponse:
    if request.installed_pack_id <= 0 or request.generation <= 0:
        raise invalid_argument("installed_pack_id and generation must be positive", field="generation")

    async def body(conn: Any) -> pb.ActivateGenerationResponse:
        try:
            await install.pack_generation_activate(conn, request.installed_pack_id, request.generation)
        except install.PackStoreError as exc:
            raise store_error(exc) from None
        log.info(
            "generation activated",
            extra={
                "installed_pack_id": request.installed_pack_id,
                "generation": request.generation,
                "actor": servicer.actor,
            },
        )
        return pb.ActivateGenerationResponse(pack=await _pack(conn, request.installed_pack_id))

    return await servicer.mutate(
        "ActivateGeneration", request.request_id, pb.ActivateGenerationResponse, body
    )


async def list_packs(
    conn: Any, request: pb.ListPacksRequest, pages: pagination.PageTokens
) -> pb.ListPacksResponse:
    size = pagination.page_size(request.page_size)
    key = pages.decode("ListPacks", request.page_token, {}, arity=1)
    infos = sorted(await install.pack_list(conn), key=lambda p: p.name)
    if key is not None:
        infos = [p for p in infos if p.name > str(key[0])]
    response = pb.ListPacksResponse(packs=[pack_proto(p) for p in infos[:size]])
    if len(infos) > size:
        response.next_page_token = pages.encode("ListPacks", [infos[size - 1].name], {})
    return response
