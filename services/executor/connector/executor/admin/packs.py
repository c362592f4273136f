"""Pack RPCs (ApplyPack, ListPacks, ActivateGeneration) over ``connector.common.pack_store``."""

from __future__ import annotations

from typing import Any

import grpc

from connector.common.grpc_server import ServiceError


async def dispatch(servicer: Any, method: str, request: Any) -> Any:
    raise ServiceError(
        grpc.StatusCode.UNIMPLEMENTED, "PACK_STORE_UNAVAILABLE", f"{method}: not available yet"
    )
