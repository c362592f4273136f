"""Python callable handlers: ``module:function``, sync or async, ``(ctx) -> Outcome | None``.

Async functions run on the executor's event loop (they must not block it). Sync functions run on a
thread pool of the executor's size (they may block; a sync handler that overruns its timeout cannot be
interrupted, its late result is still written fenced by its lease token).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from connector.executor.handlers import HandlerContext, Outcome


class HandlerUnavailable(Exception):
    """The handler target cannot be loaded in this process (retryable: a deploy may be rolling)."""


def import_target(target: str) -> Any:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerUnavailable(f"python handler target must be 'module:function', got {target!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlerUnavailable(f"cannot import module {module_name!r} ({type(exc).__name__})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HandlerUnavailable(f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise HandlerUnavailable(f"{target!r} is not callable")
    return obj


class PythonHandler:
    """Wraps an async callable (called directly) or a sync one (run on ``threads``)."""

    __slots__ = ("_fn", "_threads", "is_async", "needs_event", "target")

    def __init__(self, target: str, fn: Any, threads: ThreadPoolExecutor) -> None:
        self.target = target
        self._fn = fn
        self._threads = threads
        self.is_async = inspect.iscoroutinefunction(fn)
        self.needs_event = bool(getattr(fn, "connector_needs_event", True))

    def __call__(self, ctx: HandlerContext) -> Any:
        """An awaitable of ``Outcome | None``."""
        if self.is_async:
            return self._fn(ctx)
        return asyncio.get_running_loop().run_in_executor(self._threads, self._fn, ctx)

    @property
    def fn(self) -> Any:
        return self._fn


def python_handler(target: str, threads: ThreadPoolExecutor) -> PythonHandler:
    return PythonHandler(target, import_target(target), threads)


__all__ = ["HandlerUnavailable", "Outcome", "PythonHandler", "import_target", "python_handler"]
