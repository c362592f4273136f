"""The console's one door to the runtime: the admin gRPC API, called with the session's token.

No SQL and no store import here or anywhere in ``connector.console`` (tests/test_import_contract.py):
every view and action is an admin RPC, so the console gets the API's roles, audit lines, request ids,
input stage and dry runs for free, and a second path to the tables cannot drift from the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from connector.common.core.grpc_server import error_info
from connector.v1 import admin_service_pb2_grpc


@dataclass(frozen=True, slots=True)
class ApiError(Exception):
    """A refused or failed admin call: the canonical code, the ErrorInfo reason and the message (the
    API's messages name fields and rules, never secrets or payloads)."""

    code: str
    reason: str
    message: str
    metadata: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    @property
    def retryable(self) -> bool:
        return self.code in ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "ABORTED")


def _api_error(exc: grpc.aio.AioRpcError) -> ApiError:
    info = error_info(exc)
    code = exc.code().name if exc.code() is not None else "UNKNOWN"
    return ApiError(
        code,
        info.reason if info is not None and info.reason else code,
        exc.details() or "",
        tuple(sorted(info.metadata.items())) if info is not None else (),
    )


class AdminClient:
    """One grpc.aio channel to the admin API, shared by every session; each call carries the calling
    session's own bearer token, so the API decides what each person may see and do."""

    def __init__(
        self,
        address: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = (
            grpc.aio.secure_channel(address, credentials)
            if credentials is not None
            else grpc.aio.insecure_channel(address)
        )
        self._stub = admin_service_pb2_grpc.AdminServiceStub(self._channel)

    async def call(self, method: str, request: Message, token: str, *, timeout_s: float | None = None) -> Any:
        try:
            return await getattr(self._stub, method)(
                request,
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=timeout_s or self.timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise _api_error(exc) from None

    def stream(self, method: str, request: Message, token: str) -> Any:
        """A server stream (ReplayDeadLetters); iterate it with ``stream_items``."""
        return getattr(self._stub, method)(request, metadata=(("authorization", f"Bearer {token}"),))

    async def close(self) -> None:
        await self._channel.close()


async def stream_items(call: Any) -> Any:
    try:
        async for item in call:
            yield item
    except grpc.aio.AioRpcError as exc:
        raise _api_error(exc) from None
