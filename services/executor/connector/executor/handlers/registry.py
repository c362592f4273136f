"""Work type specs per pack generation (handler, retry policy), resolved once and cached.

The manifest of ``(installed_pack_id, generation)`` is read from ``connector_pack_generation`` the
first time an item of that generation is claimed; generations are immutable, so the cache never
goes stale. A python handler that cannot be imported is *unavailable* (retryable, re-imported after
``retry_import_s``): a deploy may still be rolling out. A generation whose manifest row is missing
or does not validate under this version's model is unavailable the same way (retry, re-read after
``retry_import_s``) — its items never run without a spec, and never die for a reason an operator can
fix. A work type a valid manifest does not declare is permanent (dead, ``unknown_work_type``).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from connector.common.packs.manifest import HandlerSpec, Manifest, RetryPolicy
from connector.executor.handlers.grpc import GrpcHandler
from connector.executor.handlers.http import HttpHandler
from connector.executor.handlers.python import HandlerUnavailable, python_handler

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkTypeRuntime:
    handler: Any  # a Handler, or None when unavailable/unknown
    needs_event: bool
    retry: RetryPolicy
    timeout_s: float
    unknown: bool = False
    unavailable: str | None = None
    spec: HandlerSpec | None = None
    retry_at: float = 0.0


class HandlerRegistry:
    def __init__(self, threads: ThreadPoolExecutor, *, retry_import_s: float = 10.0) -> None:
        self._threads = threads
        self._retry_import_s = retry_import_s
        self._by_key: dict[tuple[int, int, str], WorkTypeRuntime] = {}
        self._generations: dict[tuple[int, int], str] = {}
        self._broken: dict[tuple[int, int], tuple[str, float]] = {}  # reason, retry at (monotonic)
        self._remote: dict[tuple[str, str, float], Any] = {}

    def loaded(self, pack: int, generation: int) -> bool:
        broken = self._broken.get((pack, generation))
        if broken is not None:
            return time.monotonic() < broken[1]
        return (pack, generation) in self._generations

    def pack_name(self, pack: int, generation: int) -> str | None:
        return self._generations.get((pack, generation))

    def lookup(self, pack: int, generation: int, work_type: str) -> WorkTypeRuntime:
        broken = self._broken.get((pack, generation))
        if broken is not None:
            return WorkTypeRuntime(None, False, RetryPolicy(), 30.0, unavailable=broken[0])
        rt = self._by_key.get((pack, generation, work_type))
        if rt is None:
            rt = WorkTypeRuntime(None, False, RetryPolicy(), 30.0, unknown=True)
            self._by_key[(pack, generation, work_type)] = rt
        elif rt.unavailable is not None and rt.spec is not None and time.monotonic() >= rt.retry_at:
            self._resolve_into(rt, rt.spec)
        return rt

    def install(self, pack: int, generation: int, manifest_doc: Any, name: str) -> None:
        """Resolve every work type of a generation's manifest (called once per generation)."""
        manifest = Manifest.model_validate(manifest_doc)
        self._broken.pop((pack, generation), None)
        for work_type, spec in manifest.work_types.items():
            rt = WorkTypeRuntime(None, True, spec.retry, spec.handler.timeout_s, spec=spec.handler)
            self._resolve_into(rt, spec.handler)
            self._by_key[(pack, generation, work_type)] = rt
        self._generations[(pack, generation)] = name

    def install_broken(self, pack: int, generation: int, reason: str) -> None:
        """A generation whose manifest is missing or invalid: nothing of it runs (fails closed);
        its items are retried, and the manifest is read again after ``retry_import_s``."""
        self._broken[(pack, generation)] = (reason, time.monotonic() + self._retry_import_s)
        log.warning(
            "pack generation unavailable", extra={"pack": pack, "generation": generation, "reason": reason}
        )

    def _resolve_into(self, rt: WorkTypeRuntime, spec: HandlerSpec) -> None:
        try:
            if spec.kind == "python":
                handler: Any = python_handler(spec.target, self._threads)
            elif spec.kind == "grpc":
                handler = self._remote_client(spec)
            else:
                handler = self._remote_client(spec)
        except HandlerUnavailable as exc:
            rt.handler = None
            rt.unavailable = str(exc)
            rt.retry_at = time.monotonic() + self._retry_import_s
            log.warning("handler unavailable", extra={"handler_target": spec.target, "reason": str(exc)})
            return
        rt.handler = handler
        rt.unavailable = None
        rt.needs_event = bool(getattr(handler, "needs_event", True))

    def _remote_client(self, spec: HandlerSpec) -> Any:
        key = (spec.kind, spec.target, spec.timeout_s)
        client = self._remote.get(key)
        if client is None:
            client = (
                GrpcHandler(spec.target, spec.timeout_s)
                if spec.kind == "grpc"
                else HttpHandler(spec.target, spec.timeout_s)
            )
            self._remote[key] = client
        return client

    async def close(self) -> None:
        for client in self._remote.values():
            await client.close()
        self._remote.clear()
